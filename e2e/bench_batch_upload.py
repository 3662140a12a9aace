"""What one hostile upload costs a router replica: peak RSS growth and CPU seconds.

A file of ``--mib`` MiB of ``{}`` lines (3 bytes a line: far more lines than a batch may
hold) is uploaded to ``/v1/files`` and, if accepted, made a batch with ``/v1/batches``,
over HTTP on loopback against a ``BatchApi`` on a temporary SQLite queue, in this process.
The figures are this process's peak resident set (``ru_maxrss``) growth and its CPU time
(user + system) over the two calls, so run it as its own process:

    PYTHONPATH=operator python -m e2e.bench_batch_upload --mib 4
"""

from __future__ import annotations

import argparse
import asyncio
import resource
import tempfile
import time
from typing import Any

import aiohttp
from aiohttp import web

from sageserve.batch import BatchStore
from sageserve.batch.api import BatchApi


def _peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def _attack(url: str, content: bytes) -> dict[str, Any]:
    async with aiohttp.ClientSession() as client:
        form = aiohttp.FormData()
        form.add_field("purpose", "batch")
        form.add_field("file", content, filename="hostile.jsonl")
        async with client.post(f"{url}/v1/files", data=form) as r:
            upload = {"upload_status": r.status, "upload": await r.json()}
        if upload["upload_status"] != 200:
            return upload
        body = {"input_file_id": upload["upload"]["id"], "endpoint": "/v1/chat/completions"}
        async with client.post(f"{url}/v1/batches", json=body) as r:
            return {**upload, "batch_status": r.status}


async def main(mib: float) -> None:
    content = b"{}\n" * int(mib * 1024 * 1024 / 3)
    with tempfile.TemporaryDirectory() as tmp:
        store = BatchStore.open(f"sqlite:///{tmp}/queue.db")
        app = web.Application(client_max_size=2**30)
        BatchApi(store, lambda _model, _caller: "batch").add_routes(app)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        rss0, cpu0, t0 = _peak_rss_mib(), _cpu_s(), time.perf_counter()
        outcome = await _attack(f"http://127.0.0.1:{port}", content)
        rss1, cpu1, t1 = _peak_rss_mib(), _cpu_s(), time.perf_counter()
        await runner.cleanup()
        store.close()
    upload = outcome["upload"]
    said = upload.get("error", {}).get("message", "") if isinstance(upload, dict) else ""
    print(
        f"{len(content) / 2**20:.1f} MiB of {{}} lines: upload HTTP {outcome['upload_status']}"
        f", batch HTTP {outcome.get('batch_status', '-')}; peak RSS +{rss1 - rss0:.0f} MiB, "
        f"CPU {cpu1 - cpu0:.2f} s, wall {t1 - t0:.2f} s"
    )
    if said:
        print(f"  refused: {said}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=float, default=4.0)
    asyncio.run(main(parser.parse_args().mib))
