"""The request path on the real control plane: router → the twin's pods, over real HTTP.

`sageserve router` (its own process) discovers the pod sets' pods by watching the real
API server and forwards to them; the twin (its own process) answers for each pod with its
simulated instance's timing; Prometheus scrapes both; the operator runs in-process. The
tests check what a client and a platform team see: answers by tier, the region the global
router picks as load rises, errors for bad input, and a model at zero that serves its first
request once the operator scaled it out on the router's held demand.
"""

from __future__ import annotations

import http.client
import json
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from e2e_helpers import eventually, kubectl
from kopf.testing import KopfRunner
from operator_kit import (
    A100,
    REPO,
    RouterProcess,
    TwinProcess,
    apply,
    model_deployment,
    operator_args,
    operator_env,
    scaling_policy,
)

from sageserve.metrics.prometheus import PrometheusReader
from sageserve.metrics.queries import router_tokens

TRACE = REPO / "data/traces/azure-llm-2023/AzureLLMInferenceTrace_conv.csv.gz"
MODEL = "bloom"
SERVED = "bigscience/bloom"
#: bloom-176b on 8 A100s: at 0.05× of the conversation trace an instance idles (KV ≈ 7 %),
#: at 0.5× it is saturated (see test_e2e_twin.py).
LOW, HIGH = 0.05, 0.5


def bloom(regions: list[str], lo: int, hi: int, initial: int | None = None) -> dict[str, Any]:
    md = model_deployment(regions, A100, gpus=8, theta=114, lo=lo, hi=hi, name=MODEL)
    md["metadata"]["annotations"] = {"sageserve.io/perf-profile": "bloom-176b"}
    md["spec"]["model"] = {"name": SERVED}
    if initial is not None:
        for r in md["spec"]["regions"]:
            r["initialInstances"] = initial
    return md


def request(**kw: Any) -> dict[str, Any]:
    return {"model": SERVED, "prompt": "Say hello.", "max_tokens": 8, **kw}


def served_in(router: RouterProcess, region: str) -> float:
    return router.metric(
        "sageserve_router_requests_total", model_deployment=MODEL, region=region, code="200"
    )


def ready_pods(kubeconfig: Path, namespace: str) -> int:
    items = json.loads(kubectl(kubeconfig, ["get", "pods", "-n", namespace, "-o", "json"]).stdout)[
        "items"
    ]
    return sum(
        any(
            c["type"] == "Ready" and c["status"] == "True"
            for c in p["status"].get("conditions", [])
        )
        for p in items
    )


