"""Someone else writes replicas: a person with `kubectl scale`, then an
HPA, on a pod set the operator sizes, against the real API server and controller-manager.

What the platform team sees: the operator notices within a pace interval or two, never
writes the pod set back (no flapping, however long the other writer stays), says so in a
`Conflict` condition and Warning Events naming the other writer (from managedFields) and,
for an HPA, the autoscaler; the documented annotation hands the pod set over
(`sageserve.io/scaling: external`), removing it hands it back, and `resume` takes it back
after a conflict. The load is low throughout, so the operator always *wants* the minimum:
any write of its own during a conflict would show as a scale-in.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import yaml
from e2e_helpers import eventually, kubectl
from fault_kit import condition, deployment, events, figure, steady, wait_condition
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

from sageserve.core.labels import ANNOTATION_REPLICAS, ANNOTATION_SCALING

pytestmark = pytest.mark.slow
REGION = "us-east"
POD_SET = f"llama8b-{REGION}-a100"


def hpa(min_replicas: int) -> dict:
    return {
        "apiVersion": "autoscaling/v2",
        "kind": "HorizontalPodAutoscaler",
        "metadata": {"name": "team-hpa"},
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": POD_SET},
            "minReplicas": min_replicas,
            "maxReplicas": min_replicas,
        },
    }


@pytest.mark.usefixtures("restore_node_pools")
def test_another_writer_of_replicas_is_named_never_fought_and_the_pod_set_can_be_handed_over(
    kubeconfig: Path,
    namespace: str,
    prometheus_url: str,
    prometheus_targets_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    operator_env(monkeypatch, kubeconfig, namespace, prometheus_url, 0)
    fake = FakeVllm()
    fake.set(0.1)  # below 30 %: the operator always wants minInstances
    target = fake.scrape(prometheus_targets_dir, namespace, REGION, kubeconfig)

    def size() -> int | None:
        return replicas(kubeconfig, namespace, REGION)

    def stamp() -> str | None:
        annotations = deployment(kubeconfig, namespace, POD_SET)["metadata"].get("annotations")
        return (annotations or {}).get(ANNOTATION_REPLICAS)

    def scaled_in() -> int:
        return len(events(kubeconfig, namespace, "ScaledIn"))

    try:
        with KopfRunner(operator_args(namespace), timeout=600) as runner:
            apply(kubeconfig, namespace, scaling_policy("reactive"))
            apply(kubeconfig, namespace, model_deployment([REGION], gpus=2, lo=1, hi=3))
            eventually(lambda: size() == 1 and stamp() == "1", 60, "the pod set adopted at 1")

            # a person scales it by hand
            started = time.monotonic()
            kubectl(kubeconfig, ["scale", "deployment", POD_SET, "-n", namespace, "--replicas=3"])
            conflict = wait_condition(kubeconfig, namespace, "Conflict", "True", 30)
            detect = time.monotonic() - started
            assert conflict["reason"] == "ReplicasWrittenElsewhere"
            message = conflict["message"]
            assert f"pod set {POD_SET}: replicas 3 written by kubectl" in message, message
            assert f"{ANNOTATION_SCALING}=external" in message and "resume" in message
            warned = events(kubeconfig, namespace, "ReplicasConflict")
            kinds = sorted(e["involvedObject"]["kind"] for e in warned)
            assert kinds == ["Deployment", "ModelDeployment"], warned
            assert all(e["type"] == "Warning" for e in warned)
            before = scaled_in()
            steady(size, 12, "the hand-scaled pod set")  # six pace passes, low load
            assert scaled_in() == before and stamp() == "1"
            figure("conflict", f"kubectl scale detected in {detect:.1f} s, 0 writes back in 12 s")

            # handed over: the other writer sizes it, no conflict
            annotate = ["annotate", "deployment", POD_SET, "-n", namespace, "--overwrite"]
            kubectl(kubeconfig, [*annotate, f"{ANNOTATION_SCALING}=external"])
            wait_condition(kubeconfig, namespace, "Conflict", "False", 30, "HandedOver")
            assert events(kubeconfig, namespace, "HandedOver")
            kubectl(kubeconfig, ["scale", "deployment", POD_SET, "-n", namespace, "--replicas=2"])
            eventually(lambda: stamp() == "2", 30, "the handed-over size followed")
            steady(size, 6, "the handed-over pod set")
            assert condition(kubeconfig, namespace, "Conflict")["reason"] == "HandedOver"  # type: ignore[index]
            assert scaled_in() == before

            # handed back: paced again from the size it has (low load: down to 1)
            kubectl(kubeconfig, [*annotate, f"{ANNOTATION_SCALING}-"])
            eventually(lambda: size() == 1, 60, "scale-in once handed back")
            wait_condition(kubeconfig, namespace, "Conflict", "False", 30, "SoleWriter")

            # an HPA that wants 2 where the operator wants 1: no tug of war
            started = time.monotonic()
            kubectl(kubeconfig, ["apply", "-n", namespace, "-f", "-"], stdin=yaml.safe_dump(hpa(2)))
            conflict = wait_condition(kubeconfig, namespace, "Conflict", "True", 120)
            detect = time.monotonic() - started
            assert "replicas 2 written by kube-controller-manager" in conflict["message"], conflict
            named = [e["message"] for e in events(kubeconfig, namespace, "ReplicasConflict")]
            assert any("HorizontalPodAutoscaler/team-hpa" in m for m in named), named
            before = scaled_in()
            steady(size, 20, "the HPA's pod set")  # the HPA re-syncs every 15 s
            assert scaled_in() == before
            figure("conflict", f"HPA detected in {detect:.1f} s, 0 writes back in 20 s")

            # the HPA removed, the pod set taken back at its size, then paced
            kubectl(kubeconfig, ["delete", "hpa", "team-hpa", "-n", namespace])
            kubectl(kubeconfig, [*annotate, f"{ANNOTATION_SCALING}=resume"])
            eventually(lambda: events(kubeconfig, namespace, "TookBack"), 30, "TookBack")
            annotations = deployment(kubeconfig, namespace, POD_SET)["metadata"]["annotations"]
            assert ANNOTATION_SCALING not in annotations  # consumed
            eventually(lambda: size() == 1, 60, "scale-in once taken back")
            wait_condition(kubeconfig, namespace, "Conflict", "False", 30, "SoleWriter")
        assert runner.exception is None, runner.output
    finally:
        target.unlink(missing_ok=True)
        fake.close()
