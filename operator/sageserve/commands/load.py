"""`sageserve load`: replay a trace over HTTP against a router, bounded and local.

Each row of an Azure LLM inference trace (2023 format: timestamp, prompt and output tokens)
becomes one OpenAI request at its time ÷ `--speed` (or at `--rate` requests/s): a prompt of
that many tokens (≈ 4 characters each), `max_tokens` = the row's output, streamed, with the
tier and region headers given. The run stops after `--max-requests` or `--seconds`,
whichever comes first, and sends only to addresses on this machine (loopback): a load test
never reaches anything else. It prints the status codes, errors and TTFT percentiles.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import aiohttp
from rich.console import Console
from rich.table import Table

from sageserve.core.percentile import percentile
from sageserve.sim.traces import azure2023_rows


class NotLocal(ValueError):
    """The target is not an address of this machine."""


def require_loopback(url: str) -> None:
    """Refuse a target that does not resolve to a loopback address only."""
    host = urlsplit(url).hostname or ""
    try:
        infos = socket.getaddrinfo(host, None)
    except socket.gaierror as exc:
        raise NotLocal(f"--url: cannot resolve {host!r}: {exc}") from None
    addresses = {str(info[4][0]) for info in infos}
    if not addresses or not all(ipaddress.ip_address(a).is_loopback for a in addresses):
        raise NotLocal(
            f"--url: {host} is not this machine ({', '.join(sorted(addresses))}); the load "
            "generator only sends to loopback addresses (127.0.0.0/8, ::1)"
        )


@dataclass
class Tally:
    codes: Counter[int] = field(default_factory=Counter)
    ttft: list[float] = field(default_factory=list)
    errors: int = 0


async def _send(
    session: aiohttp.ClientSession,
    url: str,
    model: str,
    prompt: int,
    output: int,
    headers: dict[str, str],
    tally: Tally,
) -> None:
    body = {
        "model": model,
        "prompt": "x " * max(1, prompt // 2),
        "max_tokens": output,
        "stream": True,
    }
    started = time.monotonic()
    try:
        async with session.post(
            url.rstrip("/") + "/v1/completions", json=body, headers=headers
        ) as resp:
            first = True
            async for _ in resp.content.iter_any():
                if first:
                    tally.ttft.append(time.monotonic() - started)
                    first = False
            tally.codes[resp.status] += 1
    except (aiohttp.ClientError, TimeoutError):
        tally.errors += 1


async def replay(
    url: str,
    trace: Path,
    model: str,
    headers: dict[str, str],
    speed: float,
    rate: float | None,
    max_requests: int,
    seconds: float,
    max_output: int,
) -> Tally:
    """Send the trace's requests on its schedule until a bound is reached."""
    require_loopback(url)
    tally = Tally()
    timeout = aiohttp.ClientTimeout(total=seconds + 60)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        tasks: list[asyncio.Task[None]] = []
        start = time.monotonic()
        first_t: float | None = None
        for i, row in enumerate(azure2023_rows(trace)):
            if i >= max_requests:
                break
            first_t = row.t if first_t is None else first_t
            at = i / rate if rate else (row.t - first_t) / speed
            if at > seconds:
                break
            delay = start + at - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            out = max(1, min(row.output, max_output))
            tasks.append(
                asyncio.create_task(_send(session, url, model, row.prompt, out, headers, tally))
            )
        await asyncio.gather(*tasks)
    return tally


def load_command(
    url: str,
    trace: Path,
    model: str,
    headers: dict[str, str],
    speed: float,
    rate: float | None,
    max_requests: int,
    seconds: float,
    max_output: int,
    console: Console,
) -> Tally:
    tally = asyncio.run(
        replay(url, trace, model, headers, speed, rate, max_requests, seconds, max_output)
    )
    table = Table(title=f"sageserve load → {url}")
    for col in ("requests", "status codes", "errors", "TTFT p50 s", "TTFT p95 s"):
        table.add_column(col, justify="right")

    def pct(q: int) -> str:
        return f"{percentile(tally.ttft, q):.3f}" if tally.ttft else "-"

    codes = ", ".join(f"{c}: {n}" for c, n in sorted(tally.codes.items()))
    table.add_row(
        str(sum(tally.codes.values()) + tally.errors), codes, str(tally.errors), pct(50), pct(95)
    )
    console.print(table)
    return tally
