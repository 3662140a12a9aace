"""Per-tenant rate limits: requests and estimated tokens per minute (WorkloadTier
`spec.limits`), so that one tenant's client cannot take the router and every pod behind it.

Each limit is a token bucket, kept as GCRA (the generic cell rate algorithm) keeps one: a
single number per bucket, its *theoretical arrival time* (TAT), the moment the bucket
would be full again. A request of cost `c` moves the TAT `c` emission intervals
(60 s ÷ limit) later; it is admitted while the TAT stays within the burst tolerance of
now. One float per bucket and no timer: a bucket nobody uses costs nothing to refill, and
a bucket whose TAT is past is the same as one never seen.

The bucket holds one minute's budget (burst = the per-minute limit, as OpenAI's limits
read: "N per minute" admits N at once), so over any 60 s the admitted cost is at most
limit + burst, i.e. twice the limit in the worst case (a full bucket spent at the start
of the window, then the refill of the whole window).

A request is admitted only when *every* limit of its tier admits it, and a refused
request costs nothing: a client retrying too early does not push its own retry further.
A request whose cost exceeds a bucket's whole burst can never be admitted; it is refused
as too large (retry-after infinite), not left to retry for ever.

Pure and clock-free: the caller passes `now` (seconds on a monotonic clock), so tests
replay any arrival sequence without sleeping. The set of buckets is bounded
(`MAX_BUCKETS`, least recently used evicted): an evicted bucket starts full when its key
returns, so eviction errs on the side of admitting, and only when more than
`MAX_BUCKETS` keys were active within a minute.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass, replace
from typing import Literal

LimitKind = Literal["requests", "tokens"]
LIMIT_KINDS: tuple[LimitKind, ...] = ("requests", "tokens")

#: Seconds a per-minute budget refills over.
WINDOW_SECONDS = 60.0
#: Buckets kept at most (least recently used evicted): ~10,000 active API keys x 2
#: limits within a minute fit, at about 200 bytes each (a few MB).
MAX_BUCKETS = 10_000
#: Relative slack in comparisons: N requests of cost 1 against a limit of N must all be
#: admitted although 60/N x N need not be exactly 60 in floating point.
_SLACK = 1e-9


@dataclass(frozen=True)
class Limits:
    """A tier's limits as the router applies them (WorkloadTier `spec.limits`)."""

    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None
    #: the tier's keys share one budget (`per: tier`); else each key has its own
    per_tier: bool = False

    def items(self) -> tuple[tuple[LimitKind, int], ...]:
        """The limits set, requests first."""
        found: list[tuple[LimitKind, int]] = []
        if self.requests_per_minute:
            found.append(("requests", self.requests_per_minute))
        if self.tokens_per_minute:
            found.append(("tokens", self.tokens_per_minute))
        return tuple(found)


@dataclass(frozen=True)
class Step:
    """One bucket's answer to one request."""

    allowed: bool
    #: the bucket's TAT after the request (unchanged when refused)
    tat: float
    #: seconds until the same cost would be admitted: 0 when admitted, inf when never
    retry_after: float
    #: budget left after the request (before it, when refused)
    remaining: float
    #: seconds until the bucket is full again
    reset: float


def gcra(tat: float, now: float, cost: float, per_minute: int, burst: float | None = None) -> Step:
    """One request of `cost` against a bucket refilling `per_minute` a minute, holding up to
    `burst` (default: one minute's budget), whose TAT is `tat` (`now` or earlier: full)."""
    burst = float(per_minute) if burst is None else burst
    interval = WINDOW_SECONDS / per_minute
    tolerance = burst * interval
    start = max(tat, now)
    after = start + cost * interval
    slack = _SLACK * max(tolerance, 1.0)
    if after - now <= tolerance + slack:
        left = max((tolerance - (after - now)) / interval, 0.0)
        return Step(True, after, 0.0, left, after - now)
    left = max((tolerance - (start - now)) / interval, 0.0)
    wait = math.inf if cost > burst * (1 + _SLACK) else after - now - tolerance
    return Step(False, tat, wait, left, start - now)


@dataclass(frozen=True)
class LimitState:
    """Where one limit of a tier stands for the caller after a request (the
    `x-ratelimit-*-requests` or `-tokens` headers)."""

    kind: LimitKind
    limit: int
    allowed: bool
    remaining: float
    reset: float
    retry_after: float = 0.0
    #: the request's cost against this limit
    cost: float = 0.0

    @property
    def too_large(self) -> bool:
        """The request costs more than the whole budget: no wait admits it."""
        return math.isinf(self.retry_after)


