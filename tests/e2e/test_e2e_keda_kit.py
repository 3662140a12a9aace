"""KEDA on the test cluster, end to end: a ScaledObject whose trigger value this test
serves over real HTTP moves a Deployment's replicas.

What a platform team relies on when it hands scaling to KEDA: KEDA creates the HPA
`keda-hpa-<name>`; the HPA controller reads the value through the API server's
`external.metrics.k8s.io` (KEDA's metrics adapter behind the aggregation layer) and is the
writer of `spec.replicas`; a per-HPA tolerance of 0 keeps an exact count (10 -> 11, which
the default 10 % tolerance would swallow); scaling to zero and back from it is KEDA's own
activation. Nothing here writes replicas after creating the Deployment.
"""

from __future__ import annotations

import json
import threading
import urllib.parse
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml
from e2e.keda import KedaState
from e2e_helpers import eventually, kubectl

HPA_MANAGER = "kube-controller-manager"  # the HPA controller writes through deployments/scale
STEP_S = 60  # one scaling step: KEDA polls each second, the HPA syncs every 2 s


class LoadEndpoint:
    """A JSON endpoint on loopback, `{"queue": {"depth": N}}`, with N set by the test;
    counts the requests it answered (the metrics-api scaler polls it)."""

    def __init__(self, host: str) -> None:
        self.depth = 0
        self.requests = 0
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = json.dumps({"queue": {"depth": endpoint.depth}}).encode()
                endpoint.requests += 1
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                return

        self.server = ThreadingHTTPServer((host, 0), Handler)
        self.url = f"http://{host}:{self.server.server_address[1]}/load"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def load(keda: KedaState) -> Iterator[LoadEndpoint]:
    endpoint = LoadEndpoint(keda.scaler_host)
    yield endpoint
    endpoint.close()


@pytest.fixture
def ns(kubeconfig: Path) -> Iterator[str]:
    name = f"keda-kit-{uuid.uuid4().hex[:6]}"
    kubectl(kubeconfig, ["create", "namespace", name])
    yield name
    kubectl(kubeconfig, ["delete", "namespace", name, "--wait=false"], check=False)


def web_deployment(name: str, replicas: int) -> dict[str, Any]:
    """A plain Deployment; KWOK runs its pods on the inventory's fake nodes."""
    labels = {"app": name}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {"containers": [{"name": "web", "image": "registry.invalid/web:1"}]},
            },
        },
    }


def scaled_object(name: str, url: str, min_replicas: int) -> dict[str, Any]:
    """One metrics-api trigger, AverageValue with target 1: desired replicas = the value.
    Immediate policies, no stabilization and tolerance 0 in both directions."""
    rules = {
        "stabilizationWindowSeconds": 0,
        "tolerance": "0",
        "policies": [{"type": "Pods", "value": 20, "periodSeconds": 1}],
    }
    return {
        "apiVersion": "keda.sh/v1alpha1",
        "kind": "ScaledObject",
        "metadata": {"name": name},
        "spec": {
            "scaleTargetRef": {"name": name},
            "pollingInterval": 1,
            "cooldownPeriod": 1,
            "minReplicaCount": min_replicas,
            "maxReplicaCount": 12,
            "advanced": {
                "horizontalPodAutoscalerConfig": {
                    "behavior": {"scaleUp": rules, "scaleDown": rules}
                }
            },
            "triggers": [
                {
                    "type": "metrics-api",
                    "metricType": "AverageValue",
                    "metadata": {
                        "url": url,
                        "format": "json",
                        "valueLocation": "queue.depth",
                        "targetValue": "1",
                    },
                }
            ],
        },
    }


def apply(kubeconfig: Path, namespace: str, obj: dict[str, Any]) -> None:
    kubectl(kubeconfig, ["apply", "-n", namespace, "-f", "-"], stdin=yaml.safe_dump(obj))


def get(kubeconfig: Path, namespace: str, kind: str, name: str) -> dict[str, Any] | None:
    """The object with its managedFields (kubectl leaves them out unless asked); None when
    it does not exist."""
    args = ["get", kind, name, "-n", namespace, "-o", "json", "--show-managed-fields"]
    out = kubectl(kubeconfig, args, check=False)
    if out.returncode != 0:
        return None
    found: dict[str, Any] = json.loads(out.stdout)
    return found


def replicas_become(kubeconfig: Path, namespace: str, name: str, want: int) -> dict[str, Any]:
    """Wait until the Deployment's spec.replicas is `want`; the Deployment."""

    def probe() -> dict[str, Any] | None:
        dep = get(kubeconfig, namespace, "deployment", name)
        return dep if dep and dep["spec"].get("replicas", 1) == want else None

    return eventually(probe, STEP_S, f"deployment {name} spec.replicas == {want}")


