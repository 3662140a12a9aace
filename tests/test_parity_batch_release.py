"""Parity of the batch release and of held requests: one recorded sequence of EMU readings
and signal rounds through the router's `BatchReleaser` (a Batch API upload over HTTP, a
stand-in pod answering the released requests) and through the simulator's signal round
releases the same number of requests each round, with the EMU corrected by the tokens
sent since each reading (`dispatch.queue_manager.estimated_emu`), and promotes at most 16 a
round (`PROMOTED_PER_SIGNAL`); the router's hold and the simulator's refuse the same
requests (`dispatch.hold`). The readings are injected on both sides: the router's as
Prometheus would report them, the simulator's as its 1-second scrape would have read
them."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from sageserve.batch import BatchStore
from sageserve.batch.api import BatchApi
from sageserve.core.types import Request, Tier, TierKind
from sageserve.dispatch.hold import Hold
from sageserve.dispatch.request_check import estimated_tokens
from sageserve.dispatch.tiers import TierMatch
from sageserve.pace import make_strategy
from sageserve.router.app import Router, RouterConfig
from sageserve.router.fleet import Backend, Fleet
from sageserve.router.metrics import RouterMetrics
from sageserve.router.release import BatchReleaser, ReleaseConfig
from sageserve.sim.cluster import Endpoint
from sageserve.sim.engine import Simulation
from sageserve.sim.held import HeldRequests
from sageserve.sim.instance import Job
from tests.router.test_batch_release import EAST, MODEL, submit
from tests.router.test_router_http import Pod, start
from tests.sim.helpers import config, flat_perf

#: Each round: a fresh reading (EMU, KV capacity in tokens, requests waiting at the pod)
#: or None (the last one stays, corrected by what was sent since). Requests of 5,000
#: tokens on 100,000 tokens of KV.
ROUNDS: list[tuple[float, float, int] | None] = [
    (0.30, 100_000.0, 0),  # 0.30: 2 released
    None,  # 0.40: 2
    None,  # 0.50: 1 (not under 50 %)
    None,  # 0.55: 1
    None,  # 0.60: none, until the next reading
    (0.45, 100_000.0, 0),  # 2
    None,  # 0.55: 1
    (0.70, 100_000.0, 0),  # busy: none
    (0.20, 0.0, 0),  # capacity unknown: the reading alone, 2 a round
    None,
    (0.10, 100_000.0, 3),  # low EMU, but requests wait at the pod (out of time): none
    (0.10, 100_000.0, 0),  # the queue gone: 2
]
WANT = [2, 2, 1, 1, 0, 2, 1, 0, 2, 2, 0, 2]
#: the messages' JSON is 400 characters: 100 + 4,900 = 5,000 tokens as the router estimates
MESSAGES = [{"role": "user", "content": "x" * (400 - 33)}]
PROMPT_CHARS, BUDGET = len(json.dumps(MESSAGES)), 4_900
QUEUED, DUE = 30, 40


def line(custom_id: str) -> str:
    body = {"model": MODEL.served_name, "messages": MESSAGES, "max_tokens": BUDGET}
    return json.dumps(
        {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions", "body": body}
    )


def test_the_request_tokens_are_the_same_on_both_sides() -> None:
    body = json.loads(line("a"))["body"]
    assert PROMPT_CHARS == 400
    assert estimated_tokens(body) == (PROMPT_CHARS / 4, PROMPT_CHARS / 4 + BUDGET)


def router_rounds(tmp_path: Path) -> tuple[list[int], list[int]]:
    """(released per round of `ROUNDS`, promoted per round) by the router's releaser."""
    trough: list[int] = []
    promoted: list[int] = []

    async def main() -> None:
        pod = Pod("east-0")
        app = web.Application()
        app.router.add_post("/v1/chat/completions", pod.completions)
        pod_runner, pod_port = await start(app)
        fleet = Fleet()
        fleet.set_models([MODEL])
        niw = TierMatch("niw", batch=True, deadline_s=86400.0)
        fleet.set_tiers("llm", {"iw-f": TierMatch("iw-f"), "niw": niw})
        url = f"http://127.0.0.1:{pod_port}"
        fleet.set_backends([Backend("llm", "east-0", "llama", "us-east", "a100", url)])
        fleet.set_load({EAST: (0.95, 100_000.0)})
        store = BatchStore.open(f"sqlite:///{tmp_path}/queue.db")
        metrics = RouterMetrics()
        router = Router(fleet, RouterConfig(), metrics)
        releaser = BatchReleaser(store, router, metrics, "replica-a", ReleaseConfig())
        router.extra_routes = BatchApi(store, fleet.batch_tier).add_routes
        runner, port = await start(router.app())

        async def one_round() -> int:
            n = await releaser.signal_once(time.time())
            await asyncio.gather(*list(releaser.running.values()))  # answered, tokens counted
            return n

        try:
            async with aiohttp.ClientSession() as client:
                base = f"http://127.0.0.1:{port}"
                await submit(client, base, [line(f"q{i}") for i in range(QUEUED)], "24h")
                for reading in ROUNDS:
                    if reading is not None:
                        emu, capacity, waiting = reading
                        fleet.set_load({EAST: (emu, capacity)})
                        fleet.set_pod_waiting({"east-0": waiting})
                    trough.append(await one_round())
                # busy from now on: only requests whose slack ran out leave, 16 a round
                fleet.set_load({EAST: (0.95, 100_000.0)})
                await submit(client, base, [line(f"d{i}") for i in range(DUE)], "1m")
                for _ in range(4):
                    promoted.append(await one_round())
        finally:
            await runner.cleanup()
            await pod_runner.cleanup()
            store.close()

    asyncio.run(main())
    return trough, promoted


