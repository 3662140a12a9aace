"""The chart's security posture, rendered by the real helm: NetworkPolicies, the
`restricted` Pod Security Standard's pod fields, the router's timeouts reaching its flags.

The real API server admits (or refuses) these in tests/e2e/test_e2e_security.py; here each
rule is checked in the rendered YAML, so a template change that loosens one fails fast.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.chart.test_chart import by_kind, render, router_cli_params

ROUTER = {"app.kubernetes.io/name": "sageserve-router", "app.kubernetes.io/instance": "sageserve"}
PROMETHEUS = {
    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}},
    "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}},
}

#: helm (built from Go modules by scripts/setup) renders every test's chart
pytestmark = pytest.mark.integration


def policies(*sets: str) -> dict[tuple[str, str], dict[str, Any]]:
    docs = by_kind(render(*sets), "NetworkPolicy")
    return {(d["metadata"]["namespace"], d["metadata"]["name"]): d["spec"] for d in docs}


def test_only_the_router_and_prometheus_reach_the_vllm_pods() -> None:
    specs = policies("watchNamespaces={llm,chat}")
    for ns in ("llm", "chat"):
        # two policies select the vLLM pods; what they allow adds up to these two peers
        scrape, route = (
            specs[(ns, "sageserve-pod-sets")],
            specs[(ns, "sageserve-router-to-pod-sets")],
        )
        allowed = []
        for spec in (scrape, route):
            assert spec["policyTypes"] == ["Ingress"]
            assert spec["podSelector"]["matchLabels"] == {
                "app.kubernetes.io/managed-by": "sageserve"
            }
            [rule] = spec["ingress"]
            assert rule["ports"] == [{"port": "http", "protocol": "TCP"}]
            allowed += rule["from"]
        assert allowed == [
            PROMETHEUS,
            {
                "namespaceSelector": {
                    "matchLabels": {"kubernetes.io/metadata.name": "sageserve-system"}
                },
                "podSelector": {"matchLabels": ROUTER},
            },
        ]
    assert ("llm", "sageserve-router-to-pod-sets") not in policies(
        "watchNamespaces={llm}", "router.enabled=false"
    )


def test_only_prometheus_reaches_the_operator_and_clients_the_router() -> None:
    specs = policies()
    [operator] = specs[("sageserve-system", "sageserve")]["ingress"]
    assert operator == {"from": [PROMETHEUS], "ports": [{"port": "metrics", "protocol": "TCP"}]}
    [router] = specs[("sageserve-system", "sageserve-router")]["ingress"]
    assert "from" not in router  # clients: anyone, by default
    clients = {"namespaceSelector": {"matchLabels": {"gateway": "edge"}}}
    specs = policies("networkPolicy.routerFrom[0].namespaceSelector.matchLabels.gateway=edge")
    [router] = specs[("sageserve-system", "sageserve-router")]["ingress"]
    assert router["from"] == [clients, PROMETHEUS]


def test_network_policies_can_be_left_out() -> None:
    assert policies("networkPolicy.enabled=false") == {}


@pytest.mark.parametrize("app", ["sageserve", "sageserve-router"])
def test_pods_satisfy_the_restricted_pod_security_standard(app: str) -> None:
    """The `restricted` profile's checks (kubernetes.io/docs/concepts/security/
    pod-security-standards) on the rendered pod templates."""
    [deployment] = [
        d
        for d in by_kind(render(), "Deployment")
        if d["metadata"]["labels"]["app.kubernetes.io/name"] == app
    ]
    pod = deployment["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert not any(pod.get(k) for k in ("hostNetwork", "hostPID", "hostIPC"))
    allowed_volumes = {"emptyDir", "secret", "persistentVolumeClaim", "configMap", "projected"}
    for volume in pod.get("volumes", []):
        assert set(volume) - {"name"} <= allowed_volumes, volume
    for container in pod["containers"]:
        context = container["securityContext"]
        assert context["allowPrivilegeEscalation"] is False
        assert context["capabilities"] == {"drop": ["ALL"]}
        assert not context.get("privileged")
        assert all("hostPort" not in p for p in container.get("ports", []))


def test_the_router_timeouts_reach_its_command_line() -> None:
    [deployment] = [
        d
        for d in by_kind(render("router.stallTimeoutSeconds=5"), "Deployment")
        if d["metadata"]["labels"]["app.kubernetes.io/name"] == "sageserve-router"
    ]
    params = router_cli_params(deployment["spec"]["template"]["spec"]["containers"][0]["args"])
    assert params["idle_timeout_seconds"] == 75
    assert params["body_timeout_seconds"] == 30
    assert params["stall_timeout_seconds"] == 5
    assert params["upstream_timeout_seconds"] == 600


def test_the_operator_may_list_autoscalers_and_no_longer_needs_the_scale_subresource() -> None:
    [role] = [d for d in by_kind(render(), "ClusterRole") if d["metadata"]["name"] == "sageserve"]
    granted = {
        (g, r): set(rule["verbs"])
        for rule in role["rules"]
        for g in rule["apiGroups"]
        for r in rule["resources"]
    }
    assert granted[("autoscaling", "horizontalpodautoscalers")] == {"list"}
    assert ("apps", "deployments/scale") not in granted
    assert "patch" in granted[("apps", "deployments")]
