"""Each simulated instance's running interactive requests, on the decision step's snapshot.

Why: Chiron's interactive backpressure (`pace.chiron`) counts the instances running at
least one interactive request. The operator reads it from the routers' per-pod gauge
(`sageserve_router_pod_interactive_in_flight`: sent and not answered); the simulator counts
the same of its instances (queued there or running). Only for strategies that declare
`uses_interactive_busy`, so other runs pay nothing.
"""

from __future__ import annotations

from dataclasses import replace

from sageserve.core.snapshot import EndpointSnapshot
from sageserve.sim.cluster import Endpoint


def with_interactive_running(ep: Endpoint, snap: EndpointSnapshot) -> EndpointSnapshot:
    """`snap` with each reporting instance's count of running interactive requests."""
    by_id = {i.id: i for d in ep.deployments for i in d.instances}
    views = tuple(
        replace(v, interactive_running=inst.interactive_running())
        if (inst := by_id.get(v.name)) is not None
        else v
        for v in snap.instances
    )
    return replace(snap, instances=views)
