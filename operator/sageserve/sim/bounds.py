"""How far any policy could go: GPU-hour bounds of a scenario, next to what policies used.

Why: "LT-UA saves X % over reactive" means little without knowing how much there was to
save. Three figures, all from the request stream alone (one pass, `sim.lower_bound`):

- **floor**: the GPU-hours of every endpoint held at its `minInstances` for the whole window.
  No policy can go below it; when the load is light, every policy sits on it.
- **lower bound**: the fluid LP of `sim.lower_bound`: the least GPU-hours that give every
  interactive request its first token within its TTFT SLO and finish every batch request
  by its deadline, at the perf model's peak efficiency, regions pooled, no start-up, no
  rounding. No run that keeps those SLOs can go below it; how far a policy sits above it is
  what latency, forecasting and whole instances cost together.
- **oracle** (an estimate, not a bound): perfect foresight at θ: each minute, each (model,
  region) holds max(minInstances, ⌈tokens/s ÷ θ⌉) instances of its first variant, ready the
  moment they are needed (no spill-over between regions, load measured at arrival, batch
  served at arrival). Policies that defer batch work or run instances above θ come in
  under it.

- **capacity-at-SLO bound** (after runs): the same LP at the fleet's measured capacity at
  SLO, `sim.lower_bound.capacity_bound`: each token at the most tokens/s per GPU an
  instance served in a minute that kept the SLO (measured by the runs themselves),
  interactive requests in their minute, batch by its deadline. It charges what the fleet
  showed it can do within its SLO, where the lower bound charges a batch size no instance
  reaches within one, so it is the figure a policy's distance is read against.

A ModelPool's pods count in all three at its regions' `minInstances` for the whole window:
no policy runs fewer, and what its pooled models need beyond that is not modelled here (the
bounds stay bounds, looser by the pool's share).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from sageserve.sim.lower_bound import WindowLoad, capacity_bound, fluid_lower_bound, window_load
from sageserve.sim.scenario import Scenario


@dataclass(frozen=True)
class GpuHourBounds:
    floor_gpu_hours: float
    oracle_gpu_hours: float
    lower_bound_gpu_hours: float
    #: None until runs measured the capacity at SLO (`BoundsWork.at_capacity`)
    capacity_bound_gpu_hours: float | None = None


@dataclass(frozen=True)
class BoundsWork:
    """The bounds known from the request stream, and what the capacity-at-SLO bound needs
    once the runs have measured the fleet's capacity (one pass over the stream for both)."""

    bounds: GpuHourBounds
    load: WindowLoad
    lower_by_model: Mapping[str, float]
    pools_gpu_hours: float

    def at_capacity(self, peak_tps: Mapping[tuple[str, str], float]) -> GpuHourBounds:
        """The bounds with the capacity-at-SLO bound at `peak_tps` (per (model, variant),
        `peak_at_slo`); each model's figure is at least its lower bound (both bound)."""
        if not peak_tps:
            return self.bounds
        cap = capacity_bound(self.load, peak_tps, self.lower_by_model).by_model
        total = sum(max(v, self.lower_by_model.get(m, 0.0)) for m, v in cap.items())
        return replace(self.bounds, capacity_bound_gpu_hours=total + self.pools_gpu_hours)


def peak_at_slo(policies: Iterable[Mapping[str, Any]]) -> dict[tuple[str, str], float]:
    """The most tokens/s per instance of each (model, variant) in a minute that kept the
    SLO, over runs' summaries (`capacity_at_slo_tps`): the fleet's measured capacity."""
    out: dict[tuple[str, str], float] = {}
    for p in policies:
        for model, variants in (p.get("capacity_at_slo_tps") or {}).items():
            for variant, tps in variants.items():
                out[(model, variant)] = max(out.get((model, variant), 0.0), float(tps))
    return out


def gpu_hour_bounds(scenario: Scenario) -> GpuHourBounds:
    """Floor, lower bound and θ-sized estimate of `scenario`'s window (see the module doc)."""
    return bounds_work(scenario).bounds


def bounds_work(scenario: Scenario) -> BoundsWork:
    """`gpu_hour_bounds` and what the capacity-at-SLO bound needs after the runs."""
    load = window_load(scenario)
    minutes = max(1, math.ceil(scenario.workload.duration_s / 60.0))
    floor = oracle = 0.0
    for md in scenario.models:
        variant = md.spec.variants[0]
        theta = float(variant.capacity_tokens_per_second)
        gpus = variant.gpus_per_instance
        for region in md.spec.regions:
            floor += region.min_instances * gpus * minutes / 60.0
            series = load.tokens_per_s.get((md.metadata.name, region.name))
            for tps in series if series is not None else [0.0] * minutes:
                n = max(region.min_instances, math.ceil(float(tps) / theta - 1e-9))
                oracle += min(n, region.max_instances) * gpus / 60.0
    pools = sum(
        r.min_instances * pool.spec.variant.gpus_per_instance * minutes / 60.0
        for pool in scenario.pools
        for r in pool.spec.regions
        if r.max_instances > 0
    )
    lower = fluid_lower_bound(load.work)
    return BoundsWork(
        GpuHourBounds(floor + pools, oracle + pools, lower.gpu_hours + pools),
        load,
        lower.by_model,
        pools,
    )


def bounds_dict(b: GpuHourBounds) -> dict[str, float]:
    """The `bounds` entry of `simulate`'s and `compare`'s summaries."""
    out = {
        "floor_gpu_hours": round(b.floor_gpu_hours, 3),
        "lower_bound_gpu_hours": round(b.lower_bound_gpu_hours, 3),
        "oracle_gpu_hours": round(b.oracle_gpu_hours, 3),
    }
    if b.capacity_bound_gpu_hours is not None:
        out["capacity_bound_gpu_hours"] = round(b.capacity_bound_gpu_hours, 3)
    return out


def tightest_bound(b: Mapping[str, Any]) -> float:
    """The bound a policy's distance is read against: the capacity-at-SLO bound where runs
    measured it, else the lower bound (0: neither in the summary)."""
    return float(b.get("capacity_bound_gpu_hours") or b.get("lower_bound_gpu_hours") or 0.0)


def describe_bounds(b: Mapping[str, Any]) -> str:
    """One line for the console and the reports (a summary written before the lower bound
    existed has none)."""
    parts = [f"floor {b['floor_gpu_hours']:,.1f} GPU-h (every endpoint at minInstances)"]
    if "lower_bound_gpu_hours" in b:
        parts.append(
            f"lower bound {b['lower_bound_gpu_hours']:,.1f} GPU-h (fluid LP at peak "
            "efficiency: every first token within its TTFT SLO, batch by its deadline)"
        )
    if "capacity_bound_gpu_hours" in b:
        parts.append(
            f"capacity-at-SLO bound {b['capacity_bound_gpu_hours']:,.1f} GPU-h (fluid LP at "
            "the most tokens/s per GPU an instance served in a minute that kept its SLO: "
            "interactive in its minute, batch by its deadline)"
        )
    parts.append(
        f"θ-sized estimate {b['oracle_gpu_hours']:,.1f} GPU-h (perfect foresight at θ; not a bound)"
    )
    return ", ".join(parts)
