"""The batch store as the router's release worker and the Batch API use it, on SQLite and
on PostgreSQL: what a user finds in the output and error files, what happens when a
replica dies holding a request, at the deadline, and on cancel."""

from __future__ import annotations

import pytest

from sageserve.batch import BatchStore, Conflict, InvalidInput, NotFound
from tests.batch.conftest import (
    ME,
    MODEL,
    OTHER,
    T0,
    deadline_of,
    jsonl,
    known_models,
    line,
    read_jsonl,
)

ENDPOINT = "/v1/chat/completions"


def submit(store: BatchStore, lines: list[str], now: float = T0, window: str = "24h") -> str:
    upload = store.create_file(ME, jsonl(lines), "requests.jsonl", now=now)
    batch = store.create_batch(
        ME, upload.id, ENDPOINT, window, {"team": "a"}, known_models, deadline_of, now=now
    )
    return batch.id


def answer(custom_id: str) -> dict[str, object]:
    return {"object": "chat.completion", "choices": [{"message": {"content": custom_id}}]}


def run_all(store: BatchStore, model: str, now: float, owner: str = "a") -> None:
    for request in store.claim(model, 1000, owner, 60, now):
        assert store.complete(request.id, owner, 200, answer(request.custom_id), now=now)


def test_a_batch_runs_to_its_output_and_error_files(store: BatchStore) -> None:
    batch_id = submit(
        store,
        [line("r1"), "{not json", line("r2"), line("r3", model="nobody/unknown"), line("r4")],
    )
    batch = store.get_batch(ME, batch_id)
    assert batch.status == "in_progress"
    assert batch.request_counts.to_openai() == {"total": 5, "completed": 0, "failed": 2}
    assert batch.deadline == T0 + 86400 and batch.tier == "niw"

    claimed = store.claim(MODEL, 10, "router-a", 60, T0 + 1)
    assert [c.custom_id for c in claimed] == ["r1", "r2", "r4"]
    assert claimed[0].body["messages"][0]["content"] == "r1" and claimed[0].url == ENDPOINT
    store.complete(claimed[0].id, "router-a", 200, answer("r1"), "req-up-1", now=T0 + 2)
    store.complete(claimed[1].id, "router-a", 200, answer("r2"), now=T0 + 2)
    upstream_error = {"error": {"message": "context too long", "code": "context_length"}}
    store.complete(claimed[2].id, "router-a", 400, upstream_error, now=T0 + 2)

    assert store.finalize(T0 + 3) == [(batch_id, "completed")]
    assert store.finalize(T0 + 4) == []  # closed once
    batch = store.get_batch(ME, batch_id)
    assert batch.status == "completed"
    assert batch.request_counts.to_openai() == {"total": 5, "completed": 2, "failed": 3}
    assert batch.output_file_id and batch.error_file_id
    assert store.get_file(ME, batch.output_file_id).purpose == "batch_output"

    output = read_jsonl(store.file_content(ME, batch.output_file_id))
    assert [o["custom_id"] for o in output] == ["r1", "r2"]
    assert output[0]["response"] == {
        "status_code": 200,
        "request_id": "req-up-1",
        "body": answer("r1"),
    }
    assert output[0]["error"] is None and output[0]["id"].startswith("batch_req_")

    errors = read_jsonl(store.file_content(ME, batch.error_file_id))
    assert [e["custom_id"] for e in errors] == [None, "r3", "r4"]  # in input line order
    assert errors[0]["error"]["code"] == "invalid_json_line"
    assert "line 2" in errors[0]["error"]["message"] and errors[0]["response"] is None
    assert errors[1]["error"]["code"] == "model_not_found"
    assert "line 4" in errors[1]["error"]["message"]
    assert "nobody/unknown" in errors[1]["error"]["message"]
    assert errors[2]["response"]["status_code"] == 400
    assert errors[2]["error"] == {"code": "context_length", "message": "context too long"}


