"""Pooled models through the router over real HTTP, in front of the twin's pooled pod: the
router wakes the model a request needs, puts the least recently used idle one to sleep when
the pod's quota is full, and puts models idle too long to sleep (request-level switching
on vLLM's sleep-mode API)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest

from sageserve.api.model_pool import ModelPool
from sageserve.controller.pool_podsets import render_pool_pod_set
from sageserve.dispatch.tiers import TierMatch
from sageserve.router.app import Router, RouterConfig
from sageserve.router.fleet import Backend, Fleet
from sageserve.router.metrics import RouterMetrics
from sageserve.router.pool_switcher import PoolSwitcher, pool_routes
from sageserve.twin.clock import AcceleratedClock
from sageserve.twin.load import LoadControl, PerfResolver, TwinSim
from sageserve.twin.pods import pod_info
from sageserve.twin.runner import Twin
from tests.twin.helpers import CATALOG, steady

H100 = "NVIDIA-H100-80GB-HBM3"
POD = "tail-us-east-h100-0"


def pool_object(idle_s: int = 2) -> dict[str, Any]:
    return {
        "apiVersion": "sageserve.io/v1alpha1",
        "kind": "ModelPool",
        "metadata": {"name": "tail", "namespace": "llm"},
        "spec": {
            "models": [{"name": f"m{i}", "model": f"acme/ft-{i}"} for i in range(3)],
            "variant": {"name": "h100", "gpuType": H100, "gpusPerInstance": 4},
            "regions": [{"name": "us-east", "maxInstances": 2}],
            "awakePerInstance": 2,
            "idleSleepSeconds": idle_s,
            "tiers": ["iw-f"],
            "policyRef": {"name": "fleet"},
        },
    }


def pod_object() -> dict[str, Any]:
    pool = ModelPool.model_validate(pool_object())
    d = render_pool_pod_set(pool, pool.spec.regions[0], 1, "llm")
    template = d["spec"]["template"]
    return {
        "metadata": {"name": POD, "namespace": "llm", **template["metadata"]},
        "spec": {**template["spec"], "nodeName": "gpu-0"},
        "status": {"phase": "Running", "podIP": "10.0.0.9"},
    }


@pytest.fixture
def twin() -> Iterator[Twin]:
    info = pod_info(pod_object())
    assert info is not None
    resolve = PerfResolver(CATALOG, {"tail": "llama-2-70b"}).resolve
    sim = TwinSim(steady(), resolve, LoadControl(scale=0.0))
    t = Twin(sim, AcceleratedClock(speed=1), lambda: [info], refresh_s=0.1, tick_s=0.05)
    with t:
        yield t


def engines(twin: Twin) -> dict[str, str]:
    with twin.lock:
        return twin.engines[("llm", POD)].state(twin.sim.now)


@dataclass
class Served:
    """A router in front of the twin's pooled pod, on a free port, its pool sweep running."""

    url: str
    pools: PoolSwitcher
    metrics: RouterMetrics


@contextlib.asynccontextmanager
async def serving(twin: Twin) -> AsyncIterator[Served]:
    found = pool_routes(pool_object())
    assert found is not None
    info, routes = found
    fleet = Fleet()
    fleet.set_models(routes)
    fleet.set_tiers("llm", {"iw-f": TierMatch("iw-f")})
    template = f"http://{twin.address}/pods/{{namespace}}/{{pod}}/port/{{port}}"
    url = template.format(namespace="llm", pod=POD, port=8000)
    fleet.set_backends([Backend("llm", POD, "tail", "us-east", "h100", url)])
    metrics = RouterMetrics()
    pools = PoolSwitcher(metrics.registry, template)
    pools.set_pools("llm", [info])
    pools.set_pods("llm", [pod_object()])
    router = Router(fleet, RouterConfig(hold_seconds=30.0), metrics)
    router.pools = pools
    runner = aiohttp.web.AppRunner(router.app())
    await runner.setup()
    site = aiohttp.web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    sweeper = asyncio.create_task(pools.run())
    try:
        yield Served(f"http://127.0.0.1:{runner.addresses[0][1]}", pools, metrics)
    finally:
        sweeper.cancel()
        await runner.cleanup()


