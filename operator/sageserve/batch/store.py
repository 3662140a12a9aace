"""The durable batch queue: OpenAI files and batches, and their requests until answered.

Why a database and not memory: a batch waits hours for the troughs of interactive load
(SageServe §6.2: released as EMU falls, earliest deadline first, promoted when its slack
runs out; §6.3: due in 24 h or its completion window), longer than a router process can
be trusted to live. A request accepted here survives a router killed at
any moment (it is committed before ``create_batch`` returns), is answered at least once
(a claim is a lease; a lapsed lease is claimed again) and counted once (``complete`` is
idempotent per request id). SQLite (the default, embedded) serves one router; PostgreSQL
lets several replicas share one queue without running a request twice at once.

Files and batches are owned: every call about one takes the caller (a
``dispatch.identity.Principal``) and sees only its tenant's objects, so another tenant's id
is "no such file" exactly as an id that never existed (no probing for what others have).
Retention (``retention.py``) deletes files and finished batches' requests after their
``expires_at``; ``sweep`` runs it.

Every method is synchronous and short; callers on an event loop use
``asyncio.to_thread``. ``now`` (unix seconds) defaults to the clock and is a parameter so
that tests and the simulator can move time; replicas should have synchronised clocks,
since leases and deadlines compare times written by different processes.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from sqlalchemy import and_, or_, select
from sqlalchemy.engine import Connection, Engine

from sageserve.batch import db, finalize, queue, retention
from sageserve.batch.ids import new_id
from sageserve.batch.jsonl import (
    ENDPOINTS,
    KnownModels,
    ParsedFile,
    parse_input,
    request_tokens,
)
from sageserve.batch.limits import LineCounter, safe_filename
from sageserve.batch.objects import (
    Answer,
    BatchObject,
    ClaimedRequest,
    Conflict,
    DeadlineAtRisk,
    FileObject,
    InvalidInput,
    NotFound,
    QueueDepth,
    RequestCounts,
    WaitingDeadlines,
)
from sageserve.batch.retention import DEFAULT_RETENTION_S, Swept
from sageserve.batch.schema import (
    BATCH_CANCELLED,
    BATCH_FAILED,
    BATCH_TERMINAL,
    BATCH_UNFINISHED,
    CANCELLED,
    CANCELLING,
    EXPIRED,
    FAILED,
    IN_PROGRESS,
    QUEUED,
    batches,
    files,
    requests,
)
from sageserve.dispatch.identity import Principal
from sageserve.dispatch.queue_manager import DEFAULT_PROMOTION_MARGIN_S

#: OpenAI's limit of requests per batch.
DEFAULT_MAX_REQUESTS = 50_000
#: A request started this many times without an answer fails instead of running again.
DEFAULT_MAX_ATTEMPTS = 5
#: OpenAI's only completion window; a tier may allow other ones (``parse_window``).
DEFAULT_WINDOW = "24h"
MAX_WINDOW_S = 30 * 86400.0
#: Batch errors shown in a failed batch's ``errors`` (the rest is in the counts).
MAX_BATCH_ERRORS = 1000
FILE_PURPOSES = ("batch", "batch_output")
#: A batch's predicted shortfall is rewritten when it moves by more than this share.
RISK_REWRITE_RATIO = 0.05
_WINDOW = re.compile(r"^([1-9][0-9]*)([smhd])$")
_UNIT_S = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}

#: tier name -> its deadline in seconds (``WorkloadTier.spec.batch.deadlineSeconds``)
TierDeadlines = Callable[[str], float | None]


def parse_window(window: str) -> float:
    """Seconds of a completion window such as ``24h`` (also ``90m``, ``2d``)."""
    match = _WINDOW.match(window) if isinstance(window, str) else None
    seconds = float(match.group(1)) * _UNIT_S[match.group(2)] if match else 0.0
    if not match or not 60.0 <= seconds <= MAX_WINDOW_S:
        raise InvalidInput(
            f"completion_window {window!r} is not a duration between 1m and 30d such as "
            f"{DEFAULT_WINDOW!r}: use {DEFAULT_WINDOW!r}",
            param="completion_window",
        )
    return seconds


class BatchStore:
    """The queue on one database (``open(url)``); safe to share between threads."""

    def __init__(
        self,
        engine: Engine,
        *,
        max_requests: int = DEFAULT_MAX_REQUESTS,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        retention_s: float = DEFAULT_RETENTION_S,
    ) -> None:
        self.engine = engine
        self.max_requests = max_requests
        self.max_attempts = max_attempts
        #: how long a file, or a finished batch's results, is kept when the client set
        #: no ``expires_after``
        self.retention_s = retention_s

    @classmethod
    def open(
        cls,
        url: str,
        *,
        max_requests: int = DEFAULT_MAX_REQUESTS,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        retention_s: float = DEFAULT_RETENTION_S,
    ) -> BatchStore:
        """Connect to ``sqlite:///PATH`` or ``postgresql+psycopg://...`` and migrate the
        schema to the newest revision (replicas starting together take turns)."""
        engine = db.make_engine(url)
        db.upgrade(engine)
        return cls(
            engine, max_requests=max_requests, max_attempts=max_attempts, retention_s=retention_s
        )

    def close(self) -> None:
        self.engine.dispose()

    @property
    def backend(self) -> str:
        """``sqlite`` or ``postgresql``."""
        return self.engine.dialect.name

    # ---- files ---------------------------------------------------------------------

    def create_file(
        self,
        caller: Principal,
        content: bytes,
        filename: str,
        purpose: str = "batch",
        expires_after_s: float | None = None,
        now: float | None = None,
    ) -> FileObject:
        """Store an uploaded file as ``caller``'s, kept ``expires_after_s`` (the default
        retention when None); the caller enforces the size and line limits while reading."""
        if purpose not in FILE_PURPOSES:
            raise InvalidInput(
                f"purpose {purpose!r} is not supported here: use 'batch'", param="purpose"
            )
        created = _now(now)
        keep = self.retention_s if expires_after_s is None else expires_after_s
        obj = FileObject(
            new_id("file-"), purpose, safe_filename(filename), len(content), created, created + keep
        )
        with db.writing(self.engine) as conn:
            conn.execute(
                files.insert().values(
                    id=obj.id,
                    purpose=obj.purpose,
                    filename=obj.filename,
                    bytes=obj.bytes,
                    created_at=obj.created_at,
                    content=content,
                    owner=caller.owner,
                    created_by=caller.key_id,
                    expires_at=obj.expires_at,
                )
            )
        return obj

    def get_file(self, caller: Principal, file_id: str) -> FileObject:
        with db.reading(self.engine) as conn:
            return self._file(conn, caller, file_id)

    def list_files(
        self,
        caller: Principal,
        purpose: str | None = None,
        limit: int = 100,
        after: str | None = None,
    ) -> tuple[list[FileObject], bool]:
        """``caller``'s files, newest first, ``limit`` of them after the file ``after``;
        and whether more follow."""
        with db.reading(self.engine) as conn:
            stmt = select(*_FILE_COLUMNS).where(_owned(files, caller))
            if purpose is not None:
                stmt = stmt.where(files.c.purpose == purpose)
            if after is not None:
                cursor = self._file(conn, caller, after, param="after")
                stmt = stmt.where(_before(files.c.created_at, files.c.id, cursor))
            stmt = stmt.order_by(files.c.created_at.desc(), files.c.id.desc()).limit(limit + 1)
            rows = conn.execute(stmt).all()
        return [_file_object(row) for row in rows[:limit]], len(rows) > limit

    def file_content(self, caller: Principal, file_id: str) -> bytes:
        with db.reading(self.engine) as conn:
            content = conn.execute(
                select(files.c.content).where(files.c.id == file_id, _owned(files, caller))
            ).scalar()
        if content is None:
            raise NotFound("file", file_id)
        return bytes(content)

    def delete_file(self, caller: Principal, file_id: str) -> None:
        """Delete a file and the prompts of the finished batches made from it. The input
        of a batch still running is refused (Conflict): its requests are read from the
        queue, but the file is what the batch's owner will want to check it against."""
        with db.writing(self.engine) as conn:
            self._file(conn, caller, file_id)
            reader = conn.execute(
                select(batches.c.id, batches.c.status)
                .where(batches.c.input_file_id == file_id, batches.c.status.notin_(BATCH_TERMINAL))
                .limit(1)
            ).first()
            if reader is not None:
                raise Conflict(
                    f"file {file_id!r} is the input of batch {reader.id!r}, which is "
                    f"{reader.status}: cancel the batch (POST /v1/batches/{reader.id}/cancel) "
                    "or wait until it ends, then delete the file",
                    code="file_in_use",
                )
            retention.delete_files(conn, [file_id])

    # ---- batches -------------------------------------------------------------------

    def create_batch(
        self,
        caller: Principal,
        input_file_id: str,
        endpoint: str,
        completion_window: str = DEFAULT_WINDOW,
        metadata: Mapping[str, str] | None = None,
        known_models: KnownModels = lambda _: None,
        deadline_seconds: TierDeadlines = lambda _: None,
        output_expires_after_s: float | None = None,
        now: float | None = None,
    ) -> BatchObject:
        """Queue every runnable line of the input file; the others become error lines.

        ``known_models`` maps a served model name to its batch tier (None: not served for
        batch work, the line is an error). The batch is due ``completion_window`` after
        creation, or sooner if a tier of its lines has a shorter deadline
        (``deadline_seconds``); its ``tier`` is that tier. A file with no runnable line
        makes a ``failed`` batch whose ``errors`` say why, line by line. The input file
        must be ``caller``'s; the batch and its result files are ``caller``'s, the result
        files kept ``output_expires_after_s`` (the default retention when None).
        """
        if endpoint not in ENDPOINTS:
            raise InvalidInput(
                f"endpoint {endpoint!r} is not supported: use one of {', '.join(ENDPOINTS)}",
                param="endpoint",
            )
        window_s = parse_window(completion_window)
        created = _now(now)
        with db.reading(self.engine) as conn:
            source = self._file(conn, caller, input_file_id, param="input_file_id")
            if source.purpose != "batch":
                raise InvalidInput(
                    f"input_file_id {input_file_id!r} has purpose {source.purpose!r}: upload "
                    "the requests with purpose 'batch'",
                    param="input_file_id",
                )
            content = conn.execute(
                select(files.c.content).where(files.c.id == input_file_id)
            ).scalar_one()
        self._check_size(bytes(content), input_file_id)
        parsed = parse_input(bytes(content), endpoint, known_models)
        tiers = sorted({line.tier for line in parsed.requests})
        tier_deadlines = {t: d for t in tiers if (d := deadline_seconds(t)) is not None}
        tier = min(tier_deadlines, key=lambda t: tier_deadlines[t]) if tier_deadlines else None
        if tier is None and tiers:
            tier = tiers[0]
        due = created + min([window_s, *tier_deadlines.values()])
        batch_id = new_id("batch_")
        row: dict[str, Any] = {
            "id": batch_id,
            "endpoint": endpoint,
            "input_file_id": input_file_id,
            "completion_window": completion_window,
            "status": IN_PROGRESS,
            "created_at": created,
            "deadline": due,
            "tier": tier,
            "metadata_json": json.dumps(dict(metadata)) if metadata is not None else None,
            "in_progress_at": created,
            "total": parsed.total,
            "completed": 0,
            "failed": 0,
            "owner": caller.owner,
            "created_by": caller.key_id,
            "output_retention_s": output_expires_after_s or self.retention_s,
        }
        if not parsed.requests:
            row.update(_failed_row(parsed, input_file_id, created))
            row["purge_at"] = created + row["output_retention_s"]
        with db.writing(self.engine) as conn:
            self._file(conn, caller, input_file_id, param="input_file_id")  # not deleted since
            conn.execute(batches.insert().values(**row))
            if parsed.requests:
                rows = _request_rows(batch_id, endpoint, parsed, created, due)
                conn.execute(requests.insert(), rows)
        return self.get_batch(caller, batch_id)

    def _check_size(self, content: bytes, input_file_id: str) -> None:
        """Refuse a file of more requests than a batch holds before parsing any of it."""
        lines = LineCounter().feed(content)
        if lines > self.max_requests:
            raise InvalidInput(
                f"input_file_id {input_file_id!r} has {lines} requests, more than "
                f"{self.max_requests} per batch: split it into several batches",
                param="input_file_id",
                code="too_many_requests",
            )

    def get_batch(self, caller: Principal, batch_id: str) -> BatchObject:
        with db.reading(self.engine) as conn:
            row = conn.execute(
                select(batches).where(batches.c.id == batch_id, _owned(batches, caller))
            ).first()
            if row is None:
                raise NotFound("batch", batch_id)
            return self._batch_objects(conn, [row])[0]

    def list_batches(
        self, caller: Principal, limit: int = 20, after: str | None = None
    ) -> tuple[list[BatchObject], bool]:
        """``caller``'s batches, newest first, ``limit`` of them after the batch ``after``;
        and whether more follow."""
        with db.reading(self.engine) as conn:
            stmt = select(batches).where(_owned(batches, caller))
            if after is not None:
                cursor = conn.execute(
                    select(batches.c.created_at, batches.c.id).where(
                        batches.c.id == after, _owned(batches, caller)
                    )
                ).first()
                if cursor is None:
                    raise NotFound("batch", after, param="after")
                stmt = stmt.where(_before(batches.c.created_at, batches.c.id, cursor))
            stmt = stmt.order_by(batches.c.created_at.desc(), batches.c.id.desc())
            rows = conn.execute(stmt.limit(limit + 1)).all()
            return self._batch_objects(conn, rows[:limit]), len(rows) > limit

    def cancel(self, caller: Principal, batch_id: str, now: float | None = None) -> BatchObject:
        """Stop a batch: its queued requests are cancelled now; it becomes ``cancelled``
        once no replica runs one of its requests (those answers still count)."""
        at = _now(now)
        with db.writing(self.engine) as conn:
            status = conn.execute(
                select(batches.c.status)
                .where(batches.c.id == batch_id, _owned(batches, caller))
                .with_for_update()
            ).scalar()
            if status is None:
                raise NotFound("batch", batch_id)
            if status in BATCH_TERMINAL and status != BATCH_CANCELLED:
                raise Conflict(
                    f"batch {batch_id!r} is already {status} and cannot be cancelled",
                    code="batch_not_cancellable",
                )
            if status == IN_PROGRESS:
                conn.execute(
                    batches.update()
                    .where(batches.c.id == batch_id)
                    .values(status=CANCELLING, cancelling_at=at)
                )
                conn.execute(
                    requests.update()
                    .where(requests.c.batch_id == batch_id, requests.c.state == QUEUED)
                    .values(
                        state=CANCELLED,
                        error_code="batch_cancelled",
                        error_message="the batch was cancelled",
                        finished_at=at,
                    )
                )
        with db.writing(self.engine) as conn:
            finalize.close(conn, batch_id, at, self.retention_s)
        return self.get_batch(caller, batch_id)

    def finalize(self, now: float | None = None) -> list[tuple[str, str]]:
        """Close every batch that can be: write its output and error files and set its
        final status (``completed``, ``expired`` at its deadline with the unfinished
        requests as ``batch_expired`` errors, or ``cancelled``). Returns (batch id,
        status) of those closed by this call. Run it periodically, from any replica."""
        at = _now(now)
        with db.reading(self.engine) as conn:
            candidates = finalize.closable(conn, at)
        closed: list[tuple[str, str]] = []
        for batch_id in candidates:
            with db.writing(self.engine) as conn:
                status = finalize.close(conn, batch_id, at, self.retention_s)
            if status is not None:
                closed.append((batch_id, status))
        return closed

    def sweep(self, now: float | None = None) -> Swept:
        """Delete what retention says is due: finished batches' requests and result files
        past their ``purge_at``, then files past their ``expires_at`` that no running batch
        reads (with the prompts of the finished batches made from them). Accepted work is
        never deleted: an unfinished batch and its input file are kept until it ends. Run
        it periodically, from any replica; each chunk is its own short transaction."""
        at = _now(now)
        purged = deleted = 0
        while True:
            with db.reading(self.engine) as conn:
                due = retention.purgeable_batches(conn, at)
            for batch_id in due:
                with db.writing(self.engine) as conn:
                    purged += retention.purge_batch(conn, batch_id)
            if len(due) < retention.SWEEP_CHUNK:
                break
        while True:
            with db.writing(self.engine) as conn:
                expired = retention.expired_files(conn, at)
                deleted += retention.delete_files(conn, expired)
            if len(expired) < retention.SWEEP_CHUNK:
                break
        return Swept(deleted, purged)

    # ---- the queue -----------------------------------------------------------------

    def claim(
        self, model: str, n: int, owner: str, lease_s: float, now: float | None = None
    ) -> list[ClaimedRequest]:
        """Lease up to ``n`` of ``model``'s waiting requests to ``owner`` for ``lease_s``
        seconds, earliest deadline first (ties by arrival, batch, line): what the Queue
        Manager releases to an endpoint whose EMU fell (SageServe §6.2: 1 request under
        60 %, 2 under 50 %), in `BatchQueueManager`'s order (§6.3's deadlines)."""
        with db.writing(self.engine) as conn:
            return queue.claim(
                conn, queue.model_filter(model), n, owner, lease_s, _now(now), self.max_attempts
            )

    def claim_out_of_slack(
        self,
        model: str,
        now: float,
        service_tps: float,
        owner: str,
        lease_s: float,
        limit: int,
        margin_s: float = DEFAULT_PROMOTION_MARGIN_S,
        until: float | None = None,
    ) -> list[ClaimedRequest]:
        """Lease up to ``limit`` of ``model``'s requests whose slack ran out: their
        promotion time (deadline − tokens ÷ ``service_tps`` − ``margin_s``,
        `dispatch.queue_manager.promotion_time`) has passed, so they are released regardless
        of load, at interactive priority, to finish by their deadline (SageServe §6.2,
        §6.3), in order of promotion time. ``service_tps``: tokens/s one request of the
        model is served at (0: as if at once). ``until``: no request due has a later
        deadline (`WaitingDeadlines.due_until`), which bounds the index range read."""
        where, order = queue.out_of_slack(model, now, service_tps, margin_s, until)
        with db.writing(self.engine) as conn:
            return queue.claim(conn, where, limit, owner, lease_s, now, self.max_attempts, order)

    def complete(
        self,
        request_id: str,
        owner: str,
        status_code: int,
        body: Any,
        upstream_request_id: str | None = None,
        now: float | None = None,
    ) -> bool:
        """Record a request's answer (``body``: the decoded JSON, or a string). The first
        completion counts; a later one for the same id (a lease ran out and another
        replica ran it too, or a batch expired meanwhile) changes nothing: False."""
        with db.writing(self.engine) as conn:
            return queue.complete(
                conn, request_id, owner, status_code, body, upstream_request_id, _now(now)
            )

    def complete_many(
        self, owner: str, answers: Sequence[Answer], now: float | None = None
    ) -> list[str]:
        """Record many answers in one transaction (what the release loop does with the
        answers of the last few milliseconds). Each counts only if ``owner`` still holds
        its request (``running``, claimed by ``owner``): one finished already, cancelled,
        expired, or claimed by another replica after the lease ran out is left as it is.
        Returns the ids this call finished; calling again with the same answers finishes
        nothing more."""
        if not answers:
            return []
        with db.writing(self.engine) as conn:
            return queue.complete_many(conn, owner, answers, _now(now))

    def fail(
        self, request_id: str, owner: str, code: str, message: str, now: float | None = None
    ) -> bool:
        """Finish a request with an error line (no answer will ever come); False if it
        had already finished."""
        with db.writing(self.engine) as conn:
            return queue.fail(conn, request_id, owner, code, message, _now(now))

    def retry(
        self, request_id: str, owner: str, now: float | None = None, started: bool = True
    ) -> bool:
        """Put a request ``owner`` holds back in the queue (e.g. its pod failed); after
        ``max_attempts`` it fails instead. ``started=False`` when it was never sent
        (nowhere to send it): that claim does not count as an attempt. False if ``owner``
        does not hold it any more."""
        with db.writing(self.engine) as conn:
            return queue.retry(
                conn, request_id, owner, self.max_attempts, _now(now), started=started
            )

    def renew(
        self, owner: str, ids: Sequence[str], lease_s: float, now: float | None = None
    ) -> list[str]:
        """Extend ``owner``'s leases on ``ids`` to ``now + lease_s``; returns the ids it
        still holds (a missing one was taken over after its lease ran out, or finished)."""
        with db.writing(self.engine) as conn:
            return queue.renew(conn, owner, ids, lease_s, _now(now))

    def depth(self, now: float | None = None) -> list[QueueDepth]:
        """Waiting requests per (model, tier) and the oldest arrival: queue depth and age
        for the metrics, and the batch buffer β the plan provisions for."""
        with db.reading(self.engine) as conn:
            return queue.depth(conn, _now(now))

    def waiting_deadlines(self, now: float | None = None) -> list[WaitingDeadlines]:
        """Per model, the waiting requests' tokens per deadline (queued, or held under a
        lapsed lease, as ``depth`` counts them): the deadline need (`required_tps`), the
        predicted misses (`risk`) and the promotion scan's range (`due_until`), by the
        rules `BatchQueueManager` applies to its ledger (SageServe §6.3)."""
        with db.reading(self.engine) as conn:
            return queue.waiting_deadlines(conn, _now(now))

    def mark_deadline_risks(
        self, at_risk: Mapping[str, tuple[float, float]], now: float | None = None
    ) -> dict[str, DeadlineAtRisk | None]:
        """Say on each unfinished batch whether a deadline miss is predicted for it.

        ``at_risk``: per model, (the latest deadline of its work at risk, the tokens/s
        missing at its maxInstances); every unfinished batch with waiting requests of such
        a model due by that deadline is at risk (for the model missing most, if several),
        every other one is not. A batch stays marked with the time the miss was first
        predicted; its shortfall is rewritten when it moves by more than
        ``RISK_REWRITE_RATIO``, so replicas that agree write nothing. Returns the batches
        whose mark changed (None: cleared)."""
        at = _now(now)
        with db.reading(self.engine) as conn:
            wanted: dict[str, tuple[str, float]] = {}
            for model, (until, shortfall) in sorted(at_risk.items()):
                for batch_id in queue.batches_due_by(conn, model, at, until):
                    if batch_id not in wanted or wanted[batch_id][1] < shortfall:
                        wanted[batch_id] = (model, shortfall)
            marked = {
                row.id: DeadlineAtRisk.from_json(row.deadline_risk_json)
                for row in conn.execute(
                    select(batches.c.id, batches.c.deadline_risk_json).where(
                        batches.c.status.in_(BATCH_UNFINISHED),
                        batches.c.deadline_risk_json.is_not(None),
                    )
                )
            }
        changes: dict[str, DeadlineAtRisk | None] = {
            batch_id: None for batch_id in marked if batch_id not in wanted
        }
        for batch_id, (model, shortfall) in wanted.items():
            old = marked.get(batch_id)
            if old is not None and old.model == model and _close(old.shortfall_tps, shortfall):
                continue
            since = old.detected_at if old is not None else at
            changes[batch_id] = DeadlineAtRisk(model, shortfall, since)
        if changes:
            with db.writing(self.engine) as conn:
                for batch_id, mark in sorted(changes.items()):  # a few batches per change
                    conn.execute(
                        batches.update()
                        .where(
                            batches.c.id == batch_id,
                            batches.c.status.in_(BATCH_UNFINISHED),
                        )
                        .values(deadline_risk_json=None if mark is None else mark.to_json())
                    )
        return changes

    def state_counts(self) -> dict[str, int]:
        """Requests per state over the whole queue."""
        with db.reading(self.engine) as conn:
            return queue.state_counts(conn)

    def expired_total(self) -> int:
        """Requests that missed their batch's deadline (reported in error files)."""
        return self.state_counts().get(EXPIRED, 0)

    # ---- helpers -------------------------------------------------------------------

    def _file(
        self, conn: Connection, caller: Principal, file_id: str, param: str | None = None
    ) -> FileObject:
        """``caller``'s file ``file_id``; another tenant's is NotFound, as a missing one."""
        row = conn.execute(
            select(*_FILE_COLUMNS).where(files.c.id == file_id, _owned(files, caller))
        ).first()
        if row is None:
            raise NotFound("file", file_id, param=param)
        return _file_object(row)

    def _batch_objects(self, conn: Connection, rows: Sequence[Any]) -> list[BatchObject]:
        live = finalize.live_counts(
            conn, [row.id for row in rows if row.status not in BATCH_TERMINAL]
        )
        return [_batch_object(row, live.get(row.id)) for row in rows]


