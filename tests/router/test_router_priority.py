"""The router carries the caller's tier to vLLM as the request's `priority` (SageServe v3
§6.5 on Kubernetes): the model's ScalingPolicy's `spec.instanceScheduling` says how, the
caller's API key decides the tier, a header only narrows among the key's tiers, and a
client's own `priority` never reaches the pod. Over real sockets on loopback."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from sageserve.dispatch.instance_order import InstanceScheduling, OrderPolicy
from sageserve.dispatch.tiers import TierMatch
from sageserve.router.app import Router, RouterConfig, serve
from sageserve.router.discovery import Discovery
from sageserve.router.fleet import Backend, Fleet, ModelRoute
from sageserve.router.metrics import RouterMetrics
from tests.router.test_router_policy_rules import Loop, deployment

MODEL = ModelRoute("llm", "llama", "meta-llama/Llama-3.1-8B", ("us-east",), ("iw-f", "iw-n"))
TIERS = {
    "iw-f": TierMatch("iw-f", api_keys=("sk-fast", "sk-both"), priority=0, ttft_slo_s=1.0),
    "iw-n": TierMatch("iw-n", api_keys=("sk-normal", "sk-both"), priority=1, ttft_slo_s=60.0),
}


@contextlib.asynccontextmanager
async def router(policy: OrderPolicy) -> AsyncIterator[tuple[str, list[dict[str, Any]]]]:
    """A stand-in pod recording the bodies it gets, behind a router whose model's policy
    orders instances by `policy`."""
    got: list[dict[str, Any]] = []

    async def completions(request: web.Request) -> web.StreamResponse:
        got.append(await request.json())
        return web.json_response({"object": "text_completion"})

    app = web.Application()
    app.router.add_post("/v1/completions", completions)
    pod = web.AppRunner(app)
    await pod.setup()
    await web.TCPSite(pod, "127.0.0.1", 0).start()
    url = f"http://127.0.0.1:{pod.addresses[0][1]}"
    fleet = Fleet()
    fleet.set_models([replace(MODEL, instance_scheduling=InstanceScheduling(policy))])
    fleet.set_tiers("llm", TIERS)
    fleet.set_backends([Backend("llm", "pod-0", "llama", "us-east", "a100", url)])
    the_router = Router(fleet, RouterConfig(), RouterMetrics())
    bound: asyncio.Future[int] = asyncio.get_running_loop().create_future()

    async def ready(port: int) -> None:
        bound.set_result(port)

    task = asyncio.create_task(serve(the_router, "127.0.0.1", 0, ready))
    try:
        port = await bound
        yield f"http://127.0.0.1:{port}/v1/completions", got
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await pod.cleanup()


async def post(url: str, key: str, tier: str | None = None, **extra: Any) -> int:
    headers = {"Authorization": f"Bearer {key}"}
    if tier is not None:
        headers["x-sageserve-tier"] = tier
    body = {"model": MODEL.served_name, "prompt": "hello", "max_tokens": 8, **extra}
    async with aiohttp.ClientSession() as client, client.post(url, json=body, headers=headers) as r:
        await r.read()
        return r.status


@pytest.mark.parametrize(
    ("key", "tier", "extra", "want"),
    [
        ("sk-fast", None, {}, 0),  # IW-F's declared priority
        ("sk-normal", None, {}, 1),  # IW-N's
        ("sk-normal", None, {"priority": -100}, 1),  # the client's own is overwritten
        ("sk-both", "iw-n", {}, 1),  # a header narrows among the key's tiers
        ("sk-both", None, {}, 0),  # none: the key's first tier
    ],
)
def test_pf_sends_the_callers_tier_priority(
    key: str, tier: str | None, extra: dict[str, Any], want: int
) -> None:
    async def scenario() -> None:
        async with router(OrderPolicy.PF) as (url, got):
            assert await post(url, key, tier, **extra) == 200
            assert got[-1]["priority"] == want

    asyncio.run(scenario())


def test_a_header_cannot_raise_a_key_to_a_faster_tier() -> None:
    async def scenario() -> None:
        async with router(OrderPolicy.PF) as (url, got):
            assert await post(url, "sk-normal", "iw-f", priority=0) == 403
            assert got == []  # nothing reached the pod

    asyncio.run(scenario())


def test_fcfs_sends_no_priority_and_drops_the_clients() -> None:
    """The engine runs `--scheduling-policy fcfs` then, and vLLM refuses a priority."""

    async def scenario() -> None:
        async with router(OrderPolicy.FCFS) as (url, got):
            assert await post(url, "sk-fast", priority=-5) == 200
            assert "priority" not in got[-1]

    asyncio.run(scenario())


def test_edf_sends_the_ttft_deadline_in_milliseconds() -> None:
    async def scenario() -> None:
        async with router(OrderPolicy.EDF) as (url, got):
            before = time.time()
            assert await post(url, "sk-normal") == 200
            assert await post(url, "sk-fast") == 200
            after = time.time()
            normal, fast = got[0]["priority"], got[1]["priority"]
            assert (before + 60) * 1000 - 1 <= normal <= (after + 60) * 1000 + 1
            assert fast < normal  # a later IW-F request is due before an IW-N one

    asyncio.run(scenario())


def test_discovery_reads_the_order_from_the_policy_and_the_rank_from_the_tier() -> None:
    fleet = Fleet()
    discovery = Discovery(fleet, Loop(), ["llm"])  # type: ignore[arg-type]
    discovery._models_for("llm")([deployment("a", "tiers")])
    assert fleet.models["a"].instance_scheduling.policy is OrderPolicy.FCFS  # no policy yet
    discovery._policies_for("llm")([_policy("tiers", {"policy": "dpa"})])
    assert fleet.models["a"].instance_scheduling == InstanceScheduling(OrderPolicy.DPA)
    discovery._tiers_for("llm")([_tier("iw-n", 1, 60), _batch_tier("niw")])
    got = fleet.tiers["llm"]
    assert (got["iw-n"].priority, got["iw-n"].ttft_slo_s, got["iw-n"].batch) == (1, 60, False)
    assert got["niw"].batch


def _policy(name: str, scheduling: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "sageserve.io/v1alpha1",
        "kind": "ScalingPolicy",
        "metadata": {"name": name, "namespace": "llm"},
        "spec": {"instanceScheduling": scheduling},
    }


def _tier(name: str, priority: int, ttft: float) -> dict[str, Any]:
    spec = {"type": "interactive", "priority": priority, "slo": {"ttftP95Seconds": ttft}}
    return {
        "apiVersion": "sageserve.io/v1alpha1",
        "kind": "WorkloadTier",
        "metadata": {"name": name, "namespace": "llm"},
        "spec": spec,
    }


def _batch_tier(name: str) -> dict[str, Any]:
    obj = _tier(name, 2, 1)
    obj["spec"] = {"type": "batch", "priority": 2, "batch": {}}
    return obj
