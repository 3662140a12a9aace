"""A ModelPool's pods in the fleet simulator: request-level switching, sized by the plan.

On Kubernetes (docs/aegaeon.md) a ModelPool is one pod set per region; every pod runs one
sleep-mode vLLM engine per pooled model, at most `awakePerInstance` awake, and the router
(`router/pool_switcher.py`) holds a request, picks a pod, puts idle engines to sleep, wakes
the model and forwards it. Here:

- one pod is one simulated instance of the pool variant's profile, on GPUs taken from the
  same inventory as the ModelDeployments' (`Cluster.place`, `pace.spot.capacity_order`). All
  engines of a pod share its GPUs, so their requests batch together on that one instance,
  as the twin runs them (`twin/sleep_mode.py`): a pod's throughput and KV cache are the
  pod's, whichever models are awake;
- the router's rule is `sim.pool_router.RouterRule` (the decisions of
  `dispatch.pool_switch`), with a switch charged as the twin charges it
  (`perf.switch.sleep_mode_switch_seconds`: one model's weights over each GPU's host link);
  a request waiting for a wake or a slot is held, and its TTFT includes the wait;
- a request goes to its pool's endpoint in its home region, else the pool's first region in
  the scenario's order (`dispatch.region_router.preference`); with no pod up it waits there
  until one is, as the router holds it, and is never lost;
- the hourly plan (`lt-*`) sizes each (pool, region) from each pooled model's request rate
  per minute (`plan.pool_cycle`, through `plan.cycle.run_plan_cycle`, as the operator's plan
  loop does) and the simulator applies what the plan grants: new pods in `capacity_order`
  (pending while no GPUs take them), or pending then the least-loaded pods drained first,
  as the operator marks them (their held requests go to another pod). Under other
  strategies a pool keeps its initial size and the run's summary says so, with the reason
  and message of the operator's `Sized=False` condition (`plan.pool_cycle.pool_sizing`).
"""

from __future__ import annotations

from collections import defaultdict, deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Protocol

from sageserve.api.model_pool import ModelPool
from sageserve.core.snapshot import InstanceView, drain_order
from sageserve.core.types import EndpointKey
from sageserve.dispatch.pool_switch import IDLE_SWEEP_SECONDS
from sageserve.dispatch.region_router import preference
from sageserve.pace.base import make_strategy
from sageserve.perf.model import VariantPerf
from sageserve.plan.pool_cycle import PoolTarget, bounded, pool_sizing
from sageserve.sim.cluster import Cluster, Deployment, Endpoint
from sageserve.sim.instance import Instance, Job
from sageserve.sim.pool_router import RouterEngine, RouterPod, RouterRule, SwitchDone

#: `EndpointKey.pool` of a ModelPool's endpoints (its `model` is the pool's name)
POOLED = "modelpool"


@dataclass(frozen=True)
class PoolSetup:
    """One ModelPool as the fleet simulator needs it."""

    name: str
    #: `spec.policyRef.name`, for the `Sized` message
    policy: str
    #: the pooled models' names (`spec.models[].name`): what requests ask for
    models: tuple[str, ...]
    variant: str
    #: one pod: the base model's profile on the variant's GPUs, named after the pool (so its
    #: GPU-hours and its donated GPUs count as the pool's)
    perf: VariantPerf
    #: (region, minInstances, maxInstances, initial pods)
    regions: tuple[tuple[str, int, int, int], ...]
    awake_per_instance: int
    idle_sleep_s: float
    #: one level-1 sleep or wake of one engine
    switch_s: float
    #: the manifest, for the plan cycle
    manifest: ModelPool
    #: (pooled model, context length): longer requests are refused at arrival (vLLM's 400)
    contexts: tuple[tuple[str, int], ...] = ()


@dataclass
class PoolObservation:
    """What the plan cycle reads of the pools (as the operator reads the router's counter
    and the pooled pod sets' replicas), and what it grants them."""

    #: (pool, region) -> pooled model -> requests/s per minute, oldest first
    rates: dict[tuple[str, str], dict[str, list[float]]]
    #: (pool, region) -> pods serving or coming up (the pod set's replicas)
    current: dict[tuple[str, str], int]
    #: set by the planner: each (pool, region)'s pods as the plan grants them
    granted: tuple[PoolTarget, ...] | None = None


