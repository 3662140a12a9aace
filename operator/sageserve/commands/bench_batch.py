"""``sageserve bench batch``: how fast the durable batch queue takes requests in and out.

Two figures per database:

- **accepted/s**: requests of one large JSONL file stored and queued per second, i.e. the
  upload (``create_file``) plus ``create_batch`` (parse every line, insert one row per
  request, one transaction), as a user submitting a batch sees it;
- **released/s**: requests claimed and completed per second by router workers, each
  claim taking 2 requests as SageServe's Queue Manager releases them to an endpoint under
  50 % EMU (§6.2), each completion its own transaction (what a router does per answer).
  With several workers (each its own owner, as replicas would be) the figure shows how the
  database's locking (SQLite's single writer, PostgreSQL's ``SKIP LOCKED`` row locks)
  scales.

With ``--release-compare`` only the release path is measured, twice per repetition on
the same database: requests claimed as above and answered at once (no pods), their
answers recorded **each in its own transaction** (``complete``, what the release loop did
before) or **together** (``complete_many`` every ``flush_size`` answers, what it does
now). The two alternate in order across repetitions, and the ratio is taken within each
repetition, so that a machine busy with other work skews both sides alike.

Also the time ``finalize`` takes to write the batch's output file. Every run queues its
requests under a model name of its own, so runs on a shared database do not interfere.
SQLite runs on a temporary file with the store's production settings (WAL,
``synchronous=FULL``). PostgreSQL needs ``--postgres-url``; ``python -m e2e.bench_batch``
starts a throwaway server (Debian's package) and passes it.
"""

from __future__ import annotations

import json
import statistics
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table

from sageserve.batch.objects import Answer
from sageserve.batch.store import BatchStore
from sageserve.dispatch.identity import ANONYMOUS

ENDPOINT = "/v1/chat/completions"


@dataclass(frozen=True)
class BatchBenchRow:
    backend: str
    workers: int
    requests: int
    accepted_per_s: float
    released_per_s: float
    finalize_s: float


