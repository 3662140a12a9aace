"""Deadline accounting of batch (NIW) work at the end of a run: what was served in time,
what missed, and what is still legitimately waiting.

Why: SageServe's batch tier carries a 24-hour deadline (§6.3) and the Queue Manager
releases it into the troughs of interactive load, so over a one-day window (§7) most
deadlines of the work still queued when the run stops lie after the horizon. Counting that
work as failed (as SLO attainment does) punishes a policy for deferring work it may
legitimately defer; counting only finished requests that ran late (as `deadline_misses`
does) lets a policy that never serves batch work read zero misses and look cheaper. Here
every batch request that was not refused lands in exactly one class:

- **served_by_deadline**: finished, end to end within the deadline;
- **served_late**: finished after its deadline;
- **missed**: not finished although its deadline lies inside the horizon (or it was
  dropped, so it can never be served);
- **queued_beyond_horizon**: not finished, deadline after the horizon: not a miss, and not
  counted against attainment. Whether it still *can* be served is said by
  `feasible_at_max`, an earliest-deadline-first check at the fleet's largest size.

Deadline misses inside the horizon are `served_late + missed`; the deadline attainment is
served_by_deadline / (served_by_deadline + served_late + missed), i.e. over the requests
whose fate is known when the run stops.

The horizon is the last instant the run observed: the end of the window plus the drain
(the simulator keeps serving, the Queue Manager included, through the drain), so a request
whose deadline passed during the drain while it waited is a miss, not "waiting".

Pure functions on plain numbers, so the rules are tested on tables.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sageserve.dispatch.deadlines import deadline_risk


@dataclass(frozen=True, slots=True)
class PendingWork:
    """One unfinished batch request: its absolute deadline (s) and the tokens it still
    needs (prompt to recompute + output still to produce, θ's unit). Slotted: a fleet run
    may end with hundreds of thousands of these."""

    deadline_s: float
    tokens: float


def edf_feasible(pending: Iterable[PendingWork], horizon_s: float, capacity_tps: float) -> bool:
    """Whether `pending` can all finish by their deadlines, served earliest deadline first
    from `horizon_s` on at `capacity_tps` tokens/s.

    EDF is optimal for one shared, preemptible server, so the check is exact for that fluid
    model: for every deadline d, the tokens due by d must fit in (d − horizon) × capacity.
    It ignores the interactive load the same instances carry, start-up and KV limits, so it
    is optimistic: `False` is conclusive (not even the largest fleet, serving nothing else,
    meets them), `True` says only that the queue is not hopeless.
    """
    buckets = [(w.deadline_s, w.tokens) for w in pending]
    return deadline_risk(buckets, horizon_s, capacity_tps, min_window_s=0.0) is None


@dataclass(frozen=True)
class BatchAccount:
    """The deadline accounting of one batch tier × model (see the module doc)."""

    served_by_deadline: int
    served_late: int
    missed: int
    queued_beyond_horizon: int
    earliest_pending_deadline_s: float | None
    #: None when the model's capacity is unknown and something is pending
    feasible_at_max: bool | None
    horizon_s: float
    capacity_at_max_tps: float

    @property
    def misses(self) -> int:
        """Deadline misses inside the horizon: served late or missed while unfinished."""
        return self.served_late + self.missed

    @property
    def deadline_attainment(self) -> float | None:
        """served_by_deadline over the requests whose deadline lies inside the horizon or
        that finished; None when there are none."""
        known = self.served_by_deadline + self.served_late + self.missed
        return self.served_by_deadline / known if known else None

    def as_dict(self) -> dict[str, Any]:
        att = self.deadline_attainment
        return {
            "served_by_deadline": self.served_by_deadline,
            "served_late": self.served_late,
            "missed": self.missed,
            "queued_beyond_horizon": self.queued_beyond_horizon,
            "earliest_pending_deadline_s": self.earliest_pending_deadline_s,
            "feasible_at_max": self.feasible_at_max,
            "deadline_attainment": round(att, 5) if att is not None else None,
            "horizon_s": self.horizon_s,
            "capacity_at_max_tps": round(self.capacity_at_max_tps, 3),
        }


def account(
    served_by_deadline: int,
    served_late: int,
    pending: Sequence[PendingWork],
    dropped: int,
    horizon_s: float,
    capacity_tps: float,
) -> BatchAccount:
    """Classify one batch tier × model: finished counts as measured, each pending request
    by its deadline against `horizon_s`, dropped requests as missed (they will never be
    served), and the feasibility of what is legitimately waiting."""
    inside = [w for w in pending if w.deadline_s <= horizon_s]
    beyond = [w for w in pending if w.deadline_s > horizon_s]
    earliest = min((w.deadline_s for w in beyond), default=None)
    if not beyond:
        feasible: bool | None = True
    elif capacity_tps <= 0 or not math.isfinite(capacity_tps):
        feasible = None
    else:
        feasible = edf_feasible(beyond, horizon_s, capacity_tps)
    return BatchAccount(
        served_by_deadline,
        served_late,
        len(inside) + dropped,
        len(beyond),
        earliest,
        feasible,
        horizon_s,
        capacity_tps,
    )


#: Count fields summed over batch tiers × models by `totals`.
_COUNTS = ("served_by_deadline", "served_late", "missed", "queued_beyond_horizon")


def totals(entries: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """Batch tier × model entries of a summary (those with `served_by_deadline`) added up:
    how many (`entries`), the counts summed, `misses` (served late + missed), the pooled
    deadline attainment, the earliest pending deadline, and feasibility (False if any is
    infeasible, None if any is unknown, else True). Empty input gives zero counts and None
    elsewhere."""
    rows = [e for e in entries if "served_by_deadline" in e]
    out: dict[str, Any] = {k: sum(int(e[k]) for e in rows) for k in _COUNTS}
    out["entries"] = len(rows)
    out["misses"] = out["served_late"] + out["missed"]
    known = out["served_by_deadline"] + out["misses"]
    out["deadline_attainment"] = out["served_by_deadline"] / known if known else None
    pend = [e["earliest_pending_deadline_s"] for e in rows]
    out["earliest_pending_deadline_s"] = min((p for p in pend if p is not None), default=None)
    feas = [e["feasible_at_max"] for e in rows]
    out["feasible_at_max"] = (
        None if not rows else False if False in feas else None if None in feas else True
    )
    return out


def describe(t: Mapping[str, Any], end_s: float) -> dict[str, str]:
    """Table cells of `totals` for people: the deadline attainment, served by the deadline,
    the misses inside the horizon (how many of them late rather than unserved), and the
    work queued beyond the horizon with its earliest deadline (hours after the window's end)
    and whether the largest fleet could still meet it. "-" where there is no batch tier."""
    if not t.get("entries"):
        return dict.fromkeys(("attainment", "served", "missed", "waiting"), "-")
    att = t["deadline_attainment"]
    late = t["served_late"]
    waiting = f"{t['queued_beyond_horizon']:,}"
    if t["queued_beyond_horizon"]:
        first = t["earliest_pending_deadline_s"]
        feas = t["feasible_at_max"]
        verdict = "feasible" if feas else "INFEASIBLE" if feas is False else "feasible?"
        waiting += f" (due ≥ end+{(first - end_s) / 3600:.1f}h, {verdict})"
    return {
        "attainment": f"{att:.2%}" if att is not None else "-",
        "served": f"{t['served_by_deadline']:,}",
        "missed": f"{t['misses']:,}" + (f" ({late:,} late)" if late else ""),
        "waiting": waiting,
    }