def replicas_writers(deployment: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(manager, operation, subresource) of the managedFields entries owning spec.replicas."""
    return [
        (e.get("manager", ""), e.get("operation", ""), e.get("subresource", ""))
        for e in deployment["metadata"].get("managedFields") or []
        if "f:replicas" in ((e.get("fieldsV1") or {}).get("f:spec") or {})
    ]


def active(kubeconfig: Path, namespace: str, so: str) -> str | None:
    """The ScaledObject's `Active` condition status ("True"/"False"), as KEDA reports it."""
    obj = get(kubeconfig, namespace, "scaledobject", so) or {}
    conditions = (obj.get("status") or {}).get("conditions") or []
    return next((c["status"] for c in conditions if c.get("type") == "Active"), None)


def quantity(text: str) -> float:
    """A resource.Quantity as KEDA's adapter writes metric values ("3", "2500m")."""
    return float(text[:-1]) / 1000 if text.endswith("m") else float(text)


def external_metric(kubeconfig: Path, namespace: str, so: str) -> float | None:
    """The value `external.metrics.k8s.io` answers, through the API server, for the
    ScaledObject's metric (the request the HPA controller makes)."""
    obj = get(kubeconfig, namespace, "scaledobject", so)
    names = ((obj or {}).get("status") or {}).get("externalMetricNames") or []
    if not names:
        return None
    selector = urllib.parse.quote(f"scaledobject.keda.sh/name={so}")
    path = f"/apis/external.metrics.k8s.io/v1beta1/namespaces/{namespace}/{names[0]}"
    out = kubectl(kubeconfig, ["get", "--raw", f"{path}?labelSelector={selector}"], check=False)
    if out.returncode != 0:
        return None
    items = json.loads(out.stdout).get("items") or []
    return quantity(items[0]["value"]) if items else None


def test_replicas_follow_the_served_value_through_the_hpa_keda_creates(
    kubeconfig: Path, keda: KedaState, load: LoadEndpoint, ns: str
) -> None:
    name = "web"
    load.depth = 3
    apply(kubeconfig, ns, web_deployment(name, replicas=1))
    apply(kubeconfig, ns, scaled_object(name, load.url, min_replicas=1))

    hpa = eventually(
        lambda: get(kubeconfig, ns, "hpa", f"keda-hpa-{name}"), STEP_S, f"HPA keda-hpa-{name}"
    )
    assert hpa["spec"]["scaleTargetRef"]["name"] == name
    metric = hpa["spec"]["metrics"][0]
    assert metric["type"] == "External", metric
    assert metric["external"]["target"] == {"type": "AverageValue", "averageValue": "1"}
    # the API server kept the per-HPA tolerance (HPAConfigurableTolerance is on)
    assert hpa["spec"]["behavior"]["scaleUp"]["tolerance"] == "0", hpa["spec"]["behavior"]
    assert hpa["spec"]["behavior"]["scaleDown"]["tolerance"] == "0", hpa["spec"]["behavior"]

    assert eventually(
        lambda: external_metric(kubeconfig, ns, name) == 3.0,
        STEP_S,
        "external.metrics.k8s.io answering 3 through the API server",
    )
    dep = replicas_become(kubeconfig, ns, name, 3)
    assert replicas_writers(dep) == [(HPA_MANAGER, "Update", "scale")], replicas_writers(dep)
    eventually(
        lambda: (
            (get(kubeconfig, ns, "deployment", name) or {}).get("status", {}).get("readyReplicas")
            == 3
        ),
        STEP_S,
        "3 pods Ready on KWOK nodes",
    )

    for depth in (10, 11, 2):  # 10 -> 11 is within the default 10 % tolerance
        load.depth = depth
        dep = replicas_become(kubeconfig, ns, name, depth)
        assert replicas_writers(dep) == [(HPA_MANAGER, "Update", "scale")], replicas_writers(dep)
    assert external_metric(kubeconfig, ns, name) == 2.0
    assert load.requests > 0


def test_scale_to_zero_and_back_is_keda_activation(
    kubeconfig: Path, keda: KedaState, load: LoadEndpoint, ns: str
) -> None:
    name = "idle"
    load.depth = 0
    apply(kubeconfig, ns, web_deployment(name, replicas=1))
    apply(kubeconfig, ns, scaled_object(name, load.url, min_replicas=0))

    dep = replicas_become(kubeconfig, ns, name, 0)
    # KEDA's write of 0 through /scale records no owner: Scale.spec.replicas is omitempty,
    # so the write sets no field; kubectl, which set 1, no longer owns it either
    assert replicas_writers(dep) == [], replicas_writers(dep)

    load.depth = 4
    dep = replicas_become(kubeconfig, ns, name, 4)
    # KEDA activates (0 -> 1), then the HPA it owns takes the count to the value. With
    # spec.replicas left ownerless by the write of 0, the API server records no owner for
    # the later /scale writes either, so the HPA's own status says who sized it.
    eventually(
        lambda: (
            (hpa := get(kubeconfig, ns, "hpa", f"keda-hpa-{name}"))
            and (hpa.get("status") or {}).get("desiredReplicas") == 4
            and hpa["status"].get("lastScaleTime")
        ),
        STEP_S,
        f"HPA keda-hpa-{name} having scaled to 4",
    )
