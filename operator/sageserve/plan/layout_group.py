"""One (model, region, GPU type)'s OServe layout between two passes of a layout loop, and
the pass's rules that do not depend on where the loop runs (OServe §4.2, §4.3, §5.2).

Why here: the operator's layout loop (`controller.layout_loop`) and the fleet simulator's
(`sim.layout_loop`) must hold the same state and move it the same way, or the simulator
measures a loop the operator does not run. Each world observes (the operator: pod sets,
Ready pods, Prometheus, free node GPUs; the simulator: its endpoints, its router's shape
counts, its inventory) and applies (Events and status, or the run's record); the state and
its moves live here:

- `take_in_force`: on the first pass (or after an empty layout) the layout in force is
  what the variants run;
- `advance`: a switch in progress stepped as its started replicas serve
  (`layout_step.step_switch`), or abandoned with what serves kept;
- `observation` and `with_mix`: what one re-plan sees (the budget of
  `oserve_layouts.budget_gpus`, the room, the mix and the capacities);
- `begin`: a re-plan's outcome applied (a switch started);
- `managed_targets`: the layouts in force as the decision step's targets (an empty layout is
  not managed);
- `group_weights` and `published_types`: the assignment's per-variant weights of the layout
  in force at the measured mix, as `status.layouts` publishes them for the router.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from sageserve.api.scaling_policy import Layouts
from sageserve.core.snapshot import Plan
from sageserve.core.types import EndpointKey
from sageserve.plan.layout_search import Layout, LayoutSpace, Strategy, canonical, describe
from sageserve.plan.layout_step import (
    LayoutMemory,
    LayoutSettings,
    ReplanObservation,
    ReplanOutcome,
    gated,
    memory_after_abandon,
    step_switch,
)
from sageserve.plan.layout_switch import SwitchPlan
from sageserve.plan.oserve_layouts import (
    LayoutGroup,
    LayoutTargets,
    Mix,
    budget_gpus,
    variant_weights,
)

#: (model deployment, region, GPU type)
GroupKey = tuple[str, str, str]


def layout_settings(spec: Layouts) -> LayoutSettings:
    """The re-plan's knobs from `spec.layouts`."""
    return LayoutSettings(
        confirmations=spec.confirmations, min_relative_gain=spec.min_gain_fraction
    )


@dataclass
class GroupState:
    """One (model, region, GPU type)'s layout in force and what the loop keeps for it."""

    layout: Layout = ()
    #: the re-plan's gate and abandoned target (`plan.layout_step`)
    memory: LayoutMemory = field(default_factory=LayoutMemory)
    switch: SwitchPlan | None = None
    done: int = 0
    #: when the switch in progress began (the loop's clock), to find it stuck
    switch_since: float = 0.0
    targets: dict[str, int] = field(default_factory=dict)
    message: str = ""
    computed_at: float = 0.0
    mix: Mix | None = None
    capacity: dict[Strategy, tuple[float, ...]] = field(default_factory=dict)


def managed_targets(groups: Mapping[GroupKey, GroupState], changed_at: float) -> LayoutTargets:
    """The layouts in force as the decision step's targets (`with_layouts`). An empty layout
    (no instance, no switch) is not managed: the strategy's floor and from-zero rules size
    the endpoint until it holds GPUs again."""
    out = {
        (EndpointKey(model, region), variant): n
        for (model, region, _), g in groups.items()
        if g.switch is not None or any(g.targets.values())
        for variant, n in g.targets.items()
    }
    return LayoutTargets(out, changed_at)


def take_in_force(g: GroupState, group: LayoutGroup, replicas: Mapping[str, int]) -> None:
    """On the first pass, or with an empty layout, the layout in force is what the variants
    run (`replicas` per variant: the pod sets' spec.replicas, serving or coming up)."""
    if g.switch is None and not any(g.targets.values()):
        g.targets = dict(replicas)
        g.layout = group.layout(replicas)


@dataclass(frozen=True)
class Advanced:
    """What one step of a switch did: `finished` (its last action taken) or `abandoned`
    (stuck: what serves is kept), with the replicas per variant that never served."""

    finished: bool = False
    abandoned: bool = False
    #: variant name → replicas that did not come up (abandoned only)
    missing: dict[str, int] = field(default_factory=dict)
    plan: SwitchPlan | None = None


