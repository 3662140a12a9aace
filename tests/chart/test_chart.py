"""The Helm chart rendered by the real helm binary: lint, value sets, hardening, CRDs."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import typer
import yaml

from e2e import versions
from sageserve.cli import app as cli_app
from sageserve.metrics.exporter import OperatorMetrics
from sageserve.router.metrics import RouterMetrics

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "sageserve"
ROUTER_NAME = "sageserve-router"

#: helm (built from Go modules by scripts/setup) renders every test's chart
pytestmark = pytest.mark.integration


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


def app_name(doc: dict[str, Any]) -> str | None:
    return ((doc.get("metadata") or {}).get("labels") or {}).get("app.kubernetes.io/name")


def operator_docs(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The operator's objects (the router's carry app.kubernetes.io/name=sageserve-router)."""
    return [d for d in docs if app_name(d) != ROUTER_NAME]


def router_docs(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [d for d in docs if app_name(d) == ROUTER_NAME]


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
    docs = operator_docs(render(*sets))
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
        [monitor] = by_kind(docs, "ServiceMonitor")
        assert monitor["spec"]["selector"]["matchLabels"]["app.kubernetes.io/name"] == "sageserve"
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
    for needed in ("Instances", "Forecast", "GPU-hours", "Donated", "Solver", "SLO", "Router"):
        assert needed in titles
    joined = " ".join(exprs)
    for router_metric in (
        "sageserve_router_requests_total",
        "sageserve_router_ttft_seconds_bucket",
        "sageserve_router_held_requests",
        "sageserve_router_retries_total",
    ):
        assert router_metric in joined, router_metric
    assert "by (tier, code)" in joined and "by (tier, le)" in joined
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
    exposition = OperatorMetrics().exposition().decode() + RouterMetrics().exposition()[0].decode()
    exported = set(re.findall(r"\b(sageserve_[a-z_]+)", exposition))
    for name in re.findall(r"\b(sageserve_[a-z_]+)", " ".join(exprs)):
        base = re.sub(r"_(bucket|sum|count|total)$", "", name)
        assert name in exported or base in exported or f"{base}_total" in exported, name


# ---- the router ----------------------------------------------------------------------------

READ_VERBS = {"get", "list", "watch"}


def labels_match(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def router_cli_params(args: list[str]) -> dict[str, Any]:
    """The chart's arguments parsed by the real `sageserve router` command line."""
    assert args[0] == "router"
    command = typer.main.get_command(cli_app).commands["router"]  # type: ignore[attr-defined]
    return dict(command.make_context("router", list(args[1:])).params)


@pytest.mark.parametrize(
    ("sets", "namespaces"),
    [
        ([], ["sageserve-system"]),
        (["watchNamespaces={llm,batch}"], ["llm", "batch"]),
        (["watchNamespaces={llm,batch}", "router.namespaces={llm}"], ["llm"]),
        (
            [
                "router.region=us-east",
                "router.backendUrl=http://{pod}.{namespace}.svc:{port}",
                "router.maxBodyBytes=1048576",
                "router.holdSeconds=30",
                "router.maxHeldRequests=50",
                "router.maxInflightBytes=67108864",
                "router.maxOutputTokens=8192",
                "router.port=9000",
                "router.replicaCount=3",
            ],
            ["sageserve-system"],
        ),
    ],
    ids=["defaults", "watch-namespaces", "router-namespaces", "flags"],
)
def test_the_router_renders_hardened_like_the_operator(
    sets: list[str], namespaces: list[str]
) -> None:
    docs = render(*sets)
    [operator] = by_kind(operator_docs(docs), "Deployment")
    [router] = by_kind(router_docs(docs), "Deployment")
    assert router["metadata"]["name"] == "sageserve-router"
    assert router["spec"]["replicas"] == (3 if "router.replicaCount=3" in sets else 2)
    pod = router["spec"]["template"]["spec"]
    op_pod = operator["spec"]["template"]["spec"]
    assert pod["securityContext"] == op_pod["securityContext"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    [container] = pod["containers"]
    assert container["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }
    assert container["resources"]["requests"] and container["resources"]["limits"]
    # alive once it listens; ready (in the Service) once discovery has listed the cluster
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    port = 9000 if "router.port=9000" in sets else 8080
    assert container["ports"] == [{"name": "http", "containerPort": port, "protocol": "TCP"}]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["SAGESERVE_PROMETHEUS_URL"].startswith("http")
    params = router_cli_params(container["args"])
    assert params["batch_db"] == "off"  # the Batch API needs a storage decision: off
    assert params["auth"] == "required"  # every request carries a key by default
    assert params["namespace"] == namespaces
    assert params["port"] == port and params["host"] == "0.0.0.0"
    if "router.region=us-east" in sets:
        assert params["region"] == "us-east"
        assert params["backend_url"] == "http://{pod}.{namespace}.svc:{port}"
        assert params["max_body_bytes"] == 1048576 and params["hold_seconds"] == 30.0
        assert params["max_held_requests"] == 50
        assert params["max_inflight_bytes"] == 64 * 1024 * 1024
        assert params["max_output_tokens"] == 8192
    else:
        assert params["region"] is None
        assert params["backend_url"] == "http://{pod_ip}:{port}"
        assert params["max_body_bytes"] == 8 * 1024 * 1024 and params["hold_seconds"] == 120.0
        assert params["max_held_requests"] == 1000
        assert params["max_inflight_bytes"] == 128 * 1024 * 1024
        assert params["max_output_tokens"] == 131072

    # its own ServiceAccount, a Service 80 -> http, a PodDisruptionBudget of its pods only
    [account] = by_kind(router_docs(docs), "ServiceAccount")
    assert pod["serviceAccountName"] == account["metadata"]["name"] == "sageserve-router"
    assert op_pod["serviceAccountName"] != account["metadata"]["name"]
    [service] = by_kind(router_docs(docs), "Service")
    assert service["spec"]["ports"] == [
        {"name": "http", "port": 80, "targetPort": "http", "protocol": "TCP"}
    ]
    pod_labels = router["spec"]["template"]["metadata"]["labels"]
    op_pod_labels = operator["spec"]["template"]["metadata"]["labels"]
    assert labels_match(service["spec"]["selector"], pod_labels)
    [pdb] = by_kind(router_docs(docs), "PodDisruptionBudget")
    assert pdb["spec"]["minAvailable"] == 1
    assert labels_match(pdb["spec"]["selector"]["matchLabels"], pod_labels)
    # no selector of one matches the other's pods
    assert not labels_match(operator["spec"]["selector"]["matchLabels"], pod_labels)
    assert not labels_match(router["spec"]["selector"]["matchLabels"], op_pod_labels)
    for op_service in by_kind(operator_docs(docs), "Service"):
        assert not labels_match(op_service["spec"]["selector"], pod_labels)
    assert not labels_match(service["spec"]["selector"], op_pod_labels)


@pytest.mark.parametrize(
    ("sets", "namespaces"),
    [([], {"sageserve-system"}), (["watchNamespaces={llm,batch}"], {"llm", "batch"})],
    ids=["release-namespace", "watch-namespaces"],
)
def test_router_rbac_is_read_only_and_scoped_to_the_namespaces_it_serves(
    sets: list[str], namespaces: set[str]
) -> None:
    docs = render(*sets)
    router = router_docs(docs)
    assert not by_kind(router, "ClusterRole") and not by_kind(router, "ClusterRoleBinding")
    roles = by_kind(router, "Role")
    bindings = by_kind(router, "RoleBinding")
    assert {r["metadata"]["namespace"] for r in roles} == namespaces
    assert {b["metadata"]["namespace"] for b in bindings} == namespaces
    granted: dict[tuple[str, str], set[str]] = {}
    for role in roles:
        for rule in role["rules"]:
            assert "*" not in rule["verbs"] and "*" not in rule["resources"]
            assert "*" not in rule["apiGroups"]
            assert set(rule["verbs"]) <= READ_VERBS, rule
            for group in rule["apiGroups"]:
                for resource in rule["resources"]:
                    granted.setdefault((group, resource), set()).update(rule["verbs"])
    assert granted == {
        ("", "pods"): {"list", "watch"},
        ("sageserve.io", "modeldeployments"): {"list", "watch"},
        ("sageserve.io", "modelpools"): {"list", "watch"},  # pooled models (Aegaeon)
        ("sageserve.io", "workloadtiers"): {"list", "watch"},
        ("sageserve.io", "scalingpolicies"): {"list", "watch"},  # the plan's spill-over
        ("", "secrets"): {"get"},
    }
    for binding in bindings:
        assert binding["roleRef"] == {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "Role",
            "name": "sageserve-router",
        }
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": "sageserve-router", "namespace": "sageserve-system"}
        ]
    # the operator's ClusterRole stays the operator's alone
    [cluster_binding] = by_kind(docs, "ClusterRoleBinding")
    assert [s["name"] for s in cluster_binding["subjects"]] == ["sageserve"]


def test_router_service_monitor_keeps_the_endpoint_labels() -> None:
    assert not by_kind(render(), "ServiceMonitor")
    docs = render("metrics.serviceMonitor.enabled=true", "metrics.serviceMonitor.labels.team=ml")
    [monitor] = by_kind(router_docs(docs), "ServiceMonitor")
    [service] = by_kind(router_docs(docs), "Service")
    assert monitor["metadata"]["labels"]["team"] == "ml"
    assert labels_match(monitor["spec"]["selector"]["matchLabels"], service["metadata"]["labels"])
    [endpoint] = monitor["spec"]["endpoints"]
    assert endpoint["honorLabels"] is True
    assert endpoint["port"] == "http" and endpoint["path"] == "/metrics"
    [op_monitor] = by_kind(operator_docs(docs), "ServiceMonitor")
    assert not labels_match(
        op_monitor["spec"]["selector"]["matchLabels"], service["metadata"]["labels"]
    )


@pytest.mark.parametrize(
    "sets",
    [[], ["metrics.serviceMonitor.enabled=true", "dashboards.enabled=true"]],
    ids=["defaults", "monitoring"],
)
def test_router_disabled_removes_everything_router_related(sets: list[str]) -> None:
    enabled = render(*sets)
    disabled = render(*sets, "router.enabled=false")
    assert router_docs(enabled) and not router_docs(disabled)
    assert "router" not in yaml.safe_dump_all(
        [d for d in disabled if d["kind"] != "ConfigMap"]  # the dashboard keeps its panels
    )
    assert disabled == operator_docs(enabled)


def test_router_service_account_can_be_an_existing_one() -> None:
    docs = render("router.serviceAccount.create=false", "router.serviceAccount.name=gateway")
    assert not by_kind(router_docs(docs), "ServiceAccount")
    [router] = by_kind(router_docs(docs), "Deployment")
    assert router["spec"]["template"]["spec"]["serviceAccountName"] == "gateway"
    for binding in by_kind(router_docs(docs), "RoleBinding"):
        assert binding["subjects"][0]["name"] == "gateway"
    assert not by_kind(
        router_docs(render("router.podDisruptionBudget.enabled=false")), "PodDisruptionBudget"
    )


def test_the_batch_queue_on_sqlite_is_one_replica_on_a_kept_volume() -> None:
    docs = router_docs(render("router.batch.enabled=true", "router.replicaCount=1"))
    [router] = by_kind(docs, "Deployment")
    [claim] = by_kind(docs, "PersistentVolumeClaim")
    assert router["spec"]["strategy"] == {"type": "Recreate"}
    pod = router["spec"]["template"]["spec"]
    [container] = pod["containers"]
    params = router_cli_params(container["args"])
    assert params["batch_db"] == "sqlite:////var/lib/sageserve/batch.db"
    assert params["batch_lease_seconds"] == 120.0
    assert params["batch_retention_seconds"] == 30 * 86400.0
    assert {"name": "queue", "mountPath": "/var/lib/sageserve"} in container["volumeMounts"]
    volume = next(v for v in pod["volumes"] if v["name"] == "queue")
    assert volume["persistentVolumeClaim"]["claimName"] == claim["metadata"]["name"]
    assert claim["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    owner = next(e for e in container["env"] if e["name"] == "POD_NAME")
    assert owner["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"


def test_several_router_replicas_share_a_postgresql_queue_from_a_secret() -> None:
    docs = router_docs(
        render("router.batch.enabled=true", "router.batch.database.existingSecret=queue-db")
    )
    [router] = by_kind(docs, "Deployment")
    assert router["spec"]["replicas"] == 2 and not by_kind(docs, "PersistentVolumeClaim")
    [container] = router["spec"]["template"]["spec"]["containers"]
    url = next(e for e in container["env"] if e["name"] == "SAGESERVE_BATCH_DB_URL")
    assert url["valueFrom"]["secretKeyRef"] == {"name": "queue-db", "key": "url"}
    assert not any(a.startswith("--batch-db") for a in container["args"])  # the env's URL


def test_sqlite_with_several_router_replicas_is_refused_with_the_fix() -> None:
    result = helm(
        "template",
        "x",
        str(CHART),
        "--kube-version",
        "1.36.0",
        "--set",
        "router.batch.enabled=true",
    )
    assert result.returncode != 0
    assert "router.batch.database.existingSecret" in result.stderr
    assert "router.replicaCount=1" in result.stderr


@pytest.mark.parametrize(
    ("setting", "field"),
    [
        ("router.port=80", "port"),
        ("router.holdSeconds=soon", "holdSeconds"),
        ("router.backendUrl=10.0.0.1:8000", "backendUrl"),
        ("router.namespaces={Bad_NS}", "namespaces"),
        ("router.replicas=2", "replicas"),
        ("router.batch.sqlite.size=lots", "size"),
        ("router.batch.leaseSeconds=forever", "leaseSeconds"),
        ("router.auth=off", "auth"),
        ("router.keyResyncSeconds=0", "keyResyncSeconds"),
        ("router.batch.retentionSeconds=60", "retentionSeconds"),
    ],
)
def test_bad_router_values_are_refused_naming_the_key(setting: str, field: str) -> None:
    result = helm("template", "x", str(CHART), "--kube-version", "1.36.0", "--set", setting)
    assert result.returncode != 0
    assert field in result.stderr
