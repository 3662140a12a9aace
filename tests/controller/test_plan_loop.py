"""The plan loop's pure parts: GPU capacity from Nodes, plan status, restoring a plan."""

from __future__ import annotations

import math
from datetime import UTC, datetime
from pathlib import Path

import pytest
import yaml

from sageserve.api.model_deployment import ModelDeployment
from sageserve.api.scaling_policy import PlanStatus, ScalingPolicySpec
from sageserve.controller.plan_loop import (
    gpu_capacity,
    plan_status,
    recorded_plan,
    router_batch_queries,
    split_batch,
)
from sageserve.core.labels import NodeLabels
from sageserve.core.types import EndpointKey
from sageserve.plan.cycle import run_plan_cycle

ROOT = Path(__file__).resolve().parents[2]
H100 = "NVIDIA-H100-80GB-HBM3"


def _llama() -> ModelDeployment:
    docs = yaml.safe_load_all((ROOT / "policies" / "base" / "models.yaml").read_text())
    return ModelDeployment.model_validate(next(iter(docs)))


def test_gpu_capacity_counts_serving_and_spot_pools_per_region_and_type() -> None:
    nodes = list(
        yaml.safe_load_all((ROOT / "e2e" / "inventory" / "paper-3regions.yaml").read_text())
    )
    nodes.append({"metadata": {"labels": {"sageserve.io/pool": "other"}}, "status": {}})
    capacity = gpu_capacity([n for n in nodes if n], NodeLabels())
    assert capacity[("us-east", H100)] == (4 + 2) * 8
    assert len(capacity) == 6


def test_plan_status_is_a_valid_crd_status_and_restores_the_same_targets() -> None:
    md = _llama()
    spec = ScalingPolicySpec.model_validate(
        {
            "forecast": {
                "granularitySeconds": 600,
                "trainingWindowSeconds": 21600,
                "method": "persistence",
            }
        }
    )
    history = {
        ("llama-2-70b", r): [2000 + 500 * math.sin(i / 20) for i in range(300)]
        for r in ("us-east", "us-central", "us-west")
    }
    current = {("llama-2-70b", "us-east", "h100"): 20}
    cycle = run_plan_cycle([md], spec, history, {}, current)
    status = plan_status(
        cycle, [md], current, "lt-utilization-arima", datetime(2026, 11, 21, tzinfo=UTC)
    )
    PlanStatus.model_validate(status)  # what the API server's schema will accept
    east = next(t for t in status["targets"] if (t["region"], t["variant"]) == ("us-east", "h100"))
    assert east["current"] == 20 and east["delta"] == east["target"] - 20
    assert {f["method"] for f in status["forecasts"]} == {"persistence"}
    restored = recorded_plan({"status": {"plan": status}})
    assert restored is not None
    at, targets = restored.computed_at, restored.targets
    forecasts, per_instance = restored.forecasts, restored.instance_tps
    assert at == datetime(2026, 11, 21, tzinfo=UTC).timestamp()
    assert targets == cycle.endpoint_targets
    # per GPU type, as the ILP planned it: the step executes this split
    assert restored.variant_targets == cycle.in_force(at).variant_targets
    # the restored yardsticks of LT-UA are the ones the live cycle handed to the strategy
    east_key = EndpointKey("llama-2-70b", "us-east")
    assert forecasts[east_key] == round(cycle.forecast_tps[east_key], 3)
    assert per_instance == pytest.approx(cycle.instance_tps, abs=1e-3)
    assert set(per_instance) == set(targets)
    assert recorded_plan({"status": {}}) is None


