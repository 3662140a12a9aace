"""Per-endpoint load for the region router, read from Prometheus every few seconds.

The same per-pod readings the operator's decision step uses (`PrometheusReader.pod_loads`),
aggregated the same way (`fleet.endpoint_load`). Prometheus away: the last reading stays,
and the router's own in-flight accounting keeps correcting it.
"""

from __future__ import annotations

import asyncio
import logging

from sageserve.metrics.prometheus import MetricsUnavailable, PrometheusReader
from sageserve.router.fleet import Fleet, endpoint_load

log = logging.getLogger("sageserve.router")


async def refresh_load(
    fleet: Fleet, reader: PrometheusReader, namespaces: list[str], every_s: float
) -> None:
    loop = asyncio.get_running_loop()
    while True:
        pods: dict[str, tuple[float, float | None]] = {}
        waiting: dict[str, int] = {}
        try:
            for ns in namespaces:
                loads = await loop.run_in_executor(None, reader.pod_loads, ns)
                pods.update({p: (x.kv_usage, x.kv_capacity_tokens) for p, x in loads.items()})
                waiting.update({p: x.waiting for p, x in loads.items()})
        except MetricsUnavailable as exc:
            log.warning("load not refreshed: %s", exc)
        else:
            backends = [b for bs in fleet.backends.values() for b in bs]
            fleet.set_pod_loads(pods)
            fleet.set_pod_waiting(waiting)
            fleet.set_load(endpoint_load(pods, backends))
        await asyncio.sleep(every_s)
