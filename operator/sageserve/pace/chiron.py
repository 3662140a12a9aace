"""Chiron: hierarchical backpressure autoscaling (Patke et al.), SageServe v3 §7.1's
state-of-the-art baseline, on sageserve's unified fleet.

Chiron's rules, as SageServe's simulator runs them (its `ChironArbiter`):

- interactive: the interactive backpressure `ibp` = instances running at least one
  interactive request ÷ instances of the interactive and mixed pools. Above Θ (0.6) scale
  out one instance, else scale in one;
- batch: the queue's estimated pending time, pending prompt time + pending decode tokens ÷
  (decode throughput × instances), against the deadline (24 h): above it scale out one; with
  nothing pending the batch-only capacity goes to zero;
- one scaling event per endpoint per cooldown (SageServe keeps its 15 s for every policy).

How it maps onto one unified pool per (model, region), so the operator can run it as well:

- every serving instance is a *mixed* instance (it serves interactive work and, through the
  Queue Manager, batch work), so `ibp` is taken over the endpoint's serving instances that
  report the count (`EndpointObservation.interactive_busy` of `interactive_reporting`);
- the pending time exceeds the deadline exactly when the tokens/s the batch queue needs to
  finish by its deadlines exceed the throughput the instances give it: the decision step's
  batch deadline need (`batch_need_tps`, earliest deadline first over the model's queue, the
  endpoint's share) against the batch capacity of its serving instances
  (`batch_capacity_tps`: θ × serving × the Queue Manager's release threshold). With one
  deadline and the whole queue waiting now, the two tests are the same inequality; with
  several deadlines the need is the strictest of them;
- batch-only capacity is the part of the endpoint the interactive rule would not keep: a
  scale-in (ibp ≤ Θ) goes ahead when nothing is pending (Chiron's scale to zero of the
  batch pool) or when the instances left still meet the need (the batch pool holds,
  the interactive pool shrinks); the floor (`minInstances`) stays, as for every strategy.

What differs from Chiron: no separate interactive, mixed and batch pools (the operator runs
one pool per model and region); no per-request SLO-aware batching inside an instance (the
engine's priority admission is SageServe's); the throughput Chiron profiles offline is the
policy's θ (`capacityTokensPerSecond`, the plan's), given to batch only below the release
threshold; none of the decision step's queue signals or scale-in holds
(`queue_signals` off), as Chiron reads only its own two.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from sageserve.core.snapshot import EndpointPlan
from sageserve.core.types import ActionKind, EndpointObservation, ScalingAction
from sageserve.pace.base import NO_PLAN, PlanCadence, PoolLayout, register_strategy


@dataclass(frozen=True)
class ChironParams:
    """Chiron's interactive threshold Θ (`spec.chiron.interactiveBusyAbove`) and the
    cooldown every policy keeps (`spec.intervals.cooldownSeconds`)."""

    interactive_busy_above: float = 0.6
    cooldown_s: float = 15.0

    @classmethod
    def from_mapping(cls, raw: Mapping[str, Any]) -> ChironParams:
        known = {k: float(raw[k]) for k in cls.__dataclass_fields__ if k in raw}
        return cls(**known)


def interactive_backpressure(obs: EndpointObservation) -> float | None:
    """Share of the reporting instances that run an interactive request (None: no instance
    reported the count, so nothing is known)."""
    if obs.interactive_reporting <= 0:
        return None
    return obs.interactive_busy / obs.interactive_reporting


def batch_behind(obs: EndpointObservation, instances: int) -> bool:
    """Whether the batch queue's pending time with `instances` serving exceeds its deadlines:
    the need above what that many instances give batch work."""
    if obs.batch_need_tps <= 0 or obs.serving <= 0:
        return False
    per_instance = obs.batch_capacity_tps / obs.serving
    return obs.batch_need_tps > per_instance * max(0, instances)


def chiron_decision(obs: EndpointObservation, p: ChironParams) -> tuple[ActionKind, str] | None:
    """Chiron's action on one endpoint and why (cooldown handled by the caller)."""
    ibp = interactive_backpressure(obs)
    if ibp is None:
        return None
    seen = f"{obs.interactive_busy}/{obs.interactive_reporting}"
    busy = f"interactive backpressure {ibp:.0%} ({seen})"
    room = obs.active < obs.max_instances
    if ibp > p.interactive_busy_above and room:
        return ActionKind.SCALE_OUT, f"{busy} > {p.interactive_busy_above:.0%}"
    if batch_behind(obs, obs.serving):
        if not room:
            return None
        return ActionKind.SCALE_OUT, (
            f"batch pending time over its deadlines: {obs.batch_need_tps:.0f} tok/s needed, "
            f"{obs.batch_capacity_tps:.0f} tok/s of batch capacity"
        )
    if ibp > p.interactive_busy_above or obs.serving <= obs.min_instances:
        return None
    if batch_behind(obs, obs.serving - 1):
        return None  # the batch share holds: one fewer would miss the deadlines
    pending = "nothing pending" if obs.batch_need_tps <= 0 else "batch still on time"
    return ActionKind.SCALE_IN, f"{busy} <= {p.interactive_busy_above:.0%}, {pending}"


@dataclass(frozen=True)
class Chiron:
    """Chiron's interactive backpressure and batch pending-time rules on a unified pool."""

    params: ChironParams = field(default_factory=ChironParams)
    name: str = "chiron"
    layout: PoolLayout = field(default_factory=PoolLayout)
    batch_via_queue_manager: bool = True
    plan_cadence: PlanCadence = NO_PLAN
    uses_projection: bool = False
    #: Chiron reads its own two signals, not the decision step's queue pressure
    queue_signals: bool = False
    uses_interactive_busy: bool = True
    periodic: bool = False

    @property
    def cooldown_s(self) -> float:
        return self.params.cooldown_s

    def step(self, obs: EndpointObservation, plan: EndpointPlan | None) -> ScalingAction | None:
        decided = chiron_decision(obs, self.params)
        if decided is None:
            return None
        kind, reason = decided
        return ScalingAction(kind, obs.key, 1, reason)


@register_strategy("chiron")
def _make_chiron(params: Mapping[str, Any]) -> Chiron:
    return Chiron(ChironParams.from_mapping(params))
