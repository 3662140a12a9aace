"""Closing batches: the output and error files, and what happens at the deadline.

A batch is closed when nothing of it is left to run: all its requests finished
(``completed``), its deadline passed (``expired``), or it was cancelled and no replica still
holds one of its requests under a live lease (``cancelled``). Every input line ends up in
exactly one of the two files: a successful answer in the output file, anything else in the
error file with a code and a message. A request that missed the deadline is written there
with code ``batch_expired``, never silently dropped (SageServe §6.2's deadline).

The output and error files belong to the batch's owner and are kept for the batch's
``output_retention_s`` (the router's default when unset); the batch's requests are
purged at the same time (``purge_at``, ``retention.py``).

Closing takes the batch's row lock (PostgreSQL) or the write lock (SQLite) and checks the
batch again, so two replicas closing at once write the files once.
"""

from __future__ import annotations

import json
from typing import Any

from sqlalchemy import and_, exists, func, or_, select, update
from sqlalchemy.engine import Connection

from sageserve.batch.ids import new_id
from sageserve.batch.objects import RequestCounts
from sageserve.batch.schema import (
    BATCH_CANCELLED,
    BATCH_EXPIRED,
    CANCELLED,
    CANCELLING,
    COMPLETED,
    DONE,
    EXPIRED,
    IN_PROGRESS,
    RUNNING,
    UNFINISHED,
    batches,
    files,
    requests,
)

r = requests
b = batches


def closable(conn: Connection, now: float) -> list[str]:
    """Ids of the batches that can be closed now (checked again under the lock)."""
    unfinished = exists().where(r.c.batch_id == b.c.id, r.c.state.in_(UNFINISHED))
    held = exists().where(r.c.batch_id == b.c.id, r.c.state == RUNNING, r.c.lease_until >= now)
    stmt = select(b.c.id).where(
        or_(
            and_(b.c.status == IN_PROGRESS, or_(b.c.deadline <= now, ~unfinished)),
            and_(b.c.status == CANCELLING, ~held),
        )
    )
    return list(conn.execute(stmt).scalars())


def close(conn: Connection, batch_id: str, now: float, retention_s: float) -> str | None:
    """Close one batch if it can be; return its final status, or None. Its result files
    are kept ``retention_s`` unless the batch asked for its own retention."""
    batch = conn.execute(
        select(b).where(b.c.id == batch_id).with_for_update(skip_locked=True)
    ).first()
    if batch is None:
        return None
    status = _final_status(conn, batch, now)
    if status is None:
        return None
    if status == BATCH_EXPIRED:
        _end_unfinished(
            conn,
            batch_id,
            EXPIRED,
            "batch_expired",
            "the batch's deadline passed before this request ran: submit it again, or "
            "with a longer completion_window if the tier allows",
            now,
        )
    elif status == BATCH_CANCELLED:
        _end_unfinished(
            conn, batch_id, CANCELLED, "batch_cancelled", "the batch was cancelled", now
        )
    output, errors, counts = _render(conn, batch_id)
    purge_at = now + (batch.output_retention_s or retention_s)

    def write(kind: str, content: bytes) -> str | None:
        if not content:
            return None
        return _write_file(conn, batch, f"{batch_id}_{kind}.jsonl", content, now, purge_at)

    output_id, error_id = write("output", output), write("error", errors)
    conn.execute(
        update(b)
        .where(b.c.id == batch_id)
        .values(
            status=status,
            finalizing_at=now,
            output_file_id=output_id,
            error_file_id=error_id,
            total=counts.total,
            completed=counts.completed,
            failed=counts.failed,
            purge_at=purge_at,
            **{f"{status}_at": now},
        )
    )
    return status


def _final_status(conn: Connection, batch: Any, now: float) -> str | None:
    def any_left(*where: Any) -> bool:
        found = conn.execute(select(r.c.id).where(r.c.batch_id == batch.id, *where).limit(1))
        return found.first() is not None

    if batch.status == IN_PROGRESS:
        if not any_left(r.c.state.in_(UNFINISHED)):
            return COMPLETED
        return BATCH_EXPIRED if batch.deadline <= now else None
    if batch.status == CANCELLING:
        held = any_left(r.c.state == RUNNING, r.c.lease_until >= now)
        return None if held else BATCH_CANCELLED
    return None


