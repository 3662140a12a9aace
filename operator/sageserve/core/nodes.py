"""One reader of v1.Node objects for every world (SageServe §2.3: node pools).

The operator reads Nodes from the API server, the simulator and the e2e tooling read the
same objects from an inventory YAML, the twin and the semantic checks read their shape.
A node is usable by sageserve when it offers GPUs and carries the region and GPU-type
labels; its pool is the `serving` / `spot` label, and a GPU node without a pool label is
capacity outside both pools, which neither world uses (`pace.spot.capacity_order`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

from sageserve.core.labels import (
    ANNOTATION_DONATED_AT,
    ANNOTATION_LAST_MODEL,
    DEFAULT_NODE_LABELS,
    GPU_RESOURCE,
    NodeLabels,
)

#: Pool of a GPU node that carries no pool label.
OUTSIDE_POOLS = ""


@dataclass(frozen=True, slots=True)
class NodeInfo:
    """What sageserve needs of one GPU node."""

    name: str
    region: str
    gpu_type: str
    pool: str
    gpus: int
    ready: bool = True
    last_model: str | None = None
    donated_at: float | None = None


def parse_time(value: object) -> float | None:
    """A Kubernetes timestamp (RFC 3339, `...Z` or an offset), as Unix seconds; None when
    absent or not a timestamp."""
    if not value:
        return None
    try:
        return datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def _ready(status: Mapping[str, Any]) -> bool:
    conditions = status.get("conditions") or []
    ready = [c for c in conditions if c.get("type") == "Ready"]
    return not ready or ready[0].get("status") == "True"


def not_ready_since(obj: Mapping[str, Any]) -> float | None:
    """When the node's Ready condition left True (its `lastTransitionTime`); None while it
    is Ready or reports no Ready condition (a hand-written inventory). A node whose
    kubelet says NotReady, or that the node controller marks Unknown, is lost for the pods
    on it; 0.0 when the condition carries no time."""
    conditions = (obj.get("status") or {}).get("conditions") or []
    ready = [c for c in conditions if c.get("type") == "Ready"]
    if not ready or ready[0].get("status") == "True":
        return None
    return parse_time(ready[0].get("lastTransitionTime")) or 0.0


def parse_node(obj: Mapping[str, Any], labels: NodeLabels = DEFAULT_NODE_LABELS) -> NodeInfo | None:
    """The node's GPU shape, pool and donation annotations; None if sageserve cannot use it.

    GPUs are the allocatable count (capacity when allocatable is absent, as in a hand-written
    inventory). A node without GPUs, region or GPU type is not a node sageserve can place on.
    """
    meta = obj.get("metadata") or {}
    node_labels = meta.get("labels") or {}
    annotations = meta.get("annotations") or {}
    status = obj.get("status") or {}
    resources = status.get("allocatable") or status.get("capacity") or {}
    try:
        gpus = int(str(resources.get(GPU_RESOURCE, 0)))
    except ValueError:
        return None
    region, gpu_type = node_labels.get(labels.region), node_labels.get(labels.gpu_type)
    if gpus <= 0 or not region or not gpu_type:
        return None
    return NodeInfo(
        name=str(meta.get("name", "")),
        region=str(region),
        gpu_type=str(gpu_type),
        pool=str(node_labels.get(labels.pool, OUTSIDE_POOLS)),
        gpus=gpus,
        ready=_ready(status),
        last_model=annotations.get(ANNOTATION_LAST_MODEL),
        donated_at=parse_time(annotations.get(ANNOTATION_DONATED_AT)),
    )


def parse_nodes(
    objs: Iterable[Mapping[str, Any]], labels: NodeLabels = DEFAULT_NODE_LABELS
) -> list[NodeInfo]:
    """Usable GPU nodes of `objs`, in order; other objects than Nodes are refused."""
    out = []
    for obj in objs:
        if not obj:
            continue
        if obj.get("kind", "Node") != "Node":
            raise ValueError(f"an inventory holds only v1 Node objects, got {obj.get('kind')}")
        node = parse_node(obj, labels)
        if node is not None:
            out.append(node)
    return out


class PlacedGpus(Protocol):
    """A GPU node as any world lists it (`NodeInfo`, the simulator's inventory)."""

    @property
    def region(self) -> str: ...

    @property
    def gpu_type(self) -> str: ...

    @property
    def pool(self) -> str: ...

    @property
    def gpus(self) -> int: ...


def plannable_gpus(
    nodes: Iterable[PlacedGpus], labels: NodeLabels = DEFAULT_NODE_LABELS
) -> dict[tuple[str, str], int]:
    """GPUs per (region, GPU type) the plan may give out: the serving and spot pools' (a
    spot node is reclaimed for serving; SageServe §5.2). A node outside both pools is not
    sageserve's to plan on, in either world."""
    out: dict[tuple[str, str], int] = {}
    for n in nodes:
        if n.pool in (labels.serving_pool, labels.spot_pool):
            out[(n.region, n.gpu_type)] = out.get((n.region, n.gpu_type), 0) + n.gpus
    return out
