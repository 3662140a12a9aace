"""OServe's layout loop as two pure steps: one re-plan, and one step of a switch in progress.

Why here and pure: the operator's layout loop (`controller.layout_loop`) and the benchmark's
controller (`sageserve bench oserve`) must follow one rule, or the benchmark measures a loop
the operator does not run. Each world observes (the operator: pods, Prometheus, the plan in
force; the benchmark: its simulated fleet), calls these steps, and applies what they return
(the operator: pod-set targets, Events, status; the benchmark: `Fleet.execute`).

`replan_layout` (OServe §4.3 then §5.2), in order:
1. no request mix to choose by: the layout is kept, unless the GPU budget moved by at least
   one instance of the smallest variant (a new plan), when the first variant, as the ILP
   planned it, fills the budget;
2. a budget smaller than the smallest instance: kept;
3. no layout yet, or the budget moved as in 1: the search's layout for the budget, switched
   to without the gain-against-cost gate (the plan or the pod sets already chose the size);
4. otherwise `layout_switch.replan`: the search's candidates, each switch's gain against its
   cost over the forecast windows, and the `SwitchGate`'s consecutive confirmations;
5. a target abandoned less than `abandoned_hold_s` ago (its pods never served) is not
   proposed again, so a variant that cannot start does not replace pods every re-plan.
A switch is planned make-before-break inside the budget plus the GPUs free now
(`plan_switch`).

`step_switch` (OServe §5.2): the targets per strategy as the started replicas become ready
(`switch_targets`), or, past `stuck_after_s`, the switch abandoned with what serves kept.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from sageserve.plan.layout_search import (
    Layout,
    LayoutSpace,
    Strategy,
    canonical,
    describe,
    packs,
    search_layout,
)
from sageserve.plan.layout_switch import (
    StartupSeconds,
    SwitchGate,
    SwitchPlan,
    Window,
    abandon_switch,
    plan_switch,
    replan,
    stuck_after_s,
    switch_targets,
)
from sageserve.plan.oserve_layouts import Mix

#: How long an abandoned switch's target is not proposed again.
ABANDONED_HOLD_S = 3600.0


@dataclass(frozen=True)
class LayoutSettings:
    """The re-plan's knobs (`spec.layouts` on Kubernetes, the benchmark's options)."""

    confirmations: int = 2
    min_relative_gain: float = 0.02
    #: Algorithm 1's seed: fixed, so a steady mix does not propose another layout each time
    seed: int = 0
    abandoned_hold_s: float = ABANDONED_HOLD_S


@dataclass(frozen=True)
class LayoutMemory:
    """What the loop keeps for one group between re-plans."""

    gate: SwitchGate = field(default_factory=SwitchGate)
    #: the target of the last abandoned switch and until when it is not proposed again
    abandoned: Layout = ()
    abandoned_until: float = 0.0


@dataclass(frozen=True)
class ReplanObservation:
    """What one re-plan of one (model, region, GPU type) sees."""

    now: float
    #: the layout in force
    current: Layout
    #: the GPUs the plan in force (or the pod sets) give the group, and which of the two
    budget: int
    budget_source: str
    #: GPUs free now beyond those the group holds: room to start before stopping
    spare: int
    startup_s: StartupSeconds
    #: the group's strategies in the order declared (the first fills a budget without mix)
    variants: tuple[Strategy, ...]
    #: per-type capacity of each strategy at the mix's types; None without a mix
    space: LayoutSpace | None = None
    mix: Mix | None = None
    #: the horizon as forecast windows (none without a mix), and a line saying how
    windows: tuple[Window, ...] = ()
    outlook: str = ""
    #: seconds of history the mix was counted over (for the messages)
    history_s: float = 0.0


@dataclass(frozen=True)
class ReplanOutcome:
    """A switch to start (None: the layout is kept), the mix it was planned at, the line
    the status shows, and the memory for the next re-plan."""

    switch: SwitchPlan | None
    mix: Mix | None
    message: str
    memory: LayoutMemory


def _begin(
    obs: ReplanObservation,
    space: LayoutSpace,
    target: Layout,
    room: int,
    mix: Mix,
    why: str,
    memory: LayoutMemory,
) -> ReplanOutcome:
    """The switch to `target` inside `room` GPUs (make-before-break whenever they allow)."""
    current = canonical(obs.current)
    if canonical(target) == current:
        return ReplanOutcome(None, None, f"layout {describe(current)} kept: {why}", memory)
    room = max(room, sum(s.gpus for s in current), sum(s.gpus for s in target))
    plan = plan_switch(space, current, target, room, mix.rates, obs.startup_s, space.node_gpus)
    order = "make-before-break" if plan.make_before_break else "break-before-make"
    return ReplanOutcome(plan, mix, f"{why}; {order}, {len(plan.actions)} steps", memory)


def _kept(message: str, memory: LayoutMemory) -> ReplanOutcome:
    return ReplanOutcome(None, None, message, memory)


def gated(current: Layout, budget: int, space: LayoutSpace) -> bool:
    """Whether a re-plan with a mix goes through the gain-against-cost gate (rule 4), the
    only rule that reads the forecast windows: a layout is in force and the budget has not
    moved by an instance of the smallest strategy (rule 2's budget fits one)."""
    held = sum(s.gpus for s in current)
    smallest = min(s.gpus for s in space.capacity)
    return budget >= smallest and bool(current) and held <= budget < held + smallest


def replan_layout(
    obs: ReplanObservation, memory: LayoutMemory, settings: LayoutSettings
) -> ReplanOutcome:
    """One re-plan of one group (the module doc gives the rules in order)."""
    current = canonical(obs.current)
    held = sum(s.gpus for s in current)
    budget, source = obs.budget, obs.budget_source
    if obs.mix is None or obs.space is None:
        first = obs.variants[0]
        if abs(budget - held) >= min(s.gpus for s in obs.variants):
            target = canonical([first] * (budget // first.gpus))
            space = LayoutSpace({s: (1.0,) for s in obs.variants})
            why = (
                f"budget {budget} GPUs ({source}) where {describe(current)} holds {held}, "
                f"no request counted in the last {obs.history_s:.0f} s: {describe(target)}"
            )
            room = max(budget, held) + obs.spare
            return _begin(obs, space, target, room, Mix(((1.0, 1.0),), (1.0,)), why, memory)
        return _kept(
            f"layout {describe(current)} kept: no request counted in the last "
            f"{obs.history_s:.0f} s",
            memory,
        )
    space, mix = obs.space, obs.mix
    smallest = min(s.gpus for s in space.capacity)
    if budget < smallest:
        message = f"layout {describe(current)} kept: a budget of {budget} GPUs ({source})"
        return _kept(message, memory)
    if not gated(current, budget, space):
        start = current if current and packs(current, budget, space.node_gpus) else None
        target = search_layout(space, mix.rates, budget, initial=start).layout
        why = (
            f"budget {budget} GPUs ({source}) where {describe(current)} holds {held}: "
            f"{describe(current)} → {describe(target)} without the gate (the size is "
            "the plan's or the pod sets')"
        )
        return _begin(obs, space, target, max(budget, held) + obs.spare, mix, why, memory)
    decision = replan(
        space,
        current,
        obs.windows,
        budget,
        obs.startup_s,
        memory.gate,
        seed=settings.seed,
        confirmations=settings.confirmations,
        min_relative_gain=settings.min_relative_gain,
    )
    memory = LayoutMemory(decision.gate, memory.abandoned, memory.abandoned_until)
    ev = decision.evaluation
    figures = (
        f" (gain {ev.gain_requests:.1f} requests, cost {ev.cost_requests:.1f})"
        if ev is not None
        else ""
    ) + (f"; {obs.outlook}" if obs.outlook else "")
    plan = decision.plan
    if (
        decision.switch
        and plan is not None
        and canonical(plan.target) == memory.abandoned
        and obs.now < memory.abandoned_until
    ):
        return _kept(
            f"layout {describe(current)} kept: {describe(plan.target)} was abandoned (its "
            f"pods did not become Ready); not proposed again for "
            f"{memory.abandoned_until - obs.now:.0f} s{figures}",
            memory,
        )
    if decision.switch and plan is not None:
        why = f"switching {describe(current)} → {describe(plan.target)}{figures}"
        planned = Mix(mix.centroids, obs.windows[0].rates)  # the mix `decide` planned at
        return _begin(obs, space, plan.target, budget + obs.spare, planned, why, memory)
    proposed = f"; proposed {describe(plan.target)}" if plan is not None else ""
    return _kept(
        f"layout {describe(current)} kept on {budget} GPUs ({source}): "
        f"{decision.reason}{proposed}{figures}",
        memory,
    )


@dataclass(frozen=True)
class SwitchStep:
    """Where a switch in progress stands after one step.

    `targets`: the replicas per strategy now. `done`: the plan's actions taken (keep it for
    the next step). `finished`: every action taken. `abandoned`: the switch was given up
    (stuck), `targets` then being what serves, and `missing` the replicas per strategy that
    never served."""

    targets: dict[Strategy, int]
    done: int
    finished: bool = False
    abandoned: bool = False
    missing: dict[Strategy, int] = field(default_factory=dict)


def step_switch(
    now: float,
    plan: SwitchPlan,
    done: int,
    since: float,
    serving: Mapping[Strategy, int],
    startup_s: Mapping[Strategy, float],
) -> SwitchStep:
    """One step of the switch begun at `since`, with `serving` replicas per strategy ready
    now: the next targets, or the switch abandoned once it ran past `stuck_after_s`."""
    if now - since > stuck_after_s(plan, startup_s):
        expected = switch_targets(plan, serving, done).targets
        missing = {s: n - serving.get(s, 0) for s, n in expected.items() if n > serving.get(s, 0)}
        kept = abandon_switch(plan, serving, done)
        return SwitchStep(dict(kept), done, abandoned=True, missing=missing)
    progress = switch_targets(plan, serving, done)
    return SwitchStep(dict(progress.targets), progress.done, finished=progress.finished)


def memory_after_abandon(plan: SwitchPlan, now: float, settings: LayoutSettings) -> LayoutMemory:
    """After an abandoned switch: the gate restarts and its target is held off."""
    return LayoutMemory(SwitchGate(), canonical(plan.target), now + settings.abandoned_hold_s)
