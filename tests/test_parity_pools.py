"""Parity of pooled-model switching: one recorded sequence of requests, completions and idle
sweeps through the router's `PoolSwitcher` (its engines reached over HTTP) and through the
simulators' `RouterRule` gives the same pod for every request and the same wakes and sleeps,
so a pool measured by `sageserve simulate` or `sageserve bench pool` switches as the router
does (`dispatch.pool_switch` holds the rules; these are the two worlds that apply them)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry

from sageserve.core.labels import LABEL_DEPLOYMENT, LABEL_REGION
from sageserve.core.pooled_engines import (
    ANNOTATION_AWAKE_PER_INSTANCE,
    ANNOTATION_POOLED_MODELS,
    PooledEngine,
    encode_engines,
)
from sageserve.router.fleet import Backend, ModelRoute
from sageserve.router.pool_switcher import Lease, PoolInfo, PoolSwitcher
from sageserve.sim.pool_router import RouterEngine, RouterPod, RouterRule, SwitchDone

NS, POOL, REGION = "llm", "tail", "us-east"
MODELS = ("a", "b", "c", "d", "e")
PODS = ("pod-0", "pod-1")
QUOTA, IDLE_S = 2, 60.0

#: (time, what, request, model): requests arrive and finish, the idle sweep runs. Nine
#: requests of five models on two pods of two awake engines: first wakes, a request joining
#: its model awake elsewhere, a full quota evicting the least recently used idle engine,
#: a model awake and idle on one pod while the other has a free slot, and the sweep putting
#: what stayed idle to sleep.
SEQUENCE: list[tuple[float, str, str, str]] = [
    (0.0, "arrive", "r1", "a"),
    (1.0, "arrive", "r2", "b"),
    (2.0, "arrive", "r3", "a"),
    (3.0, "finish", "r1", ""),
    (4.0, "arrive", "r4", "c"),
    (5.0, "finish", "r3", ""),
    (6.0, "finish", "r2", ""),
    (7.0, "arrive", "r5", "d"),
    (8.0, "arrive", "r6", "a"),
    (9.0, "finish", "r4", ""),
    (10.0, "arrive", "r7", "b"),
    (11.0, "finish", "r5", ""),
    (12.0, "finish", "r6", ""),
    (13.0, "finish", "r7", ""),
    (20.0, "arrive", "r9", "e"),  # every slot taken by an idle engine: the LRU one sleeps
    (21.0, "finish", "r9", ""),
    (40.0, "arrive", "r8", "c"),
    (41.0, "finish", "r8", ""),
    (75.0, "sweep", "", ""),  # b and d idle since 13 s and 11 s: asleep; e (21 s) and c stay
    (102.0, "sweep", "", ""),  # now e and c too
]

#: per event: the pod a request went to (or ""), and the switches it caused
Record = list[tuple[str, tuple[tuple[str, str, str], ...]]]


# ---- the simulators' rule ----------------------------------------------------------------


@dataclass
class _Item:
    name: str
    model: str


@dataclass
class _Serving:
    """What `RouterRule` asks of a simulator, with switches that take no time (the router's
    stand-in engines answer at once) and a pod's load = its requests in flight."""

    switches: list[tuple[str, str, str]] = field(default_factory=list)
    pending: list[SwitchDone[_Item]] = field(default_factory=list)
    where: dict[str, tuple[RouterPod[_Item], RouterEngine]] = field(default_factory=dict)

    def model_of(self, item: _Item) -> str:
        return item.model

    def busy(self, engine: RouterEngine) -> int:
        return engine.busy

    def load(self, pod: RouterPod[_Item], now: float) -> float:
        return float(sum(e.busy for e in pod.engines.values()))

    def new_engine(self, pod: RouterPod[_Item], model: str) -> object:
        return None

    def forward(self, pod: RouterPod[_Item], engine: RouterEngine, item: _Item, now: float) -> None:
        engine.busy += 1
        self.where[item.name] = (pod, engine)

    def schedule_switch(self, when: float, done: SwitchDone[_Item]) -> None:
        for victim in done.victims:
            self.switches.append((done.pod.name, victim, "sleep"))
        self.switches.append((done.pod.name, done.model, "wake" if done.woken else "sleep"))
        self.pending.append(done)


def simulated() -> Record:
    serving = _Serving()
    rule: RouterRule[_Item] = RouterRule(serving, QUOTA, IDLE_S, switch_s=0.0)
    for name in PODS:
        rule.add_pod(name)
    out: Record = []
    for t, what, req, model in SEQUENCE:
        serving.switches = []
        if what == "arrive":
            assert rule.arrive(_Item(req, model), t)
        elif what == "finish":
            pod, engine = serving.where[req]
            engine.busy -= 1
            if engine.busy == 0:
                rule.released(pod, engine, t)
        else:
            rule.sweep(t)
        while serving.pending:  # the switches end at once, as the stand-in engines answer
            rule.switch_done(serving.pending.pop(0), t)
        pod_name = serving.where[req][0].name if what == "arrive" else ""
        out.append((pod_name, tuple(sorted(serving.switches))))
    return out


