"""From a user's manifests to the planner's problem, and from its plan back to targets.

The operator and the simulator both plan for fleets described by ModelDeployments under
a ScalingPolicy; this module is the one translation between those manifests and the ILP's
contract (`PlanProblem` / `PlanResult`), so a policy plans the same way in both worlds.

A ModelDeployment's variants become its (model, GPU type) pairs. The ILP has one
dimension per GPU type, so when two variants share a GPU type (say TP4 and TP8 on H100)
the one listed first is planned for; the other keeps what the pacing loop gives it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from sageserve.api.model_deployment import ModelDeployment, Variant
from sageserve.api.scaling_policy import ScalingPolicySpec
from sageserve.core.types import EndpointKey
from sageserve.plan.learned_capacity import ThetaTable
from sageserve.plan.problem import InstanceBounds, PlanProblem
from sageserve.plan.result import PlanResult

#: (model deployment, region, variant) → instances.
VariantCounts = dict[tuple[str, str, str], int]


def planned_variants(md: ModelDeployment) -> dict[str, Variant]:
    """GPU type → the variant planned for it (the first one listed for that type)."""
    out: dict[str, Variant] = {}
    for variant in md.spec.variants:
        out.setdefault(variant.gpu_type, variant)
    return out


def _layout_current(
    md: ModelDeployment,
    region: str,
    planned: Mapping[str, Variant],
    current: Mapping[tuple[str, str, str], int],
) -> dict[str, int]:
    """Instances now per GPU type when OServe layouts run (`spec.layouts`): every variant of
    the type counts, in units of the planned variant's GPUs (rounded up), so the ILP does
    not charge a start-up for GPUs a layout already holds in another variant."""
    out = {}
    for gpu, plan_v in planned.items():
        gpus = sum(
            current.get((md.metadata.name, region, v.name), 0) * v.gpus_per_instance
            for v in md.spec.variants
            if v.gpu_type == gpu
        )
        out[gpu] = -(-gpus // plan_v.gpus_per_instance)
    return out


def build_problem(
    mds: Sequence[ModelDeployment],
    policy: ScalingPolicySpec,
    current: Mapping[tuple[str, str, str], int],
    demand_tps: Mapping[tuple[str, str], Sequence[float]],
    gpu_capacity: Mapping[tuple[str, str], int] | None = None,
    theta: ThetaTable | None = None,
) -> PlanProblem:
    """The ILP for `mds` under `policy`.

    `current[(md, region, variant)]` are instances now, `demand_tps[(md, region)]` the
    forecast per window (tokens/s, β included), `gpu_capacity[(region, gpu type)]` the GPUs
    the planner may use (serving and spot pools: spot nodes can be reclaimed), `theta` the
    learned θ in force per (md, variant, region) where it replaces the declared one.
    """
    costs = {c.gpu_type: c.cost_per_gpu_hour for c in policy.optimizer.gpu_hour_costs}
    gpu_types = sorted({v.gpu_type for md in mds for v in md.spec.variants})
    regions = sorted({r.name for md in mds for r in md.spec.regions})
    windows = max((len(v) for v in demand_tps.values()), default=1)
    problem: dict[str, object] = {
        "models": [md.metadata.name for md in mds],
        "regions": regions,
        "gpu_types": gpu_types,
        "current": {},
        "demand_tps": {},
        "capacity_tps": {},
        "gpus_per_instance": {},
        "startup_seconds": {},
        "gpu_hour_cost": {
            g: costs.get(g, policy.optimizer.default_gpu_hour_cost) for g in gpu_types
        },
        "epsilon": policy.optimizer.local_serve_fraction,
        "bounds": {},
    }
    current_out: dict[str, dict[str, dict[str, int]]] = {}
    demand_out: dict[str, dict[str, list[float]]] = {}
    bounds_out: dict[str, dict[str, InstanceBounds]] = {}
    capacity: dict[str, dict[str, float]] = {}
    regional: dict[str, dict[str, dict[str, float]]] = {}
    gpus: dict[str, dict[str, int]] = {}
    startup: dict[str, dict[str, float]] = {}
    for md in mds:
        name = md.metadata.name
        variants = planned_variants(md)
        capacity[name] = {g: v.capacity_tokens_per_second for g, v in variants.items()}
        gpus[name] = {g: v.gpus_per_instance for g, v in variants.items()}
        startup[name] = {g: float(v.startup_seconds) for g, v in variants.items()}
        for region in md.spec.regions:
            learned = {
                g: theta[(name, v.name, region.name)]
                for g, v in variants.items()
                if theta and (name, v.name, region.name) in theta
            }
            if learned:
                regional.setdefault(name, {})[region.name] = learned
            per_gpu = {g: current.get((name, region.name, v.name), 0) for g, v in variants.items()}
            if policy.layouts is not None:
                per_gpu = _layout_current(md, region.name, variants, current)
            current_out.setdefault(name, {})[region.name] = per_gpu
            series = list(demand_tps.get((name, region.name), [0.0]))
            series += [series[-1]] * (windows - len(series))
            demand_out.setdefault(name, {})[region.name] = series
            bounds_out.setdefault(name, {})[region.name] = InstanceBounds(
                min=region.min_instances, max=region.max_instances
            )
    problem.update(
        current=current_out,
        demand_tps=demand_out,
        capacity_tps=capacity,
        capacity_tps_by_region=regional or None,
        gpus_per_instance=gpus,
        startup_seconds=startup,
        bounds=bounds_out,
    )
    if gpu_capacity is not None:
        problem["gpu_capacity"] = {
            r: {g: gpu_capacity.get((r, g), 0) for g in gpu_types} for r in regions
        }
    return PlanProblem.model_validate(problem)


def variant_targets(mds: Sequence[ModelDeployment], result: PlanResult) -> VariantCounts:
    """Planned instances per (model deployment, region, variant) of a solved plan."""
    out: VariantCounts = {}
    for md in mds:
        name = md.metadata.name
        for gpu, variant in planned_variants(md).items():
            for region in md.spec.regions:
                out[(name, region.name, variant.name)] = (
                    result.target.get(name, {}).get(region.name, {}).get(gpu, 0)
                )
    return out


def endpoint_targets(targets: VariantCounts) -> dict[EndpointKey, int]:
    """Planned instances per (model, region) endpoint: what the pacing strategies move toward."""
    out: dict[EndpointKey, int] = {}
    for (model, region, _variant), n in targets.items():
        key = EndpointKey(model, region)
        out[key] = out.get(key, 0) + n
    return out
