"""Batch (NIW) Queue Manager (SageServe §6.1–§6.2), earliest deadline first.

Batch requests are not routed on arrival: they wait in one global queue per model. A
(model, region) endpoint signals when its effective memory utilisation is low and the
Queue Manager releases work to it: **1 request under 60% EMU, 2 under 50%** (the paper's
rule; the public repository inverts it). When an endpoint signals is one rule for the
router and the simulator: every endpoint with Ready instances of a model with queued work
signals every `SIGNAL_S` seconds and whenever a *released batch* request it served
completes (the paper signals on completions and once a minute; every second here, since the
EMU signalled with is `estimated_emu`, which rises with each release, so the rule limits
itself). Each round releases at most `PROMOTED_PER_SIGNAL` requests whose slack ran out.

Which request goes first, and when one stops waiting for a trough:

- **earliest deadline first**: each request carries its deadline (arrival + the tier's
  deadline, 24 h in §6.3) and a release takes the earliest one of the model, ties by
  arrival. With one deadline for the whole tier this is the paper's arrival order; with
  several tiers (or batches submitted with their own completion windows) it is the order
  that meets every deadline a constant capacity can meet (EDF's optimality on one server);
- **promotion by slack**: a request whose slack — deadline − now − its expected service
  time (tokens ÷ the caller's per-model, per-request token rate) − a safety margin — runs
  out is released regardless of load, at interactive priority, as late as its deadline
  allows. The paper promotes at a fixed age (10 h), which replays a morning's batch at
  interactive priority into the evening peak whether its deadline is near or not; requests
  without a deadline keep that age rule.

The queue also keeps, per model, the tokens queued per deadline bucket
(`dispatch.deadlines.DeadlineLedger`), from which `required_tps` says the token rate the queue
needs to meet every deadline (the scaling signal `pace.pressure.deadline_pressure`).

Every operation is O(log n) (heaps; a released or promoted request is marked and skipped
when it surfaces, the heaps rebuilt when half of them is such), since a day of a fleet
queues hundreds of thousands of requests.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Generic, TypeVar

from sageserve.dispatch.deadlines import BUCKET_S, DeadlineLedger

if TYPE_CHECKING:
    from sqlalchemy import ColumnElement

T = TypeVar("T")
#: Seconds, or a column of seconds: `promotion_time` is computed on plain numbers here and
#: in SQL by the router's durable queue (`batch.queue`), so both promote the same requests.
Seconds = TypeVar("Seconds", float, "ColumnElement[float]")

#: (EMU strictly below, requests released), most generous first.
ReleaseRules = tuple[tuple[float, int], ...]
#: The paper's rule; a ScalingPolicy sets its own (`dispatch.from_policy.release_rules_of`).
DEFAULT_RELEASE_RULES: ReleaseRules = ((0.50, 2), (0.60, 1))
DEFAULT_PROMOTION_AGE_S = 10 * 3600.0
#: Slack kept for queueing at the instance once promoted (at interactive priority a
#: request waits behind the interactive queue of a loaded instance).
DEFAULT_PROMOTION_MARGIN_S = 1800.0

#: Seconds between two signal rounds (every endpoint with queued work of its model signals
#: once a round; a completed released batch request signals at once as well).
SIGNAL_S = 1.0
#: Promoted requests (slack run out) released at most per signal round, so that a backlog
#: due at once reaches the fleet over several rounds instead of in one burst.
PROMOTED_PER_SIGNAL = 16

_INF = math.inf


def estimated_emu(read_emu: float, tokens_sent_since_read: float, kv_capacity: float) -> float:
    """An endpoint's EMU as the release rule reads it (SageServe §4's EMU): the last reading
    of its KV utilisation plus the tokens sent to it since that reading (prompt + output
    budget) over its KV capacity in tokens; the reading alone when the capacity is unknown
    (0). A release raises the estimate at once, so several signals between two readings
    do not each release as if the endpoint were still idle."""
    if kv_capacity > 0:
        return read_emu + tokens_sent_since_read / kv_capacity
    return read_emu


def promotion_time(
    deadline: Seconds, tokens: Seconds, service_tps: float, margin_s: float
) -> Seconds:
    """When a request with a deadline stops waiting for a trough (SageServe §6.2, §6.3):
    its deadline less its expected service time (`tokens` ÷ `service_tps`, the tokens/s
    one request of the model is served at; 0 or less: served at once) less `margin_s`
    kept for queueing at the instance. Promoted once this time has passed.

    One function for the simulator's `BatchQueueManager` (on floats) and the router's
    durable queue (`batch.queue`, on the `deadline` and `tokens` columns), so that both
    worlds promote the same requests at the same instant."""
    if service_tps > 0:
        return deadline - tokens / service_tps - margin_s
    return deadline - margin_s


def release_count(
    emu: float, rules: Sequence[tuple[float, int]] = DEFAULT_RELEASE_RULES, waiting: int = 0
) -> int:
    """How many queued requests an endpoint at `emu` may take now; none while `waiting`
    requests wait at its instances for admission. EMU measures memory, and an endpoint can
    run out of time first (a small, decode-bound model queues at a low EMU): work released
    into such a trough only lengthens the queue its interactive requests wait in. A request
    whose slack runs out is promoted whatever the queue (`promotion_time`)."""
    if waiting > 0:
        return 0
    for below, count in rules:
        if emu < below:
            return count
    return 0


class _Entry(Generic[T]):
    """One queued request; `queued` turns False when it leaves (release or promotion)."""

    __slots__ = ("arrival", "deadline", "item", "model", "queued", "tokens")

    def __init__(self, model: str, item: T, arrival: float, deadline: float, tokens: int) -> None:
        self.model = model
        self.item = item
        self.arrival = arrival
        self.deadline = deadline
        self.tokens = tokens
        self.queued = True


class BatchQueueManager(Generic[T]):
    """Global per-model queue of batch requests: EMU-driven release, earliest deadline
    first; promotion when a request's slack runs out (by age without a deadline)."""

    def __init__(
        self,
        rules: Sequence[tuple[float, int]] = DEFAULT_RELEASE_RULES,
        promotion_age_s: float | None = DEFAULT_PROMOTION_AGE_S,
        service_tps: Mapping[str, float] | None = None,
        promotion_margin_s: float | None = DEFAULT_PROMOTION_MARGIN_S,
        bucket_s: float = BUCKET_S,
    ) -> None:
        """`promotion_age_s`: the age at which a request without a deadline is promoted
        (None: never). `service_tps[model]`: tokens/s one request of the model is served
        at (e.g. its decode rate), for its expected service time; a model not in it counts
        as served at once. `promotion_margin_s`: slack kept at promotion (None: requests
        with a deadline are never promoted)."""
        self.rules = tuple(sorted(rules))
        self.promotion_age_s = promotion_age_s
        self.service_tps = dict(service_tps or {})
        self.promotion_margin_s = promotion_margin_s
        self.bucket_s = bucket_s
        #: per model: (deadline, arrival, seq, entry), the release order
        self._release: dict[str, list[tuple[float, float, int, _Entry[T]]]] = {}
        #: all models: (promotion time, seq, entry)
        self._promote: list[tuple[float, int, _Entry[T]]] = []
        self._count: dict[str, int] = {}
        self._total = 0
        self._ledgers: dict[str, DeadlineLedger] = {}
        self._seq = itertools.count()

    # ---- submit --------------------------------------------------------------------------

    def service_s(self, model: str, tokens: int) -> float:
        """Expected service time of a request of `tokens` tokens of `model`."""
        rate = self.service_tps.get(model, 0.0)
        return tokens / rate if rate > 0 else 0.0

    def promotion_at(self, model: str, arrival: float, deadline: float, tokens: int) -> float:
        """When a request stops waiting for a trough (inf: never)."""
        if math.isfinite(deadline):
            if self.promotion_margin_s is None:
                return _INF
            rate = self.service_tps.get(model, 0.0)
            return promotion_time(deadline, float(tokens), rate, self.promotion_margin_s)
        if self.promotion_age_s is None:
            return _INF
        return arrival + self.promotion_age_s

    def submit(
        self,
        model: str,
        item: T,
        arrival: float,
        deadline: float | None = None,
        tokens: int = 0,
    ) -> None:
        """Queue a batch request, with its absolute deadline (None: none) and its token cost
        (what the deadline ledger counts and the service time is estimated from)."""
        due = _INF if deadline is None else deadline
        entry = _Entry(model, item, arrival, due, tokens)
        seq = next(self._seq)
        heapq.heappush(self._release.setdefault(model, []), (due, arrival, seq, entry))
        self._count[model] = self._count.get(model, 0) + 1
        self._total += 1
        if math.isfinite(due):
            ledger = self._ledgers.get(model)
            if ledger is None:
                ledger = self._ledgers[model] = DeadlineLedger(self.bucket_s)
            ledger.add(due, tokens)
        at = self.promotion_at(model, arrival, due, tokens)
        if math.isfinite(at):
            heapq.heappush(self._promote, (at, seq, entry))

    # ---- read ----------------------------------------------------------------------------

    def pending(self, model: str | None = None) -> int:
        if model is not None:
            return self._count.get(model, 0)
        return self._total

    def models(self) -> list[str]:
        """Models with queued requests, in name order."""
        return sorted(m for m, n in self._count.items() if n)

    def required_tps(self, model: str, now: float) -> float:
        """Tokens/s the model's queued requests with a deadline need, served earliest
        deadline first, to all finish by their deadlines (`dispatch.deadlines`)."""
        ledger = self._ledgers.get(model)
        return ledger.required_tps(now) if ledger is not None else 0.0

    def ledger(self, model: str) -> DeadlineLedger | None:
        return self._ledgers.get(model)

    # ---- leave ---------------------------------------------------------------------------

    def _take(self, entry: _Entry[T]) -> T:
        entry.queued = False
        self._count[entry.model] -= 1
        self._total -= 1
        ledger = self._ledgers.get(entry.model)
        if ledger is not None:
            ledger.remove(entry.deadline, entry.tokens)
        return entry.item

    def on_signal(self, model: str, emu: float, waiting: int = 0) -> list[T]:
        """An endpoint of `model` reports `emu` and `waiting` requests queued at its
        instances: release the requests it may take (`release_count`), earliest deadline
        first (ties by arrival)."""
        if not self._count.get(model):
            return []
        n = release_count(emu, self.rules, waiting)
        heap = self._release[model]
        out: list[T] = []
        while n > 0 and heap:
            entry = heapq.heappop(heap)[3]
            if entry.queued:
                out.append(self._take(entry))
                n -= 1
        if len(self._promote) > 2 * self._total + 1024:
            self._compact()
        return out

    def pop_aged(self, now: float, limit: int | None = None) -> list[tuple[str, T]]:
        """Requests to promote now, with their model, in order of promotion time: slack run
        out (deadline − now − service time − margin), or older than the promotion age. At
        most `limit` (None: all due; the signal round's bound is `PROMOTED_PER_SIGNAL`)."""
        out: list[tuple[str, T]] = []
        heap = self._promote
        left = math.inf if limit is None else limit
        while heap and heap[0][0] < now and len(out) < left:
            entry = heapq.heappop(heap)[2]
            if entry.queued:
                out.append((entry.model, self._take(entry)))
        if out:
            self._compact()
        return out

    def _compact(self) -> None:
        """Drop entries that left from heaps mostly made of them (keeps memory O(queued))."""
        if len(self._promote) > 2 * self._total + 1024:
            self._promote = [e for e in self._promote if e[2].queued]
            heapq.heapify(self._promote)
        for model, heap in self._release.items():
            if len(heap) > 2 * self._count.get(model, 0) + 1024:
                heap[:] = [e for e in heap if e[3].queued]
                heapq.heapify(heap)

    def drain(self) -> list[T]:
        """Remove and return everything still queued (end of a run), per model in release
        order."""
        out: list[T] = []
        for model in sorted(self._release):
            for entry in (e[3] for e in sorted(self._release[model])):
                if entry.queued:
                    out.append(self._take(entry))
        self._release.clear()
        self._promote.clear()
        return out
