"""Pooled pod sets: render a ModelPool's Deployments, reconcile them, apply the plan's size.

Each pod of a pool runs one vLLM engine per pooled model, all on the pod's GPUs, each with
sleep mode (`--enable-sleep-mode`, and `VLLM_SERVER_DEV_MODE=1`, which vLLM requires to
expose `/sleep`, `/wake_up` and `/is_sleeping`). Engines start one after another and each
is put to sleep (`POST /sleep?level=1`: weights to host memory, KV cache dropped) once it
answers `/health`, so a new pod holds no model on its GPUs and the router wakes what
requests need. Each engine may use `0.9 / awakePerInstance` of GPU memory: the quota of
awake models always fits.

Like `controller.podset`, rendering is a pure function of the spec (server-side applied,
level-triggered); replicas belong to the plan (`apply_pool_targets`).
"""

from __future__ import annotations

import logging
import os
import shlex
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import kopf

from sageserve.api.common import GROUP, VERSION
from sageserve.api.model_deployment import pod_set_name
from sageserve.api.model_pool import (
    ModelPool,
    PoolRegion,
    initial_size,
    model_port,
    parse_pool,
    served_name,
)
from sageserve.api.scaling_policy import ScalingPolicy
from sageserve.controller.faults import HELD, Sizing, ownership
from sageserve.controller.guard import held_message
from sageserve.controller.kube import Kube, ReplicasMoved, kube
from sageserve.controller.podset import engine_probes, gpu_deployment, pod_set_metadata
from sageserve.controller.semantics import SemanticProblem
from sageserve.controller.status import is_ready, model_deployment_status, set_condition
from sageserve.core.labels import (
    ANNOTATION_DELETION_COST,
    DEFAULT_NODE_LABELS,
    DRAIN_DELETION_COST,
    GPU_RESOURCE,
    LABEL_DEPLOYMENT,
    LABEL_REGION,
    LABEL_VARIANT,
    MANAGED_BY,
    MANAGED_BY_LABEL,
    NodeLabels,
)
from sageserve.core.pooled_engines import (
    ANNOTATION_AWAKE_PER_INSTANCE,
    ANNOTATION_POOLED_MODELS,
    LABEL_POOL,
    PooledEngine,
    encode_engines,
)
from sageserve.core.snapshot import InstanceView, drain_order
from sageserve.metrics.prometheus import PodLoad
from sageserve.pace.from_policy import strategy_for
from sageserve.plan.pool_cycle import bounded, pool_sizing

Logger = logging.Logger | logging.LoggerAdapter[Any]
#: GPU memory all awake engines of a pod may use together (vLLM's default per engine).
GPU_MEMORY_SHARE = 0.9


def engines(pool: ModelPool) -> list[PooledEngine]:
    spec = pool.spec
    return [
        PooledEngine(m.name, served_name(m), model_port(spec, i)) for i, m in enumerate(spec.models)
    ]


def engine_args(pool: ModelPool, index: int) -> list[str]:
    """vLLM arguments of the engine of `spec.models[index]` (then the user's extra ones)."""
    spec = pool.spec
    m = spec.models[index]
    tp = spec.variant.tensor_parallel or spec.variant.gpus_per_instance
    share = GPU_MEMORY_SHARE / spec.awake_per_instance
    return [
        "--model",
        m.model,
        "--served-model-name",
        served_name(m),
        "--port",
        str(model_port(spec, index)),
        "--tensor-parallel-size",
        str(tp),
        "--enable-sleep-mode",
        "--gpu-memory-utilization",
        f"{share:.3f}",
        *(["--max-model-len", str(m.context_length)] if m.context_length else []),
        *spec.engine.args,
    ]


_WAIT_THEN_SLEEP = (
    "import sys, time, urllib.request as u\n"
    "port = sys.argv[1]\n"
    "while True:\n"
    "    try:\n"
    "        u.urlopen(f'http://127.0.0.1:{port}/health', timeout=5)\n"
    "        break\n"
    "    except Exception:\n"
    "        time.sleep(2)\n"
    "u.urlopen(u.Request(f'http://127.0.0.1:{port}/sleep?level=1', method='POST'), timeout=600)\n"
)


