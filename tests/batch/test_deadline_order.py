"""The durable queue decides like the simulator's Queue Manager (SageServe §6.2, §6.3), on
SQLite and on PostgreSQL: claims come earliest deadline first whatever batch and
completion window a request came with, a request is promoted when its slack runs out (not
at a fixed age), the deadline need read from the queue is the one `BatchQueueManager`
computes for the same submissions, and a batch whose deadline cannot be met even at the
model's maxInstances says so."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest

from sageserve.batch import BatchStore
from sageserve.batch.jsonl import request_tokens
from sageserve.dispatch.queue_manager import (
    DEFAULT_PROMOTION_MARGIN_S,
    BatchQueueManager,
    promotion_time,
)
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


# ---- promotion by slack ---------------------------------------------------------------

RATE = 20.0  # tokens/s one request is served at
PROMOTION_BATCHES = [
    Batch(0, "24h", (one("far"),)),
    Batch(0, "90m", (one("ninety"),)),
    # a later deadline but 40,000 tokens to serve: its slack runs out first
    Batch(0, "2h", (one("long", max_tokens=40_000),)),
]
#: (seconds after T0, promoted then, in order of promotion time)
PROMOTIONS = [
    (3000.0, []),
    (3500.0, ["long"]),
    (3700.0, ["ninety"]),
    (10 * 3600.0 + 1, []),  # the paper's fixed age: the far deadline still waits
    (84_000.0, []),
    (84_700.0, ["far"]),
]


def test_a_request_is_promoted_when_its_slack_runs_out_not_at_a_fixed_age(
    store: BatchStore,
) -> None:
    qm = submit_all(store, PROMOTION_BATCHES, service_tps=RATE)
    for at, expected in PROMOTIONS:
        now = T0 + at
        waiting = {w.model: w for w in store.waiting_deadlines(now)}
        until = waiting[MODEL].due_until(now, RATE, DEFAULT_PROMOTION_MARGIN_S)
        got = store.claim_out_of_slack(MODEL, now, RATE, "a", 600, 16, until=until)
        assert [c.custom_id for c in got] == expected, at
        assert [item for _, item in qm.pop_aged(now)] == expected, at
        assert (until is None) == (expected == [])


def test_promotion_is_strictly_after_the_promotion_time_in_both_worlds(
    store: BatchStore,
) -> None:
    qm = submit_all(store, [Batch(0, "2h", (one("edge", max_tokens=1000),))], service_tps=RATE)
    [batch] = store.list_batches(ME)[0]
    tokens = request_tokens(body("edge", max_tokens=1000))
    due = promotion_time(batch.deadline, float(tokens), RATE, DEFAULT_PROMOTION_MARGIN_S)
    assert due == qm.promotion_at(MODEL, T0, batch.deadline, tokens)
    assert store.claim_out_of_slack(MODEL, due, RATE, "a", 600, 16) == []
    assert qm.pop_aged(due) == []
    later = due + 0.001
    assert [c.custom_id for c in store.claim_out_of_slack(MODEL, later, RATE, "a", 600, 16)] == [
        "edge"
    ]
    assert qm.pop_aged(later) == [(MODEL, "edge")]


def test_without_a_rate_a_request_is_promoted_a_margin_before_its_deadline(
    store: BatchStore,
) -> None:
    submit_all(store, [Batch(0, "1h", (one("hour", max_tokens=40_000),))])
    margin = DEFAULT_PROMOTION_MARGIN_S
    assert store.claim_out_of_slack(MODEL, T0 + 3600 - margin - 1, 0.0, "a", 600, 16) == []
    [got] = store.claim_out_of_slack(MODEL, T0 + 3600 - margin + 1, 0.0, "a", 600, 16)
    assert got.custom_id == "hour"


def test_promotion_takes_only_the_model_asked_for_and_at_most_the_limit(
    store: BatchStore,
) -> None:
    submit_all(
        store,
        [Batch(0, "1m", (one("m-1"), one("m-2"), one("m-3"), one("o-1", OTHER)))],
    )
    got = store.claim_out_of_slack(MODEL, T0 + 1, RATE, "a", 600, 2)
    assert [c.custom_id for c in got] == ["m-1", "m-2"]
    rest = store.claim_out_of_slack(MODEL, T0 + 2, RATE, "a", 600, 16)
    assert [c.custom_id for c in rest] == ["m-3"]
    [other] = store.claim_out_of_slack(OTHER, T0 + 2, RATE, "a", 600, 16)
    assert other.custom_id == "o-1"


# ---- the deadline need, and predicted misses ------------------------------------------

NEED_BATCHES = [
    Batch(0, "24h", (one("day-1", max_tokens=500), one("day-2", max_tokens=2000))),
    Batch(30, "1h", (one("hour-1", max_tokens=4000), one("other-1", OTHER, 100))),
    Batch(50, "90m", (one("ninety-1"), one("ninety-2"), one("ninety-3", max_tokens=9000))),
    Batch(70, "12h", (one("half-1", max_tokens=20_000),)),
]


def test_the_deadline_need_read_from_the_queue_is_the_queue_managers(
    store: BatchStore,
) -> None:
    qm = submit_all(store, NEED_BATCHES)
    qm_other = submit_all_other(NEED_BATCHES)

    def check(now: float) -> None:
        waiting = {w.model: w for w in store.waiting_deadlines(now)}
        assert waiting[MODEL].required_tps(now) == qm.required_tps(MODEL, now) > 0
        assert waiting[OTHER].required_tps(now) == qm_other.required_tps(OTHER, now) > 0
        ledger = qm.ledger(MODEL)
        assert ledger is not None
        for capacity in (0.1, 1.0, 10.0, 1000.0):
            assert waiting[MODEL].risk(now, capacity) == ledger.risk(now, capacity)

    check(T0 + 100)
    check(T0 + 3000)
    # released work no longer needs the queue's capacity, in either world
    held = [c.custom_id for c in store.claim(MODEL, 2, "a", 60, T0 + 3000)]
    assert held == qm.on_signal(MODEL, 0.0) == ["hour-1", "ninety-1"]
    check(T0 + 3010)
    # the holder died: its requests wait again and count again
    before = qm.required_tps(MODEL, T0 + 3010)
    after = {w.model: w for w in store.waiting_deadlines(T0 + 3061)}[MODEL]
    assert after.required_tps(T0 + 3061) > before


def submit_all_other(batches: list[Batch]) -> BatchQueueManager[str]:
    """The `OTHER` model's requests of `batches` in a queue manager of their own."""
    qm: BatchQueueManager[str] = BatchQueueManager(promotion_age_s=None)
    deadlines = {"24h": 86400.0, "1h": 3600.0, "90m": 5400.0, "12h": 43200.0}
    for batch in batches:
        for custom_id, model, max_tokens in batch.lines:
            if model == OTHER:
                tokens = request_tokens(body(custom_id, model, max_tokens))
                due = T0 + batch.at + deadlines[batch.window]
                qm.submit(model, custom_id, T0 + batch.at, due, tokens)
    return qm


