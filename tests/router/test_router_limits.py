"""Per-tenant rate limits over real sockets on loopback: the router as `sageserve router`
runs it (`app.serve`) in front of stand-in pods, its limiter on a clock the test moves, so
nothing sleeps (docs/router.md, "Rate limits")."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from sageserve.dispatch.rate_limit import Limits
from sageserve.dispatch.tiers import TierMatch
from sageserve.router.app import Router, RouterConfig, serve
from sageserve.router.discovery import Discovery
from sageserve.router.fleet import Backend, Fleet, ModelRoute
from sageserve.router.limits import TierLimits
from sageserve.router.metrics import RouterMetrics

#: team-a's model: a per-key tier, a per-tier tier, a token-limited tier, an unlimited one
MODEL_A = ModelRoute(
    "team-a", "llama", "meta-llama/Llama-3.1-8B", ("us-east",), ("iw-n", "shared", "tok", "free")
)
#: team-b's model: its tier has team-a's busiest tier's name and a per-tier limit
MODEL_B = ModelRoute("team-b", "llama", "team-b/llama", ("us-east",), ("iw-n",))
SHARED_3 = Limits(requests_per_minute=3, per_tier=True)
TIERS_A = {
    "iw-n": TierMatch("iw-n", api_keys=("sk-a1", "sk-a2"), limits=Limits(requests_per_minute=3)),
    "shared": TierMatch("shared", api_keys=("sk-s1", "sk-s2"), limits=SHARED_3),
    "tok": TierMatch("tok", api_keys=("sk-t",), limits=Limits(tokens_per_minute=1000)),
    "free": TierMatch("free", api_keys=("sk-free",)),
}
TIERS_B = {"iw-n": TierMatch("iw-n", api_keys=("sk-b",), limits=SHARED_3)}
#: prompt 400 characters (100 tokens) + max_tokens 500: 600 estimated tokens
COSTLY = {"prompt": "x" * 400, "max_tokens": 500}


@dataclass
class Clock:
    now: float = 1000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Env:
    url: str
    clock: Clock
    got: dict[str, int]
    metrics: RouterMetrics
    router: Router
    client: aiohttp.ClientSession

    async def post(
        self, key: str, model: ModelRoute = MODEL_A, **body: Any
    ) -> tuple[int, dict[str, str], Any]:
        payload = {"model": model.served_name, "prompt": "hello", "max_tokens": 8, **body}
        headers = {"Authorization": f"Bearer {key}"}
        async with self.client.post(self.url, json=payload, headers=headers) as r:
            text = await r.text()
            return r.status, dict(r.headers), json.loads(text) if r.status >= 400 else text

    def limited(self, namespace: str, tier: str, limit: str) -> float:
        value = self.metrics.registry.get_sample_value(
            "sageserve_router_rate_limited_total",
            {"namespace": namespace, "tier": tier, "limit": limit},
        )
        return value or 0.0


@contextlib.asynccontextmanager
async def router() -> AsyncIterator[Env]:
    """One stand-in pod per tenant and a router served by `serve`."""
    got: dict[str, int] = {}

    def pod(name: str) -> web.Application:
        async def completions(request: web.Request) -> web.StreamResponse:
            await request.read()
            got[name] = got.get(name, 0) + 1
            response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await response.prepare(request)
            await response.write(b'data: {"ok": 1}\n\ndata: [DONE]\n\n')
            return response

        app = web.Application()
        app.router.add_post("/v1/completions", completions)
        return app

    runners, backends = [], []
    for ns in ("team-a", "team-b"):
        app = pod(ns)
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        runners.append(runner)
        url = f"http://127.0.0.1:{runner.addresses[0][1]}"
        backends.append(Backend(ns, f"{ns}-0", "llama", "us-east", "a100", url))
    fleet = Fleet()
    fleet.set_models([MODEL_A, MODEL_B])
    fleet.set_tiers("team-a", TIERS_A)
    fleet.set_tiers("team-b", TIERS_B)
    fleet.set_backends(backends)
    metrics, clock = RouterMetrics(), Clock()
    the_router = Router(fleet, RouterConfig(), metrics, limits=TierLimits(fleet, metrics, clock))
    bound: asyncio.Future[int] = asyncio.get_running_loop().create_future()

    async def ready(port: int) -> None:
        bound.set_result(port)

    task = asyncio.create_task(serve(the_router, "127.0.0.1", 0, ready))
    try:
        port = await bound
        async with aiohttp.ClientSession() as client:
            url = f"http://127.0.0.1:{port}/v1/completions"
            yield Env(url, clock, got, metrics, the_router, client)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        for r in runners:
            await r.cleanup()


def test_a_tier_limited_to_n_requests_answers_n_then_429_with_retry_after() -> None:
    async def scenario() -> None:
        async with router() as env:
            for left in (2, 1, 0):
                status, headers, _ = await env.post("sk-a1")
                assert status == 200
                assert headers["x-ratelimit-limit-requests"] == "3"
                assert headers["x-ratelimit-remaining-requests"] == str(left)
                assert "x-ratelimit-limit-tokens" not in headers  # the tier sets no TPM
            status, headers, body = await env.post("sk-a1")
            assert status == 429
            assert headers["Retry-After"] == "20"  # one request refills every 60 s / 3
            assert headers["x-ratelimit-remaining-requests"] == "0"
            assert headers["x-ratelimit-reset-requests"] == "1m0s"
            error = body["error"]
            assert (error["type"], error["code"]) == ("requests", "rate_limit_exceeded")
            assert "'iw-n'" in error["message"] and "Limit 3" in error["message"]
            assert "try again in 20s" in error["message"]
            assert env.got == {"team-a": 3}, "a refused request reaches no pod"
            assert env.limited("team-a", "iw-n", "requests") == 1
            env.clock.now += 19.0
            assert (await env.post("sk-a1"))[1]["Retry-After"] == "1"
            env.clock.now += 1.0
            assert (await env.post("sk-a1"))[0] == 200  # refilled, no sleep needed
            assert env.limited("team-a", "iw-n", "requests") == 2

    asyncio.run(scenario())


@pytest.mark.parametrize(
    ("first", "second", "tier", "second_status"),
    [
        ("sk-a1", "sk-a2", "iw-n", 200),  # per: key, each key its own budget
        ("sk-s1", "sk-s2", "shared", 429),  # per: tier, the keys share one
    ],
)
def test_a_second_key_of_the_tier_shares_the_budget_only_per_tier(
    first: str, second: str, tier: str, second_status: int
) -> None:
    async def scenario() -> None:
        async with router() as env:
            for _ in range(3):
                assert (await env.post(first))[0] == 200
            assert (await env.post(first))[0] == 429
            status, headers, _ = await env.post(second)
            assert status == second_status
            remaining = "2" if second_status == 200 else "0"
            assert headers["x-ratelimit-remaining-requests"] == remaining
            assert env.limited("team-a", tier, "requests") == (1 if second_status == 200 else 2)

    asyncio.run(scenario())


def test_another_tenant_is_never_affected() -> None:
    async def scenario() -> None:
        async with router() as env:
            for key in ("sk-a1", "sk-a2", "sk-s1"):  # every limited team-a budget spent
                for _ in range(4):
                    await env.post(key)
            for left in (2, 1, 0):  # team-b's tier of the same name: a budget of its own
                status, headers, _ = await env.post("sk-b", MODEL_B)
                assert status == 200
                assert headers["x-ratelimit-remaining-requests"] == str(left)
            assert (await env.post("sk-b", MODEL_B))[0] == 429
            assert env.limited("team-b", "iw-n", "requests") == 1
            assert env.limited("team-a", "iw-n", "requests") == 2

    asyncio.run(scenario())


def test_tokens_per_minute_count_the_max_tokens_budget() -> None:
    async def scenario() -> None:
        async with router() as env:
            status, headers, _ = await env.post("sk-t", **COSTLY)
            assert status == 200
            assert headers["x-ratelimit-limit-tokens"] == "1000"
            assert headers["x-ratelimit-remaining-tokens"] == "400"
            assert headers["x-ratelimit-reset-tokens"] == "36s"
            assert "x-ratelimit-limit-requests" not in headers
            status, headers, body = await env.post("sk-t", **COSTLY)
            assert status == 429
            assert headers["Retry-After"] == "12"  # 200 tokens short at 1000 a minute
            assert body["error"]["type"] == "tokens"
            assert "Limit 1000, Requested 600" in body["error"]["message"]
            assert (await env.post("sk-t", prompt="hi", max_tokens=300))[0] == 200  # fits
            assert env.limited("team-a", "tok", "tokens") == 1

    asyncio.run(scenario())


def test_a_request_over_the_whole_token_budget_is_refused_without_a_retry_after() -> None:
    async def scenario() -> None:
        async with router() as env:
            status, headers, body = await env.post("sk-t", max_tokens=100_000)
            assert status == 429
            assert "Retry-After" not in headers  # no wait would admit it
            assert body["error"]["code"] == "rate_limit_exceeded"
            assert "Request too large" in body["error"]["message"]
            assert "max_tokens" in body["error"]["message"]
            assert headers["x-ratelimit-remaining-tokens"] == "1000"  # charged nothing
            assert (await env.post("sk-t", **COSTLY))[0] == 200

    asyncio.run(scenario())


def test_an_unlimited_tier_carries_no_rate_limit_headers() -> None:
    async def scenario() -> None:
        async with router() as env:
            for _ in range(10):
                status, headers, _ = await env.post("sk-free")
                assert status == 200
                assert not [h for h in headers if h.lower().startswith("x-ratelimit")]

    asyncio.run(scenario())


def test_batch_api_lines_released_by_the_queue_are_not_rate_limited() -> None:
    """`Router.execute` (a Batch API line the Queue Manager released) is paced by the
    queue: the tier's exhausted budget does not refuse it, nor does it spend any."""

    async def scenario() -> None:
        async with router() as env:
            body = {"model": MODEL_A.served_name, "prompt": "hello", "max_tokens": 8}
            for _ in range(5):
                done = await env.router.execute("/v1/completions", body, MODEL_A, "us-east", "iw-n")
                assert done is not None and done[0] == 200
            for _ in range(3):
                assert (await env.post("sk-a1"))[0] == 200

    asyncio.run(scenario())


