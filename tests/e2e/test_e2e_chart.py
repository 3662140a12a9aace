"""helm install into the real cluster, then the operator runs under the chart's RBAC.

`kubectl auth can-i --as` checks every permission the chart's README lists and that the
unneeded ones are denied; then the operator itself runs with the ServiceAccount's token
(not as admin) through a scale-out that reclaims a spot node, so a missing permission
shows up as a failure, not as a reasoning error in a table.
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
from operator_kit import FakeVllm, model_deployment, operator_args, scaling_policy, spot_workload

from e2e import versions

REPO = Path(__file__).resolve().parents[2]
RELEASE_NS = "sageserve-system"
SA = f"system:serviceaccount:{RELEASE_NS}:sageserve"
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
    ("patch", "deployments.apps", "scale"),
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
    ("*", "*", None),
]


def can_i(
    kubeconfig: Path, verb: str, resource: str, sub: str | None, namespace: str = "default"
) -> bool:
    args = ["auth", "can-i", verb, resource, f"--as={SA}", "-n", namespace]
    if sub:
        args.append(f"--subresource={sub}")
    return kubectl(kubeconfig, args, check=False).stdout.strip() == "yes"


def test_the_operator_pods_run_hardened(kubeconfig: Path, installed: str) -> None:
    pods = json.loads(kubectl(kubeconfig, ["get", "pods", "-n", installed, "-o", "json"]).stdout)[
        "items"
    ]
    assert len(pods) == 2
    for pod in pods:
        assert pod["status"]["phase"] == "Running"
        [container] = pod["spec"]["containers"]
        assert container["securityContext"]["readOnlyRootFilesystem"] is True
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


def sa_kubeconfig(admin: Path, tmp_path: Path) -> Path:
    """A kubeconfig that authenticates as the chart's ServiceAccount (a bound token)."""
    token = kubectl(
        admin, ["create", "token", "sageserve", "-n", RELEASE_NS, "--duration=1h"]
    ).stdout.strip()
    config = yaml.safe_load(admin.read_text())
    config["users"] = [{"name": "sageserve", "user": {"token": token}}]
    for context in config["contexts"]:
        context["context"]["user"] = "sageserve"
    path = tmp_path / "sa-kubeconfig.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


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
        assert "Forbidden" not in runner.output and "403" not in runner.output, runner.output
    finally:
        fake.close()
        target_file.unlink(missing_ok=True)
        kubectl(kubeconfig, ["delete", "namespace", namespace, "--wait=false"], check=False)