@pytest.mark.usefixtures("restore_node_pools")
def test_requests_go_by_tier_to_the_home_region_and_spill_over_above_70_percent(
    kubeconfig: Path,
    namespace: str,
    prometheus_url: str,
    prometheus_targets_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    operator_env(monkeypatch, kubeconfig, namespace, prometheus_url)
    twin = TwinProcess(
        kubeconfig, namespace, prometheus_targets_dir, "--trace", str(TRACE), "--scale", str(LOW)
    )
    router: RouterProcess | None = None
    try:
        with KopfRunner(operator_args(namespace), timeout=600):
            # one instance per region, never more or fewer: the test is about routing
            apply(
                kubeconfig,
                namespace,
                scaling_policy("reactive"),
                bloom(["us-east", "us-west"], 1, 1),
            )
            eventually(lambda: ready_pods(kubeconfig, namespace) == 2, 90, "two pods Ready")
            router = RouterProcess(
                kubeconfig,
                namespace,
                twin.url,
                prometheus_url,
                prometheus_targets_dir,
                "--max-body-bytes",
                "65536",
            )
            east = {"x-sageserve-region": "us-east"}

            # by tier, to the home region: plain and streamed
            status, body = router.post(
                "/v1/completions", request(), {**east, "x-sageserve-tier": "iw-f"}
            )
            assert status == 200, body
            assert json.loads(body)["usage"]["completion_tokens"] == 8
            assert (
                router.metric("sageserve_router_requests_total", region="us-east", tier="iw-f") == 1
            )
            status, body = router.post(
                "/v1/chat/completions",
                request(messages=[{"role": "user", "content": "hi"}], stream=True),
                {**east, "x-sageserve-tier": "iw-n"},
            )
            events = [e for e in body.decode().split("\n\n") if e]
            assert status == 200 and events[-1] == "data: [DONE]", body
            # as vLLM does, the twin coalesces tokens a slow reader has not taken yet into one
            # event, so the count of events depends on the machine's load; the tokens do not
            streamed = "".join(
                json.loads(e.removeprefix("data: "))["choices"][0]["delta"]["content"]
                for e in events[:-1]
            )
            assert streamed.split() == ["tok"] * 8, body

            # tokens per tier, the pod's usage when it reports one: the plan loop's batch
            # share comes from them through Prometheus (no PromQL from the user)
            status, body = router.post(
                "/v1/completions", request(), {**east, "x-sageserve-tier": "niw"}
            )
            usage = json.loads(body)["usage"]
            assert router.metric("sageserve_router_tokens_total", region="us-east", tier="niw") == (
                usage["prompt_tokens"] + usage["completion_tokens"]
            )
            batch_query = router_tokens("5m", namespace, ["niw"])

            def batch_rate() -> float:  # a rate needs two scrapes of a counter that grew
                router.post("/v1/completions", request(), {**east, "x-sageserve-tier": "niw"})
                found = PrometheusReader(prometheus_url).instant(batch_query)
                return found.get((namespace, MODEL, "us-east"), 0.0)

            eventually(lambda: batch_rate() > 0, 90, "the batch tier's tokens/s in Prometheus")

            # bad input, each with its error, none reaching a pod
            for data, headers, code in [
                (json.dumps(request(model="gpt-9")).encode(), east, 404),
                (b"{not json", east, 400),
                (json.dumps(request()).encode(), {**east, "x-sageserve-tier": "gold"}, 400),
                (b"x" * 70_000, east, 413),
            ]:
                status, body = router.post("/v1/completions", data, headers)
                assert status == code and "error" in json.loads(body), (code, body)

            # below 70 % at home: stays home; above it: the other region
            for _ in range(3):
                assert router.post("/v1/completions", request(), east)[0] == 200
            assert served_in(router, "us-west") == 0
            twin.load(HIGH / LOW, f"{namespace}/{MODEL}/us-east")
            reader = PrometheusReader(prometheus_url)

            def east_emu() -> float:
                loads = reader.pod_loads(namespace)
                return max((p.kv_usage for n, p in loads.items() if "us-east" in n), default=0)

            eventually(lambda: east_emu() > 0.75, 120, "us-east above 70 % KV usage")
            eventually(
                lambda: (
                    router.post("/v1/completions", request(), east)[0] == 200
                    and served_in(router, "us-west") > 0
                ),
                30,
                "a us-east request served in us-west",
            )
            # a router replica killed mid-stream: its client's stream breaks off, the other
            # replica keeps serving
            spare = RouterProcess(
                kubeconfig, namespace, twin.url, prometheus_url, prometheus_targets_dir
            )
            try:
                cut = stream_then_kill(router, request(max_tokens=400, stream=True), east)
                assert cut and not cut.endswith("data: [DONE]")
                assert spare.post("/v1/completions", request(), east)[0] == 200
            finally:
                spare.close()
    finally:
        if router is not None:
            router.close()
        twin.close()


def stream_then_kill(router: RouterProcess, body: dict[str, Any], headers: dict[str, str]) -> str:
    """Start a streamed request, SIGKILL the router after its first event, return what the
    client received (the stream must end without its [DONE])."""
    host, port = router.url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    conn.request(
        "POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json", **headers}
    )
    resp = conn.getresponse()
    assert resp.status == 200
    received = resp.readline().decode()
    router.proc.send_signal(signal.SIGKILL)
    try:
        while line := resp.readline():
            received += line.decode()
    except (http.client.IncompleteRead, ConnectionError):
        pass
    return received.strip()


@pytest.mark.usefixtures("restore_node_pools")
def test_a_model_at_zero_serves_its_first_request_after_the_operator_scales_it_out(
    kubeconfig: Path,
    namespace: str,
    prometheus_url: str,
    prometheus_targets_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    operator_env(monkeypatch, kubeconfig, namespace, prometheus_url)
    twin = TwinProcess(
        kubeconfig, namespace, prometheus_targets_dir, "--trace", str(TRACE), "--scale", "0"
    )
    router: RouterProcess | None = None
    try:
        with KopfRunner(operator_args(namespace), timeout=600):
            apply(kubeconfig, namespace, scaling_policy("reactive"), bloom(["us-east"], 0, 1, 0))
            deployment = f"{MODEL}-us-east-a100"
            eventually(
                lambda: (
                    kubectl(
                        kubeconfig, ["get", "deploy", "-n", namespace, deployment], check=False
                    ).returncode
                    == 0
                ),
                60,
                "the pod set at 0 replicas",
            )
            router = RouterProcess(
                kubeconfig,
                namespace,
                twin.url,
                prometheus_url,
                prometheus_targets_dir,
                "--hold-seconds",
                "150",
            )
            assert ready_pods(kubeconfig, namespace) == 0
            answer: dict[str, Any] = {}

            def client() -> None:
                answer["reply"] = router.post(  # type: ignore[union-attr]
                    "/v1/completions", request(), {"x-sageserve-region": "us-east"}, timeout=180
                )

            waiting = threading.Thread(target=client)
            started = time.monotonic()
            waiting.start()
            eventually(
                lambda: (
                    router.metric("sageserve_router_held_requests", model_deployment=MODEL) == 1
                ),  # type: ignore[union-attr]
                10,
                "the request held by the router",
            )
            waiting.join(timeout=180)
            sys.__stderr__.write(f"scale from zero: answered {time.monotonic() - started:.1f} s\n")
            status, body = answer.get("reply", (0, b"no answer"))
            assert status == 200, (body, router.command.output()[-3000:], twin.output()[-3000:])
            assert json.loads(body)["object"] == "text_completion"
            events = kubectl(kubeconfig, ["get", "events", "-n", namespace, "-o", "json"]).stdout
            assert "from zero: 1 request(s) waiting" in events
            assert router.metric("sageserve_router_held_requests", model_deployment=MODEL) == 0
    finally:
        if router is not None:
            router.close()
        twin.close()
