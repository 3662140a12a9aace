"""The chart's fleet roles (docs/regions.md): off by default; the hub may list the Secrets
of its own namespace and reads its members; a member install runs no operator and grants
the hub what its plan and actuation need there: Nodes, pods and evictions cluster-wide, pod
sets only in the namespaces it names."""

from __future__ import annotations

from typing import Any

import pytest

from tests.chart.test_chart import CHART, by_kind, helm, render

pytestmark = pytest.mark.integration


def _env(docs: list[dict[str, Any]]) -> dict[str, Any]:
    [deployment] = [d for d in by_kind(docs, "Deployment") if d["metadata"]["name"] == "sageserve"]
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    return {e["name"]: e.get("value") for e in container["env"]}


def test_by_default_the_fleet_is_this_cluster_and_no_secret_is_readable() -> None:
    docs = render()
    assert "SAGESERVE_MEMBER_CLUSTERS" not in _env(docs)
    rules = [r for d in by_kind(docs, "Role") + by_kind(docs, "ClusterRole") for r in d["rules"]]
    assert not [r for r in rules if "secrets" in r["resources"] and "list" in r["verbs"]]


def test_the_hub_lists_secrets_of_its_own_namespace_only() -> None:
    docs = render("fleet.hub.enabled=true", "fleet.hub.clusterName=eu-central")
    env = _env(docs)
    assert env["SAGESERVE_MEMBER_CLUSTERS"] == "on"
    assert env["SAGESERVE_CLUSTER_NAME"] == "eu-central"
    [role] = [d for d in by_kind(docs, "Role") if d["metadata"]["name"] == "sageserve-fleet-hub"]
    assert role["metadata"]["namespace"] == "sageserve-system"
    assert role["rules"] == [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["list"]}]
    cluster_rules = [r for d in by_kind(docs, "ClusterRole") for r in d["rules"]]
    assert not [r for r in cluster_rules if "secrets" in r["resources"]]


def test_a_member_install_runs_no_operator_and_grants_only_what_actuation_needs() -> None:
    docs = render("fleet.member.enabled=true")
    assert sorted((d["kind"], d["metadata"]["name"]) for d in docs) == [
        ("ClusterRole", "sageserve-member"),
        ("ClusterRoleBinding", "sageserve-member"),
        ("Secret", "sageserve-member-token"),
        ("ServiceAccount", "sageserve-member"),
    ]
    [role] = by_kind(docs, "ClusterRole")
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["list", "patch"]},
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]},
        {"apiGroups": [""], "resources": ["pods/eviction"], "verbs": ["create"]},
    ]
    [token] = by_kind(docs, "Secret")
    assert token["type"] == "kubernetes.io/service-account-token"
    assert token["metadata"]["annotations"] == {
        "kubernetes.io/service-account.name": "sageserve-member"
    }


def test_a_member_lets_the_hub_write_pod_sets_only_in_the_namespaces_it_names() -> None:
    docs = render("fleet.member.enabled=true", "fleet.member.namespaces={llm,batch}")
    bindings = by_kind(docs, "RoleBinding")
    assert sorted(b["metadata"]["namespace"] for b in bindings) == ["batch", "llm"]
    assert not [b for b in by_kind(docs, "ClusterRoleBinding") if "podsets" in b["roleRef"]["name"]]
    [podsets] = [
        d for d in by_kind(docs, "ClusterRole") if d["metadata"]["name"].endswith("-podsets")
    ]
    assert {g for r in podsets["rules"] for g in r["resources"]} == {
        "deployments",
        "pods",
        "horizontalpodautoscalers",
    }
    with_keda = render(
        "fleet.member.enabled=true", "fleet.member.namespaces={llm}", "keda.enabled=true"
    )
    [podsets] = [
        d for d in by_kind(with_keda, "ClusterRole") if d["metadata"]["name"].endswith("-podsets")
    ]
    assert "scaledobjects" in {g for r in podsets["rules"] for g in r["resources"]}
    with_pools = render(
        "fleet.member.enabled=true",
        "fleet.member.namespaces={llm}",
        "gateway.inferencePool.enabled=true",
    )
    [podsets] = [
        d for d in by_kind(with_pools, "ClusterRole") if d["metadata"]["name"].endswith("-podsets")
    ]
    granted = {g for r in podsets["rules"] for g in r["resources"]}
    assert {"inferencepools", "inferenceobjectives"} <= granted