def advance(
    g: GroupState,
    group: LayoutGroup,
    now: float,
    ready: Mapping[str, int],
    settings: LayoutSettings,
) -> Advanced:
    """Advance a switch in progress as its started replicas serve (`step_switch`, OServe
    §5.2 executed make-before-break); a switch whose new replicas did not serve in time is
    abandoned: what serves is kept and the target is not proposed again for
    `settings.abandoned_hold_s`. `ready`: serving replicas per variant name. The caller
    words the message and the Events (`g.message` is set for a finished switch only when
    every target serves; the caller adds what is still coming)."""
    if g.switch is None:
        return Advanced()
    plan, by = g.switch, group.by_strategy
    serving = {s: ready.get(v.name, 0) for s, v in by.items()}
    step = step_switch(now, plan, g.done, g.switch_since, serving, group.startup_seconds())
    g.done = step.done
    g.targets = {by[s].name: n for s, n in step.targets.items() if s in by}
    for v in group.variants:
        g.targets.setdefault(v.name, 0)
    if step.abandoned:
        g.layout = group.layout(g.targets)
        g.memory = memory_after_abandon(plan, now, settings)
        g.switch = None
        missing = {by[s].name: n for s, n in step.missing.items() if s in by}
        return Advanced(abandoned=True, missing=missing, plan=plan)
    if step.finished:
        g.switch = None
        return Advanced(finished=True, plan=plan)
    return Advanced(plan=plan)


def abandoned_message(g: GroupState, adv: Advanced, now: float, since: float) -> str:
    """The line an abandoned switch leaves in the status (and its Warning)."""
    assert adv.plan is not None
    waited = ", ".join(f"{n} pod(s) of variant {v}" for v, n in sorted(adv.missing.items()))
    return (
        f"switch {describe(adv.plan.current)} → {describe(adv.plan.target)} abandoned after "
        f"{now - since:.0f} s: {waited or 'started pods'} not Ready "
        f"(see the pods' events: image pull, scheduling, crash loop); layout kept at "
        f"{describe(g.layout)}"
    )


def finished_message(g: GroupState, adv: Advanced, ready: Mapping[str, int]) -> str:
    """The line a finished switch leaves in the status (and its Event)."""
    assert adv.plan is not None
    waiting = sum(max(0, n - ready.get(v, 0)) for v, n in g.targets.items())
    return f"switched {describe(adv.plan.current)} → {describe(adv.plan.target)}" + (
        f" ({waiting} pod(s) of the last starts not Ready yet)" if waiting else ""
    )


def observation(
    g: GroupState,
    group: LayoutGroup,
    region: str,
    plan: Plan | None,
    replicas: Mapping[str, int],
    spare: int,
    now: float,
    history_s: float,
) -> ReplanObservation:
    """What one re-plan sees before the mix: the layout in force, the budget (the plan's
    instances of the group's variants × their GPUs when a plan covers the (model, region),
    else what the layout in force holds: its own targets, which the replicas follow a pace
    pass later, `oserve_layouts.budget_gpus`), the GPUs free beyond it (`spare`), the
    variants' start-up times."""
    budget, source = budget_gpus(group, region, plan, g.targets or replicas)
    g.computed_at = now
    return ReplanObservation(
        now,
        g.layout,
        budget,
        source,
        spare,
        group.startup_seconds(),
        tuple(group.strategy(v) for v in group.variants),
        history_s=history_s,
    )


def with_mix(
    g: GroupState,
    obs: ReplanObservation,
    mix: Mix,
    capacity: dict[Strategy, tuple[float, ...]],
    node_gpus: int,
) -> tuple[ReplanObservation, bool]:
    """The observation with the measured mix and the per-type capacities (kept in `g` for
    the weights), and whether the re-plan goes through the gate (only then are forecast
    windows needed: the caller adds them)."""
    g.mix, g.capacity = mix, capacity
    space = LayoutSpace(capacity, node_gpus=node_gpus)
    obs = replace(obs, space=space, mix=mix)
    return obs, gated(canonical(g.layout), obs.budget, space)


def begin(g: GroupState, outcome: ReplanOutcome, now: float) -> bool:
    """Apply a re-plan's outcome: the memory and message kept, a switch started (True)."""
    g.memory, g.message = outcome.memory, outcome.message
    if outcome.switch is None:
        return False
    g.switch, g.done, g.switch_since = outcome.switch, 0, now
    g.layout = canonical(outcome.switch.target)
    return True


def group_weights(group: LayoutGroup, g: GroupState) -> list[dict[str, float]]:
    """Per type, the share of its requests each variant gets: the assignment LP of the
    layout in force at the measured mix (`variant_weights`, OServe §4.2); none before a mix
    was measured. Raises RuntimeError or ValueError when the LP fails."""
    if g.mix is None or not g.capacity:
        return []
    return variant_weights(group, g.capacity, canonical(g.layout), g.mix.rates)


def published_types(
    mix: Mix | None, weights: Sequence[Mapping[str, float]]
) -> list[dict[str, Any]]:
    """`status.layouts[].types`: each type's centroid tokens, rate and per-variant weights,
    rounded as published (the router dispatches by what it reads)."""
    types: list[dict[str, Any]] = []
    if mix is None:
        return types
    for j, (p, o) in enumerate(mix.centroids):
        types.append(
            {
                "promptTokens": round(p, 1),
                "outputTokens": round(o, 1),
                "rate": round(mix.rates[j], 4),
                "weights": [
                    {"variant": v, "weight": w}
                    for v, w in sorted((weights[j] if j < len(weights) else {}).items())
                ],
            }
        )
    return types