def test_work_past_its_deadline_needs_nothing_more(store: BatchStore) -> None:
    submit_all(store, [Batch(0, "1m", (one("gone"),)), Batch(0, "1h", (one("kept"),))])
    waiting = {w.model: w for w in store.waiting_deadlines(T0 + 61)}
    tokens = request_tokens(body("kept"))
    assert [(g.deadline, g.tokens) for g in waiting[MODEL].groups] == [(T0 + 3600, tokens)]


def test_a_batch_whose_deadline_cannot_be_met_says_so_until_it_can(store: BatchStore) -> None:
    submit_all(
        store,
        [
            Batch(0, "1h", (one("hour-1", max_tokens=2000), one("hour-2", max_tokens=2000))),
            Batch(10, "24h", (one("day-1"),)),
            Batch(20, "1h", (one("other-1", OTHER),)),
        ],
    )
    hour, day, other = sorted(store.list_batches(ME)[0], key=lambda b: b.created_at)
    now = T0 + 100
    waiting = {w.model: w for w in store.waiting_deadlines(now)}[MODEL]
    risk = waiting.risk(now, capacity_tps=0.5)  # 4,000+ tokens due in an hour: 1.1 tokens/s
    assert risk is not None
    assert waiting.risk(now, capacity_tps=10.0) is None
    until = waiting.latest_at_risk(risk)
    assert until == hour.deadline

    changes = store.mark_deadline_risks({MODEL: (until, risk.shortfall_tps)}, now)
    assert list(changes) == [hour.id]
    seen = store.get_batch(ME, hour.id).to_openai()["deadline_at_risk"]
    assert seen == {
        "model": MODEL,
        "shortfall_tokens_per_second": round(risk.shortfall_tps, 3),
        "detected_at": int(now),
    }
    assert store.get_batch(ME, day.id).to_openai()["deadline_at_risk"] is None
    assert store.get_batch(ME, other.id).deadline_at_risk is None

    # the same verdict from another replica a moment later writes nothing
    assert store.mark_deadline_risks({MODEL: (until, risk.shortfall_tps * 1.01)}, now + 1) == {}
    # a shortfall that grew is rewritten; the miss is still dated from its first sight
    store.mark_deadline_risks({MODEL: (until, risk.shortfall_tps * 2)}, now + 2)
    marked = store.get_batch(ME, hour.id).deadline_at_risk
    assert marked is not None and marked.detected_at == now
    assert marked.shortfall_tps == risk.shortfall_tps * 2

    # the model can meet its deadlines again (scaled, or work done): cleared
    assert store.mark_deadline_risks({}, now + 3) == {hour.id: None}
    assert store.get_batch(ME, hour.id).to_openai()["deadline_at_risk"] is None

    # a finished batch shows no prediction
    store.mark_deadline_risks({MODEL: (until, risk.shortfall_tps)}, now + 4)
    assert store.cancel(ME, hour.id, now=now + 5).status == "cancelled"
    assert store.get_batch(ME, hour.id).to_openai()["deadline_at_risk"] is None


def test_several_batches_at_risk_at_once_are_all_marked_and_all_cleared(
    store: BatchStore,
) -> None:
    submit_all(
        store,
        [
            Batch(0, "1h", (one("first", max_tokens=2000),)),
            Batch(5, "1h", (one("second", max_tokens=2000),)),
        ],
    )
    first, second = sorted(store.list_batches(ME)[0], key=lambda b: b.created_at)
    now = T0 + 100
    waiting = {w.model: w for w in store.waiting_deadlines(now)}[MODEL]
    risk = waiting.risk(now, capacity_tps=0.5)
    assert risk is not None
    changes = store.mark_deadline_risks({MODEL: (waiting.latest_at_risk(risk), 1.0)}, now)
    assert sorted(changes) == sorted([first.id, second.id])
    for batch in (first, second):
        assert store.get_batch(ME, batch.id).deadline_at_risk is not None
    assert store.mark_deadline_risks({}, now + 1) == {first.id: None, second.id: None}
    assert all(store.get_batch(ME, b.id).deadline_at_risk is None for b in (first, second))
