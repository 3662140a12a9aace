"""The chart's KEDA actuation support (docs/keda.md): off by default with no keda.sh RBAC at
all; on, the scaler's port, Service, flags, NetworkPolicy and least-privilege rules."""

from __future__ import annotations

from typing import Any

import pytest

from tests.chart.test_chart import CHART, by_kind, helm, render

pytestmark = pytest.mark.integration
ON = "keda.enabled=true"


def rules(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for d in by_kind(docs, "ClusterRole") for r in d["rules"]]


def operator_container(docs: list[dict[str, Any]]) -> dict[str, Any]:
    [deployment] = [d for d in by_kind(docs, "Deployment") if d["metadata"]["name"] == "sageserve"]
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    return dict(container)


def test_by_default_nothing_of_keda_is_rendered() -> None:
    docs = render()
    assert not [r for r in rules(docs) if "keda.sh" in r["apiGroups"]]
    container = operator_container(docs)
    assert not [a for a in container["args"] if a.startswith("--scaler")]
    assert "scaler" not in {p["name"] for p in container["ports"]}
    assert not [d for d in docs if d["metadata"]["name"].endswith("-scaler")]


def test_enabled_the_operator_serves_the_scaler_behind_its_service() -> None:
    docs = render(ON)
    container = operator_container(docs)
    assert "--scaler-listen=0.0.0.0:9100" in container["args"]
    assert "--scaler-address=sageserve-scaler.sageserve-system.svc:9100" in container["args"]
    assert {"name": "scaler", "containerPort": 9100, "protocol": "TCP"} in container["ports"]
    [service] = [d for d in by_kind(docs, "Service") if d["metadata"]["name"] == "sageserve-scaler"]
    assert service["spec"]["ports"] == [
        {
            "name": "scaler",
            "port": 9100,
            "targetPort": "scaler",
            "protocol": "TCP",
            "appProtocol": "grpc",
        }
    ]
    assert service["spec"]["selector"] == {
        "app.kubernetes.io/name": "sageserve",
        "app.kubernetes.io/instance": "sageserve",
    }


def test_enabled_rbac_adds_only_scaled_objects_and_reading_a_deployment() -> None:
    docs = render(ON)
    [role] = [d for d in by_kind(docs, "ClusterRole") if d["metadata"]["name"] == "sageserve-keda"]
    assert role["rules"] == [
        {
            "apiGroups": ["keda.sh"],
            "resources": ["scaledobjects"],
            "verbs": ["get", "list", "create", "patch", "delete"],
        },
        {"apiGroups": ["apps"], "resources": ["deployments"], "verbs": ["get"]},
    ]
    [binding] = [
        d for d in by_kind(docs, "ClusterRoleBinding") if d["metadata"]["name"] == "sageserve-keda"
    ]
    assert binding["roleRef"]["name"] == "sageserve-keda"
    assert binding["subjects"][0]["name"] == "sageserve"
    assert not [r for r in rules(docs) if "*" in r["verbs"] or "*" in r["resources"]]


def test_only_keda_s_operator_is_let_through_to_the_scaler_port() -> None:
    [policy] = [
        d
        for d in by_kind(render(ON), "NetworkPolicy")
        if d["metadata"]["name"] == "sageserve-scaler"
    ]
    assert policy["spec"]["ingress"] == [
        {
            "from": [
                {
                    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "keda"}},
                    "podSelector": {"matchLabels": {"app.kubernetes.io/name": "keda-operator"}},
                }
            ],
            "ports": [{"port": "scaler", "protocol": "TCP"}],
        }
    ]
    off = render(ON, "networkPolicy.enabled=false")
    assert not [d for d in by_kind(off, "NetworkPolicy")]


def test_another_port_reaches_every_place_that_names_it() -> None:
    docs = render(ON, "keda.port=9200")
    assert (
        "--scaler-address=sageserve-scaler.sageserve-system.svc:9200"
        in operator_container(docs)["args"]
    )


@pytest.mark.parametrize(
    ("setting", "field"),
    [
        ("keda.port=80", "/keda/port"),
        ("keda.enabled=maybe", "/keda/enabled"),
        ("keda.prt=1", "prt"),
    ],
)
def test_bad_keda_values_are_refused_naming_the_key(setting: str, field: str) -> None:
    result = helm("template", "x", str(CHART), "--kube-version", "1.36.0", "--set", setting)
    assert result.returncode != 0 and field in result.stderr


def test_helm_lint_passes_with_keda_enabled() -> None:
    result = helm("lint", "--strict", str(CHART), "--kube-version", "1.36.0", "--set", ON)
    assert result.returncode == 0, result.stdout + result.stderr