def test_each_bad_line_is_reported_with_its_number_and_the_others_run(store: BatchStore) -> None:
    lines = [
        line("ok-1"),
        "[1, 2]",
        line("wrong-url", url="/v1/completions"),
        line("ok-1"),
        line("get", method="GET"),
        '{"custom_id": "no-body", "method": "POST", "url": "/v1/chat/completions"}',
        line("streamed", body={"model": MODEL, "stream": True}),
        "",
        line("no-model", body={"prompt": "x"}),
        line("ok-2"),
    ]
    batch_id = submit(store, lines)
    run_all(store, MODEL, T0 + 1)
    store.finalize(T0 + 2)
    batch = store.get_batch(ME, batch_id)
    assert batch.request_counts.to_openai() == {"total": 9, "completed": 2, "failed": 7}
    assert batch.error_file_id is not None and batch.output_file_id is not None
    output = read_jsonl(store.file_content(ME, batch.output_file_id))
    assert [o["custom_id"] for o in output] == ["ok-1", "ok-2"]
    errors = read_jsonl(store.file_content(ME, batch.error_file_id))
    found = {(e["custom_id"], e["error"]["code"]) for e in errors}
    assert found == {
        (None, "invalid_json_line"),
        ("wrong-url", "invalid_url"),
        ("ok-1", "duplicate_custom_id"),
        ("get", "invalid_request"),
        ("no-body", "missing_required_parameter"),
        ("streamed", "invalid_request"),
        ("no-model", "missing_required_parameter"),
    }
    numbers = [int(e["error"]["message"].split()[1].rstrip(":")) for e in errors]
    assert numbers == [2, 3, 4, 5, 6, 7, 9]  # blank line 8 skipped, numbering kept
    duplicate = next(e for e in errors if e["error"]["code"] == "duplicate_custom_id")
    assert "line 1" in duplicate["error"]["message"]


def test_a_file_with_nothing_to_run_fails_the_batch_saying_why(store: BatchStore) -> None:
    batch_id = submit(store, [line("x", model="nobody"), "oops"])
    batch = store.get_batch(ME, batch_id)
    assert batch.status == "failed"
    assert batch.errors is not None
    assert [(e["code"], e["line"]) for e in batch.errors] == [
        ("model_not_found", 1),
        ("invalid_json_line", 2),
    ]
    assert batch.request_counts.to_openai() == {"total": 2, "completed": 0, "failed": 2}
    empty = store.create_batch(
        ME, store.create_file(ME, b"\n\n", "empty.jsonl").id, ENDPOINT, known_models=known_models
    )
    assert empty.status == "failed" and empty.errors is not None
    assert empty.errors[0]["code"] == "empty_file"


def test_create_batch_refuses_what_cannot_become_a_batch(store: BatchStore) -> None:
    upload = store.create_file(ME, jsonl([line("a")]), "in.jsonl")
    with pytest.raises(NotFound) as missing:
        store.create_batch(ME, "file-nope", ENDPOINT, known_models=known_models)
    assert missing.value.param == "input_file_id"
    with pytest.raises(InvalidInput) as window:
        store.create_batch(ME, upload.id, ENDPOINT, "forever", known_models=known_models)
    assert window.value.param == "completion_window" and "'24h'" in str(window.value)
    with pytest.raises(InvalidInput) as endpoint:
        store.create_batch(ME, upload.id, "/v1/embeddings", known_models=known_models)
    assert endpoint.value.param == "endpoint"
    small = BatchStore(store.engine, max_requests=1)
    two = store.create_file(ME, jsonl([line("a"), line("b")]), "two.jsonl")
    with pytest.raises(InvalidInput) as too_many:
        small.create_batch(ME, two.id, ENDPOINT, known_models=known_models)
    assert too_many.value.code == "too_many_requests" and "split" in str(too_many.value)
    assert store.list_batches(ME)[0] == []


def test_the_deadline_is_the_shorter_of_window_and_tier(store: BatchStore) -> None:
    short = store.get_batch(ME, submit(store, [line("a")], window="2h"))
    assert short.deadline == T0 + 7200
    slow = store.get_batch(ME, submit(store, [line("b", model=OTHER)], window="7d"))
    assert slow.deadline == T0 + 2 * 86400 and slow.tier == "niw-slow"
    mixed = store.get_batch(ME, submit(store, [line("c", model=OTHER), line("d")], window="7d"))
    assert mixed.deadline == T0 + 86400 and mixed.tier == "niw"


def test_a_request_whose_owner_died_runs_again_and_counts_once(store: BatchStore) -> None:
    batch_id = submit(store, [line("only")])
    [first] = store.claim(MODEL, 2, "router-a", 30, T0 + 1)
    # router-a holds it: nobody else gets it while the lease runs
    assert store.claim(MODEL, 2, "router-b", 30, T0 + 20) == []
    # router-a died; its lease ran out: router-b takes the request over
    [again] = store.claim(MODEL, 2, "router-b", 30, T0 + 32)
    assert again.id == first.id and again.attempts == 2
    assert store.complete(again.id, "router-b", 200, answer("b"), now=T0 + 33)
    # router-a was only slow, not dead: its late answer changes nothing
    assert not store.complete(first.id, "router-a", 200, answer("a"), now=T0 + 34)
    assert not store.complete(again.id, "router-b", 200, answer("b"), now=T0 + 35)
    store.finalize(T0 + 40)
    batch = store.get_batch(ME, batch_id)
    assert batch.output_file_id is not None and batch.error_file_id is None
    [result] = read_jsonl(store.file_content(ME, batch.output_file_id))
    assert result["response"]["body"] == answer("b")


