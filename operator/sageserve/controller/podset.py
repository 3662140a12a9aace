"""Render the Deployment ("pod set") that serves a ModelDeployment in one (region, variant).

A pure function of the spec, so reconciling is level-triggered and idempotent: the operator
server-side-applies exactly this object, and applying it twice changes nothing. Replicas
are passed in (they belong to the pacing loop), everything else comes from the spec.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sageserve.api.model_deployment import (
    ModelDeployment,
    RegionPlacement,
    Variant,
    pod_set_name,
)
from sageserve.api.model_pool import ModelPool
from sageserve.api.scaling_policy import ScalingPolicy
from sageserve.core.labels import (
    COMPONENT_INFERENCE,
    COMPONENT_LABEL,
    DEFAULT_NODE_LABELS,
    GPU_RESOURCE,
    LABEL_DEPLOYMENT,
    LABEL_REGION,
    LABEL_VARIANT,
    MANAGED_BY,
    MANAGED_BY_LABEL,
    NodeLabels,
)
from sageserve.dispatch.from_policy import instance_scheduling_of
from sageserve.dispatch.instance_order import FCFS, InstanceScheduling
from sageserve.metrics.engines import EngineKind, engine


def selector_labels(deployment: str, region: str, variant: str) -> dict[str, str]:
    """Labels that identify the pods of one pod set (immutable once created)."""
    return {LABEL_DEPLOYMENT: deployment, LABEL_REGION: region, LABEL_VARIANT: variant}


def scheduling_args(scheduling: InstanceScheduling) -> list[str]:
    """vLLM's scheduler for the policy's instance order (SageServe v3 §6.5): `priority`
    unless the order is FCFS (vLLM's default, which refuses a request's `priority`), so
    that the engine serves the `priority` the router sends lowest first, ties by arrival."""
    return ["--scheduling-policy", "priority"] if scheduling.ordered else []


def policy_scheduling(policies: Sequence[Mapping[str, Any]], name: str) -> InstanceScheduling:
    """The instance order of the ScalingPolicy `name` among `policies` (raw objects); FCFS
    when it is missing or does not validate (the policy reports its own problem)."""
    for raw in policies:
        if raw.get("metadata", {}).get("name") != name:
            continue
        try:
            policy = ScalingPolicy.model_validate(
                {f: raw[f] for f in ("apiVersion", "kind", "metadata", "spec") if f in raw}
            )
        except ValueError:
            return FCFS
        return instance_scheduling_of(policy.spec)
    return FCFS


def server_args(
    md: ModelDeployment, variant: Variant, scheduling: InstanceScheduling = FCFS
) -> list[str]:
    """The server's arguments for `md.spec.engine.kind`: what sageserve sets (model, served
    name, port, parallelism, context length; for vLLM the scheduler its policy's instance
    order needs; for SGLang its metrics switch), then the user's extra arguments."""
    spec = md.spec
    tp = variant.tensor_parallel or variant.gpus_per_instance // variant.pipeline_parallel
    served = spec.model.served_name or spec.model.name
    port = str(spec.engine.port)
    length = spec.model.context_length
    if spec.engine.kind is EngineKind.SGLANG:
        return [
            *("--model-path", spec.model.name, "--served-model-name", served),
            *("--host", "0.0.0.0", "--port", port),
            *("--tp-size", str(tp), "--pp-size", str(variant.pipeline_parallel)),
            *(["--context-length", str(length)] if length else []),
            "--enable-metrics",
            *spec.engine.args,
        ]
    if spec.engine.kind is EngineKind.TRTLLM:
        return [
            spec.model.name,
            *("--host", "0.0.0.0", "--port", port),
            *("--tp_size", str(tp), "--pp_size", str(variant.pipeline_parallel)),
            *(["--max_seq_len", str(length)] if length else []),
            *spec.engine.args,
        ]
    return [
        "--model",
        spec.model.name,
        "--served-model-name",
        served,
        "--port",
        port,
        "--tensor-parallel-size",
        str(tp),
        "--pipeline-parallel-size",
        str(variant.pipeline_parallel),
        *(["--max-model-len", str(length)] if length else []),
        *scheduling_args(scheduling),
        *spec.engine.args,
    ]


