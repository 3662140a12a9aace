"""The batch queue's tables: OpenAI file objects, batches, and one row per batch request.

Why one row per request (not per batch): the Queue Manager releases requests one or two at
a time as an endpoint's EMU falls (SageServe §6.2), several router replicas take them
concurrently, and a router killed at any moment must lose none and complete none twice.
A row per request carries its own state, lease and response, so a claim is a row lock
(PostgreSQL) or a short write transaction (SQLite), and a completion is one conditional
UPDATE that succeeds once.

Lines of an input file that cannot run (malformed JSON, unknown model, ...) are stored as
requests already ``failed`` with their error, so the error file is written from one table.

Files and batches belong to a tenant (``owner``: the namespace whose WorkloadTiers list
the caller's API key, "" for anonymous callers); ``created_by`` records the key's digest.
Every read filters by owner, so the owner-first indexes serve the listings. ``expires_at``
(files) and ``purge_at`` (batches) say when retention removes them (``retention.py``).

Times are unix seconds (float). The migrations under ``migrations/versions`` create exactly
these tables; ``tests/batch/test_migrations.py`` checks that they agree.
"""

from __future__ import annotations

from typing import Final

from sqlalchemy import (
    BigInteger,
    Column,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    Text,
)

metadata = MetaData()

# ---- request states -----------------------------------------------------------------
QUEUED: Final = "queued"
RUNNING: Final = "running"
DONE: Final = "done"
FAILED: Final = "failed"
CANCELLED: Final = "cancelled"
EXPIRED: Final = "expired"
#: A request in one of these states is never claimed or completed again.
TERMINAL: Final = (DONE, FAILED, CANCELLED, EXPIRED)
UNFINISHED: Final = (QUEUED, RUNNING)

# ---- batch statuses (OpenAI's) -------------------------------------------------------
VALIDATING: Final = "validating"
IN_PROGRESS: Final = "in_progress"
FINALIZING: Final = "finalizing"
COMPLETED: Final = "completed"
BATCH_FAILED: Final = "failed"
BATCH_EXPIRED: Final = "expired"
CANCELLING: Final = "cancelling"
BATCH_CANCELLED: Final = "cancelled"
BATCH_TERMINAL: Final = (COMPLETED, BATCH_FAILED, BATCH_EXPIRED, BATCH_CANCELLED)
BATCH_UNFINISHED: Final = (VALIDATING, IN_PROGRESS, FINALIZING, CANCELLING)

files = Table(
    "files",
    metadata,
    Column("id", String(64), primary_key=True),
    Column("purpose", String(32), nullable=False),
    Column("filename", String(255), nullable=False),
    Column("bytes", BigInteger, nullable=False),
    Column("created_at", Float, nullable=False),
    Column("content", LargeBinary, nullable=False),
    #: the tenant the file belongs to ("" anonymous); an output file is its batch's owner's
    Column("owner", String(63), nullable=False, server_default=""),
    #: the digest of the API key that uploaded it (its batch's, for an output file)
    Column("created_by", String(64), nullable=False, server_default=""),
    #: unix seconds: past it the sweeper deletes the file (None: kept until deleted)
    Column("expires_at", Float, nullable=True),
    # list_files: one owner's files, newest first
    Index("ix_files_owner_created", "owner", "created_at", "id"),
    # sweep: the files whose retention ran out
    Index("ix_files_expires", "expires_at"),
)

