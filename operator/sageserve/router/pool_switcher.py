"""Request-level model switching for pooled models: the router's I/O around `dispatch.pool_switch`.

A ModelPool's pods run one vLLM engine per pooled model with sleep mode (`controller.pool_podsets`).
For a request of a pooled model the router picks the pod (`dispatch.pool_switch.choose_pod`:
awake there first), and before forwarding makes sure the model's engine is awake there: it
puts the least recently used idle engines to sleep (`POST /sleep?level=1`) when the pod's
quota of awake models is full, then wakes the model (`POST /wake_up`). The request is
*held* meanwhile, counted in `sageserve_router_held_requests` like a request waiting for a
model coming from zero (`router/app.py`), and bounded by the same hold time. A background
task puts engines idle for the pool's `idleSleepSeconds` to sleep, and reads
`GET /is_sleeping` of every engine of a pod it has not met yet (a router that restarts
learns what is awake instead of assuming).

State is this router's own: with several router replicas each keeps its own view, and a
replica can find the quota full because another woke a model; the wake then fails (the
engine runs out of memory), the router re-reads the pod and the request tries another pod.
Sharing the state between replicas is not done (docs/aegaeon.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import aiohttp
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from sageserve.api.model_pool import ModelPool, served_name
from sageserve.core.labels import LABEL_DEPLOYMENT
from sageserve.core.pooled_engines import awake_per_instance, pooled_engines
from sageserve.dispatch.pool_switch import (
    IDLE_SWEEP_SECONDS,
    EngineState,
    choose_pod,
    idle_models,
    plan_wake,
)
from sageserve.router.fleet import Backend, ModelRoute

log = logging.getLogger("sageserve.router.pool_switcher")

#: How often the background task looks for idle engines and pods not yet read.
#: A sleep or wake-up call that takes longer has failed.
SWITCH_TIMEOUT_SECONDS = 120.0


class PoolSwitchFailed(Exception):
    """The model could not be woken on that pod (the caller tries another pod)."""


@dataclass(frozen=True)
class PoolInfo:
    """What the router needs of one ModelPool."""

    namespace: str
    name: str
    awake_per_instance: int
    idle_sleep_seconds: float
    #: served name → pooled model name (its metric label)
    models: Mapping[str, str]


def pool_routes(obj: Mapping[str, Any]) -> tuple[PoolInfo, list[ModelRoute]] | None:
    """A ModelPool as the router serves it: one route per pooled model, all to the pool's
    pods (endpoint = the pool per region). None if it does not validate."""
    try:
        pool = ModelPool.model_validate(
            {k: obj[k] for k in ("apiVersion", "kind", "metadata", "spec")}
        )
    except (KeyError, ValueError):
        return None
    spec, ns = pool.spec, str(pool.metadata.namespace)
    info = PoolInfo(
        ns,
        pool.metadata.name,
        spec.awake_per_instance,
        float(spec.idle_sleep_seconds),
        {served_name(m): m.name for m in spec.models},
    )
    routes = [
        ModelRoute(
            namespace=ns,
            name=pool.metadata.name,
            served_name=served_name(m),
            regions=tuple(r.name for r in spec.regions),
            tiers=tuple(spec.tiers),
            policy=spec.policy_ref.name,
        )
        for m in spec.models
    ]
    return info, routes


@dataclass
class PodPool:
    """The router's view of one pooled pod's engines."""

    namespace: str
    pod: str
    pool: str
    region: str
    quota: int
    #: served name → base URL of its engine
    urls: dict[str, str]
    engines: dict[str, EngineState] = field(default_factory=dict)
    #: read from the pod (`GET /is_sleeping`) since the router met it
    synced: bool = False
    #: set whenever an engine's state changes, for requests waiting on a slot
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    def state(self, model: str) -> EngineState:
        return self.engines.get(model, EngineState())

    def set(self, model: str, **changes: Any) -> None:
        self.engines[model] = replace(self.state(model), **changes)
        self.set_changed()

    def set_changed(self) -> None:
        """Wake the requests waiting on this pod (a slot freed, its engines read)."""
        self.changed.set()
        self.changed = asyncio.Event()


@dataclass(frozen=True)
class Lease:
    """A request's hold on an awake engine: released when the request ends."""

    pod: PodPool
    model: str
    backend: Backend


class PoolMetrics:
    """The pool's own series, on the router's registry."""

    def __init__(self, registry: CollectorRegistry) -> None:
        labels = ["namespace", "model_deployment", "region"]
        self.requests = Counter(
            "sageserve_router_pool_requests",
            "Requests received per pooled model (the plan sizes the pool on their rate).",
            [*labels, "model"],
            registry=registry,
        )
        self.switches = Counter(
            "sageserve_router_pool_switches",
            "Engines put to sleep or woken, by why (request, evict, idle).",
            [*labels, "action", "reason"],
            registry=registry,
        )
        self.awake = Gauge(
            "sageserve_router_pool_awake_models",
            "Engines awake (or switching) on the pool's pods, as the router knows them.",
            labels,
            registry=registry,
        )
        self.wake_seconds = Histogram(
            "sageserve_router_pool_wake_seconds",
            "Time a request waited for its model to be woken (sleeps first included).",
            labels,
            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120),
            registry=registry,
        )


