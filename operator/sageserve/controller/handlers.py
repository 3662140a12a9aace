"""kopf handlers: reconcile ModelDeployments into pod sets and report their status.

Level-triggered: every run recomputes the desired pod sets from the spec and applies them
with server-side apply, so a restart mid-change converges without doing anything twice.
Replica counts already in the cluster are kept (they belong to the pacing loop); a new pod
set starts at its region's initial size. A spec that passes the schema but cannot be acted
on (missing policy or tiers, no node that fits) gets `Ready=False` with the reason and an
Event, and the operator goes on with every other object.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import grpc
import kopf
from prometheus_client import start_http_server

from sageserve.api.common import GROUP, VERSION
from sageserve.api.model_deployment import ModelDeployment, pod_set_name
from sageserve.controller.fleet_kube import FleetWriteError, fleet_of
from sageserve.controller.inference_pool import gateway_status, reconcile_gateway
from sageserve.controller.kube import Kube, kube
from sageserve.controller.pace_loop import Loops
from sageserve.controller.podset import policy_scheduling, render_pod_sets
from sageserve.controller.pool_podsets import (
    on_model_pool,  # noqa: F401  (ModelPool handlers)
    reconcile_pool,
)
from sageserve.controller.semantics import (
    NodeShape,
    model_deployment_problems,
    node_shapes,
    shape_counts,
)
from sageserve.controller.status import covers, model_deployment_status, set_condition
from sageserve.core.labels import LABEL_REGION, NodeLabels
from sageserve.keda.scaledobject import fallback_replicas
from sageserve.keda.server import ExternalScaler, serve
from sageserve.metrics.exporter import OPERATOR_METRICS

RESYNC_SECONDS = float(os.environ.get("SAGESERVE_RESYNC_SECONDS", "30"))
#: Node shapes are listed at most this often (every reconcile needs them; see below).
NODE_SHAPES_SECONDS = 10.0


@kopf.on.login()
def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
    """In-cluster service account, else the kubeconfig named by KUBECONFIG at start-up."""
    return kopf.login_with_service_account(**kwargs) or kopf.login_with_kubeconfig(**kwargs)


@kopf.on.startup()
def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
    """Keep kopf's bookkeeping under our own annotation prefix."""
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(prefix=GROUP)
    settings.posting.level = logging.INFO


Logger = logging.Logger | logging.LoggerAdapter[Any]

_shapes_lock = threading.Lock()
_shapes: dict[tuple[str, str], tuple[float, list[NodeShape]]] = {}


def cluster_node_shapes(k: Kube, labels: NodeLabels) -> list[NodeShape]:
    """The distinct (region, GPU type, GPUs) shapes of the cluster's nodes and how many
    nodes have each, listed at most every NODE_SHAPES_SECONDS.

    Every reconcile checks that some node fits each variant; listing every Node for each
    ModelDeployment made a sweep O(objects × nodes) (200 objects × 2,000 nodes: minutes).
    Shapes change when node pools are added, not from one second to the next."""
    key = (labels.region, labels.gpu_type)
    with _shapes_lock:
        at, shapes = _shapes.get(key, (float("-inf"), []))
        if time.monotonic() - at >= NODE_SHAPES_SECONDS:
            shapes = shape_counts(node_shapes(k.nodes(), labels))
            _shapes[key] = (time.monotonic(), shapes)
        return shapes


