"""A lower bound on the GPU-hours of any policy: the fluid LP of a scenario's request stream.

Why: a saving means little without knowing how much there was to save, and a "best case"
that policies beat is no bound (the θ-sized estimate in `sim.bounds` books batch at arrival
and sizes at θ, a throughput instances exceed). This bound relaxes everything a policy
cannot do better than, so no simulated run of the scenario can go below it:

- **work at peak efficiency**: each request costs the instance-seconds the perf model
  cannot undercut (`RequestCost`): its prompt at the cheapest prefill step per token
  (steps of at most `max_batched_tokens`), its output tokens at decode iterations of
  `max_num_seqs` sequences, each iteration at least the decode curve's lower supporting
  line at the running contexts; on the variant where that costs the fewest GPU-seconds;
- **fluid capacity**: GPUs are continuous (no rounding to instances), start instantly and
  cost nothing to start or drain; every region of a model is one pool (spill-over);
- **time only where the SLOs pin it**: work may be done from its request's arrival on,
  and must be done only where an SLO says by when: an interactive request's prefill within
  its tier's TTFT SLO (its decode may follow at any pace: nothing bounds a run's
  time between tokens), a batch request's whole work by its deadline (SageServe §6.3);
  work due after the window is not required (GPU-hours are counted over the window, and
  the drain after it costs nothing); the fleet never goes below each endpoint's
  `minInstances`.

The LP per model (minutes t of the window, GPU-seconds of work): minimise Σ G_t / 60 with
60 G_t ≥ z_t (work served in minute t), G_t ≥ floor, and the work served up to t, Σ z,
between what is due by t and what has arrived by t. HiGHS solves it (scipy's `linprog`).
So a run that meets every TTFT SLO and every batch deadline inside the window cannot use
fewer GPU-hours; one that misses them can, by the work it left undone or late.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from itertools import pairwise

import numpy as np
from scipy import sparse
from scipy.optimize import linprog

from sageserve.perf.model import PiecewiseLinear, VariantPerf
from sageserve.sim.scenario import Scenario
from sageserve.sim.workload import fits, requests

#: vLLM's default `max_num_batched_tokens` in the simulated instance (`sim.instance`)
MAX_BATCHED_TOKENS = 16384


def cheapest_prefill_s_per_token(curve: PiecewiseLinear, max_tokens: int) -> float:
    """min over x in (0, max_tokens] of curve(x) / x. On each linear piece curve(x) / x is
    monotone, and below the first point the curve is flat, so the minimum is at a
    breakpoint or at `max_tokens`."""
    xs = [x for x in curve.xs if 0 < x <= max_tokens] + [float(max_tokens)]
    return min(curve(x) / x for x in xs)


def decode_support_line(curve: PiecewiseLinear, kv_capacity: int) -> tuple[float, float]:
    """(a, b) with a + b·kv ≤ curve(kv) for every kv in [0, kv_capacity], a, b ≥ 0: an edge
    of the curve's lower convex hull on that range, the one over its middle where that edge
    keeps a ≥ 0 (the iteration's fixed cost), so the line is close to the curve where
    instances run."""
    xs = [0.0] + [x for x in curve.xs if 0 < x < kv_capacity] + [float(kv_capacity)]
    pts = [(x, curve(x)) for x in xs]
    hull: list[tuple[float, float]] = []
    for p in pts:  # lower hull, monotone chain
        while len(hull) >= 2:
            (x1, y1), (x2, y2) = hull[-2], hull[-1]
            if (x2 - x1) * (p[1] - y1) - (y2 - y1) * (p[0] - x1) <= 0:
                hull.pop()
            else:
                break
        hull.append(p)
    best = (min(y for _, y in pts), 0.0)  # a flat line under the whole curve
    mid = kv_capacity / 2.0
    for (x1, y1), (x2, y2) in pairwise(hull):
        b = (y2 - y1) / (x2 - x1)
        a = y1 - b * x1
        if a < 0 or b < 0:
            continue
        best = (a, b)
        if x2 >= mid:
            break
    return best


@dataclass(frozen=True)
class RequestCost:
    """Instance-seconds a request needs at least on one variant (see the module doc)."""

    gpus: int
    prefill_s_per_token: float
    iteration_s: float  # the supporting line's fixed part, shared by up to max_num_seqs
    context_s_per_token: float  # its slope: per token of running context per iteration
    max_num_seqs: int

    @classmethod
    def of(cls, perf: VariantPerf, max_batched_tokens: int = MAX_BATCHED_TOKENS) -> RequestCost:
        a, b = decode_support_line(perf.decode_curve, perf.kv_capacity_tokens)
        return cls(
            perf.gpus,
            cheapest_prefill_s_per_token(perf.prefill_curve, max_batched_tokens),
            a,
            b,
            perf.max_num_seqs,
        )

    def gpu_seconds(self, prompt: int, output: int) -> tuple[float, float]:
        """(prefill, decode) GPU-seconds. The prefill makes the first token; each later one
        is a decode iteration whose running context holds at least this request's prompt + 1."""
        iterations = max(0, output - 1)
        decode_s = iterations * (
            self.iteration_s / self.max_num_seqs + (prompt + 1) * self.context_s_per_token
        )
        return self.gpus * prompt * self.prefill_s_per_token, self.gpus * decode_s


@dataclass
class ModelWork:
    """GPU-seconds of one model's requests per minute of the window: arrived in that
    minute, and due by its end (work due after the window is not counted as due)."""

    floor_gpus: float
    arrived: np.ndarray
    due: np.ndarray


@dataclass(frozen=True)
class LowerBound:
    gpu_hours: float
    by_model: dict[str, float] = field(default_factory=dict)


def solve_model(work: ModelWork) -> float:
    """The least GPU-hours of one model (the LP of the module doc)."""
    t_n = len(work.arrived)
    if t_n == 0:
        return 0.0
    arrived = np.cumsum(work.arrived)
    due = np.minimum(np.cumsum(work.due), arrived)
    # variables: G_t (GPUs), z_t (GPU-seconds served), Z_t = Σ z up to t
    g, z, cum = (np.arange(t_n) + k * t_n for k in range(3))
    ones = np.ones(t_n)
    rows = np.arange(t_n)
    a_ub = sparse.csr_matrix(  # z_t - 60 G_t <= 0
        (np.concatenate([-60.0 * ones, ones]), (np.tile(rows, 2), np.concatenate([g, z]))),
        shape=(t_n, 3 * t_n),
    )
    a_eq = sparse.csr_matrix(  # Z_t - Z_{t-1} - z_t = 0
        (
            np.concatenate([ones, -ones, -ones[1:]]),
            (np.concatenate([rows, rows, rows[1:]]), np.concatenate([cum, z, cum[:-1]])),
        ),
        shape=(t_n, 3 * t_n),
    )
    inf = np.full(t_n, np.inf)
    lower = np.concatenate([np.full(t_n, work.floor_gpus), 0 * ones, due])
    upper = np.concatenate([inf, inf, arrived])
    res = linprog(
        np.concatenate([ones / 60.0, np.zeros(2 * t_n)]),
        A_ub=a_ub,
        b_ub=np.zeros(t_n),
        A_eq=a_eq,
        b_eq=np.zeros(t_n),
        bounds=np.stack([lower, upper], axis=1),
        method="highs",
    )
    if res.status != 0:
        raise RuntimeError(f"lower-bound LP not solved: {res.message}")
    return float(res.fun)


@dataclass
class WindowLoad:
    """One pass over a scenario's request stream: each model's work (`ModelWork`), the same
    in tokens with each interactive request due in its arrival minute (`token_work`, for
    `capacity_bound`), the GPUs per instance of each (model, variant), and each (model, home
    region)'s tokens/s (input + output) per minute of the window."""

    work: dict[str, ModelWork]
    tokens_per_s: dict[tuple[str, str], np.ndarray]
    token_work: dict[str, ModelWork] = field(default_factory=dict)
    gpus: dict[tuple[str, str], int] = field(default_factory=dict)


def window_load(scenario: Scenario, max_batched_tokens: int = MAX_BATCHED_TOKENS) -> WindowLoad:
    """Work and tokens per minute of the window, from the request stream alone (requests a
    model refuses for their length count nowhere, as in the simulator)."""
    wl = scenario.workload
    minutes = max(1, math.ceil(wl.duration_s / 60.0))
    contexts = scenario.contexts()
    setup = scenario.sim_config()
    costs: dict[str, Sequence[RequestCost]] = {
        m.name: [RequestCost.of(perf, max_batched_tokens) for _, perf in m.variants]
        for m in setup.models
    }
    works = {
        m.name: ModelWork(
            floor_gpus=sum(p.min_instances for p in m.regions) * min(c.gpus for c in costs[m.name]),
            arrived=np.zeros(minutes),
            due=np.zeros(minutes),
        )
        for m in setup.models
    }
    token_works = {
        name: ModelWork(w.floor_gpus, np.zeros(minutes), np.zeros(minutes))
        for name, w in works.items()
    }
    tokens: dict[tuple[str, str], np.ndarray] = {}
    for req in requests(wl, scenario.tiers, contexts):
        work = works.get(req.model)
        if work is None or not fits(req.model, req.prompt_tokens + req.output_tokens, contexts):
            continue
        t = min(minutes - 1, max(0, int((req.arrival - wl.start_s) // 60.0)))
        key = (req.model, req.region)
        series = tokens.get(key)
        if series is None:
            series = tokens[key] = np.zeros(minutes)
        n_tokens = req.prompt_tokens + req.output_tokens
        series[t] += n_tokens / 60.0
        tw = token_works[req.model]
        tw.arrived[t] += n_tokens
        prefill, decode = min(
            (c.gpu_seconds(req.prompt_tokens, req.output_tokens) for c in costs[req.model]),
            key=sum,
        )
        work.arrived[t] += prefill + decode
        tier = req.tier
        if tier.interactive and tier.ttft_slo_s is not None:  # the first token's prefill
            due, pinned = int((req.arrival + tier.ttft_slo_s - wl.start_s) // 60.0), prefill
            tw.due[t] += n_tokens  # at capacity at SLO: all of it, in its minute
        elif not tier.interactive and tier.deadline_s is not None:  # all of it
            due, pinned = (
                int((req.arrival + tier.deadline_s - wl.start_s) // 60.0),
                prefill + decode,
            )
            if due < minutes:
                tw.due[due] += n_tokens
        else:
            continue
        if due < minutes:
            work.due[due] += pinned
    gpus = {(m.name, v): perf.gpus for m in setup.models for v, perf in m.variants}
    return WindowLoad(works, tokens, token_works, gpus)


def fluid_lower_bound(work: dict[str, ModelWork]) -> LowerBound:
    """The lower bound on GPU-hours over the window of the models' `work`."""
    by_model = {name: solve_model(w) for name, w in work.items()}
    return LowerBound(sum(by_model.values()), by_model)


def capacity_bound(
    load: WindowLoad,
    peak_tps: Mapping[tuple[str, str], float],
    fallback: Mapping[str, float],
) -> LowerBound:
    """The least GPU-hours at the fleet's measured capacity at SLO: the LP of `solve_model`
    with each request's tokens costing tokens ÷ c GPU-seconds, c the most tokens/s per GPU
    any instance of the model served in a minute that kept the SLO (`peak_tps` per (model,
    variant), measured by the runs, `sim.capacity_windows`), every interactive request's
    tokens served in its arrival minute and batch by its deadline (SageServe §6.3: the ILP
    sizes interactive load per interval at the capacity at SLO, batch fills the troughs).

    Why next to the peak-efficiency bound: that one holds for any run but charges work at a
    batch no instance reaches within a latency SLO, so it sits far under every policy; this
    one charges what the fleet showed it can serve at SLO. No run that kept the SLO in every
    minute can go below it, up to a request's tokens shifting by the minute they straddle:
    none of its instances served more than c per GPU in such a minute. A model no run
    measured keeps its peak-efficiency figure (`fallback`)."""
    by_model: dict[str, float] = {}
    for name, tw in load.token_work.items():
        per_gpu = [
            tps / load.gpus[(m, v)]
            for (m, v), tps in peak_tps.items()
            if m == name and tps > 0 and (m, v) in load.gpus
        ]
        if not per_gpu:
            by_model[name] = fallback.get(name, 0.0)
            continue
        c = max(per_gpu)
        by_model[name] = solve_model(ModelWork(tw.floor_gpus, tw.arrived / c, tw.due / c))
    return LowerBound(sum(by_model.values()), by_model)
