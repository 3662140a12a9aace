"""helm install into the real cluster, then the operator runs under the chart's RBAC.

`kubectl auth can-i --as` checks every permission the chart's README lists and that the
unneeded ones are denied; then the operator itself runs with the ServiceAccount's token
(not as admin) through a scale-out that reclaims a spot node, so a missing permission
shows up as a failure, not as a reasoning error in a table. The router gets the same
treatment: its ServiceAccount may only read pods, ModelDeployments, WorkloadTiers and (get)
Secrets in the namespace it serves, and `sageserve router` run with that token discovers a
model and reads a tier's API keys without a 403.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from e2e_helpers import eventually, kubectl, refused
from kopf.testing import KopfRunner
from operator_kit import FakeVllm, model_deployment, operator_args, scaling_policy, spot_workload

from e2e import versions

REPO = Path(__file__).resolve().parents[2]
RELEASE_NS = "sageserve-system"
SA = f"system:serviceaccount:{RELEASE_NS}:sageserve"
ROUTER_SA = f"system:serviceaccount:{RELEASE_NS}:sageserve-router"
REGION = "us-east"


def helm(kubeconfig: Path, *args: str) -> str:
    import subprocess

    result = subprocess.run(
        [str(versions.bin_dir() / "helm"), f"--kubeconfig={kubeconfig}", *args],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


@pytest.fixture(scope="module")
def installed(kubeconfig: Path) -> Iterator[str]:
    helm(
        kubeconfig,
        "upgrade",
        "--install",
        "sageserve",
        str(REPO / "charts" / "sageserve"),
        "-n",
        RELEASE_NS,
        "--create-namespace",
        "--set",
        "prometheus.url=http://127.0.0.1:9090",
        "--wait",
        "--timeout",
        "120s",
    )
    yield RELEASE_NS
    helm(kubeconfig, "uninstall", "sageserve", "-n", RELEASE_NS)


ALLOWED = [
    ("watch", "modeldeployments.sageserve.io", None),
    ("patch", "scalingpolicies.sageserve.io", "status"),
    ("create", "deployments.apps", None),
    ("patch", "deployments.apps", None),
    ("list", "horizontalpodautoscalers.autoscaling", None),
    ("delete", "deployments.apps", None),
    ("list", "nodes", None),
    ("patch", "nodes", None),
    ("list", "pods", None),
    ("create", "pods", "eviction"),
    ("create", "events", None),
    ("list", "customresourcedefinitions.apiextensions.k8s.io", None),
]
DENIED = [
    ("get", "secrets", None),
    ("list", "secrets", None),
    ("delete", "nodes", None),
    ("create", "nodes", None),
    ("delete", "pods", None),
    ("create", "clusterrolebindings.rbac.authorization.k8s.io", None),
    ("patch", "deployments.apps", "scale"),
    ("*", "*", None),
]


def can_i(
    kubeconfig: Path,
    verb: str,
    resource: str,
    sub: str | None,
    namespace: str = "default",
    account: str = SA,
) -> bool:
    args = ["auth", "can-i", verb, resource, f"--as={account}", "-n", namespace]
    if sub:
        args.append(f"--subresource={sub}")
    return kubectl(kubeconfig, args, check=False).stdout.strip() == "yes"


def pods_of(kubeconfig: Path, namespace: str, app: str) -> list[dict[str, Any]]:
    selector = f"app.kubernetes.io/name={app}"
    out = kubectl(kubeconfig, ["get", "pods", "-n", namespace, "-l", selector, "-o", "json"])
    return list(json.loads(out.stdout)["items"])


@pytest.mark.parametrize("app", ["sageserve", "sageserve-router"])
def test_the_operator_and_router_pods_run_hardened(
    kubeconfig: Path, installed: str, app: str
) -> None:
    pods = pods_of(kubeconfig, installed, app)
    assert len(pods) == 2
    for pod in pods:
        assert pod["status"]["phase"] == "Running"
        [container] = pod["spec"]["containers"]
        assert container["securityContext"]["readOnlyRootFilesystem"] is True
        assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
        assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
    crds = kubectl(kubeconfig, ["get", "crd", "-o", "name"]).stdout
    assert "modeldeployments.sageserve.io" in crds


@pytest.mark.parametrize(("verb", "resource", "sub"), ALLOWED)
def test_needed_permission_is_granted(
    kubeconfig: Path, installed: str, verb: str, resource: str, sub: str | None
) -> None:
    assert can_i(kubeconfig, verb, resource, sub)


@pytest.mark.parametrize(("verb", "resource", "sub"), DENIED)
def test_unneeded_permission_is_denied(
    kubeconfig: Path, installed: str, verb: str, resource: str, sub: str | None
) -> None:
    assert not can_i(kubeconfig, verb, resource, sub)


def test_leases_only_in_the_release_namespace(kubeconfig: Path, installed: str) -> None:
    assert can_i(kubeconfig, "update", "leases.coordination.k8s.io", None, installed)
    assert not can_i(kubeconfig, "update", "leases.coordination.k8s.io", None, "default")


ROUTER_ALLOWED = [
    ("list", "pods", None),
    ("watch", "pods", None),
    ("list", "modeldeployments.sageserve.io", None),
    ("watch", "modeldeployments.sageserve.io", None),
    ("list", "workloadtiers.sageserve.io", None),
    ("watch", "workloadtiers.sageserve.io", None),
    ("list", "scalingpolicies.sageserve.io", None),
    ("watch", "scalingpolicies.sageserve.io", None),
    ("get", "secrets", None),
]
ROUTER_DENIED = [
    ("list", "secrets", None),
    ("watch", "secrets", None),
    ("create", "pods", None),
    ("delete", "pods", None),
    ("create", "pods", "eviction"),
    ("patch", "modeldeployments.sageserve.io", None),
    ("patch", "modeldeployments.sageserve.io", "status"),
    ("update", "workloadtiers.sageserve.io", None),
    ("patch", "scalingpolicies.sageserve.io", "status"),
    ("patch", "deployments.apps", None),
    ("update", "leases.coordination.k8s.io", None),
    ("create", "events", None),
    ("*", "*", None),
]


@pytest.mark.parametrize(("verb", "resource", "sub"), ROUTER_ALLOWED)
def test_router_reads_what_discovery_needs_in_the_namespace_it_serves_only(
    kubeconfig: Path, installed: str, verb: str, resource: str, sub: str | None
) -> None:
    assert can_i(kubeconfig, verb, resource, sub, installed, ROUTER_SA)
    assert not can_i(kubeconfig, verb, resource, sub, "default", ROUTER_SA)


@pytest.mark.parametrize(("verb", "resource", "sub"), ROUTER_DENIED)
def test_router_writes_nothing(
    kubeconfig: Path, installed: str, verb: str, resource: str, sub: str | None
) -> None:
    assert not can_i(kubeconfig, verb, resource, sub, installed, ROUTER_SA)


def sa_kubeconfig(admin: Path, tmp_path: Path, account: str = "sageserve") -> Path:
    """A kubeconfig that authenticates as one of the chart's ServiceAccounts (a bound token)."""
    token = kubectl(
        admin, ["create", "token", account, "-n", RELEASE_NS, "--duration=1h"]
    ).stdout.strip()
    config = yaml.safe_load(admin.read_text())
    config["users"] = [{"name": account, "user": {"token": token}}]
    for context in config["contexts"]:
        context["context"]["user"] = account
    path = tmp_path / f"{account}-kubeconfig.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def router_objects(namespace: str) -> list[dict[str, Any]]:
    """Two tiers (iw-n recognised by an API key from a Secret) and a model serving both."""
    model = model_deployment([REGION], name="router-rbac")
    model["metadata"]["namespace"] = namespace
    model["spec"]["model"] = {"name": "org/router-rbac"}
    model["spec"]["tiers"] = ["iw-f", "iw-n"]
    return [
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "router-rbac-keys", "namespace": namespace},
            "stringData": {"team-a": "sk-router-rbac"},
        },
        {
            "apiVersion": "sageserve.io/v1alpha1",
            "kind": "WorkloadTier",
            "metadata": {"name": "iw-f", "namespace": namespace},
            "spec": {"type": "interactive", "priority": 0, "slo": {"ttftP95Seconds": 1}},
        },
        {
            "apiVersion": "sageserve.io/v1alpha1",
            "kind": "WorkloadTier",
            "metadata": {"name": "iw-n", "namespace": namespace},
            "spec": {
                "type": "interactive",
                "priority": 1,
                "slo": {"ttftP95Seconds": 60},
                "match": {"apiKeysSecretRef": {"name": "router-rbac-keys"}},
            },
        },
        model,
    ]