def test_discovery_carries_a_tiers_limits_into_its_match() -> None:
    class Loop:
        def call_soon_threadsafe(self, fn: Any, *args: Any) -> None:
            fn(*args)

    def tier(name: str, limits: dict[str, Any] | None) -> dict[str, Any]:
        spec: dict[str, Any] = {"type": "interactive", "priority": 1, "slo": {"ttftP95Seconds": 1}}
        if limits is not None:
            spec["limits"] = limits
        return {
            "apiVersion": "sageserve.io/v1alpha1",
            "kind": "WorkloadTier",
            "metadata": {"name": name, "namespace": "team-a", "uid": name},
            "spec": spec,
        }

    fleet = Fleet()
    discovery = Discovery(fleet, Loop(), ["team-a"])  # type: ignore[arg-type]
    discovery._tiers_for("team-a")(
        [
            tier("keyed", {"requestsPerMinute": 60}),
            tier("shared", {"tokensPerMinute": 9000, "per": "tier"}),
            tier("open", None),
            tier("empty", {"per": "tier"}),  # names no limit (the API server refuses it)
        ]
    )
    tiers = fleet.tiers["team-a"]
    assert tiers["keyed"].limits == Limits(requests_per_minute=60)
    assert tiers["shared"].limits == Limits(tokens_per_minute=9000, per_tier=True)
    assert tiers["open"].limits is None
    assert tiers["empty"].limits is None
