"""The decision step: one pure function that every world calls to scale its fleet.

`decide(now, snapshot, plan, state, strategy)` owns everything the operator and the
simulator used to re-derive each in its own way:

- **plan adoption**: a plan newer than the one in force replaces it (a restarted operator
  passes the plan recorded in status; the simulator the one its planner just made);
- **hold on missing data**: an endpoint whose serving instances report nothing is held
  (no action at all); with partial data (some instances silent) it may scale out but never
  in, because a silent instance may be the full one (DESIGN: failure behaviour). Partial
  data is reported (`held`, with how many report) once it has lasted
  `report_partial_after_s`, whatever the strategy wanted: a new instance is silent until
  its first scrape, which is no fault;
- **from zero and the floor**: an endpoint with nothing serving or coming scales out when
  requests wait for it (the activator pattern; with nothing serving its utilisation is
  undefined, not 100 %), and an endpoint below `minInstances` is brought back to it;
- **cooldowns**: at most one scaling event per endpoint per `strategy.cooldown_s`
  (SageServe: 15 s); the time of each endpoint's last event is the state the caller keeps;
- **the split over variants**: the ILP plans per (model, region, GPU type / variant); a
  scale-out goes to the variant furthest below its planned target, a scale-in comes from
  the one furthest above it, so the plan's choice of GPU type is what runs;
- **which instance to drain**: the least-loaded serving instances of the variant that
  shrinks (`core.snapshot.drain_order`), so a scale-in loses the least work;
- **queue pressure**: a backlog of waiting requests or a TTFT above the tier's SLO reaches
  every strategy as `pressure` next to EMU (`pace.pressure`), so a queue that grows while
  the KV cache stays low is seen (the HPA and AIBrix take the largest of several signals);
  where an endpoint picker fronts the endpoint, its queue and saturation are read the same
  way and the larger of its pressure and the engines' counts;
  after such a signal at its level no scale-in for 5 minutes (the HPA's scale-down
  stabilization), the time of the last one being state the caller keeps. A strategy that
  declares `queue_signals` off (the literal baselines: `reactive-paper`, `chiron`) gets
  neither.

The strategy (reactive, LT-I/U/UA, ...) only says whether one endpoint should grow or
shrink now. Where new capacity comes from (spot order, SageServe §6.4) is the pure
`pace.spot.reclaim_order`, which both executors call, because placement depends on the
executor's unit (nodes scheduled by Kubernetes, simulated instances).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from sageserve.core.snapshot import (
    Decision,
    EndpointSnapshot,
    Plan,
    Snapshot,
    drain_order,
)
from sageserve.core.types import ActionKind, EndpointKey, ScalingAction
from sageserve.pace.base import PacingStrategy
from sageserve.pace.pressure import SCALE_IN_STABILIZATION_S, endpoint_pressure, holds_scale_in


@dataclass(frozen=True)
class StepState:
    """What the caller keeps between steps: the plan in force, each endpoint's last
    scaling event (for the cooldown) and the last time its queue-side pressure was at its
    level (for the scale-in stabilization). A plain value: the operator keeps it in memory
    (a restart loses only cooldowns and stabilization), the simulator per run."""

    plan: Plan | None = None
    last_event: Mapping[EndpointKey, float] = field(default_factory=dict)
    saturated_at: Mapping[EndpointKey, float] = field(default_factory=dict)
    #: since when each endpoint with partial data has had it (cleared once all report)
    partial_since: Mapping[EndpointKey, float] = field(default_factory=dict)
    #: each endpoint's last scale-in (PreServe's "at most once per window")
    last_scale_in: Mapping[EndpointKey, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Held:
    """An endpoint the step held for lack of data, and why: with nothing reporting, every
    action; with some instances silent (`partial`), scale-in. `reporting` of `serving`
    serving instances report their load."""

    key: EndpointKey
    reason: str
    reporting: int = 0
    serving: int = 0
    #: since when the data has been partial (None when nothing reports)
    since: float | None = None

    @property
    def partial(self) -> bool:
        return 0 < self.reporting < self.serving


@dataclass(frozen=True)
class StepOutcome:
    decisions: list[Decision]
    state: StepState
    held: list[Held]


def adopt(state: StepState, plan: Plan | None) -> StepState:
    """The state with `plan` in force if it is newer than the current one, or as new and
    different (the same plan with an OServe layout's targets laid over it,
    `plan.oserve_layouts.with_layouts`, changes as a switch proceeds)."""
    if plan is None or state.plan is plan:
        return state
    if state.plan is not None and (
        plan.computed_at < state.plan.computed_at
        or (plan.computed_at == state.plan.computed_at and plan == state.plan)
    ):
        return state
    return replace(state, plan=plan)


def layout_move(ep: EndpointSnapshot, targets: Mapping[str, int]) -> Decision | None:
    """The move of an endpoint's OServe layout variants to their own targets (OServe §5.2
    on Kubernetes), or None when each is at its target.

    Every variant below its target first (a scale-out: the starts of a switch plan), and
    only when none is below, every one above (a scale-in: its stops, least-loaded pods
    drained). So one pass never both starts and stops, and when the layout loop's targets
    (`plan.layout_switch.switch_targets`) raise the new variants before lowering the old
    ones, the old pods go only once the new ones count in the targets' place.

    Why not through the strategy: the layout decides *which* variants run on the GPUs the
    plan (or the pod sets) give the (model, region, GPU type); the strategies size an
    endpoint's total and would move a layout only when utilisation crosses a threshold."""
    below = {v: n for v, n in targets.items() if ep.replicas.get(v, 0) < n}
    if below:
        count = sum(n - ep.replicas.get(v, 0) for v, n in below.items())
        sizes = ", ".join(f"{v}={n}" for v, n in sorted(below.items()))
        reason = f"OServe layout: start {sizes}"
        return Decision(ep.key, ActionKind.SCALE_OUT, count, dict(sorted(below.items())), reason)
    above = {v: n for v, n in targets.items() if ep.replicas.get(v, 0) > n}
    if not above:
        return None
    drain: list[str] = []
    for v, n in above.items():
        mine = tuple(i for i in ep.instances if i.variant == v)
        drain += [i.name for i in drain_order(mine)[: ep.replicas.get(v, 0) - n]]
    count = sum(ep.replicas.get(v, 0) - n for v, n in above.items())
    sizes = ", ".join(f"{v}={n}" for v, n in sorted(above.items()))
    return Decision(
        ep.key,
        ActionKind.SCALE_IN,
        count,
        dict(sorted(above.items())),
        f"OServe layout: stop to {sizes}",
        tuple(sorted(drain)),
    )