def test_the_router_discovers_and_reads_tier_keys_with_only_the_charts_permissions(
    kubeconfig: Path, installed: str, prometheus_url: str, tmp_path: Path
) -> None:
    """`sageserve router` with the router ServiceAccount's token, as the chart runs it (its
    namespaces: the release namespace by default): it lists and watches the model and the
    tiers, and reads the tier's API keys from the Secret, all without a 403."""
    import os
    import subprocess
    import sys
    import threading
    import urllib.error
    import urllib.request

    docs = router_objects(installed)
    kubectl(kubeconfig, ["apply", "-f", "-"], stdin=yaml.safe_dump_all(docs))
    account = sa_kubeconfig(kubeconfig, tmp_path, "sageserve-router")
    args = ["router", "-n", installed, "--host", "127.0.0.1", "--port", "0"]
    args += ["--hold-seconds", "0", "--prometheus-url", prometheus_url]
    proc = subprocess.Popen(
        [sys.executable, "-m", "sageserve.cli", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "KUBECONFIG": str(account)},
        cwd=REPO,
    )
    lines: list[str] = []
    assert proc.stdout is not None
    out = proc.stdout

    def read() -> None:
        for line in out:
            lines.append(line)

    threading.Thread(target=read, daemon=True).start()
    try:
        listening = eventually(
            lambda: next((ln for ln in lines if "listening on" in ln), None), 60, "router up"
        )
        base = "http://" + listening.split("listening on ")[1].strip()

        def get(path: str) -> str:
            keyed = urllib.request.Request(
                base + path, headers={"Authorization": "Bearer sk-router-rbac"}
            )
            try:
                with urllib.request.urlopen(keyed, timeout=5) as resp:
                    return str(resp.read().decode())
            except urllib.error.HTTPError as exc:  # the key not read yet: 401
                return f"HTTP {exc.code}"

        def tier_of_keyed_request() -> bool:
            request = urllib.request.Request(
                base + "/v1/completions",
                data=json.dumps({"model": "org/router-rbac", "prompt": "hi"}).encode(),
                headers={
                    "Content-Type": "application/json",
                    "Authorization": "Bearer sk-router-rbac",
                },
            )
            try:
                urllib.request.urlopen(request, timeout=5)
            except urllib.error.HTTPError as exc:
                assert exc.code == 503, exc.read()  # no pod: not held (--hold-seconds 0)
            return 'tier="iw-n"' in get("/metrics")

        eventually(lambda: "org/router-rbac" in get("/v1/models"), 60, "the model discovered")
        eventually(tier_of_keyed_request, 60, "the API key from the Secret picks tier iw-n")
        output = "".join(lines)
        assert not refused(output), output
        assert "unreadable" not in output and "watch failed" not in output, output
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        for doc in docs:
            kubectl(
                kubeconfig,
                ["delete", doc["kind"].lower(), doc["metadata"]["name"], "-n", installed],
                check=False,
            )


