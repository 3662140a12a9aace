"""Taking requests off the queue and putting results back: claims, leases, completion.

Why leases: a router replica that claims a request may die before it answers; its lease
runs out and another replica claims the request again (at-least-once). A completion is
one conditional UPDATE (``state`` still unfinished), so it counts once whoever sends it
first, and every later completion of the same request id changes nothing.

Why ``complete_many``: at high release rates one transaction per answer, not the pods,
bounds how many requests a replica finishes per second. The release loop keeps answers in
memory for a few milliseconds and records them together, one UPDATE per request in one
transaction, each conditional on ``owner`` still holding the request (``running``, its
lease). An answer the replica dies holding is simply lost: the lease runs out and the
request runs again (at-least-once execution); an answer arriving after another replica
took the request over, or after the batch was cancelled or expired, changes nothing
(exactly-once recording).

Why two steps per claim: the requests whose lease ran out come first (they were claimed
before anything still queued), then the queued ones earliest deadline first; each step is
a range scan on an index, so a claim stays cheap however long the queue is. On PostgreSQL
both steps lock their rows ``FOR UPDATE SKIP LOCKED`` (replicas claiming at once take
different rows, no one waits); on SQLite the caller's ``BEGIN IMMEDIATE`` makes the claim
one serialised step.

Released requests follow SageServe §6.2 as the simulator's ``BatchQueueManager`` releases
them: ``claim(model, n)`` is what the Queue Manager releases to an endpoint whose EMU fell
(1 under 60 %, 2 under 50 %), earliest deadline first (ties by arrival, batch, line);
``out_of_slack_filter`` picks the requests whose slack ran out
(`dispatch.queue_manager.promotion_time`, computed in SQL on the ``deadline`` and ``tokens``
columns), which are released regardless of load. ``waiting_deadlines`` reads each model's
waiting tokens per deadline: the deadline need and the predicted misses (§6.3).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from sqlalchemy import ColumnElement, and_, bindparam, func, select, union_all, update
from sqlalchemy.engine import Connection

from sageserve.batch.objects import (
    Answer,
    ClaimedRequest,
    DeadlineGroup,
    QueueDepth,
    WaitingDeadlines,
)
from sageserve.batch.schema import (
    DONE,
    EXPIRED,
    FAILED,
    IN_PROGRESS,
    QUEUED,
    RUNNING,
    UNFINISHED,
    batches,
    requests,
)
from sageserve.dispatch.queue_manager import promotion_time

r = requests
b = batches

#: The release order (SageServe §6.3): earliest deadline first, then arrival, batch, line.
EDF_ORDER: tuple[ColumnElement[Any], ...] = (r.c.deadline, r.c.arrival, r.c.batch_id, r.c.line)


def claim(
    conn: Connection,
    filters: Sequence[ColumnElement[bool]],
    n: int,
    owner: str,
    lease_s: float,
    now: float,
    max_attempts: int,
    order: Sequence[ColumnElement[Any]] = EDF_ORDER,
) -> list[ClaimedRequest]:
    """Lease up to ``n`` requests matching ``filters`` to ``owner``, in ``order``
    (earliest deadline first unless told otherwise); returned in that order."""
    if n <= 0:
        return []
    live = [*filters, b.c.status == IN_PROGRESS, b.c.deadline > now]
    lapsed = _candidates(conn, [r.c.state == RUNNING, r.c.lease_until < now, *live], n, order)
    worn = [rid for rid, attempts in lapsed if attempts >= max_attempts]
    if worn:
        _give_up(conn, worn, max_attempts, now)
    ids = [rid for rid, attempts in lapsed if attempts < max_attempts]
    if len(ids) < n:
        fresh = _candidates(conn, [r.c.state == QUEUED, *live], n - len(ids), order)
        ids += [rid for rid, _ in fresh]
    if not ids:
        return []
    conn.execute(
        update(r)
        .where(r.c.id.in_(ids))
        .values(
            state=RUNNING,
            lease_owner=owner,
            lease_until=now + lease_s,
            attempts=r.c.attempts + 1,
        )
    )
    rows = conn.execute(select(r).where(r.c.id.in_(ids)).order_by(*order)).all()
    return [
        ClaimedRequest(
            id=row.id,
            batch_id=row.batch_id,
            custom_id=row.custom_id,
            model=row.model,
            tier=row.tier,
            url=row.url,
            body=json.loads(row.body),
            arrival=row.arrival,
            deadline=row.deadline,
            attempts=row.attempts,
            lease_until=row.lease_until,
        )
        for row in rows
    ]


def _candidates(
    conn: Connection,
    where: Sequence[ColumnElement[bool]],
    n: int,
    order: Sequence[ColumnElement[Any]],
) -> list[tuple[str, int]]:
    stmt = (
        select(r.c.id, r.c.attempts)
        .join(b, b.c.id == r.c.batch_id)
        .where(*where)
        .order_by(*order)
        .limit(n)
        .with_for_update(skip_locked=True, of=r)
    )
    return [(row.id, row.attempts) for row in conn.execute(stmt)]


def _give_up(conn: Connection, ids: Sequence[str], max_attempts: int, now: float) -> None:
    """A request whose runs keep ending without an answer (each time the router running
    it stopped) fails rather than taking the fleet down again and again."""
    conn.execute(
        update(r)
        .where(r.c.id.in_(ids))
        .values(
            state=FAILED,
            lease_owner=None,
            lease_until=None,
            finished_at=now,
            error_code="too_many_attempts",
            error_message=f"the request was started {max_attempts} times and never "
            "answered (the router running it stopped each time); check the request and "
            "submit it again",
        )
    )


def model_filter(model: str) -> list[ColumnElement[bool]]:
    return [r.c.model == model]


def out_of_slack(
    model: str, now: float, service_tps: float, margin_s: float, until: float | None
) -> tuple[list[ColumnElement[bool]], tuple[ColumnElement[Any], ...]]:
    """The filter and order of ``model``'s requests whose slack ran out at ``now``:
    `promotion_time` (deadline − tokens ÷ ``service_tps`` − ``margin_s``) has passed, the
    rule and arithmetic of `BatchQueueManager.promotion_at`, on the columns. ``until``
    (the latest deadline that can be due, `WaitingDeadlines.due_until`) bounds the index
    range read; the order is the in-memory manager's: promotion time, then arrival."""
    promotion = promotion_time(r.c.deadline, r.c.tokens, service_tps, margin_s)
    where: list[ColumnElement[bool]] = [r.c.model == model, promotion < now]
    if until is not None:
        where.append(r.c.deadline <= until)
    return where, (promotion, r.c.arrival, r.c.batch_id, r.c.line)