def reconcile(body: Mapping[str, Any], namespace: str, uid: str, logger: Logger) -> dict[str, Any]:
    """One level-triggered pass over a ModelDeployment; returns its new status."""
    raw = {k: body[k] for k in ("apiVersion", "kind", "metadata", "spec")}
    md = ModelDeployment.model_validate(raw)
    k = fleet_of(kube(), os.environ)  # pod sets live where their region does
    labels = NodeLabels.from_env(os.environ)
    policies = k.objects(namespace, "scalingpolicies")
    # a silent member's pod sets are neither checked, written nor deleted until it answers
    held = k.held_regions()
    problems = model_deployment_problems(
        md,
        policies=[p["metadata"]["name"] for p in policies],
        tiers=k.names(namespace, "workloadtiers"),
        nodes=cluster_node_shapes(k, labels),
        held=held,
    )
    existing = k.deployments_of(namespace, md.metadata.name)
    applied: list[dict[str, Any]] = []
    #: pod sets a member cluster refused (`MemberClusters`; `Ready` follows the rest)
    refused: list[str] = []
    if not problems:
        current = {
            (r.name, v.name): int(existing[name]["spec"]["replicas"] or 0)
            for r in md.spec.regions
            for v in md.spec.variants
            if (name := pod_set_name(md.metadata.name, r.name, v.name)) in existing
        }
        # the engine's scheduler follows the policy's instance order: a policy changed
        # later reaches the pod sets on the next resync (a rolling restart)
        scheduling = policy_scheduling(policies, md.spec.policy_ref.name)
        desired = [
            k.placed(d)
            for d in render_pod_sets(md, current, namespace, uid, labels, scheduling)
            if d["metadata"]["labels"].get(LABEL_REGION) not in held
        ]
        wanted = {d["metadata"]["name"] for d in desired} | {
            pod_set_name(md.metadata.name, r.name, v.name)
            for r in md.spec.regions
            if r.name in held
            for v in md.spec.variants
        }
        for deployment in desired:
            have = existing.get(deployment["metadata"]["name"])
            # Applying an unchanged pod set is a no-op for the API server but still a
            # request per pod set per resync; a drifted field is applied (and restored).
            # (List items carry no apiVersion/kind: compare what we set, metadata and spec.)
            mine = {"metadata": deployment["metadata"], "spec": deployment["spec"]}
            if have is not None and covers(have, mine):
                applied.append(have)
                continue
            try:
                applied.append(k.apply(deployment))
            except FleetWriteError as exc:  # a member's: the others are applied and paced
                refused.append(str(exc))
        for name in sorted(set(existing) - wanted):
            logger.info("deleting pod set %s: its region or variant left the spec", name)
            k.delete_deployment(namespace, name)
    previous = dict(body.get("status") or {})
    if problems and not _already_reported(previous, problems[0].reason):
        message = "; ".join(p.message for p in problems)
        k.event(dict(body), "Warning", problems[0].reason, message)
    gpu_types = {v.name: v.gpu_type for v in md.spec.variants}
    now, generation = datetime.now(UTC), body["metadata"].get("generation")
    status = model_deployment_status(previous, applied, gpu_types, problems, now, generation)
    if not problems:
        # the gateway's InferencePools follow the pod sets (controller/inference_pool.py)
        outcome = reconcile_gateway(k, md, namespace, uid, policies, os.environ)
        if not outcome.ok and not _already_reported(previous, outcome.reason, "InferencePools"):
            logger.warning("InferencePools of %s: %s", md.metadata.name, outcome.message)
        status.update(gateway_status(status["conditions"], outcome, now, generation))
    if k.spans_clusters:
        status["conditions"] = member_clusters_condition(
            k, dict(body), previous, status["conditions"], refused, now, generation
        )
    return status


def member_clusters_condition(
    k: Kube,
    body: dict[str, Any],
    previous: Mapping[str, Any],
    conditions: list[dict[str, Any]],
    refused: list[str],
    now: datetime,
    generation: int | None,
) -> list[dict[str, Any]]:
    """`MemberClusters`: False naming each pod set a member refused and the fix (one
    Event per transition), True once every member took its own. Separate from `Ready` so
    one misconfigured member does not stop the pacing of the model's other regions."""
    if refused:
        message = "; ".join(refused)
        if not _already_reported(dict(previous), "MemberClusterRefused", "MemberClusters"):
            k.event(body, "Warning", "MemberClusterRefused", message)
        return set_condition(
            conditions, "MemberClusters", False, "MemberClusterRefused", message, now, generation
        )
    message = "every member cluster took the pod sets of its regions"
    return set_condition(
        conditions, "MemberClusters", True, "PodSetsApplied", message, now, generation
    )


def _already_reported(status: dict[str, Any], reason: str, type_: str = "Ready") -> bool:
    """Whether `type_` (Ready) is already False for `reason`: one Event (or warning) per
    transition, not per resync."""
    return any(
        c.get("type") == type_ and c.get("status") == "False" and c.get("reason") == reason
        for c in status.get("conditions", [])
    )


