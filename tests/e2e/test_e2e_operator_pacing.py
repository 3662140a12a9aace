"""The pace loop against the real control plane and a real Prometheus.

A stand-in vLLM metrics endpoint (prometheus-client, vLLM's metric names) is scraped by
the session's Prometheus through file_sd, with the labels the chart's scrape config adds.
The operator runs in-process; the test drives utilisation and checks what a user sees:
replicas of the pod set, Events, and the policy's Degraded condition.
"""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from e2e_helpers import eventually, kubectl
from kopf.testing import KopfRunner
from operator_kit import (
    FakeVllm,
    apply,
    free_port,
    model_deployment,
    operator_args,
    operator_env,
    policy_status,
    replicas,
    scaling_policy,
    steady_stand_in,
)

REGION = "us-central"


@pytest.fixture
def fake_vllm() -> Iterator[FakeVllm]:
    fake = FakeVllm()
    yield fake
    fake.close()


def condition(kubeconfig: Path, namespace: str, type_: str) -> dict | None:
    conditions = policy_status(kubeconfig, namespace).get("conditions", [])
    found = [c for c in conditions if c["type"] == type_]
    return found[0] if found else None


@pytest.mark.usefixtures("restore_node_pools")
def test_pace_loop_follows_utilisation_and_holds_without_data(
    kubeconfig: Path,
    namespace: str,
    prometheus_url: str,
    prometheus_targets_dir: Path,
    fake_vllm: FakeVllm,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    operator_env(monkeypatch, kubeconfig, namespace, prometheus_url)
    policy = scaling_policy("reactive")
    # 4 GPUs per instance: two instances fit the region's one 8-GPU A100 node.
    model = model_deployment([REGION])
    target_file = fake_vllm.scrape(prometheus_targets_dir, namespace, REGION, kubeconfig)
    try:
        args = operator_args(namespace)
        with KopfRunner(args, timeout=180) as runner:
            apply(kubeconfig, namespace, policy)
            apply(kubeconfig, namespace, model)
            assert eventually(
                lambda: replicas(kubeconfig, namespace, REGION) == 1,
                60,
                "the pod set at its minimum",
            )

            fake_vllm.set(0.9)  # above the 70 % scale-out threshold
            eventually(
                lambda: replicas(kubeconfig, namespace, REGION) == 2,
                90,
                "scale-out to maxInstances",
            )
            events = kubectl(kubeconfig, ["get", "events", "-n", namespace, "-o", "json"]).stdout
            assert "ScaledOut" in events

            # The series disappears: sizes are held, never scaled in, and the user is told.
            target_file.unlink()
            degraded = eventually(
                lambda: (
                    (c := condition(kubeconfig, namespace, "Degraded"))
                    and c["status"] == "True"
                    and c
                ),
                90,
                "Degraded=True on missing metrics",
            )
            assert degraded["reason"] == "MetricsMissing", degraded
            assert "llama8b/us-central" in degraded["message"]
            fake_vllm.set(0.1)  # low load that Prometheus cannot see: still no scale-in
            time.sleep(8)  # four pace passes
            assert replicas(kubeconfig, namespace, REGION) == 2

            # Data returns, low: scale in to the minimum, Degraded clears.
            fake_vllm.scrape(prometheus_targets_dir, namespace, REGION, kubeconfig)
            eventually(
                lambda: replicas(kubeconfig, namespace, REGION) == 1, 90, "scale-in to minInstances"
            )
            eventually(
                lambda: (
                    (c := condition(kubeconfig, namespace, "Degraded")) and c["status"] == "False"
                ),
                30,
                "Degraded=False once metrics are back",
            )
        assert runner.exception is None, runner.output

        # Prometheus unreachable: hold, say why.
        monkeypatch.setenv("SAGESERVE_PROMETHEUS_URL", "http://127.0.0.1:1")
        fake_vllm.set(0.95)
        with KopfRunner(args, timeout=60) as again:
            unreachable = eventually(
                lambda: (
                    (c := condition(kubeconfig, namespace, "Degraded"))
                    and c["reason"] == "PrometheusUnreachable"
                    and c
                ),
                60,
                "Degraded=PrometheusUnreachable",
            )
            assert unreachable["status"] == "True"
            assert replicas(kubeconfig, namespace, REGION) == 1
        assert again.exception is None, again.output
    finally:
        target_file.unlink(missing_ok=True)


@pytest.mark.usefixtures("restore_node_pools")
def test_plan_loop_forecasts_plans_and_lt_immediate_moves_to_the_target(
    kubeconfig: Path,
    namespace: str,
    prometheus_url: str,
    prometheus_targets_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    metrics_port = free_port()
    operator_env(monkeypatch, kubeconfig, namespace, prometheus_url, metrics_port)
    # 2,400 tokens/s for a variant of 900 tokens/s per instance: the plan needs 3 instances.
    policy = scaling_policy(
        "lt-immediate",
        forecast={"method": "persistence", "granularitySeconds": 30, "trainingWindowSeconds": 300},
    )
    model = model_deployment([REGION], hi=4)
    with steady_stand_in(prometheus_targets_dir, prometheus_url, namespace, REGION, kubeconfig):
        apply(kubeconfig, namespace, model)
        apply(kubeconfig, namespace, policy)
        args = operator_args(namespace)
        with KopfRunner(args, timeout=120) as runner:
            recorded = eventually(
                lambda: policy_status(kubeconfig, namespace).get("plan"),
                60,
                "a plan in the ScalingPolicy status",
            )
            [forecast] = recorded["forecasts"]
            assert forecast["method"] == "persistence"
            assert 2000 < forecast["tokensPerSecond"] < 2900
            [target] = recorded["targets"]
            assert (target["variant"], target["target"]) == ("a100", 3)
            assert recorded["solverStatus"] == "optimal"
            ready = condition(kubeconfig, namespace, "PlanReady")
            assert ready is not None and (ready["status"], ready["reason"]) == ("True", "Planned")
            eventually(
                lambda: replicas(kubeconfig, namespace, REGION) == 3,
                60,
                "LT-I at the planned 3 instances",
            )
            metrics = urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics").read()
            expected = (
                f'sageserve_target_instances{{model="llama8b",namespace="{namespace}",'
                f'region="{REGION}",variant="a100"}} 3.0'
            )
            assert expected in metrics.decode()
            assert b"sageserve_solver_seconds_count" in metrics
        assert runner.exception is None, runner.output