class EngineHost(Protocol):
    """What the pooled pods need of the simulation around them."""

    cluster: Cluster

    def call_at(self, when: float, fn: Callable[[float], None]) -> None: ...

    def instance_ready_at(self, inst: Instance) -> None: ...


class PooledEndpoint:
    """One (pool, region): its pods (instances), the router's rule over them, counters."""

    def __init__(
        self,
        host: EngineHost,
        setup: PoolSetup,
        region: str,
        bounds: tuple[int, int],
        refresh_s: float,
        history_minutes: int,
    ) -> None:
        self.host = host
        self.setup = setup
        self.region = region
        self.bounds = bounds
        self.ep = Endpoint(EndpointKey(setup.name, region, POOLED), *bounds, refresh_s)
        self.ep.pooled = self
        self.dep = Deployment(f"{setup.name}-{region}-{setup.variant}", setup.perf, self.ep)
        self.dep.variant = setup.variant
        self.ep.deployments.append(self.dep)
        self.rule: RouterRule[Job] = RouterRule(
            self, setup.awake_per_instance, setup.idle_sleep_s, setup.switch_s
        )
        self._in_flight: dict[Job, tuple[RouterPod[Job], RouterEngine]] = {}
        self._history_minutes = history_minutes
        #: pooled model -> requests/s per minute (the router's per-model counter)
        self.rates: dict[str, deque[float]] = {
            m: deque(maxlen=history_minutes) for m in setup.models
        }
        self._minute: dict[str, int] = defaultdict(int)
        self.arrived = 0
        self.served = 0
        self.hold_sum = 0.0
        self.hold_max = 0.0
        self.forwarded = 0
        self.resizes = 0
        #: pods serving at the end of each minute
        self.pods_by_minute: list[int] = []

    # ---- PoolServing ---------------------------------------------------------------------

    def model_of(self, item: Job) -> str:
        return item.req.model

    def busy(self, engine: RouterEngine) -> int:
        return engine.busy

    def load(self, pod: RouterPod[Job], now: float) -> float:
        inst = pod.handle
        assert isinstance(inst, Instance)
        return inst.remaining_tokens_at(now)

    def new_engine(self, pod: RouterPod[Job], model: str) -> object:
        return None

    def forward(self, pod: RouterPod[Job], engine: RouterEngine, item: Job, now: float) -> None:
        inst = pod.handle
        assert isinstance(inst, Instance)
        engine.busy += 1
        self._in_flight[item] = (pod, engine)
        held = now - item.req.arrival
        self.forwarded += 1
        self.hold_sum += held
        if held > self.hold_max:
            self.hold_max = held
        inst.enqueue(item, now)

    def schedule_switch(self, when: float, done: SwitchDone[Job]) -> None:
        self.host.call_at(when, partial(self.rule.switch_done, done))

    # ---- PooledHooks (`sim.cluster.Endpoint.pooled`) -------------------------------------

    def ready(self, inst: Instance, now: float) -> None:
        """A pod came up: the router may send it requests; what waited for a pod goes."""
        self.rule.add_pod(inst.id, inst)
        backlog, self.ep.backlog = self.ep.backlog, []
        for job in backlog:
            self.send(job, now)

    def finished(self, job: Job, now: float) -> None:
        found = self._in_flight.pop(job, None)
        if found is None:
            return
        if now >= 0:
            self.served += 1
        pod, engine = found
        engine.busy -= 1
        if engine.busy == 0:
            engine.last_used = now
            if pod.waiting:  # after the instance's update is done, as the router would
                self.host.call_at(now, partial(self._released, pod, engine))

    def _released(self, pod: RouterPod[Job], engine: RouterEngine, now: float) -> None:
        if engine.busy == 0:
            self.rule.released(pod, engine, now)

    # ---- requests and pods ---------------------------------------------------------------

    def arrive(self, job: Job, now: float) -> None:
        self.arrived += 1
        self._minute[job.req.model] += 1
        job.ep = self.ep
        self.ep.arrivals_minute += 1
        self.send(job, now)

    def send(self, job: Job, now: float) -> None:
        """To a pod by the router's rule; with no pod up, held at the endpoint."""
        if not self.rule.arrive(job, now):
            self.ep.backlog.append(job)

    def start(self, count: int, now: float) -> None:
        """The initial pods, serving from the start."""
        self.host.cluster.start_instances(self.dep, count, now)
        for inst in self.dep.instances:
            self.rule.add_pod(inst.id, inst)

    def replicas(self) -> int:
        return len(self.dep.instances) + len(self.ep.provisioning) + self.dep.pending

    def resize(self, target: int, now: float) -> None:
        """Scale to `target` pods: new ones in `capacity_order` (pending while no GPUs take
        them); fewer: pending pods first, then serving pods drained, the least loaded first
        as the operator chooses them (least KV in use, then fewest waiting:
        `core.snapshot.drain_order`)."""
        current = self.replicas()
        if target != current:
            self.resizes += 1
        for _ in range(target - current):
            got = self.host.cluster.place(self.dep, now)
            if got is not None:
                self.host.instance_ready_at(got[0])
        if target >= current:
            return
        fewer = current - target
        while fewer and self.host.cluster.unpend(self.dep):  # Pending pods go first
            fewer -= 1
        # the operator's rule (`controller.pool_podsets.pool_drain_choice`): least KV in use,
        # then fewest waiting, by `core.snapshot.drain_order` over what vLLM reports
        by_name = {p.name: p for p in self.rule.pods.values()}
        views = []
        for p in by_name.values():
            inst = p.handle
            assert isinstance(inst, Instance)
            views.append(InstanceView(p.name, "", inst.kv_at(now), inst.kv_cap, inst.waiting))
        for view in drain_order(tuple(views))[:fewer]:
            pod = by_name[view.name]
            inst = pod.handle
            assert isinstance(inst, Instance)
            held = self.rule.remove_pod(pod.name)
            self.host.cluster.drain(self.dep, inst, now)
            for job in held:
                self.send(job, now)

    def minute(self) -> None:
        for m in self.setup.models:
            self.rates[m].append(self._minute.pop(m, 0) / 60.0)
        self.pods_by_minute.append(len(self.dep.instances))
        self.ep.arrivals_minute = self.ep.finished_minute = self.ep.tokens_minute = 0
        self.ep.ttft.roll()

    def left(self) -> Iterator[Job]:
        """Requests still held (on a pod, or waiting for one)."""
        yield from self.ep.backlog
        yield from self.rule.held()

    def summary(self, initial: int) -> dict[str, Any]:
        pods = self.pods_by_minute or [len(self.dep.instances)]
        return {
            "pods": {
                "initial": initial,
                "min": min(pods),
                "max": max(pods),
                "mean": round(sum(pods) / len(pods), 3),
                "end": len(self.dep.instances),
                "by_minute": pods,
            },
            "resizes": self.resizes,
            "requests": self.arrived,
            "served": self.served,
            "held_at_end": sum(1 for _ in self.left()),
            "wakes": self.rule.wakes,
            "sleeps": self.rule.sleeps,
            "held_s": {
                "mean": round(self.hold_sum / self.forwarded, 4) if self.forwarded else None,
                "max": round(self.hold_max, 4),
            },
        }


