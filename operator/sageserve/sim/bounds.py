"""How far any policy could go: GPU-hour bounds of a scenario, next to what policies used.

Why: "LT-UA saves X % over reactive" means little without knowing how much there was to
save. Two bounds, both from the request stream alone:

- **floor**: the GPU-hours of every endpoint held at its `minInstances` for the whole window.
  No policy can go below it; when the load is light, every policy sits on it.
- **oracle**: perfect foresight at θ: each minute, each (model, region) holds
  max(minInstances, ⌈tokens/s ÷ θ⌉) instances of its first variant, ready the moment they are
  needed (no start-up, no spill-over between regions, load measured at arrival). A policy
  near the oracle has little left to gain from forecasting; one far above it does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from sageserve.sim.scenario import Scenario
from sageserve.sim.workload import window_tokens_per_minute


@dataclass(frozen=True)
class GpuHourBounds:
    floor_gpu_hours: float
    oracle_gpu_hours: float


def gpu_hour_bounds(scenario: Scenario) -> GpuHourBounds:
    """Floor and perfect-foresight GPU-hours of `scenario`'s window (see the module doc)."""
    iw, niw = window_tokens_per_minute(scenario.workload, scenario.tiers, scenario.contexts())
    minutes = max(1, math.ceil(scenario.workload.duration_s / 60.0))
    floor = oracle = 0.0
    for md in scenario.models:
        variant = md.spec.variants[0]
        theta = float(variant.capacity_tokens_per_second)
        gpus = variant.gpus_per_instance
        for region in md.spec.regions:
            key = (md.metadata.name, region.name)
            load = [
                a + b
                for a, b in zip(
                    iw.get(key, [0.0] * minutes), niw.get(key, [0.0] * minutes), strict=True
                )
            ]
            floor += region.min_instances * gpus * minutes / 60.0
            for tps in load:
                n = max(region.min_instances, math.ceil(tps / theta - 1e-9))
                oracle += min(n, region.max_instances) * gpus / 60.0
    return GpuHourBounds(floor, oracle)
