"""The routing rules a ScalingPolicy sets (`spec.routing`, `spec.instanceScheduling`), as
both worlds apply them.

One mapping from the CRD's fields to the rules' parameters, used by the simulator
(`sim.scenario`: `SimConfig.route_threshold`, `SimConfig.release_rules`,
`SimConfig.instance_scheduling`) and by `sageserve router` (`router.discovery`:
`ModelRoute.route_threshold`, `ModelRoute.release_rules`,
`ModelRoute.instance_scheduling`), so that a policy whose thresholds a team changes routes,
releases and orders the same in both (as `pace.from_policy` does for the pacing strategy).
"""

from __future__ import annotations

from sageserve.api.scaling_policy import ScalingPolicySpec
from sageserve.dispatch.instance_order import FCFS, InstanceScheduling, OrderPolicy
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


def instance_scheduling_of(spec: ScalingPolicySpec) -> InstanceScheduling:
    """`spec.instanceScheduling`: the order each instance admits waiting interactive
    requests in (SageServe v3 §6.5; `dispatch.instance_order`). The simulator's instances
    sort their queue by it; on Kubernetes the router sends each request's `priority` by it
    and the pod sets run vLLM with `--scheduling-policy priority` unless it is FCFS."""
    s = spec.instance_scheduling
    rule = InstanceScheduling(
        OrderPolicy(s.policy.value),
        expired_after_s=s.expired_after_seconds,
        urgent_within_s=s.urgent_within_seconds,
    )
    return FCFS if rule == FCFS else rule