batches = Table(
    "batches",
    metadata,
    Column("id", String(64), primary_key=True),
    Column("endpoint", String(64), nullable=False),
    Column("input_file_id", String(64), nullable=False),
    Column("completion_window", String(16), nullable=False),
    Column("status", String(16), nullable=False),
    Column("created_at", Float, nullable=False),
    #: unix seconds: past it the batch expires and its unfinished requests are reported
    Column("deadline", Float, nullable=False),
    #: the batch tier of its requests (the one with the shortest deadline if several)
    Column("tier", String(63), nullable=True),
    Column("metadata_json", Text, nullable=True),
    #: OpenAI's ``errors`` list when the whole batch failed validation
    Column("errors_json", Text, nullable=True),
    Column("output_file_id", String(64), nullable=True),
    Column("error_file_id", String(64), nullable=True),
    Column("in_progress_at", Float, nullable=True),
    Column("finalizing_at", Float, nullable=True),
    Column("completed_at", Float, nullable=True),
    Column("failed_at", Float, nullable=True),
    Column("expired_at", Float, nullable=True),
    Column("cancelling_at", Float, nullable=True),
    Column("cancelled_at", Float, nullable=True),
    #: request counts frozen when the batch reaches a final status
    Column("total", Integer, nullable=False, default=0),
    Column("completed", Integer, nullable=False, default=0),
    Column("failed", Integer, nullable=False, default=0),
    Column("owner", String(63), nullable=False, server_default=""),
    Column("created_by", String(64), nullable=False, server_default=""),
    #: seconds the output and error files are kept after they are written (None: the
    #: router's default retention)
    Column("output_retention_s", Float, nullable=True),
    #: unix seconds: past it a finished batch's requests (prompts and answers) and result
    #: files are deleted; set when the batch reaches a final status, cleared once purged
    Column("purge_at", Float, nullable=True),
    #: a predicted deadline miss, JSON {model, shortfall_tps, detected_at}: the waiting work
    #: of a model due by this batch's deadline exceeds what the model serves at its
    #: maxInstances (`dispatch.deadlines.deadline_risk`); written by any router replica, so
    #: every replica answers the same; None: no miss predicted
    Column("deadline_risk_json", Text, nullable=True),
    Index("ix_batches_status", "status"),
    # list_batches: one owner's batches, newest first
    Index("ix_batches_owner_created", "owner", "created_at", "id"),
    # deleting or sweeping a file: the batches reading it
    Index("ix_batches_input_file", "input_file_id", "status"),
    # sweep: finished batches whose retention ran out
    Index("ix_batches_purge", "purge_at"),
)

requests = Table(
    "requests",
    metadata,
    Column("id", String(64), primary_key=True),
    Column("batch_id", String(64), ForeignKey("batches.id"), nullable=False),
    Column("custom_id", String(512), nullable=True),
    #: 1-based line of the input file
    Column("line", Integer, nullable=False),
    Column("model", String(255), nullable=True),
    Column("tier", String(63), nullable=True),
    Column("url", String(64), nullable=False),
    Column("body", Text, nullable=True),
    Column("arrival", Float, nullable=False),
    #: unix seconds: the batch's deadline, kept per request so that claims take the
    #: earliest deadline first and promotion reads it from an index (SageServe §6.3)
    Column("deadline", Float, nullable=False),
    #: estimated tokens (prompt + output budget, `dispatch.request_check.estimated_tokens`):
    #: the request's share of its model's deadline need, and its expected service time
    Column("tokens", Integer, nullable=False, server_default="0"),
    Column("state", String(16), nullable=False),
    Column("lease_owner", String(255), nullable=True),
    Column("lease_until", Float, nullable=True),
    Column("attempts", Integer, nullable=False, default=0),
    Column("status_code", Integer, nullable=True),
    Column("response_body", Text, nullable=True),
    Column("response_request_id", String(255), nullable=True),
    Column("error_code", String(64), nullable=True),
    Column("error_message", Text, nullable=True),
    Column("finished_at", Float, nullable=True),
    # claim(model): one model's waiting requests earliest deadline first, in claim order
    # (arrival, batch and line break ties without a sort); the promotion scan (a range of
    # deadlines, tokens read from the index); the deadline need per model (covering)
    Index(
        "ix_requests_state_model_deadline",
        "state",
        "model",
        "deadline",
        "arrival",
        "batch_id",
        "line",
        "tokens",
    ),
    # running requests whose lease ran out (a router died holding them)
    Index("ix_requests_state_lease", "state", "lease_until"),
    # finalize / counts: a batch's requests by state (covering the counts)
    Index("ix_requests_batch_state", "batch_id", "state", "status_code"),
    # depth: waiting requests per model and tier, from the index alone
    Index("ix_requests_state_model_tier", "state", "model", "tier", "arrival"),
)
