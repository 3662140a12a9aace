"""Reactive baselines of SageServe §4 and §7.1: unified 70/30 and siloed pools.

Unified reactive: one pool per (model, region) serves all tiers; on every request arrival at
the endpoint, if its effective memory utilisation is above 70% add an instance, below 30%
donate one to spot; at most one scaling event per endpoint per 15 s cooldown. Instances come
from the spot pool (same model first, then other models' spot via redeploy) - that part is
the executor's job. Batch work waits in the Queue Manager.

Siloed: the same rule applied to separate interactive and batch pools; batch requests go
straight to the batch pool (the status quo at O365 before unification).

What `reactive` adds to the paper's rule, each absent from `reactive-paper`, the rule
exactly as SageServe §4 / §7.1 states it (EMU over serving instances > 70 % out one, < 30 %
in one, 15 s cooldown, nothing else):

1. capacity on its way counts (`count_provisioning`): EMU is scaled by serving ÷ (serving +
   coming up), the Kubernetes HPA's convention for unready pods; the literal rule reads
   serving instances only, so a burst adds an instance every cooldown until the first one
   is up (1-10 min later);
2. no scale-in while an instance is still coming up (`scale_in_while_provisioning` off);
3. the queue-side signals of the decision step (`pace.pressure`): waiting requests per
   instance, an interactive tier's TTFT P95 over its SLO and the batch deadline need, put
   on EMU's scale, the largest read (`pace.pressure.load`), so a queue that grows while
   EMU stays low scales out too;
4. after such a signal at its level, no scale-in for the policy's
   `intervals.scaleInStabilizationSeconds` (the HPA's scale-down stabilization).

Both keep what every strategy shares in `pace.step.decide` and the executors: the floor
(`minInstances`, from zero when requests wait), the ceiling (`maxInstances`), the hold on
missing or partial load data, the split over variants and the spot order.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from sageserve.core.snapshot import EndpointPlan
from sageserve.core.types import ActionKind, EndpointObservation, ScalingAction
from sageserve.pace.base import NO_PLAN, PlanCadence, PoolLayout, register_strategy
from sageserve.pace.pressure import load, load_reason


@dataclass(frozen=True)
class ReactiveParams:
    """Thresholds of the 70/30 rule (SageServe §4, §7.1) and its cooldown."""

    scale_out_above: float = 0.70
    scale_in_below: float = 0.30
    cooldown_s: float = 15.0
    count_provisioning: bool = True
    #: False: scale in whatever is coming up (the literal rule); True waits for it
    scale_in_while_provisioning: bool = False

    @classmethod
    def from_mapping(cls, raw: Mapping[str, Any]) -> ReactiveParams:
        known = {k: raw[k] for k in cls.__dataclass_fields__ if k in raw}
        return cls(**known)


def reactive_decision(obs: EndpointObservation, p: ReactiveParams) -> ActionKind | None:
    """The pure 70/30 rule for one endpoint observation (cooldown handled by the caller), on
    the largest of EMU and the queue pressure."""
    emu = load(obs, p.scale_out_above)
    if p.count_provisioning and obs.provisioning:
        # (an endpoint whose every instance is still coming up projects to 0: wait for it)
        emu = emu * obs.serving / (obs.serving + obs.provisioning)
    if emu > p.scale_out_above and obs.active < obs.max_instances:
        return ActionKind.SCALE_OUT
    settled = p.scale_in_while_provisioning or obs.provisioning == 0
    if emu < p.scale_in_below and obs.serving > obs.min_instances and settled:
        return ActionKind.SCALE_IN
    return None


@dataclass(frozen=True)
class UnifiedReactive:
    """Unified pool, 70/30 on arrival, 15 s cooldown per endpoint (SageServe §7.1)."""

    params: ReactiveParams = field(default_factory=ReactiveParams)
    name: str = "reactive"
    layout: PoolLayout = field(default_factory=PoolLayout)
    batch_via_queue_manager: bool = True
    #: baselines ignore forecasts: executors need not run the planner for them
    plan_cadence: PlanCadence = NO_PLAN
    uses_projection: bool = False
    #: the step's queue-side signals and scale-in hold (off: the literal paper rule)
    queue_signals: bool = True
    uses_interactive_busy: bool = False
    periodic: bool = False

    @property
    def cooldown_s(self) -> float:
        return self.params.cooldown_s

    def step(self, obs: EndpointObservation, plan: EndpointPlan | None) -> ScalingAction | None:
        if not self.queue_signals:
            obs = replace(obs, pressure=0.0, pressure_reason="")  # EMU alone, as the paper
        kind = reactive_decision(obs, self.params)
        if kind is None:
            return None
        sign = ">" if kind is ActionKind.SCALE_OUT else "<"
        reason = f"{load_reason(obs, self.params.scale_out_above)} {sign} threshold"
        return ScalingAction(kind, obs.key, 1, reason)


@dataclass(frozen=True)
class SiloedReactive(UnifiedReactive):
    """Separate interactive and batch pools, each under the 70/30 rule (SageServe §4, Fig. 5)."""

    name: str = "siloed"
    layout: PoolLayout = field(default_factory=lambda: PoolLayout(siloed=True))
    batch_via_queue_manager: bool = False


@register_strategy("reactive")
def _make_reactive(params: Mapping[str, Any]) -> UnifiedReactive:
    return UnifiedReactive(ReactiveParams.from_mapping(params))


@register_strategy("reactive-paper")
def _make_reactive_paper(params: Mapping[str, Any]) -> UnifiedReactive:
    """The literal rule of SageServe §4 / §7.1 ("Reactive"): EMU of serving instances only,
    > 70 % out one, < 30 % in one, 15 s cooldown; none of the four additions of `reactive`
    (module doc). The operator runs it too."""
    merged = {**params, "count_provisioning": False, "scale_in_while_provisioning": True}
    return UnifiedReactive(
        ReactiveParams.from_mapping(merged), name="reactive-paper", queue_signals=False
    )


@register_strategy("siloed")
def _make_siloed(params: Mapping[str, Any]) -> SiloedReactive:
    share = float(params.get("interactive_share", 0.8))
    return SiloedReactive(
        ReactiveParams.from_mapping(params), layout=PoolLayout(siloed=True, interactive_share=share)
    )
