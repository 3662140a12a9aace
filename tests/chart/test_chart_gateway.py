"""The chart's Gateway API Inference Extension values, rendered by the real helm binary: off
by default with no RBAC for it; on, exactly the RBAC the operator's calls need, its
settings in the operator's environment, and the NetworkPolicy that lets a gateway reach
the vLLM pods."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from sageserve.controller.inference_pool import gateway_config
from tests.chart.test_chart import CHART, by_kind, helm, render

pytestmark = pytest.mark.integration

#: gateway values on, as a values file (`{pool}` would read as a list in `--set`)
ON: dict[str, Any] = {
    "gateway": {
        "inferencePool": {"enabled": True},
        "endpointPicker": {"service": "{pool}-epp", "failureMode": "FailOpen"},
        "from": [
            {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "gateways"}}}
        ],
    }
}


def render_on(
    tmp_path: Path, *sets: str, values: dict[str, Any] | None = None
) -> list[dict[str, Any]]:
    """The chart rendered with `values` (ON by default) from a file, and `sets`."""
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump(ON if values is None else values))
    args = ["template", "sageserve", str(CHART), "-n", "sageserve-system"]
    args += ["--kube-version", "1.36.0", "-f", str(path)]
    for s in sets:
        args += ["--set", s]
    result = helm(*args)
    assert result.returncode == 0, result.stderr
    return [d for d in yaml.safe_load_all(result.stdout) if d]


def _operator_env(docs: list[dict[str, Any]]) -> dict[str, str]:
    deployment = next(
        d for d in by_kind(docs, "Deployment") if d["metadata"]["name"] == "sageserve"
    )
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    return {e["name"]: e.get("value", "") for e in container["env"]}


def _rules(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for role in by_kind(docs, "ClusterRole") for r in role["rules"]]


def test_off_by_default_without_rbac_for_it() -> None:
    docs = render()
    for rule in _rules(docs):
        assert not {"inferencepools", "inferenceobjectives"} & set(rule["resources"])
        assert not {"inference.networking.k8s.io", "llm-d.ai"} & set(rule["apiGroups"])
    env = _operator_env(docs)
    assert env["SAGESERVE_INFERENCE_POOLS"] == "off"
    assert "SAGESERVE_ENDPOINT_PICKER" not in env
    assert gateway_config(env).enabled is False
    names = [d["metadata"]["name"] for d in by_kind(docs, "NetworkPolicy")]
    assert not [n for n in names if "gateway" in n]


def test_on_gives_exactly_the_rbac_the_operator_calls_need(tmp_path: Path) -> None:
    docs = render_on(tmp_path)
    roles = {r["metadata"]["name"]: r for r in by_kind(docs, "ClusterRole")}
    assert roles["sageserve-gateway"]["rules"] == [
        {
            "apiGroups": ["inference.networking.k8s.io"],
            "resources": ["inferencepools"],
            "verbs": ["list", "create", "patch", "delete"],
        },
        {
            "apiGroups": ["llm-d.ai", "inference.networking.x-k8s.io"],
            "resources": ["inferenceobjectives"],
            "verbs": ["list", "create", "patch", "delete"],
        },
        {
            "apiGroups": ["gateway.networking.k8s.io"],
            "resources": ["httproutes"],
            "verbs": ["list", "create", "patch", "delete"],
        },
    ]
    # the operator's main role is unchanged: the gateway's rules live in their own role
    assert not [r for r in roles["sageserve"]["rules"] if "inferencepools" in r["resources"]]
    binding = next(
        b
        for b in by_kind(docs, "ClusterRoleBinding")
        if b["metadata"]["name"] == "sageserve-gateway"
    )
    assert binding["roleRef"]["name"] == "sageserve-gateway"
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "sageserve", "namespace": "sageserve-system"}
    ]


def test_on_passes_the_settings_the_operator_parses(tmp_path: Path) -> None:
    env = _operator_env(render_on(tmp_path))
    assert env["SAGESERVE_INFERENCE_POOLS"] == "auto"
    assert env["SAGESERVE_ENDPOINT_PICKER"] == "{pool}-epp:9002:FailOpen"
    config = gateway_config(env)
    assert config.enabled
    assert config.endpoint_picker is not None
    assert (config.endpoint_picker.name, config.endpoint_picker.port) == ("{pool}-epp", 9002)
    assert config.endpoint_picker.failure_mode.value == "FailOpen"
    # no service named: the pools come only from ModelDeployments that name their own
    no_service = {"gateway": {k: v for k, v in ON["gateway"].items() if k != "endpointPicker"}}
    env = _operator_env(render_on(tmp_path, values=no_service))
    assert "SAGESERVE_ENDPOINT_PICKER" not in env


def test_the_gateway_may_reach_the_vllm_pods_of_each_router_namespace(tmp_path: Path) -> None:
    docs = render_on(tmp_path, "router.namespaces={llm,batch}")
    policies = {
        (p["metadata"]["namespace"], p["metadata"]["name"]): p
        for p in by_kind(docs, "NetworkPolicy")
        if p["metadata"]["name"] == "sageserve-gateway-to-pod-sets"
    }
    assert sorted(policies) == [
        ("batch", "sageserve-gateway-to-pod-sets"),
        ("llm", "sageserve-gateway-to-pod-sets"),
    ]
    spec = policies[("llm", "sageserve-gateway-to-pod-sets")]["spec"]
    assert spec["podSelector"]["matchLabels"] == {"app.kubernetes.io/managed-by": "sageserve"}
    assert spec["ingress"] == [
        {
            "from": [
                {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "gateways"}}}
            ],
            "ports": [{"port": "http", "protocol": "TCP"}],
        }
    ]
    off = render_on(tmp_path, "networkPolicy.enabled=false")
    assert not by_kind(off, "NetworkPolicy")


def test_on_with_network_policies_and_no_peers_is_refused_with_the_fix() -> None:
    result = helm(
        "template", "x", str(CHART), "--kube-version", "1.36.0",
        "--set", "gateway.inferencePool.enabled=true",
    )  # fmt: skip
    assert result.returncode != 0
    assert "gateway.from must list the gateway's proxies and the endpoint picker" in result.stderr
    ok = helm(
        "template", "x", str(CHART), "--kube-version", "1.36.0",
        "--set", "gateway.inferencePool.enabled=true", "--set", "networkPolicy.enabled=false",
    )  # fmt: skip
    assert ok.returncode == 0, ok.stderr


@pytest.mark.parametrize(
    ("setting", "field"),
    [
        ("gateway.endpointPicker.failureMode=Maybe", "failureMode"),
        ("gateway.endpointPicker.port=0", "port"),
        ("gateway.endpointPicker.service=Bad_Name", "service"),
        ("gateway.inferencePools.enabled=true", "inferencePools"),
    ],
)
def test_bad_gateway_values_are_refused_naming_the_key(setting: str, field: str) -> None:
    result = helm("template", "x", str(CHART), "--kube-version", "1.36.0", "--set", setting)
    assert result.returncode != 0
    assert field in result.stderr