def complete(
    conn: Connection,
    request_id: str,
    owner: str,
    status_code: int,
    body: Any,
    upstream_request_id: str | None,
    now: float,
) -> bool:
    """Record the answer unless the request already finished; True if this call did."""
    return _finish(
        conn,
        request_id,
        owner,
        now,
        state=DONE,
        status_code=status_code,
        response_body=json.dumps(body),
        response_request_id=upstream_request_id,
    )


#: ids per ``IN (...)`` when finding which answers ``owner`` may still record
_HELD_CHUNK = 500


def complete_many(conn: Connection, owner: str, answers: Sequence[Answer], now: float) -> list[str]:
    """Record the answers of the requests ``owner`` still holds (``running`` under its
    lease, lapsed or not); skip the others (finished, cancelled, expired, or taken over by
    another replica after the lease ran out). Returns the ids this call finished, in the
    order of ``answers``; an id given twice counts its first answer."""
    first: dict[str, Answer] = {}
    for answer in answers:
        first.setdefault(answer.request_id, answer)
    ids = list(first)
    held: set[str] = set()
    for start in range(0, len(ids), _HELD_CHUNK):
        chunk = ids[start : start + _HELD_CHUNK]
        where = and_(r.c.id.in_(chunk), r.c.state == RUNNING, r.c.lease_owner == owner)
        # PostgreSQL: the rows stay locked until commit, so no claim (SKIP LOCKED) or
        # finalize takes them between this read and the UPDATE below
        held.update(conn.execute(select(r.c.id).where(where).with_for_update()).scalars())
    finished = [rid for rid in ids if rid in held]
    if not finished:
        return []
    stmt = (
        update(r)
        .where(r.c.id == bindparam("b_id"), r.c.state == RUNNING, r.c.lease_owner == owner)
        .values(
            state=DONE,
            lease_until=None,
            finished_at=now,
            status_code=bindparam("b_status"),
            response_body=bindparam("b_body"),
            response_request_id=bindparam("b_upstream"),
        )
    )
    conn.execute(
        stmt,
        [
            {
                "b_id": rid,
                "b_status": first[rid].status_code,
                "b_body": json.dumps(first[rid].body),
                "b_upstream": first[rid].upstream_request_id,
            }
            for rid in finished
        ],
    )
    return finished


def fail(
    conn: Connection, request_id: str, owner: str, code: str, message: str, now: float
) -> bool:
    """Finish the request with an error (no answer will come); True if this call did."""
    return _finish(
        conn, request_id, owner, now, state=FAILED, error_code=code, error_message=message
    )


def _finish(conn: Connection, request_id: str, owner: str, now: float, **values: Any) -> bool:
    """The one way a request ends: only from an unfinished state, so the first ending counts
    and a later one (a lapsed lease run twice) changes nothing."""
    result = conn.execute(
        update(r)
        .where(r.c.id == request_id, r.c.state.in_(UNFINISHED))
        .values(lease_owner=owner, lease_until=None, finished_at=now, **values)
    )
    return result.rowcount == 1


