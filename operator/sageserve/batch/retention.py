"""How long files and finished batches are kept, and the sweep that deletes them.

Why: a batch's input file holds its prompts and its output file the answers; kept for
ever, the queue grows without bound and keeps every tenant's data past any need. OpenAI's
``expires_after`` (``{"anchor": "created_at", "seconds": N}``, 1 hour to 30 days) sets a
file's retention at upload, and ``output_expires_after`` that of a batch's output and
error files; without one the router's default applies (``--batch-retention-seconds``).

The sweep never loses accepted work: a batch's requests are deleted only once the batch is
final and its retention ran out (``purge_at``), and a file that is the input of a batch
still running is kept until that batch ends. Deleting an input file also forgets the
prompts (``requests.body``) of its finished batches.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from sqlalchemy import delete, exists, select, update
from sqlalchemy.engine import Connection

from sageserve.batch.objects import InvalidInput
from sageserve.batch.schema import BATCH_TERMINAL, batches, files, requests

#: OpenAI's bounds on ``expires_after.seconds``.
MIN_RETENTION_S = 3600
MAX_RETENTION_S = 30 * 86400
DEFAULT_RETENTION_S = 30 * 86400.0
ANCHOR = "created_at"
#: rows deleted per transaction, so that a sweep never holds the write lock for long
SWEEP_CHUNK = 200


class Swept(NamedTuple):
    """What one sweep deleted: files past their retention, and finished batches whose
    requests and result files went (those result files are counted here, not in files)."""

    files: int
    batches: int


def parse_expires_after(anchor: Any, seconds: Any, field: str, form: bool = False) -> float:
    """The retention in seconds of OpenAI's ``{"anchor": "created_at", "seconds": N}``.

    ``field`` names it in errors (``expires_after``, ``output_expires_after``); ``form``:
    it came as multipart fields ``field[anchor]`` and ``field[seconds]`` (strings)."""

    def name(part: str) -> str:
        return f"{field}[{part}]" if form else f"{field}.{part}"

    if anchor != ANCHOR:
        raise InvalidInput(
            f"{name('anchor')} must be {ANCHOR!r}, got {anchor!r}", param=name("anchor")
        )
    value: int | None = None
    if isinstance(seconds, int) and not isinstance(seconds, bool):
        value = seconds
    elif form and isinstance(seconds, str) and seconds.strip().isdigit():
        value = int(seconds)
    if value is None or not MIN_RETENTION_S <= value <= MAX_RETENTION_S:
        raise InvalidInput(
            f"{name('seconds')} must be an integer from {MIN_RETENTION_S} (1 hour) to "
            f"{MAX_RETENTION_S} (30 days), got {seconds!r}",
            param=name("seconds"),
        )
    return float(value)


def expires_after_object(value: Any, field: str) -> float | None:
    """``parse_expires_after`` for a JSON body's field (None when absent)."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise InvalidInput(
            f'{field} must be an object {{"anchor": "{ANCHOR}", "seconds": N}}', param=field
        )
    return parse_expires_after(value.get("anchor"), value.get("seconds"), field)


def unfinished_reader(file_id: Any) -> Any:
    """The condition "a batch still running reads this file"."""
    return exists().where(
        batches.c.input_file_id == file_id, batches.c.status.notin_(BATCH_TERMINAL)
    )


def forget_prompts(conn: Connection, file_ids: list[str]) -> None:
    """Drop the prompts of the finished batches made from ``file_ids`` (the answers stay
    until the batch's own retention)."""
    readers = select(batches.c.id).where(
        batches.c.input_file_id.in_(file_ids), batches.c.status.in_(BATCH_TERMINAL)
    )
    conn.execute(
        update(requests)
        .where(requests.c.batch_id.in_(readers), requests.c.body.is_not(None))
        .values(body=None)
    )


def expired_files(conn: Connection, now: float) -> list[str]:
    """Up to ``SWEEP_CHUNK`` files past their retention that no running batch reads."""
    stmt = (
        select(files.c.id)
        .where(files.c.expires_at <= now, ~unfinished_reader(files.c.id))
        .limit(SWEEP_CHUNK)
    )
    return list(conn.execute(stmt).scalars())


def delete_files(conn: Connection, file_ids: list[str]) -> int:
    """Delete files and the prompts read from them; returns how many files went."""
    if not file_ids:
        return 0
    forget_prompts(conn, file_ids)
    return int(conn.execute(delete(files).where(files.c.id.in_(file_ids))).rowcount)


def purgeable_batches(conn: Connection, now: float) -> list[str]:
    """Up to ``SWEEP_CHUNK`` final batches whose retention ran out."""
    stmt = (
        select(batches.c.id)
        .where(batches.c.purge_at <= now, batches.c.status.in_(BATCH_TERMINAL))
        .limit(SWEEP_CHUNK)
    )
    return list(conn.execute(stmt).scalars())


def purge_batch(conn: Connection, batch_id: str) -> bool:
    """Delete a final batch's requests and result files; the batch object stays (its
    status and counts), with no retention left. False if it is not final any more."""
    row = conn.execute(
        select(batches.c.status, batches.c.output_file_id, batches.c.error_file_id)
        .where(batches.c.id == batch_id, batches.c.purge_at.is_not(None))
        .with_for_update()
    ).first()
    if row is None or row.status not in BATCH_TERMINAL:
        return False
    conn.execute(delete(requests).where(requests.c.batch_id == batch_id))
    results = [f for f in (row.output_file_id, row.error_file_id) if f]
    if results:
        conn.execute(delete(files).where(files.c.id.in_(results)))
    conn.execute(update(batches).where(batches.c.id == batch_id).values(purge_at=None))
    return True
