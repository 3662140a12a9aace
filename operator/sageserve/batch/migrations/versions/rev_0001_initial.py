"""The batch queue's first schema: files, batches, requests.

Revision ID: 0001
Revises:
Create Date: 2025-01-01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | Sequence[str] | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "files",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("purpose", sa.String(32), nullable=False),
        sa.Column("filename", sa.String(255), nullable=False),
        sa.Column("bytes", sa.BigInteger, nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("content", sa.LargeBinary, nullable=False),
    )
    op.create_index("ix_files_created", "files", ["created_at"])
    op.create_table(
        "batches",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("endpoint", sa.String(64), nullable=False),
        sa.Column("input_file_id", sa.String(64), nullable=False),
        sa.Column("completion_window", sa.String(16), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("deadline", sa.Float, nullable=False),
        sa.Column("tier", sa.String(63), nullable=True),
        sa.Column("metadata_json", sa.Text, nullable=True),
        sa.Column("errors_json", sa.Text, nullable=True),
        sa.Column("output_file_id", sa.String(64), nullable=True),
        sa.Column("error_file_id", sa.String(64), nullable=True),
        sa.Column("in_progress_at", sa.Float, nullable=True),
        sa.Column("finalizing_at", sa.Float, nullable=True),
        sa.Column("completed_at", sa.Float, nullable=True),
        sa.Column("failed_at", sa.Float, nullable=True),
        sa.Column("expired_at", sa.Float, nullable=True),
        sa.Column("cancelling_at", sa.Float, nullable=True),
        sa.Column("cancelled_at", sa.Float, nullable=True),
        sa.Column("total", sa.Integer, nullable=False),
        sa.Column("completed", sa.Integer, nullable=False),
        sa.Column("failed", sa.Integer, nullable=False),
    )
    op.create_index("ix_batches_status", "batches", ["status"])
    op.create_index("ix_batches_created", "batches", ["created_at"])
    op.create_table(
        "requests",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("batch_id", sa.String(64), sa.ForeignKey("batches.id"), nullable=False),
        sa.Column("custom_id", sa.String(512), nullable=True),
        sa.Column("line", sa.Integer, nullable=False),
        sa.Column("model", sa.String(255), nullable=True),
        sa.Column("tier", sa.String(63), nullable=True),
        sa.Column("url", sa.String(64), nullable=False),
        sa.Column("body", sa.Text, nullable=True),
        sa.Column("arrival", sa.Float, nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("lease_owner", sa.String(255), nullable=True),
        sa.Column("lease_until", sa.Float, nullable=True),
        sa.Column("attempts", sa.Integer, nullable=False),
        sa.Column("status_code", sa.Integer, nullable=True),
        sa.Column("response_body", sa.Text, nullable=True),
        sa.Column("response_request_id", sa.String(255), nullable=True),
        sa.Column("error_code", sa.String(64), nullable=True),
        sa.Column("error_message", sa.Text, nullable=True),
        sa.Column("finished_at", sa.Float, nullable=True),
    )
    op.create_index(
        "ix_requests_model_state_arrival",
        "requests",
        ["model", "state", "arrival", "batch_id", "line"],
    )
    op.create_index(
        "ix_requests_state_arrival", "requests", ["state", "arrival", "batch_id", "line"]
    )
    op.create_index("ix_requests_state_lease", "requests", ["state", "lease_until"])
    op.create_index("ix_requests_batch_state", "requests", ["batch_id", "state", "status_code"])
    op.create_index(
        "ix_requests_state_model_tier", "requests", ["state", "model", "tier", "arrival"]
    )


def downgrade() -> None:
    op.drop_table("requests")
    op.drop_table("batches")
    op.drop_table("files")
