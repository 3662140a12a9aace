"""Sizing a pool of sporadic models (Aegaeon §3, §4.3) and planning it with dedicated models."""

from __future__ import annotations

import math
from typing import Any

import pytest

from sageserve.plan import PlanProblem, solve_plan
from sageserve.plan.pool_sizing import (
    ModelForecast,
    PoolShape,
    active_models_quantile,
    decode_quotas,
    expected_active_models,
    models_per_decode_instance,
    round_alpha,
    size_pool,
    size_switching_pool,
    split_hot_cold,
    theta_at_tbt,
    with_pool,
)


@pytest.mark.parametrize(
    ("rates", "service", "expected"),
    [
        ([0.0] * 10, 16.79, 0.0),  # nobody sends anything: nothing is active
        ([math.log(2)], 1.0, 0.5),  # λT = ln 2: busy half the time
        ([math.log(2), math.log(4)], [1.0, 1.0], 0.5 + 0.75),  # heterogeneous rates add up
        ([1e6] * 7, 1.0, 7.0),  # always busy: every model is active
    ],
)
def test_expected_active_models_table(rates: list[float], service: Any, expected: float) -> None:
    assert expected_active_models(rates, service) == pytest.approx(expected, abs=1e-9)


def test_expected_active_models_reproduces_the_papers_worked_value() -> None:
    # Aegaeon §3: λ = 0.037, T = 16.79 s, M = 100 → E[m] = 46.55 (the formula gives 46.27:
    # the paper's λ is rounded; within 1 %).
    em = expected_active_models([0.037] * 100, 16.79)
    assert em == pytest.approx(46.55, rel=0.01)
    assert em < 100 * 0.5  # fewer than half the models are active: pooling pays


def test_expected_active_models_refuses_negative_rates_naming_the_field() -> None:
    with pytest.raises(ValueError, match="rate_rps"):
        expected_active_models([0.1, -0.1], 10.0)
    with pytest.raises(ValueError, match="service_s: 1 values for 2 models"):
        expected_active_models([0.1, 0.1], [10.0])


@pytest.mark.parametrize(
    ("quantile", "expected"),
    [(0.25, 0), (0.5, 1), (0.75, 1), (0.8, 2), (1.0, 2)],
)
def test_active_models_quantile_of_two_half_busy_models(quantile: float, expected: int) -> None:
    # two models busy half the time each: P(0) = 1/4, P(1) = 1/2, P(2) = 1/4
    rates = [math.log(2), math.log(2)]
    assert active_models_quantile(rates, 1.0, quantile) == expected


def test_worked_quota_example_meets_every_deadline() -> None:
    # Aegaeon §4.3: 3 batches, d = 0.1 s, t = 0.025 s, c = 3 s, Q_MAX = 3 → α = 1, q = 3 s;
    # 120 tokens per turn, a 12 s round = 120 × 0.1 s.
    steps = [0.025] * 3
    assert round_alpha(steps, 0.1, 3.0, 3.0) == pytest.approx(1.0)
    quotas = decode_quotas(steps, 0.1, 3.0, 3.0)
    assert quotas == pytest.approx([3.0, 3.0, 3.0])
    tokens_per_turn = quotas[0] / 0.025
    round_s = sum(quotas) + 3.0
    assert tokens_per_turn == pytest.approx(120)
    assert round_s == pytest.approx(tokens_per_turn * 0.1)


@pytest.mark.parametrize(
    ("steps", "tbt", "c", "qmax", "alpha"),
    [
        ([0.025] * 3, 0.1, 3.0, 3.0, 1.0),
        ([0.025], 0.1, 0.0, 4.0, 0.5),  # one model, no switching: the 0.5 floor
        ([0.05, 0.025], 0.1, 1.0, 4.0, 1.0 / (2 * 4) + 0.5 + 0.25),  # min n is the slow batch's
        ([0.1, 0.1], 0.1, 0.0, 4.0, 2.0),  # each step takes a whole TBT: 50 % attainment
    ],
)
def test_round_alpha_table(
    steps: list[float], tbt: float, c: float, qmax: float, alpha: float
) -> None:
    assert round_alpha(steps, tbt, c, qmax) == pytest.approx(alpha)


def test_quotas_give_slower_batches_longer_turns_within_q_max() -> None:
    quotas = decode_quotas([0.01, 0.04], 0.1, 2.0, 4.0)
    assert quotas[1] > quotas[0]  # qᵢ ∝ 1/nᵢ = tᵢ/d: a slow batch needs longer for its tokens
    assert max(quotas) == pytest.approx(4.0)  # Eq. 3 makes the longest turn exactly Q_MAX
    # every batch's turn covers the same share of the round's deadlines: q·n = R/α
    alpha = round_alpha([0.01, 0.04], 0.1, 2.0, 4.0)
    round_s = sum(quotas) + 2.0
    for q, t in zip(quotas, [0.01, 0.04], strict=True):
        assert q * 0.1 / t == pytest.approx(round_s / alpha)


