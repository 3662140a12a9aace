"""A router killed (SIGKILL) in the middle of a batch loses nothing and completes
nothing twice: a process works through a batch, is killed at an arbitrary moment, and
another one, opened on the same database, finishes the batch."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from sageserve.batch import BatchStore
from tests.batch.conftest import ME, MODEL, jsonl, known_models, line, read_jsonl

REQUESTS = 60
LEASE_S = 2.0

WORKER = textwrap.dedent(
    """
    import sys
    from sageserve.batch import BatchStore

    store = BatchStore.open(sys.argv[1])
    while True:
        for request in store.claim(sys.argv[2], 2, "doomed", float(sys.argv[3])):
            store.complete(request.id, "doomed", 200, {"by": "doomed"})
            print(request.id, flush=True)
    """
)


@pytest.mark.slow
def test_a_router_killed_mid_batch_loses_nothing_and_duplicates_nothing(
    store_url: str,
) -> None:
    store = BatchStore.open(store_url)
    try:
        upload = store.create_file(ME, jsonl([line(f"r{i}") for i in range(REQUESTS)]), "in.jsonl")
        batch = store.create_batch(ME, upload.id, "/v1/chat/completions", known_models=known_models)
        worker = subprocess.Popen(
            [sys.executable, "-c", WORKER, store_url, MODEL, str(LEASE_S)],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert worker.stdout is not None
        done_before = [worker.stdout.readline().strip() for _ in range(REQUESTS // 3)]
        os.kill(worker.pid, signal.SIGKILL)  # mid-batch, maybe mid-transaction
        worker.wait(timeout=30)
        assert all(done_before)

        time.sleep(LEASE_S + 0.5)  # what the killed router held is claimable again
        finished = 0
        while got := store.claim(MODEL, 10, "survivor", 60):
            for request in got:
                assert request.id not in done_before  # what was answered stays answered
                finished += store.complete(request.id, "survivor", 200, {"by": "survivor"})
        assert store.finalize() == [(batch.id, "completed")]
        result = store.get_batch(ME, batch.id)
        assert result.request_counts.to_openai() == {
            "total": REQUESTS,
            "completed": REQUESTS,
            "failed": 0,
        }
        assert result.output_file_id is not None
        output = read_jsonl(store.file_content(ME, result.output_file_id))
        assert sorted(o["custom_id"] for o in output) == sorted(f"r{i}" for i in range(REQUESTS))
        by = [o["response"]["body"]["by"] for o in output]
        assert by.count("doomed") >= len(done_before)
        assert by.count("survivor") == finished == REQUESTS - by.count("doomed")
        assert json.dumps(output)  # every line is plain JSON
    finally:
        store.close()
