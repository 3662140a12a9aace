"""Global router for interactive requests (SageServe §6.1).

Rule: go through the regions hosting the model in preference order (the client's own region
first, then by network proximity) and take the first whose effective memory utilisation is
under the threshold (70%, "based on production systems at Microsoft O365"); if none is, take
the region with the least EMU. Ties on least EMU keep preference order.

When the plan carries spill-over weights (`plan.flow`: what share of each region's demand
the ILP expects another region to serve, SageServe §5 C2 with ε < 1), they bound the rule:
a region sends another no more than its planned share of its recent tokens, so one
region's overload cannot take the capacity a neighbour was sized for. A model the plan gives
no weights keeps the paper's unbounded rule. The simulator and `sageserve router` both call
`route_region` with their own `SpillLedger`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

K = TypeVar("K")

DEFAULT_ROUTE_THRESHOLD = 0.70
#: Time constant of the ledger's memory: long enough to smooth bursts, short enough to
#: follow the hour the plan was made for.
DEFAULT_SPILL_MEMORY_S = 120.0
#: (model, home region) pairs the ledger remembers, the least recently used forgotten
#: first: a fleet has models × regions of them, far fewer; the cap only bounds a home
#: that was not checked against the model's regions.
DEFAULT_SPILL_KEYS = 10_000

#: Planned share of a home region's demand that each other region serves
#: (`Plan.spill[model][home]`).
SpillBounds = Mapping[str, float]


def preference(home: str | None, regions: Sequence[K], region_of: Callable[[K], str]) -> list[K]:
    """`regions` in preference order: the client's home region first, then the others in
    the order given (the deployment's, i.e. network proximity as the operator lists it)."""
    return [r for r in regions if region_of(r) == home] + [
        r for r in regions if region_of(r) != home
    ]


def pick_region(
    candidates: Sequence[tuple[K, float]], threshold: float = DEFAULT_ROUTE_THRESHOLD
) -> K:
    """`candidates` = [(region, emu), ...] in preference order; returns the chosen region."""
    if not candidates:
        raise ValueError("no region hosts the model")
    best = candidates[0]
    for cand in candidates:
        if cand[1] < threshold:
            return cand[0]
        if cand[1] < best[1]:
            best = cand
    return best[0]


@dataclass
class SpillLedger:
    """Tokens each (model, home region) sent to each region recently, decayed exponentially
    with time constant `memory_s`: the measured shares the plan's bounds are checked
    against. At most `max_keys` (model, home) pairs, least recently used forgotten first
    (a forgotten pair starts again with no history, as after a restart)."""

    memory_s: float = DEFAULT_SPILL_MEMORY_S
    max_keys: int = DEFAULT_SPILL_KEYS
    _sent: dict[tuple[Hashable, str], tuple[float, dict[str, float]]] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self._sent)

    def _decayed(self, key: tuple[Hashable, str], t: float) -> dict[str, float]:
        at, sent = self._sent.pop(key, (t, {}))  # re-inserted last: most recently used
        if t > at:
            f = math.exp(-(t - at) / self.memory_s)
            sent = {r: v * f for r, v in sent.items()}
        self._sent[key] = (max(t, at), sent)
        while len(self._sent) > self.max_keys:
            del self._sent[next(iter(self._sent))]
        return sent

    def share(self, model: Hashable, home: str, region: str, t: float) -> float:
        """Share of `home`'s recent tokens sent to `region` (0 with no history)."""
        sent = self._decayed((model, home), t)
        total = sum(sent.values())
        return sent.get(region, 0.0) / total if total > 0 else 0.0

    def record(self, model: Hashable, home: str, region: str, tokens: float, t: float) -> None:
        sent = self._decayed((model, home), t)
        sent[region] = sent.get(region, 0.0) + tokens


def route_region(
    model: Hashable,
    home: str | None,
    candidates: Sequence[tuple[K, float]],
    region_of: Callable[[K], str],
    tokens: float,
    t: float,
    ledger: SpillLedger,
    bounds: Mapping[str, SpillBounds] | None = None,
    threshold: float = DEFAULT_ROUTE_THRESHOLD,
) -> K:
    """`pick_region` within the plan's spill-over bounds, recorded in `ledger`.

    `candidates` are [(region, emu)] in preference order (`preference`), `bounds` the plan's
    weights for this model by home region (None or empty: the paper's rule, unbounded). A
    region other than home is skipped once home's share sent to it reaches its bound; home
    itself is never skipped, and a home with no candidate (no ready instance) is not bounded.
    """
    chosen: K
    limits = bounds.get(home) if bounds and home is not None else None
    if bounds and home is not None and limits is None:
        limits = {}  # the plan covers the model and expects home to serve itself
    home_ready = any(region_of(c) == home for c, _ in candidates)
    if limits is not None and home_ready:
        allowed = [
            (c, e)
            for c, e in candidates
            if region_of(c) == home
            or ledger.share(model, home or "", region_of(c), t) < limits.get(region_of(c), 0.0)
        ]
        chosen = pick_region(allowed, threshold)
    else:
        chosen = pick_region(candidates, threshold)
    if home is not None:
        ledger.record(model, home, region_of(chosen), tokens, t)
    return chosen