def test_a_request_started_too_often_fails_instead_of_looping(store: BatchStore) -> None:
    capped = BatchStore(store.engine, max_attempts=2)
    batch_id = submit(capped, [line("poison"), line("fine")])
    [poison] = capped.claim(MODEL, 1, "a", 10, T0 + 1)
    capped.claim(MODEL, 1, "b", 10, T0 + 12)  # the lapsed one again (attempt 2)
    [fine] = capped.claim(MODEL, 1, "c", 10, T0 + 24)  # poison worn out: the next one
    assert fine.custom_id == "fine"
    capped.complete(fine.id, "c", 200, answer("fine"), now=T0 + 25)
    capped.finalize(T0 + 26)
    batch = capped.get_batch(ME, batch_id)
    assert batch.status == "completed" and batch.error_file_id is not None
    [error] = read_jsonl(capped.file_content(ME, batch.error_file_id))
    assert error["custom_id"] == "poison" and error["error"]["code"] == "too_many_attempts"
    assert poison.custom_id == "poison"


def test_retry_renew_and_fail_act_only_for_the_holder(store: BatchStore) -> None:
    submit(store, [line("x"), line("y")])
    x, y = store.claim(MODEL, 2, "a", 30, T0 + 1)
    assert not store.retry(x.id, "b", now=T0 + 2)  # b does not hold it
    assert store.retry(x.id, "a", now=T0 + 2)  # its pod failed: back in the queue
    [x_again] = store.claim(MODEL, 2, "b", 30, T0 + 3)
    assert x_again.id == x.id
    assert store.renew("a", [x.id, y.id], 30, T0 + 25) == [y.id]  # x is b's now
    assert store.claim(MODEL, 2, "c", 30, T0 + 32) == []  # y renewed until T0 + 55
    assert store.fail(y.id, "a", "upstream_gone", "the model was removed", now=T0 + 41)
    assert not store.complete(y.id, "a", 200, {}, now=T0 + 42)
    assert store.renew("a", [y.id], 30, T0 + 43) == []


def test_the_deadline_expires_a_batch_and_reports_every_unfinished_line(
    store: BatchStore,
) -> None:
    batch_id = submit(store, [line("done"), line("held"), line("queued")], window="1h")
    done, held = store.claim(MODEL, 2, "a", 600, T0 + 10)
    store.complete(done.id, "a", 200, answer("done"), now=T0 + 20)
    assert store.finalize(T0 + 3599) == []
    assert store.claim(MODEL, 5, "b", 60, T0 + 3600) == []  # past the deadline: not started
    assert store.finalize(T0 + 3600) == [(batch_id, "expired")]
    batch = store.get_batch(ME, batch_id)
    assert batch.status == "expired" and batch.timestamps["expired_at"] == T0 + 3600
    assert batch.request_counts.to_openai() == {"total": 3, "completed": 1, "failed": 2}
    assert batch.error_file_id is not None and batch.output_file_id is not None
    errors = read_jsonl(store.file_content(ME, batch.error_file_id))
    assert [(e["custom_id"], e["error"]["code"]) for e in errors] == [
        ("held", "batch_expired"),
        ("queued", "batch_expired"),
    ]
    assert "deadline" in errors[0]["error"]["message"]
    assert not store.complete(held.id, "a", 200, {}, now=T0 + 3601)  # too late
    assert store.expired_total() == 2