@pytest.mark.usefixtures("restore_node_pools")
def test_the_operator_scales_and_reclaims_with_only_the_charts_permissions(
    kubeconfig: Path,
    installed: str,
    prometheus_url: str,
    prometheus_targets_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    namespace = f"rbac-{uuid.uuid4().hex[:6]}"
    kubectl(kubeconfig, ["create", "namespace", namespace])
    kubectl(kubeconfig, ["apply", "-n", namespace, "-f", str(REPO / "policies/base/tiers.yaml")])
    spot = spot_workload(REGION)
    kubectl(kubeconfig, ["apply", "-n", namespace, "-f", "-"], stdin=yaml.safe_dump(spot))
    fake = FakeVllm()
    fake.set(0.9)
    target_file = fake.scrape(prometheus_targets_dir, namespace, REGION, kubeconfig)
    for key, value in {
        "KUBECONFIG": str(sa_kubeconfig(kubeconfig, tmp_path)),
        "SAGESERVE_PROMETHEUS_URL": prometheus_url,
        "SAGESERVE_NAMESPACES": namespace,
        "SAGESERVE_LEASE_NAMESPACE": RELEASE_NS,
        "SAGESERVE_METRICS_PORT": "0",
        "SAGESERVE_INFERENCE_POOLS": "off",  # the chart's default (gateway.inferencePool)
    }.items():
        monkeypatch.setenv(key, value)
    policy = scaling_policy("reactive")
    model = model_deployment([REGION], gpus=8, theta=1800)

    def running() -> int:
        pods = json.loads(
            kubectl(
                kubeconfig,
                [
                    "get",
                    "pods",
                    "-n",
                    namespace,
                    "-l",
                    "sageserve.io/model-deployment=llama8b",
                    "-o",
                    "json",
                ],
            ).stdout
        )["items"]
        return sum(p["status"].get("phase") == "Running" for p in pods)

    args = operator_args(namespace)
    try:
        with KopfRunner(args, timeout=180) as runner:
            for doc in (policy, model):
                kubectl(
                    kubeconfig, ["apply", "-n", namespace, "-f", "-"], stdin=yaml.safe_dump(doc)
                )
            eventually(lambda: running() == 2, 120, "two instances, one on a reclaimed spot node")
            md = json.loads(
                kubectl(
                    kubeconfig, ["get", "modeldeployment", "llama8b", "-n", namespace, "-o", "json"]
                ).stdout
            )
            assert [c["status"] for c in md["status"]["conditions"] if c["type"] == "Ready"] == [
                "True"
            ]
            events = kubectl(kubeconfig, ["get", "events", "-n", namespace, "-o", "json"]).stdout
            assert "ScaledOut" in events and "Reclaimed" in events
        assert runner.exception is None, runner.output
        assert not refused(runner.output), runner.output
    finally:
        fake.close()
        target_file.unlink(missing_ok=True)
        kubectl(kubeconfig, ["delete", "namespace", namespace, "--wait=false"], check=False)
