"""The batch part of the planned demand: max(β, deadline need), the need split over regions."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import yaml

from sageserve.api.model_deployment import ModelDeployment
from sageserve.api.scaling_policy import ScalingPolicySpec
from sageserve.core.types import EndpointKey
from sageserve.plan.batch_demand import batch_demand_tps, split_need
from sageserve.plan.cycle import run_plan_cycle

ROOT = Path(__file__).resolve().parents[2]
REGIONS = ("us-east", "us-central", "us-west")


@pytest.mark.parametrize(
    ("beta", "need", "planned"),
    [
        (50.0, 0.0, 50.0),  # no queue behind its deadlines: the paper's β
        (50.0, 20.0, 50.0),  # β already covers what the queue needs
        (50.0, 400.0, 400.0),  # a starving queue: what it needs, not β on top of it
        (0.0, 400.0, 400.0),  # no batch received last hour, a queue still behind
        (50.0, math.nan, 50.0),  # a need that is not a rate is no need
        (50.0, math.inf, 50.0),
        (50.0, -3.0, 50.0),
    ],
)
def test_the_batch_part_of_demand_is_the_larger_of_the_buffer_and_the_need(
    beta: float, need: float, planned: float
) -> None:
    assert batch_demand_tps(beta, need) == planned


@pytest.mark.parametrize(
    ("need", "interactive", "shares"),
    [
        # in proportion to each region's planned interactive demand
        (600.0, {"a": 3000.0, "b": 1000.0, "c": 2000.0}, {"a": 300.0, "b": 100.0, "c": 200.0}),
        # a region without interactive demand takes no share while another has some
        (500.0, {"a": 0.0, "b": 1000.0}, {"a": 0.0, "b": 500.0}),
        # no region has interactive demand: evenly
        (600.0, {"a": 0.0, "b": 0.0, "c": 0.0}, {"a": 200.0, "b": 200.0, "c": 200.0}),
        # no need: every region gets 0
        (0.0, {"a": 3000.0, "b": 1000.0}, {"a": 0.0, "b": 0.0}),
        # a need that is not a rate is no need
        (math.nan, {"a": 3000.0}, {"a": 0.0}),
        (-5.0, {"a": 3000.0}, {"a": 0.0}),
        # a demand that is not a rate weighs nothing
        (400.0, {"a": math.nan, "b": 1000.0, "c": math.inf}, {"a": 0.0, "b": 400.0, "c": 0.0}),
        # huge demands still split the need, not lose it
        (90.0, {"a": 1e308, "b": 0.5e308}, {"a": 60.0, "b": 30.0}),
        # one region takes it all
        (250.0, {"a": 7.0}, {"a": 250.0}),
        # a model without regions
        (250.0, {}, {}),
    ],
)
def test_a_models_need_is_split_over_its_regions_by_planned_interactive_demand(
    need: float, interactive: dict[str, float], shares: dict[str, float]
) -> None:
    got = split_need(need, interactive)
    assert got == pytest.approx(shares)
    if shares:
        assert sum(got.values()) == pytest.approx(sum(shares.values()))


def _models() -> list[ModelDeployment]:
    docs = yaml.safe_load_all((ROOT / "policies" / "base" / "models.yaml").read_text())
    return [ModelDeployment.model_validate(d) for d in docs if d][:2]


def _policy() -> ScalingPolicySpec:
    return ScalingPolicySpec.model_validate(
        {
            "forecast": {
                "granularitySeconds": 600,
                "trainingWindowSeconds": 6 * 3600,
                "method": "persistence",
            }
        }
    )


def _history(models: list[ModelDeployment]) -> dict[tuple[str, str], list[float]]:
    level = {"us-east": 3000.0, "us-central": 2000.0, "us-west": 1000.0}
    return {(md.metadata.name, r): [level[r]] * 72 for md in models for r in REGIONS}


def test_a_large_deadline_need_raises_that_models_instances_and_nothing_else() -> None:
    models = _models()
    llama, bloom = (md.metadata.name for md in models)
    history = _history(models)
    received = {(llama, r): [500.0] * 6 for r in REGIONS}  # β = 50 tokens/s per region
    before = run_plan_cycle(models, _policy(), history, received, {})
    after = run_plan_cycle(
        models, _policy(), history, received, {}, batch_need={llama: 6000.0, "unknown": 1e4}
    )
    # the need goes to llama's regions by interactive demand (3 : 2 : 1), replacing β
    assert after.batch_need_tps[(llama, "us-east")] == pytest.approx(3000.0)
    assert after.batch_need_tps[(llama, "us-west")] == pytest.approx(1000.0)
    assert after.batch_need_tps[(bloom, "us-east")] == 0.0
    for r in REGIONS:
        key = (llama, r)
        assert after.batch_buffer_tps[key] == before.batch_buffer_tps[key] == 50.0
        assert after.demand_tps[key] == pytest.approx(
            before.demand_tps[key] - 50.0 + after.batch_need_tps[key]
        )
    for (model, region, variant), n in after.targets.items():
        if model == bloom:
            assert n == before.targets[(model, region, variant)]
    was, now = before.endpoint_targets, after.endpoint_targets
    for r in REGIONS:  # every region of llama grows, bloom's stay as they were
        assert now[EndpointKey(llama, r)] > was[EndpointKey(llama, r)]
        assert now[EndpointKey(bloom, r)] == was[EndpointKey(bloom, r)]


def test_a_need_below_the_buffer_changes_nothing() -> None:
    models = _models()
    llama = models[0].metadata.name
    history = _history(models)
    received = {(llama, r): [500.0] * 6 for r in REGIONS}
    before = run_plan_cycle(models, _policy(), history, received, {})
    after = run_plan_cycle(models, _policy(), history, received, {}, batch_need={llama: 60.0})
    assert after.demand_tps == before.demand_tps
    assert after.targets == before.targets


def test_a_held_region_grows_only_when_its_share_of_the_need_exceeds_what_it_serves() -> None:
    """No observation of us-west: it keeps its 12 H100 instances (3,696 tokens/s) and its
    share of the need weighs by that; a need beyond it is what the plan asks for."""
    llama = _models()[0]
    name = llama.metadata.name
    history = {(name, r): [3696.0] * 72 for r in ("us-east", "us-central")}
    current = {(name, "us-west", "h100"): 12}
    small = run_plan_cycle([llama], _policy(), history, {}, current, batch_need={name: 3000.0})
    west = (name, "us-west")
    assert small.batch_need_tps[west] == pytest.approx(1000.0)  # a third: equal demands
    assert small.demand_tps[west] == 12 * 308
    assert small.endpoint_targets[EndpointKey(name, "us-west")] == 12
    large = run_plan_cycle([llama], _policy(), history, {}, current, batch_need={name: 15000.0})
    assert large.demand_tps[west] == pytest.approx(5000.0)
    assert large.endpoint_targets[EndpointKey(name, "us-west")] > 12
