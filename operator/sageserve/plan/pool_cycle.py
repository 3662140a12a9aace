"""The pools' share of a planning cycle: forecast each pooled model's request rate, size
each ModelPool's pods from the expected number of active models, and put them into the ILP.

Why in the cycle: pooled pods take GPUs from the same (region, GPU type) capacity as the
dedicated models; adding them to the one ILP (`plan.pool_sizing.with_pool`) makes one plan cover
both, so neither is promised GPUs the other already holds (Aegaeon's pool next to the hot
models' dedicated instances, §2.2). Sizing (`plan.pool_sizing.size_switching_pool`): each pooled
model's forecast request rate λᵢ and the time a request keeps it active
Tᵢ = meanOutputTokens × tbtSeconds give E[m] = Σ(1 − e^(−λᵢTᵢ)) (Aegaeon Theorem 3.1); a pod
keeps `awakePerInstance` models awake, so the pool needs ⌈active / quota⌉ pods.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sageserve.api.model_pool import ModelPool, PoolRegion
from sageserve.api.scaling_policy import ScalingPolicySpec
from sageserve.forecast.api import forecast_peak
from sageserve.forecast.types import ForecastSpec
from sageserve.pace.base import PacingStrategy, available_strategies, make_strategy, sizes_pools
from sageserve.plan.pool_sizing import POOL_MODEL_PREFIX, size_switching_pool, with_pool
from sageserve.plan.problem import InstanceBounds, PlanProblem
from sageserve.plan.result import PlanResult

#: (pool, region) → pooled model name → its request rate per forecast step (requests/s)
PoolRates = Mapping[tuple[str, str], Mapping[str, Sequence[float]]]


def pool_sizing(policy: str, strategy: PacingStrategy) -> tuple[bool, str, str]:
    """The pool's `Sized` condition under its policy's strategy: (status, reason, message).

    Only the hourly plan cycle forecasts each pooled model's request rate and sizes the pool
    from E[m] (Aegaeon §3, in the same ILP as the ModelDeployments); under any other
    strategy the pool would silently keep its initial size, so it says so (the operator in
    the ModelPool's condition, the simulator in its summary)."""
    if sizes_pools(strategy):
        return (
            True,
            "Planned",
            f"sized by ScalingPolicy {policy!r}'s hourly plan (strategy {strategy.name})",
        )
    planners = ", ".join(n for n in available_strategies() if sizes_pools(make_strategy(n)))
    return (
        False,
        "StrategyDoesNotSizePools",
        f"spec.policyRef.name: ScalingPolicy {policy!r} uses strategy {strategy.name}, which "
        f"does not size ModelPools; each region keeps initialInstances (else minInstances). "
        f"Point the pool at a policy with strategy {planners}, or pin the size with "
        "minInstances = maxInstances",
    )


@dataclass(frozen=True)
class PoolTarget:
    """One pool in one region: what the forecast asks and what the plan grants."""

    pool: str
    region: str
    gpu_type: str
    #: forecast request rate per pooled model (requests/s)
    rates_rps: dict[str, float]
    expected_active: float
    sized_active: int
    #: pods the sizing asks for, within the region's bounds
    wanted: int
    #: pods the plan grants (fewer when the GPUs are short)
    target: int
    #: the forecaster's method per model, and why it fell back where it did
    methods: dict[str, str]
    #: True when no model had a usable observation: the size is held
    held: bool = False


def bounded(region: PoolRegion, wanted: int) -> int:
    """`wanted` within the region's minInstances and maxInstances (the plan's targets, and
    the operator's when it applies them)."""
    return max(region.min_instances, min(region.max_instances, wanted))


def size_pools(
    pools: Sequence[ModelPool],
    spec: ForecastSpec,
    policy: ScalingPolicySpec,
    rates: PoolRates,
    current: Mapping[tuple[str, str], int],
) -> list[PoolTarget]:
    """What each (pool, region) asks for, from the forecast rates of its models."""
    method, fallback = policy.forecast.method.value, policy.forecast.fallback.value
    out: list[PoolTarget] = []
    for pool in pools:
        s = pool.spec
        service = s.sizing.mean_output_tokens * s.sizing.tbt_seconds
        for region in s.regions:
            key = (pool.metadata.name, region.name)
            history = rates.get(key, {})
            forecast: dict[str, float] = {}
            methods: dict[str, str] = {}
            reliable = False
            for m in s.models:
                fc = forecast_peak(history.get(m.name, []), spec, method=method, fallback=fallback)
                methods[m.name] = fc.method + (
                    f" ({fc.fallback_reason})" if fc.fallback_reason else ""
                )
                if fc.reliable:
                    reliable = True
                    forecast[m.name] = max(0.0, fc.peak_tps)
                else:
                    forecast[m.name] = 0.0
            sized = size_switching_pool(
                [forecast[m.name] for m in s.models],
                service,
                s.awake_per_instance,
                s.sizing.active_quantile,
            )
            held = not reliable and key in current
            wanted = current[key] if held else bounded(region, sized.instances)
            out.append(
                PoolTarget(
                    pool=pool.metadata.name,
                    region=region.name,
                    gpu_type=s.variant.gpu_type,
                    rates_rps=forecast,
                    expected_active=sized.expected_active,
                    sized_active=sized.sized_active,
                    wanted=wanted,
                    target=wanted,
                    methods=methods,
                    held=held,
                )
            )
    return out


def add_pools(
    problem: PlanProblem | None,
    pools: Sequence[ModelPool],
    targets: Sequence[PoolTarget],
    policy: ScalingPolicySpec,
    current: Mapping[tuple[str, str], int],
    gpu_capacity: Mapping[tuple[str, str], int] | None,
) -> PlanProblem:
    """`problem` (None: no dedicated model) with every pool as GPU demand (`with_pool`),
    its regions and GPU types added where the dedicated models have none."""
    data: dict[str, Any] = (
        problem.model_dump()
        if problem is not None
        else {
            "models": [],
            "regions": [],
            "gpu_types": [],
            "current": {},
            "demand_tps": {},
            "capacity_tps": {},
            "gpus_per_instance": {},
            "startup_seconds": {},
            "gpu_hour_cost": {},
            "epsilon": policy.optimizer.local_serve_fraction,
            "bounds": {},
            "gpu_capacity": {} if gpu_capacity is not None else None,
        }
    )
    costs = {c.gpu_type: c.cost_per_gpu_hour for c in policy.optimizer.gpu_hour_costs}
    regions, gpus = list(data["regions"]), list(data["gpu_types"])
    for t in targets:
        if t.region not in regions:
            regions.append(t.region)
        if t.gpu_type not in gpus:
            gpus.append(t.gpu_type)
    data["regions"], data["gpu_types"] = sorted(regions), sorted(gpus)
    for g in gpus:
        data["gpu_hour_cost"].setdefault(g, costs.get(g, policy.optimizer.default_gpu_hour_cost))
    if gpu_capacity is not None:
        data["gpu_capacity"] = {
            r: {g: gpu_capacity.get((r, g), 0) for g in data["gpu_types"]} for r in data["regions"]
        }
    # unvalidated until `with_pool` validates the whole (a problem of pools alone has no
    # dedicated model, which a PlanProblem by itself refuses); nested models stay models
    data["bounds"] = {
        m: {r: InstanceBounds.model_validate(b) for r, b in per_region.items()}
        for m, per_region in (data.get("bounds") or {}).items()
    }
    out = PlanProblem.model_construct(**data)
    for pool in pools:
        mine = [t for t in targets if t.pool == pool.metadata.name]
        if not mine:
            continue
        out = with_pool(
            out,
            pool.metadata.name,
            {(t.region, t.gpu_type): t.wanted for t in mine},
            pool.spec.variant.gpus_per_instance,
            current={(t.region, t.gpu_type): current.get((t.pool, t.region), 0) for t in mine},
            startup_seconds=float(pool.spec.variant.startup_seconds),
        )
    return out


def granted(targets: Sequence[PoolTarget], result: PlanResult) -> list[PoolTarget]:
    """`targets` with what the solved plan grants each (its `wanted` when the plan has no
    target for it, e.g. an infeasible plan: the pool is then sized on its own)."""
    from dataclasses import replace

    out = []
    for t in targets:
        per_region = result.target.get(POOL_MODEL_PREFIX + t.pool, {}).get(t.region)
        got = per_region.get(t.gpu_type) if per_region else None
        out.append(replace(t, target=t.wanted if got is None else int(got)))
    return out