_FILE_COLUMNS = (
    files.c.id,
    files.c.purpose,
    files.c.filename,
    files.c.bytes,
    files.c.created_at,
    files.c.expires_at,
)
_TIMESTAMPS = (
    "in_progress_at",
    "finalizing_at",
    "completed_at",
    "failed_at",
    "expired_at",
    "cancelling_at",
    "cancelled_at",
)


def _owned(table: Any, caller: Principal) -> Any:
    """The rows of ``table`` that belong to ``caller``'s tenant."""
    return table.c.owner == caller.owner


def _now(now: float | None) -> float:
    return time.time() if now is None else now


def _before(created: Any, ident: Any, cursor: Any) -> Any:
    """Rows after ``cursor`` in newest-first order."""
    return or_(created < cursor.created_at, and_(created == cursor.created_at, ident < cursor.id))


def _file_object(row: Any) -> FileObject:
    expires = None if row.expires_at is None else float(row.expires_at)
    return FileObject(
        row.id, row.purpose, row.filename, int(row.bytes), float(row.created_at), expires
    )


def _close(old: float, new: float) -> bool:
    """Whether a stored shortfall still says ``new`` (within ``RISK_REWRITE_RATIO``)."""
    return abs(new - old) <= RISK_REWRITE_RATIO * max(abs(old), 1e-9)


