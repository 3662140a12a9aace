"""Manifests → plan problem → targets, solved by the real MILP solver."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from sageserve.api.model_deployment import ModelDeployment
from sageserve.api.scaling_policy import Layouts, ScalingPolicy
from sageserve.core.types import EndpointKey
from sageserve.plan.fleet import build_problem, endpoint_targets, variant_targets
from sageserve.plan.ilp import solve_plan

ROOT = Path(__file__).resolve().parents[2]
H100, A100 = "NVIDIA-H100-80GB-HBM3", "NVIDIA-A100-SXM4-80GB"
REGIONS = ("us-east", "us-central", "us-west")


def _paper() -> tuple[list[ModelDeployment], ScalingPolicy]:
    docs = yaml.safe_load_all((ROOT / "policies" / "base" / "models.yaml").read_text())
    mds = [ModelDeployment.model_validate(d) for d in docs]
    policy = ScalingPolicy.model_validate(
        yaml.safe_load(
            (ROOT / "policies" / "overlays" / "lt-ua" / "scalingpolicy.yaml").read_text()
        )
    )
    return mds, policy


def test_problem_carries_capacities_costs_bounds_and_demand_from_the_manifests() -> None:
    mds, policy = _paper()
    current = {("llama-2-70b", "us-east", "h100"): 20}
    demand = {("llama-2-70b", "us-east"): [3000.0, 6160.0]}
    problem = build_problem(mds, policy.spec, current, demand)
    assert problem.models == ["llama-2-70b", "bloom-176b", "llama-3-1-8b", "llama-3-2-3b"]
    assert problem.gpu_types == [A100, H100]
    assert problem.capacity_tps["llama-2-70b"] == {H100: 308, A100: 180}
    assert problem.gpu_hour_cost == {H100: 12.29, A100: 4.10}
    assert problem.current["llama-2-70b"]["us-east"] == {H100: 20, A100: 0}
    assert problem.demand_tps["llama-2-70b"]["us-east"] == [3000.0, 6160.0]
    assert problem.demand_tps["bloom-176b"]["us-west"] == [0.0, 0.0]  # padded to the horizon
    assert problem.bounds is not None and problem.bounds["llama-2-70b"]["us-west"].min == 2
    assert problem.epsilon == 1.0


def test_planned_targets_cover_the_forecast_within_gpu_capacity() -> None:
    mds, policy = _paper()
    mds = mds[:1]  # llama-2-70b only
    demand = {("llama-2-70b", r): [6160.0] for r in REGIONS}  # 20 H100 instances' worth
    capacity = {(r, g): 8 * 30 for r in REGIONS for g in (H100, A100)}
    result = solve_plan(build_problem(mds, policy.spec, {}, demand, capacity))
    assert result.status == "optimal"
    targets = variant_targets(mds, result)
    for region in REGIONS:
        served = (
            targets[("llama-2-70b", region, "h100")] * 308
            + targets[("llama-2-70b", region, "a100")] * 180
        )
        assert served >= 6160.0
        assert (
            targets[("llama-2-70b", region, "h100")] + targets[("llama-2-70b", region, "a100")]
            <= 40
        )
    totals = endpoint_targets(targets)
    assert set(totals) == {EndpointKey("llama-2-70b", r) for r in REGIONS}


def test_too_few_gpus_gives_a_reported_shortfall_not_an_error() -> None:
    mds, policy = _paper()
    mds = mds[:1]
    demand = {("llama-2-70b", r): [6160.0] for r in REGIONS}
    capacity = {(r, g): 8 * 4 for r in REGIONS for g in (H100, A100)}  # 8 instances per region
    result = solve_plan(build_problem(mds, policy.spec, {}, demand, capacity))
    assert result.status == "shortfall"
    assert result.shortfall_tps["llama-2-70b"]["us-east"] == pytest.approx(
        6160.0 - 4 * 308 - 4 * 180
    )


def test_with_layouts_every_variant_of_a_gpu_type_counts_as_current() -> None:
    """OServe layouts: a TP4xPP2 replica holds 8 H100s the ILP's planned variant would
    otherwise have to start (its current is counted in the planned variant's GPUs)."""
    mds, policy = _paper()
    raw = mds[0].model_dump(by_alias=True, exclude_none=True)
    h100 = next(v for v in raw["spec"]["variants"] if v["gpuType"] == H100)
    raw["spec"]["variants"].append(
        {**h100, "name": "h100-pp2", "gpusPerInstance": 16, "pipelineParallel": 2}
    )
    md = ModelDeployment.model_validate(raw)
    current = {("llama-2-70b", "us-east", "h100"): 1, ("llama-2-70b", "us-east", "h100-pp2"): 1}
    demand = {("llama-2-70b", "us-east"): [3000.0]}
    plain = build_problem([md], policy.spec, current, demand)
    assert plain.current["llama-2-70b"]["us-east"][H100] == 1
    spec = policy.spec.model_copy(update={"layouts": Layouts()})
    with_layouts = build_problem([md], spec, current, demand)
    assert with_layouts.current["llama-2-70b"]["us-east"][H100] == 3  # (8 + 16) / 8


def test_a_region_with_its_own_learned_theta_is_sized_with_it() -> None:
    """θ learned per region replaces the declared θ only there: a region whose instances
    were seen serving twice as much needs half the instances for the same demand."""
    mds, policy = _paper()
    mds = mds[:1]
    variants = {v.name: v for v in mds[0].spec.variants}
    h100 = variants["h100"].capacity_tokens_per_second
    demand = {("llama-2-70b", r): [h100 * 10.0] for r in REGIONS}
    gpus = {(r, H100): 8 * 30 for r in REGIONS}  # H100 only: one θ per region to compare
    theta = {("llama-2-70b", "h100", "us-east"): 2.0 * h100}
    problem = build_problem(mds, policy.spec, {}, demand, gpus, theta)
    assert problem.theta("llama-2-70b", H100, "us-east") == 2.0 * h100
    assert problem.theta("llama-2-70b", H100, "us-west") == h100
    targets = variant_targets(mds, solve_plan(problem))
    assert targets[("llama-2-70b", "us-east", "h100")] == 5
    assert targets[("llama-2-70b", "us-west", "h100")] == 10


@pytest.mark.parametrize(
    ("regional", "message"),
    [
        ({"nope": {}}, "capacity_tps_by_region.nope: unknown model"),
        ({"m": {"mars": {}}}, "capacity_tps_by_region.m.mars: unknown region"),
        ({"m": {"r": {"g2": 5.0}}}, "capacity_tps_by_region.m.r.g2: no capacity_tps.m.g2"),
        ({"m": {"r": {"g": 0.0}}}, "capacity_tps_by_region.m.r.g: must be a positive number"),
    ],
)
def test_regional_theta_is_checked_field_by_field(
    regional: dict[str, dict[str, dict[str, float]]], message: str
) -> None:
    from sageserve.plan.problem import PlanProblem

    with pytest.raises(ValueError, match=message.replace(".", r"\.")):
        PlanProblem(
            models=["m"],
            regions=["r"],
            gpu_types=["g", "g2"],
            capacity_tps={"m": {"g": 100.0}},
            capacity_tps_by_region=regional,
            gpus_per_instance={"m": {"g": 1}},
            gpu_hour_cost={"g": 1.0, "g2": 1.0},
            epsilon=1.0,
        )
