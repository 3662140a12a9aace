"""Batch deadlines on Kubernetes: the routers' need gauge read through Prometheus scales the
endpoints out (the deadline signal), and a need above what maxInstances serve is a miss
predicted: `BatchDeadlinesAtRisk` on the ModelDeployment, one Event per transition and a
metric (controller.deadlines, controller.pace_loop).

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

from sageserve.api.model_deployment import ModelDeployment, pod_set_name
from sageserve.controller import deadlines
from sageserve.controller.deadlines import AT_RISK, CONDITION, WITHIN, DeadlineOutlook, report
from sageserve.controller.pace_loop import PacePass, PaceState
from sageserve.core.labels import ANNOTATION_REPLICAS, LABEL_DEPLOYMENT, LABEL_REGION, LABEL_VARIANT
from sageserve.metrics import queries
from sageserve.metrics.exporter import OPERATOR_METRICS
from sageserve.metrics.prometheus import PrometheusReader

NS, MODEL = "llm", "m"
#: θ of the model's variants: the at-max capacity counts the fastest (1000 tokens/s)
THETA = {"h100": 1000.0, "a100": 400.0}
#: maxInstances per region: 6 instances, 6000 tokens/s at max
MAX = {"r1": 4, "r2": 2}
#: serving pods per region, all at 40 % KV: no EMU rule scales anything
PODS = {"r1": 2, "r2": 1}


# ---- the pure rule ------------------------------------------------------------------------


def md(max_instances: dict[str, int] = MAX) -> ModelDeployment:
    return ModelDeployment.model_validate(md_raw(max_instances))


@pytest.mark.parametrize(
    ("need", "at_risk", "capacity", "shortfall"),
    [
        (0.0, False, 6000.0, 0.0),  # nothing queued
        (5999.0, False, 6000.0, 0.0),  # the fastest variant everywhere at max serves it
        (6000.0, False, 6000.0, 0.0),  # exactly: every deadline met at max
        (8000.0, True, 6000.0, 2000.0),  # no scale-out avoids a miss
        (-5.0, False, 6000.0, 0.0),  # a nonsense reading is no need
    ],
)
def test_a_need_above_theta_times_max_instances_is_a_miss_predicted(
    need: float, at_risk: bool, capacity: float, shortfall: float
) -> None:
    got = deadlines.outlook(md(), need)
    assert (got.at_risk, got.capacity_tps, got.shortfall_tps) == (at_risk, capacity, shortfall)


def test_the_condition_names_the_model_the_need_and_the_shortfall() -> None:
    status, reason, message = deadlines.outlook(md(), 8000.0).condition()
    assert (status, reason) == (True, AT_RISK)
    assert "batch queue of m needs 8000 tok/s" in message
    assert "6000 tok/s at maxInstances (6 instance(s) × θ 1000 tok/s)" in message
    assert "2000 tok/s short" in message and "raise maxInstances" in message
    status, reason, message = deadlines.outlook(md(), 100.0).condition()
    assert (status, reason) == (False, WITHIN) and "no more than the 6000 tok/s" in message


def outlook(need: float) -> DeadlineOutlook:
    return DeadlineOutlook(MODEL, need, 1000.0, 6)


def cond(status: str, reason: str) -> dict[str, str]:
    return {"type": CONDITION, "status": status, "reason": reason, "message": "-"}


@pytest.mark.parametrize(
    ("in_status", "posted", "need", "write", "event"),
    [
        (None, None, 100.0, False, False),  # never at risk: no condition at all
        (None, None, 8000.0, True, True),  # turns at risk: written, one Warning
        (cond("True", AT_RISK), outlook(8000.0), 8100.0, False, False),  # figures ~same
        (cond("True", AT_RISK), outlook(8000.0), 9000.0, True, False),  # shortfall 2000→3000
        (cond("True", AT_RISK), outlook(8000.0), 100.0, True, True),  # clears: one Event
        (cond("False", WITHIN), outlook(100.0), 200.0, False, False),  # stays clear
        (cond("False", WITHIN), outlook(100.0), 8000.0, True, True),  # at risk again
        # after a restart: the status already says so, no second Event
        (cond("True", AT_RISK), None, 8000.0, True, False),
        # a concurrent status write dropped the condition: restored, no second Event
        (None, outlook(8000.0), 8000.0, True, False),
    ],
)
def test_the_condition_is_written_when_it_changes_and_an_event_posted_once_per_transition(
    in_status: dict[str, str] | None,
    posted: DeadlineOutlook | None,
    need: float,
    write: bool,
    event: bool,
) -> None:
    assert report(in_status, posted, outlook(need)) == deadlines.Report(write, event)


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

    def condition(self) -> dict[str, Any] | None:
        return next((c for c in self.md["status"]["conditions"] if c["type"] == CONDITION), None)

    def model_events(self) -> list[tuple[str, str, str]]:
        return [(t, r, m) for kind, t, r, m in self.events if kind == "ModelDeployment"]


def policy() -> dict[str, Any]:
    return {
        "apiVersion": "sageserve.io/v1alpha1",
        "kind": "ScalingPolicy",
        "metadata": {"name": "p", "namespace": NS, "generation": 1},
        "spec": {"strategy": "reactive", "spot": {"enabled": False}},
    }


def at_risk_metric() -> tuple[float | None, float | None]:
    labels = {"namespace": NS, "model_deployment": MODEL}
    registry = OPERATOR_METRICS.registry
    return (
        registry.get_sample_value("sageserve_batch_deadline_at_risk", labels),
        registry.get_sample_value("sageserve_batch_deadline_shortfall_tokens_per_second", labels),
    )


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
    assert "batch deadline pressure: 1600 tok/s needed, 1.3x batch capacity" in scaled[0]
    assert "batch deadline pressure: 800 tok/s needed" in scaled[0]
    # within what maxInstances serve: scaling is the answer, no miss is predicted
    assert kube.condition() is None and kube.model_events() == [("Normal", "ScaledOut", scaled[0])]
    assert at_risk_metric() == (0.0, 0.0)


def test_a_need_above_max_instances_is_reported_once_and_cleared_once(
    prometheus: PrometheusStub,
) -> None:
    kube, state = FakeKube(), PaceState()
    run_pass(kube, state, prometheus, 8000.0)
    condition = kube.condition()
    assert condition is not None
    assert (condition["status"], condition["reason"]) == ("True", AT_RISK)
    assert "8000 tok/s" in condition["message"] and "2000 tok/s short" in condition["message"]
    warnings = [e for e in kube.model_events() if e[0] == "Warning"]
    assert [(t, r) for t, r, _ in warnings] == [("Warning", CONDITION)]
    assert "batch queue of m needs 8000 tok/s" in warnings[0][2]
    assert at_risk_metric() == (1.0, 2000.0)
    # the Ready condition the reconciler wrote is kept beside it
    assert {c["type"] for c in kube.md["status"]["conditions"]} == {"Ready", CONDITION}

    writes = len(kube.status_writes)
    for need in (8100.0, 8050.0):  # the same miss: no Event, no status write
        run_pass(kube, state, prometheus, need)
    assert [e for e in kube.model_events() if e[0] == "Warning"] == warnings
    assert len(kube.status_writes) == writes
    assert at_risk_metric() == (1.0, 2050.0)

    run_pass(kube, state, prometheus, 1000.0)
    condition = kube.condition()
    assert condition is not None and (condition["status"], condition["reason"]) == (
        "False",
        WITHIN,
    )
    cleared = [e for e in kube.model_events() if e[1] == WITHIN]
    assert [t for t, _, _ in cleared] == ["Normal"]
    assert at_risk_metric() == (0.0, 0.0)
    run_pass(kube, state, prometheus, 1000.0)
    assert [e for e in kube.model_events() if e[1] in (WITHIN, CONDITION)] == [
        *warnings,
        *cleared,
    ]


def test_a_restarted_operator_posts_no_second_event_for_a_miss_already_reported(
    prometheus: PrometheusStub,
) -> None:
    kube = FakeKube()
    run_pass(kube, PaceState(), prometheus, 8000.0)
    run_pass(kube, PaceState(), prometheus, 8000.0)  # a new operator process: no memory
    assert [r for _, r, _ in kube.model_events() if r == CONDITION] == [CONDITION]


def test_without_the_gauge_nothing_is_said_about_deadlines(prometheus: PrometheusStub) -> None:
    kube = FakeKube()
    PacePass(kube, policy(), PaceState(), logging.getLogger("t")).run()  # type: ignore[arg-type]
    assert kube.condition() is None and kube.model_events() == []
    assert not [w for w in kube.status_writes if w[0] == "modeldeployments"]
    assert at_risk_metric() == (0.0, 0.0)