def _batch_object(row: Any, live: RequestCounts | None) -> BatchObject:
    counts = live or RequestCounts(row.total, row.completed, row.failed)
    finished = row.status in BATCH_TERMINAL
    return BatchObject(
        id=row.id,
        endpoint=row.endpoint,
        input_file_id=row.input_file_id,
        completion_window=row.completion_window,
        status=row.status,
        created_at=row.created_at,
        deadline=row.deadline,
        tier=row.tier,
        metadata=json.loads(row.metadata_json) if row.metadata_json else None,
        errors=json.loads(row.errors_json) if row.errors_json else None,
        output_file_id=row.output_file_id,
        error_file_id=row.error_file_id,
        request_counts=counts,
        timestamps={name: getattr(row, name) for name in _TIMESTAMPS},
        deadline_at_risk=None if finished else DeadlineAtRisk.from_json(row.deadline_risk_json),
    )


def _failed_row(parsed: ParsedFile, input_file_id: str, now: float) -> dict[str, Any]:
    """A batch none of whose lines can run fails at once, saying why per line."""
    if not parsed.errors:
        errors: list[dict[str, Any]] = [
            {
                "code": "empty_file",
                "message": f"input_file_id {input_file_id!r} has no request lines: upload a "
                'JSONL file with one {"custom_id", "method", "url", "body"} object per line',
                "param": "input_file_id",
                "line": None,
            }
        ]
    else:
        errors = [
            {"code": e.code, "message": e.message, "param": None, "line": e.line}
            for e in parsed.errors[:MAX_BATCH_ERRORS]
        ]
    return {
        "status": BATCH_FAILED,
        "failed_at": now,
        "errors_json": json.dumps(errors),
        "failed": parsed.total,
    }


