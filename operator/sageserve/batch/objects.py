"""What the batch store hands out: OpenAI file and batch objects, claimed requests, errors.

Plain frozen dataclasses, so that callers on the event loop never hold a database row or
session; ``to_openai()`` gives the JSON the OpenAI Batch API returns for the object.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from sageserve.dispatch.deadlines import (
    BUCKET_S,
    DeadlineRisk,
    bucket_index,
    bucketed,
    deadline_risk,
    required_tps,
)
from sageserve.dispatch.queue_manager import promotion_time


class BatchStoreError(Exception):
    """Base of the errors a caller can show to a user."""


class NotFound(BatchStoreError):
    """No such file or batch (or a file whose purpose does not fit the operation)."""

    def __init__(self, kind: str, object_id: str, param: str | None = None) -> None:
        super().__init__(f"no such {kind}: {object_id!r}")
        self.kind = kind
        self.object_id = object_id
        self.param = param


class InvalidInput(BatchStoreError):
    """A request to the store that cannot be honoured; the message names the field and fix."""

    def __init__(self, message: str, param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.param = param
        self.code = code


class Conflict(BatchStoreError):
    """The object is in a state that does not allow the operation (e.g. cancel a finished
    batch)."""

    def __init__(self, message: str, code: str | None = None) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class FileObject:
    """An uploaded input file or a results/errors file the store wrote."""

    id: str
    purpose: str
    filename: str
    bytes: int
    created_at: float
    #: when retention deletes it (None: kept until deleted)
    expires_at: float | None = None

    def to_openai(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": "file",
            "bytes": self.bytes,
            "created_at": int(self.created_at),
            "expires_at": None if self.expires_at is None else int(self.expires_at),
            "filename": self.filename,
            "purpose": self.purpose,
            "status": "processed",
            "status_details": None,
        }


@dataclass(frozen=True)
class RequestCounts:
    """OpenAI's ``request_counts``: every input line is counted once in ``total``."""

    total: int = 0
    completed: int = 0
    failed: int = 0

    def to_openai(self) -> dict[str, int]:
        return {"total": self.total, "completed": self.completed, "failed": self.failed}


@dataclass(frozen=True)
class DeadlineAtRisk:
    """A deadline miss predicted for a batch: the waiting work of ``model`` due by the
    batch's deadline exceeds what the model serves at its maxInstances, by
    ``shortfall_tps`` tokens/s (`dispatch.deadlines.deadline_risk`), since ``detected_at``."""

    model: str
    shortfall_tps: float
    detected_at: float

    def to_openai(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "shortfall_tokens_per_second": round(self.shortfall_tps, 3),
            "detected_at": int(self.detected_at),
        }

    def to_json(self) -> str:
        """As stored in ``batches.deadline_risk_json``."""
        return json.dumps(
            {
                "model": self.model,
                "shortfall_tps": self.shortfall_tps,
                "detected_at": self.detected_at,
            }
        )

    @classmethod
    def from_json(cls, text: str | None) -> DeadlineAtRisk | None:
        if not text:
            return None
        raw = json.loads(text)
        return cls(str(raw["model"]), float(raw["shortfall_tps"]), float(raw["detected_at"]))


@dataclass(frozen=True)
class BatchObject:
    """One batch with its status, deadline, counts and result files."""

    id: str
    endpoint: str
    input_file_id: str
    completion_window: str
    status: str
    created_at: float
    deadline: float
    tier: str | None
    metadata: dict[str, str] | None
    errors: list[dict[str, Any]] | None
    output_file_id: str | None
    error_file_id: str | None
    request_counts: RequestCounts
    timestamps: dict[str, float | None] = field(default_factory=dict)
    #: the miss predicted for an unfinished batch (None: none, or the batch is finished)
    deadline_at_risk: DeadlineAtRisk | None = None

    def to_openai(self) -> dict[str, Any]:
        def ts(name: str) -> int | None:
            value = self.timestamps.get(name)
            return None if value is None else int(value)

        return {
            "id": self.id,
            "object": "batch",
            "endpoint": self.endpoint,
            "errors": None if self.errors is None else {"object": "list", "data": self.errors},
            "input_file_id": self.input_file_id,
            "completion_window": self.completion_window,
            "status": self.status,
            "output_file_id": self.output_file_id,
            "error_file_id": self.error_file_id,
            "created_at": int(self.created_at),
            "in_progress_at": ts("in_progress_at"),
            "expires_at": int(self.deadline),
            "finalizing_at": ts("finalizing_at"),
            "completed_at": ts("completed_at"),
            "failed_at": ts("failed_at"),
            "expired_at": ts("expired_at"),
            "cancelling_at": ts("cancelling_at"),
            "cancelled_at": ts("cancelled_at"),
            "request_counts": self.request_counts.to_openai(),
            "metadata": self.metadata,
            # sageserve's: a predicted deadline miss (`docs/batch.md`), else null
            "deadline_at_risk": None
            if self.deadline_at_risk is None
            else self.deadline_at_risk.to_openai(),
        }


