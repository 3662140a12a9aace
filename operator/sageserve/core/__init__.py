"""Domain values shared by the simulator, the operator, the router and the policy code.

Nothing here does I/O, reads a clock or talks to Kubernetes, so the same values flow through
`sageserve simulate` and the live operator. `__all__` is exactly what the other packages
use (a test holds it to that), so this list is the core's public surface:

- `types`: requests, tiers, endpoint keys, instance states and the pool names of a tier;
- `snapshot`: what the decision step reads and returns (`EndpointSnapshot`, `Snapshot`,
  `Plan`, `Decision`, `PickerSignals`) and the rules every world shares on it (`emu`,
  `drain_order`);
- `nodes`: one reading of a v1.Node for every world (GPU type, count, pool, readiness);
- `labels`: every label, annotation and resource name sageserve reads or writes;
- `pooled_engines`: what a pooled pod's annotations say about its engines;
- `percentile`: the one percentile every printed latency figure uses.
"""

from sageserve.core.labels import (
    ANNOTATION_BLOCKED_AT,
    ANNOTATION_BLOCKED_BY,
    ANNOTATION_DELETION_COST,
    ANNOTATION_DONATED_AT,
    ANNOTATION_LAST_MODEL,
    ANNOTATION_RECLAIMED_AT,
    ANNOTATION_REPLICAS,
    ANNOTATION_SCALING,
    DEFAULT_NODE_LABELS,
    DRAIN_DELETION_COST,
    GPU_RESOURCE,
    LABEL_DEPLOYMENT,
    LABEL_REGION,
    LABEL_VARIANT,
    MANAGED_BY,
    MANAGED_BY_LABEL,
    SCALING_EXTERNAL,
    SCALING_RESUME,
    SERVING_POOL,
    SPOT_POOL,
    NodeLabels,
)
from sageserve.core.nodes import (
    not_ready_since,
    parse_node,
    parse_nodes,
    parse_time,
    plannable_gpus,
)
from sageserve.core.percentile import (
    percentile,
    percentiles,
)
from sageserve.core.pooled_engines import (
    ANNOTATION_AWAKE_PER_INSTANCE,
    ANNOTATION_POOLED_MODELS,
    LABEL_POOL,
    PooledEngine,
    awake_per_instance,
    encode_engines,
    pooled_engines,
)
from sageserve.core.snapshot import (
    Decision,
    EndpointPlan,
    EndpointSnapshot,
    InstanceView,
    PickerSignals,
    Plan,
    Snapshot,
    drain_order,
    emu,
)
from sageserve.core.types import (
    IW_F,
    POOL_BATCH,
    POOL_INTERACTIVE,
    POOL_UNIFIED,
    ActionKind,
    EndpointKey,
    EndpointObservation,
    InstanceState,
    Request,
    ScalingAction,
    Tier,
    TierKind,
)

__all__ = [
    "ANNOTATION_AWAKE_PER_INSTANCE",
    "ANNOTATION_BLOCKED_AT",
    "ANNOTATION_BLOCKED_BY",
    "ANNOTATION_DELETION_COST",
    "ANNOTATION_DONATED_AT",
    "ANNOTATION_LAST_MODEL",
    "ANNOTATION_POOLED_MODELS",
    "ANNOTATION_RECLAIMED_AT",
    "ANNOTATION_REPLICAS",
    "ANNOTATION_SCALING",
    "DEFAULT_NODE_LABELS",
    "DRAIN_DELETION_COST",
    "GPU_RESOURCE",
    "IW_F",
    "LABEL_DEPLOYMENT",
    "LABEL_POOL",
    "LABEL_REGION",
    "LABEL_VARIANT",
    "MANAGED_BY",
    "MANAGED_BY_LABEL",
    "POOL_BATCH",
    "POOL_INTERACTIVE",
    "POOL_UNIFIED",
    "SCALING_EXTERNAL",
    "SCALING_RESUME",
    "SERVING_POOL",
    "SPOT_POOL",
    "ActionKind",
    "Decision",
    "EndpointKey",
    "EndpointObservation",
    "EndpointPlan",
    "EndpointSnapshot",
    "InstanceState",
    "InstanceView",
    "NodeLabels",
    "PickerSignals",
    "Plan",
    "PooledEngine",
    "Request",
    "ScalingAction",
    "Snapshot",
    "Tier",
    "TierKind",
    "awake_per_instance",
    "drain_order",
    "emu",
    "encode_engines",
    "not_ready_since",
    "parse_node",
    "parse_nodes",
    "parse_time",
    "percentile",
    "percentiles",
    "plannable_gpus",
    "pooled_engines",
]