def split_over_variants(
    kind: ActionKind,
    count: int,
    replicas: Mapping[str, int],
    variants: tuple[str, ...],
    targets: Mapping[str, int],
) -> dict[str, int]:
    """New replicas per variant after adding or removing `count` instances (changed only).

    Out: each instance goes to the variant furthest below its planned target, else the
    first variant in spec order. In: each comes from the variant furthest above its target
    (with no plan: the one with the most replicas, the later variant on ties).
    Deterministic, so a retried step decides alike.
    """
    order = list(variants) + sorted(v for v in replicas if v not in variants)
    rank = {v: i for i, v in enumerate(order)}
    now = {v: replicas.get(v, 0) for v in order}
    changed: set[str] = set()
    for _ in range(count):
        if kind is ActionKind.SCALE_OUT:
            pick = max(order, key=lambda v: (targets.get(v, 0) - now[v], -rank[v]))
            if targets.get(pick, 0) - now[pick] <= 0:
                pick = order[0]
            now[pick] += 1
        else:
            candidates = [v for v in order if now[v] > 0]
            if not candidates:
                break
            pick = max(candidates, key=lambda v: (now[v] - targets.get(v, 0), rank[v]))
            now[pick] -= 1
        changed.add(pick)
    return {v: now[v] for v in order if v in changed}


