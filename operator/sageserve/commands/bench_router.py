"""`sageserve bench router`: what the router adds to a request's latency, and its memory.

The router runs in its own process pinned to one core (as in a pod with 1 CPU), in front
of stand-in vLLM pods that stream their answer at once; the load generator and the pods
share the other cores. Open-loop arrivals at each rate, every request streamed:

- *added latency*: (router in → pod in) is measured as (client sent → pod in) through the
  router minus the same without it, at the same rate: P50 and P99 of each, and the
  difference of the P99s;
- *first-token pass-through*: (pod sent its first chunk → client got it) through the
  router, against direct;
- the router's peak RSS (VmHWM).

Figures are printed, never asserted: machines are noisy, so the comparison that matters is
the ratio in one run. Everything stays on loopback and stops by itself.
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing as mp
import os
import time
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiohttp import web
from rich.console import Console
from rich.table import Table

from sageserve.core.percentile import percentile
from sageserve.router.app import Router, RouterConfig, run_loop, serve
from sageserve.router.fleet import Backend, Fleet, ModelRoute
from sageserve.router.metrics import RouterMetrics

MODEL = ModelRoute("bench", "m", "bench-model", ("r1",), ("iw-f",))


def _pin(core: int) -> None:
    if hasattr(os, "sched_setaffinity") and core < (os.cpu_count() or 1):
        os.sched_setaffinity(0, {core})


def _router_main(pods: list[str], port_queue: Any, loop: str) -> None:
    """The router process: a static fleet of `pods` (base URLs), one core."""
    _pin(0)

    async def main() -> None:
        fleet = Fleet()
        fleet.set_models([MODEL])
        fleet.set_backends(
            Backend("bench", f"pod-{i}", "m", "r1", "v", url) for i, url in enumerate(pods)
        )

        async def ready(port: int) -> None:
            port_queue.put(port)

        await serve(Router(fleet, RouterConfig(), RouterMetrics()), "127.0.0.1", 0, ready)

    run_loop(main(), loop)


@dataclass
class Sample:
    pod_in: float  # pod in - client sent
    first_chunk: float  # client got the first chunk - pod sent it


async def _pod(request: web.Request) -> web.StreamResponse:
    arrived = time.monotonic()
    body = await request.json()
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    chunk = {"pod_in": arrived - body["sent"], "first_out": time.monotonic()}
    await response.write(f"data: {json.dumps(chunk)}\n\n".encode())
    await response.write(b"data: [DONE]\n\n")
    return response


async def _start_pods(n: int) -> tuple[list[web.AppRunner], list[str]]:
    runners, urls = [], []
    for _ in range(n):
        app = web.Application()
        app.router.add_post("/v1/completions", _pod)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        runners.append(runner)
        urls.append(f"http://127.0.0.1:{runner.addresses[0][1]}")
    return runners, urls


async def _one(session: aiohttp.ClientSession, url: str, out: list[Sample]) -> None:
    body = {"model": MODEL.served_name, "prompt": "x", "max_tokens": 1, "stream": True}
    body["sent"] = time.monotonic()
    try:
        async with session.post(url + "/v1/completions", json=body) as resp:
            async for line in resp.content:
                if line.startswith(b"data: {"):
                    got = time.monotonic()
                    chunk = json.loads(line[6:])
                    out.append(Sample(chunk["pod_in"], got - chunk["first_out"]))
                    break
            await resp.read()
    except aiohttp.ClientError:
        pass


async def _load(url: str, rate: float, seconds: float) -> tuple[list[Sample], int]:
    out: list[Sample] = []
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        tasks = []
        start = time.monotonic()
        n = int(rate * seconds)
        for i in range(n):
            delay = start + i / rate - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(_one(session, url, out)))
        await asyncio.gather(*tasks)
    return out, n


def _rss_peak_mb(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


async def _measure(url: str, rate: float, seconds: float) -> dict[str, Any]:
    samples, sent = await _load(url, rate, seconds)
    pod_in = [s.pod_in * 1000 for s in samples]
    first = [s.first_chunk * 1000 for s in samples]
    return {
        "sent": sent,
        "answered": len(samples),
        "pod_in_p50_ms": percentile(pod_in, 50),
        "pod_in_p99_ms": percentile(pod_in, 99),
        "first_chunk_p50_ms": percentile(first, 50),
        "first_chunk_p99_ms": percentile(first, 99),
    }


def _loops() -> tuple[str, ...]:
    """asyncio, and uvloop when it is installed."""
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return ("asyncio",)
    return ("asyncio", "uvloop")


def bench_router_command(
    rates: list[float], seconds: float, pods: int, console: Console
) -> dict[str, Any]:
    """Run the benchmark and print its table; returns the figures. The router is measured
    with each event loop in the same run, so the two compare on the same machine state."""

    async def main() -> dict[str, Any]:
        _pin(1)
        runners, urls = await _start_pods(pods)
        ctx = mp.get_context("spawn")
        results: dict[str, Any] = {"rates": {rate: {} for rate in rates}, "rss_peak_mb": {}}
        try:
            for rate in rates:
                results["rates"][rate]["direct"] = await _measure(urls[0], rate, seconds)
            for loop in _loops():
                ports = ctx.Queue()
                proc = ctx.Process(target=_router_main, args=(urls, ports, loop), daemon=True)
                proc.start()
                try:
                    port = await asyncio.get_running_loop().run_in_executor(
                        None, ports.get, True, 60
                    )
                    for rate in rates:
                        row = results["rates"][rate]
                        row[loop] = await _measure(f"http://127.0.0.1:{port}", rate, seconds)
                    results["rss_peak_mb"][loop] = _rss_peak_mb(proc.pid or 0)
                finally:
                    proc.terminate()
                    proc.join(10)
            return results
        finally:
            for r in runners:
                await r.cleanup()

    results = asyncio.run(main())
    table = Table(
        title=f"sageserve bench router: {pods} stand-in pods, streamed, {seconds:g} s per rate"
    )
    for col in (
        "req/s",
        "path",
        "answered",
        "→pod P50 ms",
        "→pod P99 ms",
        "added P99 ms",
        "1st chunk P50 ms",
        "1st chunk P99 ms",
    ):
        table.add_column(col, justify="right")
    for rate, row in results["rates"].items():
        for name in ("direct", *_loops()):
            r = row[name]
            added = r["pod_in_p99_ms"] - row["direct"]["pod_in_p99_ms"]
            table.add_row(
                f"{rate:g}",
                name if name == "direct" else f"via {name}",
                f"{r['answered']}/{r['sent']}",
                f"{r['pod_in_p50_ms']:.2f}",
                f"{r['pod_in_p99_ms']:.2f}",
                "" if name == "direct" else f"{added:.2f}",
                f"{r['first_chunk_p50_ms']:.2f}",
                f"{r['first_chunk_p99_ms']:.2f}",
            )
    console.print(table)
    rss = ", ".join(f"{loop} {mb:.0f} MB" for loop, mb in results["rss_peak_mb"].items())
    console.print(f"router peak RSS (one core, pinned): {rss}")
    return results
