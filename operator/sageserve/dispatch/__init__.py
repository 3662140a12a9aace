"""Where each request goes, as pure decisions: region (SageServe §6.1), instance (PreServe
§4.3.3), batch release and promotion (SageServe §6.2), pooled-model switching, identity,
tiers, rate limits and request checks.

Shared by the router (`router/`, the HTTP service that applies them) and the simulator:
inputs are loads the caller measured, outputs are choices. Nothing here reads a clock or
talks to a cluster. (Named apart from `router/` so the rule and the service that runs it
are not confused.)
"""

from sageserve.dispatch.instance_picker import pick_deployment, pick_instance
from sageserve.dispatch.priorities import scheduler_priority
from sageserve.dispatch.queue_manager import BatchQueueManager, release_count
from sageserve.dispatch.region_router import pick_region

__all__ = [
    "BatchQueueManager",
    "pick_deployment",
    "pick_instance",
    "pick_region",
    "release_count",
    "scheduler_priority",
]
