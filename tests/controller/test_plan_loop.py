"""The plan loop: GPU capacity from Nodes, plan status, restoring a plan, and one pass
against the API server and Prometheus in process (`plan_fakes`)."""

from __future__ import annotations

import logging
import math
from datetime import UTC, datetime
from pathlib import Path

import pytest
import yaml

from sageserve.api.model_deployment import ModelDeployment
from sageserve.api.scaling_policy import PlanStatus, ScalingPolicySpec
from sageserve.controller.plan_loop import (
    deadline_needs,
    gpu_capacity,
    plan_status,
    recorded_plan,
    router_batch_queries,
    split_batch,
)
from sageserve.core.labels import NodeLabels
from sageserve.core.types import EndpointKey
from sageserve.plan.cycle import run_plan_cycle
from tests.controller.plan_fakes import FakeKube, FakeReader, plan_pass

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


# ---- the batch deadline need -----------------------------------------------------------------

LLAMA = "llama-2-70b"
LOG = logging.getLogger("plan-loop-test")
#: interactive tokens/s per region (3 : 2 : 1) and the batch received (β = 50 tokens/s); a
#: region of the inventory serves 2,928 tokens/s at most (six 8-GPU instances of each type)
LEVEL = {"us-east": 1500.0, "us-central": 1000.0, "us-west": 500.0}
TOTAL = {(LLAMA, r): [v] * 36 for r, v in LEVEL.items()}
RECEIVED = {(LLAMA, r): [500.0] * 6 for r in LEVEL}


def test_deadline_needs_are_per_model_and_a_reading_that_is_not_a_rate_is_no_need(
    caplog: pytest.LogCaptureFixture,
) -> None:
    samples = {
        ("llm", "a", ""): 120.0,
        ("llm", "b", ""): math.nan,
        ("llm", "c", ""): -4.0,
        ("llm", "d", ""): math.inf,
        ("other", "a", ""): 999.0,  # another namespace's queue
        ("llm", "e", ""): 0.0,
    }
    with caplog.at_level(logging.WARNING):
        assert deadline_needs(samples, "llm", LOG) == {
            "a": 120.0,
            "b": 0.0,
            "c": 0.0,
            "d": 0.0,
            "e": 0.0,
        }
    warned = " ".join(r.getMessage() for r in caplog.records)
    assert all(f"llm/{m}" in warned for m in "bcd") and "llm/a" not in warned


def test_the_plan_loop_provisions_the_deadline_need_the_routers_export() -> None:
    quiet = plan_pass(FakeKube(), FakeReader(TOTAL, received=RECEIVED), LOG)
    kube = FakeKube()
    reader = FakeReader(TOTAL, received=RECEIVED, need={LLAMA: 1800.0, "gone": 50.0})
    starving = plan_pass(kube, reader, LOG)
    assert quiet is not None and starving is not None
    status = PlanStatus.model_validate(kube.plan())
    forecasts = {f.region: f for f in status.forecasts}
    # split by the regions' interactive forecast; the plan's batch part is the need, not β
    for region, share in {"us-east": 900.0, "us-central": 600.0, "us-west": 300.0}.items():
        f = forecasts[region]
        assert f.batch_deadline_need_tokens_per_second == pytest.approx(share)
        assert f.batch_buffer_tokens_per_second == pytest.approx(50.0)
        assert f.tokens_per_second == pytest.approx(LEVEL[region] + share)
        key = EndpointKey(LLAMA, region)
        assert starving.endpoint_targets[key] > quiet.endpoint_targets[key]
    assert kube.events[-1][0] == "Planned"


def test_without_a_need_series_the_plan_is_the_papers() -> None:
    kube = FakeKube()
    cycle = plan_pass(kube, FakeReader(TOTAL, received=RECEIVED), LOG)
    assert cycle is not None
    plan = kube.plan()
    assert {f["batchDeadlineNeedTokensPerSecond"] for f in plan["forecasts"]} == {0.0}
    assert {f["tokensPerSecond"] - LEVEL[f["region"]] for f in plan["forecasts"]} == {50.0}
    zero = plan_pass(FakeKube(), FakeReader(TOTAL, received=RECEIVED, need={LLAMA: 0.0}), LOG)
    assert zero is not None and zero.targets == cycle.targets


