"""Owners and retention: who a file or batch belongs to, and when it is deleted.

Rows written before this revision belong to anonymous callers (owner ""), and get the
default retention (30 days) from their creation, or for a finished batch from the time it
was closed, so that an upgraded queue stops growing without anyone deleting by hand.
An input file of a batch still running is kept until the batch ends (the sweeper checks).

Revision ID: 0002
Revises: 0001
Create Date: 2025-01-02
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | Sequence[str] | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

#: The retention rows of the first revision get (the router's default).
BACKFILL_RETENTION_S = 30 * 86400.0
_TERMINAL = ("completed", "failed", "expired", "cancelled")


def upgrade() -> None:
    with op.batch_alter_table("files") as files:
        files.add_column(sa.Column("owner", sa.String(63), nullable=False, server_default=""))
        files.add_column(sa.Column("created_by", sa.String(64), nullable=False, server_default=""))
        files.add_column(sa.Column("expires_at", sa.Float, nullable=True))
    op.drop_index("ix_files_created", "files")
    op.create_index("ix_files_owner_created", "files", ["owner", "created_at", "id"])
    op.create_index("ix_files_expires", "files", ["expires_at"])
    with op.batch_alter_table("batches") as batches:
        batches.add_column(sa.Column("owner", sa.String(63), nullable=False, server_default=""))
        batches.add_column(
            sa.Column("created_by", sa.String(64), nullable=False, server_default="")
        )
        batches.add_column(sa.Column("output_retention_s", sa.Float, nullable=True))
        batches.add_column(sa.Column("purge_at", sa.Float, nullable=True))
    op.drop_index("ix_batches_created", "batches")
    op.create_index("ix_batches_owner_created", "batches", ["owner", "created_at", "id"])
    op.create_index("ix_batches_input_file", "batches", ["input_file_id", "status"])
    op.create_index("ix_batches_purge", "batches", ["purge_at"])
    keep = sa.literal(BACKFILL_RETENTION_S)
    files_t = sa.table("files", sa.column("created_at", sa.Float), sa.column("expires_at"))
    op.execute(files_t.update().values(expires_at=files_t.c.created_at + keep))
    batches_t = sa.table(
        "batches",
        sa.column("status", sa.String),
        sa.column("created_at", sa.Float),
        sa.column("finalizing_at", sa.Float),
        sa.column("purge_at", sa.Float),
    )
    closed = sa.func.coalesce(batches_t.c.finalizing_at, batches_t.c.created_at)
    op.execute(
        batches_t.update().where(batches_t.c.status.in_(_TERMINAL)).values(purge_at=closed + keep)
    )


def downgrade() -> None:
    op.drop_index("ix_batches_purge", "batches")
    op.drop_index("ix_batches_input_file", "batches")
    op.drop_index("ix_batches_owner_created", "batches")
    op.create_index("ix_batches_created", "batches", ["created_at"])
    with op.batch_alter_table("batches") as batches:
        for column in ("purge_at", "output_retention_s", "created_by", "owner"):
            batches.drop_column(column)
    op.drop_index("ix_files_expires", "files")
    op.drop_index("ix_files_owner_created", "files")
    op.create_index("ix_files_created", "files", ["created_at"])
    with op.batch_alter_table("files") as files:
        for column in ("expires_at", "created_by", "owner"):
            files.drop_column(column)
