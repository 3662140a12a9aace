"""One planning cycle from manifests and token-rate history, with the real forecaster and solver."""

from __future__ import annotations

import math
from datetime import UTC, datetime
from pathlib import Path

import pytest
import yaml

from sageserve.api.model_deployment import ModelDeployment
from sageserve.api.scaling_policy import ScalingPolicySpec, spill_from_status
from sageserve.controller.plan_loop import plan_status
from sageserve.core.types import EndpointKey
from sageserve.plan.cycle import history_at_policy_step, run_plan_cycle, training_points

ROOT = Path(__file__).resolve().parents[2]
REGIONS = ("us-east", "us-central", "us-west")


def _llama() -> ModelDeployment:
    docs = yaml.safe_load_all((ROOT / "policies" / "base" / "models.yaml").read_text())
    return ModelDeployment.model_validate(next(iter(docs)))


def _policy(**forecast: object) -> ScalingPolicySpec:
    return ScalingPolicySpec.model_validate(
        {
            "forecast": {
                "granularitySeconds": 600,
                "trainingWindowSeconds": 6 * 3600,
                "method": "persistence",
                **forecast,
            }
        }
    )


def _diurnal(days: int, base: float, amplitude: float) -> list[float]:
    steps = days * 144
    return [base + amplitude * math.sin(2 * math.pi * i / 144) for i in range(steps)]


def test_demand_is_the_forecast_plus_the_batch_buffer_and_the_plan_covers_it() -> None:
    md = _llama()
    history = {("llama-2-70b", r): _diurnal(2, 3000.0, 1000.0) for r in REGIONS}
    batch = {("llama-2-70b", "us-east"): [500.0] * 6}
    cycle = run_plan_cycle([md], _policy(), history, batch, current={})
    east = ("llama-2-70b", "us-east")
    assert cycle.forecasts[east].method == "persistence"
    assert cycle.batch_buffer_tps[east] == 50.0  # 10 % of the last hour's batch rate
    assert cycle.demand_tps[east] == cycle.forecasts[east].peak_tps + 50.0
    assert cycle.result.status == "optimal"
    for region in REGIONS:
        h100 = cycle.targets[("llama-2-70b", region, "h100")]
        a100 = cycle.targets[("llama-2-70b", region, "a100")]
        assert h100 * 308 + a100 * 180 >= cycle.demand_tps[("llama-2-70b", region)]
        assert cycle.endpoint_targets[EndpointKey("llama-2-70b", region)] == h100 + a100
    # LT-UA's yardstick is the expected load in the gap window with all of the batch load,
    # not the provisioned peak + β
    assert cycle.forecast_tps[EndpointKey("llama-2-70b", "us-east")] == (cycle.expected_tps[east])
    path = cycle.forecasts[east].path_tps  # 10-minute steps: the gap window is steps 5 and 6
    assert cycle.expected_tps[east] == pytest.approx((path[4] + path[5]) / 2 + 500.0)


@pytest.mark.slow
def test_lt_ua_yardstick_is_the_point_forecast_in_the_last_minutes_of_the_interval() -> None:
    md = _llama()
    rising = [1000.0 + 10.0 * i for i in range(6 * 60)]  # +10 tokens/s per minute
    history = {("llama-2-70b", r): rising for r in REGIONS}
    policy = _policy(granularitySeconds=60, method="arima-classic")
    cycle = run_plan_cycle([md], policy, history, {}, current={})
    east = ("llama-2-70b", "us-east")
    fc = cycle.forecasts[east]
    assert fc.method == "arima-classic" and len(fc.path_tps) == 60
    # the mean of minutes 41..60 of the path: below the hour's peak, above the next minute
    assert cycle.expected_tps[east] == pytest.approx(sum(fc.path_tps[40:60]) / 20)
    assert fc.path_tps[0] < cycle.expected_tps[east] < fc.peak_tps + 1e-9


def test_a_region_without_any_observation_keeps_its_current_size() -> None:
    md = _llama()
    history = {("llama-2-70b", r): _diurnal(2, 3000.0, 1000.0) for r in ("us-east", "us-central")}
    current = {("llama-2-70b", "us-west", "h100"): 12}
    cycle = run_plan_cycle([md], _policy(), history, {}, current)
    assert not cycle.forecasts[("llama-2-70b", "us-west")].reliable
    assert cycle.demand_tps[("llama-2-70b", "us-west")] == 12 * 308
    assert cycle.endpoint_targets[EndpointKey("llama-2-70b", "us-west")] == 12


def test_too_little_history_falls_back_to_the_named_baseline() -> None:
    md = _llama()
    history = {("llama-2-70b", r): [2000.0] * 3 for r in REGIONS}
    cycle = run_plan_cycle(
        [md], _policy(method="arima", fallback="moving-average"), history, {}, {}
    )
    forecast = cycle.forecasts[("llama-2-70b", "us-east")]
    assert forecast.requested == "arima"
    assert forecast.method != "arima"
    assert forecast.fallback_reason and "history" in forecast.fallback_reason


def test_tokens_per_instance_are_the_planned_variants_capacities_weighted_by_target() -> None:
    from sageserve.plan.cycle import instance_capacity

    md = _llama()  # H100 variant 308 tokens/s, A100 variant 180 tokens/s
    h100, a100 = (v.name for v in md.spec.variants)
    per = instance_capacity(
        [md], {("llama-2-70b", "us-east", h100): 3, ("llama-2-70b", "us-east", a100): 1}
    )
    assert per[EndpointKey("llama-2-70b", "us-east")] == pytest.approx((3 * 308 + 180) / 4)
    # no target: the first planned variant's θ, so LT-UA can still size from traffic
    assert per[EndpointKey("llama-2-70b", "us-west")] == 308


