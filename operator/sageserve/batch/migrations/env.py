"""Alembic's environment for the batch queue: migrate on the connection we are handed.

Why only a handed-over connection: ``BatchStore.open`` runs the upgrade inside its own
write transaction (SQLite ``BEGIN IMMEDIATE``, PostgreSQL an advisory lock), so that
several router replicas starting at once migrate one after the other, never together.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy.engine import Connection

from sageserve.batch.schema import metadata


def run() -> None:
    connection = context.config.attributes.get("connection")
    if not isinstance(connection, Connection):
        raise RuntimeError(
            "the batch queue migrates only through BatchStore.open(url), which hands Alembic "
            "a connection; do not run `alembic upgrade` by hand"
        )
    context.configure(
        connection=connection,
        target_metadata=metadata,
        # SQLite cannot ALTER most things: later revisions copy the table instead.
        render_as_batch=connection.dialect.name == "sqlite",
    )
    with context.begin_transaction():
        context.run_migrations()


run()
