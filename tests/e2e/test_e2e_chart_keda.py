"""helm install with `keda.enabled=true` into the real cluster, next to a default install.

What a platform team turning on `actuation: keda` relies on: the chart puts the operator's
external scaler behind a Service (gRPC, on the operator pods), starts the operator with the
scaler's listen and dial addresses, and grants its ServiceAccount exactly what it does with
`keda.sh` ScaledObjects (get, list, create, patch, delete) in every namespace it manages;
a default install (the value off) grants none of it (least privilege). KEDA's CRDs are
applied (no KEDA running) so the ScaledObject writes with the ServiceAccount's token go
through the real API server: a missing grant is a 403, not a line in a table.

Two releases, so that each test reads the state it names and no test depends on another's
upgrade: `sageserve-keda` (keda.enabled=true) and `sageserve-plain` (the defaults).
"""

from __future__ import annotations

import json
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from e2e_helpers import kubectl

from e2e import keda as keda_kit
from e2e import versions

REPO = Path(__file__).resolve().parents[2]
SCALER_PORT = 9100  # the chart's keda.port default


@dataclass(frozen=True)
class Release:
    """One helm release of the chart (release name == fullname == ServiceAccount name)."""

    name: str
    namespace: str

    @property
    def account(self) -> str:
        return f"system:serviceaccount:{self.namespace}:{self.name}"


KEDA = Release("sageserve-keda", "sageserve-keda-system")
PLAIN = Release("sageserve-plain", "sageserve-plain-system")