def launcher_script(pool: ModelPool) -> str:
    """The pod's shell script: each engine started, awaited and put to sleep in turn (one
    at a time, so two engines never profile the GPU memory at once), then wait on all."""
    lines = ["set -e"]
    for i in range(len(pool.spec.models)):
        args = " ".join(shlex.quote(a) for a in engine_args(pool, i))
        port = model_port(pool.spec, i)
        lines.append(f"vllm serve {args} &")
        lines.append(f"python3 -c {shlex.quote(_WAIT_THEN_SLEEP)} {port}")
    lines.append("wait")
    return "\n".join(lines) + "\n"


def render_pool_pod_set(
    pool: ModelPool,
    region: PoolRegion,
    replicas: int,
    namespace: str,
    owner_uid: str | None = None,
    node_labels: NodeLabels = DEFAULT_NODE_LABELS,
) -> dict[str, Any]:
    """The apps/v1 Deployment of `pool` in `region`, with `replicas` pooled pods."""
    name = pool.metadata.name
    variant = pool.spec.variant
    selector = {LABEL_DEPLOYMENT: name, LABEL_REGION: region.name, LABEL_VARIANT: variant.name}
    labels = {
        "app.kubernetes.io/name": "vllm",
        "app.kubernetes.io/instance": name,
        "app.kubernetes.io/component": "pooled-inference",
        MANAGED_BY_LABEL: MANAGED_BY,
        LABEL_POOL: name,
        **selector,
    }
    metadata = pod_set_metadata(
        pod_set_name(name, region.name, variant.name), namespace, labels, pool, owner_uid
    )
    match = [
        {"key": node_labels.region, "operator": "In", "values": [region.name]},
        {"key": node_labels.gpu_type, "operator": "In", "values": [variant.gpu_type]},
        {"key": node_labels.pool, "operator": "In", "values": [node_labels.serving_pool]},
    ]
    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": match}]
            }
        }
    }
    found = engines(pool)
    gpus = str(variant.gpus_per_instance)
    # every engine loads before the pod is Ready: startup covers them all
    startup = variant.startup_seconds * len(found)
    probe = {"path": "/health", "port": found[0].port}
    container = {
        "name": "vllm",
        "image": pool.spec.engine.image,
        "command": ["/bin/sh", "-c", launcher_script(pool)],
        "env": [{"name": "VLLM_SERVER_DEV_MODE", "value": "1"}],
        "ports": [
            {"name": f"m{i}", "containerPort": e.port, "protocol": "TCP"}
            for i, e in enumerate(found)
        ],
        "resources": {"requests": {GPU_RESOURCE: gpus}, "limits": {GPU_RESOURCE: gpus}},
        **engine_probes(probe, startup),
        "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"}],
    }
    annotations = {
        ANNOTATION_POOLED_MODELS: encode_engines(found),
        ANNOTATION_AWAKE_PER_INSTANCE: str(pool.spec.awake_per_instance),
    }
    return gpu_deployment(
        metadata,
        replicas,
        selector,
        labels,
        affinity,
        container,
        found[0].port,
        variant.drain_seconds,
        annotations,
    )


def render_pool_pod_sets(
    pool: ModelPool,
    replicas: Mapping[str, int],
    namespace: str,
    owner_uid: str | None = None,
    node_labels: NodeLabels = DEFAULT_NODE_LABELS,
) -> list[dict[str, Any]]:
    """Every pod set of `pool`; `replicas[region]` defaults to the region's initial size."""
    return [
        render_pool_pod_set(
            pool,
            r,
            replicas.get(r.name, initial_size(r)),
            namespace,
            owner_uid,
            node_labels,
        )
        for r in pool.spec.regions
    ]