@kopf.on.resume(GROUP, VERSION, "modeldeployments")
@kopf.on.create(GROUP, VERSION, "modeldeployments")
@kopf.on.update(GROUP, VERSION, "modeldeployments", field="spec")
def on_model_deployment(
    body: kopf.Body, namespace: str | None, uid: str, patch: kopf.Patch, logger: Logger, **_: Any
) -> None:
    """Apply the pod sets of a new or changed ModelDeployment."""
    assert namespace is not None  # ModelDeployments are namespaced
    patch.status.update(reconcile(body, namespace, uid, logger))


def resync(obj: dict[str, Any]) -> None:
    """Reconcile one ModelDeployment or ModelPool outside kopf's handlers (the background
    loop's resync): a policy or node that appears later makes a waiting object Ready."""
    namespace, uid = obj["metadata"]["namespace"], obj["metadata"]["uid"]
    if obj.get("kind") == "ModelPool":
        plural, status = "modelpools", reconcile_pool(obj, namespace, uid)
    else:
        plural = "modeldeployments"
        status = reconcile(obj, namespace, uid, logging.getLogger("sageserve.resync"))
    if any((obj.get("status") or {}).get(k) != v for k, v in status.items()):
        kube().patch_status(namespace, plural, obj["metadata"]["name"], status)


_loops: Loops | None = None
#: the KEDA external scaler's gRPC server, when --scaler-listen is set
_scaler: grpc.Server | None = None
#: Ports already serving metrics in this process (an operator restarted in-process reuses them).
_metrics_ports: set[int] = set()


def watched_namespaces() -> list[str] | None:
    """SAGESERVE_NAMESPACES (comma-separated, set by `sageserve operator -n`), else all."""
    raw = os.environ.get("SAGESERVE_NAMESPACES", "").strip()
    return [n for n in raw.split(",") if n] or None


@kopf.on.startup()
def start_loops(logger: Logger, **_: Any) -> None:
    """Start the pace and resync loop next to kopf's event handling."""
    global _loops
    port = int(os.environ.get("SAGESERVE_METRICS_PORT", "8080"))
    if port > 0 and port not in _metrics_ports:
        try:
            start_http_server(port, registry=OPERATOR_METRICS.registry)
            _metrics_ports.add(port)
            logger.info("operator metrics on :%d/metrics", port)
        except OSError as exc:  # scaling goes on without its metrics; say so loudly
            logger.error("cannot serve metrics on port %d: %s", port, exc)
    _loops = Loops(watched_namespaces(), resync, RESYNC_SECONDS, logger)
    _loops.start()
    start_scaler(logger)


def scaler_lookup(namespace: str, pod_set: str) -> int | None:
    """What the scaler answers for a pod set with no decision recorded in this process
    (just started, or not the leader): the plan the leader last wrote into its
    ScaledObject (`fallback.replicas`), else the pod set's current replicas."""
    k = fleet_of(kube(), os.environ)
    found = k.scaled_object(namespace, pod_set)
    recorded = fallback_replicas(found) if found is not None else None
    return recorded if recorded is not None else k.deployment_replicas(namespace, pod_set)


def start_scaler(logger: Logger) -> None:
    """Serve KEDA's external scaler on SAGESERVE_SCALER_LISTEN (`--scaler-listen`), once
    per process; a port that cannot be bound is logged loudly (keda-mode ScaledObjects then
    fall back to the plan they carry)."""
    global _scaler
    listen = os.environ.get("SAGESERVE_SCALER_LISTEN", "")
    if not listen or _scaler is not None:
        return
    try:
        _scaler, port = serve(listen, ExternalScaler(scaler_lookup))
    except (OSError, RuntimeError) as exc:
        logger.error("cannot serve the KEDA scaler on %s: %s", listen, exc)
        return
    logger.info("KEDA external scaler on %s (port %d)", listen, port)


@kopf.on.cleanup()
def stop_loops(**_: Any) -> None:
    """Stop the background loop when the operator stops."""
    if _loops is not None:
        _loops.stopped.set()
        _loops.join(timeout=10)
    global _scaler
    if _scaler is not None:
        _scaler.stop(grace=2)
        _scaler = None
