"""The operator against the real control plane: pod sets from ModelDeployments.

Runs the kopf handlers in-process (kopf's KopfRunner) against the e2e cluster, applies
tiers, a policy and a small ModelDeployment with kubectl as a user would, and checks what
a user would look at: the Deployments, where their pods run, and the status conditions.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from e2e_helpers import eventually, kubectl
from kopf.testing import KopfRunner
from operator_kit import H100, model_deployment, operator_args

REPO = Path(__file__).resolve().parents[2]


def small_model(name: str, policy: str = "fleet") -> dict:
    return model_deployment(
        ["us-east", "us-west"], H100, gpus=8, theta=1500, name=name, policy=policy
    )


@pytest.fixture
def namespace(kubeconfig: Path) -> Iterator[str]:
    name = f"op-{uuid.uuid4().hex[:6]}"
    for path in sorted((REPO / "crds").glob("*.yaml")):
        kubectl(kubeconfig, ["apply", "--server-side", "--force-conflicts", "-f", str(path)])
    kubectl(kubeconfig, ["wait", "--for=condition=Established", "crd", "--all", "--timeout=60s"])
    kubectl(kubeconfig, ["create", "namespace", name])
    kubectl(kubeconfig, ["apply", "-n", name, "-f", str(REPO / "policies/base/tiers.yaml")])
    kubectl(
        kubeconfig,
        ["apply", "-n", name, "-f", str(REPO / "policies/overlays/lt-ua/scalingpolicy.yaml")],
    )
    yield name
    kubectl(kubeconfig, ["delete", "namespace", name, "--wait=false"], check=False)


def apply(kubeconfig: Path, namespace: str, doc: dict) -> None:
    kubectl(kubeconfig, ["apply", "-n", namespace, "-f", "-"], stdin=yaml.safe_dump(doc))


def get_json(kubeconfig: Path, namespace: str, *what: str) -> dict:
    return json.loads(kubectl(kubeconfig, ["get", "-n", namespace, *what, "-o", "json"]).stdout)


def ready_condition(kubeconfig: Path, namespace: str, name: str) -> dict | None:
    md = get_json(kubeconfig, namespace, "modeldeployment", name)
    found = [c for c in md.get("status", {}).get("conditions", []) if c["type"] == "Ready"]
    return found[0] if found else None


@pytest.mark.usefixtures("restore_node_pools")
def test_model_deployment_becomes_pod_sets_running_on_matching_gpu_nodes(
    kubeconfig: Path, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    monkeypatch.setenv("SAGESERVE_NAMESPACES", namespace)
    monkeypatch.setenv("SAGESERVE_PROMETHEUS_URL", "http://127.0.0.1:1")  # no policy paces here
    args = operator_args(namespace)
    with KopfRunner(args, timeout=120) as runner:
        apply(kubeconfig, namespace, small_model("llama8b"))

        def pod_sets() -> list[str] | None:
            items = get_json(kubeconfig, namespace, "deployments")["items"]
            names = sorted(d["metadata"]["name"] for d in items)
            return names if len(names) == 2 else None

        assert eventually(pod_sets, 60, "two pod sets") == [
            "llama8b-us-east-h100",
            "llama8b-us-west-h100",
        ]

        def running_pods() -> list[dict] | None:
            pods = get_json(kubeconfig, namespace, "pods")["items"]
            running = [p for p in pods if p["status"].get("phase") == "Running"]
            return running if len(running) == 2 else None

        nodes = {
            n["metadata"]["name"]: n for n in get_json(kubeconfig, "default", "nodes")["items"]
        }
        for pod in eventually(running_pods, 90, "one Running pod per pod set"):
            labels = nodes[pod["spec"]["nodeName"]]["metadata"]["labels"]
            region = pod["metadata"]["labels"]["sageserve.io/region"]
            assert labels["topology.kubernetes.io/region"] == region
            assert labels["nvidia.com/gpu.product"] == H100
            assert labels["sageserve.io/pool"] == "serving"

        ready = eventually(
            lambda: (
                (c := ready_condition(kubeconfig, namespace, "llama8b"))
                and c["status"] == "True"
                and c
            ),
            60,
            "Ready=True on the ModelDeployment",
        )
        assert ready["reason"] == "PodSetsApplied"
        status = get_json(kubeconfig, namespace, "modeldeployment", "llama8b")["status"]
        assert status["instances"] == 2

        # An object that passes the schema but names a missing policy: Ready=False, and
        # the operator keeps serving the other object.
        apply(kubeconfig, namespace, small_model("orphan", policy="no-such-policy"))
        bad = eventually(
            lambda: ready_condition(kubeconfig, namespace, "orphan"),
            60,
            "a Ready condition on orphan",
        )
        assert (bad["status"], bad["reason"]) == ("False", "PolicyNotFound")
        assert "no-such-policy" in bad["message"]
        items = get_json(kubeconfig, namespace, "deployments")["items"]
        assert not [d for d in items if d["metadata"]["name"].startswith("orphan-")]
        events = get_json(kubeconfig, namespace, "events")["items"]
        assert any(e.get("reason") == "PolicyNotFound" for e in events)

        # Level-triggered: restarting reconciles to the same objects, nothing is duplicated.
        before = get_json(kubeconfig, namespace, "deployments")["items"]
    assert runner.exception is None, runner.output
    with KopfRunner(args, timeout=60) as again:
        eventually(lambda: ready_condition(kubeconfig, namespace, "llama8b"), 30, "resume")
    assert again.exception is None, again.output
    after = get_json(kubeconfig, namespace, "deployments")["items"]
    assert [(d["metadata"]["name"], d["spec"]["replicas"]) for d in after] == [
        (d["metadata"]["name"], d["spec"]["replicas"]) for d in before
    ]