@pytest.mark.parametrize("need", [math.nan, -10.0, math.inf])
def test_a_need_that_is_not_a_rate_plans_as_none_and_is_logged(
    need: float, caplog: pytest.LogCaptureFixture
) -> None:
    paper = plan_pass(FakeKube(), FakeReader(TOTAL, received=RECEIVED), LOG)
    with caplog.at_level(logging.WARNING):
        cycle = plan_pass(FakeKube(), FakeReader(TOTAL, received=RECEIVED, need={LLAMA: need}), LOG)
    assert paper is not None and cycle is not None
    assert cycle.targets == paper.targets
    assert set(cycle.batch_need_tps.values()) == {0.0}
    assert any(f"llm/{LLAMA}" in r.getMessage() for r in caplog.records)


def test_an_unanswered_need_query_still_plans_with_beta_and_says_so(
    caplog: pytest.LogCaptureFixture,
) -> None:
    paper = plan_pass(FakeKube(), FakeReader(TOTAL, received=RECEIVED), LOG)
    kube = FakeKube()
    with caplog.at_level(logging.WARNING):
        cycle = plan_pass(kube, FakeReader(TOTAL, received=RECEIVED, need_fails=True), LOG)
    assert paper is not None and cycle is not None
    assert cycle.targets == paper.targets
    assert kube.events[-1][0] == "Planned"
    assert any("β alone" in r.getMessage() for r in caplog.records)


def test_every_plan_written_carries_the_condition_that_describes_it() -> None:
    """A reader (`kubectl get -o yaml`, a GitOps diff, a test) never sees a plan without
    its PlanReady condition: both go out in one status write, the first plan and the next."""
    kube = FakeKube()
    reader = FakeReader(TOTAL, received=RECEIVED)
    for _ in range(2):
        assert plan_pass(kube, reader, LOG) is not None
    with_plan = [p for p in kube.patches if "plan" in p]
    assert len(with_plan) == 2
    for patch in with_plan:
        ready = {c["type"]: c for c in patch["conditions"]}["PlanReady"]
        assert (ready["status"], ready["reason"]) == ("True", "Planned")
    assert [reason for reason, _ in kube.events] == ["Planned", "Planned"]


def test_a_model_that_cannot_be_acted_on_is_not_planned_and_breaks_no_other_plan() -> None:
    """One team's ModelDeployment whose floors no region can hold (`Ready=False`, as the
    reconcile reports it) is left out of the plan; before, its floors made the whole
    policy's plan infeasible, so every other model lost its plan."""
    alone = plan_pass(FakeKube(), FakeReader(TOTAL), LOG)
    kube = FakeKube(count=2)
    other = kube.mds[1]
    for region in other["spec"]["regions"]:
        region["minInstances"] = region["maxInstances"] = 500
    other["status"] = {
        "conditions": [
            {
                "type": "Ready",
                "status": "False",
                "reason": "MinInstancesUnreachable",
                "lastTransitionTime": "2026-12-01T00:00:00Z",
            }
        ]
    }
    planned = plan_pass(kube, FakeReader(TOTAL), LOG)
    assert alone is not None and planned is not None
    assert planned.endpoint_targets == alone.endpoint_targets
    assert {k.model for k in planned.endpoint_targets} == {LLAMA}
    assert kube.events[-1][0] == "Planned"


def test_a_model_not_yet_reconciled_is_planned() -> None:
    """Right after the operator starts, its first plan may come before kopf has reconciled
    a ModelDeployment (no `Ready` condition yet); it is planned, or it would wait for the
    next plan, an hour off."""
    reconciled = plan_pass(FakeKube(), FakeReader(TOTAL), LOG)
    kube = FakeKube()
    for md in kube.mds:
        md.pop("status")
    fresh = plan_pass(kube, FakeReader(TOTAL), LOG)
    assert reconciled is not None and fresh is not None
    assert fresh.endpoint_targets == reconciled.endpoint_targets
