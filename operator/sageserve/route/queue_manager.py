"""Batch (NIW) Queue Manager (SageServe §6.1–§6.2).

Batch requests are not routed on arrival: they wait in one global FIFO queue per model.
A (model, region) endpoint signals when its effective memory utilisation is low and the
Queue Manager releases work to it: **1 request under 60% EMU, 2 under 50%** (the paper's
rule; the public repository inverts it). Requests older than the promotion age (10 h) are
released regardless of load, with interactive priority, so the 24 h deadline holds.

When an endpoint signals is the caller's choice; the simulator signals on every request
completion of the endpoint (as the repository's `feed_async` does) and once per minute.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import Generic, TypeVar

T = TypeVar("T")

#: (EMU strictly below, requests released), most generous first.
DEFAULT_RELEASE_RULES: tuple[tuple[float, int], ...] = ((0.50, 2), (0.60, 1))
DEFAULT_PROMOTION_AGE_S = 10 * 3600.0


def release_count(emu: float, rules: Sequence[tuple[float, int]] = DEFAULT_RELEASE_RULES) -> int:
    """How many queued requests an endpoint at `emu` may take now."""
    for below, count in rules:
        if emu < below:
            return count
    return 0


class BatchQueueManager(Generic[T]):
    """Global per-model FIFO of batch requests with EMU-driven release and aging."""

    def __init__(
        self,
        rules: Sequence[tuple[float, int]] = DEFAULT_RELEASE_RULES,
        promotion_age_s: float | None = DEFAULT_PROMOTION_AGE_S,
    ) -> None:
        self.rules = tuple(sorted(rules))
        self.promotion_age_s = promotion_age_s
        self._queues: dict[str, deque[tuple[float, T]]] = {}

    def submit(self, model: str, item: T, arrival: float) -> None:
        """Queue a batch request (arrivals must come in time order per model)."""
        q = self._queues.get(model)
        if q is None:
            q = self._queues[model] = deque()
        q.append((arrival, item))

    def pending(self, model: str | None = None) -> int:
        if model is not None:
            q = self._queues.get(model)
            return len(q) if q else 0
        return sum(len(q) for q in self._queues.values())

    def on_signal(self, model: str, emu: float) -> list[T]:
        """An endpoint of `model` reports `emu`: release the requests it may take."""
        q = self._queues.get(model)
        if not q:
            return []
        n = release_count(emu, self.rules)
        out: list[T] = []
        while n > 0 and q:
            out.append(q.popleft()[1])
            n -= 1
        return out

    def pop_aged(self, now: float) -> list[tuple[str, T]]:
        """Requests older than the promotion age, oldest first, with their model."""
        if self.promotion_age_s is None:
            return []
        limit = now - self.promotion_age_s
        out: list[tuple[str, T]] = []
        for model, q in self._queues.items():
            while q and q[0][0] < limit:
                out.append((model, q.popleft()[1]))
        return out

    def drain(self) -> list[T]:
        """Remove and return everything still queued (end of a run)."""
        out = [item for q in self._queues.values() for _, item in q]
        self._queues.clear()
        return out