#: trtllm-serve serves Prometheus metrics only with `return_perf_metrics` (and iteration
#: stats for the queue and KV gauges) in its LLM API options, which it reads from a file.
TRTLLM_OPTIONS = "/tmp/sageserve-llm-api-options.yaml"
TRTLLM_LAUNCH = (
    "printf 'return_perf_metrics: true\\nenable_iter_perf_stats: true\\n' > "
    f'{TRTLLM_OPTIONS} && exec trtllm-serve "$@" --extra_llm_api_options {TRTLLM_OPTIONS}'
)


def server_command(kind: EngineKind) -> list[str] | None:
    """The container command for `kind`, None where the image's entrypoint is the server
    (vLLM's OpenAI image). SGLang's image has no server entrypoint; trtllm-serve is started
    by a shell that first writes the options that turn its Prometheus metrics on."""
    if kind is EngineKind.SGLANG:
        return ["python3", "-m", "sglang.launch_server"]
    if kind is EngineKind.TRTLLM:
        return ["/bin/sh", "-c", TRTLLM_LAUNCH, "trtllm-serve"]
    return None


def engine_container(
    md: ModelDeployment, args: list[str], gpus: str, probe_seconds: int
) -> dict[str, Any]:
    """The server container of a pod set (a ModelDeployment's or a ModelPool's)."""
    kind = md.spec.engine.kind
    command = server_command(kind)
    return {
        "name": kind.value,
        "image": md.spec.engine.image,
        **({"command": command} if command else {}),
        "args": args,
        "ports": [{"name": "http", "containerPort": md.spec.engine.port, "protocol": "TCP"}],
        "resources": {"requests": {GPU_RESOURCE: gpus}, "limits": {GPU_RESOURCE: gpus}},
        **engine_probes({"path": "/health", "port": "http"}, probe_seconds),
        "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"}],
    }


def pod_set_metadata(
    name: str,
    namespace: str,
    labels: dict[str, str],
    owner: ModelDeployment | ModelPool,
    owner_uid: str | None,
) -> dict[str, Any]:
    """A pod set's metadata, owned (garbage-collected with it) by `owner`, the
    ModelDeployment or ModelPool it serves, when its uid is known."""
    metadata: dict[str, Any] = {"name": name, "namespace": namespace, "labels": labels}
    if owner_uid is not None:
        metadata["ownerReferences"] = [
            {
                "apiVersion": owner.api_version,
                "kind": owner.kind,
                "name": owner.metadata.name,
                "uid": owner_uid,
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ]
    return metadata


def gpu_deployment(
    metadata: dict[str, Any],
    replicas: int,
    selector: dict[str, str],
    labels: dict[str, str],
    affinity: dict[str, Any],
    container: dict[str, Any],
    metrics_port: int,
    drain_seconds: int,
    annotations: dict[str, str] | None = None,
    metrics_path: str = "/metrics",
) -> dict[str, Any]:
    """The Deployment of a GPU pod set (a ModelDeployment's or a ModelPool's): one vLLM
    container on tolerated GPU nodes, scraped by Prometheus on `metrics_port`; a pod taken
    out of service is stopped `drain_seconds` after (`Variant.drain_seconds`, the rule the
    simulator's drained instances follow)."""
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": metadata,
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": selector},
            # GPUs are the scarce resource: replace pods in place rather than surge.
            "strategy": {
                "type": "RollingUpdate",
                "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1},
            },
            "template": {
                "metadata": {
                    "labels": labels,
                    "annotations": {
                        **(annotations or {}),
                        "prometheus.io/scrape": "true",
                        "prometheus.io/port": str(metrics_port),
                        "prometheus.io/path": metrics_path,
                    },
                },
                "spec": {
                    "affinity": affinity,
                    "tolerations": [
                        {"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}
                    ],
                    "containers": [container],
                    # Tensor parallelism exchanges tensors through shared memory.
                    "volumes": [{"name": "dshm", "emptyDir": {"medium": "Memory"}}],
                    "terminationGracePeriodSeconds": drain_seconds,
                },
            },
        },
    }