def pool_problems(
    pool: ModelPool, policies: Sequence[str], tiers: Sequence[str]
) -> list[SemanticProblem]:
    """What passes the schema but cannot be acted on: a missing policy or tier."""
    out = []
    if pool.spec.policy_ref.name not in policies:
        out.append(
            SemanticProblem(
                "PolicyNotFound",
                f"spec.policyRef.name: ScalingPolicy {pool.spec.policy_ref.name!r} does not "
                "exist in this namespace; create it or fix the name",
            )
        )
    missing = [t for t in pool.spec.tiers if t not in tiers]
    if missing:
        out.append(
            SemanticProblem(
                "TierNotFound",
                f"spec.tiers: WorkloadTier(s) {', '.join(missing)} do not exist in this "
                "namespace; create them or remove them from spec.tiers",
            )
        )
    return out


def reconcile_pool(body: Mapping[str, Any], namespace: str, uid: str) -> dict[str, Any]:
    """One level-triggered pass over a ModelPool; returns its new status."""
    pool = parse_pool(body)
    k = kube()
    labels = NodeLabels.from_env(os.environ)
    problems = pool_problems(
        pool, k.names(namespace, "scalingpolicies"), k.names(namespace, "workloadtiers")
    )
    existing = k.deployments_of(namespace, pool.metadata.name)
    applied: list[dict[str, Any]] = []
    if not problems:
        variant = pool.spec.variant.name
        current = {
            r.name: int(existing[n]["spec"].get("replicas") or 0)
            for r in pool.spec.regions
            if (n := pod_set_name(pool.metadata.name, r.name, variant)) in existing
        }
        desired = render_pool_pod_sets(pool, current, namespace, uid, labels)
        applied = [k.apply(d) for d in desired]
        wanted = {d["metadata"]["name"] for d in desired}
        for name in sorted(set(existing) - wanted):
            k.delete_deployment(namespace, name)
    previous = dict(body.get("status") or {})
    if problems:
        k.event(dict(body), "Warning", problems[0].reason, "; ".join(p.message for p in problems))
    status = model_deployment_status(
        previous,
        applied,
        {pool.spec.variant.name: pool.spec.variant.gpu_type},
        problems,
        datetime.now(UTC),
        body["metadata"].get("generation"),
    )
    # the plan's size, where a plan set one, stays the target
    if "targetInstances" in previous and "targetInstances" in status:
        status["targetInstances"] = previous["targetInstances"]
    name = pool.spec.policy_ref.name
    for raw in k.objects(namespace, "scalingpolicies"):
        if raw["metadata"]["name"] != name:
            continue
        try:
            strategy = strategy_for(
                ScalingPolicy.model_validate(
                    {f: raw[f] for f in ("apiVersion", "kind", "metadata", "spec") if f in raw}
                ).spec
            )
        except ValueError:
            break  # the policy reports its own problem
        sized, reason, message = pool_sizing(name, strategy)
        was: Mapping[str, Any] = next(
            (c for c in previous.get("conditions") or [] if c.get("type") == "Sized"), {}
        )
        status["conditions"] = set_condition(
            status["conditions"],
            "Sized",
            sized,
            reason,
            message,
            datetime.now(UTC),
            body["metadata"].get("generation"),
        )
        if not sized and (was.get("status"), was.get("reason")) != ("False", reason):
            k.event(dict(body), "Warning", reason, message)  # once, not every resync
    return status


@kopf.on.resume(GROUP, VERSION, "modelpools")
@kopf.on.create(GROUP, VERSION, "modelpools")
@kopf.on.update(GROUP, VERSION, "modelpools", field="spec")
def on_model_pool(
    body: kopf.Body, namespace: str | None, uid: str, patch: kopf.Patch, **_: Any
) -> None:
    """Apply the pooled pod sets of a new or changed ModelPool."""
    assert namespace is not None
    patch.status.update(reconcile_pool(body, namespace, uid))