def test_quota_input_errors_name_the_field() -> None:
    with pytest.raises(ValueError, match=r"step_s\[1\]"):
        decode_quotas([0.02, 0.0], 0.1, 1.0)
    with pytest.raises(ValueError, match="step_s: needs at least one batch"):
        decode_quotas([], 0.1, 1.0)
    with pytest.raises(ValueError, match="tbt_s"):
        decode_quotas([0.02], -0.1, 1.0)


@pytest.mark.parametrize(
    ("step", "switch", "target", "expected"),
    [
        (0.025, 0.5, 0.9, 3),  # α(k) = k(0.5/16 + 1/4): 3 → 0.84, 4 → 1.125 > 1/0.9
        (0.025, 0.0, 0.9, 4),  # free switching: only the decoding time binds (k/4 ≤ 1.11)
        (0.01, 0.5, 0.9, 9),  # faster steps share more: k(0.5/40 + 0.1) ≤ 1.11
        (0.025, 4.0, 0.9, 2),  # slow switches: k(4/16 + 1/4) ≤ 1.11
    ],
)
def test_models_per_decode_instance_table(
    step: float, switch: float, target: float, expected: int
) -> None:
    assert models_per_decode_instance(step, 0.1, switch, target) == expected


def test_models_per_decode_instance_refuses_a_step_slower_than_the_tbt() -> None:
    with pytest.raises(ValueError, match="step_s"):
        models_per_decode_instance(0.2, 0.1, 0.5)


def test_models_per_decode_instance_is_capped_by_kv() -> None:
    assert models_per_decode_instance(0.01, 0.1, 0.5, kv_limit=3) == 3


SHAPE = PoolShape(
    region="east",
    gpu_type="h100",
    gpus_per_instance=4,
    theta_tps=2000.0,
    decode_step_s=0.025,
    prefill_s=0.2,
    switch_s=0.5,
)


def test_hot_models_stay_dedicated_and_the_long_tail_is_pooled() -> None:
    models = [ModelForecast("hot", 5.0, 500, 300)] + [
        ModelForecast(f"cold-{i}", 0.037, 500, 168) for i in range(100)
    ]
    hot, cold = split_hot_cold(models, SHAPE.theta_tps, 0.5)
    assert hot == {"hot": 2}  # 4,000 tokens/s over θ 2,000
    assert len(cold) == 100
    plan = size_pool(models, SHAPE)
    # 100 cold models at λ = 0.037, T = 168 × 0.1 s: E[m] ≈ 46, 3 per decode instance
    assert plan.expected_active == pytest.approx(expected_active_models([0.037] * 100, 16.8))
    assert plan.models_per_decode_instance == 3
    assert plan.decode_instances == math.ceil(plan.sized_active / 3)
    assert plan.prefill_instances == math.ceil(100 * 0.037 * 0.7 / 0.8)
    assert plan.gpu_demand() == {("east", "h100"): plan.pool_instances * 4}
    # far fewer instances than one per model
    assert plan.pool_instances < 100 / 4


def test_sizing_for_busier_moments_needs_more_decode_instances() -> None:
    models = [ModelForecast(f"m{i}", 0.05, 500, 200) for i in range(60)]
    mean = size_pool(models, SHAPE)
    p99 = size_pool(models, SHAPE, active_quantile=0.99)
    assert p99.sized_active > mean.sized_active
    assert p99.decode_instances >= mean.decode_instances


def test_size_pool_refuses_duplicate_model_names() -> None:
    with pytest.raises(ValueError, match="models: duplicate"):
        size_pool([ModelForecast("a", 0.1, 1, 1), ModelForecast("a", 0.1, 1, 1)], SHAPE)


def _problem(**over: Any) -> PlanProblem:
    data: dict[str, Any] = {
        "models": ["llama"],
        "regions": ["east", "west"],
        "gpu_types": ["h100"],
        "demand_tps": {"llama": {"east": [3000.0, 5000.0], "west": [1000.0, 1000.0]}},
        "capacity_tps": {"llama": {"h100": 1000.0}},
        "gpus_per_instance": {"llama": {"h100": 4}},
        "gpu_hour_cost": {"h100": 1.0},
        "epsilon": 1.0,
        "gpu_capacity": {"east": {"h100": 40}, "west": {"h100": 40}},
    }
    data.update(over)
    return PlanProblem.model_validate(data)


