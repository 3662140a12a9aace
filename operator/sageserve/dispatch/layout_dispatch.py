"""Dispatch by request type between parallelism layouts (OServe §4.2): one pure rule for
the benchmark harness (`sim/oserve_fleet.py`) and `sageserve router` (`router/fleet.py`).

OServe serves one model with several (TP, PP) layouts side by side and sends each request
type to the layouts in the shares its assignment computed (per type j and replica k the
LP's x_{k,j}/λ_j, summed over the replicas of a layout: the per-(type, variant) weights of
ScalingPolicy `status.layouts`). Three steps, each a function here so the simulator and
the router cannot drift apart:

- **type**: `nearest_type`, the nearest k-means centroid in log(1 + tokens) of (prompt,
  *predicted* output) (`forecast/request_types.py`; the router does not know the real
  output yet);
- **layout**: `TypeWeights.choose`, smooth weighted round robin over the type's weights
  (nginx's rule): deterministic, and after n requests of a type every key has had its
  share within one request, where a random draw would drift by √n;
- **overflow**: `overflow`, whether the preferred replica is swamped enough to send the
  request to another layout instead.

`dispatch_by_type` puts the three together over one endpoint's candidates as `sageserve
router` (`router/fleet.py`) and the fleet simulator (`sim/engine.py`) both dispatch
between the variants of a ModelDeployment whose policy publishes `status.layouts`
(`EndpointLayout`, built from the published types by `endpoint_layout`).

Nothing here reads a clock, draws a random number or imports numpy: it runs once per
request on the router's hot path.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Container, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

#: `overflow`'s threshold: tokens left on the preferred replica above OVERFLOW_RATIO × the
#: least-loaded candidate's + OVERFLOW_TOKENS (chosen on the tuning hours of `sageserve
#: bench oserve`, docs/oserve.md "Overflow dispatch"; a smaller margin pools more)
OVERFLOW_RATIO = 1.5
OVERFLOW_TOKENS = 1024.0


class _Ordered(Protocol):
    def __lt__(self, other: Any, /) -> bool: ...


K = TypeVar("K", bound=_Ordered)
B = TypeVar("B")


def nearest_type(log_centroids: Sequence[tuple[float, float]], prompt: float, output: float) -> int:
    """The request type of one request: the nearest centroid (squared distance in
    log(1 + tokens), `RequestTypes.classify`'s rule), without numpy (the dispatch path).
    Ties go to the lower type; no centroid at all is type 0."""
    lp, lo = math.log1p(max(0.0, prompt)), math.log1p(max(0.0, output))
    best, best_d = 0, math.inf
    for j, (cp, co) in enumerate(log_centroids):
        d = (lp - cp) ** 2 + (lo - co) ** 2
        if d < best_d:
            best, best_d = j, d
    return best


class TypeWeights(Generic[K]):
    """Per request type, the keys (layouts: the simulator's `Strategy`, the router's variant
    names) and their dispatch weights; `choose` runs smooth weighted round robin per type.

    Each choice adds every present key's weight to its credit, takes the key with the most
    credit (ties: the greatest key, so the result does not depend on dict order) and takes
    the present keys' total weight off it. Over the keys present, after n choices of a type
    each key has been chosen within one of n × its share of the total.

    A key that is not present (its replicas are not serving, or every pod of the variant is
    ejected) is skipped and its credit left as it was, neither grown nor reset: credits stay
    within one round's total, so a key that returns resumes its turn and never receives a
    catch-up burst for the time it was away. Keys with weight 0 are dropped.
    """

    def __init__(self, weights: Mapping[int, Mapping[K, float]] | None = None) -> None:
        self.weights: dict[int, dict[K, float]] = {}
        self._credit: dict[int, dict[K, float]] = {}
        if weights is not None:
            self.set(weights)

    def set(self, weights: Mapping[int, Mapping[K, float]]) -> None:
        """New weights (a re-plan); every credit starts again from 0."""
        self.weights = {j: {k: w for k, w in ws.items() if w > 0} for j, ws in weights.items()}
        self._credit = {j: dict.fromkeys(ws, 0.0) for j, ws in self.weights.items()}

    def of(self, type_: int) -> dict[K, float]:
        """The type's keys with weight > 0 (empty when the type has none)."""
        return self.weights.get(type_, {})

    def choose(self, type_: int, present: Container[K]) -> K | None:
        """The key a request of `type_` goes to, among `present`; None when the type names
        no present key (the caller then dispatches without weights)."""
        ws = {k: w for k, w in self.weights.get(type_, {}).items() if k in present}
        if not ws:
            return None
        credit = self._credit.setdefault(type_, {})
        total = sum(ws.values())
        for k, w in ws.items():
            credit[k] = credit.get(k, 0.0) + w
        pick = max(ws, key=lambda k: (credit[k], k))
        credit[pick] -= total
        return pick

    def credit(self, type_: int, key: K) -> float:
        """A key's credit for a type (0 before its first turn): for tests and debugging."""
        return self._credit.get(type_, {}).get(key, 0.0)


def overflow(
    preferred_load: float,
    alternative_load: float,
    ratio: float = OVERFLOW_RATIO,
    tokens: float = OVERFLOW_TOKENS,
) -> bool:
    """Whether a request should leave the replica its type's weights prefer for the
    least-loaded replica of another layout that can serve the type: when the preferred one
    has more than `ratio` × that replica's tokens left, plus `tokens`.

    Why (OServe §4.2 and `sageserve bench oserve`): the assignment LP balances *mean*
    utilisation at one mix, so strict weights partition the types between replicas; under
    bursty traffic (the code service's clumps) one partition queues while another idles,
    and the statistical multiplexing a shared pool would have had is lost (docs/oserve.md:
    weights held fixed gave 2.62 req/s goodput against 3.87 least-loaded on the same
    layout). Here the weights are a preference: while no replica holds a backlog beyond
    the floor (`tokens`), the normal, unsaturated case, they are followed exactly; a
    swamped preferred replica gives the request away. The load is tokens left (queued and
    running), not waiting requests: a pipeline's larger KV cache admits more requests, so
    by request count it looks idle while its batch is slow. 1.5 × + 1,024 was chosen on the
    benchmark's tuning hours (docs/oserve.md, "Overflow dispatch").
    """
    return preferred_load > ratio * alternative_load + tokens


#: One endpoint's request types as the plan publishes them (`layouts_from_status`): per
#: type, (prompt tokens, output tokens, variant → weight).
LayoutTypes = Sequence[tuple[float, float, Mapping[str, float]]]


@dataclass
class EndpointLayout:
    """One endpoint's OServe layout as requests are dispatched by it (OServe §4.2): the
    request types' centroids in log(1 + tokens), each type's weights per variant with their
    round robin, and every variant the plan names (with any weight, 0 included)."""

    types: tuple[tuple[float, float, tuple[tuple[str, float], ...]], ...]
    log_centroids: tuple[tuple[float, float], ...]
    weights: TypeWeights[str]
    variants: frozenset[str]


def endpoint_layout(types: LayoutTypes) -> EndpointLayout | None:
    """The layout of one endpoint from its published types; None when no type names a
    variant with weight > 0 (nothing to dispatch by: the endpoint keeps the type-free
    rule)."""
    frozen = tuple(
        (float(p), float(o), tuple(sorted((str(v), float(w)) for v, w in ws.items())))
        for p, o, ws in types
    )
    weights = {j: dict(ws) for j, (_, _, ws) in enumerate(frozen)}
    if not any(w > 0 for ws in weights.values() for w in ws.values()):
        return None
    return EndpointLayout(
        types=frozen,
        log_centroids=tuple(
            (math.log1p(max(0.0, p)), math.log1p(max(0.0, o))) for p, o, _ in frozen
        ),
        weights=TypeWeights(weights),
        variants=frozenset(v for ws in weights.values() for v in ws),
    )


def dispatch_by_type(
    layout: EndpointLayout,
    candidates: Sequence[B],
    variant_of: Callable[[B], str],
    pick: Callable[[list[B]], B],
    load: Callable[[B], float],
    prompt_tokens: float,
    predicted_output: float,
    ratio: float = OVERFLOW_RATIO,
    tokens: float = OVERFLOW_TOKENS,
) -> tuple[B, int, bool] | None:
    """OServe §4.2 dispatch over one endpoint's `candidates` (not empty): the request's type
    (nearest centroid of its prompt and *predicted* output), the variant by the type's
    weights (smooth weighted round robin among the variants with a candidate), `pick` among
    that variant's candidates (the in-region picker); then the overflow: if that candidate's
    `load` (tokens left) exceeds `ratio` × the least-loaded candidate's of another variant
    the type weighs (any other variant when it weighs only one) + `tokens`, that one
    instead. Returns (chosen, type, overflowed).

    None (the caller's type-free rule decides) when a candidate runs a variant the layout
    does not name (another GPU type, or a variant the plan has not weighed yet: weights
    over some candidates would starve the others), or when the type weighs no variant that
    has a candidate."""
    if any(variant_of(b) not in layout.variants for b in candidates):
        return None
    j = nearest_type(layout.log_centroids, prompt_tokens, predicted_output)
    variant = layout.weights.choose(j, {variant_of(b) for b in candidates})
    if variant is None:
        return None
    chosen = pick([b for b in candidates if variant_of(b) == variant])
    weighed = layout.weights.of(j)
    others = [
        b
        for b in candidates
        if variant_of(b) != variant and (len(weighed) < 2 or variant_of(b) in weighed)
    ]
    if others:
        alt = min(others, key=load)
        if overflow(load(chosen), load(alt), ratio, tokens):
            return alt, j, True
    return chosen, j, False


__all__ = [
    "OVERFLOW_RATIO",
    "OVERFLOW_TOKENS",
    "EndpointLayout",
    "LayoutTypes",
    "TypeWeights",
    "dispatch_by_type",
    "endpoint_layout",
    "nearest_type",
    "overflow",
]
