"""The operator's side of the decision step: snapshots from the cluster, decisions applied.

Pure, like the HPA's replica calculator: the pace loop only fetches (Deployments, pods,
Prometheus) and writes (scale, pod-deletion cost). Building an `EndpointSnapshot` here and
in the simulator (`sim.cluster.Endpoint.snapshot`) from the same facts gives the same
value, which the parity test checks:

- serving instances are the Ready pods that are not terminating and whose node is Ready
  (a pod on a lost node may still say Ready: nothing on the node can say otherwise); the
  rest of each pod
  set's `spec.replicas` is capacity on its way (pods still loading count as coming, not as
  missing), terminating pods are draining;
- each serving pod that reports KV usage becomes an `InstanceView` with its KV capacity
  from its engine's cache size (vLLM's `vllm:cache_config_info` num_gpu_blocks ×
  block_size, the other engines' equivalents: `metrics.engines`), so EMU is Σ used ÷ Σ
  capacity (`core.snapshot.emu`). When some pod does not export its cache size, every pod
  of the endpoint weighs the same (the mean of their usage);
- each pod's projected KV usage over the look-ahead (PreServe §4.3.1) is what the routers
  export (`sageserve_router_projected_kv_usage`, rebuilt by
  `PrometheusReader.pod_projections`): the router sees every request, the operator none;
- requests waiting are the pods' queues plus the requests the router holds for an
  endpoint with nothing serving (`sageserve_router_held_requests`): the demand that brings
  a model back from zero;
- each pod's running interactive requests (Chiron's interactive backpressure, only for
  the `chiron` strategy) are the routers' in-flight count per pod
  (`sageserve_router_pod_interactive_in_flight`): vLLM exports its running requests but not
  their tier, and the router knows the tier of what it sent;
- where an endpoint picker fronts a region's pods (`spec.signals.endpointPicker`), what it
  reports of the region's InferencePool (`metrics.picker`: its waiting requests,
  saturation and running requests), the pool found by name (`spec.regions[].
  inferencePool`, default `<name>-<region>`); the simulator's picker reads the same from its
  instances;
- the batch deadline need is the tokens/s the model's batch queue needs to meet every
  deadline, as the routers read the shared queue
  (`sageserve_batch_deadline_need_tokens_per_second`, `PrometheusReader.
  batch_deadline_needs`); each endpoint takes its share by serving instances, against the
  batch capacity of its serving instances under the Queue Manager's release threshold
  (`pace.pressure.with_deadline_need`, the simulator's rule; SageServe §6.2–§6.3), θ the
  model's (`api.model_deployment.model_theta_tps`).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from typing import Any

from sageserve.api.model_deployment import (
    ModelDeployment,
    inference_pool_name,
    model_theta_tps,
    pod_set_name,
)
from sageserve.api.workload_tier import WorkloadTier
from sageserve.controller.status import essence, is_ready
from sageserve.core.labels import LABEL_DEPLOYMENT, LABEL_REGION, LABEL_VARIANT
from sageserve.core.snapshot import Decision, EndpointSnapshot, InstanceView, PickerSignals
from sageserve.core.types import EndpointKey
from sageserve.metrics.prometheus import PodLoad, Series, TierTtft
from sageserve.pace.pressure import with_deadline_need

#: Capacity weight of a pod whose KV-cache size is unknown (see the module doc).
UNKNOWN_CAPACITY = 1.0


def _terminating(pod: Mapping[str, Any]) -> bool:
    return bool((pod.get("metadata") or {}).get("deletionTimestamp"))


def _replicas(deployment: Mapping[str, Any] | None) -> int:
    return int(((deployment or {}).get("spec") or {}).get("replicas") or 0)


def endpoint_snapshots(
    md: ModelDeployment,
    namespace: str,
    deployments: Mapping[str, Mapping[str, Any]],
    pods: Iterable[Mapping[str, Any]],
    loads: Mapping[str, PodLoad],
    tokens_per_s: Series,
    held_requests: Series | None = None,
    lost_nodes: Collection[str] = frozenset(),
    projections: Mapping[str, tuple[float, ...]] | None = None,
    batch_need_tps: float = 0.0,
    release_below: float = 0.6,
    ttft: Mapping[tuple[str, str, str], TierTtft] | None = None,
    ttft_slo_s: Mapping[str, float] | None = None,
    interactive_running: Mapping[str, int] | None = None,
    picker: Mapping[str, PickerSignals] | None = None,
    theta_tps: float | None = None,
) -> dict[EndpointKey, EndpointSnapshot]:
    """One snapshot per region of `md` that has a pod set (existing Deployments only);
    pods on `lost_nodes` (not Ready) are not serving. `projections` are each pod's
    projected KV usage as the routers export it (`PrometheusReader.pod_projections`);
    `batch_need_tps` the tokens/s the model's batch queue needs to meet every deadline
    (`PrometheusReader.batch_deadline_needs`), shared over the endpoints by serving
    instances, and `release_below` the EMU under which the Queue Manager releases batch
    work (`spec.routing.batchRelease`, SageServe §6.2: 60 %). `ttft` is each endpoint's
    TTFT P95 and count per tier over the last minute as the routers measured it on
    streamed answers (`PrometheusReader.tier_ttft`), `ttft_slo_s` each interactive tier's
    SLO (its WorkloadTier's `ttftP95Seconds`): the TTFT pressure of `pace.pressure`, read
    as the simulator reads its own minute histogram (`sim.cluster.TtftWindow`).
    `interactive_running` is each pod's interactive requests in flight as the routers count
    them (`PrometheusReader.pod_interactive_running`; a pod absent runs none), for Chiron's
    interactive backpressure; None leaves the count unobserved. `picker` is what the
    endpoint picker reports per InferencePool name (`PrometheusReader.picker_signals`); each
    region reads its own pool's (`inference_pool_name`); None: no picker read."""
    name = md.metadata.name
    variants = tuple(v.name for v in md.spec.variants)
    mine: dict[str, list[Mapping[str, Any]]] = {}
    for pod in pods:
        labels = (pod.get("metadata") or {}).get("labels") or {}
        if labels.get(LABEL_DEPLOYMENT) == name and labels.get(LABEL_VARIANT) in variants:
            mine.setdefault(str(labels.get(LABEL_REGION)), []).append(pod)
    out: dict[EndpointKey, EndpointSnapshot] = {}
    for region in md.spec.regions:
        sets = {v: deployments.get(pod_set_name(name, region.name, v)) for v in variants}
        if all(d is None for d in sets.values()):
            continue
        serving = [
            p
            for p in mine.get(region.name, [])
            if is_ready(p)
            and not _terminating(p)
            and (p.get("spec") or {}).get("nodeName") not in lost_nodes
        ]
        reporting = [p for p in serving if p["metadata"]["name"] in loads]
        sized = all(loads[p["metadata"]["name"]].kv_capacity_tokens for p in reporting)
        views = []
        for pod in reporting:
            load = loads[pod["metadata"]["name"]]
            cap = load.kv_capacity_tokens if sized and load.kv_capacity_tokens else UNKNOWN_CAPACITY
            variant = str(pod["metadata"]["labels"][LABEL_VARIANT])
            name_ = pod["metadata"]["name"]
            projection = (projections or {}).get(name_, ())
            running = None if interactive_running is None else interactive_running.get(name_, 0)
            views.append(
                InstanceView(
                    name_, variant, load.kv_usage * cap, cap, load.waiting, projection, running
                )
            )
        key3 = (namespace, name, region.name)
        key = EndpointKey(name, region.name)
        out[key] = EndpointSnapshot(
            key=key,
            min_instances=region.min_instances,
            max_instances=region.max_instances,
            replicas={v: _replicas(d) for v, d in sets.items() if d is not None},
            serving=len(serving),
            instances=tuple(views),
            draining=sum(1 for p in mine.get(region.name, []) if _terminating(p)),
            waiting=sum(i.waiting for i in views) + int((held_requests or {}).get(key3, 0)),
            tokens_per_s=tokens_per_s.get(key3, 0.0),
            variants=variants,
            ttft_p95_s=dict(seen.p95_s) if (seen := (ttft or {}).get(key3)) else {},
            ttft_samples=dict(seen.samples) if seen else {},
            ttft_slo_s=dict(ttft_slo_s or {}),
            picker=None if picker is None else picker.get(inference_pool_name(md, region)),
        )
    model_serving = sum(snap.serving for snap in out.values())
    theta = model_theta_tps(md) if theta_tps is None else theta_tps
    return {
        key: with_deadline_need(snap, batch_need_tps, model_serving, theta, release_below)
        for key, snap in out.items()
    }


def pod_set_changes(md: ModelDeployment, decision: Decision) -> dict[str, int]:
    """New `spec.replicas` per pod set name for one decision."""
    return {
        pod_set_name(md.metadata.name, decision.key.region, variant): replicas
        for variant, replicas in decision.replicas.items()
    }


def interactive_ttft_slo(tiers: Iterable[Mapping[str, Any]]) -> dict[str, float]:
    """Each interactive WorkloadTier's TTFT SLO (`spec.slo.ttftP95Seconds`) by name, the
    tier label the routers count first tokens under; a tier that does not validate is left
    out (its own status says why)."""
    out: dict[str, float] = {}
    for obj in tiers:
        try:
            tier = WorkloadTier.model_validate(essence(obj))
        except ValueError:
            continue
        slo = tier.spec.slo.ttft_p95_seconds
        if slo is not None and slo > 0:
            out[tier.metadata.name] = float(slo)
    return out
