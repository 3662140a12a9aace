"""The plan loop with `spec.capacity.learn`: θ learned from the pod sets' minutes in
Prometheus sizes the plan once trusted, and each ModelDeployment's status shows declared
and learned θ with the evidence."""

from __future__ import annotations

import logging
import math
from typing import Any

from sageserve.api.model_deployment import ModelDeploymentStatus
from sageserve.controller.plan_loop import PlanPass
from sageserve.core.labels import NodeLabels
from sageserve.core.types import EndpointKey
from sageserve.metrics import queries
from sageserve.metrics.prometheus import MetricsUnavailable
from sageserve.plan.cycle import PlanCycle
from sageserve.plan.learned_capacity import recorded_theta
from tests.controller.plan_fakes import NS, FakeKube, FakeReader, policy_body

LOG = logging.getLogger("plan-loop-capacity-test")
LLAMA = "llama-2-70b"
LEVEL = {"us-east": 1500.0, "us-central": 1000.0, "us-west": 500.0}
TOTAL = {(LLAMA, r): [v] * 36 for r, v in LEVEL.items()}
#: declared θ of llama-2-70b/h100 in policies/base
DECLARED_H100 = 308.0


class CapacityReader(FakeReader):
    """Prometheus also holding, for llama-2-70b/h100 in us-east, `minutes` one-minute
    windows in which 2 pods served `per_pod` tokens/s each at 60 % KV use with IW-F's
    TTFT P95 at `p95` seconds (SLO 1 s)."""

    def __init__(self, minutes: int, per_pod: float, p95: float = 0.4, fails: bool = False) -> None:
        super().__init__(TOTAL)
        self.minutes, self.per_pod, self.p95, self.fails = minutes, per_pod, p95, fails
        self.asked = 0

    def series(
        self, expr: str, end: float, seconds: float, step: float
    ) -> list[tuple[dict[str, str], list[float]]]:
        self.asked += 1
        if self.fails:
            raise MetricsUnavailable("Prometheus at fake did not answer: 503")
        n = int(seconds // step)
        recent = [math.nan] * (n - self.minutes)
        base = {"namespace": NS, "model_deployment": LLAMA, "region": "us-east"}
        values = {
            queries.variant_tokens_per_second("60s", NS): 2 * self.per_pod,
            queries.variant_instances("60s", NS): 2.0,
            queries.variant_emu("60s", NS): 0.6,
            queries.router_ttft_p95(NS, "60s"): self.p95,
            queries.router_ttft_count(NS, "60s"): 50.0,
        }
        value = values[expr]
        labels = {**base, "tier": "iw-f"} if "router_ttft" in expr else {**base, "variant": "h100"}
        return [(labels, recent + [value] * self.minutes)]


def learning_policy(**capacity: Any) -> dict[str, Any]:
    body = policy_body()
    body["spec"]["capacity"] = {"learn": True, "minWindows": 30, **capacity}
    return body


def run(kube: FakeKube, reader: FakeReader, body: dict[str, Any]) -> PlanCycle:
    cycle = PlanPass(kube, body, [], LOG).run(reader, NodeLabels())  # type: ignore[arg-type]
    assert cycle is not None
    return cycle


def capacity_status(kube: FakeKube) -> ModelDeploymentStatus:
    patch = next(p for p in reversed(kube.patches) if "capacity" in p)
    return ModelDeploymentStatus.model_validate(patch)


def test_a_trusted_learned_theta_sizes_the_plan_and_is_shown_in_status() -> None:
    declared = run(FakeKube(), FakeReader(TOTAL), policy_body())
    kube = FakeKube()
    learned = run(kube, CapacityReader(minutes=40, per_pod=1.4 * DECLARED_H100), learning_policy())
    east = EndpointKey(LLAMA, "us-east")
    # the plan's instance θ is the learned one, so fewer instances serve the same forecast
    assert learned.instance_tps[east] > declared.instance_tps[east]
    assert sum(learned.endpoint_targets.values()) < sum(declared.endpoint_targets.values())
    status = capacity_status(kube)
    row = next(c for c in status.capacity if (c.variant, c.region) == ("h100", "us-east"))
    assert row.trusted and row.qualifying_windows == 40
    assert row.declared_tokens_per_second == DECLARED_H100
    assert row.in_force_tokens_per_second == round(1.4 * DECLARED_H100, 3)
    # pod sets with no window yet show the declared θ, untrusted
    other = next(c for c in status.capacity if (c.variant, c.region) == ("a100", "us-west"))
    assert not other.trusted and other.learned_tokens_per_second is None


def test_too_few_windows_or_missed_slos_keep_the_declared_theta() -> None:
    declared = run(FakeKube(), FakeReader(TOTAL), policy_body())
    for reader in (
        CapacityReader(minutes=10, per_pod=1.4 * DECLARED_H100),
        CapacityReader(minutes=40, per_pod=1.4 * DECLARED_H100, p95=1.5),
    ):
        kube = FakeKube()
        got = run(kube, reader, learning_policy())
        assert got.endpoint_targets == declared.endpoint_targets
        row = next(c for c in capacity_status(kube).capacity if c.region == "us-east")
        assert not row.trusted


def test_an_unanswered_capacity_query_plans_with_the_declared_theta() -> None:
    declared = run(FakeKube(), FakeReader(TOTAL), policy_body())
    kube = FakeKube()
    got = run(kube, CapacityReader(40, 1.4 * DECLARED_H100, fails=True), learning_policy())
    assert got.endpoint_targets == declared.endpoint_targets
    assert not any("capacity" in p for p in kube.patches)


def test_learning_off_reads_nothing_more() -> None:
    reader = CapacityReader(minutes=40, per_pod=1.4 * DECLARED_H100)
    kube = FakeKube()
    run(kube, reader, policy_body())
    assert reader.asked == 0
    assert not any("capacity" in p for p in kube.patches)


def test_learning_turned_off_clears_the_theta_status_the_deadlines_read() -> None:
    kube = FakeKube()
    run(kube, CapacityReader(minutes=40, per_pod=1.4 * DECLARED_H100), learning_policy())
    recorded = capacity_status(kube).model_dump(by_alias=True, mode="json")["capacity"]
    for md in kube.mds:  # what the API server holds after that plan
        md["status"] = {**md["status"], "capacity": recorded}
    learning = next(md for md in kube.mds if md["metadata"]["name"] == LLAMA)
    assert recorded_theta(LLAMA, learning)  # the pace loop judges deadlines with it
    kube.patches.clear()
    run(kube, CapacityReader(minutes=40, per_pod=1.4 * DECLARED_H100), policy_body())
    cleared = [p for p in kube.patches if "capacity" in p]
    assert cleared and all(p == {"capacity": None} for p in cleared)
