"""Donate idle serving nodes to the spot pool and reclaim spot nodes for pending instances.

Nodes move between pools by their pool label (DESIGN.md). A serving node that no serving
pod uses is donated: relabelled `spot`, annotated with the model it last served and when.
A serving pod that cannot be scheduled (no serving GPUs left in its region and GPU type)
gets a spot node back: the spot pods on it are evicted through the Eviction API (so their
PodDisruptionBudgets are honoured) and the node is relabelled `serving`, preferring nodes
that last served the same model (weights cached). Serving pods are never evicted.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sageserve.api.model_deployment import pod_set_name
from sageserve.controller.kube import Kube
from sageserve.core.labels import (
    ANNOTATION_DONATED_AT,
    ANNOTATION_LAST_MODEL,
    ANNOTATION_RECLAIMED_AT,
    GPU_RESOURCE,
    LABEL_DEPLOYMENT,
    LABEL_REGION,
    LABEL_VARIANT,
    MANAGED_BY,
    MANAGED_BY_LABEL,
    NodeLabels,
)
from sageserve.core.nodes import parse_node
from sageserve.metrics.exporter import OPERATOR_METRICS
from sageserve.pace.spot import PoolNode, donation_candidates, reclaim_order


def is_serving_pod(pod: Mapping[str, Any]) -> bool:
    """A pod of a sageserve pod set (the only pods donation must never disturb)."""
    labels = (pod.get("metadata") or {}).get("labels") or {}
    return labels.get(MANAGED_BY_LABEL) == MANAGED_BY and LABEL_DEPLOYMENT in labels


def _active(pod: Mapping[str, Any]) -> bool:
    return (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed")


def pod_gpus(pod: Mapping[str, Any]) -> int:
    """GPUs a pod requests (limits, as extended resources require them equal)."""
    total = 0
    for c in (pod.get("spec") or {}).get("containers", []):
        res = c.get("resources") or {}
        value = (res.get("limits") or {}).get(GPU_RESOURCE) or (res.get("requests") or {}).get(
            GPU_RESOURCE
        )
        total += int(str(value or 0))
    return total


def model_of(pod: Mapping[str, Any]) -> str:
    """`<namespace>/<model deployment>` of a serving pod."""
    meta = pod.get("metadata") or {}
    return f"{meta.get('namespace')}/{(meta.get('labels') or {}).get(LABEL_DEPLOYMENT)}"


def pool_nodes(
    nodes: Iterable[Mapping[str, Any]], pods: Iterable[Mapping[str, Any]], labels: NodeLabels
) -> list[PoolNode]:
    """The GPU nodes with their pool, GPUs held by serving pods and donation annotations."""
    serving_gpus: dict[str, int] = {}
    for pod in pods:
        node = (pod.get("spec") or {}).get("nodeName")
        if node and is_serving_pod(pod) and _active(pod):
            serving_gpus[node] = serving_gpus.get(node, 0) + pod_gpus(pod)
    out = []
    for obj in nodes:
        node = parse_node(obj, labels)
        if node is None or not node.pool:
            continue
        out.append(
            PoolNode(
                name=node.name,
                region=node.region,
                gpu_type=node.gpu_type,
                pool=node.pool,
                gpus=node.gpus,
                serving_gpus=serving_gpus.get(node.name, 0),
                last_model=node.last_model,
                donated_at=node.donated_at,
            )
        )
    return out


@dataclass(frozen=True)
class Pending:
    """A serving pod the scheduler could not place: it needs a node of (region, GPU type)."""

    model: str
    region: str
    gpu_type: str
    gpus: int


def unschedulable(
    pods: Iterable[Mapping[str, Any]], region_of: Mapping[str, tuple[str, str]]
) -> list[Pending]:
    """Pending serving pods, with the (region, GPU type) of their pod set.

    `region_of[deployment name]` gives the pod set's (region, GPU type); the pod's owner
    chain is not needed because the pod carries its pod set's labels.
    """
    out = []
    for pod in pods:
        if not is_serving_pod(pod) or (pod.get("spec") or {}).get("nodeName"):
            continue
        if (pod.get("status") or {}).get("phase") != "Pending":
            continue
        labels = (pod.get("metadata") or {}).get("labels") or {}
        key = pod_set_name(
            str(labels.get(LABEL_DEPLOYMENT)),
            str(labels.get(LABEL_REGION)),
            str(labels.get(LABEL_VARIANT)),
        )
        if key in region_of:
            region, gpu = region_of[key]
            out.append(Pending(model_of(pod), region, gpu, pod_gpus(pod)))
    return out


def plan_moves(
    nodes: list[PoolNode],
    pending: list[Pending],
    scope: set[tuple[str, str]],
    labels: NodeLabels,
    busy: set[tuple[str, str]] | None = None,
) -> tuple[list[tuple[PoolNode, Pending]], list[PoolNode]]:
    """(reclaims, donations) for one pass: one spot node per pending pod that fits; idle
    serving nodes of (region, GPU type) pairs in `scope` with nothing pending, donated.

    `busy` pairs have pod sets still coming up (replicas not all ready): their idle nodes
    are about to be used, so they are not donated."""
    reclaims: list[tuple[PoolNode, Pending]] = []
    taken: set[str] = set()
    for p in pending:
        for node, _source in reclaim_order(
            nodes, p.model, p.region, p.gpu_type, p.gpus, labels.spot_pool
        ):
            if node.name not in taken:
                taken.add(node.name)
                reclaims.append((node, p))
                break
    waiting = {(p.region, p.gpu_type) for p in pending} | (busy or set())
    donations = [
        n
        for region, gpu in sorted(scope - waiting)
        for n in donation_candidates(nodes, region, gpu, labels.serving_pool)
    ]
    return reclaims, donations


def now_iso() -> str:
    """The current time as the annotations write it."""
    return datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


class SpotPass:
    """Carry out one pass of donations and reclaims for the pod sets of one policy."""

    def __init__(self, kube: Kube, labels: NodeLabels) -> None:
        self.kube = kube
        self.labels = labels
        #: Spot-pool nodes of the pass's (region, GPU type) pairs once it ran.
        self.spot_nodes = 0

    def run(
        self,
        region_of: Mapping[str, tuple[str, str]],
        busy: set[tuple[str, str]],
        dry_run: bool,
    ) -> tuple[list[str], list[str]]:
        """Reclaim and donate; returns the names of the nodes (reclaimed, donated)."""
        nodes_raw, pods = self.kube.nodes(), self.kube.pods()
        nodes = pool_nodes(nodes_raw, pods, self.labels)
        self.remember_models(nodes_raw, pods)
        scope = set(region_of.values())
        pending = unschedulable(pods, region_of)
        reclaims, donations = plan_moves(nodes, pending, scope, self.labels, busy)
        spot = {pair: 0 for pair in scope}
        size: dict[tuple[str, str], int] = {}
        for n in nodes:
            size[(n.region, n.gpu_type)] = max(size.get((n.region, n.gpu_type), 0), n.gpus)
            if n.pool == self.labels.spot_pool and (n.region, n.gpu_type) in spot:
                spot[(n.region, n.gpu_type)] += 1
        if dry_run:
            self.spot_nodes = sum(spot.values())
            OPERATOR_METRICS.record_pools(spot, size)
            return [n.name for n, _ in reclaims], [n.name for n in donations]
        for node, _ in reclaims:
            spot[(node.region, node.gpu_type)] -= 1
        for node in donations:
            spot[(node.region, node.gpu_type)] += 1
        self.spot_nodes = sum(spot.values())
        OPERATOR_METRICS.record_pools(spot, size)
        for node, _pending in reclaims:
            # Relabel before evicting: otherwise the evicted pod's replacement can be
            # scheduled onto the node while it still says `spot`, and the serving pod the
            # node was reclaimed for stays Pending.
            self.kube.mark_node(
                node.name,
                {self.labels.pool: self.labels.serving_pool},
                {ANNOTATION_RECLAIMED_AT: now_iso()},
            )
            for pod in pods:
                meta = pod.get("metadata") or {}
                on_node = (pod.get("spec") or {}).get("nodeName") == node.name
                if on_node and not is_serving_pod(pod) and _active(pod) and not _daemon(pod):
                    self.kube.evict(meta["namespace"], meta["name"])
        for node in donations:
            self.kube.mark_node(
                node.name,
                {self.labels.pool: self.labels.spot_pool},
                {ANNOTATION_DONATED_AT: now_iso()},
            )
        return [n.name for n, _ in reclaims], [n.name for n in donations]

    def remember_models(self, nodes: list[dict[str, Any]], pods: list[dict[str, Any]]) -> None:
        """Annotate each node running a serving pod with its model, for a later reclaim."""
        running = {
            (p.get("spec") or {}).get("nodeName"): model_of(p)
            for p in pods
            if is_serving_pod(p) and _active(p) and (p.get("spec") or {}).get("nodeName")
        }
        for node in nodes:
            meta = node.get("metadata") or {}
            model = running.get(meta.get("name"))
            if model and (meta.get("annotations") or {}).get(ANNOTATION_LAST_MODEL) != model:
                self.kube.mark_node(meta["name"], {}, {ANNOTATION_LAST_MODEL: model})


def _daemon(pod: Mapping[str, Any]) -> bool:
    """DaemonSet pods run on every node and are not evicted to free GPUs."""
    owners = (pod.get("metadata") or {}).get("ownerReferences") or []
    return any(o.get("kind") == "DaemonSet" for o in owners)
