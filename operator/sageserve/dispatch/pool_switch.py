"""Request-level model switching on a pool of sleep-mode vLLM engines (pure decisions).

A pooled pod runs one vLLM engine per model of its ModelPool, at most `awakePerInstance`
of them awake (weights and KV cache on the GPUs); the others sleep (level 1: weights in host
memory). Aegaeon (Xiang et al., SOSP '25) switches models per *token* inside its engine;
stock vLLM can only put a whole engine to sleep and wake it, so here a model is switched in
for a request and kept while it is busy (Aegaeon §5's request-level switching, as
ServerlessLLM does). These functions decide, from a snapshot of each pod's engines:

- which pod serves a request (:func:`choose_pod`): one where its model is awake, else one
  with a free awake slot, else one with an idle awake model to put to sleep, least
  recently used first; with every awake model busy everywhere, the request waits;
- what to put to sleep to wake a model on one pod (:func:`plan_wake`), never a model with a
  request in flight or in the middle of a switch;
- which idle models to put to sleep (:func:`idle_models`), so a pod's GPU memory does not
  stay held by a model nobody asks for.

The router (`router/pool_switcher.py`) calls them and does the I/O (`POST /sleep?level=1`,
`POST /wake_up`); nothing here reads a clock or the network.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

#: How often idle models are looked for and put to sleep (`idle_models`), in seconds.
IDLE_SWEEP_SECONDS = 1.0


@dataclass(frozen=True)
class EngineState:
    """One model's engine on one pod, as the router last knew it."""

    awake: bool = False
    #: requests of this model in flight on this pod
    busy: int = 0
    #: when it last started or finished a request (or woke); seconds on any monotonic clock
    last_used: float = 0.0
    #: a sleep or wake-up of it is under way
    switching: bool = False

    @property
    def holds_memory(self) -> bool:
        """Awake, or on its way up or down: its weights may be on the GPUs."""
        return self.awake or self.switching


#: engines of one pod by model name
PodEngines = Mapping[str, EngineState]


@dataclass(frozen=True)
class WakePlan:
    """What to do on one pod so that `model` can serve: put `sleep` to sleep, then wake
    `model` (`wake` False when it is awake already). `wait`: no slot can be freed now (every
    awake model is busy or switching); the request waits for one."""

    model: str
    wake: bool
    sleep: tuple[str, ...] = ()
    wait: bool = False


def _awake(engines: PodEngines) -> int:
    return sum(1 for e in engines.values() if e.holds_memory)


def _evictable(engines: PodEngines, keep: str) -> list[str]:
    """Awake, idle, not switching engines other than `keep`, least recently used first."""
    idle = [
        (e.last_used, name)
        for name, e in engines.items()
        if name != keep and e.awake and not e.switching and e.busy == 0
    ]
    return [name for _, name in sorted(idle)]


def plan_wake(engines: PodEngines, model: str, quota: int) -> WakePlan:
    """Make room for `model` on a pod that keeps at most `quota` models awake.

    Awake (or waking) already: nothing to do. A free slot: wake it. Otherwise the least
    recently used idle models go to sleep first, as many as needed to get under the quota;
    when not enough are idle the request waits (a busy model is never put to sleep under
    its requests)."""
    if quota < 1:
        raise ValueError(f"quota: must be >= 1, got {quota}")
    state = engines.get(model, EngineState())
    if state.awake:
        return WakePlan(model, wake=False)
    if state.switching:  # being woken (or put to sleep) by another request: wait for it
        return WakePlan(model, wake=False, wait=True)
    over = _awake(engines) - quota + 1
    if over <= 0:
        return WakePlan(model, wake=True)
    victims = _evictable(engines, model)
    if len(victims) < over:
        return WakePlan(model, wake=False, wait=True)
    return WakePlan(model, wake=True, sleep=tuple(victims[:over]))


def choose_pod(
    pods: Sequence[tuple[str, PodEngines]],
    model: str,
    quota: int,
    load: Mapping[str, float] | None = None,
) -> str | None:
    """The pod to serve a request of `model` on (None: no pod).

    Preference, each time the least loaded (`load`, e.g. tokens in flight) first, then by
    name: (1) the model is awake there, (2) it is waking there, (3) a free awake slot,
    (4) an idle awake model can be put to sleep, (5) any pod (the request waits there for
    a slot)."""
    if not pods:
        return None
    load = load or {}

    def rank(item: tuple[str, PodEngines]) -> tuple[int, float, str]:
        name, engines = item
        state = engines.get(model, EngineState())
        if state.awake and not state.switching:
            tier = 0
        elif state.switching:
            tier = 1
        else:
            plan = plan_wake(engines, model, quota)
            tier = 4 if plan.wait else (2 if not plan.sleep else 3)
        return (tier, load.get(name, 0.0), name)

    return min(pods, key=rank)[0]


def idle_models(engines: PodEngines, now: float, idle_seconds: float) -> list[str]:
    """Awake models with no request in flight for at least `idle_seconds`, oldest first."""
    return [
        name
        for name in _evictable(engines, keep="")
        if now - engines[name].last_used >= idle_seconds
    ]
