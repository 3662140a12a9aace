"""The OpenAI Batch API on a durable queue.

``store.BatchStore`` keeps files, batches and one row per request in SQLite or PostgreSQL;
``api.BatchApi`` serves ``/v1/files`` and ``/v1/batches`` over it. The router's release
worker claims requests as SageServe's Queue Manager releases them (§6.2) and completes
them; ``finalize`` writes the results.
"""

from sageserve.batch.objects import (
    Answer,
    BatchObject,
    BatchStoreError,
    ClaimedRequest,
    Conflict,
    FileObject,
    InvalidInput,
    NotFound,
    QueueDepth,
    RequestCounts,
)
from sageserve.batch.store import BatchStore, parse_window

__all__ = [
    "Answer",
    "BatchObject",
    "BatchStore",
    "BatchStoreError",
    "ClaimedRequest",
    "Conflict",
    "FileObject",
    "InvalidInput",
    "NotFound",
    "QueueDepth",
    "RequestCounts",
    "parse_window",
]
