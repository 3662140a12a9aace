"""The token rate a batch queue needs so that every queued request meets its deadline.

Why: SageServe's batch tier (NIW) carries a deadline (24 h, §6.3) and the Queue Manager
releases it only into the troughs of interactive load (§6.1–§6.2: under 60 % EMU). The
scaling strategies (§4 reactive 70/30, §6.4 LT-U / LT-UA) read EMU, and released batch work
keeps EMU under the release threshold, so batch work alone never makes an endpoint grow:
when the troughs do not absorb what was received, requests wait until their deadline has
passed. This module states what the queue needs, as one number a scaling signal can read
(`pace.pressure.deadline_pressure`).

The rule (earliest deadline first): queued work with deadlines d_1 ≤ d_2 ≤ … and token
costs w_1, w_2, … all finish by their deadlines at a constant rate r if and only if, for
every k, w_1 + … + w_k ≤ r · (d_k − now). The least such rate is

    max over k of (w_1 + … + w_k) / (d_k − now).

To keep it O(buckets) rather than O(requests), the queue keeps a ledger of tokens per
deadline bucket (`BUCKET_S` wide), each bucket read as due at its lower edge: every
request in it is due no earlier, so the rate is never below the exact one. Work already
due (or due within one bucket) counts as due one bucket from now: it cannot be on time,
and the rate it asks for stays finite.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

#: Width of a deadline bucket, seconds (the resolution of the required rate).
BUCKET_S = 60.0


def bucket_index(deadline: float, bucket_s: float = BUCKET_S) -> int:
    """The deadline bucket a deadline falls in; its lower edge is the index × `bucket_s`.
    One rule for the simulator's ledger and the router's queue, so both bucket alike."""
    return math.floor(deadline / bucket_s)


def bucketed(
    work: Iterable[tuple[float, float]], bucket_s: float = BUCKET_S
) -> list[tuple[float, float]]:
    """(deadline, tokens) pairs summed per deadline bucket: (lower edge, tokens), earliest
    first, as `DeadlineLedger.buckets` keeps them (work without tokens or deadline left out)."""
    tokens: dict[int, float] = {}
    for deadline, amount in work:
        if amount > 0 and math.isfinite(deadline):
            k = bucket_index(deadline, bucket_s)
            tokens[k] = tokens.get(k, 0.0) + amount
    return [(k * bucket_s, v) for k, v in sorted(tokens.items())]


def required_tps(
    buckets: Iterable[tuple[float, float]], now: float, min_window_s: float = BUCKET_S
) -> float:
    """Tokens/s that finish every (deadline, tokens) bucket by its deadline, serving the
    earliest deadline first: max over k of the tokens of the k earliest buckets ÷ the time
    to the k-th one's deadline (at least `min_window_s`). 0 with nothing queued."""
    need = cumulative = 0.0
    for deadline, tokens in sorted(buckets):
        if tokens <= 0:
            continue
        cumulative += tokens
        need = max(need, cumulative / max(deadline - now, min_window_s))
    return need


@dataclass(frozen=True)
class DeadlineRisk:
    """Queued work that a capacity cannot finish by its deadlines, served earliest
    deadline first: every request due by `until_s` is at risk, and `shortfall_tokens` is
    the most by which the work due by some deadline exceeds what the capacity serves
    before it."""

    until_s: float
    shortfall_tokens: float
    need_tps: float
    capacity_tps: float

    @property
    def shortfall_tps(self) -> float:
        """Tokens/s missing: the rate the deadlines need beyond the capacity."""
        return max(0.0, self.need_tps - self.capacity_tps)


def deadline_risk(
    buckets: Iterable[tuple[float, float]],
    now: float,
    capacity_tps: float,
    min_window_s: float = BUCKET_S,
) -> DeadlineRisk | None:
    """None when `capacity_tps`, serving the (deadline, tokens) buckets earliest deadline
    first from `now`, finishes each by its deadline; else what is at risk.

    The same condition as `required_tps` (the work due by each deadline d must fit in
    capacity × (d − now), at least `min_window_s`), read against a given capacity: the
    model's at `maxInstances` says whether a miss can still be avoided by scaling
    (SageServe §6.3's 24-hour deadline; a miss predicted, not discovered). EDF is optimal
    for one shared preemptible server, so `None` is exact for that fluid model and
    optimistic for real instances that also carry interactive load."""
    until = -math.inf
    shortfall = need = cumulative = 0.0
    for deadline, tokens in sorted(buckets):
        if tokens <= 0:
            continue
        cumulative += tokens
        window = max(deadline - now, min_window_s, 0.0)
        need = max(need, cumulative / window) if window > 0 else math.inf
        excess = cumulative - max(0.0, capacity_tps) * window
        if excess > 1e-9:
            until = deadline
            shortfall = max(shortfall, excess)
    if until == -math.inf:
        return None
    return DeadlineRisk(until, shortfall, need, max(0.0, capacity_tps))


def capacity_at_max(theta_tps: float, max_instances: Iterable[int]) -> float:
    """A model's tokens/s at its endpoints' maxInstances: θ per instance × Σ over regions.

    The largest capacity scaling can give the model's batch queue (serving nothing else):
    a need above it is a miss predicted that no scale-out can avoid. One rule for the
    simulator's end-of-run feasibility (`sim.deadlines`) and the operator's
    `BatchDeadlinesAtRisk` (`controller.deadlines`)."""
    return max(0.0, theta_tps) * sum(max(0, n) for n in max_instances)


class DeadlineLedger:
    """Queued tokens per deadline bucket of one model, kept up to date on submit and
    release, so the required rate costs O(buckets) however many requests wait."""

    def __init__(self, bucket_s: float = BUCKET_S) -> None:
        if bucket_s <= 0:
            raise ValueError("bucket_s must be positive")
        self.bucket_s = bucket_s
        self._tokens: dict[int, int] = {}

    def _bucket(self, deadline: float) -> int:
        return bucket_index(deadline, self.bucket_s)

    def add(self, deadline: float, tokens: int) -> None:
        if tokens <= 0 or math.isinf(deadline):
            return
        k = self._bucket(deadline)
        self._tokens[k] = self._tokens.get(k, 0) + tokens

    def remove(self, deadline: float, tokens: int) -> None:
        if tokens <= 0 or math.isinf(deadline):
            return
        k = self._bucket(deadline)
        left = self._tokens.get(k, 0) - tokens
        if left > 0:
            self._tokens[k] = left
        else:
            self._tokens.pop(k, None)

    @property
    def tokens(self) -> int:
        """All queued tokens with a deadline."""
        return sum(self._tokens.values())

    def buckets(self) -> list[tuple[float, float]]:
        """(deadline of the bucket: its lower edge, tokens), earliest first."""
        return [(k * self.bucket_s, float(v)) for k, v in sorted(self._tokens.items())]

    def required_tps(self, now: float) -> float:
        """`required_tps` over this ledger's buckets."""
        return required_tps(self.buckets(), now, self.bucket_s)

    def risk(self, now: float, capacity_tps: float) -> DeadlineRisk | None:
        """`deadline_risk` over this ledger's buckets."""
        return deadline_risk(self.buckets(), now, capacity_tps, self.bucket_s)
