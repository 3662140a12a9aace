"""OServe's lower level: assign each request type's rate to the replicas (OServe §4.2).

The paper builds a flow network (source → type j → (replica k, type j) → replica k → sink) and
solves it with preflow-push. Its node constraint C3, Σ_j x_{k,j} · M_k / n_{k,j} ≤ M_k, charges
each unit of type-j flow M_k / n_{k,j} units of the replica's capacity, a factor that differs
per type: that is a generalised flow, which an ordinary max-flow cannot enforce. The exact
equivalent is a small LP, solved here with HiGHS (`plan/mip.py`); dividing C3 by M_k removes
the LCM:

    maximise  Φ = Σ_{k,j} x_{k,j}
    s.t.      Σ_k x_{k,j} ≤ λ_j              (C1, demand of type j)
              x_{k,j} ≤ e_{k,j}              (C2, edge capacity; e = n when not given)
              Σ_j x_{k,j} / n_{k,j} ≤ 1      (C3, the replica's shared capacity)
              x ≥ 0

x, λ, n and e are requests/s. Many assignments reach the same Φ (always when the replicas can
serve more than the demand), and the routing weights x_{k,j}/λ_j would then be whatever
vertex the simplex stops at. The tie-break, settled here ([GAP] in the paper), is
lexicographic, each level an LP that keeps the levels above it:

1. Φ, the paper's objective;
2. only when some demand is unserved: the largest θ such that every type gets at least θ of
   its rate (max-concurrent flow). Without it, maximising Φ alone cuts the types that cost
   most per request first (long prompts, long outputs), all of them, to serve more of the
   cheap ones; with it the shortfall is spread as evenly as Φ allows;
3. the smallest highest replica utilisation u = max_k Σ_j x_{k,j}/n_{k,j}. Once Φ is fixed
   the remaining freedom is where the load sits, and the latency the paper measures (P99)
   grows with the busiest replica's load, not with the mean; spreading it leaves every
   replica headroom for bursts inside the span. Level 2 alone would not do it: when all the
   demand is served every assignment gives θ = 1.

`mix_scale` is a different question, the one the layout search asks to break its own ties:
how far the whole predicted mix could grow (the largest θ with θ·λ servable, uncapped).
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

import numpy as np

from sageserve.plan.mip import FloatArray, ModelBuilder, solve

#: relative slack when an upper level's optimum is held as a constraint of the next level
_HOLD = 1e-9
#: requests/s below which a rate or a capacity counts as zero
_NEGLIGIBLE = 1e-9


@dataclass(frozen=True)
class Assignment:
    """The LP's answer for one span.

    served[k][j]: requests/s of type j sent to replica k (x_{k,j});
    weights[k][j]: x_{k,j}/λ_j, the routing weight of replica k within type j (0 when λ_j = 0);
    unserved[j]: λ_j − Σ_k x_{k,j}; utilisation[k]: Σ_j x_{k,j}/n_{k,j};
    throughput: Φ; fair_share: the θ of level 2 (1.0 when everything is served);
    status: the solver's status of the last level solved ("optimal" unless it failed).
    """

    served: tuple[tuple[float, ...], ...]
    weights: tuple[tuple[float, ...], ...]
    unserved: tuple[float, ...]
    utilisation: tuple[float, ...]
    throughput: float
    fair_share: float
    status: str


def _check(
    rates: Sequence[float],
    capacity: Sequence[Sequence[float]],
    edge_capacity: Sequence[Sequence[float]] | None,
) -> tuple[FloatArray, FloatArray, FloatArray]:
    lam = np.asarray(rates, dtype=np.float64)
    n = np.asarray(capacity, dtype=np.float64).reshape(len(capacity), len(rates))
    if lam.ndim != 1 or np.any(~np.isfinite(lam)) or np.any(lam < 0):
        raise ValueError(f"rates: finite and >= 0 per type, got {list(rates)}")
    if np.any(~np.isfinite(n)) or np.any(n < 0):
        raise ValueError("capacity: n[k][j] must be finite and >= 0 requests/s")
    # Rates and capacities under _NEGLIGIBLE requests/s (one request in ~30 years) are 0:
    # their reciprocals in C3 and θ·λ would reach the solver's infinity.
    lam = np.where(lam < _NEGLIGIBLE, 0.0, lam)
    n = np.where(n < _NEGLIGIBLE, 0.0, n)
    if edge_capacity is None:
        e = n.copy()
    else:
        e = np.asarray(edge_capacity, dtype=np.float64).reshape(n.shape)
        if np.any(np.isnan(e)) or np.any(e < 0):
            raise ValueError("edge_capacity: e[k][j] must be >= 0 requests/s")
    return lam, n, e


def _base(
    lam: FloatArray, n: FloatArray, e: FloatArray, *, demand_capped: bool, cost: float = 0.0
) -> tuple[ModelBuilder, list[list[int]]]:
    """Columns x_{k,j} (objective coefficient `cost`, HiGHS minimises) with C2 as bounds,
    C3 rows, and C1 rows when `demand_capped`."""
    b = ModelBuilder()
    k_count, j_count = n.shape
    cols: list[list[int]] = []
    for k in range(k_count):
        row: list[int] = []
        for j in range(j_count):
            hi = float(min(e[k, j], n[k, j])) if n[k, j] > 0 else 0.0
            if demand_capped:
                hi = min(hi, float(lam[j]))
            row.append(b.add_col(cost, 0.0, hi, False))
        cols.append(row)
    for k in range(k_count):
        idx = [cols[k][j] for j in range(j_count) if n[k, j] > 0]
        if idx:
            b.add_row(idx, [1.0 / float(n[k, j]) for j in range(j_count) if n[k, j] > 0], 0, 1.0)
    if demand_capped:
        for j in range(j_count):
            b.add_row([cols[k][j] for k in range(k_count)], [1.0] * k_count, 0.0, float(lam[j]))
    return b, cols


def _x(sol_x: FloatArray, cols: list[list[int]]) -> FloatArray:
    return np.asarray([[max(0.0, float(sol_x[c])) for c in row] for row in cols])


def assign(
    rates: Sequence[float],
    capacity: Sequence[Sequence[float]],
    edge_capacity: Sequence[Sequence[float]] | None = None,
) -> Assignment:
    """Assign `rates[j]` (λ_j) to replicas of capacity `capacity[k][j]` (n_{k,j}); see above."""
    lam, n, e = _check(rates, capacity, edge_capacity)
    k_count, j_count = n.shape
    total = float(lam.sum())
    if k_count == 0 or total <= 0:
        x = np.zeros((k_count, j_count))
        return _result(x, lam, n, 1.0, "optimal")
    # Level 1: Φ.
    b, cols = _base(lam, n, e, demand_capped=True, cost=-1.0)
    sol = solve(b.build(), time_limit=10.0)
    if sol.status != "optimal":
        raise RuntimeError(f"assignment LP (throughput) failed: {sol.status} {sol.message}")
    x = _x(sol.x, cols)
    phi = float(x.sum())
    floor_phi = phi * (1.0 - _HOLD) - _HOLD
    fair = 1.0
    if phi < total * (1.0 - 1e-9):
        fair, x = _fairest_shortfall(lam, n, e, floor_phi, x)
    x, status = _least_peak_utilisation(lam, n, e, floor_phi, fair, x)
    return _result(x, lam, n, fair, status)


def _fairest_shortfall(
    lam: FloatArray, n: FloatArray, e: FloatArray, floor_phi: float, x: FloatArray
) -> tuple[float, FloatArray]:
    """Level 2: the largest θ with every type served ≥ θ·λ_j, holding Φ."""
    k_count, j_count = n.shape
    b, cols = _base(lam, n, e, demand_capped=True)
    all_cols = [c for row in cols for c in row]
    theta = b.add_col(-1.0, 0.0, 1.0, False)
    b.add_row(all_cols, [1.0] * len(all_cols), floor_phi, math.inf)
    for j in range(j_count):
        if lam[j] > 0:
            b.add_row(
                [cols[k][j] for k in range(k_count)] + [theta],
                [1.0] * k_count + [-float(lam[j])],
                0.0,
                math.inf,
            )
    sol = solve(b.build(), time_limit=10.0)
    if sol.status != "optimal":
        return 1.0 if float(x.sum()) >= float(lam.sum()) else 0.0, x
    return min(1.0, max(0.0, float(sol.x[theta]))), _x(sol.x, cols)


def _least_peak_utilisation(
    lam: FloatArray, n: FloatArray, e: FloatArray, floor_phi: float, fair: float, x: FloatArray
) -> tuple[FloatArray, str]:
    """Level 3: the smallest highest replica utilisation, holding Φ and θ."""
    k_count, j_count = n.shape
    b, cols = _base(lam, n, e, demand_capped=True)
    all_cols = [c for row in cols for c in row]
    u = b.add_col(1.0, 0.0, 1.0, False)
    b.add_row(all_cols, [1.0] * len(all_cols), floor_phi, math.inf)
    for k in range(k_count):
        idx = [j for j in range(j_count) if n[k, j] > 0]
        if idx:
            b.add_row(
                [cols[k][j] for j in idx] + [u],
                [1.0 / float(n[k, j]) for j in idx] + [-1.0],
                -math.inf,
                0.0,
            )
    if fair < 1.0:
        for j in range(j_count):
            if lam[j] > 0:
                need = fair * float(lam[j]) * (1.0 - _HOLD) - _HOLD
                b.add_row([cols[k][j] for k in range(k_count)], [1.0] * k_count, need, math.inf)
    sol = solve(b.build(), time_limit=10.0)
    if sol.status != "optimal":
        return x, sol.status
    return _x(sol.x, cols), sol.status


def _result(x: FloatArray, lam: FloatArray, n: FloatArray, fair: float, status: str) -> Assignment:
    k_count, j_count = n.shape
    # The solver's feasibility tolerance (~1e-9 absolute) can put a column a hair above its
    # λ_j; scale it back so C1 holds exactly and the weights of a type sum to at most 1.
    x = x.copy()
    for j in range(j_count):
        col = float(x[:, j].sum())
        if col > lam[j]:
            x[:, j] *= float(lam[j]) / col if col > 0 else 0.0
    weights = tuple(
        tuple(float(x[k, j] / lam[j]) if lam[j] > 0 else 0.0 for j in range(j_count))
        for k in range(k_count)
    )
    util = tuple(
        float(sum(x[k, j] / n[k, j] for j in range(j_count) if n[k, j] > 0)) for k in range(k_count)
    )
    served_per_type = x.sum(axis=0) if k_count else np.zeros(j_count)
    unserved = tuple(float(max(0.0, lam[j] - served_per_type[j])) for j in range(j_count))
    return Assignment(
        served=tuple(tuple(float(v) for v in row) for row in x),
        weights=weights,
        unserved=unserved,
        utilisation=util,
        throughput=float(x.sum()),
        fair_share=fair,
        status=status,
    )


def max_throughput(
    rates: Sequence[float],
    capacity: Sequence[Sequence[float]],
    edge_capacity: Sequence[Sequence[float]] | None = None,
) -> float:
    """Φ alone (level 1 of `assign`): one LP, for the layout search's inner loop."""
    lam, n, e = _check(rates, capacity, edge_capacity)
    if n.shape[0] == 0 or float(lam.sum()) <= 0:
        return 0.0
    b, cols = _base(lam, n, e, demand_capped=True, cost=-1.0)
    sol = solve(b.build(), time_limit=10.0)
    if sol.status != "optimal":
        raise RuntimeError(f"assignment LP (throughput) failed: {sol.status} {sol.message}")
    return float(_x(sol.x, cols).sum())


