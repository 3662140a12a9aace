"""In-region routing (SageServe §6.1): least-loaded deployment, then shortest queue.

The Model Router sends a request to the deployment (pod set) with the least effective
memory used; inside it, to the instance with the fewest remaining tokens to process
("join the shortest queue" on tokens, the repository's `token_jsq`). Ties go to the first
candidate so results are deterministic.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

K = TypeVar("K")


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
