"""Domain types shared by the simulator, the operator and the policy code.

Everything here is a plain dataclass or enum: no I/O, no clock, no Kubernetes, so the same
values flow through `sageserve simulate` and the live operator.
"""

from sageserve.core.types import (
    ActionKind,
    EndpointKey,
    EndpointObservation,
    GpuType,
    InstanceState,
    Region,
    Request,
    ScalingAction,
    Tier,
    TierKind,
)

__all__ = [
    "ActionKind",
    "EndpointKey",
    "EndpointObservation",
    "GpuType",
    "InstanceState",
    "Region",
    "Request",
    "ScalingAction",
    "Tier",
    "TierKind",
]
