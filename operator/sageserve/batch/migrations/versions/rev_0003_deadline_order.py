"""Earliest deadline first: each request carries its deadline and its estimated tokens.

The router's Queue Manager releases a model's requests earliest deadline first and promotes
a request when its slack runs out (deadline − tokens ÷ the model's per-request rate −
margin; SageServe §6.2, §6.3), as the simulator's `BatchQueueManager` does. Both read the
request's deadline and tokens from an index, so they are columns of the request:

- ``deadline`` is copied from the request's batch (every request of a batch shares it);
- ``tokens`` of the requests still waiting or running is *computed* from their bodies
  with the rule new requests are stored with (`batch.jsonl.request_tokens`). A default of
  0 would count the queue an upgrade finds as work of no size: its deadline need would
  read 0 and its requests would be promoted as if served at once, for up to the longest
  completion window (30 days). Finished requests (and lines that failed on arrival) keep
  0: nothing reads their tokens;
- ``batches.deadline_risk_json`` says whether a deadline miss is predicted for a batch
  (the router writes it; none for rows written before).

The arrival-ordered indexes are replaced by one index on (state, model, deadline, …), which
serves the claim, the promotion scan and the deadline need per model.

Revision ID: 0003
Revises: 0002
Create Date: 2025-01-03
"""

from __future__ import annotations

import json
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from sageserve.batch.jsonl import request_tokens

revision: str = "0003"
down_revision: str | Sequence[str] | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

#: Requests whose tokens are computed per read and write (bodies held in memory at once).
BACKFILL_CHUNK = 1000
_UNFINISHED = ("queued", "running")
_DEADLINE_INDEX = ("state", "model", "deadline", "arrival", "batch_id", "line", "tokens")


def upgrade() -> None:
    with op.batch_alter_table("requests") as requests:
        requests.add_column(sa.Column("deadline", sa.Float, nullable=True))
        requests.add_column(sa.Column("tokens", sa.Integer, nullable=False, server_default="0"))
    requests_t = sa.table(
        "requests",
        sa.column("id", sa.String),
        sa.column("batch_id", sa.String),
        sa.column("state", sa.String),
        sa.column("body", sa.Text),
        sa.column("deadline", sa.Float),
        sa.column("tokens", sa.Integer),
    )
    batches_t = sa.table("batches", sa.column("id", sa.String), sa.column("deadline", sa.Float))
    due = (
        sa.select(batches_t.c.deadline)
        .where(batches_t.c.id == requests_t.c.batch_id)
        .scalar_subquery()
    )
    op.execute(requests_t.update().values(deadline=due))
    _backfill_tokens(requests_t)
    with op.batch_alter_table("requests") as requests:
        requests.alter_column("deadline", existing_type=sa.Float, nullable=False)
    op.drop_index("ix_requests_state_arrival", "requests")
    op.drop_index("ix_requests_model_state_arrival", "requests")
    op.create_index("ix_requests_state_model_deadline", "requests", list(_DEADLINE_INDEX))
    with op.batch_alter_table("batches") as batches:
        batches.add_column(sa.Column("deadline_risk_json", sa.Text, nullable=True))


def _backfill_tokens(requests_t: sa.TableClause) -> None:
    """The tokens of every unfinished request, from its body, a chunk at a time (in id
    order, so each read starts where the last stopped)."""
    conn = op.get_bind()
    write = (
        requests_t.update()
        .where(requests_t.c.id == sa.bindparam("b_id"))
        .values(tokens=sa.bindparam("b_tokens"))
    )
    last = ""
    while True:
        rows = conn.execute(
            sa.select(requests_t.c.id, requests_t.c.body)
            .where(requests_t.c.state.in_(_UNFINISHED), requests_t.c.id > last)
            .order_by(requests_t.c.id)
            .limit(BACKFILL_CHUNK)
        ).all()
        if not rows:
            return
        values = [{"b_id": row.id, "b_tokens": _tokens(row.body)} for row in rows]
        conn.execute(write, values)
        last = rows[-1].id


def _tokens(body: str | None) -> int:
    """A stored body's tokens; 0 for one that is not a JSON object (never stored so)."""
    try:
        parsed = json.loads(body) if body else None
    except ValueError:
        return 0
    return request_tokens(parsed) if isinstance(parsed, dict) else 0


def downgrade() -> None:
    with op.batch_alter_table("batches") as batches:
        batches.drop_column("deadline_risk_json")
    op.drop_index("ix_requests_state_model_deadline", "requests")
    op.create_index(
        "ix_requests_model_state_arrival",
        "requests",
        ["model", "state", "arrival", "batch_id", "line"],
    )
    op.create_index(
        "ix_requests_state_arrival", "requests", ["state", "arrival", "batch_id", "line"]
    )
    with op.batch_alter_table("requests") as requests:
        requests.drop_column("tokens")
        requests.drop_column("deadline")