def test_one_plan_covers_dedicated_and_pooled_capacity() -> None:
    problem = with_pool(_problem(), "tail", {("east", "h100"): 4}, gpus_per_instance=4)
    plan = solve_plan(problem)
    assert plan.status == "optimal"
    assert plan.target["pool:tail"]["east"]["h100"] == 4
    assert plan.target["pool:tail"].get("west", {}).get("h100", 0) == 0
    assert plan.target["llama"]["east"]["h100"] == 5  # its own peak, beside the pool
    east_gpus = 4 * (
        plan.target["llama"]["east"]["h100"] + plan.target["pool:tail"]["east"]["h100"]
    )
    assert east_gpus <= 40


def test_a_pool_competes_for_the_same_gpus_as_dedicated_models() -> None:
    # east has 32 GPUs: the dedicated model's 5 instances (20 GPUs) and a 4-instance pool
    # (16 GPUs) do not both fit, so the plan reports a shortfall instead of overbooking
    problem = with_pool(
        _problem(gpu_capacity={"east": {"h100": 32}, "west": {"h100": 40}}),
        "tail",
        {("east", "h100"): 4},
        gpus_per_instance=4,
    )
    plan = solve_plan(problem)
    assert plan.status == "shortfall"
    east = plan.target["llama"]["east"]["h100"] + plan.target["pool:tail"]["east"]["h100"]
    assert 4 * east <= 32


def test_with_pool_refuses_unknown_regions_and_mixed_gpu_types() -> None:
    with pytest.raises(ValueError, match="region north"):
        with_pool(_problem(), "tail", {("north", "h100"): 1}, 4)
    with pytest.raises(ValueError, match="one GPU type per pool"):
        with_pool(
            _problem(gpu_types=["h100", "a100"], gpu_hour_cost={"h100": 1.0, "a100": 1.0}),
            "tail",
            {("east", "h100"): 1, ("west", "a100"): 1},
            4,
        )


def test_dedicated_models_are_sized_for_their_busiest_window() -> None:
    bursty = ModelForecast("hot", 5.0, 500, 300, peak_tokens_per_s=9000.0)
    hot, _ = split_hot_cold([bursty], theta_tps=2000.0, threshold=0.5)
    assert hot == {"hot": 5}  # 9,000 tokens/s at peak over θ 2,000, not the mean's 2


def test_theta_at_tbt_keeps_the_decoding_step_within_the_tbt() -> None:
    # step = 10 ms + 1 µs per context token: within 80 ms up to 70,000 tokens; requests of
    # 500 + 100/2 context → 127 at once, each 100 steps of 80 ms
    theta = theta_at_tbt(lambda k: 0.01 + 1e-6 * k, 1_000_000, 0.1, 500, 100)
    assert theta == pytest.approx(70_000 / 550 / (100 * 0.08) * 600, rel=1e-3)
    # a looser TBT lets the same instance serve more
    assert theta_at_tbt(lambda k: 0.01 + 1e-6 * k, 1_000_000, 0.2, 500, 100) > theta
    # the KV cache caps it when the step never reaches the TBT
    small = theta_at_tbt(lambda k: 0.01 + 1e-6 * k, 10_000, 0.1, 500, 100)
    assert small == pytest.approx(10_000 / 550 / (100 * 0.02) * 600, rel=1e-3)
    with pytest.raises(ValueError, match="tbt_s"):
        theta_at_tbt(lambda k: 0.5, 1000, 0.1, 500, 100)


@pytest.mark.parametrize(
    ("rates", "service", "quota", "quantile", "expected_active", "sized", "instances"),
    [
        pytest.param([0.0] * 20, 60.0, 2, None, 0.0, 0, 0, id="no-load-no-pod"),
        pytest.param([0.037] * 100, 16.79, 4, None, 46.27, 47, 12, id="paper-rates-mean"),
        pytest.param([1.0 / 60] * 20, 60.0, 2, None, 12.64, 13, 7, id="one-per-minute-mean"),
        pytest.param([1.0] + [0.0] * 9, 10.0, 3, 0.99, 1.0, 1, 1, id="one-hot-model"),
    ],
)
def test_size_switching_pool(
    rates: list[float],
    service: float,
    quota: int,
    quantile: float | None,
    expected_active: float,
    sized: int,
    instances: int,
) -> None:
    got = size_switching_pool(rates, service, quota, quantile)
    assert got.expected_active == pytest.approx(expected_active, abs=0.01)
    assert (got.sized_active, got.instances) == (sized, instances)


def test_size_switching_pool_sizes_a_quantile_above_the_mean() -> None:
    rates = [1.0 / 60] * 20
    mean = size_switching_pool(rates, 60.0, 2)
    high = size_switching_pool(rates, 60.0, 2, 0.99)
    assert high.sized_active > mean.sized_active and high.instances >= mean.instances
    with pytest.raises(ValueError, match="awake_per_instance"):
        size_switching_pool(rates, 60.0, 0)
