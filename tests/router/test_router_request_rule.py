"""Hostile numbers and options over real HTTP: refused before anything is counted.

A `max_tokens` of NaN, Infinity or -1e12 used to reach the endpoint's EMU estimate (the
Queue Manager then released batch work into a busy endpoint) and the spill ledger (broken
until restart); `n` went uncounted. Each is now a 400 naming the field, and the fleet's
accounting is exactly as before the request."""

from __future__ import annotations

import math

from tests.router.test_router_http import body, run, sample

EAST = ("llm", "llama", "us-east")

#: (what the client sends, the field the 400 names)
HOSTILE: list[tuple[bytes, str]] = [
    (b'{"model": "meta-llama/Llama-3.1-8B", "prompt": "x", "max_tokens": NaN}', "max_tokens"),
    (b'{"model": "meta-llama/Llama-3.1-8B", "prompt": "x", "max_tokens": Infinity}', "max_tokens"),
    (b'{"model": "meta-llama/Llama-3.1-8B", "prompt": "x", "max_tokens": -1e12}', "max_tokens"),
    (b'{"model": "meta-llama/Llama-3.1-8B", "prompt": "x", "max_tokens": 1e15}', "max_tokens"),
    (b'{"model": "meta-llama/Llama-3.1-8B", "prompt": "x", "n": 0}', "n"),
    (b'{"model": "meta-llama/Llama-3.1-8B", "prompt": "x", "n": true}', "n"),
    (b'{"model": "meta-llama/Llama-3.1-8B", "prompt": "x", "temperature": 9}', "temperature"),
    (b'{"model": "meta-llama/Llama-3.1-8B", "prompt": "x", "stream": "yes"}', "stream"),
    (b'{"model": "meta-llama/Llama-3.1-8B", "prompt": "x", "stop": [1]}', "stop"),
    (b'{"model": "meta-llama/Llama-3.1-8B", "prompt": [NaN]}', "prompt"),
]


def test_hostile_numbers_are_400_naming_the_field_and_count_nothing() -> None:
    async def scenario(client, url, fleet, pods, metrics) -> None:  # type: ignore[no-untyped-def]
        fleet.set_load({EAST: (0.3, 1000.0)})
        before = (fleet.estimated_emu(EAST), dict(fleet.ledger._sent), dict(fleet.sent))
        for data, param in HOSTILE:
            async with client.post(f"{url}/v1/completions", data=data) as r:
                assert r.status == 400, data
                error = (await r.json())["error"]
                assert error["param"] == param, data
                assert error["type"] == "invalid_request_error"
                assert error["message"].startswith(param)
        after = (fleet.estimated_emu(EAST), dict(fleet.ledger._sent), dict(fleet.sent))
        assert after == before  # EMU, spill ledger and tokens sent: untouched
        assert math.isfinite(fleet.estimated_emu(EAST))
        assert all(not p.got for p in pods.values())
        labels = dict(namespace="llm", model_deployment="llama", region="us-east", tier="iw-f")
        assert sample(metrics, "sageserve_router_requests_total", code="400", **labels) == 0

    run(scenario, {"east-0": ("us-east", False)})


def test_a_body_the_json_reader_chokes_on_is_a_400_not_a_500() -> None:
    async def scenario(client, url, fleet, pods, metrics) -> None:  # type: ignore[no-untyped-def]
        for data in (b"[" * 100_000, b'{"model": "m", "seed": ' + b"9" * 5000 + b"}"):
            async with client.post(f"{url}/v1/completions", data=data) as r:
                assert r.status == 400
                assert "not JSON" in (await r.json())["error"]["message"]

    run(scenario, {"east-0": ("us-east", False)})


def test_n_choices_cost_n_output_budgets_in_the_emu_estimate() -> None:
    """Between two Prometheus readings the router adds what it sent: n = 8 is eight
    output budgets, so the Queue Manager sees the load the pod will carry."""

    async def scenario(client, url, fleet, pods, metrics) -> None:  # type: ignore[no-untyped-def]
        fleet.set_load({EAST: (0.0, 1000.0)})
        sent: list[float] = []
        real_start = fleet.start

        def start(backend, tokens):  # type: ignore[no-untyped-def]
            sent.append(tokens)
            real_start(backend, tokens)

        fleet.start = start  # type: ignore[method-assign]
        for n in (1, 8):
            async with client.post(f"{url}/v1/completions", json=body(max_tokens=100, n=n)) as r:
                assert r.status == 200
        prompt = len("hello") / 4
        assert sent == [prompt + 100, prompt + 800]

    run(scenario, {"east-0": ("us-east", False)})


def test_chat_and_completions_take_their_own_logprobs() -> None:
    async def scenario(client, url, fleet, pods, metrics) -> None:  # type: ignore[no-untyped-def]
        async with client.post(f"{url}/v1/chat/completions", json=body(logprobs=True)) as r:
            assert r.status == 200
        async with client.post(f"{url}/v1/completions", json=body(logprobs=True)) as r:
            assert r.status == 400 and (await r.json())["error"]["param"] == "logprobs"
        async with client.post(f"{url}/v1/completions", json=body(logprobs=5)) as r:
            assert r.status == 200

    run(scenario, {"east-0": ("us-east", False)})


def test_the_output_cap_is_the_routers_to_set() -> None:
    async def scenario(client, url, fleet, pods, metrics) -> None:  # type: ignore[no-untyped-def]
        async with client.post(f"{url}/v1/completions", json=body(max_tokens=4097)) as r:
            assert r.status == 400
            assert "from 1 to 4096" in (await r.json())["error"]["message"]
        async with client.post(f"{url}/v1/completions", json=body(max_tokens=4096)) as r:
            assert r.status == 200

    run(scenario, {"east-0": ("us-east", False)}, max_output_tokens=4096)
