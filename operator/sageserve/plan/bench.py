"""Synthetic planning problems of a given size, and the ``sageserve bench plan`` timing.

The instances look like a fleet: diurnal demand per (model, region) with a per-region phase,
θ per (model, GPU type) roughly proportional to GPU speed and inversely to model size, some
(model, GPU) pairs impossible (model too large), current instances near yesterday's need, and
GPU inventories that are tight in some regions so that capacity rows bind.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np

from sageserve.plan.ilp import PlanOptions, solve_plan
from sageserve.plan.problem import PlanProblem

# A GPU catalogue with public-cloud-like relative decode throughput, memory (GB) and $/GPU-hour.
CATALOGUE: list[tuple[str, float, int, float]] = [
    ("h100", 1.00, 80, 4.0),
    ("a100-80", 0.62, 80, 2.6),
    ("a100-40", 0.55, 40, 2.0),
    ("l40s", 0.40, 48, 1.4),
    ("a10g", 0.16, 24, 0.75),
    ("h200", 1.30, 141, 5.0),
    ("b200", 2.10, 192, 8.0),
    ("v100", 0.25, 32, 1.1),
]


def synthetic_problem(
    models: int,
    regions: int,
    gpu_types: int,
    *,
    seed: int = 0,
    windows: int = 6,
    tight: float = 1.0,
    inventory: bool = True,
) -> PlanProblem:
    """A reproducible problem; ``tight`` scales the GPU inventory's headroom over today's use
    (1.0: 0–40 % headroom per (region, type) plus 0–16 spare GPUs)."""
    rng = np.random.default_rng(seed)
    if gpu_types > len(CATALOGUE):
        raise ValueError(f"at most {len(CATALOGUE)} GPU types")
    gpus = [name for name, *_ in CATALOGUE[:gpu_types]]
    speed = np.array([v for _, v, _, _ in CATALOGUE[:gpu_types]])
    mem = np.array([v for _, _, v, _ in CATALOGUE[:gpu_types]])
    # Each operator negotiates its own prices: ±15 % around the list price.
    cost = np.array([v for *_, v in CATALOGUE[:gpu_types]]) * rng.uniform(0.85, 1.15, gpu_types)
    size_gb = rng.choice([8, 16, 70, 140, 400], models, p=[0.3, 0.2, 0.3, 0.1, 0.1])
    model_names = [f"m{i:03d}" for i in range(models)]
    region_names = [f"r{j:02d}" for j in range(regions)]
    capacity: dict[str, dict[str, float]] = {}
    gpi: dict[str, dict[str, int]] = {}
    startup: dict[str, dict[str, float]] = {}
    for i, m in enumerate(model_names):
        capacity[m], gpi[m], startup[m] = {}, {}, {}
        for k, g in enumerate(gpus):
            per = int(2 ** math.ceil(math.log2(max(1.0, 1.3 * size_gb[i] / mem[k]))))
            if per > 8:
                continue
            # Throughput per instance: GPU speed × GPUs, less for bigger models, ±10 % per
            # (model, GPU) pair for kernels that suit one GPU better than another.
            capacity[m][g] = float(
                round(per * speed[k] * 40000.0 / math.sqrt(size_gb[i]) * rng.uniform(0.9, 1.1), 1)
            )
            gpi[m][g] = per
            startup[m][g] = float(round(60 + 2.0 * size_gb[i] * rng.uniform(0.8, 1.2), 1))
    demand: dict[str, dict[str, list[float]]] = {}
    current: dict[str, dict[str, dict[str, int]]] = {}
    used = np.zeros((regions, gpu_types))
    popularity = rng.lognormal(0.0, 1.0, models)
    for i, m in enumerate(model_names):
        demand[m], current[m] = {}, {}
        base_theta = max(capacity[m].values()) if capacity[m] else 1.0
        for j, r in enumerate(region_names):
            if rng.random() < 0.25:
                continue  # model not offered in this region
            level = popularity[i] * base_theta * rng.uniform(0.5, 6.0)
            phase = rng.uniform(0, 2 * math.pi)
            t0 = rng.uniform(0, 24)
            series = [
                float(
                    round(
                        level
                        * (1.0 + 0.4 * math.sin(phase + 2 * math.pi * (t0 + w / 6) / 24))
                        * rng.uniform(0.9, 1.1),
                        1,
                    )
                )
                for w in range(windows)
            ]
            demand[m][r] = series
            options = list(capacity[m])
            if not options:
                continue
            g = options[int(rng.integers(len(options)))]
            k = gpus.index(g)
            n = max(0, round(max(series) / capacity[m][g] * rng.uniform(0.7, 1.3)))
            current[m][r] = {g: n}
            used[j, k] += n * gpi[m][g]
    # Inventory: what the current fleet uses per (region, type) — it runs today, so it fits —
    # times a headroom drawn around ``tight``, plus a few spare GPUs; some types are absent
    # from some regions. Low headroom makes capacity rows bind and forces type substitution.
    gpu_capacity = {
        r: {
            g: math.ceil(used[j, k] * tight * rng.uniform(1.0, 1.4))
            + int(rng.integers(0, 3)) * 8 * int(rng.random() < 0.8)
            for k, g in enumerate(gpus)
        }
        for j, r in enumerate(region_names)
    }
    return PlanProblem.model_validate(
        {
            "models": model_names,
            "regions": region_names,
            "gpu_types": gpus,
            "current": current,
            "demand_tps": demand,
            "capacity_tps": capacity,
            "gpus_per_instance": gpi,
            "gpu_hour_cost": {g: float(round(cost[k], 3)) for k, g in enumerate(gpus)},
            "startup_seconds": startup,
            "epsilon": 0.8,
            "gpu_capacity": gpu_capacity if inventory else None,
            "bounds": {m: {r: {"min": 1, "max": 400} for r in demand[m]} for m in model_names},
        }
    )


@dataclass(frozen=True)
class BenchRow:
    size: str
    seed: int
    status: str
    seconds: float
    build_seconds: float
    objective: float | None
    gap: float | None


def bench_plan(
    sizes: list[tuple[int, int, int]],
    seeds: int = 3,
    options: PlanOptions | None = None,
    inventory: bool = True,
) -> list[BenchRow]:
    """Solve ``seeds`` random instances of each size; wall seconds include building."""
    rows: list[BenchRow] = []
    for size in sizes:
        for seed in range(seeds):
            t0 = time.perf_counter()
            problem = synthetic_problem(*size, seed=seed, inventory=inventory)
            t1 = time.perf_counter()
            result = solve_plan(problem, options)
            rows.append(
                BenchRow(
                    size="x".join(map(str, size)),
                    seed=seed,
                    status=result.status,
                    seconds=time.perf_counter() - t1,
                    build_seconds=t1 - t0,
                    objective=result.objective,
                    gap=result.mip_gap,
                )
            )
    return rows
