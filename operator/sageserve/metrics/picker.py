"""One table from an endpoint picker's (EPP's) Prometheus series to sageserve's pressure
signals, and the PromQL built from it.

Where an InferencePool's endpoint picker runs in front of a region's pods, it sees demand
the engines do not: with flow control on, it holds requests in its own queue while the
pool is saturated, so the engines' queues stay short and their KV caches below the
scale-out threshold while requests wait at the gateway. The pace step reads the picker's
signals next to the engines' (`pace.pressure.endpoint_pressure`, the largest of the two).

The table is `PICKERS` below (printed with the reasons in docs/metrics.md):

- **waiting** ← the pool's mean engine queue × its ready pods, plus the requests the
  picker holds in its flow-control queue (summed over its replicas): every request
  admitted and not yet in a batch, which is what vLLM's `num_requests_waiting` counts on
  one pod; read on the queue pressure's scale (waiting per serving instance ÷ 5);
- **saturation** ← the flow-control saturation gauge (the largest over `stage`): the
  default utilization detector's mean over pods of max(waiting ÷ 5, KV ÷ 0.8), 1.0 at its
  gating set point. That is the queue pressure's own scale (its queue threshold is the
  same 5 per pod as `pace.pressure.QUEUE_SATURATION`), and its KV term passes 1 only above
  80 % KV, where EMU is already over the 70 % scale-out threshold: it never scales out for
  memory before EMU would;
- **running** ← the pool's mean running requests × its ready pods: vLLM's
  `num_requests_running`. Reported with the pressure, not a pressure itself: the KV the
  running requests hold is EMU's, and no per-pod batch limit is known to measure them by.

Names and labels were read from the sources: GAIE v1.3.0 and v1.5.0
`pkg/epp/metrics/metrics.go` (the pool gauges carry the pool's name as `name`, the flow
control gauges as `inference_pool`; v1.3.0 has no saturation or running gauge per pool;
GAIE v1.6.0 ships no EPP, only the conformance `lwepp`: its EPP moved to llm-d-router)
and llm-d-router `pkg/epp/metrics/llm_d_router_metrics.go` and `docs/metrics.md`. The
per-model running gauges (`inference_objective_running_requests{model_name}`,
`llm_d_epp_request_running{model_name, ...}`) carry no pool label, so they cannot be told
apart by region and are not read. The flow-control gauges exist only with flow control on:
absent, the picker holds no queue of its own and its waiting is the engines'.

Matching: every series is read per pool name (`inference_pool`, or `name` renamed to it)
and namespace (the scrape target's, which is the pool's: an InferencePool's
`endpointPickerRef` names a Service of its own namespace). A pool is the endpoint
(ModelDeployment, region) whose `spec.regions[].inferencePool` names it, by default
`<ModelDeployment name>-<region>` (`api.model_deployment.inference_pool_name`). Picker
replicas each watch the whole pool, so their pool gauges are one figure (the largest is
read); each holds its own flow-control queue, so those are summed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

from sageserve.core.snapshot import PickerSignals
from sageserve.metrics import vllm

__all__ = ["PICKERS", "POOL_LABEL", "PickerKind", "PickerMetrics", "PickerSignals"]

#: The picker's default utilization detector: an endpoint's saturation is the larger of
#: its waiting requests ÷ 5 and its KV use ÷ 0.8 (llm-d-router `saturationdetector/
#: utilization`: DefaultQueueDepthThreshold, DefaultKVCacheUtilThreshold); the simulator's
#: picker reads its instances with the same rule (`sim.cluster.Endpoint.picker_signals`).
QUEUE_THRESHOLD = 5.0
KV_THRESHOLD = 0.8

#: The label the flow-control series name the pool by; the pool gauges' `name` is renamed to
#: it so that every picker query answers per pool alike.
POOL_LABEL = "inference_pool"


class PickerKind(StrEnum):
    """Which endpoint picker's metrics the pace loop reads (`spec.signals.endpointPicker`)."""

    NONE = "none"
    GAIE = "gaie"
    LLM_D = "llm-d"


