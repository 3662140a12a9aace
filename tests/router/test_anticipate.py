"""The router's per-pod load anticipators: fed by what it proxies, read by named pickers."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from sageserve.dispatch.instance_picker import Arrival, make_picker
from sageserve.dispatch.length_predictor import LengthQuery
from sageserve.dispatch.tiers import TierMatch
from sageserve.forecast.request_types import bucket_tokens, shape_bucket
from sageserve.router.anticipate import PodAnticipators, client_id
from sageserve.router.app import POD_HEADER, Router, RouterConfig, run_loop
from sageserve.router.fleet import REMAINING_TOKENS, Backend, Fleet, ModelRoute, fleet_picker
from sageserve.router.metrics import RouterMetrics
from sageserve.router.usage import reported_completion

MODEL = ModelRoute("llm", "llama", "meta-llama/Llama-3.1-8B", ("us-east",), ("iw-f",))
A = Backend("llm", "pod-a", "llama", "us-east", "a100", "http://a")
B = Backend("llm", "pod-b", "llama", "us-east", "a100", "http://b")


def test_the_predictor_learns_each_clients_lengths_from_answers() -> None:
    ants = PodAnticipators("client-quantile")
    long, short = client_id("key-long"), client_id("key-short")
    for _ in range(20):
        for client, out in ((long, 900), (short, 12)):
            t = ants.sent("pod-a", "m", client, ants.arrival("m", client, 50))
            ants.answered(t, out)
    assert ants.arrival("m", long, 50).predicted_output > 500
    assert ants.arrival("m", short, 50).predicted_output < 30
    assert ants.anticipator("pod-a").requests == 0  # every answered request left the map


def test_a_user_with_a_lone_surrogate_is_a_client_like_any_other() -> None:
    # `{"user": "\\ud800"}` is valid JSON and decodes to a lone surrogate
    assert client_id("\ud800") == client_id("\ud800") != client_id("\ud801")


def test_streamed_tokens_advance_the_pods_clock_and_finishing_frees_the_projection() -> None:
    ants = PodAnticipators()
    t = ants.sent("pod-a", "m", 0, Arrival(100, 50))
    assert ants.projection("pod-a")[0] > 0  # waiting: projected as starting next
    ants.first_byte(t)
    ants.streamed(t, 10)
    assert ants.iteration("pod-a") == 10
    ants.streamed(t, 5)
    assert ants.iteration("pod-a") == 15
    ants.answered(t, 20)
    assert ants.iteration("pod-a") == 20
    assert max(ants.projection("pod-a")) == 0.0
    ants.release(t)  # releasing twice (the handler's finally) is harmless
    assert ants.anticipator("pod-a").requests == 0


def test_an_answer_read_after_its_request_was_released_still_teaches_and_advances() -> None:
    # the Batch API's executor releases the request in its `finally`, then reads the answer
    ants = PodAnticipators()
    t = ants.sent("pod-a", "m", 7, Arrival(100, 50))
    ants.release(t)
    ants.answered(t, 30)
    assert ants.iteration("pod-a") == 30
    assert ants.predictor("m").predict(LengthQuery(7, 100)) > 0
    assert ants.anticipator("pod-a").requests == 0


def test_capacity_comes_from_the_pods_metrics() -> None:
    ants = PodAnticipators()
    ants.sent("pod-a", "m", 0, Arrival(1000, 100))
    before = max(ants.projection("pod-a"))
    ants.set_capacity("pod-a", 5000)
    assert max(ants.projection("pod-a")) > before
    ants.set_capacity("pod-a", None)  # unknown: unchanged
    assert ants.anticipator("pod-a").capacity == 5000


def test_the_fleet_forgets_pods_that_are_gone() -> None:
    fleet = Fleet()
    fleet.set_backends([A, B])
    fleet.track(A, MODEL, 0, Arrival(10, 10))
    fleet.set_backends([B])
    assert fleet.anticipators.anticipator("pod-a").requests == 0  # a new, empty map


def fleet_with(picker: str) -> Fleet:
    fleet = Fleet(picker=fleet_picker(picker))
    fleet.set_models([MODEL])
    fleet.set_backends([A, B])
    return fleet


def test_preserve_avoids_the_pod_filling_up_where_least_request_takes_it() -> None:
    """pod-a: one request predicted to run 3,000 tokens; pod-b: two of 20 tokens. Fewest
    requests is pod-a; the anticipated load (PreServe Eq. 1) is pod-b's."""
    choices = {}
    for name in ("least-request", "preserve"):
        fleet = fleet_with(name)
        fleet.anticipators.set_capacity("pod-a", 20_000)
        fleet.anticipators.set_capacity("pod-b", 20_000)
        fleet.track(A, MODEL, 0, Arrival(200, 3000))
        fleet.track(B, MODEL, 0, Arrival(200, 20))
        fleet.track(B, MODEL, 0, Arrival(200, 20))
        choice = fleet.choose_backend(MODEL, "us-east", arrival=Arrival(200, 20))
        assert choice is not None
        choices[name] = choice.pod
    assert choices == {"least-request": "pod-a", "preserve": "pod-b"}


def test_without_a_named_picker_the_fewest_remaining_tokens_rule_stays() -> None:
    assert fleet_picker(REMAINING_TOKENS) is None
    fleet = fleet_with(REMAINING_TOKENS)
    fleet.start(A, 500.0)
    fleet.start(B, 100.0)
    fleet.start(B, 100.0)
    assert fleet.choose_backend(MODEL, "us-east", arrival=Arrival(10, 10)) == B


