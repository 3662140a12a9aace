"""`sageserve load`: a trace replayed over HTTP, bounded, to this machine only."""

from __future__ import annotations

import asyncio
import gzip
from pathlib import Path

import pytest
from aiohttp import web

from sageserve.commands.load import NotLocal, replay, require_loopback


@pytest.mark.parametrize("url", ["http://127.0.0.1:8080", "http://localhost:1", "http://[::1]:9"])
def test_loopback_targets_are_allowed(url: str) -> None:
    require_loopback(url)


@pytest.mark.parametrize("url", ["http://10.0.0.1:8080", "http://192.168.1.10", "http://8.8.8.8"])
def test_any_other_address_is_refused_before_anything_is_sent(url: str) -> None:
    with pytest.raises(NotLocal, match="only sends to loopback"):
        require_loopback(url)


def test_a_trace_is_replayed_with_its_sizes_until_the_count_bound(tmp_path: Path) -> None:
    trace = tmp_path / "trace.csv.gz"
    rows = [f"2023-11-16 18:15:46.{i:06d},{100 + i},{5 + i}" for i in range(10)]
    with gzip.open(trace, "wt") as f:
        f.write("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "\n".join(rows) + "\n")
    got: list[int] = []

    async def pod(request: web.Request) -> web.Response:
        got.append((await request.json())["max_tokens"])
        return web.Response(text="data: [DONE]\n\n", content_type="text/event-stream")

    async def main() -> None:
        app = web.Application()
        app.router.add_post("/v1/completions", pod)
        runner = web.AppRunner(app)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        url = f"http://127.0.0.1:{runner.addresses[0][1]}"
        try:
            tally = await replay(url, trace, "m", {}, 1.0, None, 4, 30.0, 512)
        finally:
            await runner.cleanup()
        assert dict(tally.codes) == {200: 4} and tally.errors == 0

    asyncio.run(main())
    assert sorted(got) == [5, 6, 7, 8]  # the first four rows' output sizes, then it stopped
