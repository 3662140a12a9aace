"""Batch deadlines on Kubernetes: the routers' need gauge read through Prometheus scales the
endpoints out (the deadline signal, controller.pace_loop).

The pace pass runs in process against a Prometheus stand-in answering the HTTP API (the
operator's own `PrometheusReader` parses its answers) and a Kubernetes stand-in that keeps
the objects, their status and the Events it was sent.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse

import pytest

from sageserve.api.model_deployment import pod_set_name
from sageserve.controller.pace_loop import PacePass, PaceState
from sageserve.core.labels import ANNOTATION_REPLICAS, LABEL_DEPLOYMENT, LABEL_REGION, LABEL_VARIANT
from sageserve.metrics import queries
from sageserve.metrics.prometheus import PrometheusReader

NS, MODEL = "llm", "m"
#: θ of the model's variants: the at-max capacity counts the fastest (1000 tokens/s)
THETA = {"h100": 1000.0, "a100": 400.0}
#: maxInstances per region: 6 instances, 6000 tokens/s at max
MAX = {"r1": 4, "r2": 2}
#: serving pods per region, all at 40 % KV: no EMU rule scales anything
PODS = {"r1": 2, "r2": 1}


# ---- the Prometheus side ------------------------------------------------------------------


def sample(value: float, **labels: str) -> dict[str, Any]:
    return {"metric": labels, "value": [0, repr(value)]}


class PrometheusStub:
    """Answers instant queries over HTTP as Prometheus does, from `answer(query)`."""

    def __init__(self) -> None:
        self.need: list[dict[str, Any]] = []
        self.queries: list[str] = []
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                query = parse_qs(urlparse(self.path).query).get("query", [""])[0]
                stub.queries.append(query)
                body = json.dumps(
                    {
                        "status": "success",
                        "data": {"resultType": "vector", "result": stub.answer(query)},
                    }
                ).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def answer(self, query: str) -> list[dict[str, Any]]:
        if queries.BATCH_DEADLINE_NEED in query:
            return self.need
        pods = [(f"{r}-{i}", r) for r, n in PODS.items() for i in range(n)]
        if "kv_cache_usage_perc" in query:
            return [sample(0.4, pod=p, namespace=NS) for p, _ in pods]
        if "num_requests_waiting" in query and "sum by" not in query:
            return [sample(0.0, pod=p, namespace=NS) for p, _ in pods]
        return []  # token rates, held requests: none


@pytest.fixture
def prometheus(monkeypatch: pytest.MonkeyPatch) -> Iterator[PrometheusStub]:
    stub = PrometheusStub()
    thread = threading.Thread(
        target=stub.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
    )
    thread.start()
    monkeypatch.setenv("SAGESERVE_PROMETHEUS_URL", stub.url)
    yield stub
    stub.server.shutdown()
    stub.server.server_close()


def test_the_reader_takes_each_models_need_from_the_routers_gauge(
    prometheus: PrometheusStub,
) -> None:
    prometheus.need = [
        sample(2400.0, namespace=NS, model_deployment=MODEL),
        sample(float("nan"), namespace=NS, model_deployment="broken"),
        sample(-3.0, namespace=NS, model_deployment="negative"),
    ]
    assert PrometheusReader(prometheus.url).batch_deadline_needs(NS) == {MODEL: 2400.0}
    assert prometheus.queries == [queries.batch_deadline_need(NS)]


# ---- the pace pass ------------------------------------------------------------------------


def md_raw(max_instances: dict[str, int] = MAX) -> dict[str, Any]:
    return {
        "apiVersion": "sageserve.io/v1alpha1",
        "kind": "ModelDeployment",
        "metadata": {"name": MODEL, "namespace": NS, "generation": 1},
        "spec": {
            "model": {"name": "meta-llama/Llama-2-70b-hf"},
            "variants": [
                {"name": v, "gpuType": f"GPU-{v}", "capacityTokensPerSecond": theta}
                for v, theta in THETA.items()
            ],
            "regions": [
                {"name": r, "minInstances": 1, "maxInstances": n} for r, n in max_instances.items()
            ],
            "tiers": ["niw"],
            "policyRef": {"name": "p"},
        },
        "status": {
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "PodSetsApplied",
                    "message": "",
                    "lastTransitionTime": "2026-01-01T00:00:00Z",
                }
            ]
        },
    }


class FakeKube:
    """The API server as the pace pass sees it: objects with a status it can patch, pod
    sets it can scale, and the Events it posted."""

    def __init__(self) -> None:
        self.md = md_raw()
        self.events: list[tuple[str, str, str, str]] = []
        self.status_writes: list[tuple[str, str, dict[str, Any]]] = []
        self.pod_sets = {
            pod_set_name(MODEL, r, v): {
                "metadata": {
                    "name": pod_set_name(MODEL, r, v),
                    "labels": {LABEL_DEPLOYMENT: MODEL, LABEL_REGION: r, LABEL_VARIANT: v},
                    "annotations": {ANNOTATION_REPLICAS: str(PODS[r] if v == "h100" else 0)},
                },
                "spec": {"replicas": PODS[r] if v == "h100" else 0},
            }
            for r in PODS
            for v in THETA
        }

    def objects(self, namespace: str, plural: str) -> list[dict[str, Any]]:
        return [json.loads(json.dumps(self.md))] if plural == "modeldeployments" else []

    def nodes(self) -> list[dict[str, Any]]:
        return []

    def deployments_by_owner(self, namespace: str) -> dict[str, dict[str, dict[str, Any]]]:
        return {MODEL: json.loads(json.dumps(self.pod_sets))}

    def pods_of(self, namespace: str) -> list[dict[str, Any]]:
        return [
            {
                "metadata": {
                    "name": f"{r}-{i}",
                    "labels": {LABEL_DEPLOYMENT: MODEL, LABEL_REGION: r, LABEL_VARIANT: "h100"},
                },
                "spec": {"nodeName": "n1"},
                "status": {"conditions": [{"type": "Ready", "status": "True"}]},
            }
            for r, n in PODS.items()
            for i in range(n)
        ]

    def set_replicas(
        self, namespace: str, observed: dict[str, Any], replicas: int, drop_scaling: bool = False
    ) -> None:
        pod_set = self.pod_sets[observed["metadata"]["name"]]
        pod_set["spec"]["replicas"] = replicas
        pod_set["metadata"]["annotations"][ANNOTATION_REPLICAS] = str(replicas)

    def annotate_pod(self, namespace: str, name: str, annotations: dict[str, str]) -> None:
        pass

    def event(self, obj: dict[str, Any], type_: str, reason: str, message: str) -> None:
        self.events.append((obj["kind"], type_, reason, message))

    def patch_status(self, namespace: str, plural: str, name: str, status: dict[str, Any]) -> None:
        self.status_writes.append((plural, name, status))
        if plural == "modeldeployments":
            self.md["status"].update(status)

    def autoscalers(self, namespace: str) -> dict[str, list[str]]:
        return {}


def policy() -> dict[str, Any]:
    return {
        "apiVersion": "sageserve.io/v1alpha1",
        "kind": "ScalingPolicy",
        "metadata": {"name": "p", "namespace": NS, "generation": 1},
        "spec": {"strategy": "reactive", "spot": {"enabled": False}},
    }


def run_pass(kube: FakeKube, state: PaceState, prometheus: PrometheusStub, need: float) -> None:
    prometheus.need = [sample(need, namespace=NS, model_deployment=MODEL)]
    PacePass(kube, policy(), state, logging.getLogger("t")).run()  # type: ignore[arg-type]


def test_a_deadline_need_read_from_prometheus_scales_out_and_says_why(
    prometheus: PrometheusStub,
) -> None:
    """KV at 40 % everywhere (no EMU rule moves), the routers' gauge says the model's batch
    queue needs 2400 tokens/s: over the 3 × 1000 × 60 % its serving instances give batch
    work, so both endpoints scale out, the Event naming the deadline pressure."""
    kube = FakeKube()
    run_pass(kube, PaceState(), prometheus, 2400.0)
    scaled = [m for kind, t, r, m in kube.events if r == "ScaledOut"]
    assert len(scaled) == 1  # one Event per ModelDeployment and reason
    assert "r1/h100=3" in scaled[0] and "r2/h100=2" in scaled[0]
    assert "batch deadline pressure: 1600 tok/s needed (1.3x batch capacity)" in scaled[0]
    assert "batch deadline pressure: 800 tok/s needed" in scaled[0]
