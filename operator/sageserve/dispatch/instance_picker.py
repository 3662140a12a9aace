"""In-region routing: the deployment, then the instance, of a request (SageServe §6.1,
PreServe §4.3.3).

The Model Router sends a request to the deployment (pod set) with the least effective
memory used (SageServe). Inside it, an instance picker chooses the instance; pickers sit
behind one small interface and are chosen by name (as cluster-autoscaler's expanders):

- `round-robin`: the next instance in turn, whatever the load (PreServe §3.2.2's RR);
- `least-request`: fewest requests on the instance, running or waiting (LR);
- `min-usage`: least KV cache in use now (MU; memory only, the simulator has no separate
  GPU-utilisation signal);
- `token-jsq`: fewest prompt tokens to prefill plus *predicted* output tokens left
  (SageServe's "fewest remaining tokens", on predicted lengths);
- `preserve`: prefill load + decode load + a memory penalty above 80 % projected KV
  (PreServe §4.3.3, Eq. 1).

`token-jsq` and `preserve` read output lengths from a length predictor
(`dispatch.length_predictor`) through the instance's load anticipator (`dispatch.anticipator`):
with the `oracle` predictor they become the upper bounds no real router reaches. Ties go
to the first candidate, so results are deterministic.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

from sageserve.dispatch.anticipator import LoadAnticipator

K = TypeVar("K")

#: The picker the simulator uses when none is named (SageServe's, on predicted lengths).
DEFAULT_PICKER = "token-jsq"
#: PreServe §4.3.3: the projected KV usage above which the memory penalty applies.
MEMORY_PENALTY_FROM = 0.80
#: PreServe §4.3.3: the penalty's weight β.
MEMORY_PENALTY_WEIGHT = 1.0


def _argmin(candidates: Sequence[tuple[K, float]]) -> K:
    if not candidates:
        raise ValueError("no candidate to route to")
    best_k, best_v = candidates[0]
    for k, v in candidates:
        if v < best_v:
            best_k, best_v = k, v
    return best_k


def pick_deployment(candidates: Sequence[tuple[K, float]]) -> K:
    """[(deployment, emu), ...] -> the deployment with the least EMU."""
    return _argmin(candidates)


def pick_instance(candidates: Sequence[tuple[K, float]]) -> K:
    """[(instance, remaining tokens), ...] -> the instance with the fewest remaining tokens."""
    return _argmin(candidates)


class LoadView(Protocol):
    """What a picker may know of one candidate instance, read when the picker asks: the
    simulator answers from live instance state, so a picker pays only for what it reads
    (token-JSQ never reads `kv_usage`)."""

    @property
    def anticipator(self) -> LoadAnticipator: ...

    @property
    def iteration(self) -> int: ...

    @property
    def kv_usage(self) -> float: ...


@dataclass(frozen=True, slots=True)
class InstanceLoad:
    """A `LoadView` taken once: what the router knows of one candidate pod."""

    #: the instance's look-ahead map: requests, queued prompt tokens, predicted decode left
    anticipator: LoadAnticipator
    #: the instance's decode iteration now (the anticipator's clock)
    iteration: int
    #: KV-cache usage measured now, a fraction of capacity
    kv_usage: float


@dataclass(frozen=True, slots=True)
class Arrival:
    """The request being routed: prompt tokens known, output tokens predicted."""

    prompt_tokens: int
    predicted_output: int


class InstancePicker(Protocol):
    name: str

    def pick(self, req: Arrival, candidates: Sequence[tuple[K, LoadView]]) -> K:
        """The candidate to send `req` to."""
        ...


_REGISTRY: dict[str, Callable[[], InstancePicker]] = {}


def register_picker(
    name: str,
) -> Callable[[Callable[[], InstancePicker]], Callable[[], InstancePicker]]:
    """Class decorator: make a picker available to `make_picker(name)`."""

    def deco(factory: Callable[[], InstancePicker]) -> Callable[[], InstancePicker]:
        _REGISTRY[name] = factory
        return factory

    return deco


def picker_names() -> list[str]:
    return sorted(_REGISTRY)


def make_picker(name: str) -> InstancePicker:
    """A new picker registered as `name` (pickers may keep state, e.g. round-robin's turn)."""
    factory = _REGISTRY.get(name)
    if factory is None:
        raise ValueError(
            f"unknown instance picker {name!r}: choose one of {', '.join(picker_names())}"
        )
    return factory()


@register_picker("round-robin")
class RoundRobin:
    """Each request to the next candidate in turn, whatever their load."""

    name = "round-robin"

    def __init__(self) -> None:
        self._turn = 0

    def pick(self, req: Arrival, candidates: Sequence[tuple[K, LoadView]]) -> K:
        if not candidates:
            raise ValueError("no candidate to route to")
        k = candidates[self._turn % len(candidates)][0]
        self._turn += 1
        return k


@register_picker("least-request")
class LeastRequest:
    """The instance with the fewest requests on it, running or waiting."""

    name = "least-request"

    def pick(self, req: Arrival, candidates: Sequence[tuple[K, LoadView]]) -> K:
        return _argmin([(k, float(v.anticipator.requests)) for k, v in candidates])


@register_picker("min-usage")
class MinUsage:
    """The instance with the least KV cache in use now (reactive: blind to growth)."""

    name = "min-usage"

    def pick(self, req: Arrival, candidates: Sequence[tuple[K, LoadView]]) -> K:
        return _argmin([(k, v.kv_usage) for k, v in candidates])


@register_picker("token-jsq")
class TokenJsq:
    """The instance with the fewest tokens still to process: queued prompts plus the
    predicted output left of every request on it (SageServe's in-region rule)."""

    name = "token-jsq"

    def pick(self, req: Arrival, candidates: Sequence[tuple[K, LoadView]]) -> K:
        # `_argmin` unrolled: this runs for every candidate of every simulated request
        if not candidates:
            raise ValueError("no candidate to route to")
        best_k, first = candidates[0]
        best = first.anticipator.tokens_left(first.iteration)
        for k, v in candidates[1:]:
            tokens = v.anticipator.tokens_left(v.iteration)
            if tokens < best:
                best_k, best = k, tokens
        return best_k


def preserve_score(req: Arrival, load: LoadView) -> float:
    """PreServe §4.3.3, Eq. 1: L = (queued_p + P) + (current_d + D) + β·max(0, U_k − 0.8)·M,
    with U_k the peak projected usage over the look-ahead after virtually adding the
    request. Every term is in tokens. (The paper prints argmax; its text and purpose say
    the minimum is chosen.)"""
    ant = load.anticipator
    prefill = ant.queued_prefill_tokens + req.prompt_tokens
    decode = ant.predicted_decode_tokens(load.iteration) + req.predicted_output
    peak = ant.peak(load.iteration, req.prompt_tokens, req.predicted_output)
    penalty = max(0.0, peak - MEMORY_PENALTY_FROM) * ant.capacity
    return prefill + decode + MEMORY_PENALTY_WEIGHT * penalty


@register_picker("preserve")
class PreServe:
    """The instance with the least anticipated load (`preserve_score`)."""

    name = "preserve"

    def pick(self, req: Arrival, candidates: Sequence[tuple[K, LoadView]]) -> K:
        return _argmin([(k, preserve_score(req, v)) for k, v in candidates])


__all__ = [
    "DEFAULT_PICKER",
    "Arrival",
    "InstanceLoad",
    "InstancePicker",
    "LoadView",
    "make_picker",
    "pick_deployment",
    "pick_instance",
    "picker_names",
    "preserve_score",
    "register_picker",
]