def _request_rows(
    batch_id: str, endpoint: str, parsed: ParsedFile, arrival: float, deadline: float
) -> list[dict[str, Any]]:
    """One row per line: a runnable one queued with its batch's deadline and its estimated
    tokens (`jsonl.request_tokens`), a bad one already failed with its error."""
    rows: list[dict[str, Any]] = []
    common = {
        "batch_id": batch_id,
        "url": endpoint,
        "arrival": arrival,
        "deadline": deadline,
        "attempts": 0,
    }
    for line in parsed.requests:
        rows.append(
            {
                **common,
                "id": new_id("batch_req_"),
                "custom_id": line.custom_id,
                "line": line.line,
                "model": line.model,
                "tier": line.tier,
                "body": json.dumps(line.body),
                "tokens": request_tokens(line.body),
                "state": QUEUED,
                "error_code": None,
                "error_message": None,
                "finished_at": None,
            }
        )
    for error in parsed.errors:
        rows.append(
            {
                **common,
                "id": new_id("batch_req_"),
                "custom_id": error.custom_id,
                "line": error.line,
                "model": None,
                "tier": None,
                "body": None,
                "tokens": 0,
                "state": FAILED,
                "error_code": error.code,
                "error_message": error.message,
                "finished_at": arrival,
            }
        )
    return rows