# ---- the router --------------------------------------------------------------------------


def _pod(name: str) -> dict[str, Any]:
    engines = [PooledEngine(m, m, 8000 + i) for i, m in enumerate(MODELS)]
    return {
        "metadata": {
            "name": name,
            "labels": {LABEL_DEPLOYMENT: POOL, LABEL_REGION: REGION},
            "annotations": {
                ANNOTATION_POOLED_MODELS: encode_engines(engines),
                ANNOTATION_AWAKE_PER_INSTANCE: str(QUOTA),
            },
        },
        "status": {"podIP": "127.0.0.1"},
    }


class _Engines:
    """Every engine of both pods behind one HTTP server (vLLM's sleep-mode endpoints), each
    asleep at first; what it is asked is recorded."""

    def __init__(self) -> None:
        self.switches: list[tuple[str, str, str]] = []

    def app(self) -> web.Application:
        app = web.Application()
        base = "/pods/{namespace}/{pod}/port/{port}"
        app.router.add_get(base + "/is_sleeping", self.is_sleeping)
        app.router.add_post(base + "/sleep", self.switch)
        app.router.add_post(base + "/wake_up", self.switch)
        return app

    async def is_sleeping(self, request: web.Request) -> web.Response:
        return web.json_response({"is_sleeping": True})

    async def switch(self, request: web.Request) -> web.Response:
        model = MODELS[int(request.match_info["port"]) - 8000]
        action = "wake" if request.path.endswith("/wake_up") else "sleep"
        self.switches.append((request.match_info["pod"], model, action))
        return web.Response(text="")


async def routed() -> Record:
    engines = _Engines()
    runner = web.AppRunner(engines.app())
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    now = [0.0]
    switcher = PoolSwitcher(
        CollectorRegistry(),
        f"http://127.0.0.1:{port}/pods/{{namespace}}/{{pod}}/port/{{port}}",
        clock=lambda: now[0],
    )
    try:
        switcher.set_pools(NS, [PoolInfo(NS, POOL, QUOTA, IDLE_S, {m: m for m in MODELS})])
        switcher.set_pods(NS, [_pod(p) for p in PODS])
        switcher.session = aiohttp.ClientSession()  # as `PoolSwitcher.run` opens it
        await switcher.sweep()  # the router reads each engine once before serving the pod
        leases: dict[str, Lease] = {}
        out: Record = []
        for t, what, req, model in SEQUENCE:
            now[0] = t
            engines.switches = []
            chosen = ""
            if what == "arrive":
                route = ModelRoute(NS, POOL, model, (REGION,), ("iw-f",))
                candidates = [Backend(NS, p, POOL, REGION, "h100", "") for p in PODS]
                load = {
                    p: float(sum(e.busy for e in switcher.pods[(NS, p)].engines.values()))
                    for p in PODS
                }
                backend = switcher.prefer(route, candidates, load)
                assert backend is not None
                leases[req] = await switcher.acquire(route, backend, time.monotonic() + 5.0)
                chosen = backend.pod
            elif what == "finish":
                switcher.release(leases.pop(req))
            else:
                await switcher.sweep()
            out.append((chosen, tuple(sorted(engines.switches))))
        return out
    finally:
        if switcher.session is not None:
            await switcher.session.close()
        await runner.cleanup()


@pytest.fixture(scope="module")
def both() -> Iterator[tuple[Record, Record]]:
    yield asyncio.run(routed()), simulated()


def test_every_request_goes_to_the_same_pod_in_both_worlds(both: tuple[Record, Record]) -> None:
    router, simulator = both
    assert [pod for pod, _ in simulator] == [pod for pod, _ in router]


def test_every_wake_and_sleep_is_the_same_in_both_worlds(both: tuple[Record, Record]) -> None:
    router, simulator = both
    for (t, what, req, _), (_, r), (_, s) in zip(SEQUENCE, router, simulator, strict=True):
        assert s == r, f"{what} {req} at {t} s"


def test_the_sequence_exercises_every_rule(both: tuple[Record, Record]) -> None:
    """The sequence is worth comparing: it wakes, serves a request on a model already awake,
    evicts the least recently used idle engine at a full quota, and puts engines idle past
    `idleSleepSeconds` to sleep on the sweep, not the others."""
    router, _ = both
    by_event = {
        (what, req or str(t)): got for (t, what, req, _), got in zip(SEQUENCE, router, strict=True)
    }
    assert sum(1 for _, ss in router for s in ss if s[2] == "wake") == 6
    assert by_event[("arrive", "r3")] == ("pod-0", ())  # a awake there: no switch
    assert by_event[("arrive", "r9")] == (
        "pod-0",
        (("pod-0", "c", "sleep"), ("pod-0", "e", "wake")),
    )
    assert by_event[("sweep", "75.0")][1] == (("pod-1", "b", "sleep"), ("pod-1", "d", "sleep"))
    assert by_event[("sweep", "102.0")][1] == (("pod-0", "c", "sleep"), ("pod-0", "e", "sleep"))