def test_readings_that_are_not_demand_are_reported_in_the_plan_and_not_provisioned() -> None:
    """A broken exporter's +Inf and 1e30, a NaN and a negative rate in one region's history:
    that region's plan is the clean one's and its forecast says how many points it ignored."""
    md = _llama()
    spec = ScalingPolicySpec.model_validate(
        {"forecast": {"granularitySeconds": 600, "method": "persistence"}}
    )
    clean = [2000 + 500 * math.sin(i / 20) for i in range(300)]
    broken = list(clean)
    for i, value in zip((100, 150, 200, 299), (math.inf, 1e30, math.nan, -3.0), strict=True):
        broken[i] = value
    regions = ("us-east", "us-central", "us-west")
    plans = [
        run_plan_cycle([md], spec, {("llama-2-70b", r): h for r in regions}, {}, {})
        for h in (clean, broken)
    ]
    assert plans[1].targets == plans[0].targets
    status = plan_status(plans[1], [md], {}, "lt-utilization-arima", datetime.now(UTC))
    PlanStatus.model_validate(status)
    assert {f["ignoredPoints"] for f in status["forecasts"]} == {4}
    clean_status = plan_status(plans[0], [md], {}, "lt-utilization-arima", datetime.now(UTC))
    assert all("ignoredPoints" not in f for f in clean_status["forecasts"])


def test_batch_traffic_is_taken_out_of_the_forecast_series_and_feeds_beta() -> None:
    key, other = ("llama", "us-east"), ("llama", "us-west")
    total = {key: [1000.0] * 90 + [math.nan] + [1200.0] * 29, other: [50.0] * 120}
    batch = {key: [300.0] * 110 + [1500.0] * 10}
    interactive, last_hour = split_batch(total, batch, 60.0)
    assert interactive[key][:90] == [700.0] * 90
    assert math.isnan(interactive[key][90])  # a gap stays a gap
    assert interactive[key][-1] == 0.0  # batch above the total (scrape skew): no negative load
    assert interactive[other] == [50.0] * 120  # no batch series: all traffic is interactive
    assert len(last_hour[key]) == 60 and last_hour[key][-1] == 1500.0
    md = _llama()
    spec = ScalingPolicySpec.model_validate({"forecast": {"method": "persistence"}})
    hist = {("llama-2-70b", "us-east"): interactive[key]}
    cycle = run_plan_cycle([md], spec, hist, {("llama-2-70b", "us-east"): last_hour[key]}, {})
    assert cycle.batch_buffer_tps[("llama-2-70b", "us-east")] == 0.1 * (50 * 300 + 10 * 1500) / 60


def test_without_a_batch_query_the_batch_share_is_what_the_router_counted_for_batch_tiers() -> None:
    tiers = [
        {"metadata": {"name": "iw-f"}, "spec": {"type": "interactive"}},
        {"metadata": {"name": "niw"}, "spec": {"type": "batch"}},
        {"metadata": {"name": "bulk"}, "spec": {"type": "batch"}},
    ]
    found = router_batch_queries("1m", "llm", tiers)
    assert found is not None
    served, received = found
    for query in found:
        assert 'namespace="llm"' in query and 'tier=~"bulk|niw"' in query
    assert "sageserve_router_tokens_total" in served
    # β: what the Batch API accepted, else what the router served of batch tiers
    assert received.index("sageserve_batch_accepted_tokens_total") < received.index(
        "sageserve_router_tokens_total"
    )
    # a namespace without batch tiers: no batch series, all traffic is interactive
    assert router_batch_queries("1m", "llm", tiers[:1]) is None


def test_beta_comes_from_the_batch_load_received_not_what_the_troughs_let_through() -> None:
    md = _llama()
    spec = ScalingPolicySpec.model_validate({"forecast": {"method": "persistence"}})
    key = ("llama-2-70b", "us-east")
    hist = {key: [1000.0] * 120}
    served = {key: [100.0] * 60}  # the queue lets 100 tokens/s through
    received = {key: [900.0] * 60}  # while 900 tokens/s arrive
    cycle = run_plan_cycle([md], spec, hist, served, {}, batch_received=received)
    assert cycle.batch_buffer_tps[key] == pytest.approx(90.0)
    assert run_plan_cycle([md], spec, hist, served, {}).batch_buffer_tps[key] == 10.0