def to_decision(action: ScalingAction, ep: EndpointSnapshot, plan: Plan | None) -> Decision:
    """A strategy's action on one endpoint, made concrete: replicas per variant, drains.
    Variants an OServe layout sizes are left out of the split (the layout moves them)."""
    variants = ep.variants or tuple(sorted(ep.replicas))
    if plan is not None and plan.layout_variants:
        managed = plan.layout_targets(ep.key)
        variants = tuple(v for v in variants if v not in managed)
        ep = replace(ep, replicas={v: n for v, n in ep.replicas.items() if v not in managed})
        if not variants:
            return Decision(ep.key, action.kind, 0, {}, action.reason)
    targets = {v: plan.variant_target(ep.key, v) for v in variants} if plan else {}
    replicas = split_over_variants(action.kind, action.count, ep.replicas, variants, targets)
    drain: list[str] = []
    if action.kind is ActionKind.SCALE_IN:
        for variant, n in replicas.items():
            fewer = ep.replicas.get(variant, 0) - n
            mine = tuple(i for i in ep.instances if i.variant == variant)
            drain += [i.name for i in drain_order(mine)[:fewer]]
    count = sum(abs(n - ep.replicas.get(v, 0)) for v, n in replicas.items())
    return Decision(ep.key, action.kind, count, replicas, action.reason, tuple(sorted(drain)))


def _layout_step(ep: EndpointSnapshot, plan: Plan | None) -> tuple[Decision | None, bool]:
    """(the layout's move on the endpoint, whether a layout sizes all of its variants). A
    stop waits while some serving instance is silent: it may be a new one not counted yet."""
    managed = plan.layout_targets(ep.key) if plan else {}
    if not managed:
        return None, False
    move = layout_move(ep, managed)
    if move is not None and move.kind is ActionKind.SCALE_IN and ep.partial_data:
        move = None
    return move, len(managed) >= len(ep.variants or ep.replicas)


def _floor_action(ep: EndpointSnapshot) -> ScalingAction | None:
    """Scale-out the strategy cannot be asked for: from zero on demand, up to the floor."""
    active = ep.serving + ep.provisioning
    if active >= ep.max_instances:
        return None
    if active == 0 and ep.demand_waiting > 0:
        need = max(1, ep.min_instances)
        reason = f"from zero: {ep.demand_waiting} request(s) waiting"
        return ScalingAction(ActionKind.SCALE_OUT, ep.key, need, reason)
    if active < ep.min_instances:
        reason = f"{active} instance(s) below minInstances {ep.min_instances}"
        return ScalingAction(ActionKind.SCALE_OUT, ep.key, ep.min_instances - active, reason)
    return None


def _lacking_data(
    ep: EndpointSnapshot, now: float, partial_since: dict[EndpointKey, float], after_s: float
) -> Held | None:
    """What to report of an endpoint's missing or partial data (partial: once it has lasted
    `after_s`, counted in `partial_since`, which this keeps up to date)."""
    if not ep.partial_data:
        partial_since.pop(ep.key, None)
    if ep.missing_data:
        reason = f"none of {ep.serving} serving instance(s) reports its load"
        return Held(ep.key, reason, 0, ep.serving)
    if not ep.partial_data:
        return None
    began = partial_since.setdefault(ep.key, now)
    if now - began < after_s:
        return None
    reason = f"{ep.reporting} of {ep.serving} serving instance(s) report: no scale-in"
    return Held(ep.key, reason, ep.reporting, ep.serving, began)


