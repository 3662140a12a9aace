"""Scale-down stuck: a pod that never finishes terminating, on the real
API server with KWOK's kubelet stand-in (it deletes a pod at once unless a finalizer holds
it, as an unresponsive kubelet or a storage finalizer would in a real cluster).

What the platform team sees: one scale-in, then none more on that endpoint while its
drained pod is stuck (its GPUs are not free; a second scale-in would strand a second
instance's the same way), a `TerminationStuck` condition and a Warning Event naming the
pod and its finalizer once the bound has passed, and pacing resumed as soon as the pod is
gone. The load is low throughout: the operator wants the minimum all along.
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

pytestmark = pytest.mark.slow
REGION = "us-west"
FINALIZER = "example.com/backup-volume"
SELECTOR = "sageserve.io/model-deployment=llama8b"
#: The operator reports a stuck pod this long after its deadline (SAGESERVE_REPORT_AFTER_SECONDS).
BOUND = 10


def release(kubeconfig: Path, namespace: str) -> None:
    """Remove the finalizer from every pod (also what lets the namespace be deleted)."""
    for pod in pods(kubeconfig, namespace, SELECTOR):
        if FINALIZER in (pod["metadata"].get("finalizers") or []):
            kubectl(
                kubeconfig,
                [
                    "patch",
                    "pod",
                    pod["metadata"]["name"],
                    "-n",
                    namespace,
                    "--type=json",
                    "-p",
                    '[{"op": "remove", "path": "/metadata/finalizers"}]',
                ],
                check=False,
            )


@pytest.mark.usefixtures("restore_node_pools")
def test_a_pod_stuck_terminating_stops_further_scale_in_and_is_reported_after_a_bound(
    kubeconfig: Path,
    namespace: str,
    prometheus_url: str,
    prometheus_targets_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    operator_env(monkeypatch, kubeconfig, namespace, prometheus_url, 0)
    monkeypatch.setenv("SAGESERVE_REPORT_AFTER_SECONDS", str(BOUND))
    fake = FakeVllm()
    fake.set(0.5)  # between the thresholds: hold 3 until the test lowers it
    target = fake.scrape(prometheus_targets_dir, namespace, REGION, kubeconfig)
    model = model_deployment([REGION], gpus=2, lo=1, hi=3)
    model["spec"]["regions"][0]["initialInstances"] = 3
    # a 5 s cooldown: the step after a scale-in comes once KWOK has deleted the drained pod
    policy = scaling_policy("reactive", intervals={"paceSeconds": 2, "cooldownSeconds": 5})

    def size() -> int | None:
        return replicas(kubeconfig, namespace, REGION)

    def terminating() -> list[dict]:
        return [
            p
            for p in pods(kubeconfig, namespace, SELECTOR)
            if p["metadata"].get("deletionTimestamp")
        ]

    try:
        with KopfRunner(operator_args(namespace), timeout=600) as runner:
            apply(kubeconfig, namespace, policy, model)
            eventually(lambda: len(pods(kubeconfig, namespace, SELECTOR)) == 3, 60, "3 pods")
            for pod in pods(kubeconfig, namespace, SELECTOR):
                patch = f'{{"metadata": {{"finalizers": ["{FINALIZER}"]}}}}'
                kubectl(
                    kubeconfig,
                    ["patch", "pod", pod["metadata"]["name"], "-n", namespace, "-p", patch],
                )

            fake.set(0.1)  # low: scale in, one instance at a time, to minInstances 1
            started = time.monotonic()
            [stuck] = eventually(terminating, 60, "a drained pod terminating")
            assert size() == 2
            stuck_name = stuck["metadata"]["name"]
            condition = wait_condition(
                kubeconfig, namespace, "TerminationStuck", "True", BOUND + 30
            )
            detect = time.monotonic() - started
            assert stuck_name in condition["message"] and FINALIZER in condition["message"]
            assert "no further scale-in" in condition["message"]
            [warning] = events(kubeconfig, namespace, "TerminationStuck")
            assert warning["type"] == "Warning" and stuck_name in warning["message"]
            assert warning["involvedObject"]["kind"] == "ModelDeployment"
            steady(size, 12, "the pod set while a pod is stuck")  # low load, no 2nd scale-in
            assert len(events(kubeconfig, namespace, "ScaledIn")) == 1
            assert [p["metadata"]["name"] for p in terminating()] == [stuck_name]
            figure(
                "stuck",
                f"reported {detect:.1f} s after the scale-in (bound {BOUND} s); "
                "1 scale-in, 0 more while stuck",
            )

            # the finalizers go: the pod leaves, the report clears, pacing resumes
            started = time.monotonic()
            release(kubeconfig, namespace)
            wait_condition(kubeconfig, namespace, "TerminationStuck", "False", 30, "NoneStuck")
            eventually(lambda: size() == 1, 60, "the next scale-in once the pod is gone")
            figure("stuck", f"pacing resumed {time.monotonic() - started:.1f} s after release")
        assert runner.exception is None, runner.output
    finally:
        release(kubeconfig, namespace)
        target.unlink(missing_ok=True)
        fake.close()
