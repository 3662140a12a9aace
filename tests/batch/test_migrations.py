"""The schema the migrations build is the one the code uses, and replicas starting at
once on a fresh database migrate one after the other."""

from __future__ import annotations

import json
import threading

import pytest
from alembic.autogenerate import compare_metadata
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import text

from sageserve.batch import BatchStore, NotFound
from sageserve.batch.db import MIGRATIONS, current_revision, make_engine, upgrade
from sageserve.batch.jsonl import request_tokens
from sageserve.batch.schema import metadata
from sageserve.dispatch.identity import ANONYMOUS
from tests.batch.conftest import ME


def head() -> str | None:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    return ScriptDirectory.from_config(config).get_current_head()


def test_the_migrated_schema_matches_the_tables_the_code_uses(store: BatchStore) -> None:
    with store.engine.connect() as conn:
        differences = compare_metadata(MigrationContext.configure(conn), metadata)
    assert differences == []
    assert current_revision(store.engine) == head()


def test_replicas_starting_together_on_a_fresh_database_all_open_it(store_url: str) -> None:
    opened: list[BatchStore] = []
    failures: list[BaseException] = []
    start = threading.Barrier(3)

    def open_store() -> None:
        start.wait()
        try:
            opened.append(BatchStore.open(store_url))
        except BaseException as exc:  # surfaced below
            failures.append(exc)

    threads = [threading.Thread(target=open_store) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    try:
        assert not failures, failures
        assert len(opened) == 3
        assert current_revision(opened[0].engine) == head()
    finally:
        for store in opened:
            store.close()


def test_migration_scripts_ship_with_the_package() -> None:
    assert (MIGRATIONS / "env.py").is_file()
    assert (MIGRATIONS / "script.py.mako").is_file()
    assert list((MIGRATIONS / "versions").glob("rev_*.py"))


def test_a_queue_from_the_first_revision_upgrades_with_its_rows(store_url: str) -> None:
    """Rows written before owners and retention existed become anonymous callers' with the
    default retention; a tenant sees none of them, and the schema is the code's."""
    engine = make_engine(store_url)
    upgrade(engine, "0001")
    t0 = 1_700_000_000.0
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO files (id, purpose, filename, bytes, created_at, content) "
                "VALUES ('file-old', 'batch', 'old.jsonl', 3, :t, :c)"
            ),
            {"t": t0, "c": b"{}\n"},
        )
        for batch_id, status, finalized in (
            ("batch_done", "completed", t0 + 10),
            ("batch_run", "in_progress", None),
        ):
            conn.execute(
                text(
                    "INSERT INTO batches (id, endpoint, input_file_id, completion_window, "
                    "status, created_at, deadline, finalizing_at, total, completed, failed) "
                    "VALUES (:id, '/v1/chat/completions', 'file-old', '24h', :s, :t, :d, :f, "
                    "1, 0, 0)"
                ),
                {"id": batch_id, "s": status, "t": t0, "d": t0 + 86400, "f": finalized},
            )
            conn.execute(
                text(
                    "INSERT INTO requests (id, batch_id, line, url, body, arrival, state, "
                    "attempts) VALUES (:r, :b, 1, '/v1/chat/completions', '{}', :t, "
                    "'queued', 0)"
                ),
                {"r": f"req-{batch_id}", "b": batch_id, "t": t0},
            )
    engine.dispose()
    store = BatchStore.open(store_url)
    try:
        assert current_revision(store.engine) == head()
        with store.engine.connect() as conn:
            assert compare_metadata(MigrationContext.configure(conn), metadata) == []
        old = store.get_file(ANONYMOUS, "file-old")
        assert old.expires_at == t0 + 30 * 86400
        assert store.file_content(ANONYMOUS, "file-old") == b"{}\n"
        assert {b.id for b in store.list_batches(ANONYMOUS)[0]} == {"batch_done", "batch_run"}
        assert store.list_files(ME)[0] == [] and store.list_batches(ME)[0] == []
        with pytest.raises(NotFound):
            store.get_batch(ME, "batch_done")
        # the finished batch got the default retention from its closing; the running one
        # keeps its request, and its input file, however late the sweep
        assert store.sweep(t0 + 10 + 30 * 86400) == (0, 1)
        assert store.get_file(ANONYMOUS, "file-old").id == "file-old"
        assert [c.id for c in store.claim("x", 1, "r", 60, t0)] == []  # no model: waits
        with store.engine.connect() as conn:
            left = conn.execute(text("SELECT id FROM requests")).scalars().all()
        assert left == ["req-batch_run"]
    finally:
        store.close()


def test_a_queue_from_before_deadline_order_gets_deadlines_and_tokens(store_url: str) -> None:
    """Requests queued before they carried their deadline and tokens get their batch's
    deadline and the tokens their body is estimated at, so the upgraded queue is claimed
    earliest deadline first and its need counts the work it holds."""
    engine = make_engine(store_url)
    upgrade(engine, "0002")
    t0 = 1_700_000_000.0
    chat = {"model": "m", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 900}
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO files (id, purpose, filename, bytes, created_at, content) "
                "VALUES ('file-in', 'batch', 'in.jsonl', 3, :t, :c)"
            ),
            {"t": t0, "c": b"{}\n"},
        )
        for batch_id, created, window in (
            ("batch_day", t0, 86400.0),
            ("batch_hour", t0 + 5, 3600.0),
        ):
            conn.execute(
                text(
                    "INSERT INTO batches (id, endpoint, input_file_id, completion_window, "
                    "status, created_at, deadline, total, completed, failed) "
                    "VALUES (:id, '/v1/chat/completions', 'file-in', '24h', 'in_progress', "
                    ":t, :d, 2, 0, 0)"
                ),
                {"id": batch_id, "t": created, "d": created + window},
            )
            for line, state in ((1, "queued"), (2, "done")):
                conn.execute(
                    text(
                        "INSERT INTO requests (id, batch_id, custom_id, line, model, url, body, "
                        "arrival, state, attempts) VALUES (:r, :b, :c, :l, 'm', "
                        "'/v1/chat/completions', :body, :t, :s, 0)"
                    ),
                    {
                        "r": f"req-{batch_id}-{line}",
                        "b": batch_id,
                        "c": f"{batch_id}-{line}",
                        "l": line,
                        "body": json.dumps(chat),
                        "t": created,
                        "s": state,
                    },
                )
    engine.dispose()
    store = BatchStore.open(store_url)
    try:
        with store.engine.connect() as conn:
            assert compare_metadata(MigrationContext.configure(conn), metadata) == []
            rows = conn.execute(text("SELECT id, deadline, tokens FROM requests ORDER BY id")).all()
        assert [(row.id, row.deadline, row.tokens) for row in rows] == [
            ("req-batch_day-1", t0 + 86400, request_tokens(chat)),
            ("req-batch_day-2", t0 + 86400, 0),
            ("req-batch_hour-1", t0 + 5 + 3600, request_tokens(chat)),
            ("req-batch_hour-2", t0 + 5 + 3600, 0),
        ]
        [waiting] = store.waiting_deadlines(t0 + 10)
        assert [(g.deadline, g.tokens) for g in waiting.groups] == [
            (t0 + 5 + 3600, request_tokens(chat)),
            (t0 + 86400, request_tokens(chat)),
        ]
        claimed = [c.custom_id for c in store.claim("m", 2, "r", 60, t0 + 10)]
        assert claimed == ["batch_hour-1", "batch_day-1"]
        assert store.get_batch(ANONYMOUS, "batch_hour").deadline_at_risk is None
    finally:
        store.close()
