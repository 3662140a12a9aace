"""The API server restarts mid-run: the test cluster's kube-apiserver is
stopped in the middle of a scale-out and started again, as a kubelet restarts its static
pod; the operator runs in-process throughout.

What the platform team sees: the operator does not crash (kopf's watches and the pace loop
reconnect by themselves), the scale-out finishes, and it takes exactly as many actions as
the same scale-out without the restart: none lost, none doubled (each write tests the count
it read, and every pass decides afresh from what the API server says).
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from e2e_helpers import eventually, kubectl
from fault_kit import figure, steady
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

from e2e import kwok_cluster, state
from sageserve.metrics.exporter import OPERATOR_METRICS

pytestmark = pytest.mark.slow
REGION = "us-east"
DOWN_S = 5.0


def actions(namespace: str, direction: str) -> float:
    """Scalings the operator carried out (counted after each successful write)."""
    labels = {
        "namespace": namespace,
        "model": "llama8b",
        "region": REGION,
        "direction": direction,
        "strategy": "reactive",
    }
    value = OPERATOR_METRICS.registry.get_sample_value("sageserve_scaling_events_total", labels)
    return value or 0.0


def rounds(namespace: str) -> float:
    """Pace passes that ran to the end (a pass the API server failed is not counted)."""
    labels = {"namespace": namespace, "policy": "fleet", "kind": "pace"}
    value = OPERATOR_METRICS.registry.get_sample_value("sageserve_round_seconds_count", labels)
    return value or 0.0


@pytest.mark.usefixtures("restore_node_pools")
def test_a_restart_of_the_api_server_mid_scale_out_loses_and_doubles_no_action(
    e2e_cluster: state.ClusterState,
    kubeconfig: Path,
    namespace: str,
    prometheus_url: str,
    prometheus_targets_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    if e2e_cluster.provider != "kwok":
        pytest.fail("restarting the API server needs the kwok provider's processes")
    operator_env(monkeypatch, kubeconfig, namespace, prometheus_url, 0)
    fake = FakeVllm()
    fake.set(0.1)
    target = fake.scrape(prometheus_targets_dir, namespace, REGION, kubeconfig)

    def size() -> int | None:
        return replicas(kubeconfig, namespace, REGION)

    def api_ready() -> bool:
        return kubectl(kubeconfig, ["get", "--raw", "/readyz"], check=False).returncode == 0

    try:
        with KopfRunner(operator_args(namespace), timeout=600) as runner:
            apply(kubeconfig, namespace, scaling_policy("reactive"))
            apply(kubeconfig, namespace, model_deployment([REGION], gpus=2, lo=1, hi=4))
            eventually(lambda: size() == 1, 60, "the pod set at 1")

            # without a restart: saturated, 1 → 4 one instance at a time
            out = actions(namespace, "out")
            fake.set(0.9)
            eventually(lambda: size() == 4, 120, "scale-out to 4")
            steady(size, 6, "the pod set at its maximum")
            plain = actions(namespace, "out") - out
            fake.set(0.1)
            eventually(lambda: size() == 1, 120, "back to 1")

            # the same with the API server restarted after the first step
            out = actions(namespace, "out")
            fake.set(0.9)
            eventually(lambda: size() == 2, 60, "the first scale-out")
            down = kwok_cluster.restart_component(
                Path(e2e_cluster.workdir), "kube-apiserver", DOWN_S, api_ready
            )
            back, passes = time.monotonic(), rounds(namespace)
            eventually(lambda: rounds(namespace) > passes, 60, "a pace pass after the restart")
            reconnected = time.monotonic() - back
            eventually(lambda: size() == 4, 120, "the scale-out finished after the restart")
            recovered = time.monotonic() - back
            steady(size, 6, "the pod set at its maximum")
            restarted = actions(namespace, "out") - out
            assert restarted == plain == 3, (restarted, plain)
        assert runner.exception is None, runner.output
        figure(
            "API server restart",
            f"unavailable {down:.1f} s; {restarted:.0f} scale-outs as without it "
            f"({plain:.0f}); the first whole pace pass {reconnected:.1f} s after it was back, "
            f"at the target {recovered:.1f} s after (the controller-manager lost its Lease "
            "and was restarted)",
        )
    finally:
        target.unlink(missing_ok=True)
        fake.close()
