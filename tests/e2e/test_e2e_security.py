"""The chart's security posture on the real API server.

A release namespace labelled for the `restricted` Pod Security Standard (enforce, audit,
warn): the API server's PodSecurity admission admits the operator's and the router's pods
(and refuses a privileged pod there, so enforcement is real, not assumed); the
NetworkPolicies are accepted by the API server and their selectors, asked of the API
server, pick exactly the operator's pods, the router's, and the pod sets' vLLM pods, with
the router and Prometheus as the only peers allowed to the latter. KWOK has no network
plugin, so no packet is dropped here: what is checked is what the policies select.
"""

from __future__ import annotations

import json
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from e2e_helpers import eventually, kubectl
from operator_kit import model_deployment

from e2e import versions
from sageserve.api.model_deployment import ModelDeployment
from sageserve.controller.podset import render_pod_set

REPO = Path(__file__).resolve().parents[2]
RELEASE = "secure"
RESTRICTED = {
    f"pod-security.kubernetes.io/{mode}": "restricted" for mode in ("enforce", "audit", "warn")
}


def helm(kubeconfig: Path, *args: str) -> str:
    result = subprocess.run(
        [str(versions.bin_dir() / "helm"), f"--kubeconfig={kubeconfig}", *args],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout + result.stderr


@pytest.fixture(scope="module")
def restricted_release(kubeconfig: Path) -> Iterator[str]:
    """The chart installed into a fresh namespace labelled `restricted`; its name."""
    namespace = f"secure-{uuid.uuid4().hex[:6]}"
    labels = [f"{k}={v}" for k, v in RESTRICTED.items()]
    kubectl(kubeconfig, ["create", "namespace", namespace])
    kubectl(kubeconfig, ["label", "namespace", namespace, *labels])
    output = helm(
        kubeconfig,
        "upgrade",
        "--install",
        RELEASE,
        str(REPO / "charts" / "sageserve"),
        "-n",
        namespace,
        "--set",
        "prometheus.url=http://127.0.0.1:9090",
        "--set",
        "replicaCount=1",
        "--set",
        "router.replicaCount=1",
        "--wait",
        "--timeout",
        "120s",
    )
    assert "violate" not in output, output  # no PodSecurity warning on install
    yield namespace
    helm(kubeconfig, "uninstall", RELEASE, "-n", namespace)
    kubectl(kubeconfig, ["delete", "namespace", namespace, "--wait=false"], check=False)


def pods(kubeconfig: Path, namespace: str, selector: str) -> list[dict[str, Any]]:
    out = kubectl(kubeconfig, ["get", "pods", "-n", namespace, "-l", selector, "-o", "json"])
    return list(json.loads(out.stdout)["items"])


def selector(s: dict[str, Any]) -> str:
    """A LabelSelector as kubectl's `-l` string (matchLabels and Exists expressions)."""
    parts = [f"{k}={v}" for k, v in (s.get("matchLabels") or {}).items()]
    for e in s.get("matchExpressions") or []:
        assert e["operator"] == "Exists", e
        parts.append(e["key"])
    return ",".join(parts)


@pytest.mark.parametrize("app", ["sageserve", "sageserve-router"])
def test_the_operator_and_router_are_admitted_under_restricted(
    kubeconfig: Path, restricted_release: str, app: str
) -> None:
    running = eventually(
        lambda: [
            p
            for p in pods(kubeconfig, restricted_release, f"app.kubernetes.io/name={app}")
            if p["status"].get("phase") == "Running"
        ],
        60,
        f"{app} running",
    )
    assert len(running) == 1
    # and the API server finds no pod there that breaks it: pinning the level to this
    # server's version makes it evaluate every pod in the namespace and warn about each
    # violator (setting the same label again would evaluate nothing)
    minor = ".".join(versions.KUBERNETES_VERSION.split(".")[:2])
    out = kubectl(
        kubeconfig,
        [
            "label",
            "--dry-run=server",
            "--overwrite",
            "namespace",
            restricted_release,
            f"pod-security.kubernetes.io/enforce-version=v{minor}",
        ],
    )
    assert "labeled (server dry run)" in out.stdout, out.stdout + out.stderr
    assert "violate" not in out.stdout + out.stderr, out.stderr


def test_a_privileged_pod_is_refused_there(kubeconfig: Path, restricted_release: str) -> None:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "root-shell"},
        "spec": {
            "containers": [
                {"name": "sh", "image": "busybox", "securityContext": {"privileged": True}}
            ]
        },
    }
    out = kubectl(
        kubeconfig,
        ["apply", "-n", restricted_release, "-f", "-"],
        stdin=yaml.safe_dump(pod),
        check=False,
    )
    assert out.returncode != 0
    assert 'violates PodSecurity "restricted' in out.stderr, out.stderr