@dataclass(frozen=True)
class Verdict:
    """A request's outcome against every limit of its tier (no limits: allowed)."""

    states: tuple[LimitState, ...] = ()

    @property
    def allowed(self) -> bool:
        return all(s.allowed for s in self.states)

    @property
    def refused_by(self) -> LimitState | None:
        """The limit that refused, the one needing the longest wait when several did."""
        refused = [s for s in self.states if not s.allowed]
        return max(refused, key=lambda s: s.retry_after) if refused else None

    @property
    def retry_after(self) -> float:
        by = self.refused_by
        return by.retry_after if by else 0.0


#: (namespace, tier, key id or "" for a tier-wide bucket, kind)
BucketKey = tuple[str, str, str, LimitKind]


class RateLimiter:
    """Every tier's buckets, bounded to `max_buckets` (least recently used evicted)."""

    def __init__(self, max_buckets: int = MAX_BUCKETS) -> None:
        if max_buckets < 1:
            raise ValueError("max_buckets must be at least 1")
        self.max_buckets = max_buckets
        self._tats: OrderedDict[BucketKey, float] = OrderedDict()

    def __len__(self) -> int:
        return len(self._tats)

    def admit(
        self,
        namespace: str,
        tier: str,
        key_id: str,
        limits: Limits,
        tokens: float,
        now: float,
    ) -> Verdict:
        """Admit (and charge) one request of `tokens` estimated tokens, or refuse it and
        charge nothing. `key_id` is the caller's key ("" for an anonymous caller, who then
        shares the tier's budget with every other anonymous caller)."""
        who = "" if limits.per_tier else key_id
        charged: list[tuple[BucketKey, Step]] = []
        states: list[LimitState] = []
        for kind, per_minute in limits.items():
            key: BucketKey = (namespace, tier, who, kind)
            cost = 1.0 if kind == "requests" else max(tokens, 0.0)
            step = gcra(self._tats.get(key, now), now, cost, per_minute)
            charged.append((key, step))
            state = LimitState(kind, per_minute, step.allowed, step.remaining, step.reset)
            states.append(replace(state, retry_after=step.retry_after, cost=cost))
        verdict = Verdict(tuple(states))
        if verdict.allowed:
            for key, step in charged:
                self._store(key, step.tat)
        return verdict

    def _store(self, key: BucketKey, tat: float) -> None:
        self._tats[key] = tat
        self._tats.move_to_end(key)
        while len(self._tats) > self.max_buckets:
            self._tats.popitem(last=False)


def retry_after_header(seconds: float) -> str:
    """`Retry-After` in whole seconds, at least 1 (0 would invite an immediate retry that
    is refused again)."""
    if math.isinf(seconds):
        return str(int(WINDOW_SECONDS))
    return str(max(1, math.ceil(seconds - _SLACK)))


def duration_text(seconds: float) -> str:
    """A reset time as OpenAI writes it in `x-ratelimit-reset-*`: "20ms", "1.5s", "6m0s"."""
    seconds = max(seconds, 0.0)
    if seconds < 1.0:
        return f"{round(seconds * 1000)}ms"
    minutes, rest = divmod(round(seconds, 3), 60.0)
    text = f"{rest:.3f}".rstrip("0").rstrip(".") + "s"
    return f"{int(minutes)}m{text}" if minutes else text


def rate_limit_headers(verdict: Verdict) -> dict[str, str]:
    """OpenAI's `x-ratelimit-limit-*`, `-remaining-*` and `-reset-*` headers, for the
    limits the tier sets (none for an unlimited tier)."""
    headers: dict[str, str] = {}
    for s in verdict.states:
        headers[f"x-ratelimit-limit-{s.kind}"] = str(s.limit)
        headers[f"x-ratelimit-remaining-{s.kind}"] = str(math.floor(s.remaining + _SLACK))
        headers[f"x-ratelimit-reset-{s.kind}"] = duration_text(s.reset)
    return headers


__all__ = [
    "LIMIT_KINDS",
    "MAX_BUCKETS",
    "WINDOW_SECONDS",
    "LimitKind",
    "LimitState",
    "Limits",
    "RateLimiter",
    "Step",
    "Verdict",
    "duration_text",
    "gcra",
    "rate_limit_headers",
    "retry_after_header",
]
