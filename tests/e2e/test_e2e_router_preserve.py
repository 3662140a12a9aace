"""PreServe's picker in the real request path: router → the twin's pods, over real HTTP.

Two `sageserve router` processes in front of the same two pods (one region), one with
`--picker preserve`, one with `--picker least-request`. Each learns its clients' output
lengths from the answers it proxies (the pod's `usage`), then sees the same requests in
flight: one pod holds a request predicted to run long, the other two short ones. The next
request goes, with least-request, to the pod with fewer requests, the one filling up; with
PreServe's picker (PreServe §4.3.3, its anticipated decode load and KV), to the other.
Which pod took each request is read from the router's `x-sageserve-pod` answer header.
"""

from __future__ import annotations

import http.client
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from e2e_helpers import eventually, kubectl
from kopf.testing import KopfRunner
from operator_kit import (
    REPO,
    RouterProcess,
    TwinProcess,
    apply,
    model_deployment,
    operator_args,
    operator_env,
    scaling_policy,
    tier_keys,
)

TRACE = REPO / "data/traces/azure-llm-2023/AzureLLMInferenceTrace_conv.csv.gz"
SERVED = "meta-llama/Llama-3.1-8B-Instruct"
#: output tokens of each client's answers (the twin answers `max_tokens` tokens)
LONG, SHORT = 1500, 200
#: answers per client before the per-client prediction is used (client-quantile's minimum)
WARM_UP = 16


def ready_pods(kubeconfig: Path, namespace: str) -> list[str]:
    items = json.loads(kubectl(kubeconfig, ["get", "pods", "-n", namespace, "-o", "json"]).stdout)[
        "items"
    ]
    return sorted(
        p["metadata"]["name"]
        for p in items
        if any(
            c["type"] == "Ready" and c["status"] == "True"
            for c in p["status"].get("conditions", [])
        )
    )


def body(tokens: int, stream: bool = True) -> dict[str, Any]:
    return {"model": SERVED, "prompt": "Tell me a story.", "max_tokens": tokens, "stream": stream}


def headers(client: str) -> dict[str, str]:
    return {
        "Content-Type": "application/json",
        "Authorization": f"Bearer {client}",
        "x-sageserve-tier": "iw-f",
    }


def client_keys(kubeconfig: Path, namespace: str) -> None:
    """The two clients' API keys, listed by tier iw-f (a key is the client the router's
    length predictor learns per, and the identity that may use the tier)."""
    clients = {c: c for c in ("long-writer", "short-writer")}
    tier_keys(kubeconfig, namespace, "clients", clients, "iw-f")


def warm_up(router: RouterProcess) -> None:
    """Each client's answers, all at once, whole: the router's predictor learns them."""
    errors: list[str] = []

    def one(client: str, tokens: int) -> None:
        status, answer = router.post("/v1/completions", body(tokens, False), headers(client), 300)
        if status != 200 or json.loads(answer)["usage"]["completion_tokens"] != tokens:
            errors.append(f"{client}: {status} {answer[:200]!r}")

    threads = [
        threading.Thread(target=one, args=(client, tokens))
        for client, tokens in (("long-writer", LONG), ("short-writer", SHORT))
        for _ in range(WARM_UP)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


@contextmanager
def in_flight(router: RouterProcess, client: str, tokens: int) -> Iterator[str]:
    """A streamed request under way (its answer started, not read): yields the pod the
    router chose for it; leaving closes it."""
    host, port = router.url.removeprefix("http://").rsplit(":", 1)
    conn = http.client.HTTPConnection(host, int(port), timeout=120)
    try:
        conn.request("POST", "/v1/completions", json.dumps(body(tokens)), headers(client))
        resp = conn.getresponse()  # the status line and headers: the first token is out
        assert resp.status == 200, resp.read()[:300]
        yield str(resp.getheader("x-sageserve-pod"))
    finally:
        conn.close()


def placements(router: RouterProcess) -> tuple[str, str, str, str]:
    """(short 1, long, short 2, the next short request): the pod each went to, the first
    three still streaming when the fourth is routed."""
    with (
        in_flight(router, "short-writer", SHORT) as s1,
        in_flight(router, "long-writer", LONG) as long,
        in_flight(router, "short-writer", SHORT) as s2,
        in_flight(router, "short-writer", SHORT) as probe,
    ):
        return s1, long, s2, probe


@pytest.mark.usefixtures("restore_node_pools")
def test_preserve_avoids_the_pod_filling_up_where_least_request_sends_the_request(
    kubeconfig: Path,
    namespace: str,
    prometheus_url: str,
    prometheus_targets_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    operator_env(monkeypatch, kubeconfig, namespace, prometheus_url)
    twin = TwinProcess(
        kubeconfig, namespace, prometheus_targets_dir, "--trace", str(TRACE), "--scale", "0.01"
    )
    routers: dict[str, RouterProcess] = {}
    try:
        with KopfRunner(operator_args(namespace), timeout=600):
            # two pods in one region, never more or fewer: the test is about the pod choice
            md = model_deployment(["us-east"], lo=2, hi=2)
            md["metadata"]["annotations"] = {"sageserve.io/perf-profile": "llama-3-1-8b"}
            apply(kubeconfig, namespace, scaling_policy("reactive"), md)
            eventually(lambda: len(ready_pods(kubeconfig, namespace)) == 2, 90, "two pods Ready")
            pod_a, pod_b = ready_pods(kubeconfig, namespace)

            def twin_serves_both() -> bool:
                endpoints = twin.status()["endpoints"].values()
                return {pod_a, pod_b} <= {p for e in endpoints for p in e["servingPods"]}

            eventually(twin_serves_both, 60, "the twin serving both pods")
            client_keys(kubeconfig, namespace)
            for picker in ("preserve", "least-request"):
                routers[picker] = RouterProcess(
                    kubeconfig,
                    namespace,
                    twin.url,
                    prometheus_url,
                    prometheus_targets_dir,
                    "--picker",
                    picker,
                    "--region",
                    "us-east",
                )
            learners = [threading.Thread(target=warm_up, args=(r,)) for r in routers.values()]
            for t in learners:
                t.start()
            for t in learners:
                t.join()

            # the same requests in flight through each router: the long one alone on one
            # pod, the two short ones on the other
            lr = placements(routers["least-request"])
            pre = placements(routers["preserve"])
            assert lr[:3] == (pod_a, pod_b, pod_a), lr
            assert pre[:3] == (pod_a, pod_b, pod_a), pre
            # least-request: pod_b has one request against pod_a's two, so it gets the
            # next one, on top of the long answer that keeps filling its KV cache
            assert lr[3] == pod_b, lr
            # PreServe: pod_b's projected load (1,500 output tokens to come) is far above
            # pod_a's (two of 200), so the request goes to pod_a
            assert pre[3] == pod_a, pre
            # every answer with its output count is in the normalized-latency histogram
            for router in routers.values():
                assert (
                    router.metric("sageserve_router_normalized_latency_seconds_count", tier="iw-f")
                    >= 2 * WARM_UP
                )
    finally:
        for r in routers.values():
            r.close()
        twin.close()