def _end_unfinished(
    conn: Connection, batch_id: str, state: str, code: str, message: str, now: float
) -> None:
    conn.execute(
        update(r)
        .where(r.c.batch_id == batch_id, r.c.state.in_(UNFINISHED))
        .values(
            state=state,
            lease_owner=None,
            lease_until=None,
            error_code=code,
            error_message=message,
            finished_at=now,
        )
    )


def _render(conn: Connection, batch_id: str) -> tuple[bytes, bytes, RequestCounts]:
    """The output and error files' JSONL, in input line order, and the final counts."""
    output: list[str] = []
    errors: list[str] = []
    columns = (
        r.c.id,
        r.c.custom_id,
        r.c.state,
        r.c.status_code,
        r.c.response_body,
        r.c.response_request_id,
        r.c.error_code,
        r.c.error_message,
    )  # not the request bodies: a batch's results are written without reading them
    rows = conn.execute(select(*columns).where(r.c.batch_id == batch_id).order_by(r.c.line))
    for row in rows:
        response = None
        if row.status_code is not None:
            response = {
                "status_code": row.status_code,
                "request_id": row.response_request_id or row.id.replace("batch_req_", "req_"),
                "body": json.loads(row.response_body) if row.response_body else None,
            }
        line: dict[str, Any] = {"id": row.id, "custom_id": row.custom_id, "response": response}
        if row.state == DONE and 200 <= row.status_code < 300:
            output.append(json.dumps({**line, "error": None}))
            continue
        line["error"] = _error_of(row, response)
        errors.append(json.dumps(line))
    counts = RequestCounts(len(output) + len(errors), len(output), len(errors))
    return _jsonl(output), _jsonl(errors), counts


def _error_of(row: Any, response: dict[str, Any] | None) -> dict[str, str]:
    if row.error_code is not None:
        return {"code": row.error_code, "message": row.error_message or ""}
    body = response.get("body") if response else None
    upstream = body.get("error") if isinstance(body, dict) else None
    if isinstance(upstream, dict):
        return {
            "code": str(upstream.get("code") or upstream.get("type") or "upstream_error"),
            "message": str(upstream.get("message") or ""),
        }
    return {
        "code": "upstream_error",
        "message": f"the model server answered HTTP {row.status_code}",
    }


def _jsonl(lines: list[str]) -> bytes:
    return ("\n".join(lines) + "\n").encode() if lines else b""


def _write_file(
    conn: Connection, batch: Any, filename: str, content: bytes, now: float, expires_at: float
) -> str:
    """A result file of ``batch``, owned as the batch is."""
    file_id = new_id("file-")
    conn.execute(
        files.insert().values(
            id=file_id,
            purpose="batch_output",
            filename=filename,
            bytes=len(content),
            created_at=now,
            content=content,
            owner=batch.owner,
            created_by=batch.created_by,
            expires_at=expires_at,
        )
    )
    return file_id


def live_counts(conn: Connection, batch_ids: list[str]) -> dict[str, RequestCounts]:
    """Counts of batches still running, from their requests (terminal ones are frozen)."""
    if not batch_ids:
        return {}
    ok = and_(r.c.state == DONE, r.c.status_code >= 200, r.c.status_code < 300)
    ended = r.c.state.notin_(UNFINISHED)
    rows = conn.execute(
        select(
            r.c.batch_id,
            func.count(),
            func.count().filter(ok),
            func.count().filter(ended),
        )
        .where(r.c.batch_id.in_(batch_ids))
        .group_by(r.c.batch_id)
    ).all()
    return {
        batch_id: RequestCounts(int(total), int(good), int(ended) - int(good))
        for batch_id, total, good, ended in rows
    }