def test_cancel_stops_queued_requests_and_waits_for_running_ones(store: BatchStore) -> None:
    batch_id = submit(store, [line("running"), line("queued-1"), line("queued-2")])
    [running] = store.claim(MODEL, 1, "a", 60, T0 + 1)
    batch = store.cancel(ME, batch_id, now=T0 + 2)
    assert batch.status == "cancelling" and batch.timestamps["cancelling_at"] == T0 + 2
    assert store.claim(MODEL, 5, "b", 60, T0 + 3) == []
    assert store.cancel(ME, batch_id, now=T0 + 4).status == "cancelling"  # idempotent
    assert store.finalize(T0 + 5) == []  # a replica still runs one of its requests
    assert store.complete(running.id, "a", 200, answer("running"), now=T0 + 6)
    assert store.finalize(T0 + 7) == [(batch_id, "cancelled")]
    batch = store.get_batch(ME, batch_id)
    assert batch.status == "cancelled"
    assert batch.request_counts.to_openai() == {"total": 3, "completed": 1, "failed": 2}
    assert batch.output_file_id is not None and batch.error_file_id is not None
    assert [o["custom_id"] for o in read_jsonl(store.file_content(ME, batch.output_file_id))] == [
        "running"
    ]
    errors = read_jsonl(store.file_content(ME, batch.error_file_id))
    assert {e["error"]["code"] for e in errors} == {"batch_cancelled"}
    with pytest.raises(Conflict):
        done = submit(store, [line("z")], now=T0 + 8)
        run_all(store, MODEL, T0 + 9)
        store.finalize(T0 + 10)
        store.cancel(ME, done, now=T0 + 11)


def test_cancel_with_nothing_running_is_cancelled_at_once(store: BatchStore) -> None:
    batch_id = submit(store, [line("a"), line("b")])
    assert store.cancel(ME, batch_id, now=T0 + 1).status == "cancelled"
    # a replica that died holding a request does not keep a cancel waiting forever
    other = submit(store, [line("c")], now=T0 + 2)
    store.claim(MODEL, 1, "dead", 10, T0 + 3)
    assert store.cancel(ME, other, now=T0 + 4).status == "cancelling"
    assert store.finalize(T0 + 14) == [(other, "cancelled")]


def test_depth_counts_waiting_requests_per_model_and_tier(store: BatchStore) -> None:
    submit(store, [line("a1"), line("a2"), line("o1", model=OTHER)], now=T0)
    submit(store, [line("a3")], now=T0 + 100)
    store.claim(MODEL, 1, "a", 60, T0 + 200)  # held: not waiting
    depth = store.depth(T0 + 201)
    assert [(d.model, d.tier, d.queued, d.oldest_arrival) for d in depth] == [
        (MODEL, "niw", 2, T0),
        (OTHER, "niw-slow", 1, T0),
    ]
    # the holder died: its request waits again
    assert store.depth(T0 + 261)[0].queued == 3
    assert store.state_counts()["queued"] == 3


def test_files_list_page_and_delete(store: BatchStore) -> None:
    made = [store.create_file(ME, b"{}\n", f"f{i}.jsonl", now=T0 + i) for i in range(5)]
    page, more = store.list_files(ME, limit=2)
    assert [f.filename for f in page] == ["f4.jsonl", "f3.jsonl"] and more
    page, more = store.list_files(ME, limit=10, after=page[-1].id)
    assert [f.filename for f in page] == ["f2.jsonl", "f1.jsonl", "f0.jsonl"] and not more
    assert store.list_files(ME, purpose="batch_output")[0] == []
    store.delete_file(ME, made[0].id)
    with pytest.raises(NotFound):
        store.get_file(ME, made[0].id)
    with pytest.raises(NotFound):
        store.file_content(ME, made[0].id)
    with pytest.raises(NotFound):
        store.delete_file(ME, made[0].id)
    with pytest.raises(InvalidInput):
        store.create_file(ME, b"x", "x.bin", purpose="fine-tune")


def test_batches_list_newest_first_with_a_cursor(store: BatchStore) -> None:
    ids = [submit(store, [line(f"r{i}")], now=T0 + i) for i in range(3)]
    page, more = store.list_batches(ME, limit=2)
    assert [b.id for b in page] == [ids[2], ids[1]] and more
    page, more = store.list_batches(ME, limit=2, after=ids[1])
    assert [b.id for b in page] == [ids[0]] and not more
    with pytest.raises(NotFound) as unknown:
        store.list_batches(ME, after="batch_nope")
    assert unknown.value.param == "after"
    assert page[0].metadata == {"team": "a"}


def test_a_store_opened_again_finds_everything(store_url: str) -> None:
    first = BatchStore.open(store_url)
    batch_id = submit(first, [line("a"), line("b")])
    [held] = first.claim(MODEL, 1, "a", 30, T0 + 1)
    first.close()
    again = BatchStore.open(store_url)  # a restarted router: migrations are a no-op
    try:
        assert again.get_batch(ME, batch_id).request_counts.total == 2
        assert [c.custom_id for c in again.claim(MODEL, 5, "b", 30, T0 + 2)] == ["b"]
        assert [c.id for c in again.claim(MODEL, 5, "b", 30, T0 + 32)] == [held.id]
    finally:
        again.close()