def helm(kubeconfig: Path, *args: str) -> str:
    result = subprocess.run(
        [str(versions.bin_dir() / "helm"), f"--kubeconfig={kubeconfig}", *args],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def install(kubeconfig: Path, release: Release, *values: str) -> None:
    sets = [
        arg
        for value in ("prometheus.url=http://127.0.0.1:9090", *values)
        for arg in ("--set", value)
    ]
    helm(
        kubeconfig,
        "upgrade",
        "--install",
        release.name,
        str(REPO / "charts" / "sageserve"),
        "-n",
        release.namespace,
        "--create-namespace",
        *sets,
        "--wait",
        "--timeout",
        "120s",
    )


@pytest.fixture(scope="module")
def managed_namespace(kubeconfig: Path) -> Iterator[str]:
    """KEDA's CRDs (ScaledObject's schema, no KEDA), both releases, and a fresh namespace
    of the kind the operator manages (watchNamespaces empty: all of them)."""
    keda_kit.apply_crds(kubeconfig)
    install(kubeconfig, KEDA, "keda.enabled=true")
    install(kubeconfig, PLAIN)
    namespace = f"keda-rbac-{uuid.uuid4().hex[:6]}"
    kubectl(kubeconfig, ["create", "namespace", namespace])
    yield namespace
    kubectl(kubeconfig, ["delete", "namespace", namespace, "--wait=false"], check=False)
    for release in (KEDA, PLAIN):
        helm(kubeconfig, "uninstall", release.name, "-n", release.namespace)
        kubectl(kubeconfig, ["delete", "namespace", release.namespace, "--wait=false"], check=False)


def get_json(kubeconfig: Path, *args: str) -> dict[str, Any]:
    return dict(json.loads(kubectl(kubeconfig, ["get", *args, "-o", "json"]).stdout))


def operator_container(kubeconfig: Path, release: Release) -> dict[str, Any]:
    deployment = get_json(kubeconfig, "deployment", release.name, "-n", release.namespace)
    [container] = deployment["spec"]["template"]["spec"]["containers"]
    return dict(container)


def test_the_scaler_service_reaches_the_operator_pods_on_the_grpc_port(
    kubeconfig: Path, managed_namespace: str
) -> None:
    service = get_json(kubeconfig, "service", f"{KEDA.name}-scaler", "-n", KEDA.namespace)
    assert service["spec"]["ports"] == [
        {
            "name": "scaler",
            "port": SCALER_PORT,
            "targetPort": "scaler",
            "protocol": "TCP",
            "appProtocol": "grpc",
        }
    ]
    selector = ",".join(f"{k}={v}" for k, v in service["spec"]["selector"].items())
    pods = get_json(kubeconfig, "pods", "-n", KEDA.namespace, "-l", selector)["items"]
    assert len(pods) == 2, "the selector picks the two operator replicas"
    assert all(p["metadata"]["name"].startswith(f"{KEDA.name}-") for p in pods)
    assert not any("router" in p["metadata"]["name"] for p in pods)
    # targetPort `scaler` resolves, on every pod the Service selects, to the running
    # operator container's port of that name. (This cluster's pods have loopback IPs, which
    # an EndpointSlice may not hold, so the resolution is read off the pods themselves.)
    for pod in pods:
        assert pod["status"]["phase"] == "Running"
        [container] = pod["spec"]["containers"]
        named = {p["name"]: p["containerPort"] for p in container["ports"]}
        assert named.get("scaler") == SCALER_PORT, pod["metadata"]["name"]
    services = kubectl(kubeconfig, ["get", "services", "-n", PLAIN.namespace, "-o", "name"])
    assert "scaler" not in services.stdout, "no scaler Service without keda.enabled"


def test_the_operator_is_started_with_the_scaler_flags(
    kubeconfig: Path, managed_namespace: str
) -> None:
    container = operator_container(kubeconfig, KEDA)
    address = f"{KEDA.name}-scaler.{KEDA.namespace}.svc:{SCALER_PORT}"
    assert f"--scaler-listen=0.0.0.0:{SCALER_PORT}" in container["args"]
    assert f"--scaler-address={address}" in container["args"]
    assert {"name": "scaler", "containerPort": SCALER_PORT, "protocol": "TCP"} in container["ports"]
    # the address the ScaledObjects' triggers dial is the Service's, on the Service's port
    service = get_json(kubeconfig, "service", f"{KEDA.name}-scaler", "-n", KEDA.namespace)
    host, port = address.rsplit(":", 1)
    assert host == f"{service['metadata']['name']}.{service['metadata']['namespace']}.svc"
    assert int(port) == service["spec"]["ports"][0]["port"]
    plain = operator_container(kubeconfig, PLAIN)
    assert not [a for a in plain["args"] if a.startswith("--scaler-")]
    assert "scaler" not in [p["name"] for p in plain["ports"]]


def test_only_kedas_operator_may_dial_the_scaler_port(
    kubeconfig: Path, managed_namespace: str
) -> None:
    policy = get_json(kubeconfig, "networkpolicy", f"{KEDA.name}-scaler", "-n", KEDA.namespace)
    assert policy["spec"]["policyTypes"] == ["Ingress"]
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


def can_i(kubeconfig: Path, release: Release, verb: str, resource: str, namespace: str) -> bool:
    args = ["auth", "can-i", verb, resource, f"--as={release.account}", "-n", namespace]
    return kubectl(kubeconfig, args, check=False).stdout.strip() == "yes"


NEEDED = ["get", "list", "create", "patch", "delete"]


@pytest.mark.parametrize("verb", NEEDED)
def test_scaledobjects_are_granted_only_with_keda_enabled(
    kubeconfig: Path, managed_namespace: str, verb: str
) -> None:
    for namespace in ("default", managed_namespace):
        assert can_i(kubeconfig, KEDA, verb, "scaledobjects.keda.sh", namespace), namespace
        assert not can_i(kubeconfig, PLAIN, verb, "scaledobjects.keda.sh", namespace), namespace


@pytest.mark.parametrize(
    ("verb", "resource"),
    [
        ("watch", "scaledobjects.keda.sh"),
        ("update", "scaledobjects.keda.sh"),
        ("deletecollection", "scaledobjects.keda.sh"),
        ("create", "scaledjobs.keda.sh"),
        ("create", "triggerauthentications.keda.sh"),
        ("create", "clustertriggerauthentications.keda.sh"),
        ("patch", "deployments.apps/scale"),
        ("get", "secrets"),
    ],
)
def test_keda_enabled_grants_nothing_more(
    kubeconfig: Path, managed_namespace: str, verb: str, resource: str
) -> None:
    resource, _, sub = resource.partition("/")
    args = ["auth", "can-i", verb, resource, f"--as={KEDA.account}", "-n", managed_namespace]
    if sub:
        args.append(f"--subresource={sub}")
    assert kubectl(kubeconfig, args, check=False).stdout.strip() == "no"


def token_kubeconfig(admin: Path, release: Release, tmp_path: Path) -> Path:
    """A kubeconfig that authenticates as the release's operator ServiceAccount."""
    token = kubectl(
        admin, ["create", "token", release.name, "-n", release.namespace, "--duration=10m"]
    ).stdout.strip()
    config = yaml.safe_load(admin.read_text())
    config["users"] = [{"name": release.name, "user": {"token": token}}]
    for context in config["contexts"]:
        context["context"]["user"] = release.name
    path = tmp_path / f"{release.name}-kubeconfig.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def scaled_object(namespace: str) -> dict[str, Any]:
    return {
        "apiVersion": "keda.sh/v1alpha1",
        "kind": "ScaledObject",
        "metadata": {
            "name": "llama8b-us-east",
            "namespace": namespace,
            "labels": {"app.kubernetes.io/managed-by": "sageserve"},
        },
        "spec": {
            "scaleTargetRef": {"name": "llama8b-us-east"},
            "minReplicaCount": 0,
            "triggers": [
                {
                    "type": "external",
                    "metadata": {
                        "scalerAddress": f"{KEDA.name}-scaler.{KEDA.namespace}.svc:{SCALER_PORT}"
                    },
                }
            ],
        },
    }


def test_the_operators_token_writes_scaledobjects_only_with_keda_enabled(
    kubeconfig: Path, managed_namespace: str, tmp_path: Path
) -> None:
    """Server-side apply (create, then patch), list and delete a ScaledObject with each
    operator's own token, as the operator does; the default install's token gets 403."""
    doc = yaml.safe_dump(scaled_object(managed_namespace))
    apply = ["apply", "--server-side", "--field-manager=sageserve", "-f", "-"]
    name = "scaledobject/llama8b-us-east"

    plain = token_kubeconfig(kubeconfig, PLAIN, tmp_path)
    denied = kubectl(plain, apply, stdin=doc, check=False)
    assert denied.returncode != 0 and "forbidden" in denied.stderr.lower(), denied.stderr
    denied = kubectl(plain, ["get", "scaledobjects", "-n", managed_namespace], check=False)
    assert denied.returncode != 0 and "forbidden" in denied.stderr.lower(), denied.stderr

    account = token_kubeconfig(kubeconfig, KEDA, tmp_path)
    kubectl(account, apply, stdin=doc)  # create
    patched = scaled_object(managed_namespace)
    patched["spec"]["minReplicaCount"] = 1
    kubectl(account, apply, stdin=yaml.safe_dump(patched))  # patch
    listed = get_json(
        account, "scaledobjects", "-n", managed_namespace, "-l", "app.kubernetes.io/managed-by"
    )
    assert [(o["metadata"]["name"], o["spec"]["minReplicaCount"]) for o in listed["items"]] == [
        ("llama8b-us-east", 1)
    ]
    kubectl(account, ["delete", name, "-n", managed_namespace, "--wait=false"])
    gone = kubectl(kubeconfig, ["get", name, "-n", managed_namespace], check=False)
    assert gone.returncode != 0 and "NotFound" in gone.stderr, gone.stdout + gone.stderr
