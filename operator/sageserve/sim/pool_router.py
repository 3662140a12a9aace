"""The router's request-level rule for pooled models, as every simulator runs it.

`sageserve router` serves a ModelPool's models by waking and sleeping vLLM engines
(`router/pool_switcher.py`); its decisions are the pure functions of
`dispatch.pool_switch`. This module keeps the state those functions read — each pod's
engines (awake, switching, last used) and the requests held on each pod — and applies their
answers with simulated time: a request goes to the pod `choose_pod` picks and is held there
in arrival order until `plan_wake` finds its model a slot; a wake puts the least recently
used idle engines to sleep first, then moves the model's weights in (each sleep and wake one
model's weights over the host link, `perf.switch`); every `IDLE_SWEEP_SECONDS` the engines
idle for `idle_sleep_s` go to sleep (`idle_models`).

Both simulators use this one implementation: `sim.pool_serving`'s `router` strategy (one
instance per engine, a fixed number of pods) and the fleet simulator's pooled pods
(`sim.pooled_pods`: one instance per pod, pods added and removed by the plan). What differs
between them — how an engine's busy count and a pod's load are read, where a request is
forwarded, how a switch's end is scheduled — is the `PoolServing` they pass in.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from typing import Generic, Protocol, TypeVar

from sageserve.dispatch.pool_switch import EngineState, choose_pod, idle_models, plan_wake

T = TypeVar("T")


class RouterEngine:
    """One model's engine on one pod, as the router knows it."""

    __slots__ = ("awake", "busy", "handle", "last_used", "switching")

    def __init__(self, handle: object) -> None:
        #: what the serving side keeps for the engine (e.g. its own instance)
        self.handle = handle
        self.awake = False
        self.switching = False
        self.last_used = 0.0
        #: requests in flight, where the serving side counts them here
        self.busy = 0


class RouterPod(Generic[T]):
    """One pooled pod: its engines, the ones holding GPU memory, its held requests."""

    __slots__ = ("engines", "handle", "live", "name", "waiting")

    def __init__(self, name: str, handle: object = None) -> None:
        self.name = name
        #: what the serving side keeps for the pod (e.g. its instance)
        self.handle = handle
        self.engines: dict[str, RouterEngine] = {}
        #: the engines awake or on their way up or down (those whose weights may be on the
        #: GPUs); the others sleep
        self.live: dict[str, RouterEngine] = {}
        #: requests held on this pod until `plan_wake` finds their model a slot
        self.waiting: deque[T] = deque()


class SwitchDone(Generic[T]):
    """A sleep or wake under way on `pod`: `model` woken (`woken`) or put to sleep, after
    `victims` were put to sleep."""

    __slots__ = ("model", "pod", "victims", "woken")

    def __init__(
        self, pod: RouterPod[T], model: str, victims: tuple[str, ...], woken: bool
    ) -> None:
        self.pod = pod
        self.model = model
        self.victims = victims
        self.woken = woken


class PoolServing(Protocol[T]):
    """What the rule needs of the simulator that serves the requests."""

    def model_of(self, item: T) -> str: ...

    def busy(self, engine: RouterEngine) -> int:
        """Requests of the engine's model in flight on its pod."""
        ...

    def load(self, pod: RouterPod[T], now: float) -> float:
        """The pod's load as `choose_pod` weighs it (tokens still to process)."""
        ...

    def new_engine(self, pod: RouterPod[T], model: str) -> object:
        """The serving side's handle of a new engine (kept in `RouterEngine.handle`)."""
        ...

    def forward(self, pod: RouterPod[T], engine: RouterEngine, item: T, now: float) -> None:
        """Send `item` to `engine`, awake on `pod`."""
        ...

    def schedule_switch(self, when: float, done: SwitchDone[T]) -> None:
        """Call `RouterRule.switch_done(done, when)` at `when`."""
        ...


