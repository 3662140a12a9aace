"""Retention on SQLite and PostgreSQL: the sweep deletes expired files and finished
batches' requests and results, forgets the prompts of a deleted input file, and never
touches the work of a batch that is still running."""

from __future__ import annotations

import pytest
from sqlalchemy import func, select

from sageserve.batch import BatchStore, Conflict, NotFound
from sageserve.batch.schema import requests
from tests.batch.conftest import ME, MODEL, T0, deadline_of, jsonl, known_models, line

HOUR = 3600.0
ENDPOINT = "/v1/chat/completions"


def request_rows(store: BatchStore, batch_id: str) -> tuple[int, int]:
    """(request rows, of them with their prompt) of a batch."""
    with store.engine.connect() as conn:
        total, prompts = conn.execute(
            select(func.count(), func.count(requests.c.body)).where(requests.c.batch_id == batch_id)
        ).one()
    return int(total), int(prompts)


def test_the_sweep_keeps_a_running_batchs_work_and_then_deletes_it_all(
    store: BatchStore,
) -> None:
    file = store.create_file(ME, jsonl([line("a"), line("b")]), "in.jsonl", "batch", HOUR, T0)
    assert file.expires_at == T0 + HOUR
    batch = store.create_batch(
        ME, file.id, ENDPOINT, "24h", None, known_models, deadline_of, 2 * HOUR, T0
    )
    unused = store.create_file(ME, b"{}\n", "unused.jsonl", "batch", HOUR, T0)

    # past the file's retention, the batch still running: only the unused file goes
    assert store.sweep(T0 + 5 * HOUR) == (1, 0)
    with pytest.raises(NotFound):
        store.get_file(ME, unused.id)
    assert store.get_file(ME, file.id).id == file.id
    assert request_rows(store, batch.id) == (2, 2)
    for claimed in store.claim(MODEL, 10, "router", 60, T0 + 5 * HOUR):
        store.complete(claimed.id, "router", 200, {"ok": 1}, now=T0 + 5 * HOUR)

    closed_at = T0 + 6 * HOUR
    assert store.finalize(closed_at) == [(batch.id, "completed")]
    done = store.get_batch(ME, batch.id)
    assert done.output_file_id is not None
    assert store.get_file(ME, done.output_file_id).expires_at == closed_at + 2 * HOUR
    # the batch ended: its expired input goes, and with it the prompts; answers stay
    assert store.sweep(closed_at + 1) == (1, 0)
    with pytest.raises(NotFound):
        store.file_content(ME, file.id)
    assert request_rows(store, batch.id) == (2, 0)
    assert store.file_content(ME, done.output_file_id).count(b"\n") == 2

    # the results' retention runs out: requests and result files go, the batch stays
    assert store.sweep(closed_at + 2 * HOUR - 1) == (0, 0)
    assert store.sweep(closed_at + 2 * HOUR) == (0, 1)  # its result file with it
    assert request_rows(store, batch.id) == (0, 0)
    with pytest.raises(NotFound):
        store.get_file(ME, done.output_file_id)
    kept = store.get_batch(ME, batch.id)
    assert kept.status == "completed" and kept.request_counts.completed == 2
    assert store.sweep(closed_at + 100 * HOUR) == (0, 0)


def test_an_unfinished_batch_is_never_swept_however_old(store: BatchStore) -> None:
    file = store.create_file(ME, jsonl([line("a")]), "in.jsonl", "batch", HOUR, T0)
    batch = store.create_batch(ME, file.id, ENDPOINT, "24h", None, known_models, now=T0)
    [held] = store.claim(MODEL, 1, "router", 10 * 86400, T0 + 1)
    assert store.sweep(T0 + 40 * 86400) == (0, 0)  # past every retention, still running
    assert request_rows(store, batch.id) == (1, 1)
    assert store.get_file(ME, file.id).id == file.id
    assert store.complete(held.id, "router", 200, {"ok": 1}, now=T0 + 40 * 86400)


def test_deleting_an_input_file_forgets_the_prompts_of_its_finished_batches(
    store: BatchStore,
) -> None:
    file = store.create_file(ME, jsonl([line("a"), line("b")]), "in.jsonl", now=T0)
    batch = store.create_batch(ME, file.id, ENDPOINT, known_models=known_models, now=T0)
    with pytest.raises(Conflict) as in_use:
        store.delete_file(ME, file.id)
    assert in_use.value.code == "file_in_use" and batch.id in str(in_use.value)
    assert request_rows(store, batch.id) == (2, 2)
    store.cancel(ME, batch.id, now=T0 + 1)
    store.delete_file(ME, file.id)
    assert request_rows(store, batch.id) == (2, 0)  # the error file was written already
    with pytest.raises(NotFound):
        store.get_file(ME, file.id)
