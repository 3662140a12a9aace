"""SageServe routing: global region router, batch Queue Manager, in-region picking, priorities.

Pure code shared by the simulator and (later) the operator: inputs are loads the caller
measured, outputs are choices. Nothing here reads a clock or talks to a cluster.
"""

from sageserve.route.instance_picker import pick_deployment, pick_instance
from sageserve.route.priorities import scheduler_priority
from sageserve.route.queue_manager import BatchQueueManager, release_count
from sageserve.route.region_router import pick_region

__all__ = [
    "BatchQueueManager",
    "pick_deployment",
    "pick_instance",
    "pick_region",
    "release_count",
    "scheduler_priority",
]
