"""Connecting to the queue's database and bringing its schema to the current revision.

SQLite is the default (embedded, nothing to start): WAL so that readers never wait for
the writer, ``synchronous=FULL`` so that an accepted request survives a power cut, a
busy timeout so that concurrent writers wait instead of failing, and every write
transaction opened with ``BEGIN IMMEDIATE`` so that a claim reads and marks its requests
as one step (SQLite's deferred BEGIN would let two processes read the same queued rows
and then fail to upgrade their locks). PostgreSQL is for several router replicas: claims
lock rows with ``FOR UPDATE SKIP LOCKED`` (``queue.py``).
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from sqlalchemy import create_engine, event, text
from sqlalchemy.engine import Connection, Engine, make_url
from sqlalchemy.exc import OperationalError

MIGRATIONS = Path(__file__).parent / "migrations"
#: Seconds a SQLite writer waits for another one before giving up.
SQLITE_BUSY_TIMEOUT_S = 30.0
#: Any constant: PostgreSQL serialises the migrations of replicas starting at once on it.
PG_MIGRATION_LOCK = 0x5A6E_BA7C
_WRITE = "sageserve_write"


def normalize_url(url: str) -> str:
    """``postgresql://`` and ``postgres://`` mean psycopg 3 (the driver we depend on)."""
    for prefix in ("postgresql://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix) :]
    return url


def make_engine(url: str) -> Engine:
    """An engine for ``sqlite:///PATH`` or ``postgresql+psycopg://...`` set up as above."""
    parsed = make_url(normalize_url(url))
    if parsed.get_backend_name() == "sqlite":
        if parsed.database in (None, "", ":memory:"):
            raise ValueError(
                f"{url}: the batch queue needs a file, e.g. sqlite:///var/lib/sageserve/queue.db"
            )
        Path(parsed.database or "").parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(
            parsed,
            connect_args={"timeout": SQLITE_BUSY_TIMEOUT_S, "check_same_thread": False},
        )
        _sqlite_events(engine)
        return engine
    if parsed.get_backend_name() == "postgresql":
        return create_engine(parsed, pool_pre_ping=True)
    raise ValueError(
        f"{url}: the batch queue supports sqlite:///PATH and postgresql+psycopg://... URLs"
    )


def _sqlite_events(engine: Engine) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # pysqlite's own transaction handling would BEGIN (deferred) behind our back.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute(f"PRAGMA busy_timeout={int(SQLITE_BUSY_TIMEOUT_S * 1000)}")
        _wal(cursor)
        cursor.execute("PRAGMA synchronous=FULL")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        write = conn.get_execution_options().get(_WRITE, False)
        conn.exec_driver_sql("BEGIN IMMEDIATE" if write else "BEGIN")


def _wal(cursor: Any) -> None:
    """Switch to WAL. On a fresh file several replicas opening at once race for the switch
    and SQLite answers "database is locked" without waiting on the busy handler, so the
    switch is retried until the busy timeout has passed."""
    deadline = time.monotonic() + SQLITE_BUSY_TIMEOUT_S
    while True:
        try:
            cursor.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


@contextmanager
def writing(engine: Engine) -> Iterator[Connection]:
    """A write transaction: committed on exit, rolled back on an exception."""
    with engine.connect() as conn:
        conn.execution_options(**{_WRITE: True})
        with conn.begin():
            yield conn


@contextmanager
def reading(engine: Engine) -> Iterator[Connection]:
    """A read-only transaction (one consistent snapshot)."""
    with engine.connect() as conn, conn.begin():
        yield conn


def upgrade(engine: Engine, revision: str = "head") -> None:
    """Migrate to ``revision`` (the newest by default); replicas starting together take
    turns.

    On a fresh SQLite file, replicas racing to create it can be told "database is locked"
    without the busy handler being consulted (SQLite's deadlock avoidance); the whole
    migration, one transaction, is then tried again until the busy timeout has passed."""
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    deadline = time.monotonic() + SQLITE_BUSY_TIMEOUT_S
    while True:
        try:
            with writing(engine) as conn:
                if conn.dialect.name == "postgresql":
                    conn.execute(
                        text("SELECT pg_advisory_xact_lock(:key)"), {"key": PG_MIGRATION_LOCK}
                    )
                config.attributes["connection"] = conn
                command.upgrade(config, revision)
            return
        except OperationalError as exc:
            locked = engine.dialect.name == "sqlite" and "locked" in str(exc)
            if not locked or time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def current_revision(engine: Engine) -> str | None:
    """The schema revision the database is at (None before the first migration)."""
    from alembic.runtime.migration import MigrationContext

    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()