def _sizing(setup: PoolSetup, strategy: str) -> tuple[bool, str, str]:
    """`plan.pool_cycle.pool_sizing` for the run's strategy (by its name or alias)."""
    return pool_sizing(setup.policy, make_strategy(strategy))


@dataclass
class PooledPods:
    """Every ModelPool of a run: routing by pooled model, the sweep, the plan's sizes."""

    host: EngineHost
    setups: Sequence[PoolSetup]
    strategy: str
    #: whether a plan cycle runs in this run (the strategy plans hourly)
    plans: bool
    start_s: float
    end_s: float
    refresh_s: float
    history_minutes: int
    region_order: Sequence[str] = ()
    #: requests/s per minute before the window per (pooled model, home region)
    history: Mapping[tuple[str, str], Sequence[float]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.endpoints: dict[tuple[str, str], PooledEndpoint] = {}
        self.by_model: dict[str, list[PooledEndpoint]] = {}
        self.sizing = {s.name: _sizing(s, self.strategy) for s in self.setups}
        #: the plan sizes the pools: an hourly plan runs and the strategy is one that sizes
        self.planned = self.plans and any(ok for ok, _, _ in self.sizing.values())
        order = {r: i for i, r in enumerate(self.region_order)}
        self._initial: dict[tuple[str, str], int] = {}
        for s in self.setups:
            eps = []
            for region, lo, hi, initial in sorted(
                s.regions, key=lambda r: (order.get(r[0], 99), r[0])
            ):
                if hi <= 0:
                    continue
                pe = PooledEndpoint(
                    self.host, s, region, (lo, hi), self.refresh_s, self.history_minutes
                )
                pe.start(initial, self.start_s)
                self.endpoints[(s.name, region)] = pe
                self._initial[(s.name, region)] = initial
                eps.append(pe)
            for m in s.models:
                self.by_model[m] = eps
        self._route: dict[tuple[str, str], PooledEndpoint] = {}
        before: dict[tuple[PooledEndpoint, str], list[float]] = {}
        for (model, home), values in sorted(self.history.items()):
            if model in self.by_model:
                key = (self._endpoint(model, home), model)
                got = before.setdefault(key, [0.0] * len(values))
                for i, v in enumerate(values[-len(got) :]):
                    got[i] += v
        for (pe, model), values in before.items():
            pe.rates[model].extend(values)
        if self.endpoints:
            self.host.call_at(self.start_s + IDLE_SWEEP_SECONDS, self._sweep)

    def _endpoint(self, model: str, home: str) -> PooledEndpoint:
        key = (model, home)
        pe = self._route.get(key)
        if pe is None:
            pe = self._route[key] = preference(home, self.by_model[model], _region)[0]
        return pe

    def arrive(self, job: Job, now: float, inter_region_s: float) -> None:
        pe = self._endpoint(job.req.model, job.req.region)
        if pe.region != job.req.region:
            job.net_delay = inter_region_s
        pe.arrive(job, now)

    def _sweep(self, now: float) -> None:
        for pe in self.endpoints.values():
            pe.rule.sweep(now)
        if now + IDLE_SWEEP_SECONDS <= self.end_s:
            self.host.call_at(now + IDLE_SWEEP_SECONDS, self._sweep)

    def minute(self) -> None:
        for pe in self.endpoints.values():
            pe.minute()

    # ---- the plan ------------------------------------------------------------------------

    def observe(self) -> PoolObservation:
        return PoolObservation(
            rates={
                k: {m: list(v) for m, v in pe.rates.items()} for k, pe in self.endpoints.items()
            },
            current={k: pe.replicas() for k, pe in self.endpoints.items()},
        )

    def apply(self, granted: Sequence[PoolTarget] | None, now: float) -> None:
        """The plan's pods per (pool, region), within the region's bounds (as the
        operator's `apply_pool_targets`), for the pools the strategy sizes."""
        for t in granted or ():
            pe = self.endpoints.get((t.pool, t.region))
            if pe is None or not self.sizing[t.pool][0]:
                continue
            region = next(r for r in pe.setup.manifest.spec.regions if r.name == t.region)
            pe.resize(bounded(region, t.target), now)

    # ---- the end -------------------------------------------------------------------------

    def left(self) -> Iterator[Job]:
        for pe in self.endpoints.values():
            yield from pe.left()

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for s in self.setups:
            ok, reason, message = self.sizing[s.name]
            out[s.name] = {
                "models": list(s.models),
                "awake_per_instance": s.awake_per_instance,
                "switch_s": round(s.switch_s, 4),
                "sized": {"status": ok, "reason": reason, "message": message},
                "regions": {
                    r: pe.summary(self._initial[(n, r)])
                    for (n, r), pe in self.endpoints.items()
                    if n == s.name
                },
            }
        return out


def _region(pe: PooledEndpoint) -> str:
    return pe.region
