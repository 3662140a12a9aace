"""When to move from the running layout to the one the search proposes, and how (OServe §5.2).

OServe re-plans every span and switches whenever the best strategy changes (§5.2, App. F):
its ad hoc switch moves weight shards GPU-to-GPU in about 10 s, so a switch is nearly free
and the paper has no hysteresis ([GAP], digest A7: "switch only if predicted gain × horizon
> predicted switch cost" is our addition). On Kubernetes a layout change replaces pods, and a
new pod loads its weights from scratch (`Variant.startupSeconds`, 10 min by default;
OServe §6: reloading takes "over 50 seconds" even on a warm host). So this module answers
two questions, both pure:

1. **Is the switch worth it?** (`evaluate_switch`) Over a horizon cut into forecast windows
   (e.g. the next hour as 6-12 windows of 5-10 min, each with the predicted rate of every
   request type), the gain is the extra served requests of the target layout,
   Σ_w overlap(w, [switch done, horizon]) · (Φ_new(w) − Φ_old(w)), with Φ from the
   assignment LP (`plan/oserve_assign.max_throughput`, §4.2): served throughput × time, or
   equivalently the reduction of unserved requests. Before the switch completes the old
   layout serves, so only the time after it counts. The cost is the issue's: GPUs started
   × their start-up time, in GPU-seconds that serve nothing, turned into requests at the
   current layout's served requests per GPU-second (the service a GPU gives now; the target
   layout's when the current one serves nothing).
2. **How to switch?** (`plan_switch`) Keep every replica whose (TP, PP) the target also has
   (a multiset intersection: replicas of one strategy are interchangeable, so this keeps
   the most replicas and the most GPUs), start the rest of the target, stop the rest of
   the current layout. Make-before-break when the spare GPUs allow: every start comes
   before any stop, so every intermediate layout contains the old one or the new one and
   the capacity never drops below min(old, new) (the LP's feasible set only grows with a
   replica). Otherwise break-before-make in steps that keep the most capacity: start what
   fits (the start that adds the most capacity first), and when nothing fits, stop the
   replica whose loss leaves the most capacity, preferring one that alone frees enough
   GPUs for a pending start. Capacity is the target mix's: θ·Σλ from `mix_scale`, the
   requests/s the layout could serve at the first window's mix (uncapped, so a drop shows
   even when both layouts serve all of the demand).

**Hysteresis, settled** (`decide`): switch only when (a) the net gain (gain − cost) is
positive, (b) the gain is at least `min_relative_gain` (default 2 %) of what the current
layout serves over the horizon, and (c) (a) and (b) held in `confirmations` consecutive
re-plans (default 2). Why each:
- (a) is the issue's rule: a switch that costs more service than it brings is a loss even
  when the forecast is exact;
- (b) because the capacities n are analytical (`perf/capacity.py`) and the pipeline
  profiles derived (App. D): a predicted gain of a fraction of a percent is inside the
  model's error, and a switch replaces real pods on its strength;
- (c) because the forecast is what is uncertain: OServe's own moving-average baseline is
  off by 43 % RRMSE (§5.1), and one window's spike makes one plan look better; the paper
  leans on re-optimising every minute with a 10 s switch (§5.1), which a 10-minute pod
  start-up cannot afford. Two confirmations at a 5-10 minute re-plan interval mean the
  change lasted at least one interval, the paper's observed minimum switching interval
  (Fig. 14: 5 minutes). The streak counts consecutive worthwhile re-plans whatever their
  target (a drifting mix may propose near-equal layouts in turn; the switch goes to the
  latest one, re-evaluated on the newest forecast); a re-plan that is not worthwhile
  resets it. `confirmations=1` is the paper's behaviour.

`replan` glues one re-plan together: the layout search on the horizon's mean mix (on the
whole budget and on the GPUs already held, since Algorithm 1 fills spare GPUs for headroom
that the switch cost does not pay for), then `decide` on each candidate.

What is not modelled: where pods land (GPU counts and, with `node_gpus`, the first-fit
packing of `layout_search.packs`; the scheduler places the real pods), KV migration or
draining of in-flight requests (§5.2: drain short, migrate long; a stopped pod here loses
its requests as the twin's do), and OServe's shard transfer plan (Algorithm 2), which needs
GPU-to-GPU weight copies vLLM does not offer.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from sageserve.plan.layout_search import (
    Layout,
    LayoutSpace,
    Strategy,
    canonical,
    packs,
    search_layout,
)
from sageserve.plan.oserve_assign import max_throughput, mix_scale

StartupSeconds = float | Mapping[Strategy, float]


@dataclass(frozen=True)
class Window:
    """One forecast window of the horizon: its length and the predicted requests/s per type."""

    duration_s: float
    rates: tuple[float, ...]


@dataclass(frozen=True)
class SwitchAction:
    """One step: start a replica (and wait until it serves) or stop one.

    `layout_after`: the replicas serving once the step is done; `capacity_after`: its
    requests/s at the planned mix (θ·Σλ); `gpus_after`: GPUs held (serving or starting)."""

    kind: Literal["start", "stop"]
    strategy: Strategy
    layout_after: Layout
    capacity_after: float
    gpus_after: int


@dataclass(frozen=True)
class SwitchPlan:
    """How to go from `current` to `target`.

    Consecutive start actions may run at once (they only add capacity); a stop waits for
    the starts before it to serve. `min_capacity`: the lowest capacity over the current
    layout and every step; `make_before_break`: every start precedes every stop;
    `start_waves`: runs of consecutive starts (each costs one start-up time);
    `gpu_seconds`: GPUs started × their start-up time (the switch cost)."""

    current: Layout
    target: Layout
    keep: Layout
    start: Layout
    stop: Layout
    actions: tuple[SwitchAction, ...]
    capacity_before: float
    capacity_after: float
    min_capacity: float
    make_before_break: bool
    start_waves: int
    duration_s: float
    gpu_seconds: float

    @property
    def final_layout(self) -> Layout:
        return self.actions[-1].layout_after if self.actions else canonical(self.current)


@dataclass(frozen=True)
class SwitchEvaluation:
    """Gain and cost of one switch over the horizon, in requests (see the module's docstring)."""

    gain_requests: float
    served_before_requests: float
    cost_gpu_seconds: float
    requests_per_gpu_second: float
    cost_requests: float
    relative_gain: float
    worthwhile: bool
    reason: str

    @property
    def net_requests(self) -> float:
        return self.gain_requests - self.cost_requests


@dataclass(frozen=True)
class SwitchGate:
    """The hysteresis state carried from one re-plan to the next: consecutive worthwhile
    re-plans so far (and the target of the latest)."""

    streak: int = 0
    target: Layout | None = None


@dataclass(frozen=True)
class SwitchDecision:
    switch: bool
    plan: SwitchPlan | None
    evaluation: SwitchEvaluation | None
    gate: SwitchGate
    reason: str


def _startup(startup_s: StartupSeconds, s: Strategy) -> float:
    if isinstance(startup_s, Mapping):
        try:
            return float(startup_s[s])
        except KeyError:
            raise KeyError(
                f"no start-up time for {s}; have {sorted(map(str, startup_s))}"
            ) from None
    return float(startup_s)


def _rows(space: LayoutSpace, layout: Sequence[Strategy]) -> list[Sequence[float]]:
    try:
        return [space.capacity[s] for s in layout]
    except KeyError as e:
        raise KeyError(f"strategy {e.args[0]} has no capacity row in the layout space") from None


def capacity_at_mix(
    space: LayoutSpace, layout: Sequence[Strategy], rates: Sequence[float]
) -> float:
    """Requests/s `layout` could serve at the mix of `rates` (θ·Σλ, `mix_scale`); with no
    demand at all, at an even mix of the types (each type rate 1); 0 when it can serve
    none of the types in the mix."""
    lam = [max(0.0, float(r)) for r in rates]
    if sum(lam) <= 0:
        lam = [1.0] * max(space.types(), len(lam))
    if not layout:
        return 0.0
    theta, _ = mix_scale(lam, _rows(space, layout))
    # mix_scale leaves out the types no replica serves; with none left θ is infinite, and
    # the layout serves nothing of this mix
    return theta * sum(lam) if math.isfinite(theta) else 0.0


def match_layouts(
    current: Sequence[Strategy], target: Sequence[Strategy]
) -> tuple[Layout, Layout, Layout]:
    """(keep, start, stop): replicas of the same (TP, PP) in both are kept (multiset
    intersection, the most replicas and GPUs reusable), the rest started or stopped."""
    have, want = Counter(current), Counter(target)
    keep = have & want
    return (
        canonical(keep.elements()),
        canonical((want - keep).elements()),
        canonical((have - keep).elements()),
    )


class _Steps:
    """The state of `plan_switch` while it orders the actions."""

    def __init__(
        self,
        space: LayoutSpace,
        current: Sequence[Strategy],
        budget_gpus: int,
        rates: Sequence[float],
        node_gpus: int | None,
    ) -> None:
        self.space, self.rates = space, rates
        self.budget, self.node_gpus = budget_gpus, node_gpus
        self.state = list(canonical(current))
        self.actions: list[SwitchAction] = []

    def cap(self, layout: Sequence[Strategy]) -> float:
        return capacity_at_mix(self.space, layout, self.rates)

    def fits(self, layout: Sequence[Strategy]) -> bool:
        if sum(s.gpus for s in layout) > self.budget:
            return False
        return self.node_gpus is None or packs(layout, self.budget, self.node_gpus)

    def act(
        self, kind: Literal["start", "stop"], s: Strategy, capacity: float | None = None
    ) -> None:
        if kind == "start":
            self.state.append(s)
        else:
            self.state.remove(s)
        value = self.cap(self.state) if capacity is None else capacity
        gpus = sum(x.gpus for x in self.state)
        self.actions.append(SwitchAction(kind, s, canonical(self.state), value, gpus))

    def best_start(self, pending: Sequence[Strategy]) -> tuple[Strategy, float] | None:
        """Make: of the starts that fit now, the one that adds the most capacity (larger
        ones first on ties); None when none fits."""
        options = [
            (self.cap([*self.state, s]), s.gpus, s)
            for s in dict.fromkeys(pending)
            if self.fits([*self.state, s])
        ]
        if not options:
            return None
        value, _, best = max(options)
        return best, value

    def best_stop(
        self, pending_stop: Sequence[Strategy], pending_start: Sequence[Strategy]
    ) -> tuple[Strategy, float]:
        """Break: the stop that leaves the most capacity, preferring one that alone makes a
        waiting start fit (fewer steps spent at reduced capacity), fewer GPUs on ties."""
        scored = []
        for s in dict.fromkeys(pending_stop):
            rest = list(self.state)
            rest.remove(s)
            unblocks = any(self.fits([*rest, p]) for p in pending_start)
            scored.append((unblocks, self.cap(rest), -s.gpus, s))
        _, value, _, victim = max(scored)
        return victim, value


def _duration(actions: Sequence[SwitchAction], startup_s: StartupSeconds) -> tuple[int, float]:
    """(start waves, seconds): each run of consecutive starts takes its slowest start-up;
    stops are immediate."""
    waves, duration, longest = 0, 0.0, -1.0
    for a in actions:
        if a.kind == "start":
            if longest < 0:
                waves += 1
                longest = 0.0
            longest = max(longest, _startup(startup_s, a.strategy))
        elif longest >= 0:
            duration += longest
            longest = -1.0
    return waves, duration + max(0.0, longest)


def plan_switch(
    space: LayoutSpace,
    current: Sequence[Strategy],
    target: Sequence[Strategy],
    budget_gpus: int,
    rates: Sequence[float],
    startup_s: StartupSeconds,
    node_gpus: int | None = None,
) -> SwitchPlan:
    """The switch plan from `current` to `target` inside `budget_gpus` (see the module's
    docstring): make-before-break while the spare GPUs allow, otherwise steps that keep the
    most capacity at the mix `rates`. With `node_gpus`, every intermediate layout must also
    pack onto the budget's nodes (`layout_search.packs`)."""
    used_now = sum(s.gpus for s in current)
    if used_now > budget_gpus:
        raise ValueError(f"the current layout holds {used_now} GPUs, over the budget {budget_gpus}")
    if sum(s.gpus for s in target) > budget_gpus:
        raise ValueError(
            f"the target layout needs {sum(s.gpus for s in target)} GPUs, over the budget "
            f"{budget_gpus}"
        )
    if node_gpus is not None and not packs(target, budget_gpus, node_gpus):
        raise ValueError(f"the target layout does not pack onto nodes of {node_gpus} GPUs")
    keep, start, stop = match_layouts(current, target)
    steps = _Steps(space, current, budget_gpus, rates, node_gpus)
    before = steps.cap(steps.state)
    pending_start, pending_stop = list(start), list(stop)
    while pending_start or pending_stop:
        found = steps.best_start(pending_start)
        if found is not None:
            pending_start.remove(found[0])
            steps.act("start", *found)
        elif pending_stop:
            victim, value = steps.best_stop(pending_stop, pending_start)
            pending_stop.remove(victim)
            steps.act("stop", victim, value)
        else:
            # Only with node packing (first fit may refuse a subset of a packable target);
            # the target itself packs, so the rest starts together.
            for s in list(pending_start):
                pending_start.remove(s)
                steps.act("start", s)
    actions = steps.actions
    kinds = [a.kind for a in actions]
    first_stop = kinds.index("stop") if "stop" in kinds else len(kinds)
    last_start = max((i for i, k in enumerate(kinds) if k == "start"), default=-1)
    caps = [before, *(a.capacity_after for a in actions)]
    waves, duration = _duration(actions, startup_s)
    return SwitchPlan(
        current=canonical(current),
        target=canonical(target),
        keep=keep,
        start=start,
        stop=stop,
        actions=tuple(actions),
        capacity_before=before,
        capacity_after=caps[-1],
        min_capacity=min(caps),
        make_before_break=last_start < first_stop,
        start_waves=waves,
        duration_s=duration,
        gpu_seconds=sum(s.gpus * _startup(startup_s, s) for s in start),
    )


def evaluate_switch(
    space: LayoutSpace,
    current: Sequence[Strategy],
    target: Sequence[Strategy],
    windows: Sequence[Window],
    plan: SwitchPlan,
    min_relative_gain: float = 0.02,
    throughput: Callable[[Sequence[float], Sequence[Sequence[float]]], float] = max_throughput,
) -> SwitchEvaluation:
    """Gain (extra served requests after the switch completes, over the windows) against
    cost (`plan.gpu_seconds` at the current requests per GPU-second); see the module's
    docstring for the rule and why."""
    if not windows:
        raise ValueError("no forecast windows: give the horizon as at least one window")
    old_rows, new_rows = _rows(space, current), _rows(space, target)
    t = 0.0
    gain = served_before = 0.0
    first_old = first_new = 0.0
    for i, w in enumerate(windows):
        if w.duration_s < 0:
            raise ValueError(f"a window of {w.duration_s} s: durations must be >= 0")
        phi_old = throughput(w.rates, old_rows) if old_rows else 0.0
        phi_new = throughput(w.rates, new_rows) if new_rows else 0.0
        if i == 0:
            first_old, first_new = phi_old, phi_new
        after = max(0.0, t + w.duration_s - max(t, plan.duration_s))
        gain += after * (phi_new - phi_old)
        served_before += w.duration_s * phi_old
        t += w.duration_s
    gpus_old = sum(s.gpus for s in current)
    gpus_new = sum(s.gpus for s in target)
    if gpus_old and first_old > 0:
        per_gpu_s = first_old / gpus_old
    elif gpus_new:
        per_gpu_s = first_new / gpus_new
    else:
        per_gpu_s = 0.0
    cost = plan.gpu_seconds * per_gpu_s
    relative = gain / served_before if served_before > 0 else (math.inf if gain > 0 else 0.0)
    if not plan.actions:
        ok, why = False, "the target is the current layout"
    elif gain - cost <= 0:
        ok, why = (
            False,
            (
                f"gain {gain:.1f} requests over the horizon does not cover the cost "
                f"{cost:.1f} ({plan.gpu_seconds:.0f} GPU-seconds of start-up)"
            ),
        )
    elif relative < min_relative_gain:
        ok, why = (
            False,
            (
                f"gain {relative:.2%} of the served requests is under the minimum "
                f"{min_relative_gain:.2%}"
            ),
        )
    else:
        ok, why = True, (f"gain {gain:.1f} requests ({relative:.2%}) exceeds the cost {cost:.1f}")
    return SwitchEvaluation(
        gain_requests=gain,
        served_before_requests=served_before,
        cost_gpu_seconds=plan.gpu_seconds,
        requests_per_gpu_second=per_gpu_s,
        cost_requests=cost,
        relative_gain=relative,
        worthwhile=ok,
        reason=why,
    )


def decide(
    space: LayoutSpace,
    current: Sequence[Strategy],
    candidate: Sequence[Strategy],
    windows: Sequence[Window],
    budget_gpus: int,
    startup_s: StartupSeconds,
    gate: SwitchGate = SwitchGate(),
    confirmations: int = 2,
    min_relative_gain: float = 0.02,
    node_gpus: int | None = None,
) -> SwitchDecision:
    """One re-plan's decision: plan and evaluate the switch to `candidate`, then apply the
    hysteresis (`confirmations` consecutive worthwhile re-plans; the module's docstring says
    why). Returns the new gate state to pass to the next re-plan."""
    if confirmations < 1:
        raise ValueError("confirmations must be >= 1 (1: switch on the first worthwhile plan)")
    if not windows:
        raise ValueError("no forecast windows: give the horizon as at least one window")
    if canonical(current) == canonical(candidate):
        return SwitchDecision(
            False, None, None, SwitchGate(), "the candidate is the current layout"
        )
    plan = plan_switch(
        space, current, candidate, budget_gpus, windows[0].rates, startup_s, node_gpus
    )
    ev = evaluate_switch(space, current, candidate, windows, plan, min_relative_gain)
    if not ev.worthwhile:
        return SwitchDecision(False, plan, ev, SwitchGate(), ev.reason)
    streak = gate.streak + 1
    if streak < confirmations:
        return SwitchDecision(
            False,
            plan,
            ev,
            SwitchGate(streak, canonical(candidate)),
            f"{ev.reason}; worthwhile in {streak} of {confirmations} consecutive re-plans",
        )
    return SwitchDecision(True, plan, ev, SwitchGate(), ev.reason)


def horizon_rates(windows: Sequence[Window]) -> tuple[float, ...]:
    """The time-weighted mean requests/s per type over the windows."""
    total = sum(w.duration_s for w in windows)
    types = max((len(w.rates) for w in windows), default=0)
    if total <= 0:
        return tuple(0.0 for _ in range(types))
    return tuple(
        sum(w.duration_s * (w.rates[j] if j < len(w.rates) else 0.0) for w in windows) / total
        for j in range(types)
    )


def replan(
    space: LayoutSpace,
    current: Sequence[Strategy],
    windows: Sequence[Window],
    budget_gpus: int,
    startup_s: StartupSeconds,
    gate: SwitchGate = SwitchGate(),
    *,
    seed: int = 0,
    confirmations: int = 2,
    min_relative_gain: float = 0.02,
) -> SwitchDecision:
    """One re-plan (every 5-10 minutes, OServe §5.1): search layouts for the horizon's
    mean mix (Algorithm 1, `layout_search`), `decide` on each over the windows, and keep
    the worthwhile one with the largest net gain (else the least bad, not switched to).

    Candidates, and why:
    - the search on the whole budget and on the GPUs the current layout holds (when fewer):
      Algorithm 1 breaks Φ ties by headroom θ, so on a budget with spare GPUs it fills
      them, and starting more GPUs costs more than a layout of the same size would (the
      switch cost is not in the search's objective);
    - each from the paper's uniform start and from the current layout: Algorithm 1 only
      accepts improvements, so a search started at the current layout proposes nothing
      worse and shares more replicas with it;
    - the mean mix, because the search scores one mix while the switch must pay off over
      the horizon; `decide` then checks each candidate window by window.
    Algorithm 1 is random: a fixed `seed` keeps a steady mix from proposing a different
    layout at every re-plan."""
    rates = horizon_rates(windows)
    sizes = [budget_gpus]
    held = sum(x.gpus for x in current)
    if 0 < held < budget_gpus:
        sizes.append(held)
    candidates: list[Layout] = []
    for gpus in sizes:
        starts: list[Layout | None] = [None]
        if current and packs(current, gpus, space.node_gpus):
            starts.insert(0, canonical(current))
        for start in starts:
            found = search_layout(space, rates, gpus, seed=seed, initial=start).layout
            if found not in candidates:
                candidates.append(found)
    decisions = [
        decide(
            space,
            current,
            c,
            windows,
            budget_gpus,
            startup_s,
            gate,
            confirmations,
            min_relative_gain,
            node_gpus=space.node_gpus,
        )
        for c in candidates
    ]

    def rank(d: SwitchDecision) -> tuple[bool, float]:
        ev = d.evaluation
        return (ev is not None and ev.worthwhile, ev.net_requests if ev is not None else 0.0)

    return max(decisions, key=rank)  # the first of equals: the order above


@dataclass(frozen=True)
class SwitchProgress:
    """Where the execution of a `SwitchPlan` stands: the replicas each strategy should have
    now (`targets`), how many of the plan's actions are taken (`done`, the caller keeps it
    for the next step) and whether all are (`finished`)."""

    targets: dict[Strategy, int]
    done: int
    finished: bool


def _taken(plan: SwitchPlan, done: int) -> tuple[Counter[Strategy], set[Strategy]]:
    """Replicas per strategy once the first `done` actions of `plan` are taken, and the
    strategies those actions started."""
    if not 0 <= done <= len(plan.actions):
        raise ValueError(f"done: {done} is not within the plan's {len(plan.actions)} actions")
    counts: Counter[Strategy] = Counter(plan.current)
    started: set[Strategy] = set()
    for a in plan.actions[:done]:
        counts[a.strategy] += 1 if a.kind == "start" else -1
        if a.kind == "start":
            started.add(a.strategy)
    return counts, started


def switch_targets(
    plan: SwitchPlan, ready: Mapping[Strategy, int], done: int = 0
) -> SwitchProgress:
    """Step `plan` (OServe §5.2, executed make-before-break on Kubernetes) as the replicas
    become Ready: the targets per strategy after the actions that may be taken now.

    The rule is the benchmark harness's (`sim.oserve_fleet.Fleet._advance`): a start is
    taken at once (consecutive starts run together, they only add capacity); a stop waits
    until every start before it serves, i.e. until each started strategy has as many
    `ready` replicas as its target so far (the harness counts its starting replicas; a
    kept replica's readiness is not waited for, as there). Stops never undo: `done` actions
    stay taken when a started replica fails later (the caller passes back `done`), so a
    crash after the switch is a pod set below target, not a restart of the old layout.

    Starts and stops never share a strategy (`match_layouts` keeps the intersection), so a
    strategy's target only rises or only falls over the plan."""
    counts, started = _taken(plan, done)
    i = done
    while i < len(plan.actions):
        a = plan.actions[i]
        if a.kind == "stop" and any(ready.get(s, 0) < counts[s] for s in started):
            break
        counts[a.strategy] += 1 if a.kind == "start" else -1
        if a.kind == "start":
            started.add(a.strategy)
        i += 1
    strategies = dict.fromkeys([*plan.current, *plan.target])
    return SwitchProgress({s: max(0, counts[s]) for s in strategies}, i, i == len(plan.actions))


#: A switch whose started replicas are not all serving after this many start-ups (plus
#: `STUCK_GRACE_S`) is abandoned (`abandon_switch`). Why: on Kubernetes a new pod can wait
#: forever (an image that does not pull, a GPU node that never frees, a crash loop) while
#: its stops wait for it (`switch_targets`), and a switch in progress blocks every re-plan.
#: Two start-ups, because a start-up is the variant's own estimate and a slow pull or a
#: rescheduled pod may double it; the grace covers scheduling on a busy cluster.
STUCK_STARTUPS = 2.0
STUCK_GRACE_S = 120.0


def stuck_after_s(plan: SwitchPlan, startup_s: Mapping[Strategy, float]) -> float:
    """Seconds after its first action when `plan` counts as stuck: `STUCK_STARTUPS` times
    the slowest start-up among the strategies it starts, plus `STUCK_GRACE_S` (a plan that
    starts nothing never waits)."""
    started = {a.strategy for a in plan.actions if a.kind == "start"}
    slowest = max((startup_s.get(s, 0.0) for s in started), default=0.0)
    return STUCK_STARTUPS * slowest + STUCK_GRACE_S


def abandon_switch(
    plan: SwitchPlan, ready: Mapping[Strategy, int], done: int
) -> dict[Strategy, int]:
    """The targets that keep what serves when a switch is abandoned: the `done` actions stay
    taken (stops are never undone), the rest are dropped, and each started strategy keeps
    only its `ready` replicas (the starts that never served are withdrawn). Kept replicas
    and the old layout's unstopped replicas keep serving, so an abandoned make-before-break
    switch is the old layout plus whatever new replicas came up."""
    counts, started = _taken(plan, done)
    return {
        s: min(counts[s], ready.get(s, 0)) if s in started else max(0, counts[s])
        for s in dict.fromkeys([*plan.current, *plan.target])
    }