def mix_scale(
    rates: Sequence[float],
    capacity: Sequence[Sequence[float]],
    edge_capacity: Sequence[Sequence[float]] | None = None,
) -> tuple[float, tuple[float, ...]]:
    """The largest θ such that θ·λ_j of every type is servable (max-concurrent flow,
    uncapped: θ > 1 is headroom), and each replica's utilisation at that θ.

    Why the layout search needs it: whenever the replicas can serve the whole demand, every
    layout reaches Φ = Σλ and Algorithm 1's "accept if better" cannot tell them apart
    ([GAP] ties, OServe §4.3); θ still can. The utilisations say which replicas are the
    bottleneck (saturated at θ) and which are not, Algorithm 1's O and U sets. Types that
    none of these replicas can serve are left out of θ (Φ reports them as unserved).
    """
    lam, n, e = _check(rates, capacity, edge_capacity)
    k_count, j_count = n.shape
    # A type no replica can serve at all (too long for every one) would pin θ at 0 whatever
    # the rest does; it is left out here and shows as Φ's shortfall instead.
    servable = np.minimum(n, e).max(axis=0) > 0 if k_count else np.zeros(j_count, dtype=bool)
    lam = np.where(servable, lam, 0.0)
    if k_count == 0 or float(lam.sum()) <= 0:
        return (math.inf if float(lam.sum()) <= 0 else 0.0), tuple(0.0 for _ in range(k_count))
    b, cols = _base(lam, n, e, demand_capped=False)
    theta = b.add_col(-1.0, 0.0, math.inf, False)
    for j in range(j_count):
        if lam[j] > 0:
            b.add_row(
                [cols[k][j] for k in range(k_count)] + [theta],
                [1.0] * k_count + [-float(lam[j])],
                0.0,
                math.inf,
            )
    sol = solve(b.build(), time_limit=10.0)
    if sol.status != "optimal":
        raise RuntimeError(f"assignment LP (mix scale) failed: {sol.status} {sol.message}")
    x = _x(sol.x, cols)
    util = tuple(
        float(sum(x[k, j] / n[k, j] for j in range(j_count) if n[k, j] > 0)) for k in range(k_count)
    )
    return max(0.0, float(sol.x[theta])), util