def test_an_unknown_picker_name_is_refused_with_the_choices() -> None:
    with pytest.raises(ValueError, match="preserve"):
        fleet_picker("fastest")
    with pytest.raises(ValueError, match="client-quantile"):
        PodAnticipators("psychic")


def test_the_completion_count_is_read_from_the_usage() -> None:
    tail = b'data: {"usage": {"prompt_tokens": 5, "completion_tokens": 42, "total_tokens": 47}}'
    assert reported_completion(tail) == 42
    assert reported_completion(b"data: [DONE]") is None


class UsagePod:
    """A stand-in vLLM pod answering `max_tokens` tokens with vLLM's usage object."""

    async def completions(self, request: web.Request) -> web.StreamResponse:
        body: dict[str, Any] = await request.json()
        n = int(body.get("max_tokens", 16))
        usage = {"prompt_tokens": 3, "completion_tokens": n, "total_tokens": n + 3}
        if not body.get("stream"):
            await asyncio.sleep(0.01)
            return web.json_response({"object": "text_completion", "usage": usage})
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for i in range(n):
            await response.write(f"data: {json.dumps({'token': i})}\n\n".encode())
        await response.write(f"data: {json.dumps({'usage': usage})}\n\n".encode())
        await response.write(b"data: [DONE]\n\n")
        return response


def test_proxied_answers_teach_the_predictor_and_export_normalized_latency() -> None:
    async def main() -> None:
        pod = UsagePod()
        app = web.Application()
        app.router.add_post("/v1/completions", pod.completions)
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        port = int(runner.addresses[0][1])
        backend = Backend("llm", "pod-a", "llama", "us-east", "a100", f"http://127.0.0.1:{port}")
        fleet = Fleet(picker=make_picker("preserve"))
        fleet.set_models([MODEL])
        fleet.set_tiers(MODEL.namespace, {"iw-f": TierMatch("iw-f", api_keys=("k1",))})
        fleet.set_backends([backend])
        metrics = RouterMetrics()
        router = Router(fleet, RouterConfig(), metrics)
        rrunner = web.AppRunner(router.app())
        await rrunner.setup()
        await web.TCPSite(rrunner, "127.0.0.1", 0).start()
        url = f"http://127.0.0.1:{int(rrunner.addresses[0][1])}/v1/completions"
        try:
            async with aiohttp.ClientSession() as client:
                for i in range(20):
                    req = {"model": MODEL.served_name, "prompt": "hi", "max_tokens": 40}
                    req["stream"] = bool(i % 2)
                    headers = {"Authorization": "Bearer k1", "x-sageserve-tier": "iw-f"}
                    async with client.post(url, json=req, headers=headers) as r:
                        assert r.status == 200
                        assert r.headers[POD_HEADER] == "pod-a"
                        await r.read()
        finally:
            await rrunner.cleanup()
            await runner.cleanup()
        predicted = fleet.anticipators.arrival(MODEL.served_name, client_id("k1"), 3)
        assert 35 <= predicted.predicted_output <= 45  # learnt from the usage: 40
        assert fleet.anticipators.anticipator("pod-a").requests == 0
        labels = {"namespace": "llm", "model_deployment": "llama", "region": "us-east"}
        count = metrics.registry.get_sample_value(
            "sageserve_router_normalized_latency_seconds_count", {**labels, "tier": "iw-f"}
        )
        assert count == 20
        # every answer counted by its lengths (3 prompt, 40 output tokens: buckets 4 and 64),
        # plain and streamed alike: the operator's history of OServe's request types
        shape = {**labels, "prompt_le": "4", "output_le": "64"}
        assert (
            metrics.registry.get_sample_value("sageserve_router_request_shapes_total", shape) == 20
        )

    run_loop(main())


@pytest.mark.parametrize(
    ("tokens", "bucket"),
    [(0, "1"), (1, "1"), (2, "2"), (3, "4"), (4096, "4096"), (4097, "8192"), (10**6, "+Inf")],
)
def test_a_length_falls_in_the_smallest_log2_bucket_that_holds_it(tokens: int, bucket: str) -> None:
    assert shape_bucket(tokens) == bucket
    if bucket != "+Inf":  # the bucket's representative length lies inside it
        assert int(bucket) / 2 < bucket_tokens(bucket) <= int(bucket)


def test_the_router_exports_each_pods_projected_kv_quantiles() -> None:
    fleet = fleet_with("preserve")
    fleet.anticipators.set_capacity("pod-a", 1000)
    fleet.track(A, MODEL, 0, Arrival(500, 600))  # 500 + i tokens: full from i = 500
    metrics = RouterMetrics()
    metrics.watch(fleet)
    labels = {"namespace": "llm", "model_deployment": "llama", "region": "us-east"}

    def q(pod: str, quantile: str) -> float | None:
        return metrics.registry.get_sample_value(
            "sageserve_router_projected_kv_usage", {**labels, "pod": pod, "quantile": quantile}
        )

    assert q("pod-a", "0") == pytest.approx(0.5)
    assert q("pod-a", "1") == pytest.approx(0.599)
    assert q("pod-b", "1") == 0.0  # an idle pod is exported too: nothing projected