class RouterRule(Generic[T]):
    """The router's request-level rule over a set of pods (`router/pool_switcher.py`)."""

    def __init__(
        self, serving: PoolServing[T], quota: int, idle_sleep_s: float, switch_s: float
    ) -> None:
        if quota < 1:
            raise ValueError(f"awake_per_instance: must be >= 1, got {quota}")
        self.serving = serving
        self.quota = quota
        self.idle_sleep_s = idle_sleep_s
        #: one model's weights over the host link: a level-1 sleep, or a wake
        self.switch_s = switch_s
        self.pods: dict[str, RouterPod[T]] = {}
        self.wakes = 0
        self.sleeps = 0

    # ---- pods --------------------------------------------------------------------------------

    def add_pod(self, name: str, handle: object = None) -> RouterPod[T]:
        """A new pod: every engine asleep (the pod's launcher puts each to sleep once up)."""
        pod: RouterPod[T] = RouterPod(name, handle)
        self.pods[name] = pod
        return pod

    def remove_pod(self, name: str) -> list[T]:
        """The pod leaves (drained); the requests it held, for the caller to send again."""
        pod = self.pods.pop(name)
        held = list(pod.waiting)
        pod.waiting.clear()
        return held

    def held(self) -> Iterator[T]:
        for pod in self.pods.values():
            yield from pod.waiting

    # ---- the router's view ---------------------------------------------------------------

    def state(self, e: RouterEngine) -> EngineState:
        return EngineState(e.awake, self.serving.busy(e), e.last_used, e.switching)

    def view(self, pod: RouterPod[T]) -> dict[str, EngineState]:
        """The pod's engines as the router knows them; a sleeping engine is left out: the
        rules read it as they read a model with no engine there (asleep, no request)."""
        return {m: self.state(e) for m, e in pod.live.items()}

    def _engine(self, pod: RouterPod[T], model: str) -> RouterEngine:
        e = pod.engines.get(model)
        if e is None:
            e = pod.engines[model] = RouterEngine(self.serving.new_engine(pod, model))
        return e

    # ---- requests ------------------------------------------------------------------------

    def arrive(self, item: T, now: float) -> bool:
        """`PoolSwitcher.prefer`: hold `item` on the pod `choose_pod` picks (least loaded
        first) and serve what that pod can; False when there is no pod at all."""
        pods = self.pods.values()
        if not pods:
            return False
        serving = self.serving
        views = [(p.name, self.view(p)) for p in pods]
        load = {p.name: serving.load(p, now) for p in pods}
        name = choose_pod(views, serving.model_of(item), self.quota, load)
        assert name is not None  # there is a pod
        pod = self.pods[name]
        pod.waiting.append(item)
        self.serve(pod, now)
        return True

    def serve(self, pod: RouterPod[T], now: float) -> None:
        """`PoolSwitcher.acquire` for each request held on the pod, in arrival order: wait
        while `plan_wake` says so; otherwise put its victims to sleep and wake its model
        (the request waits for that), or, awake, forward it."""
        serving = self.serving
        held: deque[T] = deque()
        view = self.view(pod)
        for item in pod.waiting:
            model = serving.model_of(item)
            plan = plan_wake(view, model, self.quota)
            if plan.wait:
                held.append(item)
                continue
            e = self._engine(pod, model)
            if plan.wake:
                for victim in plan.sleep:
                    pod.engines[victim].switching = True
                e.switching = True
                pod.live[model] = e
                self.wakes += 1
                self.sleeps += len(plan.sleep)
                # the sleeps run together, then the wake: each moves one model's weights
                delay = (self.switch_s if plan.sleep else 0.0) + self.switch_s
                serving.schedule_switch(now + delay, SwitchDone(pod, model, plan.sleep, True))
                held.append(item)
                view = self.view(pod)
                continue
            e.last_used = now
            serving.forward(pod, e, item, now)
            view[model] = self.state(e)  # busy now: not a model to put to sleep
        pod.waiting = held

    def released(self, pod: RouterPod[T], engine: RouterEngine, now: float) -> None:
        """The engine's last request finished (the lease released): last used now, and the
        requests held on its pod may find a slot."""
        engine.last_used = now
        if pod.waiting and self.pods.get(pod.name) is pod:
            self.serve(pod, now)

    # ---- switches ------------------------------------------------------------------------

    def sweep(self, now: float) -> None:
        """The router's idle sweep: engines idle past `idle_sleep_s` go to sleep."""
        for pod in self.pods.values():
            for model in idle_models(self.view(pod), now, self.idle_sleep_s):
                pod.engines[model].switching = True
                self.sleeps += 1
                self.serving.schedule_switch(now + self.switch_s, SwitchDone(pod, model, (), False))

    def switch_done(self, done: SwitchDone[T], when: float) -> None:
        """A sleep or wake ended: the engines' states, then what the pod holds is served."""
        pod = done.pod
        for victim in done.victims:
            v = pod.engines[victim]
            v.awake = v.switching = False
            del pod.live[victim]
        e = pod.engines[done.model]
        e.switching = False
        e.awake = done.woken
        if not e.awake:
            del pod.live[done.model]
        e.last_used = when
        if self.pods.get(pod.name) is pod:
            self.serve(pod, when)
