"""``complete_many``: many answers recorded in one transaction, on SQLite and PostgreSQL,
with the guarantees of ``complete``: an answer counts only while its sender holds the
request, once, and never over another ending (a replica that took the request over after
the lease ran out, a cancelled or expired batch)."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from sqlalchemy import select

from sageserve.batch import Answer, BatchStore
from sageserve.batch.schema import requests
from tests.batch.conftest import ME, MODEL, T0, deadline_of, jsonl, known_models, line, read_jsonl

ENDPOINT = "/v1/chat/completions"
#: when the answers are recorded (leases of 60 s taken at T0 + 1 still run)
AT = T0 + 30


def submit(store: BatchStore, custom_ids: list[str]) -> str:
    upload = store.create_file(ME, jsonl([line(c) for c in custom_ids]), "in.jsonl", now=T0)
    batch = store.create_batch(
        ME, upload.id, ENDPOINT, "24h", None, known_models, deadline_of, now=T0
    )
    return batch.id


def row(store: BatchStore, request_id: str) -> Any:
    with store.engine.connect() as conn:
        return conn.execute(
            select(
                requests.c.state,
                requests.c.lease_owner,
                requests.c.response_body,
                requests.c.status_code,
            ).where(requests.c.id == request_id)
        ).first()


def mine(store: BatchStore, batch_id: str) -> str:
    [held] = store.claim(MODEL, 1, "me", 60, T0 + 1)
    return held.id


def lapsed(store: BatchStore, batch_id: str) -> str:
    [held] = store.claim(MODEL, 1, "me", 5, T0 + 1)  # ran out at T0 + 6, nobody took it
    return held.id


def taken_over(store: BatchStore, batch_id: str) -> str:
    [held] = store.claim(MODEL, 1, "me", 5, T0 + 1)
    [again] = store.claim(MODEL, 1, "them", 60, T0 + 10)
    assert again.id == held.id
    return held.id


def recorded_already(store: BatchStore, batch_id: str) -> str:
    rid = mine(store, batch_id)
    assert store.complete(rid, "me", 200, {"first": True}, now=T0 + 2)
    return rid


def recorded_by_another(store: BatchStore, batch_id: str) -> str:
    rid = taken_over(store, batch_id)
    assert store.complete_many("them", [Answer(rid, 200, {"first": True})], T0 + 11) == [rid]
    return rid


def cancelled(store: BatchStore, batch_id: str) -> str:
    rid = lapsed(store, batch_id)
    store.cancel(ME, batch_id, now=T0 + 2)  # waits for the lease, which runs out
    assert store.finalize(T0 + 10) == [(batch_id, "cancelled")]
    return rid


def expired(store: BatchStore, batch_id: str) -> str:
    rid = mine(store, batch_id)
    assert store.finalize(T0 + 86400) == [(batch_id, "expired")]  # still running then
    return rid


def queued(store: BatchStore, batch_id: str) -> str:
    with store.engine.connect() as conn:
        rid: str = conn.execute(
            select(requests.c.id).where(requests.c.batch_id == batch_id)
        ).scalar_one()
    return rid


def given_back(store: BatchStore, batch_id: str) -> str:
    rid = mine(store, batch_id)
    assert store.retry(rid, "me", now=T0 + 2)
    return rid


@dataclass(frozen=True)
class Case:
    setup: Callable[[BatchStore, str], str]
    #: this call records "me"'s answer
    records: bool
    #: the request's state afterwards
    state: str


CASES = {
    "held by me": Case(mine, True, "done"),
    "held by me, lease ran out, nobody took it": Case(lapsed, True, "done"),
    "taken over by another replica": Case(taken_over, False, "running"),
    "recorded already (the same answer sent twice)": Case(recorded_already, False, "done"),
    "recorded by the replica that took it over": Case(recorded_by_another, False, "done"),
    "its batch cancelled": Case(cancelled, False, "cancelled"),
    "its batch expired": Case(expired, False, "expired"),
    "never claimed": Case(queued, False, "queued"),
    "given back to the queue": Case(given_back, False, "queued"),
}


@pytest.mark.parametrize("case", list(CASES.values()), ids=list(CASES))
def test_an_answer_counts_only_while_its_sender_holds_the_request(
    store: BatchStore, case: Case
) -> None:
    batch_id = submit(store, ["only"])
    rid = case.setup(store, batch_id)
    before = row(store, rid)
    at = T0 + 86401 if case.setup is expired else AT
    finished = store.complete_many("me", [Answer(rid, 200, {"by": "me"}, "up-1")], at)
    assert finished == ([rid] if case.records else [])
    after = row(store, rid)
    assert after.state == case.state
    if case.records:
        assert json.loads(after.response_body) == {"by": "me"} and after.status_code == 200
        assert after.lease_owner == "me"
    else:
        assert tuple(after) == tuple(before)  # nothing about it changed


def test_many_answers_one_call_the_held_ones_recorded_and_idempotent(store: BatchStore) -> None:
    batch_id = submit(store, [f"r{i}" for i in range(6)])
    claimed = store.claim(MODEL, 6, "me", 5, T0 + 1)
    ids = [c.id for c in claimed]
    # r0 and r1: the lease ran out and another replica runs them now
    assert [c.id for c in store.claim(MODEL, 2, "them", 60, T0 + 10)] == ids[:2]
    answers = [Answer(c.id, 200, {"custom": c.custom_id}, f"up-{c.custom_id}") for c in claimed]
    answers.insert(4, Answer(ids[2], 500, {"a": "second answer"}))  # only the first counts
    assert store.complete_many("me", answers, T0 + 11) == ids[2:]
    assert store.complete_many("me", answers, T0 + 12) == []  # sent again: nothing more
    assert store.complete_many("me", [], T0 + 12) == []
    theirs = [Answer(rid, 200, {"custom": "by them"}) for rid in ids[:2]]
    assert store.complete_many("them", theirs + answers, T0 + 13) == ids[:2]
    assert store.state_counts()["done"] == 6

    assert store.finalize(T0 + 14) == [(batch_id, "completed")]
    batch = store.get_batch(ME, batch_id)
    assert batch.output_file_id is not None and batch.error_file_id is None
    output = read_jsonl(store.file_content(ME, batch.output_file_id))
    bodies = {o["custom_id"]: o["response"] for o in output}
    assert len(output) == 6
    assert bodies["r2"] == {"status_code": 200, "request_id": "up-r2", "body": {"custom": "r2"}}
    assert bodies["r0"]["body"] == bodies["r1"]["body"] == {"custom": "by them"}


def test_more_answers_than_one_lookup_takes(store: BatchStore) -> None:
    submit(store, [f"r{i}" for i in range(1200)])
    claimed = store.claim(MODEL, 1200, "me", 60, T0 + 1)
    answers = [Answer(c.id, 200, {"i": i}) for i, c in enumerate(claimed)]
    assert store.complete_many("me", answers, AT) == [c.id for c in claimed]
    assert store.state_counts()["done"] == 1200
