"""The planner's input: one hourly provisioning problem (the `sageserve plan` JSON contract).

Units (paper ambiguity #2, settled here): demand ρ and per-instance capacity θ are both in
**tokens per second**. The paper's appendix forecasts tokens per minute and the reference
repository compares a per-minute forecast with ``30 × TPS``; we use one unit on both sides so
that the ratio ρ/θ is simply "instances needed".

Costs: ``gpu_hour_cost[g]`` is α per GPU-hour; one instance of model m on GPU type g costs
``c = α_g × gpus_per_instance[m][g]`` per hour; its start-up cost is
``σ = c × startup_seconds[m][g] / 3600`` (the paper's σ = α × start-up time).

These types are the plan's own (not ``core``): the JSON contract is an API of the planner and is
documented in ``docs/plan-json.md``.
"""

from __future__ import annotations

import math
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

Nested2 = dict[str, dict[str, float]]


class InstanceBounds(BaseModel):
    """Instances of one model in one region, summed over GPU types."""

    model_config = ConfigDict(extra="forbid")

    min: int = Field(default=0, ge=0)
    max: int | None = Field(default=None, ge=0)

    @model_validator(mode="after")
    def _min_le_max(self) -> InstanceBounds:
        if self.max is not None and self.max < self.min:
            raise ValueError(f"min ({self.min}) is greater than max ({self.max})")
        return self