def test_regions_that_share_capacity_get_spill_over_weights_the_router_can_follow() -> None:
    md = _llama()
    history = {("llama-2-70b", r): [3000.0] * 288 for r in REGIONS}
    history[("llama-2-70b", "us-west")] = [6000.0] * 288
    gpus = [v.gpu_type for v in md.spec.variants]
    capacity = {(r, g): 200 for r in REGIONS for g in gpus}
    sharing = _policy().model_copy(
        update={"optimizer": _policy().optimizer.model_copy(update={"local_serve_fraction": 0.5})}
    )
    cycle = run_plan_cycle([md], sharing, history, {}, {}, capacity)
    assert cycle.result.status == "optimal"
    spill = cycle.spill["llama-2-70b"]
    theta = {v.name: v.capacity_tokens_per_second for v in md.spec.variants}
    served = {
        r: sum(n * theta[v] for (m, rr, v), n in cycle.targets.items() if rr == r) for r in REGIONS
    }
    for home, shares in spill.items():
        # each region keeps at least ε of its own demand, the rest goes where capacity is
        assert sum(shares.values()) <= 0.5 + 1e-9
        local = min(served[home], cycle.demand_tps[("llama-2-70b", home)])
        assert local + sum(shares.values()) * cycle.demand_tps[("llama-2-70b", home)] == (
            pytest.approx(cycle.demand_tps[("llama-2-70b", home)], rel=1e-3)
        )
    # the whole plan, the default ε = 1: every region serves itself, nothing to bound
    alone = run_plan_cycle([md], _policy(), history, {}, {}, capacity)
    assert alone.spill == {}
    # what the status publishes, the operator and the router read back
    status = plan_status(cycle, [md], {}, "lt-utilization-arima", datetime.now(UTC))
    read_back = spill_from_status(status)
    assert read_back["llama-2-70b"].keys() == spill.keys()
    for home, shares in spill.items():
        assert read_back["llama-2-70b"][home] == pytest.approx(shares, abs=1e-4)


def test_regions_peaking_at_different_times_share_capacity_when_epsilon_allows() -> None:
    """C2 over the forecast path: two regions in anti-phase need together the peak of their
    sum, less than the sum of their peaks (SageServe §5); ε = 1 keeps each at its own."""
    md = _llama()
    md = md.model_copy(update={"spec": md.spec.model_copy(update={"regions": md.spec.regions[:2]})})
    east, central = (r.name for r in md.spec.regions)
    day = 144  # 10-minute steps
    wave = [math.sin(2 * math.pi * i / day) for i in range(3 * day)]
    history = {
        ("llama-2-70b", east): [3000.0 + 2000.0 * w for w in wave],
        ("llama-2-70b", central): [3000.0 - 2000.0 * w for w in wave],
    }

    def planned(epsilon: float) -> tuple[float, dict[str, float]]:
        spec = _policy(method="arima", horizonSeconds=12 * 3600, trainingWindowSeconds=3 * 86400)
        spec = spec.model_copy(
            update={
                "optimizer": spec.optimizer.model_copy(update={"local_serve_fraction": epsilon})
            }
        )
        cycle = run_plan_cycle([md], spec, history, {}, {})
        assert cycle.result.status == "optimal"
        theta = {v.name: v.capacity_tokens_per_second for v in md.spec.variants}
        per_region = {
            r: sum(n * theta[v] for (_, rr, v), n in cycle.targets.items() if rr == r)
            for r in (east, central)
        }
        return sum(cycle.demand_tps.values()), per_region

    peaks, shared = planned(0.5)
    assert sum(shared.values()) < 0.8 * peaks  # the sum's peak, not the sum of peaks
    _, alone = planned(1.0)
    assert sum(alone.values()) >= 0.99 * peaks  # ε = 1: every region covers its own peak


def _grid(step_s: int, training_s: int) -> ScalingPolicySpec:
    return ScalingPolicySpec.model_validate(
        {"forecast": {"granularitySeconds": step_s, "trainingWindowSeconds": training_s}}
    )


@pytest.mark.parametrize(
    ("step_s", "training_s", "minutes", "expected"),
    [
        # the paper's grid: one step a minute, the last hour of what the world kept
        (60, 180, [float(m) for m in range(10)], [7.0, 8.0, 9.0]),
        # 5-minute steps: each the mean of its five minutes, counted back from now (the
        # oldest incomplete step dropped), the last two steps of a 10-minute window
        (300, 600, [float(m) for m in range(12)], [4.0, 9.0]),
        # a window longer than what was kept: all of it
        (60, 3600, [1.0, 2.0], [1.0, 2.0]),
        # 30-second steps: a minute's rate twice, as `rate` sampled twice a minute reads it
        (30, 120, [1.0, 2.0, 3.0], [2.0, 2.0, 3.0, 3.0]),
    ],
)
def test_a_per_minute_history_is_given_to_the_forecaster_on_the_policys_grid(
    step_s: int, training_s: int, minutes: list[float], expected: list[float]
) -> None:
    key = ("m", "r")
    got = history_at_policy_step(_grid(step_s, training_s), {key: minutes})
    assert got == {key: expected}
    assert training_points(_grid(step_s, training_s)) == training_s // step_s
