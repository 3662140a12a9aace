"""A fast feasible plan (no optimality claim), the answer of last resort.

Why: on large coupled fleets HiGHS can spend its whole budget (node limit, or the wall-clock
safety stop) without an incumbent, and then there would be no plan at all. A greedy plan that
meets C1, min bounds and C2 within the inventory is returned instead (status ``time_limit``,
solver ``greedy``). (Passing it to HiGHS as a starting solution was measured to make the final
gap worse, so it is not used that way.)

Rule: start from nothing, add one instance at a time to the cell with the lowest cost per
useful tokens/s, where an instance that already runs (x < n) costs c and a new one c + σ.
Returns None when the greedy gets stuck.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TypeVar

from sageserve.plan.problem import PlanProblem

Cell = tuple[int, int, int]
K = TypeVar("K")


def greedy_plan(  # noqa: C901 — one pass per constraint family of §5 in the order the fallback must satisfy them
    p: PlanProblem,
    cells: list[Cell],
    ub: dict[Cell, int],
    need_local: dict[tuple[int, int], float],
    need_global: dict[int, float],
) -> dict[Cell, int] | None:
    models, regions, gpus = p.models, p.regions, p.gpu_types
    x = {cell: 0 for cell in cells}
    used: dict[tuple[int, int], int] = {}
    count: dict[tuple[int, int], int] = {}
    cap_local: dict[tuple[int, int], float] = {}
    cap_global: dict[int, float] = {}
    by_pair: dict[tuple[int, int], list[Cell]] = {}
    by_model: dict[int, list[Cell]] = {}
    for cell in cells:
        by_pair.setdefault((cell[0], cell[1]), []).append(cell)
        by_model.setdefault(cell[0], []).append(cell)

    def room(cell: Cell) -> bool:
        i, j, k = cell
        if x[cell] >= ub[cell]:
            return False
        b = p.bound(models[i], regions[j])
        if b.max is not None and count.get((i, j), 0) >= b.max:
            return False
        limit = p.gpu_cap(regions[j], gpus[k])
        gpi = p.gpus_per_instance[models[i]][gpus[k]]
        return limit is None or used.get((j, k), 0) + gpi <= limit

    def add(cell: Cell) -> None:
        i, j, k = cell
        m, g = models[i], gpus[k]
        x[cell] += 1
        used[(j, k)] = used.get((j, k), 0) + p.gpus_per_instance[m][g]
        count[(i, j)] = count.get((i, j), 0) + 1
        theta = p.theta(m, g, regions[j]) or 0.0
        cap_local[(i, j)] = cap_local.get((i, j), 0.0) + theta
        cap_global[i] = cap_global.get(i, 0.0) + theta

    def price(cell: Cell, deficit: float) -> float:
        i, j, k = cell
        m, r, g = models[i], regions[j], gpus[k]
        cost = p.instance_cost(m, g)
        if x[cell] >= p.current_instances(m, r, g):
            cost += p.startup_cost(m, g)
        useful = min(p.theta(m, g, r) or 0.0, deficit) if deficit > 0 else 1.0
        return cost / max(useful, 1e-9)

    def fill(options: list[Cell], deficit_of: Callable[[], float]) -> bool:
        while True:
            deficit = deficit_of()
            if deficit <= 1e-9:
                return True
            open_cells = [c for c in options if room(c)]
            if not open_cells:
                return False
            add(min(open_cells, key=lambda c: price(c, deficit)))

    for (i, j), options in by_pair.items():
        b = p.bound(models[i], regions[j])
        while count.get((i, j), 0) < b.min:
            open_cells = [c for c in options if room(c)]
            if not open_cells:
                return None
            add(min(open_cells, key=lambda c: price(c, 0.0)))
        if not fill(options, _deficit(cap_local, (i, j), need_local.get((i, j), 0.0))):
            return None
    for i, options in by_model.items():
        if not fill(options, _deficit(cap_global, i, need_global.get(i, 0.0))):
            return None
    for (i, j), total in cap_local.items():  # sanity: the rules above hold
        if total + 1e-6 < need_local.get((i, j), 0.0) - 1e-6 or math.isnan(total):
            return None
    return x


def _deficit(caps: dict[K, float], key: K, need: float) -> Callable[[], float]:
    """How much capacity ``key`` still lacks, read live from ``caps``."""
    return lambda: need - caps.get(key, 0.0)