def test_a_cluster_name_kubernetes_cannot_carry_is_refused_naming_the_value() -> None:
    result = helm(
        "template",
        "sageserve",
        str(CHART),
        "--kube-version",
        "1.36.0",
        "--set",
        "fleet.hub.clusterName=Bad_Name",
    )
    assert result.returncode != 0
    assert "/fleet/hub/clusterName" in result.stderr


def test_router_peers_become_peer_flags_and_a_bad_one_is_refused() -> None:
    docs = render(
        "router.enabled=true",
        "router.peers.eu-west=https://router.eu-west.example.com",
        "router.peers.ap-east=http://10.0.0.7:8080",
    )
    [router] = [
        d for d in by_kind(docs, "Deployment") if d["metadata"]["name"] == "sageserve-router"
    ]
    [container] = router["spec"]["template"]["spec"]["containers"]
    assert [a for a in container["args"] if a.startswith("--peer")] == [
        "--peer=ap-east=http://10.0.0.7:8080",
        "--peer=eu-west=https://router.eu-west.example.com",
    ]
    refused = helm(
        "template",
        "sageserve",
        str(CHART),
        "--kube-version",
        "1.36.0",
        "--set",
        "router.enabled=true",
        "--set",
        "router.peers.eu-west=ftp://x",
    )
    assert refused.returncode != 0 and "/router/peers/eu-west" in refused.stderr


def test_a_member_runs_a_router_reading_the_hubs_catalogue_given_the_hubs_kubeconfig() -> None:
    docs = render(
        "fleet.member.enabled=true",
        "fleet.member.namespaces={llm}",
        "fleet.member.hubKubeconfigSecret=hub-kubeconfig",
    )
    [router] = [
        d for d in by_kind(docs, "Deployment") if d["metadata"]["name"] == "sageserve-router"
    ]
    spec = router["spec"]["template"]["spec"]
    [container] = spec["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["SAGESERVE_ROUTER_HUB_KUBECONFIG"] == "/etc/sageserve/hub/kubeconfig"
    [hub] = [v for v in spec["volumes"] if v["name"] == "hub"]
    assert hub["secret"]["secretName"] == "hub-kubeconfig"
    # in the member it reads pods only, in the namespaces the hub writes pod sets in
    [role] = [r for r in by_kind(docs, "Role") if r["metadata"]["name"] == "sageserve-router"]
    assert role["metadata"]["namespace"] == "llm"
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list", "watch"]}]
    assert not [d for d in by_kind(docs, "Deployment") if d["metadata"]["name"] == "sageserve"]


def test_the_hub_gives_member_routers_an_identity_that_only_reads_the_catalogue() -> None:
    assert not [
        d
        for d in render("fleet.hub.enabled=true")
        if d["metadata"]["name"].endswith("member-router")
    ]
    docs = render(
        "fleet.hub.enabled=true", "fleet.hub.memberRouters=true", "router.namespaces={llm,batch}"
    )
    names = {(d["kind"], d["metadata"]["name"]) for d in docs}
    assert ("ServiceAccount", "sageserve-member-router") in names
    assert ("Secret", "sageserve-member-router-token") in names
    roles = [r for r in by_kind(docs, "Role") if r["metadata"]["name"] == "sageserve-member-router"]
    assert sorted(r["metadata"]["namespace"] for r in roles) == ["batch", "llm"]
    verbs = {(g, v) for r in roles[0]["rules"] for g in r["resources"] for v in r["verbs"]}
    assert ("secrets", "get") in verbs and ("secrets", "list") not in verbs
    assert not [v for g, v in verbs if v not in ("list", "watch", "get")]
