"""OServe's upper level: which replicas, of how many GPUs and which (TP, PP), to run inside a
GPU budget for the predicted mix of request types (OServe §4.3, App. E, Algorithm 1).

Why a search: the throughput Φ of a deployment {d_r, s_r} (GPUs and strategy per replica,
Σ d_r = D) comes from the lower level (`plan/oserve_assign.py`), and enumerating every
deployment is only feasible for a few GPUs. Algorithm 1 starts from uniform pure-TP replicas
of the smallest size the model fits on and, per iteration:

1. records the deployment and solves the lower level on it;
2. splits the replicas into O (saturated: utilisation = 1 at the solution) and U (the rest);
3. for each r ∈ O, at random: *merge* with another r' ∈ O (d_r += d_r', r' removed) or
   *swap* δ GPUs from some u ∈ U (d_r += δ, d_u −= δ);
4. for each r ∈ U, at random: *split* into two replicas, or *swap* δ GPUs to some o ∈ O;
5. chooses the strategies of the new sizes that give the highest throughput;
6. keeps the change if the throughput rose, else reverts to the recorded deployment;

and stops after `patience` iterations without a gain (the paper's example: 20) or after
`max_iterations`.

Settled here (the paper leaves them open, [GAP]):
- δ and the split point: uniformly at random among the values that leave both replicas at a
  size some strategy runs on (a donor may give all its GPUs and vanish);
- the objective: (Φ, θ) compared lexicographically, θ being the largest multiple of the
  predicted mix the deployment can serve (`mix_scale`). Whenever the budget can serve the
  whole demand every deployment ties at Φ = Σλ and "accept if better" would never move;
  θ breaks those ties towards headroom at the predicted mix. O and U come from the θ solution
  (at θ the bottleneck replicas are saturated);
- GPUs that the uniform start cannot use (D not a multiple of its size) stay idle.

Deviations (marked as such):
- steps 3-4 act on each replica with probability `mutation_rate` (default 0.5; 1.0 is the
  paper's rule). With every replica acting, a deployment whose replicas are all saturated
  (every replica at the max-concurrent solution, usual under load) can only merge all of
  them pairwise at once: from 4 × TP4 it reaches 2 × 8 GPUs, never 8 + 4 + 4;
- when no replica is under-utilised (U = ∅, the usual case under load: at the max-concurrent
  solution every replica tends to saturate), a saturated replica may also *split*. By the
  paper's rules such a deployment can only merge, so the search could only ever grow its
  replicas: from 4 × TP4 it reaches 2 × 8 GPUs and then 16, never 8 + 4 + 4, and one
  replica holding the whole budget could never change again;
- step 5 enumerates every combination of strategies (the paper's rule) only while there are at
  most `enumerate_limit` of them, counted as multisets since replicas of one size are
  interchangeable; above that it runs coordinate ascent (one replica at a time, the others
  fixed, until no replica changes), which can miss a combination the enumeration would find;
- Kubernetes filters the paper does not have: TP divides the attention heads (vLLM), a TP
  group stays inside one node, and every deployment must pack onto the budget's nodes
  (`packs`: first-fit decreasing of the TP groups, each PP stage one group; it may refuse a
  packable deployment of odd TP sizes, never accepts an unpackable one).

Deterministic for a given seed: the only randomness is one `random.Random(seed)` and every
iteration order is fixed. No wall clock is read; the caller times it.
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from sageserve.plan.oserve_assign import max_throughput, mix_scale

#: utilisation at or above which a replica counts as saturated (Algorithm 1's O)
_SATURATED = 1.0 - 1e-6
#: relative tolerance of "better": the LP solutions carry ~1e-9 noise
_TOL = 1e-6


@dataclass(frozen=True, order=True)
class Strategy:
    """One replica's parallelism: TP × PP GPUs."""

    tensor_parallel: int
    pipeline_parallel: int = 1

    @property
    def gpus(self) -> int:
        return self.tensor_parallel * self.pipeline_parallel

    def __str__(self) -> str:
        if self.pipeline_parallel == 1:
            return f"TP{self.tensor_parallel}"
        return f"TP{self.tensor_parallel}xPP{self.pipeline_parallel}"


def _key(s: Strategy) -> tuple[int, int, int]:
    return (s.gpus, s.tensor_parallel, s.pipeline_parallel)


Layout = tuple[Strategy, ...]


def canonical(layout: Iterable[Strategy]) -> Layout:
    """Replicas sorted by (GPUs, TP, PP): deployments that differ only in order are one."""
    return tuple(sorted(layout, key=_key))


