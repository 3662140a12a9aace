"""The release loop records answers in batches, on SQLite and PostgreSQL: when
``flush_size`` answers wait, ``flush_s`` after the first, and when it stops; the leases of
answered-but-unrecorded requests are renewed; a router killed before the flush loses
nothing (the requests run again once the leases lapse) and records nothing twice.

The router is a stand-in that answers at once (``Instant``), so only the queue and the
release loop are under test; `tests/router/test_batch_release.py` runs the real router.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any, cast

import pytest

from sageserve.batch import BatchStore
from sageserve.dispatch.tiers import TierMatch
from sageserve.router.app import Router, RouterConfig
from sageserve.router.fleet import Backend, Fleet, ModelRoute
from sageserve.router.metrics import RouterMetrics
from sageserve.router.release import BatchReleaser, ReleaseConfig
from tests.batch.conftest import ME, MODEL, REPO, jsonl, known_models, line, read_jsonl

ROUTE = ModelRoute("llm", "llama", MODEL, ("us-east",), ("niw",))
EAST = ("llm", "llama", "us-east")


class Instant:
    """The router as the releaser uses it, answering every request at once."""

    def __init__(self, owner: str, echo: bool = False) -> None:
        self.fleet = Fleet()
        self.fleet.set_models([ROUTE])
        self.fleet.set_tiers("llm", {"niw": TierMatch("niw", batch=True, deadline_s=86400.0)})
        self.fleet.set_backends(
            [Backend("llm", "east-0", "llama", "us-east", "a100", "http://127.0.0.1:9")]
        )
        self.fleet.set_load({EAST: (0.3, 1000.0)})  # a trough: 2 released per signal
        self.config = RouterConfig()
        self.owner = owner
        self.echo = echo
        self.answered: list[str] = []

    async def execute(
        self, path: str, body: dict[str, Any], model: ModelRoute, region: str, tier: str
    ) -> tuple[int, Any]:
        custom_id = body["messages"][0]["content"]
        self.answered.append(custom_id)
        if self.echo:
            print(custom_id, flush=True)
        return 200, {"by": self.owner, "custom": custom_id}


def releaser(store: BatchStore, owner: str, echo: bool = False, **config: Any) -> BatchReleaser:
    settings = {"signal_s": 0.05, "finalize_s": 3600.0, "sweep_s": 3600.0, **config}
    router = cast(Router, Instant(owner, echo))
    return BatchReleaser(store, router, RouterMetrics(), owner, ReleaseConfig(**settings))


def answered(worker: BatchReleaser) -> list[str]:
    return cast(Instant, worker.router).answered


def submit(store: BatchStore, n: int) -> str:
    upload = store.create_file(ME, jsonl([line(f"r{i}") for i in range(n)]), "in.jsonl")
    return store.create_batch(ME, upload.id, "/v1/chat/completions", known_models=known_models).id


async def until(check: Callable[[], Awaitable[bool]], seconds: float = 20.0) -> None:
    deadline = time.monotonic() + seconds
    while not await check():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.02)


def done(store: BatchStore) -> Callable[[], Awaitable[int]]:
    async def count() -> int:
        return (await asyncio.to_thread(store.state_counts))["done"]

    return count


def test_answers_are_recorded_by_the_flush_size_and_the_rest_when_it_stops(
    store: BatchStore,
) -> None:
    async def main() -> None:
        submit(store, 6)
        worker = releaser(store, "a", flush_size=4, flush_s=3600.0)
        task = asyncio.create_task(worker.run())
        recorded = done(store)

        async def all_answered() -> bool:
            return len(answered(worker)) == 6 and await recorded() >= 4

        # the first flush takes every answer in by the time it runs (4, or more when answers
        # came meanwhile); what is left is fewer than a flush and waits for four more
        await until(all_answered)
        flushed = await recorded()
        await asyncio.sleep(0.3)  # six signals more, no flush_s: nothing more is recorded
        assert await recorded() == flushed
        assert len(worker.unrecorded) == 6 - flushed < 4
        counts = await asyncio.to_thread(store.state_counts)
        assert counts["running"] == 6 - flushed and counts["queued"] == 0
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        assert await recorded() == 6 and worker.unrecorded == {}

    asyncio.run(main())


def test_answers_are_recorded_flush_s_after_the_first(store: BatchStore) -> None:
    async def main() -> None:
        submit(store, 3)
        worker = releaser(store, "a", flush_size=1000, flush_s=0.2)
        task = asyncio.create_task(worker.run())
        try:

            async def recorded() -> bool:
                return await done(store)() == 3

            await until(recorded)
            assert sorted(answered(worker)) == ["r0", "r1", "r2"] and worker.unrecorded == {}
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    asyncio.run(main())


@pytest.mark.slow
def test_leases_of_answers_waiting_for_the_flush_are_renewed(store: BatchStore) -> None:
    async def main() -> None:
        submit(store, 2)
        # a lease of 2 s renewed every 2/3 s: a loaded machine may delay one renewal, not three
        worker = releaser(store, "a", flush_size=1000, flush_s=3600.0, lease_s=2.0)
        task = asyncio.create_task(worker.run())

        async def both_answered() -> bool:
            return len(worker.unrecorded) == 2

        await until(both_answered)
        await asyncio.sleep(5.0)  # two and a half leases
        # still held: another replica gets nothing
        assert await asyncio.to_thread(store.claim, MODEL, 10, "b", 60) == []
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        assert await done(store)() == 2
        assert sorted(answered(worker)) == ["r0", "r1"]  # each ran once

    asyncio.run(main())


LEASE_S = 2.0
REQUESTS = 40

DOOMED = textwrap.dedent(
    """
    import asyncio, sys
    from sageserve.batch import BatchStore
    from tests.batch.test_release_flush import releaser

    store = BatchStore.open(sys.argv[1])
    worker = releaser(
        store, "doomed", echo=True, flush_size=int(sys.argv[2]), flush_s=3600.0,
        lease_s=float(sys.argv[3]),
    )
    asyncio.run(worker.run())
    """
)


def crash_before_the_flush(store_url: str, flush_size: int, answers_before_kill: int) -> None:
    """A router answers ``answers_before_kill`` requests and is killed (SIGKILL) with
    some or all of them unrecorded; another finishes the batch."""
    store = BatchStore.open(store_url)
    try:
        batch_id = submit(store, REQUESTS)
        doomed = subprocess.Popen(
            [sys.executable, "-c", DOOMED, store_url, str(flush_size), str(LEASE_S)],
            stdout=subprocess.PIPE,
            text=True,
            cwd=REPO,
        )
        assert doomed.stdout is not None
        ran = [doomed.stdout.readline().strip() for _ in range(answers_before_kill)]
        os.kill(doomed.pid, signal.SIGKILL)
        doomed.wait(timeout=30)
        assert all(ran)
        kept = store.state_counts()["done"]
        if flush_size > REQUESTS:  # nothing recorded: every answer lost with the process
            assert kept == 0 and len(ran) == REQUESTS

        time.sleep(LEASE_S + 0.5)  # the killed router's leases lapse

        async def finish() -> BatchReleaser:
            survivor = releaser(store, "survivor")
            task = asyncio.create_task(survivor.run())

            async def all_done() -> bool:
                return await done(store)() == REQUESTS

            await until(all_done)
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
            return survivor

        survivor = asyncio.run(finish())
        assert store.finalize() == [(batch_id, "completed")]
        result = store.get_batch(ME, batch_id)
        assert result.request_counts.to_openai() == {
            "total": REQUESTS,
            "completed": REQUESTS,
            "failed": 0,
        }
        assert result.output_file_id is not None
        output = read_jsonl(store.file_content(ME, result.output_file_id))
        custom = Counter(o["custom_id"] for o in output)
        assert custom == Counter(f"r{i}" for i in range(REQUESTS))  # each recorded once
        by = Counter(o["response"]["body"]["by"] for o in output)
        assert by["doomed"] == kept and by["survivor"] == REQUESTS - kept
        # what the killed router answered but never recorded ran again (at least once)
        assert len(answered(survivor)) == REQUESTS - kept
    finally:
        store.close()


@pytest.mark.slow
def test_a_router_killed_before_recording_its_answers_loses_none(store_url: str) -> None:
    crash_before_the_flush(store_url, flush_size=1000, answers_before_kill=REQUESTS)


@pytest.mark.slow
def test_a_router_killed_between_flushes_records_each_request_once(store_url: str) -> None:
    crash_before_the_flush(store_url, flush_size=8, answers_before_kill=REQUESTS // 2 + 3)