def retry(
    conn: Connection,
    request_id: str,
    owner: str,
    max_attempts: int,
    now: float,
    started: bool = True,
) -> bool:
    """Give a request ``owner`` holds back to the queue (or fail it after
    ``max_attempts``); False if ``owner`` no longer holds it. ``started=False``: it was
    never sent (nowhere to send it), so the claim does not count as an attempt."""
    held = and_(r.c.id == request_id, r.c.state == RUNNING, r.c.lease_owner == owner)
    attempts = conn.execute(select(r.c.attempts).where(held).with_for_update()).scalar()
    if attempts is None:
        return False
    if started and attempts >= max_attempts:
        _give_up(conn, [request_id], max_attempts, now)
        return True
    conn.execute(
        update(r)
        .where(held)
        .values(
            state=QUEUED,
            lease_owner=None,
            lease_until=None,
            attempts=attempts if started else max(attempts - 1, 0),
        )
    )
    return True


def renew(
    conn: Connection, owner: str, ids: Sequence[str], lease_s: float, now: float
) -> list[str]:
    """Extend the leases ``owner`` still holds among ``ids``; return those ids."""
    if not ids:
        return []
    held = and_(r.c.id.in_(list(ids)), r.c.state == RUNNING, r.c.lease_owner == owner)
    kept = list(conn.execute(select(r.c.id).where(held).with_for_update()).scalars())
    if kept:
        conn.execute(update(r).where(r.c.id.in_(kept)).values(lease_until=now + lease_s))
    return kept


def depth(conn: Connection, now: float) -> list[QueueDepth]:
    """Requests waiting per (model, tier): queued, or claimed by a replica whose lease ran
    out (they will be claimed again). Both are read from indexes."""
    totals: dict[tuple[str, str | None], tuple[int, float]] = {}
    for waiting in (
        [r.c.state == QUEUED],
        [r.c.state == RUNNING, r.c.lease_until < now],
    ):
        rows = conn.execute(
            select(r.c.model, r.c.tier, func.count(), func.min(r.c.arrival))
            .where(*waiting)
            .group_by(r.c.model, r.c.tier)
        ).all()
        for model, tier, count, oldest in rows:
            seen, first = totals.get((model, tier), (0, float(oldest)))
            totals[(model, tier)] = (seen + int(count), min(first, float(oldest)))
    return [
        QueueDepth(model, tier, count, oldest)
        for (model, tier), (count, oldest) in sorted(
            totals.items(), key=lambda item: (item[0][0], item[0][1] or "")
        )
    ]


def waiting_deadlines(conn: Connection, now: float) -> list[WaitingDeadlines]:
    """Per model, its waiting requests' tokens (and largest request) per deadline, earliest
    first: queued, or claimed by a replica whose lease ran out, as ``depth`` counts them,
    and not yet past their deadline (those can no longer be served; ``finalize`` reports
    them). One GROUP BY over the two index ranges; a batch's requests share a deadline, so
    there is a row per (model, batch) at most."""
    waiting = union_all(
        select(r.c.model, r.c.deadline, r.c.tokens).where(r.c.state == QUEUED, r.c.deadline > now),
        select(r.c.model, r.c.deadline, r.c.tokens).where(
            r.c.state == RUNNING, r.c.lease_until < now, r.c.deadline > now
        ),
    ).subquery()
    rows = conn.execute(
        select(
            waiting.c.model,
            waiting.c.deadline,
            func.sum(waiting.c.tokens),
            func.max(waiting.c.tokens),
        )
        .group_by(waiting.c.model, waiting.c.deadline)
        .order_by(waiting.c.model, waiting.c.deadline)
    ).all()
    groups: dict[str, list[DeadlineGroup]] = {}
    for model, deadline, tokens, largest in rows:
        group = DeadlineGroup(float(deadline), int(tokens or 0), int(largest or 0))
        groups.setdefault(str(model), []).append(group)
    return [WaitingDeadlines(model, tuple(found)) for model, found in groups.items()]


def batches_due_by(conn: Connection, model: str, now: float, until: float) -> list[str]:
    """The batches with waiting requests of ``model`` due by ``until`` (read from the
    deadline index: queued ones, then those under a lapsed lease)."""
    found: set[str] = set()
    for waiting in (
        [r.c.state == QUEUED],
        [r.c.state == RUNNING, r.c.lease_until < now],
    ):
        found.update(
            conn.execute(
                select(r.c.batch_id)
                .where(*waiting, r.c.model == model, r.c.deadline > now, r.c.deadline <= until)
                .distinct()
            ).scalars()
        )
    return sorted(found)


def state_counts(conn: Connection) -> dict[str, int]:
    """Requests per state over the whole queue (``expired`` ones missed their deadline)."""
    rows = conn.execute(select(r.c.state, func.count()).group_by(r.c.state)).all()
    counts = {state: 0 for state in (QUEUED, RUNNING, DONE, FAILED, EXPIRED)}
    counts.update({state: int(count) for state, count in rows})
    return counts
