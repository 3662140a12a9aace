"""Regions as clusters on the request path: two routers over real HTTP on loopback, each in
front of its own cluster's stand-in pods, the first with the second as the peer of us-west.

What a client sees is asserted: a request spilled from a full home region is answered by
the other cluster's pod, with its own key deciding the tenant there too; a forwarded
request is never forwarded back; a peer that fails before answering leaves the request to
this cluster's pods."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from sageserve.dispatch.tiers import TierMatch
from sageserve.router.app import Router, RouterConfig, run_loop
from sageserve.router.fleet import Backend, Fleet, ModelRoute
from sageserve.router.metrics import RouterMetrics
from sageserve.router.peers import FORWARDED_HEADER, PeerConfigError, parse_peers
from tests.router.test_router_http import Pod, start

MODEL = ModelRoute(
    "llm", "llama", "meta-llama/Llama-3.1-8B", ("us-east", "us-west"), ("iw-f", "niw")
)
KEY_A, KEY_B = "sk-team-a", "sk-team-b"
EAST, WEST = ("llm", "llama", "us-east"), ("llm", "llama", "us-west")


def _fleet(region: str, pod_url: str | None) -> Fleet:
    """One cluster's router view: the model in both regions, its own pod in `region`, keys
    required, team a's key listed for this namespace (team b's is another namespace's)."""
    fleet = Fleet(auth="required")
    fleet.set_models([MODEL])
    fleet.set_tiers(
        "llm",
        {
            "iw-f": TierMatch("iw-f", ("fast",), api_keys=(KEY_A,)),
            "niw": TierMatch("niw", batch=True),
        },
    )
    fleet.set_tiers("other", {"iw-f": TierMatch("iw-f", api_keys=(KEY_B,))})
    if pod_url is not None:
        fleet.set_backends([Backend("llm", f"{region}-0", "llama", region, "a100", pod_url)])
    return fleet


Scenario = Callable[
    [aiohttp.ClientSession, str, str, dict[str, Pod], Fleet, Fleet], Awaitable[None]
]


def run(scenario: Scenario, peer_down: bool = False, **east_config: Any) -> None:
    """Cluster east: pod east-0 and router A (home us-east, peer us-west -> router B).
    Cluster west: pod west-0 and router B (home us-west, peer us-east -> router A)."""

    async def main() -> None:
        runners: list[web.AppRunner] = []
        pods: dict[str, Pod] = {}
        urls: dict[str, str] = {}
        for name in ("east-0", "west-0"):
            pod = Pod(name)
            app = web.Application()
            app.router.add_post("/v1/completions", pod.completions)
            runner, port = await start(app)
            runners.append(runner)
            pods[name], urls[name] = pod, f"http://127.0.0.1:{port}"
        west = _fleet("us-west", urls["west-0"])
        east = _fleet("us-east", urls["east-0"])
        # B first, so A can name it; B names A as its own peer for us-east (the loop guard)
        b_app = web.Application()
        b_runner, b_port = await start(b_app)  # placeholder to learn a free port
        await b_runner.cleanup()
        b_url = "http://127.0.0.1:1" if peer_down else f"http://127.0.0.1:{b_port}"
        a_router = Router(
            east,
            RouterConfig(
                home_region="us-east", hold_seconds=2.0, peers={"us-west": b_url}, **east_config
            ),
            RouterMetrics(),
        )
        a_runner, a_port = await start(a_router.app())
        runners.append(a_runner)
        b_router = Router(
            west,
            RouterConfig(
                home_region="us-west",
                hold_seconds=2.0,
                peers={"us-east": f"http://127.0.0.1:{a_port}"},
            ),
            RouterMetrics(),
        )
        b_runner = web.AppRunner(b_router.app())
        await b_runner.setup()
        await web.TCPSite(b_runner, "127.0.0.1", b_port).start()
        runners.append(b_runner)
        try:
            async with aiohttp.ClientSession() as client:
                await scenario(
                    client,
                    f"http://127.0.0.1:{a_port}",
                    f"http://127.0.0.1:{b_port}",
                    pods,
                    east,
                    west,
                )
        finally:
            for r in runners:
                await r.cleanup()

    run_loop(main())


def body(**kw: Any) -> dict[str, Any]:
    return {"model": MODEL.served_name, "prompt": "hello", "max_tokens": 8, **kw}


def auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def test_a_full_home_region_spills_to_the_other_clusters_pod_with_the_callers_key() -> None:
    async def scenario(client, a, b, pods, east, west) -> None:  # type: ignore[no-untyped-def]
        async with client.post(f"{a}/v1/completions", json=body(), headers=auth(KEY_A)) as r:
            assert r.status == 200 and (await r.json())["pod"] == "east-0"  # home has room
        east.set_load({EAST: (0.95, 1000.0)})  # home past the 70 % spill threshold
        async with client.post(f"{a}/v1/completions", json=body(), headers=auth(KEY_A)) as r:
            assert r.status == 200, await r.text()
            assert (await r.json())["pod"] == "west-0"  # answered in the other cluster
            assert r.headers["x-sageserve-pod"] == "peer/us-west"
        assert len(pods["west-0"].got) == 1
        # streamed answers come through both routers as they are produced
        stream = body(stream=True)
        async with client.post(f"{a}/v1/completions", json=stream, headers=auth(KEY_A)) as r:
            assert r.status == 200
            events = [line async for line in r.content if line.startswith(b"data: ")]
        assert events[-1] == b"data: [DONE]\n" and b"west-0" in events[0]

    run(scenario)


def test_the_other_cluster_decides_the_tenant_from_the_callers_own_key() -> None:
    """Team b's key sees no llama here; forwarded, it would see none there either: the
    request is refused here (404, as for a model that does not exist), never sent on with
    another identity. With no key at all it is 401 here."""

    async def scenario(client, a, b, pods, east, west) -> None:  # type: ignore[no-untyped-def]
        east.set_load({EAST: (0.95, 1000.0)})
        async with client.post(f"{a}/v1/completions", json=body(), headers=auth(KEY_B)) as r:
            assert r.status == 404
        async with client.post(f"{a}/v1/completions", json=body()) as r:
            assert r.status == 401
        # at the peer itself, a forwarded request without a key is refused the same way
        async with client.post(
            f"{b}/v1/completions", json=body(), headers={FORWARDED_HEADER: "us-east"}
        ) as r:
            assert r.status == 401
        assert pods["west-0"].got == []

    run(scenario)


def test_a_forwarded_request_is_served_where_it_lands_never_sent_back() -> None:
    """West's pod gone: router B would forward us-west's traffic to us-east, but not a
    request router A forwarded; that one waits for a pod there and gets 503, and A's pod
    never sees it twice."""

    async def scenario(client, a, b, pods, east, west) -> None:  # type: ignore[no-untyped-def]
        west.set_backends([])
        headers = {**auth(KEY_A), FORWARDED_HEADER: "us-east"}
        async with client.post(f"{b}/v1/completions", json=body(), headers=headers) as r:
            assert r.status == 503 and (await r.json())["error"]["code"] == "model_starting"
        assert pods["east-0"].got == []
        async with client.post(f"{b}/v1/completions", json=body(), headers=auth(KEY_A)) as r:
            assert r.status == 200 and (await r.json())["pod"] == "east-0"  # B's own client

    run(scenario)


def test_a_peer_that_fails_before_answering_leaves_the_request_to_this_cluster() -> None:
    async def scenario(client, a, b, pods, east, west) -> None:  # type: ignore[no-untyped-def]
        east.set_load({EAST: (0.95, 1000.0)})
        async with client.post(f"{a}/v1/completions", json=body(), headers=auth(KEY_A)) as r:
            assert r.status == 200 and (await r.json())["pod"] == "east-0"
        east.set_backends([])  # nothing here either: an error naming the region
        async with client.post(f"{a}/v1/completions", json=body(), headers=auth(KEY_A)) as r:
            assert r.status == 502
            assert "the router of region us-west failed" in (await r.json())["error"]["message"]

    run(scenario, peer_down=True)


@pytest.mark.parametrize(
    ("values", "peers_or_error"),
    [
        (
            ["eu-west=https://router.eu-west.example.com/"],
            {"eu-west": "https://router.eu-west.example.com"},
        ),
        (["a=http://x:8080,b=https://y/prefix"], {"a": "http://x:8080", "b": "https://y/prefix"}),
        (["eu-west"], "expected REGION=URL"),
        (["EU=http://x"], "is not a DNS label"),
        (["eu=ftp://x"], "is not an http(s) URL"),
        (["eu=http://x?token=1"], "no query or fragment"),
        (["eu=http://x", "eu=http://y"], "one peer per region"),
    ],
)
def test_peers_are_region_equals_url(values: list[str], peers_or_error: Any) -> None:
    if isinstance(peers_or_error, dict):
        assert parse_peers(values) == peers_or_error
    else:
        with pytest.raises(
            PeerConfigError, match=peers_or_error.replace("(", r"\(").replace(")", r"\)")
        ):
            parse_peers(values)