def engine_probes(probe: dict[str, Any], startup_seconds: int) -> dict[str, Any]:
    """The vLLM container's probes: loading weights takes up to `startup_seconds`, and only
    then do liveness checks begin (one rule for ModelDeployment and ModelPool pods)."""
    return {
        "startupProbe": {
            "httpGet": probe,
            "periodSeconds": 10,
            "failureThreshold": max(1, -(-startup_seconds // 10)) + 6,
        },
        "readinessProbe": {"httpGet": probe, "periodSeconds": 5},
        "livenessProbe": {"httpGet": probe, "periodSeconds": 15, "failureThreshold": 4},
    }


def render_pod_set(
    md: ModelDeployment,
    region: RegionPlacement,
    variant: Variant,
    replicas: int,
    namespace: str,
    owner_uid: str | None = None,
    node_labels: NodeLabels = DEFAULT_NODE_LABELS,
    scheduling: InstanceScheduling = FCFS,
) -> dict[str, Any]:
    """The apps/v1 Deployment serving `md` in `region` on `variant`, with `replicas` pods.

    Pods require the region, the GPU type and the serving pool by node affinity, so they
    never land on a donated (spot) node; GPUs are requested as `nvidia.com/gpu`.
    """
    name = md.metadata.name
    port = md.spec.engine.port
    selector = selector_labels(name, region.name, variant.name)
    labels = {
        "app.kubernetes.io/name": md.spec.engine.kind.value,
        "app.kubernetes.io/instance": name,
        COMPONENT_LABEL: COMPONENT_INFERENCE,
        MANAGED_BY_LABEL: MANAGED_BY,
        **selector,
    }
    gpus = str(variant.gpus_per_instance)
    metadata = pod_set_metadata(
        pod_set_name(name, region.name, variant.name), namespace, labels, md, owner_uid
    )
    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {
                        "matchExpressions": [
                            {"key": node_labels.region, "operator": "In", "values": [region.name]},
                            {
                                "key": node_labels.gpu_type,
                                "operator": "In",
                                "values": [variant.gpu_type],
                            },
                            {
                                "key": node_labels.pool,
                                "operator": "In",
                                "values": [node_labels.serving_pool],
                            },
                        ]
                    }
                ]
            }
        }
    }
    container = engine_container(
        md, server_args(md, variant, scheduling), gpus, variant.startup_seconds
    )
    return gpu_deployment(
        metadata,
        replicas,
        selector,
        labels,
        affinity,
        container,
        port,
        variant.drain_seconds,
        metrics_path=engine(md.spec.engine.kind).metrics_path,
    )


def render_pod_sets(
    md: ModelDeployment,
    replicas: dict[tuple[str, str], int],
    namespace: str,
    owner_uid: str | None = None,
    node_labels: NodeLabels = DEFAULT_NODE_LABELS,
    scheduling: InstanceScheduling = FCFS,
) -> list[dict[str, Any]]:
    """Every pod set of `md`; `replicas[(region, variant)]` defaults to the initial size.

    The initial size of a region (initialInstances, else minInstances) goes to its first
    variant: the planner spreads instances over variants once it has run.
    """
    out = []
    for region in md.spec.regions:
        initial = region.initial_instances
        if initial is None:
            initial = region.min_instances
        for i, variant in enumerate(md.spec.variants):
            default = initial if i == 0 else 0
            count = replicas.get((region.name, variant.name), default)
            out.append(
                render_pod_set(
                    md, region, variant, count, namespace, owner_uid, node_labels, scheduling
                )
            )
    return out