def read(ep: Endpoint, emu: float, capacity: float, waiting: int, t: float) -> None:
    """A reading of `ep` at `t`, as its scrape would have taken it."""
    ep._emu, ep._emu_t, ep.kv_read, ep.sent = emu, t, int(capacity), 0
    ep._waiting_read = waiting
    ep.version += 1


def simulator_rounds() -> tuple[list[int], list[int]]:
    """The same rounds through the simulator's signal round (its readings never refresh
    by themselves: `emu_refresh_s` is longer than the sequence)."""
    cfg = config(flat_perf(kv=100_000), initial=1, lo=1, hi=1, emu_refresh_s=1e9)
    cfg = cfg.__class__(**{**cfg.__dict__, "predictor": "oracle"})
    sim = Simulation(cfg, make_strategy("reactive"), [])
    niw = Tier("niw", TierKind.BATCH, deadline_s=86400.0, priority=1)
    due = Tier("niw-due", TierKind.BATCH, deadline_s=60.0, priority=1)
    prompt = PROMPT_CHARS // 4
    for i in range(QUEUED):
        sim._arrive(Request(i, 0.0, "m", niw, "r1", prompt, BUDGET))
    ep = sim.cluster.endpoints[next(iter(sim.cluster.endpoints))]
    trough: list[int] = []
    t = 1.0
    for reading in ROUNDS:
        if reading is not None:
            read(ep, *reading, t)
        before = sim.qm.pending()
        sim._signal_round(t)
        trough.append(before - sim.qm.pending())
        t += 1.0
    read(ep, 0.95, 100_000.0, 0, t)
    for i in range(DUE):
        sim._arrive(Request(QUEUED + i, t, "m", due, "r1", prompt, BUDGET))
    promoted: list[int] = []
    for _ in range(4):
        t += 1.0
        before = sim.qm.pending()
        sim._signal_round(t)
        promoted.append(before - sim.qm.pending())
    return trough, promoted


def test_router_and_simulator_release_the_same_work_each_round(tmp_path: Path) -> None:
    router_trough, router_promoted = router_rounds(tmp_path)
    sim_trough, sim_promoted = simulator_rounds()
    assert router_trough == sim_trough == WANT
    assert router_promoted == sim_promoted == [16, 16, 8, 0]


def test_router_and_simulator_hold_and_refuse_the_same_requests() -> None:
    """Four requests for a model with no ready pod and a bound of two held: the router
    answers two 429 at once and two 503 when the hold runs out; the simulator refuses
    the same two at once and the two others when their hold ends."""
    hold_s, max_held = 0.3, 2

    async def router_side() -> list[int]:
        fleet = Fleet()
        fleet.set_models([MODEL])
        fleet.set_tiers("llm", {"iw-f": TierMatch("iw-f")})
        fleet.set_backends([])
        cfg = RouterConfig(hold_seconds=hold_s, max_held_requests=max_held)
        router = Router(fleet, cfg, RouterMetrics())
        runner, port = await start(router.app())
        body = {"model": MODEL.served_name, "prompt": "hi", "max_tokens": 4}
        try:
            async with aiohttp.ClientSession() as client:

                async def one(delay: float) -> int:
                    await asyncio.sleep(delay)
                    url = f"http://127.0.0.1:{port}/v1/completions"
                    async with client.post(url, json=body) as r:
                        return r.status

                return list(await asyncio.gather(*(one(0.02 * i) for i in range(4))))
        finally:
            await runner.cleanup()

    statuses = asyncio.run(router_side())

    events: list[tuple[float, Any]] = []
    refused: list[int] = []
    held = HeldRequests(
        hold_s,
        max_held,
        lambda when, fn: events.append((when, fn)),
        lambda j: refused.append(j.req.id),
    )
    cfg = config(flat_perf(), initial=0, lo=0, hi=1)
    ep = Simulation(cfg, make_strategy("reactive"), []).cluster.endpoints
    endpoint = next(iter(ep.values()))
    tier = Tier("iw-f", TierKind.INTERACTIVE, ttft_slo_s=1.0)
    decisions = []
    for i in range(4):
        job = Job(Request(i, 0.02 * i, "m", tier, "r1", 1, 4), 0)
        decisions.append(held.hold(job, endpoint, 0.02 * i))
    at_once = list(refused)
    for when, fn in sorted(events, key=lambda e: e[0]):
        fn(when)
    assert decisions == [Hold.HOLD, Hold.HOLD, Hold.BUSY, Hold.BUSY]
    assert sorted(statuses) == [429, 429, 503, 503]
    assert statuses == [503, 503, 429, 429]  # the first two were held, then gave up
    assert at_once == [2, 3] and sorted(refused) == [0, 1, 2, 3]
    assert endpoint.backlog == []


def test_the_router_command_defaults_are_the_shared_bounds() -> None:
    """`sageserve router` keeps its imports light, so its option defaults are written out;
    they must be the bounds the simulator holds requests by."""
    import inspect

    from sageserve.commands.router import router_command
    from sageserve.dispatch.hold import HOLD_S, MAX_HELD

    params = inspect.signature(router_command).parameters
    assert params["hold_seconds"].default == HOLD_S == RouterConfig().hold_seconds
    assert params["max_held_requests"].default == MAX_HELD == RouterConfig().max_held_requests
    assert ReleaseConfig().signal_s == cfg_default("signal_s")
    assert ReleaseConfig().promoted_per_signal == cfg_default("promoted_per_signal")


def cfg_default(name: str) -> Any:
    from sageserve.sim.engine import SimConfig

    return SimConfig.__dataclass_fields__[name].default
