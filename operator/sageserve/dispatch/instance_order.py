"""The order an instance admits its waiting interactive requests in (SageServe v3 §6.5).

The instance scheduler iterates its waiting queue in policy order and admits requests while
KV memory permits. With two interactive tiers of different TTFT SLOs (IW-F, IW-N) the
paper compares four orders (§6.5, evaluated in §7.2.6, Fig. 15), each a function of the
request's arrival, its tier and `d_r`, the time left to its TTFT deadline (negative once
expired):

- FCFS: by arrival (the default; what vLLM does without priorities);
- EDF: ascending `d_r`, so expired requests come first (no starvation) and an IW-F request
  goes ahead of an IW-N request that arrived at the same time;
- PF (priority first): every request of the faster tier, FCFS, before any of the slower;
- DPA (deadline and priority aware): six buckets, in this order: severely expired
  (`d_r < -τ_n`), urgent IW-F (`0 ≤ d_r ≤ τ_p`), urgent IW-N, non-urgent IW-F, non-urgent
  IW-N, recently expired (`-τ_n ≤ d_r < 0`).

Which tier is faster is the WorkloadTier's declared `spec.priority` (lower first: IW-F 0,
IW-N 1); with more than two interactive tiers PF and DPA order them by it. Batch work keeps
its place: released batch requests wait behind every interactive one (SageServe §6.1),
and a batch request promoted near its deadline has no TTFT deadline and ranks after every
interactive tier (`LAST_RANK`). A request preempted after its first token goes first
under every policy (vLLM re-queues it at the head). The paper gives no values for `τ_n`
and `τ_p`; the defaults here are 10 s and 2 s (`spec.instanceScheduling`).

On Kubernetes the order is carried to vLLM as the request's `priority` (vLLM's
`--scheduling-policy priority` serves the lowest value first, ties by arrival):
`engine_priority`. A fixed number cannot follow `d_r` as time passes, so DPA is sent as PF
there.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import NamedTuple

from sageserve.core.types import Tier

_INF = float("inf")

#: The rank of work with no TTFT deadline (batch): after every interactive tier, whose
#: declared priorities are at most 1000 (WorkloadTier `spec.priority`).
LAST_RANK = 1001

#: EDF's engine priority of batch work: after any deadline in milliseconds since the epoch.
EDF_BATCH_PRIORITY = 2**62

DEFAULT_EXPIRED_AFTER_S = 10.0
DEFAULT_URGENT_WITHIN_S = 2.0


class OrderPolicy(StrEnum):
    """The instance scheduler's order of waiting interactive requests (SageServe §6.5)."""

    FCFS = "fcfs"
    EDF = "edf"
    PF = "pf"
    DPA = "dpa"


@dataclass(frozen=True, slots=True)
class InstanceScheduling:
    """A ScalingPolicy's `spec.instanceScheduling`: the policy and DPA's two thresholds."""

    policy: OrderPolicy = OrderPolicy.FCFS
    #: τ_n: a request more than this late is severely expired (DPA's first bucket)
    expired_after_s: float = DEFAULT_EXPIRED_AFTER_S
    #: τ_p: a request due within this is urgent (DPA)
    urgent_within_s: float = DEFAULT_URGENT_WITHIN_S

    @property
    def ordered(self) -> bool:
        """Whether the queue is reordered at all (FCFS keeps arrival order, at no cost)."""
        return self.policy is not OrderPolicy.FCFS


FCFS = InstanceScheduling()


class Waiting(NamedTuple):
    """What the order reads of one waiting request."""

    arrival: float
    #: absolute TTFT deadline (arrival + the tier's TTFT SLO); inf: none (batch)
    deadline: float
    #: the tier's declared priority, lower first; `LAST_RANK` for batch
    rank: int
    #: preempted after its first token: re-queued at the head under every policy
    started: bool = False


def waiting_for(
    arrival: float,
    ttft_slo_s: float | None,
    priority: int,
    batch: bool,
    started: bool = False,
) -> Waiting:
    """A request that arrived at `arrival`, of a tier with this TTFT SLO and declared
    priority: its TTFT deadline and rank (batch: none, and after every interactive tier)."""
    if batch:
        return Waiting(arrival, _INF, LAST_RANK, started)
    deadline = arrival + ttft_slo_s if ttft_slo_s is not None else _INF
    return Waiting(arrival, deadline, priority, started)


def waiting_of(tier: Tier, arrival: float, started: bool = False) -> Waiting:
    """A request of `tier` that arrived at `arrival` (`waiting_for` on the tier)."""
    return waiting_for(arrival, tier.ttft_slo_s, tier.priority, not tier.interactive, started)


Key = tuple[float, ...]


def sort_key(rule: InstanceScheduling, now: float) -> Callable[[Waiting], Key]:
    """The sort key of `rule` at `now`: sorting waiting requests by it (stably) gives the
    order the instance admits them in."""
    policy = rule.policy
    if policy is OrderPolicy.FCFS:

        def fcfs(w: Waiting) -> Key:
            return (0.0 if w.started else 1.0, w.arrival)

        return fcfs
    if policy is OrderPolicy.EDF:

        def edf(w: Waiting) -> Key:
            return (0.0 if w.started else 1.0, w.deadline, w.arrival)

        return edf
    if policy is OrderPolicy.PF:

        def pf(w: Waiting) -> Key:
            return (0.0 if w.started else 1.0, w.rank, w.arrival)

        return pf
    tau_n, tau_p = rule.expired_after_s, rule.urgent_within_s

    def dpa(w: Waiting) -> Key:
        if w.started:
            return (0.0, 0.0, 0.0, w.arrival)
        d = w.deadline - now
        if d < -tau_n:  # severely expired: most expired first
            return (1.0, 0.0, w.deadline, w.arrival)
        if d < 0:  # recently expired: last
            return (4.0, 0.0, w.deadline, w.arrival)
        bucket = 2.0 if d <= tau_p else 3.0  # urgent, then non-urgent; faster tier first
        return (bucket, float(w.rank), w.deadline, w.arrival)

    return dpa


def order(rule: InstanceScheduling, now: float, waiting: Sequence[Waiting]) -> list[int]:
    """Indices of `waiting` in the order `rule` admits them at `now` (ties keep their
    queue order)."""
    key = sort_key(rule, now)
    return sorted(range(len(waiting)), key=lambda i: key(waiting[i]))


def engine_priority(rule: InstanceScheduling, w: Waiting, epoch_s: float = 0.0) -> int | None:
    """The `priority` vLLM's OpenAI server is sent for a request (lower first; vLLM breaks
    ties by arrival), or None under FCFS (the engine runs `--scheduling-policy fcfs` and
    takes none). PF and DPA send the tier's rank; EDF the TTFT deadline in milliseconds
    since `epoch_s` (batch: after every deadline)."""
    policy = rule.policy
    if policy is OrderPolicy.FCFS:
        return None
    if policy is OrderPolicy.EDF:
        if w.deadline == _INF:
            return EDF_BATCH_PRIORITY
        return round((w.deadline - epoch_s) * 1000.0)
    return w.rank


__all__ = [
    "DEFAULT_EXPIRED_AFTER_S",
    "DEFAULT_URGENT_WITHIN_S",
    "EDF_BATCH_PRIORITY",
    "FCFS",
    "LAST_RANK",
    "InstanceScheduling",
    "OrderPolicy",
    "Waiting",
    "engine_priority",
    "order",
    "sort_key",
    "waiting_for",
    "waiting_of",
]
