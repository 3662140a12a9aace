"""The durable queue decides like the simulator's Queue Manager (SageServe §6.2, §6.3), on
SQLite and on PostgreSQL: claims come earliest deadline first whatever batch and
completion window a request came with."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest

from sageserve.batch import BatchStore
from sageserve.batch.jsonl import request_tokens
from sageserve.route.queue_manager import BatchQueueManager
from tests.batch.conftest import ME, MODEL, OTHER, T0, deadline_of, jsonl, known_models

ENDPOINT = "/v1/chat/completions"


def body(custom_id: str, model: str = MODEL, max_tokens: int = 256) -> dict[str, object]:
    return {
        "model": model,
        "messages": [{"role": "user", "content": custom_id}],
        "max_tokens": max_tokens,
    }


def request(custom_id: str, model: str = MODEL, max_tokens: int = 256) -> str:
    return json.dumps(
        {
            "custom_id": custom_id,
            "method": "POST",
            "url": ENDPOINT,
            "body": body(custom_id, model, max_tokens),
        }
    )


@dataclass(frozen=True)
class Batch:
    """A batch as submitted: seconds after T0, completion window, request lines as
    (custom id, model, max_tokens)."""

    at: float
    window: str
    lines: tuple[tuple[str, str, int], ...]


def submit_all(
    store: BatchStore, batches: list[Batch], service_tps: float = 0.0
) -> BatchQueueManager[str]:
    """Submit each batch to the store and the same requests, with the deadline and tokens
    the store gave them, to a `BatchQueueManager` (release 2 per signal at any EMU; one
    request of `MODEL` served at `service_tps`)."""
    qm: BatchQueueManager[str] = BatchQueueManager(
        rules=((1.0, 2),), promotion_age_s=None, service_tps={MODEL: service_tps}
    )
    for batch in batches:
        upload = store.create_file(
            ME, jsonl([request(c, m, t) for c, m, t in batch.lines]), "in.jsonl", now=T0 + batch.at
        )
        created = store.create_batch(
            ME,
            upload.id,
            ENDPOINT,
            batch.window,
            None,
            known_models,
            deadline_of,
            now=T0 + batch.at,
        )
        for custom_id, model, max_tokens in batch.lines:
            tokens = request_tokens(body(custom_id, model, max_tokens))
            qm.submit(model, custom_id, T0 + batch.at, created.deadline, tokens)
    return qm


def one(custom_id: str, model: str = MODEL, max_tokens: int = 256) -> tuple[str, str, int]:
    return (custom_id, model, max_tokens)


# ---- claims: earliest deadline first -------------------------------------------------

CLAIM_ORDER = {
    "completion windows interleave the deadlines of one model's batches": (
        [
            Batch(0, "24h", (one("day-1"), one("day-2"))),
            Batch(10, "1h", (one("hour-1"), one("other-1", OTHER))),
            Batch(20, "12h", (one("half-1"), one("half-2"))),
            Batch(30, "90m", (one("ninety-1"),)),
            Batch(40, "1m", (one("minute-1"),)),
        ],
        ["minute-1", "hour-1", "ninety-1", "half-1", "half-2", "day-1", "day-2"],
    ),
    "one deadline: the earlier arrival first, then the line": (
        [
            Batch(3600, "1h", (one("late-1"),)),
            Batch(0, "2h", (one("early-1"), one("early-2"))),
        ],
        ["early-1", "early-2", "late-1"],
    ),
    "a later batch with a nearer deadline overtakes the queue": (
        [
            Batch(0, "24h", (one("first-1"), one("first-2"), one("first-3"))),
            Batch(7200, "1h", (one("urgent-1"),)),
        ],
        ["urgent-1", "first-1", "first-2", "first-3"],
    ),
}


@pytest.mark.parametrize("batches, expected", CLAIM_ORDER.values(), ids=list(CLAIM_ORDER))
def test_claims_take_the_earliest_deadline_first_as_the_queue_manager_releases(
    store: BatchStore, batches: list[Batch], expected: list[str]
) -> None:
    qm = submit_all(store, batches)
    now = T0 + max(b.at for b in batches) + 1
    claimed: list[str] = []
    while got := store.claim(MODEL, 2, "a", 600, now):  # the release under 50 % EMU
        claimed += [c.custom_id for c in got]
    released: list[str] = []
    while got_qm := qm.on_signal(MODEL, 0.0):
        released += got_qm
    assert claimed == expected
    assert released == expected


def test_a_lapsed_lease_is_claimed_again_before_queued_work(store: BatchStore) -> None:
    submit_all(store, [Batch(0, "24h", (one("held"),)), Batch(10, "1h", (one("urgent"),))])
    [first] = store.claim(MODEL, 1, "dead", 30, T0 + 20)
    assert first.custom_id == "urgent"
    got = [c.custom_id for c in store.claim(MODEL, 2, "b", 60, T0 + 60)]
    assert got == ["urgent", "held"]
