"""Hostile and broken clients and pods, over real sockets on loopback (docs/reliability.md).

The router runs as `sageserve router` runs it (`app.serve`: idle timeout, backlog, linger)
in front of stand-in pods; clients are raw sockets where an HTTP library would be too
polite (a body that never comes, headers a byte at a time, a 100 MB upload).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from sageserve.dispatch.tiers import TierMatch
from sageserve.router.app import Router, RouterConfig, serve
from sageserve.router.fleet import Backend, Fleet, ModelRoute
from sageserve.router.metrics import RouterMetrics

MODEL = ModelRoute("team-a", "llama", "meta-llama/Llama-3.1-8B", ("us-east",), ("iw-f", "iw-n"))
BODY = {"model": MODEL.served_name, "prompt": "hello", "max_tokens": 8}
#: team-a's key (team-a lists keys, so every request of it must carry one)
AUTH = {"Authorization": "Bearer sk-a"}


class Pods:
    """Stand-in vLLM pods; the names in `hang` accept a request and never answer."""

    def __init__(self) -> None:
        self.hang: set[str] = set()
        self.got: dict[str, int] = {}

    def app(self, name: str) -> web.Application:
        async def completions(request: web.Request) -> web.StreamResponse:
            await request.read()
            self.got[name] = self.got.get(name, 0) + 1
            if name in self.hang:
                await asyncio.sleep(3600)
            response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await response.prepare(request)
            await response.write(f"data: {json.dumps({'pod': name})}\n\ndata: [DONE]\n\n".encode())
            return response

        app = web.Application()
        app.router.add_post("/v1/completions", completions)
        return app


@contextlib.asynccontextmanager
async def router(**config: Any) -> AsyncIterator[tuple[int, Pods, RouterMetrics]]:
    """Two pods in us-east and a router served by `serve`; yields (port, pods, metrics)."""
    pods, runners, backends = Pods(), [], []
    for name in ("east-0", "east-1"):
        runner = web.AppRunner(pods.app(name), handler_cancellation=True)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        runners.append(runner)
        url = f"http://127.0.0.1:{runner.addresses[0][1]}"
        backends.append(Backend("team-a", name, "llama", "us-east", "a100", url))
    fleet = Fleet()
    fleet.set_models([MODEL])
    fleet.set_tiers(
        "team-a", {"iw-f": TierMatch("iw-f"), "iw-n": TierMatch("iw-n", api_keys=("sk-a",))}
    )
    fleet.set_tiers("team-b", {"iw-f": TierMatch("iw-f", api_keys=("sk-b",))})
    fleet.set_backends(backends)
    metrics = RouterMetrics()
    bound: asyncio.Future[int] = asyncio.get_running_loop().create_future()

    async def ready(port: int) -> None:
        bound.set_result(port)

    the_router = Router(fleet, RouterConfig(**config), metrics)
    task = asyncio.create_task(serve(the_router, "127.0.0.1", 0, ready))
    try:
        yield await bound, pods, metrics
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        for r in runners:
            await r.cleanup()


def run(scenario: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(scenario())


async def head(port: int, length: int, extra: str = "") -> tuple[asyncio.StreamReader, Any]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(
        (
            "POST /v1/completions HTTP/1.1\r\nHost: router\r\n"
            "Authorization: Bearer sk-a\r\n"
            f"Content-Type: application/json\r\nContent-Length: {length}\r\n{extra}\r\n"
        ).encode()
    )
    await writer.drain()
    return reader, writer


def test_a_body_declared_over_the_limit_is_refused_before_it_is_sent() -> None:
    async def scenario() -> None:
        async with router(max_body_bytes=1024) as (port, pods, _):
            reader, writer = await head(port, 100 * 1024 * 1024)  # 100 MB, none of it sent
            status = await asyncio.wait_for(reader.readline(), 5)
            assert status.startswith(b"HTTP/1.1 413"), status
            writer.close()
            # with Expect: 100-continue, no 100 Continue: a polite client never sends it
            reader, writer = await head(port, 100 * 1024 * 1024, "Expect: 100-continue\r\n")
            status = await asyncio.wait_for(reader.readline(), 5)
            assert status.startswith(b"HTTP/1.1 413"), status
            writer.close()
            assert pods.got == {}

    run(scenario)


def test_an_allowed_body_with_expect_continue_is_asked_for_and_served() -> None:
    async def scenario() -> None:
        async with (
            router() as (port, _, _),
            aiohttp.ClientSession(headers=AUTH) as client,
            client.post(f"http://127.0.0.1:{port}/v1/completions", json=BODY, expect100=True) as r,
        ):
            assert r.status == 200

    run(scenario)


@pytest.mark.slow
def test_a_body_that_never_arrives_is_answered_408_within_the_body_timeout() -> None:
    async def scenario() -> None:
        async with router(body_timeout_seconds=0.5) as (port, pods, _):
            reader, writer = await head(port, 500)
            writer.write(b'{"model": ')  # and nothing more
            started = time.monotonic()
            status = await asyncio.wait_for(reader.readline(), 5)
            assert status.startswith(b"HTTP/1.1 408"), status
            assert time.monotonic() - started < 2
            assert await asyncio.wait_for(reader.read(), 5) is not None  # then closed
            writer.close()
            assert pods.got == {}

    run(scenario)


def test_a_client_dribbling_its_headers_is_cut_off_at_the_idle_timeout() -> None:
    async def scenario() -> None:
        async with router(idle_timeout_seconds=1.0) as (port, _, _):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            started = time.monotonic()
            closed_after = None
            for byte in b"POST /v1/completions HTTP/1.1\r\nHost: router\r\nX-Slow: " + b"a" * 60:
                try:
                    writer.write(bytes([byte]))
                    await writer.drain()
                    if await asyncio.wait_for(reader.read(1), 0.1) == b"":
                        closed_after = time.monotonic() - started
                        break
                except TimeoutError:
                    continue
                except ConnectionError:
                    closed_after = time.monotonic() - started
                    break
            writer.close()
            assert closed_after is not None and closed_after < 3, closed_after

    run(scenario)


def test_identity_decides_the_tenant_and_tier_and_a_header_only_narrows() -> None:
    cases: list[tuple[str | None, str | None, int]] = [
        ("sk-b", None, 404),  # another tenant's model does not exist for its key
        ("sk-nobody", None, 401),
        (None, None, 401),  # team-a lists keys: no key, no entry
        (None, "iw-f", 401),  # and a header grants nothing
        ("sk-a", "iw-f", 403),  # sk-a may use iw-n only: the header may not raise it
        ("sk-a", None, 200),
        ("sk-a", "iw-n", 200),
    ]

    async def scenario() -> None:
        async with router() as (port, pods, metrics), aiohttp.ClientSession() as client:
            url = f"http://127.0.0.1:{port}/v1/completions"
            for key, tier, status in cases:
                headers = {"Authorization": f"Bearer {key}"} if key else {}
                if tier:
                    headers["x-sageserve-tier"] = tier
                async with client.post(url, json=BODY, headers=headers) as r:
                    assert r.status == status, (key, tier)
                    if status != 200:
                        message = (await r.json())["error"]["message"]
                        assert "team-b" not in message  # whose key it is stays unsaid
                        assert "team-a" not in message
            models = f"http://127.0.0.1:{port}/v1/models"
            async with client.get(models, headers={"Authorization": "Bearer sk-b"}) as r:
                assert (await r.json())["data"] == []  # team-b sees none of team-a's models
            async with client.get(models) as r:  # anonymous: only open namespaces' models
                assert (await r.json())["data"] == []
            assert sum(pods.got.values()) == 2
            tier_n = metrics.registry.get_sample_value(
                "sageserve_router_requests_total",
                dict(
                    namespace="team-a",
                    model_deployment="llama",
                    region="us-east",
                    tier="iw-n",
                    code="200",
                ),
            )
            assert tier_n == 2

    run(scenario)


def test_a_hung_pod_costs_one_stall_timeout_then_is_avoided() -> None:
    async def scenario() -> None:
        async with (
            router(stall_timeout_seconds=0.5, eject_seconds=30) as (port, pods, metrics),
            aiohttp.ClientSession(headers=AUTH) as client,
        ):
            pods.hang.add("east-0")  # first by name: the picker's first choice
            url = f"http://127.0.0.1:{port}/v1/completions"
            took = []
            for _ in range(4):
                started = time.monotonic()
                async with client.post(url, json={**BODY, "stream": True}) as r:
                    assert r.status == 200
                    assert b"east-1" in await r.read()
                took.append(time.monotonic() - started)
            assert 0.5 <= took[0] < 2, took  # one stall timeout, then the retry
            assert max(took[1:]) < 0.4, took  # the hung pod is out of rotation
            assert pods.got["east-0"] == 1
            retries = metrics.registry.get_sample_value(
                "sageserve_router_retries_total",
                dict(namespace="team-a", model_deployment="llama", region="us-east"),
            )
            assert retries == 1
            # every pod hung: a bounded 502, never a request held forever
            pods.hang.add("east-1")
            started = time.monotonic()
            async with client.post(url, json={**BODY, "stream": True}) as r:
                assert r.status == 502
            assert time.monotonic() - started < 3

    run(scenario)