def describe(layout: Sequence[Strategy]) -> str:
    """`TP4 ×2 + TP4xPP2` style, largest replicas first."""
    counts: dict[Strategy, int] = {}
    for s in sorted(layout, key=_key, reverse=True):
        counts[s] = counts.get(s, 0) + 1
    return " + ".join(f"{s} ×{c}" if c > 1 else str(s) for s, c in counts.items()) or "(none)"


@dataclass(frozen=True)
class LayoutSpace:
    """The strategies the search may use and their per-type capacity n_j (requests/s).

    `capacity[s][j]`: requests/s of type j one replica of strategy s sustains alone
    (`perf/capacity.py` derives it from the profiles). Strategies that break a filter
    (TP must divide `attention_heads`, TP ≤ `node_gpus`) are dropped, whatever the table says.
    """

    capacity: Mapping[Strategy, Sequence[float]]
    node_gpus: int = 8
    attention_heads: int | None = None
    _by_size: dict[int, list[Strategy]] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        by_size: dict[int, list[Strategy]] = {}
        for s in sorted(self.capacity, key=_key):
            if s.tensor_parallel < 1 or s.pipeline_parallel < 1:
                continue
            if self.attention_heads and self.attention_heads % s.tensor_parallel:
                continue
            if s.tensor_parallel > self.node_gpus:
                continue
            by_size.setdefault(s.gpus, []).append(s)
        object.__setattr__(self, "_by_size", by_size)

    def strategies(self, gpus: int) -> list[Strategy]:
        return list(self._by_size.get(gpus, ()))

    def sizes(self) -> list[int]:
        return sorted(self._by_size)

    def types(self) -> int:
        return max((len(v) for v in self.capacity.values()), default=0)