def network_policies(kubeconfig: Path, namespace: str) -> dict[str, dict[str, Any]]:
    out = kubectl(kubeconfig, ["get", "networkpolicy", "-n", namespace, "-o", "json"])
    return {p["metadata"]["name"]: p["spec"] for p in json.loads(out.stdout)["items"]}


def test_network_policies_select_exactly_the_pods_they_guard(
    kubeconfig: Path, restricted_release: str
) -> None:
    ns = restricted_release
    specs = network_policies(kubeconfig, ns)
    operator = specs[f"{RELEASE}-sageserve"]
    router = specs[f"{RELEASE}-sageserve-router"]
    names = {
        name: sorted(
            p["metadata"]["labels"]["app.kubernetes.io/name"]
            for p in pods(kubeconfig, ns, selector(spec["podSelector"]))
        )
        for name, spec in (("operator", operator), ("router", router))
    }
    assert names == {"operator": ["sageserve"], "router": ["sageserve-router"]}
    [only] = operator["ingress"]
    assert only["ports"] == [{"port": "metrics", "protocol": "TCP"}]
    assert [peer["podSelector"]["matchLabels"] for peer in only["from"]] == [
        {"app.kubernetes.io/name": "prometheus"}
    ]

    # the pod sets' pods (here: the release namespace, the router's default): a pod as the
    # operator renders it is selected by both pod-set policies; the router's pods are the
    # one peer besides Prometheus
    scrape, route = (
        specs[f"{RELEASE}-sageserve-pod-sets"],
        specs[f"{RELEASE}-sageserve-router-to-pod-sets"],
    )
    raw = model_deployment(["us-east"], name="probe")
    raw["metadata"]["namespace"] = ns
    md = ModelDeployment.model_validate(raw)
    template = render_pod_set(md, md.spec.regions[0], md.spec.variants[0], 0, ns)
    labels = template["spec"]["template"]["metadata"]["labels"]
    stand_in = {
        "apiVersion": "v1",
        "kind": "ConfigMap",  # labels only: a vLLM pod would not pass `restricted`
        "metadata": {"name": "pod-set-labels", "labels": labels},
    }
    kubectl(kubeconfig, ["apply", "-n", ns, "-f", "-"], stdin=yaml.safe_dump(stand_in))
    for spec in (scrape, route):
        out = kubectl(
            kubeconfig,
            ["get", "configmap", "-n", ns, "-l", selector(spec["podSelector"]), "-o", "name"],
        )
        assert out.stdout.split() == ["configmap/pod-set-labels"], spec
    peers = [peer for spec in (scrape, route) for rule in spec["ingress"] for peer in rule["from"]]
    router_peer = next(p for p in peers if "sageserve-router" in json.dumps(p))
    namespaces = kubectl(
        kubeconfig,
        ["get", "namespace", "-l", selector(router_peer["namespaceSelector"]), "-o", "name"],
    ).stdout.split()
    assert namespaces == [f"namespace/{ns}"]
    selected = pods(kubeconfig, ns, selector(router_peer["podSelector"]))
    assert [p["metadata"]["labels"]["app.kubernetes.io/name"] for p in selected] == [
        "sageserve-router"
    ]
    assert len(peers) == 2  # the router and Prometheus, nobody else
    assert all(
        rule["ports"] == [{"port": "http", "protocol": "TCP"}]
        for spec in (scrape, route)
        for rule in spec["ingress"]
    )
