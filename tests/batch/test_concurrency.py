"""Two router replicas on one queue: never the same request at once, each counted once.

Each replica is its own ``BatchStore`` (own engine and connections, as two processes
would have), with two worker threads each, all claiming from the same model's queue at
the same moment, on SQLite (``BEGIN IMMEDIATE``) and PostgreSQL (``SKIP LOCKED``).
"""

from __future__ import annotations

import threading
from collections import Counter

from sageserve.batch import BatchStore, ClaimedRequest
from tests.batch.conftest import ME, MODEL, T0, deadline_of, jsonl, known_models, line

REQUESTS = 240
WORKERS_PER_REPLICA = 2


def test_replicas_claiming_at_once_never_share_a_request(store_url: str) -> None:
    replicas = [BatchStore.open(store_url), BatchStore.open(store_url)]
    try:
        upload = replicas[0].create_file(
            ME, jsonl([line(f"r{i}") for i in range(REQUESTS)]), "in.jsonl", now=T0
        )
        batch = replicas[0].create_batch(
            ME, upload.id, "/v1/chat/completions", "24h", None, known_models, deadline_of, now=T0
        )
        start = threading.Barrier(len(replicas) * WORKERS_PER_REPLICA)
        claimed: dict[str, list[ClaimedRequest]] = {}
        firsts: Counter[str] = Counter()
        lock = threading.Lock()
        failures: list[BaseException] = []

        def worker(store: BatchStore, owner: str) -> None:
            try:
                start.wait()
                mine: list[ClaimedRequest] = []
                while got := store.claim(MODEL, 2, owner, 600, T0 + 1):
                    mine += got
                    for request in got:
                        if store.complete(request.id, owner, 200, {"by": owner}, now=T0 + 2):
                            with lock:
                                firsts[request.id] += 1
                claimed[owner] = mine
            except BaseException as exc:  # surfaced below
                failures.append(exc)

        threads = [
            threading.Thread(target=worker, args=(store, f"replica{i}-worker{w}"))
            for i, store in enumerate(replicas)
            for w in range(WORKERS_PER_REPLICA)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
        assert not failures, failures
        every = [r.id for requests in claimed.values() for r in requests]
        assert len(every) == REQUESTS and len(set(every)) == REQUESTS  # nobody shared one
        assert set(firsts.values()) == {1} and len(firsts) == REQUESTS
        assert replicas[1].finalize(T0 + 3) == [(batch.id, "completed")]
        assert replicas[0].get_batch(ME, batch.id).request_counts.completed == REQUESTS
    finally:
        for store in replicas:
            store.close()


def test_replicas_closing_batches_at_once_write_the_files_once(store_url: str) -> None:
    replicas = [BatchStore.open(store_url) for _ in range(3)]
    try:
        store = replicas[0]
        ids = []
        for b in range(4):
            upload = store.create_file(ME, jsonl([line(f"b{b}")]), "in.jsonl", now=T0)
            batch = store.create_batch(
                ME, upload.id, "/v1/chat/completions", known_models=known_models, now=T0
            )
            ids.append(batch.id)
        for request in store.claim(MODEL, 10, "w", 60, T0 + 1):
            store.complete(request.id, "w", 200, {}, now=T0 + 2)
        start = threading.Barrier(len(replicas))
        closed: list[tuple[str, str]] = []

        def close(replica: BatchStore) -> None:
            start.wait()
            closed.extend(replica.finalize(T0 + 3))

        threads = [threading.Thread(target=close, args=(r,)) for r in replicas]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
        assert sorted(closed) == sorted((i, "completed") for i in ids)
        assert len(store.list_files(ME, purpose="batch_output")[0]) == len(ids)
    finally:
        for replica in replicas:
            replica.close()
