"""Donate idle serving nodes to the spot pool and reclaim spot nodes for pending instances.

Nodes move between pools by their pool label (DESIGN.md). A serving node that no serving
pod uses is donated: relabelled `spot`, annotated with the model it last served and when.
A serving pod that cannot be scheduled (no serving GPUs left in its region and GPU type)
gets a spot node back: the spot pods on it are evicted through the Eviction API (so their
PodDisruptionBudgets are honoured) and the node is relabelled `serving`, preferring nodes
that last served the same model (weights cached). Serving pods are never evicted.

A PodDisruptionBudget may refuse an eviction (429): the pass retries it every pace pass
for `SAGESERVE_RECLAIM_TIMEOUT_SECONDS` (60 s), then gives the node back to the spot pool
(annotated `sageserve.io/reclaim-blocked-at` and `-by`, skipped for five times that long)
and takes the next node (`pace.spot.reclaim_step`). A node that is not Ready (lost) is
neither donated, reclaimed nor counted in the spot pool.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sageserve.api.model_deployment import pod_set_name
from sageserve.controller.kube import Kube
from sageserve.core.labels import (
    ANNOTATION_BLOCKED_AT,
    ANNOTATION_BLOCKED_BY,
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
from sageserve.core.nodes import parse_node, parse_time
from sageserve.metrics.exporter import OPERATOR_METRICS
from sageserve.pace.spot import (
    RETRY_AFTER_TIMEOUTS,
    Pending,
    PoolNode,
    ReclaimStep,
    plan_moves,
    reclaim_step,
    skipped,
)

__all__ = ["RETRY_AFTER_TIMEOUTS", "Pending", "plan_moves"]


def reclaim_timeout_s() -> float:
    """How long a reclaim retries evictions a PodDisruptionBudget refuses before it gives
    the node back and takes another (SAGESERVE_RECLAIM_TIMEOUT_SECONDS, 60 s)."""
    return float(os.environ.get("SAGESERVE_RECLAIM_TIMEOUT_SECONDS", "60"))


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
    """The GPU nodes with their pool, readiness, GPUs held by serving pods, the spot pods
    on them (staying or leaving) and the donation and reclaim annotations."""
    serving_gpus: dict[str, int] = {}
    tenants: dict[str, list[str]] = {}
    leaving: dict[str, int] = {}
    for pod in pods:
        node = (pod.get("spec") or {}).get("nodeName")
        if not node or not _active(pod):
            continue
        if is_serving_pod(pod):
            serving_gpus[node] = serving_gpus.get(node, 0) + pod_gpus(pod)
        elif not _daemon(pod):
            meta = pod.get("metadata") or {}
            if meta.get("deletionTimestamp"):
                leaving[node] = leaving.get(node, 0) + 1
            else:
                tenants.setdefault(node, []).append(f"{meta.get('namespace')}/{meta.get('name')}")
    out = []
    for obj in nodes:
        node = parse_node(obj, labels)
        if node is None or not node.pool:
            continue
        annotations = (obj.get("metadata") or {}).get("annotations") or {}
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
                ready=node.ready,
                reclaimed_at=parse_time(annotations.get(ANNOTATION_RECLAIMED_AT)),
                blocked_at=parse_time(annotations.get(ANNOTATION_BLOCKED_AT)),
                tenants=tuple(sorted(tenants.get(node.name, []))),
                leaving=leaving.get(node.name, 0),
            )
        )
    return out


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


def now_iso() -> str:
    """The current time as the annotations write it."""
    return datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


@dataclass(frozen=True)
class Blocked:
    """A node whose reclaim was given up: the eviction of a spot pod on it was refused."""

    node: str
    #: when it was given up (RFC 3339, as annotated)
    since: str
    #: which pod and what refused it (the PodDisruptionBudget, from the 429's cause)
    by: str

    def describe(self, timeout_s: float) -> str:
        """Stable while the node stays blocked (no running count)."""
        until = parse_time(self.since)
        after = (
            datetime.fromtimestamp(until + RETRY_AFTER_TIMEOUTS * timeout_s, UTC)
            .isoformat(timespec="seconds")
            .replace("+00:00", "Z")
            if until is not None
            else "later"
        )
        return (
            f"spot node {self.node}: eviction of {self.by}, retried for {timeout_s:.0f} s; "
            f"reclaim given up at {self.since}, the node handed back to the spot pool and not "
            f"taken again before {after}; the pending instance takes another node"
        )


class SpotPass:
    """Carry out one pass of donations and reclaims for the pod sets of one policy."""

    def __init__(self, kube: Kube, labels: NodeLabels) -> None:
        self.kube = kube
        self.labels = labels
        #: Spot-pool nodes (Ready ones) of the pass's (region, GPU type) pairs once it ran.
        self.spot_nodes = 0
        #: reclaims given up in this pass (an Event each)
        self.given_up: list[Blocked] = []
        #: nodes of the pass's pairs skipped because a reclaim of them was given up
        self.blocked: list[Blocked] = []
        self.timeout_s = reclaim_timeout_s()

    def run(
        self,
        region_of: Mapping[str, tuple[str, str]],
        busy: set[tuple[str, str]],
        dry_run: bool,
        nodes_raw: list[dict[str, Any]] | None = None,
    ) -> tuple[list[str], list[str]]:
        """Reclaim and donate; returns the names of the nodes (reclaimed, donated).
        `nodes_raw`: the Nodes as the caller listed them (listed here when None)."""
        if nodes_raw is None:
            nodes_raw = self.kube.nodes()
        pods = self.kube.pods()
        now = time.time()
        nodes = pool_nodes(nodes_raw, pods, self.labels)
        self.remember_models(nodes_raw, pods)
        scope = set(region_of.values())
        pending = unschedulable(pods, region_of)
        reclaims, donations = plan_moves(
            nodes, pending, scope, self.labels, busy, now, self.timeout_s
        )
        spot = {pair: 0 for pair in scope}
        size: dict[tuple[str, str], int] = {}
        for n in nodes:
            size[(n.region, n.gpu_type)] = max(size.get((n.region, n.gpu_type), 0), n.gpus)
            if n.pool == self.labels.spot_pool and n.ready and (n.region, n.gpu_type) in spot:
                spot[(n.region, n.gpu_type)] += 1
        by_node = {
            (o.get("metadata") or {}).get("name"): (o.get("metadata") or {}).get("annotations")
            or {}
            for o in nodes_raw
        }
        retry_after = RETRY_AFTER_TIMEOUTS * self.timeout_s
        self.blocked = [
            Blocked(
                n.name,
                str(by_node.get(n.name, {}).get(ANNOTATION_BLOCKED_AT, "")),
                str(by_node.get(n.name, {}).get(ANNOTATION_BLOCKED_BY, "a spot pod refused")),
            )
            for n in nodes
            if (n.region, n.gpu_type) in scope
            and n.pool == self.labels.spot_pool
            and skipped(n, now, retry_after)
        ]
        if dry_run:
            self.spot_nodes = sum(spot.values())
            OPERATOR_METRICS.record_pools(spot, size)
            return [n.name for n, _ in reclaims], [n.name for n in donations]
        for node in self.follow_up(nodes, now, scope):
            spot[(node.region, node.gpu_type)] += 1
        for node, _ in reclaims:
            spot[(node.region, node.gpu_type)] -= 1
        for node in donations:
            spot[(node.region, node.gpu_type)] += 1
        self.spot_nodes = sum(spot.values())
        OPERATOR_METRICS.record_pools(spot, size)
        for node, _pending in reclaims:
            # Relabel before evicting: otherwise the evicted pod's replacement can be
            # scheduled onto the node while it still says `spot`, and the serving pod the
            # node was reclaimed for stays Pending. A refused eviction is retried by the
            # next passes (`follow_up`).
            self.kube.mark_node(
                node.name,
                {self.labels.pool: self.labels.serving_pool},
                {ANNOTATION_RECLAIMED_AT: now_iso()},
            )
            for pod in node.tenants:
                namespace, name = pod.split("/", 1)
                self.kube.evict(namespace, name)
        for node in donations:
            self.kube.mark_node(
                node.name,
                {self.labels.pool: self.labels.spot_pool},
                {ANNOTATION_DONATED_AT: now_iso()},
            )
        return [n.name for n, _ in reclaims], [n.name for n in donations]

    def follow_up(
        self, nodes: list[PoolNode], now: float, scope: set[tuple[str, str]]
    ) -> list[PoolNode]:
        """Evict again the spot pods still on nodes reclaimed earlier; give back the nodes
        whose evictions are still refused past the bound. Returns the nodes given back."""
        back = []
        for node in nodes:
            if (node.region, node.gpu_type) not in scope:
                continue
            step = reclaim_step(node, now, self.timeout_s, self.labels.serving_pool)
            if step is None:
                continue
            refused = []
            for pod in node.tenants:
                namespace, name = pod.split("/", 1)
                why = self.kube.evict(namespace, name)
                if why is not None:
                    refused.append(f"pod {pod} refused by {why}")
            if step is ReclaimStep.GIVE_UP and refused:
                blocked = Blocked(node.name, now_iso(), "; ".join(refused)[:500])
                self.kube.mark_node(
                    node.name,
                    {self.labels.pool: self.labels.spot_pool},
                    {ANNOTATION_BLOCKED_AT: blocked.since, ANNOTATION_BLOCKED_BY: blocked.by},
                )
                self.given_up.append(blocked)
                self.blocked.append(blocked)
                back.append(node)
        return back

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
