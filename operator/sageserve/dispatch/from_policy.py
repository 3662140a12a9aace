"""The routing rules a ScalingPolicy sets (`spec.routing`), as both worlds apply them.

One mapping from the CRD's fields to the rules' parameters, used by the simulator
(`sim.scenario`: `SimConfig.route_threshold`, `SimConfig.release_rules`) and by
`sageserve router` (`router.discovery`: `ModelRoute.route_threshold`,
`ModelRoute.release_rules`), so that a policy whose thresholds a team changes routes and
releases the same in both (as `pace.from_policy` does for the pacing strategy).
"""

from __future__ import annotations

from sageserve.api.scaling_policy import ScalingPolicySpec
from sageserve.dispatch.queue_manager import ReleaseRules


def route_threshold_of(spec: ScalingPolicySpec) -> float:
    """`spec.routing.regionEmuThreshold`: the global router sends an interactive request to
    the first region, in preference order, whose EMU is under it, else to the least loaded
    region (SageServe §6.1, `dispatch.region_router.pick_region`)."""
    return spec.routing.region_emu_threshold


def release_rules_of(spec: ScalingPolicySpec) -> ReleaseRules:
    """`spec.routing.batchRelease` as `dispatch.queue_manager.release_count`'s rules, the most
    generous first: the Queue Manager releases 2 queued batch requests to an endpoint whose
    EMU is under `twoBelowEmu`, 1 under `oneBelowEmu`, none above (SageServe §6.2). The API
    server keeps `twoBelowEmu` below `oneBelowEmu`."""
    release = spec.routing.batch_release
    return ((release.two_below_emu, 2), (release.one_below_emu, 1))
