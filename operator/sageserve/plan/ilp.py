"""SageServe's provisioning ILP (paper §5, [v3]) plus the constraints a real fleet needs.

Decision: the instance target x_{m,r,g} = n_{m,r,g} + δ_{m,r,g} for every (model, region, GPU
type) the model can run on. The paper's problem, exactly:

- C1 (local service): Σ_g θ_{m,g} x_{m,r,g} ≥ ε · max_w ρ_{m,r}(w)            ∀ m, r
- C2 (global service): Σ_{r,g} θ_{m,g} x_{m,r,g} ≥ max_w Σ_r ρ_{m,r}(w)       ∀ m
  (the peak of the *summed* demand per window, not the sum of regional peaks)
- C3: δ ≥ −n, i.e. x ≥ 0
- objective γ + μ = Σ c_{m,g} δ + Σ σ_{m,g} max(0, δ), with c = α_g × GPUs per instance.

max(0, δ) is linearised by writing δ = up − down with integer up ≥ 0 and 0 ≤ down ≤ n: the
objective (c + σ)·up − c·down makes "up and down both positive" never better than the net
change, and it needs no extra rows (unlike u ≥ δ), which keeps the model small.

Added (the paper leaves them out; documented in docs/plan-json.md):
- GPU capacity per (region, GPU type): Σ_m gpus_per_instance_{m,g} x_{m,r,g} ≤ cap_{r,g};
- min/max instances per (model, region) summed over GPU types;
- shortfall: if no plan meets C1/C2 within capacity and bounds, slack s_{m,r,t} ≤ (tier t's
  demand at region r's peak window) is allowed in C1 (scaled by ε) and C2, and minimised
  lexicographically tier by tier, highest tier first; the cheapest plan with those shortfalls
  is then chosen. So higher tiers are served first, and the result reports the shortfall
  instead of failing.

ε (paper ambiguity #1): it is an input; the paper gives no value and the reference repository
effectively uses ε = 1 without C2. ScalingPolicy's default is documented with the policy.

The plan is a function of the problem: the solver's budget is a node limit per MIP solve and
the wall clock is only a safety stop (see :class:`PlanOptions`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from sageserve.plan.greedy import greedy_plan
from sageserve.plan.mip import MipModel, MipSolution, ModelBuilder, solve
from sageserve.plan.problem import PlanProblem
from sageserve.plan.result import PlanResult

# Branch-and-bound nodes per MIP solve (see PlanOptions). Measured on plan/bench.py's fleets:
# on the coupled 20 × 20 × 5 fleets it reaches the gaps the former 10 s wall-clock budget
# reached on a lightly loaded 2-core machine (mean 0.18 %) in 8–12 s, and it solves every
# per-model MIP of the uncoupled 100 × 30 × 6 fleets to the gap (docs/plan-json.md).
DEFAULT_NODE_LIMIT = 100


@dataclass(frozen=True)
class PlanOptions:
    """Solver settings (from the ScalingPolicy's ILP settings).

    The hourly plan of SageServe §5 must be a function of its inputs, so the solver's budget
    is deterministic work, not wall-clock time: ``node_limit`` branch-and-bound nodes for each
    MIP solve (HiGHS ``mip_max_nodes``, CBC ``maxNodes``), one thread and a fixed ``seed``.
    The same problem then gives the same plan on any machine, however fast or loaded.

    ``time_limit`` (seconds) is only a safety stop against a runaway solve: every solver call
    gets it whole, it is never split by measuring elapsed time, and a plan it cut short says so
    in its ``reason`` (that plan is the one result that depends on the machine). ``threads``
    above 1 lets HiGHS use more threads, which it does not promise to be deterministic.
    """

    solver: str = "highs"
    time_limit: float = 60.0
    mip_gap: float = 1e-4
    threads: int = 1
    node_limit: int = DEFAULT_NODE_LIMIT
    seed: int = 0

    def __post_init__(self) -> None:
        if self.node_limit < 1:
            raise ValueError("node_limit must be at least 1 (the root node)")
        if self.time_limit <= 0:
            raise ValueError("time_limit must be positive")


@dataclass
class _Layout:
    """Where each decision lives in the column vector."""

    cells: list[tuple[int, int, int]] = field(default_factory=list)  # (m, r, g) indices
    x: list[int] = field(default_factory=list)  # target instances of each cell
    u: dict[tuple[int, int, int], int] = field(default_factory=dict)  # start-up slack columns
    ub: dict[tuple[int, int, int], int] = field(default_factory=dict)
    shortfall: dict[tuple[int, int, int], int] = field(default_factory=dict)  # (m, r, t) -> col


def solve_plan(  # noqa: C901 — the fallback ladder (coupled, per model, greedy) in one place
    problem: PlanProblem, options: PlanOptions | None = None
) -> PlanResult:
    """Solve one planning problem. Never raises for solver outcomes: the status says what
    happened (see :class:`PlanResult`). Deterministic unless the wall-clock safety stop fires
    (see :class:`PlanOptions`): the clock is read only to report ``solve_seconds``."""
    opts = options or PlanOptions()
    start = time.perf_counter()  # reporting only
    data = _Data(problem)

    def run(model: MipModel, abs_gap: float = 0.0) -> MipSolution:
        sol = solve(
            model,
            solver=opts.solver,
            mip_abs_gap=abs_gap,
            time_limit=opts.time_limit,
            mip_gap=opts.mip_gap,
            threads=opts.threads,
            node_limit=opts.node_limit,
            seed=opts.seed,
        )
        if sol.status == "error" and opts.solver == "highs":
            sol = solve(
                model,
                solver="cbc",
                time_limit=opts.time_limit,
                mip_gap=opts.mip_gap,
                threads=opts.threads,
                node_limit=opts.node_limit,
                seed=opts.seed,
            )
        return sol

    decomposed = _solve_by_model(data, run, opts, start)
    if decomposed is not None:
        return decomposed
    model, layout = data.build(shortfall=False)
    sol = run(model)
    if sol.status in ("optimal", "node_limit", "time_limit"):
        status = "optimal" if sol.status == "optimal" else "time_limit"
        return data.result(status, sol, layout, start, reason=_stop_reason(sol, opts))
    if sol.status == "no_solution":
        greedy = data.greedy(layout)
        if greedy is not None:
            # A valid plan beats none: the greedy plan meets every constraint.
            return data.result_from(
                "time_limit",
                greedy,
                {},
                "greedy",
                None,
                start,
                f"{_limit_words(sol, opts)} reached before the solver found a plan; "
                "greedy plan (feasible, not optimised)",
            )
        return _failed(
            data, f"no feasible plan found within the {_limit_words(sol, opts)}", sol, start
        )
    if sol.status == "error":
        return _failed(data, f"solver error: {sol.message}", sol, start)

    # Demand cannot be met in full: shed lowest tiers first.
    caps: dict[int, float] = {}
    stops: list[MipSolution] = []
    for t in range(len(data.tiers)):
        model, layout = data.build(shortfall=True, minimise_tier=t, tier_caps=caps)
        sol = run(model)
        if sol.status == "infeasible":
            return _failed(data, data.diagnose_infeasible(), sol, start)
        if sol.status not in ("optimal", "node_limit", "time_limit"):
            return _failed(
                data, f"shortfall phase for tier {data.tiers[t]!r}: {sol.message}", sol, start
            )
        if sol.status != "optimal":
            stops.append(sol)
        caps[t] = data.tier_total(sol, layout, t)
    model, layout = data.build(shortfall=True, tier_caps=caps)
    sol = run(model)
    if sol.status not in ("optimal", "node_limit", "time_limit"):
        return _failed(data, f"final shortfall phase: {sol.message}", sol, start)
    status = "shortfall" if sol.status == "optimal" else "time_limit"
    reason = _stop_reason(sol, opts)
    if reason is None:
        reason = "not enough GPUs / instance bounds for the forecast demand"
        if stops:  # a higher tier's shortfall may not be the least possible
            reason += f"; {_limit_words(stops[0], opts)} reached in a shortfall phase"
    return data.result(status, sol, layout, start, reason=reason)


def _solve_by_model(  # noqa: C901 — per-model solves and the safety stop that ends them
    data: _Data,
    run: Callable[[MipModel, float], MipSolution],
    opts: PlanOptions,
    start: float,
) -> PlanResult | None:
    """Exact shortcut: without GPU capacity rows the problem splits into one small MIP per
    model (C1, C2 and bounds never mix models), and one B&B tree per model is far faster than
    one tree over all of them (the per-model gaps add up to at most the same relative gap).
    With an inventory, the union of the per-model optima is optimal for the full problem when
    it also fits the inventory (optimal for a relaxation, and feasible); a per-model solve that
    is not proven optimal ends the shortcut. Returns None when the caller must solve the
    coupled problem.

    Budget: each per-model MIP gets the node limit (deterministic). If one is cut short by the
    wall-clock safety stop, the models after it get their greedy plans without a solve, so a
    runaway costs one time limit, not one per model.

    Gap: the full problem's criterion is (UB − LB)/UB ≤ mip_gap. Each model may stop at an
    absolute gap of mip_gap × LB/M, where LB is a cheap valid lower bound of the whole
    objective (every model pays at least its cheapest cost per token/s for its global peak),
    so the summed gaps meet the same criterion while a small model is not held to a precision
    of a fraction of a cent (per-model relative gaps made near-tied GPU types very slow)."""
    coupled = bool(data.p.gpu_capacity)
    models_with_cells = max(1, len(data.models))
    abs_gap = opts.mip_gap * data.objective_lower_bound() / models_with_cells
    values: dict[tuple[int, int, int], int] = {}
    upper = slack = 0.0  # summed incumbents and summed (incumbent − bound)
    solver, status, unknown_gap = "", "optimal", False
    timed_out = False  # the safety stop fired: no more solver calls
    limits: set[str] = set()
    for i in range(len(data.models)):
        model, layout = data.build(shortfall=False, only_model=i, capacity=False)
        if model.num_cols == 0:
            continue
        if timed_out:
            sol = MipSolution("no_solution", message="safety stop in an earlier model")
            sol.timed_out = True
        else:
            sol = run(model, abs_gap)
            timed_out = sol.timed_out
        if sol.status != "optimal":
            limits.add(_limit_words(sol, opts))
        if sol.status == "no_solution" and not coupled:
            # This model's budget ran out before any incumbent: its greedy plan is valid.
            greedy = data.greedy(layout)
            if greedy is None:
                return None
            values.update(greedy)
            status, unknown_gap = "time_limit", True
            continue
        if sol.status in ("node_limit", "time_limit") and not coupled:
            status = "time_limit"
        elif sol.status != "optimal":
            return None
        solver = sol.solver
        upper += sol.objective
        slack += sol.objective * (sol.gap if sol.gap is not None else 1.0)
        values.update(
            {cell: round(sol.x[col]) for cell, col in zip(layout.cells, layout.x, strict=True)}
        )
    p = data.p
    used: dict[tuple[int, int], int] = {}
    for (i, j, k), x in values.items():
        used[(j, k)] = used.get((j, k), 0) + p.gpus_per_instance[data.models[i]][data.gpus[k]] * x
    for (j, k), total in used.items():
        cap = p.gpu_cap(data.regions[j], data.gpus[k])
        if cap is not None and total > cap:
            return None
    gap: float | None = slack / upper if upper > 0 else 0.0
    if unknown_gap:
        gap = None
    elif status == "time_limit" and gap is not None and gap <= opts.mip_gap:
        status = "optimal"  # some models stopped early, but the whole plan meets the gap
    reason = None
    if status == "time_limit":
        shown = "unknown (greedy plan for some models)" if gap is None else f"{gap:.3%}"
        reason = f"{' and '.join(sorted(limits))} reached in the per-model solves; gap {shown}"
    return data.result_from(status, values, {}, solver, gap, start, reason)


def _limit_words(sol: MipSolution, opts: PlanOptions) -> str:
    """Which budget stopped a solve, in the words the plan's reason uses."""
    if sol.timed_out:
        return (
            f"wall-clock safety stop ({opts.time_limit:g} s per solve; "
            "this plan depends on the machine's speed)"
        )
    if sol.status in ("node_limit", "no_solution"):
        return f"node limit ({opts.node_limit} per solve)"
    return f"solver limit ({sol.message})"


def _stop_reason(sol: MipSolution, opts: PlanOptions) -> str | None:
    if sol.status not in ("node_limit", "time_limit"):
        return None
    gap = "unknown" if sol.gap is None else f"{sol.gap:.3%}"
    return f"{_limit_words(sol, opts)} reached; best plan found, gap {gap}"


def _failed(data: _Data, reason: str, sol: MipSolution, start: float) -> PlanResult:
    return PlanResult(
        status="infeasible",
        reason=reason,
        solve_seconds=time.perf_counter() - start,
        solver=sol.solver,
    )


class _Data:
    """Problem data in index form, and the formulation."""

    def __init__(self, p: PlanProblem) -> None:
        self.p = p
        self.models, self.regions, self.gpus = p.models, p.regions, p.gpu_types
        self.tiers = p.tier_names()
        nm, nr = len(self.models), len(self.regions)
        w = p.windows()
        # peak_local[m][r] = max_w ρ; at_peak[m][r][t] = tier t's demand in that window.
        self.peak_local = np.zeros((nm, nr))
        self.at_peak = np.zeros((nm, nr, len(self.tiers)))
        self.peak_global = np.zeros(nm)
        for i, m in enumerate(self.models):
            total = np.zeros(max(w, 1))
            for j, r in enumerate(self.regions):
                per_tier = p.tier_demand(m, r)
                series = np.array([per_tier[t] for t in self.tiers]).reshape(len(self.tiers), -1)
                if series.size == 0:
                    continue  # no demand windows at all
                summed = series.sum(axis=0)
                if summed.size:
                    wstar = int(np.argmax(summed))
                    self.peak_local[i, j] = float(summed[wstar])
                    self.at_peak[i, j, :] = series[:, wstar]
                    total[: summed.size] += summed
            self.peak_global[i] = float(total.max()) if total.size else 0.0

    def build(  # noqa: C901 — the ILP of SageServe §5, one constraint family after another
        self,
        *,
        shortfall: bool,
        minimise_tier: int | None = None,
        tier_caps: dict[int, float] | None = None,
        only_model: int | None = None,
        capacity: bool = True,
    ) -> tuple[MipModel, _Layout]:
        """The MIP; ``only_model`` / ``capacity=False`` give the per-model relaxation used by
        ``solve_plan``'s decomposition."""
        p, b, lay = self.p, ModelBuilder(), _Layout()
        cost_on = minimise_tier is None
        eps = p.epsilon
        nm, nr = len(self.models), len(self.regions)
        c1: dict[tuple[int, int], tuple[list[int], list[float]]] = {}
        c2: dict[int, tuple[list[int], list[float]]] = {}
        caps: dict[tuple[int, int], tuple[list[int], list[float]]] = {}
        counts: dict[tuple[int, int], tuple[list[int], list[float]]] = {}
        terms: dict[tuple[int, int], list[tuple[int, float]]] = {}
        min_cost, max_theta = math.inf, 0.0
        for i, m in enumerate(self.models):
            if only_model is not None and i != only_model:
                continue
            for j, r in enumerate(self.regions):
                bnd = p.bound(m, r)
                for k, g in enumerate(self.gpus):
                    theta = p.theta(m, g, r)
                    if theta is None:
                        continue
                    n = p.current_instances(m, r, g)
                    gpi = p.gpus_per_instance[m][g]
                    c, sigma = p.instance_cost(m, g), p.startup_cost(m, g)
                    if c > 0:
                        min_cost = min(min_cost, c)
                    max_theta = max(max_theta, theta)
                    # More instances than the model's whole peak needs on this GPU type are
                    # never useful (beyond the min bound), so this bound cuts nothing optimal.
                    ub = max(n, math.ceil(self.peak_global[i] / theta - 1e-9), bnd.min)
                    if bnd.max is not None:
                        ub = min(ub, bnd.max)
                    cap = p.gpu_cap(r, g)
                    if cap is not None:
                        ub = min(ub, cap // gpi)
                    # Objective (γ + μ) + Σ c·n: the fleet's cost after the change plus the
                    # start-up cost, so the relative MIP gap is relative to the fleet's cost.
                    # n = 0: every instance is new, cost c + σ. n > 0: cost c per instance and
                    # σ per instance above n through a continuous u ≥ x − n (max(0, δ)
                    # linearised); u is integral at the optimum because x is.
                    x = b.add_col(
                        (c + sigma if n == 0 else c) if cost_on else 0.0,
                        0.0,
                        float(max(ub, 0)),
                        True,
                    )
                    if n > 0 and sigma > 0 and cost_on and ub > n:
                        u = b.add_col(sigma, 0.0, float(ub - n), False)
                        b.add_row([u, x], [1.0, -1.0], float(-n), math.inf)
                        lay.u[(i, j, k)] = u
                    lay.cells.append((i, j, k))
                    lay.x.append(x)
                    lay.ub[(i, j, k)] = max(ub, 0)
                    _push(c1, (i, j), x, theta)
                    _push(c2, i, x, theta)
                    _push(counts, (i, j), x, 1.0)
                    terms.setdefault((i, j), []).append((x, theta))
                    if cap is not None and capacity:
                        _push(caps, (j, k), x, float(gpi))
        # A tiny cost on shortfall in the final phase reports the least shortfall that the
        # chosen plan needs, without trading it against real cost.
        tiny = 1e-7 * (min_cost if math.isfinite(min_cost) else 1.0) / max(max_theta, 1.0)
        tier_rows: dict[int, tuple[list[int], list[float]]] = {}
        if shortfall:
            for i in range(nm):
                if only_model is not None and i != only_model:
                    continue
                for j in range(nr):
                    for t in range(len(self.tiers)):
                        hi = float(self.at_peak[i, j, t])
                        if hi <= 0:
                            continue
                        obj = tiny if minimise_tier is None else float(t == minimise_tier)
                        col = b.add_col(obj, 0.0, hi, False)
                        lay.shortfall[(i, j, t)] = col
                        _push(c1, (i, j), col, eps)
                        _push(c2, i, col, 1.0)
                        _push(tier_rows, t, col, 1.0)
        inf = math.inf
        for i in range(nm):
            if only_model is not None and i != only_model:
                continue
            for j in range(nr):
                need = eps * self.peak_local[i, j]
                if need > 0:
                    _row(b, *c1.get((i, j), ([], [])), need, inf)
                    if not shortfall:
                        _rounding_cuts(b, terms.get((i, j), []), need)
                bnd = p.bound(self.models[i], self.regions[j])
                if bnd.min > 0 or bnd.max is not None:
                    hi = inf if bnd.max is None else float(bnd.max)
                    _row(b, *counts.get((i, j), ([], [])), float(bnd.min), hi)
            if self.peak_global[i] > 0:
                _row(b, *c2.get(i, ([], [])), float(self.peak_global[i]), inf)
                if not shortfall:
                    model_terms = [t for j in range(nr) for t in terms.get((i, j), [])]
                    _rounding_cuts(b, model_terms, float(self.peak_global[i]))
        for j, r in enumerate(self.regions):
            for k, g in enumerate(self.gpus):
                cap = p.gpu_cap(r, g)
                if cap is not None and (j, k) in caps:
                    _row(b, *caps[(j, k)], -inf, float(cap))
        for t, limit in (tier_caps or {}).items():
            if t in tier_rows:
                _row(b, *tier_rows[t], -inf, limit + 1e-7 * max(1.0, limit))
        return b.build(), lay

    def objective_lower_bound(self) -> float:
        """A valid lower bound of the solver objective (fleet cost after the change + μ):
        model m's capacity must reach its global peak, and no GPU type delivers a token/s
        cheaper than min_g c/θ (θ the largest of any region's where regions have their own)."""
        p, total = self.p, 0.0
        for i, m in enumerate(self.models):
            rates = [
                p.instance_cost(m, g) / max(p.theta(m, g, r) or t for r in [None, *p.regions])
                for g, t in p.capacity_tps.get(m, {}).items()
            ]
            local = p.epsilon * float(self.peak_local[i].sum())
            if rates:
                total += min(rates) * max(float(self.peak_global[i]), local)
        return total

    def greedy(self, lay: _Layout) -> dict[tuple[int, int, int], int] | None:
        """The greedy feasible plan (see ``plan.greedy``), or None if it gets stuck."""
        p = self.p
        need_local = {
            (i, j): p.epsilon * float(self.peak_local[i, j])
            for i in range(len(self.models))
            for j in range(len(self.regions))
        }
        need_global = {i: float(self.peak_global[i]) for i in range(len(self.models))}
        return greedy_plan(p, lay.cells, lay.ub, need_local, need_global)

    def tier_total(self, sol: MipSolution, lay: _Layout, t: int) -> float:
        return float(sum(sol.x[col] for (_, _, tt), col in lay.shortfall.items() if tt == t))

    def result(
        self, status: str, sol: MipSolution, lay: _Layout, start: float, reason: str | None
    ) -> PlanResult:
        values = {cell: round(sol.x[col]) for cell, col in zip(lay.cells, lay.x, strict=True)}
        short = {key: float(sol.x[col]) for key, col in lay.shortfall.items()}
        return self.result_from(status, values, short, sol.solver, sol.gap, start, reason)

    def result_from(
        self,
        status: str,
        values: dict[tuple[int, int, int], int],
        short: dict[tuple[int, int, int], float],
        solver: str,
        gap: float | None,
        start: float,
        reason: str | None,
    ) -> PlanResult:
        p = self.p
        target: dict[str, dict[str, dict[str, int]]] = {}
        delta: dict[str, dict[str, dict[str, int]]] = {}
        gamma = mu = 0.0
        for (i, j, k), x in values.items():
            m, r, g = self.models[i], self.regions[j], self.gpus[k]
            n = p.current_instances(m, r, g)
            d = x - n
            target.setdefault(m, {}).setdefault(r, {})[g] = n + d
            delta.setdefault(m, {}).setdefault(r, {})[g] = d
            gamma += p.instance_cost(m, g) * d
            mu += p.startup_cost(m, g) * max(0, d)
        shortfall: dict[str, dict[str, float]] = {}
        by_tier: dict[str, dict[str, dict[str, float]]] = {}
        for (i, j, t), value in short.items():
            if value <= 1e-6 * max(1.0, float(self.peak_local[i, j])):
                continue
            m, r = self.models[i], self.regions[j]
            value = round(value, 3)
            shortfall.setdefault(m, {})[r] = shortfall.get(m, {}).get(r, 0.0) + value
            by_tier.setdefault(m, {}).setdefault(r, {})[self.tiers[t]] = value
        final_status = status
        if status == "shortfall" and not shortfall:
            final_status = "optimal"
        return PlanResult.model_validate(
            {
                "status": final_status,
                "reason": reason if final_status != "optimal" else None,
                "target": target,
                "delta": delta,
                "objective": gamma + mu,
                "gamma": gamma,
                "mu": mu,
                "shortfall_tps": shortfall,
                "shortfall_tps_by_tier": by_tier if self.p.tiers else {},
                "solve_seconds": time.perf_counter() - start,
                "solver": solver,
                "mip_gap": gap,
            }
        )

    def diagnose_infeasible(self) -> str:
        """Name the regions whose min bounds cannot fit their GPUs (a necessary check)."""
        p = self.p
        bad: list[str] = []
        for r in self.regions:
            if p.gpu_cap(r, self.gpus[0]) is None and p.gpu_capacity is None:
                continue
            need = 0
            for m in self.models:
                lo = p.bound(m, r).min
                if lo <= 0:
                    continue
                options = [
                    p.gpus_per_instance[m][g]
                    for g in self.gpus
                    if (p.theta(m, g) is not None and (p.gpu_cap(r, g) or 0) > 0)
                    or (p.theta(m, g) is not None and p.gpu_cap(r, g) is None)
                ]
                if not options:
                    bad.append(f"{m}@{r} (min {lo}, no GPU type it can run on has capacity)")
                    continue
                need += lo * min(options)
            total = sum((p.gpu_cap(r, g) or 0) for g in self.gpus)
            if any(p.gpu_cap(r, g) is None for g in self.gpus):
                continue
            if need > total:
                bad.append(f"region {r}: min bounds need at least {need} GPUs, {total} exist")
        detail = "; ".join(bad) if bad else "min bounds and gpu_capacity contradict each other"
        return f"no plan satisfies the instance bounds within the GPU capacity: {detail}"


def _rounding_cuts(b: ModelBuilder, terms: list[tuple[int, float]], need: float) -> None:
    """Chvátal–Gomory rounding of a covering row Σ θ_k x_k ≥ need, once per divisor d among
    the row's θ values: Σ ceil(θ_k/d) x_k ≥ ceil(need/d). Valid for integer x ≥ 0 and tighter
    than the LP row (d = max θ gives "at least ceil(need/θmax) instances")."""
    for d in sorted({theta for _, theta in terms}):
        cols = [x for x, _ in terms]
        vals = [float(math.ceil(theta / d - 1e-9)) for _, theta in terms]
        _row(b, cols, vals, float(math.ceil(need / d - 1e-9)), math.inf)


def _push(rows: dict[Any, tuple[list[int], list[float]]], key: Any, col: int, val: float) -> None:
    cols, vals = rows.setdefault(key, ([], []))
    cols.append(col)
    vals.append(val)


def _row(b: ModelBuilder, cols: list[int], vals: list[float], lo: float, hi: float) -> None:
    """Add a row, or nothing when it has no columns (then it is either trivially true or the
    infeasibility shows up in the model through another row)."""
    if cols:
        b.add_row(cols, vals, lo, hi)
    elif lo > 1e-9 or hi < -1e-9:
        # Empty but violated (e.g. demand for a model that can run nowhere): keep it visible
        # as an impossible bound on a dummy column so the solver reports infeasible.
        dummy = b.add_col(0.0, 0.0, 0.0, False)
        b.add_row([dummy], [1.0], lo, hi)