def input_file(model: str, requests: int, prompt_chars: int = 400) -> bytes:
    """A batch input file of ``requests`` chat requests of ``prompt_chars`` characters."""
    prompt = ("lorem ipsum " * (prompt_chars // 12 + 1))[:prompt_chars]
    lines = [
        json.dumps(
            {
                "custom_id": f"req-{i}",
                "method": "POST",
                "url": ENDPOINT,
                "body": {
                    "model": model,
                    "messages": [{"role": "user", "content": prompt}],
                    "max_tokens": 128,
                },
            }
        )
        for i in range(requests)
    ]
    return ("\n".join(lines) + "\n").encode()


def _release(store: BatchStore, model: str, workers: int, claim_size: int) -> None:
    """Claim and complete everything queued for ``model`` with ``workers`` threads."""
    failures: list[BaseException] = []

    def work(owner: str) -> None:
        try:
            while got := store.claim(model, claim_size, owner, 600.0):
                for request in got:
                    store.complete(request.id, owner, 200, {"choices": [], "custom": 1})
        except BaseException as exc:  # re-raised in the caller's thread
            failures.append(exc)

    threads = [threading.Thread(target=work, args=(f"bench-{w}",)) for w in range(workers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if failures:
        raise failures[0]


def bench_store(store: BatchStore, requests: int, workers: int, claim_size: int) -> BatchBenchRow:
    """One submit → release → finalize cycle of ``requests`` requests on ``store``."""
    model = f"bench-{uuid.uuid4().hex[:12]}"
    content = input_file(model, requests)
    t0 = time.perf_counter()
    upload = store.create_file(ANONYMOUS, content, "bench.jsonl")
    batch = store.create_batch(
        ANONYMOUS, upload.id, ENDPOINT, "24h", None, lambda m: "batch" if m == model else None
    )
    accepted_s = time.perf_counter() - t0
    if batch.request_counts.failed:
        raise RuntimeError(f"bench batch has {batch.request_counts.failed} failed lines")
    t1 = time.perf_counter()
    _release(store, model, workers, claim_size)
    released_s = time.perf_counter() - t1
    t2 = time.perf_counter()
    closed = [status for batch_id, status in store.finalize() if batch_id == batch.id]
    finalize_s = time.perf_counter() - t2
    if closed != ["completed"]:
        raise RuntimeError(f"bench batch did not complete: {closed}")
    return BatchBenchRow(
        store.backend,
        workers,
        requests,
        requests / accepted_s,
        requests / released_s,
        finalize_s,
    )


@dataclass(frozen=True)
class ReleaseBenchRow:
    backend: str
    repetition: int
    #: ``complete`` (one transaction per answer) or ``complete_many``
    mode: str
    requests: int
    released_per_s: float


RELEASE_MODES = ("complete", "complete_many")


def _release_one(
    store: BatchStore, model: str, claim_size: int, mode: str, flush_size: int
) -> None:
    """Claim everything queued for ``model`` and record an instant answer for each."""
    owner = f"bench-{mode}"
    pending: list[Answer] = []
    while got := store.claim(model, claim_size, owner, 600.0):
        for request in got:
            if mode == "complete":
                store.complete(request.id, owner, 200, {"choices": [], "custom": 1})
                continue
            pending.append(Answer(request.id, 200, {"choices": [], "custom": 1}))
            if len(pending) >= flush_size:
                store.complete_many(owner, pending)
                pending = []
    if pending:
        store.complete_many(owner, pending)


def bench_release(
    store: BatchStore, requests: int, claim_size: int, flush_size: int, repeats: int
) -> list[ReleaseBenchRow]:
    """Per repetition, ``requests`` requests released with each mode (alternating which
    goes first); each run queues its own batch under a model of its own."""
    rows: list[ReleaseBenchRow] = []
    for rep in range(repeats):
        order = RELEASE_MODES if rep % 2 == 0 else RELEASE_MODES[::-1]
        for mode in order:
            model = f"bench-{uuid.uuid4().hex[:12]}"
            upload = store.create_file(ANONYMOUS, input_file(model, requests), "bench.jsonl")
            batch = store.create_batch(ANONYMOUS, upload.id, ENDPOINT, "24h", None, _tier_of(model))
            t0 = time.perf_counter()
            _release_one(store, model, claim_size, mode, flush_size)
            seconds = time.perf_counter() - t0
            counts = store.get_batch(ANONYMOUS, batch.id).request_counts
            if counts.completed != requests:
                raise RuntimeError(f"{mode}: {counts.completed} of {requests} completed")
            rows.append(ReleaseBenchRow(store.backend, rep, mode, requests, requests / seconds))
    return rows


def _tier_of(model: str) -> Callable[[str], str | None]:
    """``known_models`` for a bench batch: only ``model``, as batch work."""
    return lambda m: "batch" if m == model else None


def _spread(values: list[float], fmt: str) -> str:
    med = statistics.median(values)
    return f"{med:{fmt}} ({min(values):{fmt}} – {max(values):{fmt}})"


def bench_release_command(
    requests: int,
    claim_size: int,
    flush_size: int,
    repeats: int,
    postgres_url: str | None,
    console: Console,
) -> list[ReleaseBenchRow]:
    """``--release-compare``: released req/s with ``complete`` and with ``complete_many``
    on SQLite (a temporary file) and, given its URL, on PostgreSQL; print the median
    (min – max) of each and of the per-repetition ratio, return the rows."""
    rows: list[ReleaseBenchRow] = []
    for store in _stores(requests, postgres_url):
        rows += bench_release(store, requests, claim_size, flush_size, repeats)
    table = Table(
        title=f"sageserve bench batch --release-compare: {requests} requests per run, claims "
        f"of {claim_size}, complete_many every {flush_size} answers, {repeats} repetitions; "
        "median (min – max)"
    )
    for column in ("database", "complete req/s", "complete_many req/s", "ratio"):
        table.add_column(column, justify="right")
    for backend in dict.fromkeys(row.backend for row in rows):
        rate: dict[str, dict[int, float]] = {mode: {} for mode in RELEASE_MODES}
        for row in rows:
            if row.backend == backend:
                rate[row.mode][row.repetition] = row.released_per_s
        each, many = rate["complete"], rate["complete_many"]
        table.add_row(
            backend,
            _spread(list(each.values()), ",.0f"),
            _spread(list(many.values()), ",.0f"),
            _spread([many[r] / each[r] for r in each], ".2f") + "×",
        )
    console.print(table)
    if not postgres_url:
        console.print(
            "PostgreSQL: pass --postgres-url, or run `python -m e2e.bench_batch "
            "--release-compare` (starts a throwaway server)"
        )
    return rows


def _stores(requests: int, postgres_url: str | None) -> Iterator[BatchStore]:
    """A queue on SQLite (a temporary file), then, given its URL, on PostgreSQL; each
    closed once the caller has measured it."""
    with tempfile.TemporaryDirectory(prefix="sageserve-bench-batch-") as tmp:
        urls = [f"sqlite:///{Path(tmp) / 'queue.db'}"]
        if postgres_url:
            urls.append(postgres_url)
        for url in urls:
            store = BatchStore.open(url, max_requests=max(requests, 1))
            try:
                yield store
            finally:
                store.close()


def bench_batch_command(
    requests: int,
    workers: list[int],
    claim_size: int,
    postgres_url: str | None,
    console: Console,
) -> list[BatchBenchRow]:
    """Run the bench on SQLite (a temporary file) and, given its URL, on PostgreSQL;
    print the table and return the rows."""
    rows: list[BatchBenchRow] = []
    for store in _stores(requests, postgres_url):
        rows += [bench_store(store, requests, n, claim_size) for n in workers]
    table = Table(
        title=f"sageserve bench batch: {requests} requests per run, claims of {claim_size}"
    )
    for column in ("database", "workers", "accepted req/s", "released req/s", "finalize s"):
        table.add_column(column, justify="right")
    for row in rows:
        table.add_row(
            row.backend,
            str(row.workers),
            f"{row.accepted_per_s:,.0f}",
            f"{row.released_per_s:,.0f}",
            f"{row.finalize_s:.2f}",
        )
    console.print(table)
    if not postgres_url:
        console.print(
            "PostgreSQL: pass --postgres-url, or run `python -m e2e.bench_batch` (starts a "
            "throwaway server)"
        )
    return rows
