"""The Batch API through the router, released into the troughs by the Queue Manager.

Real HTTP on loopback: a client uploads a JSONL file and creates a batch on the router;
stand-in pods answer; the router's `BatchReleaser` runs SageServe §6.2's rule on the
router's EMU estimate. What the user sees is asserted: nothing reaches a pod while the
region is busy, the work runs once the region's EMU falls, the output and error files,
queue depth in the metrics, promotion of a request whose slack ran out regardless of load
(and not of one with a far deadline), the rate the queue's deadlines need, and a batch
whose deadline the model cannot meet even at maxInstances saying so.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from sageserve.batch import BatchStore
from sageserve.batch.api import BatchApi
from sageserve.batch.jsonl import request_tokens
from sageserve.dispatch.tiers import TierMatch
from sageserve.metrics.queries import BATCH_DEADLINE_NEED
from sageserve.router.app import Router, RouterConfig
from sageserve.router.fleet import Backend, Fleet, ModelRoute
from sageserve.router.metrics import RouterMetrics
from sageserve.router.release import BatchReleaser, ReleaseConfig
from tests.router.test_router_http import Pod, start

MODEL = ModelRoute("llm", "llama", "llama-8b", ("us-east",), ("iw-f", "niw"))
EAST = ("llm", "llama", "us-east")

Scenario = Callable[
    [aiohttp.ClientSession, str, Fleet, Pod, RouterMetrics, BatchStore], Awaitable[None]
]


def run(tmp_path: Path, scenario: Scenario, model: ModelRoute = MODEL) -> None:
    """A router with the Batch API on SQLite and its releaser, one stand-in pod."""

    async def main() -> None:
        pod = Pod("east-0")
        app = web.Application()
        app.router.add_post("/v1/chat/completions", pod.completions)
        pod_runner, pod_port = await start(app)
        fleet = Fleet()
        fleet.set_models([model])
        niw = TierMatch("niw", batch=True, deadline_s=86400.0)
        fleet.set_tiers("llm", {"iw-f": TierMatch("iw-f"), "niw": niw})
        fleet.set_backends(
            [Backend("llm", "east-0", "llama", "us-east", "a100", f"http://127.0.0.1:{pod_port}")]
        )
        fleet.set_load({EAST: (0.8, 1000.0)})  # busy: above the 60 % release threshold
        store = BatchStore.open(f"sqlite:///{tmp_path}/queue.db")
        metrics = RouterMetrics()
        router = Router(fleet, RouterConfig(), metrics)
        releaser = BatchReleaser(
            store, router, metrics, "replica-a", ReleaseConfig(signal_s=0.05, finalize_s=0.1)
        )
        router.extra_routes = BatchApi(
            store, fleet.batch_tier, accepted=releaser.accepted
        ).add_routes
        runner, port = await start(router.app())
        task = asyncio.create_task(releaser.run())
        try:
            async with aiohttp.ClientSession() as client:
                await scenario(client, f"http://127.0.0.1:{port}", fleet, pod, metrics, store)
        finally:
            task.cancel()
            await runner.cleanup()
            await pod_runner.cleanup()
            store.close()

    asyncio.run(main())


def request_line(custom_id: str, model: str = MODEL.served_name) -> str:
    return json.dumps(
        {
            "custom_id": custom_id,
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {"model": model, "messages": [{"role": "user", "content": custom_id}]},
        }
    )


async def submit(
    client: aiohttp.ClientSession, url: str, lines: list[str], window: str = "24h"
) -> dict[str, Any]:
    form = aiohttp.FormData()
    form.add_field("purpose", "batch")
    form.add_field("file", ("\n".join(lines) + "\n").encode(), filename="in.jsonl")
    async with client.post(f"{url}/v1/files", data=form) as r:
        assert r.status == 200, await r.text()
        file_id = (await r.json())["id"]
    body = {
        "input_file_id": file_id,
        "endpoint": "/v1/chat/completions",
        "completion_window": window,
    }
    async with client.post(f"{url}/v1/batches", json=body) as r:
        assert r.status == 200, await r.text()
        batch: dict[str, Any] = await r.json()
        return batch


async def until_closed(
    client: aiohttp.ClientSession, url: str, batch_id: str, seconds: float = 20.0
) -> dict[str, Any]:
    for _ in range(int(seconds / 0.05)):
        async with client.get(f"{url}/v1/batches/{batch_id}") as r:
            batch: dict[str, Any] = await r.json()
        if batch["status"] in ("completed", "failed", "expired", "cancelled"):
            return batch
        await asyncio.sleep(0.05)
    raise AssertionError(f"batch {batch_id} still {batch['status']}")


async def lines_of(client: aiohttp.ClientSession, url: str, file_id: str) -> list[dict[str, Any]]:
    async with client.get(f"{url}/v1/files/{file_id}/content") as r:
        assert r.status == 200
        return [json.loads(x) for x in (await r.text()).splitlines() if x.strip()]


def sample(metrics: RouterMetrics, name: str, **labels: str) -> float:
    return metrics.registry.get_sample_value(name, labels) or 0.0


def test_a_batch_waits_while_the_region_is_busy_and_runs_in_the_trough(tmp_path: Path) -> None:
    async def scenario(client, url, fleet, pod, metrics, store) -> None:  # type: ignore[no-untyped-def]
        lines = [request_line("a"), "{not json", request_line("b"), request_line("c", "gpt-9")]
        batch = await submit(client, url, lines)
        assert batch["request_counts"]["total"] == 4
        await asyncio.sleep(0.5)  # ten signals at 80 % EMU: nothing released
        assert pod.got == []
        queued = dict(namespace="llm", model_deployment="llama", tier="niw")
        assert sample(metrics, "sageserve_batch_queued_requests", **queued) == 2
        # the load received, for β: the two runnable lines' estimate (prompt ÷ 4 + budget)
        received = dict(namespace="llm", model_deployment="llama", region="us-east", tier="niw")
        per_line = len(json.dumps([{"role": "user", "content": "a"}])) / 4 + 256
        accepted = sample(metrics, "sageserve_batch_accepted_tokens_total", **received)
        assert accepted == 2 * per_line

        fleet.set_load({EAST: (0.3, 1000.0)})  # the trough
        done = await until_closed(client, url, batch["id"])
        assert done["status"] == "completed"
        assert sorted(b["messages"][0]["content"] for b in pod.got) == ["a", "b"]
        assert all(b.get("stream") is False for b in pod.got)  # read whole, never streamed
        output = await lines_of(client, url, done["output_file_id"])
        assert sorted(o["custom_id"] for o in output) == ["a", "b"]
        assert all(o["response"]["status_code"] == 200 for o in output)
        assert output[0]["response"]["body"]["pod"] == "east-0"
        errors = await lines_of(client, url, done["error_file_id"])
        messages = " ".join(e["error"]["message"] for e in errors)
        assert "line 2" in messages and "gpt-9" in messages
        served = dict(namespace="llm", model_deployment="llama", region="us-east", tier="niw")
        assert sample(metrics, "sageserve_router_requests_total", code="200", **served) == 2
        assert sample(metrics, "sageserve_batch_batches_closed_total", status="completed") == 1

    run(tmp_path, scenario)


def test_a_request_whose_slack_ran_out_runs_regardless_of_load_a_far_one_waits(
    tmp_path: Path,
) -> None:
    async def scenario(client, url, fleet, pod, metrics, store) -> None:  # type: ignore[no-untyped-def]
        fleet.set_load({EAST: (0.95, 1000.0)})  # never a trough
        far = await submit(client, url, [request_line("far")])
        # due in a minute: less slack than the 30 min promotion margin, promoted at once
        urgent = await submit(client, url, [request_line("urgent")], window="1m")
        done = await until_closed(client, url, urgent["id"])
        assert done["status"] == "completed"
        await asyncio.sleep(0.5)  # ten more rounds at 95 % EMU
        assert [b["messages"][0]["content"] for b in pod.got] == ["urgent"]
        async with client.get(f"{url}/v1/batches/{far['id']}") as r:
            waiting = await r.json()
        assert waiting["status"] == "in_progress"
        assert waiting["request_counts"] == {"total": 1, "completed": 0, "failed": 0}

    run(tmp_path, scenario)


def body_of(custom_id: str) -> dict[str, Any]:
    line: dict[str, Any] = json.loads(request_line(custom_id))
    return dict(line["body"])


def test_the_queue_exports_the_rate_its_deadlines_need(tmp_path: Path) -> None:
    async def scenario(client, url, fleet, pod, metrics, store) -> None:  # type: ignore[no-untyped-def]
        labels = dict(namespace="llm", model_deployment="llama")
        await until_metric(metrics, BATCH_DEADLINE_NEED, labels, lambda v: v == 0.0)
        await submit(client, url, [request_line("a"), request_line("b")])
        # the need: the two requests' tokens by their deadline, a day away
        tokens = request_tokens(body_of("a")) + request_tokens(body_of("b"))
        need = await until_metric(metrics, BATCH_DEADLINE_NEED, labels, lambda v: v > 0)
        assert tokens / 86400 <= need <= tokens / (86400 - 120)
        assert pod.got == []  # busy: nothing released, nothing promoted

    run(tmp_path, scenario)


async def until_metric(
    metrics: RouterMetrics,
    name: str,
    labels: dict[str, str],
    ready: Callable[[float], bool],
    seconds: float = 20.0,
) -> float:
    for _ in range(int(seconds / 0.05)):
        value = metrics.registry.get_sample_value(name, labels)
        if value is not None and ready(value):
            return value
        await asyncio.sleep(0.05)
    raise AssertionError(f"{name}{labels} never got there: {value}")


def test_a_batch_whose_deadline_cannot_be_met_says_so_until_the_model_can_meet_it(
    tmp_path: Path,
) -> None:
    async def scenario(client, url, fleet, pod, metrics, store) -> None:  # type: ignore[no-untyped-def]
        batch = await submit(client, url, [request_line("a"), request_line("b")])
        assert batch["deadline_at_risk"] is None
        at_risk = await until_field(client, url, batch["id"], lambda b: b["deadline_at_risk"])
        risk = at_risk["deadline_at_risk"]
        assert risk["model"] == MODEL.served_name
        assert risk["shortfall_tokens_per_second"] > 0
        assert at_risk["created_at"] <= risk["detected_at"] <= at_risk["expires_at"]
        labels = dict(namespace="llm", model_deployment="llama")
        assert sample(metrics, "sageserve_router_batch_deadline_at_risk", **labels) == 1
        assert pod.got == []  # still busy: nothing released, nothing promoted

        fleet.set_models([replace(MODEL, capacity_at_max_tps=1000.0)])  # maxInstances raised
        cleared = await until_field(
            client, url, batch["id"], lambda b: b["deadline_at_risk"] is None
        )
        assert cleared["status"] == "in_progress"
        assert sample(metrics, "sageserve_router_batch_deadline_at_risk", **labels) == 0
        assert sample(metrics, BATCH_DEADLINE_NEED, **labels) > 0

    # a thousandth of a token/s at maxInstances: a day of it is 86 tokens, less than the
    # two requests' 256-token budgets
    run(tmp_path, scenario, replace(MODEL, capacity_at_max_tps=0.001))


async def until_field(
    client: aiohttp.ClientSession,
    url: str,
    batch_id: str,
    ready: Callable[[dict[str, Any]], Any],
    seconds: float = 20.0,
) -> dict[str, Any]:
    for _ in range(int(seconds / 0.05)):
        async with client.get(f"{url}/v1/batches/{batch_id}") as r:
            batch: dict[str, Any] = await r.json()
        if ready(batch):
            return batch
        await asyncio.sleep(0.05)
    raise AssertionError(f"batch {batch_id} never got there: {batch}")