def packs(layout: Sequence[Strategy], gpus: int, node_gpus: int) -> bool:
    """Whether every TP group (one per PP stage) fits a node of the budget: ⌊gpus/N⌋ nodes
    of N GPUs plus one of the remainder, first-fit decreasing."""
    if sum(s.gpus for s in layout) > gpus:
        return False
    free = [node_gpus] * (gpus // node_gpus)
    if gpus % node_gpus:
        free.append(gpus % node_gpus)
    groups = sorted(
        (s.tensor_parallel for s in layout for _ in range(s.pipeline_parallel)), reverse=True
    )
    for g in groups:
        for i, room in enumerate(free):
            if room >= g:
                free[i] = room - g
                break
        else:
            return False
    return True


@dataclass(frozen=True, order=True)
class Score:
    """(Φ, θ): served requests/s at the predicted rates, then the largest multiple of the
    mix servable (see the module docstring)."""

    throughput: float
    scale: float

    def beats(self, other: Score, demand: float) -> bool:
        """Strictly better by more than the LP's noise."""
        tol = _TOL * max(1.0, demand)
        if self.throughput > other.throughput + tol:
            return True
        if self.throughput < other.throughput - tol:
            return False
        return self.scale > other.scale * (1.0 + _TOL) + _TOL


@dataclass(frozen=True)
class Evaluation:
    score: Score
    utilisation: tuple[float, ...]


class Evaluator:
    """Lower-level solves, memoised per canonical deployment (Φ depends only on the
    multiset of replica strategies)."""

    def __init__(self, space: LayoutSpace, rates: Sequence[float]) -> None:
        self.space = space
        self.rates = [float(r) for r in rates]
        self.demand = float(sum(self.rates))
        self.cache: dict[Layout, Evaluation] = {}

    def __call__(self, layout: Layout) -> Evaluation:
        found = self.cache.get(layout)
        if found is not None:
            return found
        cap = [list(self.space.capacity[s]) for s in layout]
        theta, util = mix_scale(self.rates, cap)
        # θ ≥ 1 with every requested type servable here: Φ = Σλ without a second LP
        # (`mix_scale` leaves out types no replica of the layout can serve).
        servable = all(
            rate <= 0 or any(row[j] > 0 for row in cap) for j, rate in enumerate(self.rates)
        )
        whole = servable and theta >= 1.0 - 1e-12
        phi = self.demand if whole else max_throughput(self.rates, cap)
        ev = Evaluation(Score(phi, theta if math.isfinite(theta) else 0.0), util)
        self.cache[layout] = ev
        return ev

    @property
    def evaluations(self) -> int:
        return len(self.cache)


@dataclass(frozen=True)
class SearchResult:
    layout: Layout
    score: Score
    initial: Layout
    initial_score: Score
    iterations: int
    accepted: int
    evaluations: int
    idle_gpus: int
    #: how step 5 chose strategies: "enumeration", "coordinate ascent" or both
    strategy_choice: str


def uniform_layout(space: LayoutSpace, gpus: int) -> Layout:
    """Algorithm 1's start: as many replicas as fit of the smallest size that runs pure TP
    (the model's minimum-memory size, OServe §4.3 "Initialization"), packed onto the nodes."""
    pure = [s for d in space.sizes() for s in space.strategies(d) if s.pipeline_parallel == 1]
    candidates = pure or [s for d in space.sizes() for s in space.strategies(d)]
    if not candidates:
        raise ValueError("space: no strategy passes the filters (TP divides heads, TP ≤ node)")
    s = min(candidates, key=_key)
    count = gpus // s.gpus
    while count > 0 and not packs([s] * count, gpus, space.node_gpus):
        count -= 1
    if count == 0:
        raise ValueError(f"gpus: {gpus} GPUs hold no replica of {s} ({s.gpus} GPUs)")
    return canonical([s] * count)


def best_homogeneous(
    space: LayoutSpace, rates: Sequence[float], gpus: int, evaluator: Evaluator | None = None
) -> tuple[Layout, Score]:
    """The best deployment of identical replicas (OServe's vLLM baselines, §6.1): every
    strategy, as many replicas as pack into the budget."""
    ev = evaluator or Evaluator(space, rates)
    best: tuple[Layout, Score] | None = None
    for d in space.sizes():
        for s in space.strategies(d):
            count = gpus // d
            while count > 0 and not packs([s] * count, gpus, space.node_gpus):
                count -= 1
            if count == 0:
                continue
            layout = canonical([s] * count)
            score = ev(layout).score
            if best is None or score.beats(best[1], ev.demand):
                best = (layout, score)
    if best is None:
        raise ValueError(f"gpus: no homogeneous deployment fits {gpus} GPUs")
    return best


class _Search:
    def __init__(
        self,
        space: LayoutSpace,
        evaluator: Evaluator,
        gpus: int,
        rng: random.Random,
        enumerate_limit: int,
        mutation_rate: float,
    ) -> None:
        self.mutation_rate = mutation_rate
        self.space = space
        self.ev = evaluator
        self.gpus = gpus
        self.rng = rng
        self.enumerate_limit = enumerate_limit
        self.valid = set(space.sizes())
        self.choices: set[str] = set()

    # ---- step 3-4: merge / split / swap --------------------------------------------------

    def _deltas(self, taker: int, giver: int) -> list[int]:
        return [
            delta
            for delta in range(1, giver + 1)
            if taker + delta in self.valid and (giver - delta == 0 or giver - delta in self.valid)
        ]

    def _swap(self, sizes: list[int], taker: int, givers: list[int]) -> bool:
        options = [(g, self._deltas(sizes[taker], sizes[g])) for g in givers if sizes[g] > 0]
        options = [(g, ds) for g, ds in options if ds]
        if not options:
            return False
        g, ds = self.rng.choice(options)
        delta = self.rng.choice(ds)
        sizes[taker] += delta
        sizes[g] -= delta
        return True

    def _cuts(self, size: int) -> list[int]:
        return [c for c in range(1, size) if c in self.valid and size - c in self.valid]

    def mutate(self, sizes_in: Sequence[int], over: list[int], under: list[int]) -> list[int]:
        """Algorithm 1 steps 3-4 on replica sizes; returns the new sizes (0 = removed)."""
        sizes = list(sizes_in)
        extra: list[int] = []
        for r in over:
            if sizes[r] == 0 or self.rng.random() >= self.mutation_rate:
                continue
            partners = [o for o in over if o != r and sizes[o] > 0]
            merge = [o for o in partners if sizes[r] + sizes[o] in self.valid]
            # Deviation: with nothing under-utilised, a saturated replica may also split.
            cuts = self._cuts(sizes[r]) if not under else []
            ops = (
                (["merge"] if merge else [])
                + (["swap"] if under else [])
                + (["split"] if cuts else [])
            )
            if not ops:
                continue
            op = self.rng.choice(ops)
            if op == "merge":
                o = self.rng.choice(merge)
                sizes[r] += sizes[o]
                sizes[o] = 0
            elif op == "split":
                c = self.rng.choice(cuts)
                extra.append(sizes[r] - c)
                sizes[r] = c
            else:
                self._swap(sizes, r, under)
        for r in under:
            if sizes[r] == 0 or self.rng.random() >= self.mutation_rate:
                continue
            cuts = self._cuts(sizes[r])
            ops = (["split"] if cuts else []) + (["swap"] if over else [])
            if not ops:
                continue
            if self.rng.choice(ops) == "split":
                c = self.rng.choice(cuts)
                extra.append(sizes[r] - c)
                sizes[r] = c
            else:
                takers = [o for o in over if sizes[o] > 0]
                options = [(o, self._deltas(sizes[o], sizes[r])) for o in takers]
                options = [(o, ds) for o, ds in options if ds]
                if options:
                    o, ds = self.rng.choice(options)
                    delta = self.rng.choice(ds)
                    sizes[o] += delta
                    sizes[r] -= delta
        return [d for d in sizes if d > 0] + extra

    # ---- step 5: strategies for given sizes ----------------------------------------------

    def choose(self, sizes: Sequence[int], hint: Sequence[Strategy]) -> tuple[Layout, Score] | None:
        groups: dict[int, int] = {}
        for d in sizes:
            groups[d] = groups.get(d, 0) + 1
        count = 1
        for d, c in groups.items():
            count *= math.comb(len(self.space.strategies(d)) + c - 1, c)
        if count <= self.enumerate_limit:
            self.choices.add("enumeration")
            return self._enumerate(groups)
        self.choices.add("coordinate ascent")
        return self._ascend(sizes, hint)

    def _enumerate(self, groups: Mapping[int, int]) -> tuple[Layout, Score] | None:
        per_group = [
            list(itertools.combinations_with_replacement(self.space.strategies(d), c))
            for d, c in sorted(groups.items())
        ]
        best: tuple[Layout, Score] | None = None
        for combo in itertools.product(*per_group):
            layout = canonical(s for part in combo for s in part)
            if not packs(layout, self.gpus, self.space.node_gpus):
                continue
            score = self.ev(layout).score
            if best is None or score.beats(best[1], self.ev.demand):
                best = (layout, score)
        return best

    def _ascend(
        self, sizes: Sequence[int], hint: Sequence[Strategy]
    ) -> tuple[Layout, Score] | None:
        kept = {s: 0 for s in hint}
        for s in hint:
            kept[s] += 1
        current: list[Strategy] = []
        for d in sizes:
            same = [s for s in self.space.strategies(d) if kept.get(s, 0) > 0]
            s = same[0] if same else self.space.strategies(d)[0]
            if same:
                kept[s] -= 1
            current.append(s)
        layout = canonical(current)
        best = None
        if packs(layout, self.gpus, self.space.node_gpus):
            best = (layout, self.ev(layout).score)
        changed = True
        passes = 0
        while changed and passes < 10:
            changed, passes = False, passes + 1
            for i, d in enumerate(sizes):
                for s in self.space.strategies(d):
                    if s == current[i]:
                        continue
                    trial = list(current)
                    trial[i] = s
                    cand = canonical(trial)
                    if not packs(cand, self.gpus, self.space.node_gpus):
                        continue
                    score = self.ev(cand).score
                    if best is None or score.beats(best[1], self.ev.demand):
                        best, current, changed = (cand, score), trial, True
        return best


def search_layout(
    space: LayoutSpace,
    rates: Sequence[float],
    gpus: int,
    *,
    seed: int = 0,
    patience: int = 20,
    max_iterations: int = 500,
    enumerate_limit: int = 256,
    mutation_rate: float = 0.5,
    initial: Layout | None = None,
) -> SearchResult:
    """Algorithm 1 (see the module docstring) for `rates[j]` requests/s of each type on a
    budget of `gpus` GPUs; deterministic for a given `seed`."""
    if gpus < 1:
        raise ValueError(f"gpus: must be >= 1, got {gpus}")
    if len(rates) != space.types():
        raise ValueError(f"rates: one per type of the capacity table ({space.types()})")
    ev = Evaluator(space, rates)
    start = canonical(initial) if initial is not None else uniform_layout(space, gpus)
    if not packs(start, gpus, space.node_gpus):
        raise ValueError(f"initial: {describe(start)} does not pack onto {gpus} GPUs")
    if not 0.0 < mutation_rate <= 1.0:
        raise ValueError(f"mutation_rate: must be in (0, 1], got {mutation_rate}")
    search = _Search(space, ev, gpus, random.Random(seed), enumerate_limit, mutation_rate)
    layout, current = start, ev(start)
    stale = iterations = accepted = 0
    while stale < patience and iterations < max_iterations:
        iterations += 1
        over = [r for r, u in enumerate(current.utilisation) if u >= _SATURATED]
        under = [r for r, u in enumerate(current.utilisation) if u < _SATURATED]
        sizes = search.mutate([s.gpus for s in layout], over, under)
        found = None
        if sorted(sizes) != sorted(s.gpus for s in layout):
            found = search.choose(sizes, layout)
        if found is not None and found[1].beats(current.score, ev.demand):
            layout, current = found[0], ev(found[0])
            accepted += 1
            stale = 0
        else:
            stale += 1  # revert: `layout` still holds the recorded deployment
    return SearchResult(
        layout=layout,
        score=current.score,
        initial=start,
        initial_score=ev(start).score,
        iterations=iterations,
        accepted=accepted,
        evaluations=ev.evaluations,
        idle_gpus=gpus - sum(s.gpus for s in layout),
        strategy_choice=" + ".join(sorted(search.choices)) or "none",
    )
