"""A ModelPool in the planning cycle: its pods sized from its models' forecast request rates
(E[m], Aegaeon Theorem 3.1) and planned in the same ILP as the dedicated models."""

from __future__ import annotations

from typing import Any

from sageserve.api.model_pool import ModelPool
from sageserve.api.scaling_policy import ScalingPolicySpec
from sageserve.plan.cycle import run_plan_cycle
from tests.plan.test_cycle import _llama

A100 = "NVIDIA-A100-SXM4-80GB"


def pool(models: int = 20, lo: int = 1, hi: int = 8, region: str = "us-east") -> ModelPool:
    doc: dict[str, Any] = {
        "apiVersion": "sageserve.io/v1alpha1",
        "kind": "ModelPool",
        "metadata": {"name": "tail"},
        "spec": {
            "models": [{"name": f"m{i}", "model": f"acme/ft-{i}"} for i in range(models)],
            "variant": {"name": "a100", "gpuType": A100, "gpusPerInstance": 4},
            "regions": [{"name": region, "minInstances": lo, "maxInstances": hi}],
            "awakePerInstance": 2,
            "tiers": ["iw-f"],
            "sizing": {"meanOutputTokens": 600, "tbtSeconds": 0.1, "activeQuantile": None},
            "policyRef": {"name": "fleet"},
        },
    }
    return ModelPool.model_validate(doc)


def policy() -> ScalingPolicySpec:
    return ScalingPolicySpec.model_validate(
        {"forecast": {"granularitySeconds": 60, "method": "persistence"}}
    )


def rates(per_model: float, models: int = 20, steps: int = 30) -> dict[str, list[float]]:
    return {f"m{i}": [per_model] * steps for i in range(models)}


def test_a_pool_alone_is_sized_from_expected_active_models() -> None:
    # 20 models at one request a minute, each active 60 s: E[m] = 20(1 − e⁻¹) = 12.6 → 13
    # active → 7 pods of 2 awake models
    cycle = run_plan_cycle(
        [],
        policy(),
        {},
        {},
        {},
        {("us-east", A100): 64},
        pools=[pool()],
        pool_rates={("tail", "us-east"): rates(1 / 60)},
    )
    [t] = cycle.pools
    assert round(t.expected_active, 2) == 12.64
    assert (t.sized_active, t.wanted, t.target) == (13, 7, 7)
    assert cycle.result.target["pool:tail"]["us-east"][A100] == 7


def test_more_load_asks_for_more_pods_within_the_bounds() -> None:
    def target(per_model: float, hi: int = 8) -> int:
        cycle = run_plan_cycle(
            [],
            policy(),
            {},
            {},
            {},
            {("us-east", A100): 64},
            pools=[pool(hi=hi)],
            pool_rates={("tail", "us-east"): rates(per_model)},
        )
        return cycle.pools[0].target

    assert target(0.0) == 1  # minInstances
    assert target(1 / 200) == 3  # E[m] = 20(1 − e^−0.3) = 5.2 → 6 active
    assert target(1 / 60) == 7
    assert target(1.0, hi=8) == 8  # maxInstances


def test_pool_and_dedicated_models_share_the_gpus_of_one_plan() -> None:
    md = _llama()
    history = {("llama-2-70b", r.name): [3000.0] * 30 for r in md.spec.regions}
    gpu = md.spec.variants[0].gpu_type
    capacity = {(r.name, g): 10_000 for r in md.spec.regions for g in (gpu, A100)}
    alone = run_plan_cycle([md], policy(), history, {}, {}, capacity)
    both = run_plan_cycle(
        [md],
        policy(),
        history,
        {},
        {},
        capacity,
        pools=[pool()],
        pool_rates={("tail", "us-east"): rates(1 / 60)},
    )
    assert both.targets == alone.targets
    assert both.pools[0].target == 7
    # too few A100s for the pool: the plan grants what fits and says the rest is short
    short = {**capacity, ("us-east", A100): 12}
    squeezed = run_plan_cycle(
        [md],
        policy(),
        history,
        {},
        {},
        short,
        pools=[pool()],
        pool_rates={("tail", "us-east"): rates(1 / 60)},
    )
    assert squeezed.pools[0].wanted == 7 and squeezed.pools[0].target == 3
    assert squeezed.result.shortfall_tps.get("pool:tail", {}).get("us-east", 0) > 0


def test_no_observation_holds_the_pool_at_its_size() -> None:
    cycle = run_plan_cycle(
        [],
        policy(),
        {},
        {},
        {},
        {("us-east", A100): 64},
        pools=[pool()],
        pool_rates={},
        pool_current={("tail", "us-east"): 3},
    )
    assert cycle.pools[0].held and cycle.pools[0].target == 3


def test_a_short_drop_is_missing_data_and_a_lasting_one_shrinks_the_pool() -> None:
    def target(quiet_steps: int) -> int:
        history = {f"m{i}": [1 / 60] * 40 + [0.0] * quiet_steps for i in range(20)}
        cycle = run_plan_cycle(
            [],
            policy(),
            {},
            {},
            {},
            {("us-east", A100): 64},
            pools=[pool()],
            pool_rates={("tail", "us-east"): history},
            pool_current={("tail", "us-east"): 7},
        )
        return cycle.pools[0].target

    # quiet minutes read as a collection gap at first (forecast.gaps: a step down that has
    # not come back yet, for up to 20 minutes), not as demand gone: no scale-in on it
    assert target(5) > 1
    # quiet for an hour: the rate is real, the pool shrinks to its minimum
    assert target(60) == 1
