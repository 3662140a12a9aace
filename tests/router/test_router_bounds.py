"""What a client can make the router hold: label series, held requests, body bytes.

Header values used to become metric labels (40 random regions, 40 new series), and held
requests and their bodies were unbounded (12 held 7 MiB requests: +190 MB). Each is now
bounded by configuration, and what is refused is a 429 a client can retry."""

from __future__ import annotations

import asyncio
import json
import random
import resource
import string
import sys

from prometheus_client.parser import text_string_to_metric_families

from tests.router.test_router_http import body, run, sample

HELD = dict(namespace="llm", model_deployment="llama", region="us-east")


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20


async def series(client, url) -> set[tuple[str, frozenset[tuple[str, str]]]]:  # type: ignore[no-untyped-def]
    async with client.get(f"{url}/metrics") as r:
        text = await r.text()
    return {
        (s.name, frozenset(s.labels.items()))
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_random_region_and_tier_headers_add_no_metric_series() -> None:
    async def scenario(client, url, fleet, pods, metrics) -> None:  # type: ignore[no-untyped-def]
        async with client.post(f"{url}/v1/completions", json=body()) as r:
            assert r.status == 200
        before = await series(client, url)
        rng = random.Random(7)
        for i in range(40):
            junk = "".join(rng.choices(string.ascii_lowercase + "-", k=12))
            header = "x-sageserve-region" if i % 2 == 0 else "x-sageserve-tier"
            async with client.post(
                f"{url}/v1/completions", json=body(), headers={header: junk}
            ) as r:
                assert r.status == 400
                error = (await r.json())["error"]
                assert error["param"] == header
                if header == "x-sageserve-region":  # names what may be sent
                    assert "use one of us-east, us-west" in error["message"]
        assert await series(client, url) == before  # not one new series
        # a region the model serves is still honoured
        async with client.post(
            f"{url}/v1/completions", json=body(), headers={"x-sageserve-region": "us-west"}
        ) as r:
            assert (await r.json())["pod"] == "west-0"

    run(scenario, {"east-0": ("us-east", False), "west-0": ("us-west", False)})


def test_past_max_held_requests_a_model_from_zero_answers_429_and_the_held_are_served() -> None:
    async def scenario(client, url, fleet, pods, metrics) -> None:  # type: ignore[no-untyped-def]
        ready = [b for bs in fleet.backends.values() for b in bs]
        fleet.set_backends([])
        waiting = [
            asyncio.ensure_future(client.post(f"{url}/v1/completions", json=body()))
            for _ in range(5)
        ]
        refused = []
        for _ in range(200):
            refused = [t for t in waiting if t.done()]
            if len(refused) == 3 and sample(metrics, "sageserve_router_held_requests", **HELD) == 2:
                break
            await asyncio.sleep(0.02)
        assert len(refused) == 3
        for t in refused:
            r = t.result()
            assert r.status == 429 and r.headers["Retry-After"] == "30"
            error = (await r.json())["error"]
            assert (
                error["code"] == "max_held_requests" and "--max-held-requests 2" in error["message"]
            )
        limit = dict(limit="max_held_requests")
        assert sample(metrics, "sageserve_router_refused_requests_total", **limit) == 3
        fleet.set_backends(ready)  # the operator scaled 0 → 1
        for t in waiting:
            if t not in refused:
                assert (await t).status == 200
        assert len(pods["east-0"].got) == 2

    run(scenario, {"east-0": ("us-east", False)}, max_held_requests=2)


def test_twelve_held_7_mib_requests_cost_no_more_than_the_byte_limit() -> None:
    """12 requests of 7 MiB for a model at zero, with --max-inflight-bytes 32 MiB: four
    are held (28 MiB), eight are 429 before their bodies are read; when a pod comes the
    four are served whole."""
    payload = json.dumps(body(prompt="x" * (7 * 2**20))).encode()  # one copy, client side
    headers = {"Content-Type": "application/json"}

    async def scenario(client, url, fleet, pods, metrics) -> None:  # type: ignore[no-untyped-def]
        ready = [b for bs in fleet.backends.values() for b in bs]
        fleet.set_backends([])
        start_rss = rss_mb()
        waiting = [
            asyncio.ensure_future(
                client.post(f"{url}/v1/completions", data=payload, headers=headers)
            )
            for _ in range(12)
        ]
        for _ in range(500):
            done = [t for t in waiting if t.done()]
            if len(done) == 8 and sample(metrics, "sageserve_router_held_requests", **HELD) == 4:
                break
            await asyncio.sleep(0.02)
        held_rss = rss_mb()
        done = [t for t in waiting if t.done()]
        assert len(done) == 8
        for t in done:
            r = t.result()
            assert r.status == 429 and r.headers["Retry-After"] == "5"
            assert (await r.json())["error"]["code"] == "max_inflight_bytes"
        inflight = sample(metrics, "sageserve_router_inflight_body_bytes")
        assert 4 * 7 * 2**20 < inflight <= 32 * 2**20
        fleet.set_backends(ready)
        for t in waiting:
            if t not in done:
                assert (await t).status == 200
        assert len(pods["east-0"].got) == 4
        assert all(len(got["prompt"]) == 7 * 2**20 for got in pods["east-0"].got)
        assert sample(metrics, "sageserve_router_inflight_body_bytes") == 0
        refused = sample(
            metrics, "sageserve_router_refused_requests_total", limit="max_inflight_bytes"
        )
        assert refused == 8
        print(
            f"\nbounds: 12 x 7 MiB for a model at zero, limit 32 MiB: 4 held, 8 refused; "
            f"RSS {start_rss:.0f} MB before, {held_rss:.0f} MB while held "
            f"(+{held_rss - start_rss:.0f} MB, client and stand-in pod in the same process)",
            file=sys.stderr,
        )

    run(
        scenario,
        {"east-0": ("us-east", False)},
        max_body_bytes=8 * 2**20,
        max_inflight_bytes=32 * 2**20,
        hold_seconds=30.0,
    )