@dataclass(frozen=True)
class ClaimedRequest:
    """A request leased to one router replica until ``lease_until``: send ``body`` to
    ``url`` on a pod of ``model``, then ``complete`` (or ``retry``) it by ``id``."""

    id: str
    batch_id: str
    custom_id: str
    model: str
    tier: str | None
    url: str
    body: dict[str, Any]
    arrival: float
    deadline: float
    attempts: int
    lease_until: float


class Answer(NamedTuple):
    """A released request's answer from its pod, for ``BatchStore.complete_many``:
    ``body`` is the decoded JSON (or a string), ``upstream_request_id`` the pod's id."""

    request_id: str
    status_code: int
    body: Any
    upstream_request_id: str | None = None


class QueueDepth(NamedTuple):
    """Queued (not yet released) requests of one model and tier: the queue's signal to
    the plan (SageServe's batch buffer β) and to the metrics."""

    model: str
    tier: str | None
    queued: int
    oldest_arrival: float


class DeadlineGroup(NamedTuple):
    """A model's waiting requests that share one deadline (a batch's): their tokens and
    the tokens of the largest of them."""

    deadline: float
    tokens: int
    largest: int


@dataclass(frozen=True)
class WaitingDeadlines:
    """One model's waiting requests (queued, or held under a lapsed lease) by deadline, as
    the queue read them: what the Queue Manager's deadline rules read (SageServe §6.3).
    ``required_tps`` and ``risk`` are `dispatch.deadlines` over the same buckets
    `BatchQueueManager`'s ledger keeps; ``due_until`` is the promotion rule."""

    model: str
    #: earliest deadline first
    groups: tuple[DeadlineGroup, ...]

    def buckets(self, bucket_s: float = BUCKET_S) -> list[tuple[float, float]]:
        """(lower edge, tokens) per deadline bucket, earliest first."""
        return bucketed(((g.deadline, float(g.tokens)) for g in self.groups), bucket_s)

    def required_tps(self, now: float, bucket_s: float = BUCKET_S) -> float:
        """Tokens/s that meet every deadline, earliest deadline first."""
        return required_tps(self.buckets(bucket_s), now, bucket_s)

    def risk(
        self, now: float, capacity_tps: float, bucket_s: float = BUCKET_S
    ) -> DeadlineRisk | None:
        """What `capacity_tps` cannot finish by its deadline (None: nothing)."""
        return deadline_risk(self.buckets(bucket_s), now, capacity_tps, bucket_s)

    def latest_at_risk(self, risk: DeadlineRisk, bucket_s: float = BUCKET_S) -> float:
        """The latest deadline of the work at risk: every group in the buckets up to
        ``risk.until_s`` (a bucket's lower edge) is due by it."""
        last = bucket_index(risk.until_s, bucket_s)
        at_risk = [g.deadline for g in self.groups if bucket_index(g.deadline, bucket_s) <= last]
        return max(at_risk, default=risk.until_s)

    def due_until(self, now: float, service_tps: float, margin_s: float) -> float | None:
        """The latest deadline among the requests whose promotion time has passed
        (`dispatch.queue_manager.promotion_time`; the largest of a group is promoted first),
        None when none has: the range of deadlines the promotion scan reads."""
        due = [
            g.deadline
            for g in self.groups
            if promotion_time(g.deadline, float(g.largest), service_tps, margin_s) < now
        ]
        return max(due, default=None)