K = TypeVar("K", bound=Hashable)


def layout_weights(
    capacity: Mapping[K, Sequence[float]], layout: Sequence[K], rates: Sequence[float]
) -> list[dict[K, float]]:
    """Per type, the share of its requests each strategy of `layout` gets: the dispatch
    weights (OServe §4.2), `assign`'s x_{k,j}/λ_j summed over the replicas of each strategy
    (replicas of one strategy are interchangeable) and normalised. A type with no demand, or
    that no replica can serve, is shared in proportion to n, so a dispatcher still has a
    preference when it appears; a type no replica can serve at all gets no weights.

    The one rule for the simulator's harness (`commands/bench_oserve.py`) and the operator's
    `status.layouts` (`plan/oserve_layouts.variant_weights`), which the router follows."""
    out: list[dict[K, float]] = [{} for _ in rates]
    if not layout:
        return out
    result = assign(list(rates), [list(capacity[s]) for s in layout])
    for j in range(len(rates)):
        served = sum(result.weights[k][j] for k in range(len(layout)))
        shares: dict[K, float] = {}
        for k, s in enumerate(layout):
            w = result.weights[k][j] if served > _NEGLIGIBLE else float(capacity[s][j])
            shares[s] = shares.get(s, 0.0) + w
        total = sum(shares.values())
        if total > 0:
            out[j] = {s: w / total for s, w in shares.items()}
    return out
