"""Leader election on a real Lease: one replica leads, the other takes over when it stops."""

from __future__ import annotations

import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

import pytest
import yaml
from e2e_helpers import eventually, kubectl
from kopf.testing import KopfRunner
from operator_kit import FakeVllm, model_deployment, operator_args, scaling_policy

from sageserve.controller.kube import Kube
from sageserve.controller.leader import LeaderElection

REPO = Path(__file__).resolve().parents[2]


def test_only_one_replica_leads_and_the_other_takes_over_after_expiry(
    kubeconfig: Path, api_client: object
) -> None:
    namespace = f"lease-{uuid.uuid4().hex[:6]}"
    kubectl(kubeconfig, ["create", "namespace", namespace])
    try:
        kube = Kube(api_client)  # type: ignore[arg-type]
        first = LeaderElection(kube, namespace, "replica-a", duration_s=2)
        second = LeaderElection(kube, namespace, "replica-b", duration_s=2)
        assert first.lead()
        assert not second.lead()
        assert first.lead()  # renewing keeps it
        assert not second.lead()
        time.sleep(3)  # replica-a stops renewing
        assert second.lead()
        assert not first.lead()
        holder = kubectl(
            kubeconfig,
            [
                "get",
                "lease",
                "sageserve-operator",
                "-n",
                namespace,
                "-o",
                "jsonpath={.spec.holderIdentity}",
            ],
        ).stdout
        assert holder == "replica-b"
    finally:
        kubectl(kubeconfig, ["delete", "namespace", namespace, "--wait=false"], check=False)


@pytest.mark.usefixtures("restore_node_pools")
def test_a_replica_without_the_lease_does_not_scale(
    kubeconfig: Path,
    prometheus_url: str,
    prometheus_targets_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    namespace = f"lead-{uuid.uuid4().hex[:6]}"
    kubectl(kubeconfig, ["create", "namespace", namespace])
    for path in sorted((REPO / "crds").glob("*.yaml")):
        kubectl(kubeconfig, ["apply", "--server-side", "--force-conflicts", "-f", str(path)])
    kubectl(kubeconfig, ["apply", "-n", namespace, "-f", str(REPO / "policies/base/tiers.yaml")])
    now = datetime.now(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")
    other = {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": "sageserve-operator"},
        "spec": {"holderIdentity": "other-replica", "leaseDurationSeconds": 8, "renewTime": now},
    }
    kubectl(kubeconfig, ["apply", "-n", namespace, "-f", "-"], stdin=yaml.safe_dump(other))
    fake = FakeVllm()
    fake.set(0.9)  # the load asks for a second instance at once
    target_file = fake.scrape(prometheus_targets_dir, namespace, "us-central", kubeconfig)
    for key, value in {
        "KUBECONFIG": str(kubeconfig),
        "SAGESERVE_PROMETHEUS_URL": prometheus_url,
        "SAGESERVE_NAMESPACES": namespace,
        "SAGESERVE_LEASE_NAMESPACE": namespace,
        "SAGESERVE_METRICS_PORT": "0",
    }.items():
        monkeypatch.setenv(key, value)
    policy = scaling_policy("reactive")
    model = model_deployment(["us-central"])

    def replicas() -> int | None:
        out = kubectl(
            kubeconfig,
            [
                "get",
                "deployment",
                "llama8b-us-central-a100",
                "-n",
                namespace,
                "-o",
                "jsonpath={.spec.replicas}",
            ],
            check=False,
        )
        return int(out.stdout) if out.returncode == 0 and out.stdout else None

    args = operator_args(namespace)
    try:
        with KopfRunner(args, timeout=120) as runner:
            for doc in (policy, model):
                kubectl(
                    kubeconfig, ["apply", "-n", namespace, "-f", "-"], stdin=yaml.safe_dump(doc)
                )
            assert eventually(lambda: replicas() == 1, 30, "the pod set created by the handlers")
            time.sleep(4)  # two pace intervals while another replica holds the Lease
            assert replicas() == 1
            eventually(
                lambda: replicas() == 2, 60, "scale-out once the other replica's Lease expired"
            )
            holder = kubectl(
                kubeconfig,
                [
                    "get",
                    "lease",
                    "sageserve-operator",
                    "-n",
                    namespace,
                    "-o",
                    "jsonpath={.spec.holderIdentity}",
                ],
            ).stdout
            assert holder not in ("", "other-replica")
        assert runner.exception is None, runner.output
    finally:
        fake.close()
        target_file.unlink(missing_ok=True)
        kubectl(kubeconfig, ["delete", "namespace", namespace, "--wait=false"], check=False)