class PlanProblem(BaseModel):
    """One planning problem; see ``docs/plan-json.md`` for the field-by-field contract.

    Missing entries have a meaning rather than being errors where the meaning is obvious:
    no ``current`` entry = 0 instances, no ``demand_tps`` entry = no demand, no
    ``capacity_tps[m][g]`` = model m cannot run on GPU g, no ``gpu_capacity`` = unlimited GPUs,
    no ``bounds`` = min 0 / no max. ``capacity_tps_by_region[m][r][g]``, where given,
    replaces ``capacity_tps[m][g]`` in that region (θ learned per region from the fleet,
    ``plan.learned_capacity``). Names that are not declared in ``models`` / ``regions`` /
    ``gpu_types`` are errors, because a typo there would silently drop demand or capacity.

    Tiers (optional): ``tiers`` lists tier names, highest priority first, and
    ``demand_tps_by_tier[m][r][tier]`` gives each tier's forecast per window. When demand cannot
    be met, the planner sheds the lowest tier first (lexicographically). Without tiers, all
    demand is one tier. If both ``demand_tps`` and ``demand_tps_by_tier`` are given for a
    (model, region), their per-window sums must agree.
    """

    model_config = ConfigDict(extra="forbid")

    models: list[str] = Field(min_length=1)
    regions: list[str] = Field(min_length=1)
    gpu_types: list[str] = Field(min_length=1)
    current: dict[str, dict[str, dict[str, int]]] = Field(default_factory=dict)
    demand_tps: dict[str, dict[str, list[float]]] = Field(default_factory=dict)
    capacity_tps: Nested2
    capacity_tps_by_region: dict[str, dict[str, dict[str, float]]] | None = None
    gpus_per_instance: dict[str, dict[str, int]]
    gpu_hour_cost: dict[str, float]
    startup_seconds: Nested2 = Field(default_factory=dict)
    epsilon: float = Field(gt=0.0, le=1.0)
    gpu_capacity: dict[str, dict[str, int]] | None = None
    bounds: dict[str, dict[str, InstanceBounds]] | None = None
    tiers: list[str] | None = None
    demand_tps_by_tier: dict[str, dict[str, dict[str, list[float]]]] | None = None

    @model_validator(mode="after")
    def _check_references(self) -> PlanProblem:  # noqa: C901 — a flat list of independent input checks, each naming the field
        errors: list[str] = []
        models, regions, gpus = set(self.models), set(self.regions), set(self.gpu_types)
        for name, names in (
            ("models", self.models),
            ("regions", self.regions),
            ("gpu_types", self.gpu_types),
        ):
            if len(set(names)) != len(names):
                errors.append(f"{name}: duplicate names")

        def keys(path: str, mapping: dict[str, Any], allowed: set[str], kind: str) -> None:
            for key in mapping:
                if key not in allowed:
                    errors.append(f"{path}.{key}: unknown {kind} (not in {kind}s)")

        keys("current", self.current, models, "model")
        for m, per_region in self.current.items():
            keys(f"current.{m}", per_region, regions, "region")
            for r, per_gpu in per_region.items():
                keys(f"current.{m}.{r}", per_gpu, gpus, "gpu_type")
                for g, n in per_gpu.items():
                    if n < 0:
                        errors.append(f"current.{m}.{r}.{g}: must be >= 0, got {n}")
                    elif n > 0 and g not in self.capacity_tps.get(m, {}):
                        errors.append(
                            f"current.{m}.{r}.{g}: {n} instances on a GPU type the model has no "
                            f"capacity_tps for; add capacity_tps.{m}.{g}"
                        )
        keys("capacity_tps", self.capacity_tps, models, "model")
        for m, theta_by_gpu in self.capacity_tps.items():
            keys(f"capacity_tps.{m}", theta_by_gpu, gpus, "gpu_type")
            for g, theta in theta_by_gpu.items():
                if not (theta > 0 and math.isfinite(theta)):
                    errors.append(f"capacity_tps.{m}.{g}: must be a positive number, got {theta}")
                gpi = self.gpus_per_instance.get(m, {}).get(g)
                if gpi is None:
                    errors.append(f"gpus_per_instance.{m}.{g}: missing (capacity_tps has it)")
                elif gpi < 1:
                    errors.append(f"gpus_per_instance.{m}.{g}: must be >= 1, got {gpi}")
        keys("capacity_tps_by_region", self.capacity_tps_by_region or {}, models, "model")
        for m, regional in (self.capacity_tps_by_region or {}).items():
            keys(f"capacity_tps_by_region.{m}", regional, regions, "region")
            for r, regional_theta in regional.items():
                for g, theta in regional_theta.items():
                    path = f"capacity_tps_by_region.{m}.{r}.{g}"
                    if g not in self.capacity_tps.get(m, {}):
                        errors.append(f"{path}: no capacity_tps.{m}.{g} to replace; add it")
                    elif not (theta > 0 and math.isfinite(theta)):
                        errors.append(f"{path}: must be a positive number, got {theta}")
        keys("gpus_per_instance", self.gpus_per_instance, models, "model")
        for m, per_gpu in self.gpus_per_instance.items():
            keys(f"gpus_per_instance.{m}", per_gpu, gpus, "gpu_type")
        keys("startup_seconds", self.startup_seconds, models, "model")
        for m, secs_by_gpu in self.startup_seconds.items():
            keys(f"startup_seconds.{m}", secs_by_gpu, gpus, "gpu_type")
            for g, s in secs_by_gpu.items():
                if not (s >= 0 and math.isfinite(s)):
                    errors.append(f"startup_seconds.{m}.{g}: must be >= 0, got {s}")
        keys("gpu_hour_cost", self.gpu_hour_cost, gpus, "gpu_type")
        for g in self.gpu_types:
            cost = self.gpu_hour_cost.get(g)
            if cost is None:
                errors.append(f"gpu_hour_cost.{g}: missing")
            elif not (cost >= 0 and math.isfinite(cost)):
                errors.append(f"gpu_hour_cost.{g}: must be >= 0, got {cost}")
        if self.gpu_capacity is not None:
            keys("gpu_capacity", self.gpu_capacity, regions, "region")
            for r, per_gpu in self.gpu_capacity.items():
                keys(f"gpu_capacity.{r}", per_gpu, gpus, "gpu_type")
                for g, cap in per_gpu.items():
                    if cap < 0:
                        errors.append(f"gpu_capacity.{r}.{g}: must be >= 0, got {cap}")
        if self.bounds is not None:
            keys("bounds", self.bounds, models, "model")
            for m, bounds_by_region in self.bounds.items():
                keys(f"bounds.{m}", bounds_by_region, regions, "region")
                for r, b in bounds_by_region.items():
                    if b.min > 0 and not self.capacity_tps.get(m):
                        errors.append(f"bounds.{m}.{r}.min: model has no capacity_tps on any GPU")

        lengths: set[int] = set()

        def series(path: str, values: list[float]) -> None:
            lengths.add(len(values))
            if not values:
                errors.append(f"{path}: needs at least one window")
            for w, v in enumerate(values):
                if not (v >= 0 and math.isfinite(v)):
                    errors.append(f"{path}[{w}]: must be a finite number >= 0, got {v}")

        keys("demand_tps", self.demand_tps, models, "model")
        for m, demand_by_region in self.demand_tps.items():
            keys(f"demand_tps.{m}", demand_by_region, regions, "region")
            for r, values in demand_by_region.items():
                series(f"demand_tps.{m}.{r}", values)
        if self.demand_tps_by_tier is not None:
            if not self.tiers:
                errors.append("demand_tps_by_tier: given without tiers")
            tiers = set(self.tiers or [])
            if len(tiers) != len(self.tiers or []):
                errors.append("tiers: duplicate names")
            keys("demand_tps_by_tier", self.demand_tps_by_tier, models, "model")
            for m, per_region_t in self.demand_tps_by_tier.items():
                keys(f"demand_tps_by_tier.{m}", per_region_t, regions, "region")
                for r, per_tier in per_region_t.items():
                    keys(f"demand_tps_by_tier.{m}.{r}", per_tier, tiers, "tier")
                    for t, tier_values in per_tier.items():
                        series(f"demand_tps_by_tier.{m}.{r}.{t}", tier_values)
                    total = self.demand_tps.get(m, {}).get(r)
                    if total is not None and per_tier:
                        summed = [sum(v) for v in zip(*per_tier.values(), strict=False)]
                        if len(summed) == len(total) and any(
                            abs(a - b) > 1e-6 * max(1.0, abs(b))
                            for a, b in zip(summed, total, strict=True)
                        ):
                            errors.append(
                                f"demand_tps.{m}.{r}: differs from the sum of "
                                f"demand_tps_by_tier.{m}.{r} over tiers"
                            )
        if len(lengths) > 1:
            errors.append(
                f"demand_tps: every series must have the same number of windows, got "
                f"{sorted(lengths)}"
            )
        if errors:
            raise ValueError("; ".join(errors))
        return self

    # --- derived views used by the formulation (no validation logic below) ---

    def windows(self) -> int:
        """Number of forecast windows in the horizon (0 when there is no demand at all)."""
        for per_region in self.demand_tps.values():
            for values in per_region.values():
                return len(values)
        for per_region_t in (self.demand_tps_by_tier or {}).values():
            for per_tier in per_region_t.values():
                for values in per_tier.values():
                    return len(values)
        return 0

    def tier_names(self) -> list[str]:
        """Tier names, highest priority first; one implicit tier when none are declared."""
        return list(self.tiers) if self.tiers else ["all"]

    def tier_demand(self, model: str, region: str) -> dict[str, list[float]]:
        """Per-tier demand series of one (model, region); zeros where nothing is given."""
        w = self.windows()
        by_tier = (self.demand_tps_by_tier or {}).get(model, {}).get(region)
        if by_tier:
            return {t: list(by_tier.get(t, [0.0] * w)) for t in self.tier_names()}
        total = self.demand_tps.get(model, {}).get(region, [0.0] * w)
        names = self.tier_names()
        # Total given without a split: it all belongs to the highest tier.
        return {t: (list(total) if i == 0 else [0.0] * w) for i, t in enumerate(names)}

    def demand(self, model: str, region: str) -> list[float]:
        """Total demand series ρ_{m,r}(w) in tokens/s."""
        per_tier = self.tier_demand(model, region)
        w = self.windows()
        return [sum(series[k] for series in per_tier.values()) for k in range(w)]

    def current_instances(self, model: str, region: str, gpu: str) -> int:
        return self.current.get(model, {}).get(region, {}).get(gpu, 0)

    def theta(self, model: str, gpu: str, region: str | None = None) -> float | None:
        """θ of `model` on `gpu` (None: it cannot run there), in `region` where that region
        has its own."""
        base = self.capacity_tps.get(model, {}).get(gpu)
        if base is None or region is None or not self.capacity_tps_by_region:
            return base
        return self.capacity_tps_by_region.get(model, {}).get(region, {}).get(gpu, base)

    def instance_cost(self, model: str, gpu: str) -> float:
        """c = α_g × GPUs per instance ($ per instance-hour)."""
        return self.gpu_hour_cost[gpu] * self.gpus_per_instance[model][gpu]

    def startup_cost(self, model: str, gpu: str) -> float:
        """σ = c × start-up hours."""
        seconds = self.startup_seconds.get(model, {}).get(gpu, 0.0)
        return self.instance_cost(model, gpu) * seconds / 3600.0

    def bound(self, model: str, region: str) -> InstanceBounds:
        return (self.bounds or {}).get(model, {}).get(region, InstanceBounds())

    def gpu_cap(self, region: str, gpu: str) -> int | None:
        """GPUs available in (region, type); None = unlimited. A region listed in
        ``gpu_capacity`` without a type has 0 of that type; an unlisted region is unlimited."""
        if self.gpu_capacity is None or region not in self.gpu_capacity:
            return None
        return self.gpu_capacity[region].get(gpu, 0)
