"""No GPU anywhere: a scale-out with the inventory exhausted (the
region's one serving node full, its spot node taken out of the pools), on the real
scheduler.

What the platform team sees: the new instance stays Pending and is counted as capacity on
its way, so the saturated endpoint asks for one instance, not one per pace pass up to
maxInstances; the pace loop keeps its cadence (no pass waits on the Pending pod); a
`CapacityShortfall` condition and a Warning Event name the (model, region), how many
instances of how many GPUs and the scheduler's reason; once a node is back the pod is
placed (the spot node reclaimed) and the report clears.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from e2e_helpers import eventually, kubectl
from fault_kit import events, figure, pods, steady, wait_condition
from kopf.testing import KopfRunner
from operator_kit import (
    FakeVllm,
    apply,
    model_deployment,
    operator_args,
    operator_env,
    replicas,
    scaling_policy,
)

from sageserve.metrics.exporter import OPERATOR_METRICS
from sageserve.metrics.prometheus import PrometheusReader

pytestmark = pytest.mark.slow
REGION = "us-central"
SPOT_NODE = f"gpu-{REGION}-a100-spot-0"
SELECTOR = "sageserve.io/model-deployment=llama8b"
BOUND = 5


def pool(kubeconfig: Path, node: str, value: str) -> None:
    kubectl(kubeconfig, ["label", "node", node, f"sageserve.io/pool={value}", "--overwrite"])


@pytest.mark.usefixtures("restore_node_pools")
def test_a_scale_out_nothing_can_place_is_reported_once_without_a_cascade_or_a_stall(
    kubeconfig: Path,
    namespace: str,
    prometheus_url: str,
    prometheus_targets_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    operator_env(monkeypatch, kubeconfig, namespace, prometheus_url, 0)
    monkeypatch.setenv("SAGESERVE_REPORT_AFTER_SECONDS", str(BOUND))
    pool(kubeconfig, SPOT_NODE, "reserved")  # another team's: neither serving nor spot
    fake = FakeVllm()
    fake.set(0.5)
    target = fake.scrape(prometheus_targets_dir, namespace, REGION, kubeconfig)
    # 8 GPUs per instance: the region's one 8-GPU serving node holds one
    model = model_deployment([REGION], gpus=8, theta=1800, lo=1, hi=4)

    def size() -> int | None:
        return replicas(kubeconfig, namespace, REGION)

    def rounds() -> float:
        labels = {"namespace": namespace, "policy": "fleet", "kind": "pace"}
        return (
            OPERATOR_METRICS.registry.get_sample_value("sageserve_round_seconds_count", labels) or 0
        )

    try:
        with KopfRunner(operator_args(namespace), timeout=600) as runner:
            apply(kubeconfig, namespace, scaling_policy("reactive"), model)
            eventually(
                lambda: (
                    [p["status"].get("phase") for p in pods(kubeconfig, namespace, SELECTOR)]
                    == ["Running"]
                ),
                90,
                "one instance running",
            )
            fake.set(0.9)  # saturated, and stays so: the Pending instance never serves
            started = time.monotonic()
            eventually(lambda: size() == 2, 60, "one scale-out")
            shortfall = wait_condition(
                kubeconfig, namespace, "CapacityShortfall", "True", BOUND + 30, "Unschedulable"
            )
            detect = time.monotonic() - started
            message = shortfall["message"]
            assert message.startswith(f"llama8b/{REGION}: 1 instance(s) of 8 GPU(s) Pending"), (
                message
            )
            assert "nodes are available" in message  # the scheduler's own reason
            [warning] = events(kubeconfig, namespace, "CapacityShortfall")
            assert (
                warning["type"] == "Warning"
                and warning["involvedObject"]["kind"] == "ModelDeployment"
            )

            # no cascade: the Pending instance counts as coming, for 10 pace passes
            before = rounds()
            steady(size, 20, "the pod set while nothing can place its new instance")
            assert len(events(kubeconfig, namespace, "ScaledOut")) == 1
            passes = rounds() - before
            assert passes >= 7, passes  # every 2 s, none stuck behind the Pending pod
            figure(
                "no GPU",
                f"shortfall reported {detect:.1f} s after the scale-out (bound {BOUND} s); "
                f"1 scale-out, {passes:.0f} pace passes in 20 s, no cascade",
            )

            # capacity comes back: the spot node is reclaimed, the instance placed
            fake.set(0.5)
            # the lower load read by the operator's own query first: at the last scrape's 0.9
            # the placed instance would be followed at once by a second, correct, scale-out
            reader = PrometheusReader(prometheus_url, timeout_s=10)

            def lower() -> bool:
                loads = reader.pod_loads(namespace)
                return bool(loads) and all(p.kv_usage < 0.7 for p in loads.values())

            eventually(
                lower,
                30,
                "Prometheus reading the lower load",
            )
            started = time.monotonic()
            pool(kubeconfig, SPOT_NODE, "spot")
            wait_condition(kubeconfig, namespace, "CapacityShortfall", "False", 90, "AllPlaced")
            assert events(kubeconfig, namespace, "Reclaimed")
            running = [p["status"].get("phase") for p in pods(kubeconfig, namespace, SELECTOR)]
            assert running == ["Running", "Running"], running
            figure(
                "no GPU",
                f"placed and cleared {time.monotonic() - started:.1f} s after a node came back",
            )
        assert runner.exception is None, runner.output
    finally:
        target.unlink(missing_ok=True)
        fake.close()