@dataclass(frozen=True)
class PickerMetrics:
    """One picker's series for each signal (None: it exports none)."""

    kind: PickerKind
    #: requests held in the picker's flow-control queue, per pool (label `inference_pool`)
    gateway_queue: str
    #: the pool's mean engine queue and its ready pods (label `name`)
    average_queue: str
    ready_pods: str
    #: the saturation detector's reading, per pool (label `inference_pool`)
    saturation: str | None
    #: the pool's mean running requests (label `name`)
    average_running: str | None


PICKERS: dict[PickerKind, PickerMetrics] = {
    PickerKind.GAIE: PickerMetrics(
        kind=PickerKind.GAIE,
        gateway_queue="inference_extension_flow_control_queue_size",
        average_queue="inference_pool_average_queue_size",
        ready_pods="inference_pool_ready_pods",
        saturation="inference_extension_flow_control_pool_saturation",
        average_running="inference_pool_average_running_requests",
    ),
    PickerKind.LLM_D: PickerMetrics(
        kind=PickerKind.LLM_D,
        gateway_queue="llm_d_epp_flow_control_queue_size",
        average_queue="llm_d_epp_average_queue_size",
        ready_pods="llm_d_epp_ready_endpoints",
        saturation="llm_d_epp_flow_control_pool_saturation",
        average_running="llm_d_epp_average_running_requests",
    ),
}


def _ns(namespace: str) -> str:
    return f'{vllm.LABEL_NAMESPACE}="{namespace}"'


def _per_pool_product(average: str, ready: str, namespace: str) -> str:
    """average × ready pods per pool (their labels are the same target's), the largest over
    picker replicas, the pool named by `inference_pool`."""
    product = f"{average}{{{_ns(namespace)}}} * {ready}{{{_ns(namespace)}}}"
    renamed = f'label_replace({product}, "{POOL_LABEL}", "$1", "name", "(.+)")'
    return f"max by ({vllm.LABEL_NAMESPACE}, {POOL_LABEL}) ({renamed})"


def engine_queue(picker: PickerMetrics, namespace: str) -> str:
    """Requests queued in the pool's engines as the picker reads them, per pool."""
    return _per_pool_product(picker.average_queue, picker.ready_pods, namespace)


def gateway_queue(picker: PickerMetrics, namespace: str) -> str:
    """Requests the picker holds before dispatch, per pool, summed over its replicas."""
    return (
        f"sum by ({vllm.LABEL_NAMESPACE}, {POOL_LABEL}) "
        f"({picker.gateway_queue}{{{_ns(namespace)}}})"
    )


def saturation(picker: PickerMetrics, namespace: str) -> str | None:
    """The pool's saturation (the largest over stages and replicas), or None where the
    picker exports none."""
    if picker.saturation is None:
        return None
    series = f"{picker.saturation}{{{_ns(namespace)}}}"
    return f"max by ({vllm.LABEL_NAMESPACE}, {POOL_LABEL}) ({series})"


def running(picker: PickerMetrics, namespace: str) -> str | None:
    """Requests running in the pool's engines, per pool, or None where it exports none."""
    if picker.average_running is None:
        return None
    return _per_pool_product(picker.average_running, picker.ready_pods, namespace)


def combine(
    engine_queue: Mapping[str, float],
    gateway_queue: Mapping[str, float],
    saturation: Mapping[str, float],
    running: Mapping[str, float],
) -> dict[str, PickerSignals]:
    """Each pool's signals from the four per-pool readings (`engine_queue` … `running`'s
    queries): waiting is the engines' queues plus the picker's own (0 when its flow-control
    series is absent: flow control off). A pool with no engine-queue reading is absent, so
    a picker silent on a pool is reported, never read as an idle one."""
    return {
        pool: PickerSignals(
            round(waiting + gateway_queue.get(pool, 0.0)),
            saturation.get(pool),
            None if pool not in running else round(running[pool]),
        )
        for pool, waiting in engine_queue.items()
    }
