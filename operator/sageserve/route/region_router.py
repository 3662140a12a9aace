"""Global router for interactive requests (SageServe §6.1).

Rule: go through the regions hosting the model in preference order (the client's own region
first, then by network proximity) and take the first whose effective memory utilisation is
under the threshold (70%, "based on production systems at Microsoft O365"); if none is, take
the region with the least EMU. Ties on least EMU keep preference order.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

K = TypeVar("K")

DEFAULT_ROUTE_THRESHOLD = 0.70


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
