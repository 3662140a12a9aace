"""The router over real HTTP on loopback, in front of stand-in vLLM pods.

The stand-ins answer the OpenAI API (plain and streamed) and can fail on purpose; the
router's fleet is filled as discovery would fill it. What a client sees is asserted:
status codes, OpenAI-shaped errors, streamed chunks, retries, holding while a model comes
from zero, and the region the global router picks.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

from sageserve.dispatch.tiers import TierMatch
from sageserve.router.app import Router, RouterConfig, run_loop
from sageserve.router.fleet import Backend, Fleet, ModelRoute
from sageserve.router.metrics import RouterMetrics

MODEL = ModelRoute(
    "llm", "llama", "meta-llama/Llama-3.1-8B", ("us-east", "us-west"), ("iw-f", "niw")
)


class Pod:
    """A stand-in vLLM pod: records what it got; `fail` makes it answer 500."""

    def __init__(self, name: str, fail: bool = False) -> None:
        self.name = name
        self.fail = fail
        self.got: list[dict[str, Any]] = []

    async def completions(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.got.append(body)
        if self.fail:
            return web.json_response({"error": "boom"}, status=500)
        if not body.get("stream"):
            return web.json_response({"object": "text_completion", "pod": self.name})
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for i in range(3):
            await response.write(f"data: {json.dumps({'token': i, 'pod': self.name})}\n\n".encode())
            await asyncio.sleep(0.01)
        await response.write(b"data: [DONE]\n\n")
        return response


async def start(app: web.Application) -> tuple[web.AppRunner, int]:
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, int(runner.addresses[0][1])


Scenario = Callable[
    [aiohttp.ClientSession, str, Fleet, dict[str, Pod], RouterMetrics], Awaitable[None]
]


def run(
    scenario: Scenario, pods: dict[str, tuple[str, bool]], loop: str = "asyncio", **config: Any
) -> None:
    """Start the pods {name: (region, fail)} and a router in front of them; run `scenario`."""

    async def main() -> None:
        runners, stand_ins, backends = [], {}, []
        for name, (region, fail) in pods.items():
            pod = Pod(name, fail)
            app = web.Application(client_max_size=64 * 1024 * 1024)
            app.router.add_post("/v1/completions", pod.completions)
            app.router.add_post("/v1/chat/completions", pod.completions)
            runner, port = await start(app)
            runners.append(runner)
            stand_ins[name] = pod
            backends.append(
                Backend("llm", name, "llama", region, "a100", f"http://127.0.0.1:{port}")
            )
        fleet = Fleet()
        fleet.set_models([MODEL])
        fleet.set_tiers(
            "llm", {"iw-f": TierMatch("iw-f", ("fast",)), "niw": TierMatch("niw", batch=True)}
        )
        fleet.set_backends(backends)
        metrics = RouterMetrics()
        metrics.watch(fleet)
        router = Router(fleet, RouterConfig(**{"hold_seconds": 5.0, **config}), metrics)
        runner, port = await start(router.app())
        runners.append(runner)
        try:
            async with aiohttp.ClientSession() as client:
                await scenario(client, f"http://127.0.0.1:{port}", fleet, stand_ins, metrics)
        finally:
            for r in runners:
                await r.cleanup()

    run_loop(main(), loop)


def body(**kw: Any) -> dict[str, Any]:
    return {"model": MODEL.served_name, "prompt": "hello", "max_tokens": 8, **kw}


def sample(metrics: RouterMetrics, name: str, **labels: str) -> float:
    value = metrics.registry.get_sample_value(name, labels)
    return value or 0.0


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])  # uvloop: in the test extras
def test_a_request_reaches_a_pod_with_its_tier_counted(loop: str) -> None:
    async def scenario(client, url, fleet, pods, metrics) -> None:  # type: ignore[no-untyped-def]
        async with client.post(
            f"{url}/v1/completions", json=body(), headers={"x-sageserve-tier": "fast"}
        ) as r:
            assert r.status == 200
            assert (await r.json())["pod"] == "east-0"
        assert pods["east-0"].got == [body()]
        labels = dict(
            namespace="llm", model_deployment="llama", region="us-east", tier="iw-f", code="200"
        )
        assert sample(metrics, "sageserve_router_requests_total", **labels) == 1

    run(scenario, {"east-0": ("us-east", False), "west-0": ("us-west", False)}, loop)


def test_the_router_exports_its_emu_estimate_with_what_it_sent_since_the_last_reading() -> None:
    """What the Queue Manager decides on is visible at /metrics: Prometheus' reading plus
    the tokens sent since (a 100-token request on 1,000 tokens of cache adds 10 %)."""

    async def scenario(client, url, fleet, pods, metrics) -> None:  # type: ignore[no-untyped-def]
        east, west = ("llm", "llama", "us-east"), ("llm", "llama", "us-west")
        fleet.set_load({east: (0.55, 1000.0), west: (0.2, 1000.0)})

        async def emu() -> dict[str, float]:
            async with client.get(f"{url}/metrics") as r:
                text = await r.text()
            return {
                s.labels["region"]: s.value
                for f in text_string_to_metric_families(text)
                for s in f.samples
                if s.name == "sageserve_router_endpoint_emu"
            }

        assert await emu() == {"us-east": 0.55, "us-west": 0.2}
        fleet.start(fleet.backends[east][0], 100.0)
        assert (await emu())["us-east"] == pytest.approx(0.65)

    run(scenario, {"east-0": ("us-east", False), "west-0": ("us-west", False)})


def test_streamed_tokens_pass_through_as_server_sent_events() -> None:
    async def scenario(client, url, fleet, pods, metrics) -> None:  # type: ignore[no-untyped-def]
        async with client.post(f"{url}/v1/chat/completions", json=body(stream=True)) as r:
            assert r.status == 200 and r.content_type == "text/event-stream"
            events = [line async for line in r.content if line.strip()]
        assert [json.loads(e[6:])["token"] for e in events[:-1]] == [0, 1, 2]
        assert events[-1].strip() == b"data: [DONE]"

    run(scenario, {"east-0": ("us-east", False)})


def test_bad_input_gets_openai_shaped_errors_naming_the_field() -> None:
    async def scenario(client, url, fleet, pods, metrics) -> None:  # type: ignore[no-untyped-def]
        cases = [
            (b"{not json", {}, 400, "not JSON"),
            (json.dumps({"prompt": "x"}).encode(), {}, 400, "model: required"),
            (json.dumps(body(model="gpt-9")).encode(), {}, 404, "not served here"),
            (
                json.dumps(body()).encode(),
                {"x-sageserve-tier": "iw-n"},
                400,
                "use one of iw-f, niw",
            ),
            (b"x" * 2048, {}, 413, "over 1024 bytes"),
        ]
        for data, headers, status, message in cases:
            async with client.post(f"{url}/v1/completions", data=data, headers=headers) as r:
                assert r.status == status, message
                assert message in (await r.json())["error"]["message"]

        async def chunked() -> Any:  # no Content-Length: refused once it passes the limit
            for _ in range(4):
                yield b"x" * 512

        async with client.post(f"{url}/v1/completions", data=chunked()) as r:
            assert r.status == 413 and "over 1024 bytes" in (await r.json())["error"]["message"]
        assert all(not p.got for p in pods.values())  # nothing reached a pod

    run(scenario, {"east-0": ("us-east", False)}, max_body_bytes=1024)


def test_a_pod_failing_before_the_first_byte_is_retried_once_elsewhere() -> None:
    async def scenario(client, url, fleet, pods, metrics) -> None:  # type: ignore[no-untyped-def]
        async with client.post(f"{url}/v1/completions", json=body()) as r:
            assert r.status == 200 and (await r.json())["pod"] == "east-1"
        assert len(pods["east-0"].got) == 1  # tried first (fewest tokens, first by name)
        assert (
            sample(
                metrics,
                "sageserve_router_retries_total",
                namespace="llm",
                model_deployment="llama",
                region="us-east",
            )
            == 1
        )

    run(scenario, {"east-0": ("us-east", True), "east-1": ("us-east", False)})


def test_a_model_at_zero_holds_requests_publishes_the_demand_and_serves_once_a_pod_is_ready() -> (
    None
):
    async def scenario(client, url, fleet, pods, metrics) -> None:  # type: ignore[no-untyped-def]
        ready = fleet.backends.copy()
        fleet.set_backends([])
        request = asyncio.ensure_future(client.post(f"{url}/v1/completions", json=body()))
        held = dict(namespace="llm", model_deployment="llama", region="us-east")
        for _ in range(100):
            if sample(metrics, "sageserve_router_held_requests", **held) == 1:
                break
            await asyncio.sleep(0.02)
        assert sample(metrics, "sageserve_router_held_requests", **held) == 1
        fleet.set_backends([b for bs in ready.values() for b in bs])  # the operator scaled 0 → 1
        r = await request
        assert r.status == 200 and (await r.json())["pod"] == "east-0"
        assert sample(metrics, "sageserve_router_held_requests", **held) == 0

    run(scenario, {"east-0": ("us-east", False)})


def test_a_replica_that_has_not_listed_the_cluster_holds_requests_and_is_not_ready() -> None:
    """A router replica just started (a rolling update, a second replica) does not know the
    models yet: a request waits for discovery's first lists instead of a 404 for a model
    that exists, and /readyz keeps the Service off the replica meanwhile."""

    async def scenario(client, url, fleet, pods, metrics) -> None:  # type: ignore[no-untyped-def]
        fleet.listed.clear()
        fleet.set_models([])  # as discovery starts: nothing listed yet
        request = asyncio.ensure_future(client.post(f"{url}/v1/completions", json=body()))
        async with client.get(f"{url}/readyz") as r:
            assert r.status == 503
        async with client.get(f"{url}/healthz") as r:
            assert r.status == 200  # alive all along: no restart for being new
        await asyncio.sleep(0.3)
        assert not request.done() and pods["east-0"].got == []
        fleet.set_models([MODEL])  # discovery's lists land
        fleet.listed.set()
        r = await request
        assert r.status == 200 and (await r.json())["pod"] == "east-0"
        async with client.get(f"{url}/readyz") as r:
            assert r.status == 200

    run(scenario, {"east-0": ("us-east", False)})


def test_a_hold_that_runs_out_answers_503_with_retry_after() -> None:
    async def scenario(client, url, fleet, pods, metrics) -> None:  # type: ignore[no-untyped-def]
        fleet.set_backends([])
        async with client.post(f"{url}/v1/completions", json=body()) as r:
            assert r.status == 503 and r.headers["Retry-After"] == "30"
            assert (await r.json())["error"]["code"] == "model_starting"

    run(scenario, {"east-0": ("us-east", False)}, hold_seconds=0.2)


def test_requests_spill_to_another_region_only_above_the_threshold() -> None:
    async def scenario(client, url, fleet, pods, metrics) -> None:  # type: ignore[no-untyped-def]
        east = ("llm", "llama", "us-east")
        west = ("llm", "llama", "us-west")
        fleet.set_load({east: (0.65, 1e9), west: (0.1, 1e9)})
        async with client.post(f"{url}/v1/completions", json=body()) as r:
            assert (await r.json())["pod"] == "east-0"  # home region under 70 %: stays
        fleet.set_load({east: (0.75, 1e9), west: (0.1, 1e9)})
        async with client.post(f"{url}/v1/completions", json=body()) as r:
            assert (await r.json())["pod"] == "west-0"  # above 70 %: the next region
        async with client.post(
            f"{url}/v1/completions", json=body(), headers={"x-sageserve-region": "us-west"}
        ) as r:
            assert (await r.json())["pod"] == "west-0"  # a client in us-west stays home

    run(
        scenario,
        {"east-0": ("us-east", False), "west-0": ("us-west", False)},
        home_region="us-east",
    )


def test_a_client_that_goes_away_mid_stream_cancels_the_pods_request() -> None:
    cut: list[str] = []

    async def slow(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        try:
            for i in range(200):
                await response.write(f"data: {i}\n\n".encode())
                await asyncio.sleep(0.02)
        except (ConnectionResetError, asyncio.CancelledError):
            cut.append("upstream closed")
            raise
        return response

    async def main() -> None:
        pod = web.Application()
        pod.router.add_post("/v1/completions", slow)
        pod_runner = web.AppRunner(pod, handler_cancellation=True)
        await pod_runner.setup()
        await web.TCPSite(pod_runner, "127.0.0.1", 0).start()
        fleet = Fleet()
        fleet.set_models([MODEL])
        url = f"http://127.0.0.1:{pod_runner.addresses[0][1]}"
        fleet.set_backends([Backend("llm", "east-0", "llama", "us-east", "a100", url)])
        router_runner = web.AppRunner(
            Router(fleet, RouterConfig(), RouterMetrics()).app(), handler_cancellation=True
        )
        await router_runner.setup()
        await web.TCPSite(router_runner, "127.0.0.1", 0).start()
        port = router_runner.addresses[0][1]
        try:
            async with aiohttp.ClientSession() as client:
                resp = await client.post(
                    f"http://127.0.0.1:{port}/v1/completions", json=body(stream=True)
                )
                assert (await resp.content.readline()).startswith(b"data: 0")
                resp.close()  # the client goes away
            for _ in range(100):
                if cut:
                    break
                await asyncio.sleep(0.02)
            assert cut == ["upstream closed"]  # well before the pod's 4 s answer ends
        finally:
            await router_runner.cleanup()
            await pod_runner.cleanup()

    asyncio.run(main())


def test_a_batch_tier_request_waits_for_the_trough_and_an_interactive_one_does_not() -> None:
    async def scenario(client, url, fleet, pods, metrics) -> None:  # type: ignore[no-untyped-def]
        fleet.set_load({("llm", "llama", "us-east"): (0.8, 1000.0)})  # above 60 %: no release
        niw = {"x-sageserve-tier": "niw", "x-sageserve-region": "us-east"}
        batch = asyncio.create_task(client.post(f"{url}/v1/completions", json=body(), headers=niw))
        await asyncio.sleep(0.3)
        labels = dict(namespace="llm", model_deployment="llama", region="us-east", tier="niw")
        assert sample(metrics, "sageserve_router_deferred_requests", **labels) == 1
        assert pods["east-0"].got == []
        interactive = {"x-sageserve-region": "us-east"}
        async with client.post(f"{url}/v1/completions", json=body(), headers=interactive) as r:
            assert r.status == 200  # the interactive request is not held behind it
        assert len(pods["east-0"].got) == 1
        fleet.set_load({("llm", "llama", "us-east"): (0.4, 1000.0)})  # the trough
        async with await batch as r:
            assert r.status == 200
        assert len(pods["east-0"].got) == 2
        assert sample(metrics, "sageserve_router_deferred_requests", **labels) == 0

    run(scenario, {"east-0": ("us-east", False)})


def test_a_deferred_batch_request_is_served_when_the_hold_time_runs_out() -> None:
    async def scenario(client, url, fleet, pods, metrics) -> None:  # type: ignore[no-untyped-def]
        fleet.set_load({("llm", "llama", "us-east"): (0.95, 1000.0)})  # never a trough
        niw = {"x-sageserve-tier": "niw", "x-sageserve-region": "us-east"}
        async with client.post(f"{url}/v1/completions", json=body(), headers=niw) as r:
            assert r.status == 200  # late, never dropped
        assert len(pods["east-0"].got) == 1

    run(scenario, {"east-0": ("us-east", False)}, hold_seconds=0.5)