class PoolSwitcher:
    """Wakes the engines requests need and puts idle ones to sleep, on every pooled pod."""

    def __init__(
        self,
        registry: CollectorRegistry,
        url_template: str,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.url_template = url_template
        self.clock = clock
        self.metrics = PoolMetrics(registry)
        self.pools: dict[tuple[str, str], PoolInfo] = {}
        self.pods: dict[tuple[str, str], PodPool] = {}
        self.session: aiohttp.ClientSession | None = None

    # ---- written by discovery (on the event loop) ---------------------------------------

    def set_pools(self, namespace: str, pools: Iterable[PoolInfo]) -> None:
        self.pools = {k: v for k, v in self.pools.items() if k[0] != namespace}
        self.pools.update({(p.namespace, p.name): p for p in pools})

    def set_pods(self, namespace: str, pods: Iterable[Mapping[str, Any]]) -> None:
        """This namespace's pooled pods (Ready or not: only Ready ones get requests); the
        state of pods already known is kept."""
        seen: dict[tuple[str, str], PodPool] = {}
        for pod in pods:
            meta = pod.get("metadata") or {}
            engines = pooled_engines(meta.get("annotations"))
            labels = meta.get("labels") or {}
            if not engines or meta.get("deletionTimestamp"):
                continue
            key = (namespace, str(meta.get("name")))
            known = self.pods.get(key)
            if known is not None:
                seen[key] = known
                continue
            ip = str((pod.get("status") or {}).get("podIP", ""))
            urls = {
                e.served_name: self.url_template.format(
                    pod_ip=ip, port=e.port, namespace=namespace, pod=key[1]
                )
                for e in engines
            }
            if not ip and "{pod_ip}" in self.url_template:
                continue  # no address yet: met again once it has one
            seen[key] = PodPool(
                namespace,
                key[1],
                str(labels.get(LABEL_DEPLOYMENT, "")),
                str(labels.get("sageserve.io/region", "")),
                awake_per_instance(meta.get("annotations")),
                urls,
            )
        self.pods = {k: v for k, v in self.pods.items() if k[0] != namespace} | seen

    # ---- read by request handlers -------------------------------------------------------

    def serves(self, model: ModelRoute) -> bool:
        return (model.namespace, model.name) in self.pools

    def prefer(
        self,
        model: ModelRoute,
        candidates: Iterable[Backend],
        load: Mapping[str, float],
    ) -> Backend | None:
        """The pod to send a request of a pooled model to (`dispatch.pool_switch.choose_pod`)."""
        by_pod = {b.pod: b for b in candidates}
        met = [
            self.pods[k] for name in sorted(by_pod) if (k := (model.namespace, name)) in self.pods
        ]
        # a pod whose engines have not answered yet (still starting) only when no other is
        # left: `acquire` holds the request until it answers
        known = [(p.pod, p.engines) for p in met if p.synced] or [(p.pod, p.engines) for p in met]
        quota = self.pools[(model.namespace, model.name)].awake_per_instance
        chosen = choose_pod(known, model.served_name, quota, load)
        return by_pod.get(chosen) if chosen else None

    async def acquire(self, model: ModelRoute, backend: Backend, deadline: float) -> Lease:
        """The model's engine on `backend`'s pod awake and leased to one request: sleeps and
        wakes as `dispatch.pool_switch.plan_wake` says, waiting (until `deadline`, monotonic)
        while every awake engine there is busy. Raises `PoolSwitchFailed`."""
        self.session = self.session or aiohttp.ClientSession()
        pod = self.pods.get((backend.namespace, backend.pod))
        info = self.pools[(model.namespace, model.name)]
        name = model.served_name
        if pod is None or name not in pod.urls:
            raise PoolSwitchFailed(f"pod {backend.pod} has no engine for {name}")
        self.metrics.requests.labels(
            model.namespace, model.name, backend.region, info.models.get(name, name)
        ).inc()
        started = self.clock()
        switched = False
        while not pod.synced:  # its engines have not answered yet: wait for the sweep
            await self._until(pod, deadline, f"the engines of {backend.pod} never answered")
        while True:
            plan = plan_wake(pod.engines, name, pod.quota)
            if not plan.wait:
                break
            await self._until(
                pod, deadline, f"every awake model on {backend.pod} stayed busy; no slot for {name}"
            )
        if plan.wake:
            switched = True
            for victim in plan.sleep:
                pod.set(victim, switching=True)
            pod.set(name, switching=True)
            try:
                await asyncio.gather(
                    *(self._switch(pod, victim, "sleep", "evict") for victim in plan.sleep)
                )
                await self._switch(pod, name, "wake_up", "request")
            except PoolSwitchFailed:
                pod.set(name, awake=False, switching=False)
                pod.synced = False  # read the pod again: the router's count may be off
                raise
        pod.set(name, busy=pod.state(name).busy + 1, last_used=self.clock())
        if switched:
            self.metrics.wake_seconds.labels(model.namespace, model.name, backend.region).observe(
                self.clock() - started
            )
        self._count_awake()
        return Lease(pod, name, replace(backend, url=pod.urls[name]))

    @staticmethod
    async def _until(pod: PodPool, deadline: float, why: str) -> None:
        """Wait for the pod's next change, at most until `deadline` (monotonic): raises
        `PoolSwitchFailed(why)` once it has passed."""
        left = deadline - time.monotonic()
        if left <= 0:
            raise PoolSwitchFailed(why)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(pod.changed.wait(), left)

    def release(self, lease: Lease) -> None:
        state = lease.pod.state(lease.model)
        lease.pod.set(lease.model, busy=max(0, state.busy - 1), last_used=self.clock())

    # ---- I/O -------------------------------------------------------------------------------

    async def _switch(self, pod: PodPool, model: str, action: str, reason: str) -> None:
        """`POST /sleep?level=1` or `POST /wake_up` of one engine, its state updated."""
        assert self.session is not None
        path = "/sleep?level=1" if action == "sleep" else "/wake_up"
        url = pod.urls[model].rstrip("/") + path
        try:
            timeout = aiohttp.ClientTimeout(total=SWITCH_TIMEOUT_SECONDS)
            async with self.session.post(url, timeout=timeout) as resp:
                body = await resp.read()
                if resp.status >= 400:
                    raise PoolSwitchFailed(
                        f"{action} {model} on {pod.pod}: HTTP {resp.status} {body[:300]!r}"
                    )
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise PoolSwitchFailed(f"{action} {model} on {pod.pod}: {exc}") from exc
        awake = action == "wake_up"
        pod.set(model, awake=awake, switching=False, last_used=self.clock())
        self.metrics.switches.labels(
            pod.namespace, pod.pool, pod.region, "wake" if awake else "sleep", reason
        ).inc()
        log.info("pod %s: %s %s (%s)", pod.pod, "woke" if awake else "put to sleep", model, reason)

    async def _read(self, pod: PodPool) -> None:
        """Every engine's `GET /is_sleeping` (a pod met for the first time, or after a failed
        switch)."""
        assert self.session is not None
        for model, base in sorted(pod.urls.items()):
            if pod.state(model).switching or pod.state(model).busy:
                continue
            try:
                async with self.session.get(base.rstrip("/") + "/is_sleeping") as resp:
                    doc = await resp.json(content_type=None) if resp.status == 200 else None
                sleeping = doc.get("is_sleeping") if isinstance(doc, dict) else None
                if not isinstance(sleeping, bool):
                    raise ValueError(f"HTTP {resp.status}, no is_sleeping in the answer")
            except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
                # a pod still starting (not listening, or its engines not up behind the
                # address): read again on the next sweep; requests are held meanwhile
                log.debug("pod %s: is_sleeping of %s unreadable: %s", pod.pod, model, exc)
                return
            if sleeping == pod.state(model).awake:
                pod.set(model, awake=not sleeping, last_used=self.clock())
        pod.synced = True
        pod.set_changed()

    async def sweep(self) -> None:
        """One pass: read new pods, put engines idle too long to sleep."""
        now = self.clock()
        jobs = []
        for pod in list(self.pods.values()):
            if not pod.synced:
                jobs.append(self._read(pod))
                continue
            info = self.pools.get((pod.namespace, pod.pool))
            if info is None:
                continue
            for model in idle_models(pod.engines, now, info.idle_sleep_seconds):
                pod.set(model, switching=True)
                jobs.append(self._idle_sleep(pod, model))
        for result in await asyncio.gather(*jobs, return_exceptions=True):
            if isinstance(result, Exception):
                log.warning("pool sweep: %s", result)
        self._count_awake()

    async def _idle_sleep(self, pod: PodPool, model: str) -> None:
        try:
            await self._switch(pod, model, "sleep", "idle")
        except PoolSwitchFailed:
            pod.set(model, switching=False)
            pod.synced = False
            raise

    def _count_awake(self) -> None:
        counts: dict[tuple[str, str, str], int] = {}
        for pod in self.pods.values():
            key = (pod.namespace, pod.pool, pod.region)
            counts[key] = counts.get(key, 0) + sum(
                1 for e in pod.engines.values() if e.holds_memory
            )
        for key, n in counts.items():
            self.metrics.awake.labels(*key).set(n)

    async def run(self) -> None:
        """The background task: a session of its own, a sweep every IDLE_SWEEP_SECONDS."""
        self.session = self.session or aiohttp.ClientSession()
        try:
            while True:
                try:
                    await self.sweep()
                except Exception:  # keep sweeping: one bad pod must not stop the others
                    log.exception("pool sweep failed")
                await asyncio.sleep(IDLE_SWEEP_SECONDS)
        finally:
            await self.session.close()
