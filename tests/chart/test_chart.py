"""The Helm chart rendered by the real helm binary: lint, value sets, hardening, CRDs."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from e2e import versions
from sageserve.metrics.exporter import OperatorMetrics

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "sageserve"


def helm(*args: str) -> subprocess.CompletedProcess[str]:
    binary = versions.bin_dir() / "helm"
    assert binary.exists(), (
        f"{binary} missing: ./scripts/setup builds it (python -m e2e.cluster build)"
    )
    return subprocess.run([str(binary), *args], capture_output=True, text=True, check=False)


def render(*sets: str) -> list[dict[str, Any]]:
    args = [
        "template",
        "sageserve",
        str(CHART),
        "-n",
        "sageserve-system",
        "--kube-version",
        "1.36.0",
    ]
    for s in sets:
        args += ["--set", s]
    result = helm(*args)
    assert result.returncode == 0, result.stderr
    return [d for d in yaml.safe_load_all(result.stdout) if d]


def by_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def test_helm_lint_passes_with_default_and_strict_values() -> None:
    result = helm("lint", "--strict", str(CHART), "--kube-version", "1.36.0")
    assert result.returncode == 0, result.stdout + result.stderr


def test_chart_crds_are_the_generated_crds() -> None:
    ours = {p.name: p.read_bytes() for p in (ROOT / "crds").glob("*.yaml")}
    charted = {p.name: p.read_bytes() for p in (CHART / "crds").glob("*.yaml")}
    assert charted == ours, "copy crds/*.yaml into charts/sageserve/crds/"


@pytest.mark.parametrize(
    "sets",
    [
        [],
        ["dryRun=true", "logLevel=debug", "watchNamespaces={llm,batch}"],
        ["metrics.serviceMonitor.enabled=true", "dashboards.enabled=true", "replicaCount=3"],
        [
            "prometheus.auth.bearerTokenSecret.name=prom-token",
            "serviceAccount.create=false",
            "serviceAccount.name=ops",
        ],
        ["prometheus.auth.basicAuthSecret.name=prom-basic", "podDisruptionBudget.enabled=false"],
    ],
    ids=["defaults", "dry-run-namespaces", "monitoring", "bearer-token", "basic-auth"],
)
def test_value_sets_render_a_hardened_operator(sets: list[str]) -> None:
    docs = render(*sets)
    [deployment] = by_kind(docs, "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    [container] = pod["containers"]
    sc = container["securityContext"]
    assert sc == {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    env = {e["name"]: e for e in container["env"]}
    assert (
        env["SAGESERVE_LEASE_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"]
        == "metadata.namespace"
    )
    if "dryRun=true" in sets:
        assert env["SAGESERVE_DRY_RUN"]["value"] == "true"
        assert "--namespace=llm" in container["args"] and "--namespace=batch" in container["args"]
    if any(s.startswith("prometheus.auth.bearerTokenSecret") for s in sets):
        assert env["SAGESERVE_PROMETHEUS_BEARER_TOKEN_FILE"]["value"].endswith("/token")
        assert any(v.get("secret", {}).get("secretName") == "prom-token" for v in pod["volumes"])
    if "metrics.serviceMonitor.enabled=true" in sets:
        assert by_kind(docs, "ServiceMonitor") and by_kind(docs, "ConfigMap")
        assert deployment["spec"]["replicas"] == 3
    assert bool(by_kind(docs, "PodDisruptionBudget")) == (
        "podDisruptionBudget.enabled=false" not in sets
    )
    assert bool(by_kind(docs, "ServiceAccount")) == ("serviceAccount.create=false" not in sets)


def test_cluster_role_grants_no_secrets_no_wildcards_and_no_node_deletion() -> None:
    [role] = by_kind(render(), "ClusterRole")
    for rule in role["rules"]:
        assert "*" not in rule["verbs"] and "*" not in rule["resources"]
        assert "secrets" not in rule["resources"]
        if "nodes" in rule["resources"]:
            assert set(rule["verbs"]) <= {"list", "patch"}
        if "pods" in rule["resources"]:
            assert "delete" not in rule["verbs"]


@pytest.mark.parametrize(
    ("setting", "field"),
    [
        ("logLevel=loud", "logLevel"),
        ("replicaCount=0", "replicaCount"),
        ("prometheus.url=localhost:9090", "url"),
        ("promethues.url=x", "promethues"),
    ],
)
def test_bad_values_are_refused_naming_the_key(setting: str, field: str) -> None:
    result = helm("template", "x", str(CHART), "--kube-version", "1.36.0", "--set", setting)
    assert result.returncode != 0
    assert field in result.stderr


def test_dashboard_queries_are_valid_promql_over_metrics_that_exist(tmp_path: Path) -> None:
    dashboard = json.loads((CHART / "dashboards" / "sageserve.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    titles = " ".join(p["title"] for p in dashboard["panels"])
    for needed in ("Instances", "Forecast", "GPU-hours", "Donated", "Solver", "SLO"):
        assert needed in titles
    grafana = {
        "$__range_s": "3600",
        "$__range": "1h",
        "$__rate_interval": "5m",
        "$namespace": ".*",
        "$model": ".*",
    }
    rules = []
    for i, expr in enumerate(exprs):
        for var, value in grafana.items():
            expr = expr.replace(var, value)
        rules.append({"record": f"dashboard:panel{i}", "expr": expr})
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    promtool = shutil.which("promtool")
    assert promtool, "promtool missing: ./scripts/setup installs the Debian prometheus package"
    check = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    exported = set(re.findall(r"\b(sageserve_[a-z_]+)", OperatorMetrics().exposition().decode()))
    for name in re.findall(r"\b(sageserve_[a-z_]+)", " ".join(exprs)):
        base = re.sub(r"_(bucket|sum|count|total)$", "", name)
        assert name in exported or base in exported or f"{base}_total" in exported, name