def pool_drain_choice(
    pods: Iterable[Mapping[str, Any]],
    loads: Mapping[str, PodLoad],
    pool: str,
    region: str,
    count: int,
) -> list[str]:
    """The `count` Ready pods of a pooled pod set to remove first on a scale-in: least
    loaded by the rule every scale-in follows (`core.snapshot.drain_order`: least KV in use,
    then fewest waiting), among the pods that report a load; the simulator drains the same
    way (`sim.pooled_pods`). A pod with no load reported is never chosen (it may be the
    busiest); the ReplicaSet removes pods that are not Ready before any of these."""
    views = []
    for pod in pods:
        meta = pod.get("metadata") or {}
        labels = meta.get("labels") or {}
        name = str(meta.get("name", ""))
        if (
            labels.get(LABEL_DEPLOYMENT) != pool
            or labels.get(LABEL_REGION) != region
            or meta.get("deletionTimestamp")
            or not is_ready(pod)
            or name not in loads
        ):
            continue
        load = loads[name]
        cap = load.kv_capacity_tokens or 1.0
        views.append(InstanceView(name, "", load.kv_usage * cap, cap, load.waiting))
    return [v.name for v in drain_order(tuple(views))[: max(0, count)]]


def apply_pool_targets(
    k: Kube,
    namespace: str,
    pools: Sequence[tuple[Mapping[str, Any], ModelPool]],
    targets: Mapping[tuple[str, str], int],
    expected_active: Mapping[str, float],
    logger: Logger,
    dry_run: bool = False,
    pods: Sequence[Mapping[str, Any]] = (),
    loads: Mapping[str, PodLoad] | None = None,
) -> None:
    """Scale each pooled pod set to the plan's size (`targets[(pool, region)]`, within the
    region's bounds) and record it in the pool's status, with an Event when it moves.

    The pace loop's ownership rules hold here too (docs/reliability.md): a pod set handed
    to another autoscaler (`sageserve.io/scaling: external`), one whose replicas another
    writer changed, or one with an unknown `scaling` annotation is left as it is, with a
    `PoolResizeHeld` Event naming why; a write that loses a race with another writer
    (`ReplicasMoved`) is not retried over it and does not stop the other pools or the
    plan's status. A scale-in first marks the least-loaded pods (`pool_drain_choice` over
    `pods` and their `loads`) with a low `pod-deletion-cost`, so the ReplicaSet removes
    those rather than a pod with requests in flight."""
    sets = k.deployments_by_owner(namespace)
    for raw, pool in pools:
        name = pool.metadata.name
        total = 0
        for region in pool.spec.regions:
            if (name, region.name) not in targets:
                continue
            target = bounded(region, targets[(name, region.name)])
            total += target
            set_name = pod_set_name(name, region.name, pool.spec.variant.name)
            observed = sets.get(name, {}).get(set_name)
            if observed is None:
                continue
            before = int(observed["spec"].get("replicas") or 0)
            if before == target or dry_run:
                continue
            own = ownership(observed)
            if own.sizing in HELD:
                k.event(
                    dict(raw),
                    "Warning",
                    "PoolResizeHeld",
                    f"the plan asks {target} pooled pod(s) of {set_name}, held at {before}: "
                    + held_message(own, namespace),
                )
                continue
            drained = pool_drain_choice(pods, loads or {}, name, region.name, before - target)
            for pod_name in drained:
                k.annotate_pod(
                    namespace, pod_name, {ANNOTATION_DELETION_COST: str(DRAIN_DELETION_COST)}
                )
            try:
                k.set_replicas(
                    namespace, observed, target, drop_scaling=own.sizing is Sizing.RESUME
                )
            except ReplicasMoved as exc:
                logger.info("pool %s changed while being resized (%s); next plan", set_name, exc)
                continue
            message = (
                f"pool {set_name}: {before} → {target} pooled pod(s) for "
                f"{expected_active.get(name, 0.0):.2f} expected active model(s)"
                + (f", draining {', '.join(drained)}" if drained else "")
            )
            logger.info("%s", message)
            k.event(dict(raw), "Normal", "PoolResized", message)
        status: dict[str, Any] = {"targetInstances": total}
        if name in expected_active:
            status["expectedActiveModels"] = round(expected_active[name], 4)
        k.patch_status(namespace, "modelpools", name, status)