def _strategy_action(
    now: float,
    ep: EndpointSnapshot,
    state: StepState,
    strategy: PacingStrategy,
    saturated: dict[EndpointKey, float],
    last_event: float | None,
    last_scale_in: float | None,
    stabilization_s: float,
) -> ScalingAction | None:
    """The strategy's action on one endpoint with the step's signals added (queue pressure,
    the endpoint's last events), a scale-in held during the pressure's stabilization."""
    key = ep.key
    endpoint_plan = state.plan.for_endpoint(key) if state.plan else None
    if not strategy.queue_signals:  # a literal baseline: its own signals only, no hold
        obs = replace(ep.observation(now), last_event_at=last_event, last_scale_in_at=last_scale_in)
        return strategy.step(obs, endpoint_plan)
    pressure = endpoint_pressure(ep)
    if pressure.ratio > 0:
        obs = replace(
            ep.observation(now),
            last_event_at=last_event,
            last_scale_in_at=last_scale_in,
            pressure=pressure.ratio,
            pressure_reason=pressure.describe(),
        )
    else:
        obs = replace(ep.observation(now), last_event_at=last_event, last_scale_in_at=last_scale_in)
    if pressure.ratio >= 1.0:
        saturated[key] = now
    action = strategy.step(obs, endpoint_plan)
    if (
        action is not None
        and action.kind is ActionKind.SCALE_IN
        and holds_scale_in(now, saturated.get(key), stabilization_s)
    ):
        return None
    return action


def _paced(
    now: float,
    ep: EndpointSnapshot,
    state: StepState,
    strategy: PacingStrategy,
    saturated: dict[EndpointKey, float],
    since: float | None,
    last_scale_in: float | None,
    stabilization_s: float,
) -> Decision | None:
    """The floor's or the strategy's decision on one endpoint (None: nothing to do)."""
    action = _floor_action(ep)
    if action is None and ep.serving + ep.provisioning > 0:
        action = _strategy_action(
            now, ep, state, strategy, saturated, since, last_scale_in, stabilization_s
        )
    if action is not None and action.kind is ActionKind.SCALE_IN and ep.partial_data:
        action = None  # a silent instance may be the full one
    if action is None:
        return None
    decision = to_decision(action, ep, state.plan)
    return decision if decision.count else None


def decide(
    now: float,
    snapshot: Snapshot,
    plan: Plan | None,
    state: StepState,
    strategy: PacingStrategy,
    report_partial_after_s: float = 0.0,
    scale_in_stabilization_s: float = SCALE_IN_STABILIZATION_S,
) -> StepOutcome:
    """Decisions for the endpoints of `snapshot`, in key order, and the state after them.

    Endpoints with partial data are in `held` once it has lasted `report_partial_after_s`
    (their scale-in is held from the first step). A scale-in waits
    `scale_in_stabilization_s` after the endpoint's queue-side pressure was last at its
    level (`spec.intervals.scaleInStabilizationSeconds`)."""
    state = adopt(state, plan)
    last = dict(state.last_event)
    saturated = dict(state.saturated_at)
    partial_since = dict(state.partial_since)
    scaled_in = dict(state.last_scale_in)
    decisions: list[Decision] = []
    held: list[Held] = []
    for key in sorted(snapshot.endpoints):
        ep = snapshot.endpoints[key]
        lacking = _lacking_data(ep, now, partial_since, report_partial_after_s)
        if lacking is not None:
            held.append(lacking)
            if not lacking.partial:
                continue
        since = last.get(key)
        if since is not None and now - since < strategy.cooldown_s:
            continue
        decision, owned = _layout_step(ep, state.plan)
        if decision is None and not owned:  # else the layout sizes every variant
            decision = _paced(
                now,
                ep,
                state,
                strategy,
                saturated,
                since,
                scaled_in.get(key),
                scale_in_stabilization_s,
            )
        if decision is None:
            continue
        if decision.kind is ActionKind.SCALE_IN and ep.stuck_terminating:
            continue  # an earlier scale-in is stuck: held, and no cooldown booked for it
        decisions.append(decision)
        last[key] = now
        if decision.kind is ActionKind.SCALE_IN:
            scaled_in[key] = now
    return StepOutcome(
        decisions, StepState(state.plan, last, saturated, partial_since, scaled_in), held
    )
