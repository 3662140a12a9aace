"""The schema the migrations build is the one the code uses, and replicas starting at
once on a fresh database migrate one after the other."""

from __future__ import annotations

import threading

from alembic.autogenerate import compare_metadata
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory

from sageserve.batch import BatchStore
from sageserve.batch.db import MIGRATIONS, current_revision
from sageserve.batch.schema import metadata


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
