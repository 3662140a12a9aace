"""A router as `sageserve router` runs it, in a process of its own, for a hostile client.

`python -m tests.router.hostile_router '<json>'` builds a `Fleet` by hand (two tenants,
`required` keys), opens the Batch API on the store the JSON names, starts the releaser and
calls `app.serve` on a loopback port; it prints `port <n>` once it listens. The stand-in
pods run elsewhere (the parent passes their URLs), so this process's memory is the
router's alone. On standard input, `scale` lists the pod of the model that starts with
none (its held requests are then served) and answers `scaled`; end of input stops it.

The tenants: `team-a` serves `llama-8b` (tiers iw-f, iw-n, niw) and `cold-1b` (iw-f, no
pod until `scale`); its keys are `sk-a-fast` (iw-f), `sk-a-limited` (iw-n, 2 requests a
minute) and `sk-a-batch` (niw, the batch tier). `team-b` serves `qwen-7b` (iw-f, niw) to
its one key `sk-b`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import threading
from typing import Any

from sageserve.batch import BatchStore
from sageserve.batch.api import BatchApi
from sageserve.dispatch.rate_limit import Limits
from sageserve.dispatch.tiers import TierMatch
from sageserve.router.app import Router, RouterConfig, serve
from sageserve.router.fleet import Backend, Fleet, ModelRoute
from sageserve.router.metrics import RouterMetrics
from sageserve.router.release import BatchReleaser, ReleaseConfig

LLAMA = ModelRoute("team-a", "llama", "llama-8b", ("us-east", "us-west"), ("iw-f", "iw-n", "niw"))
COLD = ModelRoute("team-a", "cold", "cold-1b", ("us-east",), ("iw-f",))
QWEN = ModelRoute("team-b", "qwen", "qwen-7b", ("us-east",), ("iw-f", "niw"))
MODELS = (LLAMA, COLD, QWEN)
#: (model, region) of each stand-in pod the parent serves
PODS = (
    (LLAMA, "us-east"),
    (LLAMA, "us-west"),
    (QWEN, "us-east"),
    (COLD, "us-east"),
)
KEY_FAST, KEY_LIMITED, KEY_BATCH, KEY_B = "sk-a-fast", "sk-a-limited", "sk-a-batch", "sk-b"
RATE_LIMIT_RPM = 2
DAY = 86400.0


def fleet_of(pod_urls: dict[str, str]) -> tuple[Fleet, list[Backend], list[Backend]]:
    """The fleet with every pod but the cold model's; (fleet, listed, all pods)."""
    fleet = Fleet(auth="required")
    fleet.set_models(MODELS)
    fleet.set_tiers(
        "team-a",
        {
            "iw-f": TierMatch("iw-f", header_values=("interactive",), api_keys=(KEY_FAST,)),
            "iw-n": TierMatch(
                "iw-n",
                api_keys=(KEY_LIMITED,),
                limits=Limits(requests_per_minute=RATE_LIMIT_RPM),
            ),
            "niw": TierMatch("niw", batch=True, deadline_s=DAY, api_keys=(KEY_BATCH,)),
        },
    )
    fleet.set_tiers(
        "team-b",
        {
            "iw-f": TierMatch("iw-f", api_keys=(KEY_B,)),
            "niw": TierMatch("niw", batch=True, deadline_s=DAY, api_keys=(KEY_B,)),
        },
    )
    every = [
        Backend(
            m.namespace,
            f"{m.name}-{region}-0",
            m.name,
            region,
            "a100",
            pod_urls[pod_name(m, region)],
        )
        for m, region in PODS
    ]
    listed = [b for b in every if b.model_deployment != COLD.name]
    fleet.set_backends(listed)
    return fleet, listed, every


def pod_name(model: ModelRoute, region: str) -> str:
    return f"{model.name}-{region}"


async def run(spec: dict[str, Any]) -> None:
    fleet, _, every = fleet_of(spec["pods"])
    config = RouterConfig(
        body_timeout_seconds=spec["body_timeout_s"],
        hold_seconds=spec["hold_seconds"],
        max_held_requests=spec["max_held_requests"],
        max_inflight_bytes=spec["max_inflight_bytes"],
        eject_seconds=1.0,
    )
    metrics = RouterMetrics()
    metrics.watch(fleet)
    store = BatchStore.open(spec["store_url"])
    router = Router(fleet, config, metrics)
    releaser = BatchReleaser(
        store, router, metrics, "hostile", ReleaseConfig(signal_s=0.2, finalize_s=0.5)
    )
    router.extra_routes = BatchApi(
        store,
        fleet.batch_tier,
        deadlines=lambda tier: (fleet.batch_tiers().get(tier) or TierMatch("")).deadline_s,
        max_upload_bytes=spec["max_upload_bytes"],
        body_timeout_s=spec["body_timeout_s"],
        accepted=releaser.accepted,
        claim_bytes=router.claim_bytes,
    ).add_routes
    loop = asyncio.get_running_loop()
    stopped = asyncio.Event()
    tasks: list[asyncio.Task[None]] = []

    def scale() -> None:
        fleet.set_backends(every)
        print("scaled", flush=True)

    def commands() -> None:
        for command in sys.stdin:
            if command.strip() == "scale":
                loop.call_soon_threadsafe(scale)
        loop.call_soon_threadsafe(stopped.set)

    async def ready(port: int) -> None:
        tasks.append(asyncio.create_task(releaser.run()))
        print(f"port {port}", flush=True)
        threading.Thread(target=commands, daemon=True).start()

    server = asyncio.create_task(serve(router, "127.0.0.1", 0, ready))
    try:
        await stopped.wait()
    finally:
        for task in (*tasks, server):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        store.close()


if __name__ == "__main__":
    asyncio.run(run(json.loads(sys.argv[1])))