@pytest.mark.slow
def test_the_router_wakes_what_requests_need_and_sleeps_what_stays_idle(twin: Twin) -> None:
    async def main() -> None:
        def sample(name: str, **labels: str) -> float:
            return metrics.registry.get_sample_value(name, labels) or 0.0

        async def ask(client: aiohttp.ClientSession, model: str) -> int:
            body = {"model": model, "prompt": "hi", "max_tokens": 4}
            async with client.post(f"{url}/v1/completions", json=body) as resp:
                await resp.read()
                return resp.status

        async with serving(twin) as served, aiohttp.ClientSession() as client:
            url, pools, metrics = served.url, served.pools, served.metrics
            # the pod's engines start asleep (its launcher leaves them so); the router
            # reads them, then wakes each model a request needs
            deadline = time.monotonic() + 10
            while not pools.pods[("llm", POD)].synced:
                assert time.monotonic() < deadline, "the pod was never read"
                await asyncio.sleep(0.05)
            assert await ask(client, "acme/ft-0") == 200
            assert engines(twin)["acme/ft-0"] == "awake"
            assert await ask(client, "acme/ft-1") == 200
            assert await ask(client, "acme/ft-0") == 200  # ft-1 is now the LRU
            # the quota (2) is full: the least recently used idle model sleeps first
            assert await ask(client, "acme/ft-2") == 200
            assert engines(twin) == {
                "acme/ft-0": "awake",
                "acme/ft-1": "asleep",
                "acme/ft-2": "awake",
            }
            labels = {"namespace": "llm", "model_deployment": "tail", "region": "us-east"}
            wakes = sample(
                "sageserve_router_pool_switches_total",
                **labels,
                action="wake",
                reason="request",
            )
            evicted = sample(
                "sageserve_router_pool_switches_total", **labels, action="sleep", reason="evict"
            )
            assert (wakes, evicted) == (3, 1)
            assert sample("sageserve_router_pool_requests_total", **labels, model="m0") == 2
            # a burst on a sleeping model: every request of it served after one wake
            statuses = await asyncio.gather(*(ask(client, "acme/ft-1") for _ in range(8)))
            assert statuses == [200] * 8
            assert (
                sample(
                    "sageserve_router_pool_switches_total",
                    **labels,
                    action="wake",
                    reason="request",
                )
                == 4
            )
            # idle past idleSleepSeconds (2 s): every model goes to sleep
            deadline = time.monotonic() + 20
            while set(engines(twin).values()) != {"asleep"}:
                assert time.monotonic() < deadline, engines(twin)
                await asyncio.sleep(0.1)
            assert (
                sample(
                    "sageserve_router_pool_switches_total",
                    **labels,
                    action="sleep",
                    reason="idle",
                )
                == 2
            )
            assert sample("sageserve_router_held_requests", **labels) == 0

    asyncio.run(main())


@pytest.mark.slow
def test_a_request_for_a_pod_whose_engines_are_not_up_yet_is_held_not_failed() -> None:
    """A pooled pod the router meets (Ready in the API) before its engines answer behind
    the address: requests wait for the pod's engines instead of failing their wake (the
    pool growing under load dropped requests with 502)."""
    info = pod_info(pod_object())
    assert info is not None
    served: list[Any] = []  # the twin serves the pod only once it is listed here
    resolve = PerfResolver(CATALOG, {"tail": "llama-2-70b"}).resolve
    sim = TwinSim(steady(), resolve, LoadControl(scale=0.0))
    twin = Twin(sim, AcceleratedClock(speed=1), lambda: list(served), refresh_s=0.1, tick_s=0.05)

    async def main() -> None:
        async with serving(twin) as got, aiohttp.ClientSession() as client:

            async def ask() -> int:
                body = {"model": "acme/ft-0", "prompt": "hi", "max_tokens": 4}
                async with client.post(f"{got.url}/v1/completions", json=body) as resp:
                    await resp.read()
                    return resp.status

            asking = asyncio.gather(*(ask() for _ in range(4)))
            await asyncio.sleep(2.0)  # several sweeps find the engines unanswering
            assert not got.pools.pods[("llm", POD)].synced
            assert (
                got.metrics.registry.get_sample_value(
                    "sageserve_router_held_requests",
                    {"namespace": "llm", "model_deployment": "tail", "region": "us-east"},
                )
                == 4
            )
            served.append(info)  # the engines come up
            assert await asking == [200] * 4

    with twin:
        asyncio.run(main())
