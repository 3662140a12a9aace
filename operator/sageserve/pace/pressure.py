"""Queue pressure: what KV-cache usage does not show, as one more scaling signal.

Why: every strategy of SageServe (§4 reactive 70/30, §6.4 LT-U / LT-UA) reads effective
memory utilisation (EMU) alone. EMU measures memory, not work: when prompts are long, an
instance is bound by prefill compute long before its KV cache fills, so requests queue
while EMU stays low and no EMU rule ever scales out (seen on a ServeGen day: a Bloom
endpoint at the floor of 2 with a backlog growing to 65,000 requests over 20 hours, KV
under 50 %, IW-F TTFT P50 43 minutes). The Kubernetes HPA and AIBrix compute a size per
metric and take the largest; here each extra signal is put on EMU's scale and the
strategies read the largest (`load`), so their thresholds, cooldowns and plans apply
unchanged:

- **backlog**: requests waiting per serving instance, against a saturation level of 5
  (`QUEUE_SATURATION`: the default queue-depth threshold of the Gateway API Inference
  Extension's saturation detector and of llm-d's workload-variant autoscaler). At the
  level the signal equals the scale-out threshold; above it the endpoint scales out; it
  blocks scale-in from 3/7 of it (2.1 waiting per instance at the 70/30 band), so the
  fleet does not shrink onto a queue. A backlog that keeps growing crosses the level
  whatever the rate;
- **TTFT**: the P95 time to first token of each interactive tier over the last minute,
  against the tier's TTFT SLO (WorkloadTier `ttftP95Seconds`; SageServe §2.2). It counts
  only above the SLO (ratio > 1), since a P95 within it is the SLO met, and only with at
  least `TTFT_MIN_SAMPLES` first tokens, so one slow request in a quiet minute is no trend;
- **deadline**: the tokens/s the model's batch queue needs so that every queued request
  finishes by its deadline (`dispatch.deadlines.required_tps`, earliest deadline first; the
  endpoint's share of it), against the batch capacity of the endpoint's serving instances
  below the release threshold: `serving × θ × 60 %`, θ the per-instance capacity the plan
  sizes with (capacityTokensPerSecond, §6.3) and 60 % the EMU under which the Queue
  Manager releases batch work (§6.2). Why that capacity: released batch work holds an
  instance at most at the release threshold, so no EMU rule (70 % to scale out) ever sees
  it; the trough release gives batch at most that share of an instance. At 1 the queue
  needs all of it and the endpoint scales out, which lowers EMU and lets the Queue Manager
  release more; interactive load is not subtracted (EMU shows it, and the strategies read
  the largest signal, not a sum), so the signal errs late, never early.

- **endpoint picker**: where an InferencePool's endpoint picker fronts the endpoint
  (`spec.signals.endpointPicker`), its requests waiting (its flow-control queue plus the
  engines' queues as it reads them) on the backlog's scale, and its saturation as it is
  (1.0 at the picker's gating set point: the utilization detector's mean over pods of
  max(waiting ÷ 5, KV ÷ 0.8), the same queue level of 5 as the backlog's). The picker
  holds requests back while its pool is saturated, so the engines' queues stay short and
  their KV below the scale-out threshold while requests wait at the gateway: only the
  picker sees that demand. The step reads the larger of the picker's and the engines'
  pressure, not their sum, as the Kubernetes HPA (one replica count per metric, the
  largest taken) and AIBrix's autoscalers do, and as EMU and the backlog are combined
  here: the picker's queue counts the engines' queues again and its saturation is made of
  the engines' own queues and KV, so a sum would count one overload twice. A saturation
  of exactly 1.0 may be the picker's fail-closed reading of stale metrics; at 1.0 the
  signal equals the scale-out threshold without passing it, so it only holds scale-in.

A queue-side signal at its level also holds scale-in for the policy's
`spec.intervals.scaleInStabilizationSeconds` (`SCALE_IN_STABILIZATION_S`, 300 s, by
default: the HPA's default scale-down stabilization window): prefill-bound capacity shows
no EMU,
so without it the instance a queue brought is removed as soon as the queue is gone (EMU
under 30 %) and the queue forms again, an instance started and drained every few minutes.
EMU-driven decisions are unchanged.

Pure functions of the decision step's snapshot: the operator (per-pod engine queues, the
routers' batch deadline need gauge, the picker's series) and the simulator (its
instances' queues, its own TTFT histogram, its Queue Manager's need, its picker's reading
of its instances) feed the same facts, and `pace.step.decide` applies
the same rule. Both worlds put a model's deadline need on its endpoints' snapshots with
one function, `with_deadline_need`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace

from sageserve.core.snapshot import EndpointSnapshot, PickerSignals
from sageserve.core.types import EndpointObservation

#: Waiting requests per serving instance at which an instance counts as saturated
#: (gateway-api-inference-extension `DefaultQueueDepthThreshold`, llm-d WVA
#: `queueLengthThreshold`: both 5).
QUEUE_SATURATION = 5.0
#: First tokens of a tier in the window below which its TTFT P95 is not acted on.
TTFT_MIN_SAMPLES = 20
#: Seconds after a queue-side signal at its level during which no scale-in happens
#: (Kubernetes HPA `behavior.scaleDown.stabilizationWindowSeconds` default).
SCALE_IN_STABILIZATION_S = 300.0


@dataclass(frozen=True)
class Pressure:
    """Queue-side signals of one endpoint, each 1.0 at its saturation level."""

    #: waiting requests per serving instance ÷ `QUEUE_SATURATION`
    queue: float = 0.0
    #: the worst interactive tier's TTFT P95 ÷ its SLO, when above 1 (else 0)
    ttft: float = 0.0
    waiting: int = 0
    tier: str = ""
    #: the batch tokens/s the deadlines need ÷ the endpoint's batch capacity
    deadline: float = 0.0
    need_tps: float = 0.0
    #: the endpoint picker's pressure: the larger of its waiting requests per serving
    #: instance ÷ `QUEUE_SATURATION` and its saturation (0 without a picker)
    picker: float = 0.0
    picker_reason: str = ""

    @property
    def ratio(self) -> float:
        return max(self.queue, self.picker, self.ttft, self.deadline)

    def describe(self) -> str:
        """Which signal dominates, for Events and logs."""
        if self.deadline > 0 and self.deadline >= max(self.queue, self.ttft, self.picker):
            return (
                f"batch deadline pressure: {self.need_tps:.0f} tok/s needed, "
                f"{self.deadline:.1f}x batch capacity"
            )
        if self.ttft >= max(self.queue, self.picker) and self.ttft > 0:
            return f"{self.tier} TTFT P95 {self.ttft:.1f}x its SLO"
        if self.picker > self.queue:
            return self.picker_reason
        return f"{self.waiting} waiting, {self.queue * QUEUE_SATURATION:.1f} per instance"


def queue_pressure(waiting: int, serving: int, saturation: float = QUEUE_SATURATION) -> float:
    """Waiting requests per serving instance ÷ the saturation level; 0 with nothing serving
    (bringing an endpoint back from zero is the step's floor rule, not a ratio)."""
    if serving <= 0 or waiting <= 0:
        return 0.0
    return waiting / (serving * saturation)


def picker_pressure(picker: PickerSignals | None, serving: int) -> tuple[float, str]:
    """(the endpoint picker's pressure, what makes it): the larger of its waiting requests
    per serving instance ÷ `QUEUE_SATURATION` and its saturation; 0 without a picker or with
    nothing serving (an empty pool reads as saturated to the picker; bringing an endpoint
    back from zero is the step's floor rule, which reads the picker's waiting requests)."""
    if picker is None or serving <= 0:
        return 0.0, ""
    queue = queue_pressure(picker.waiting, serving)
    saturation = picker.saturation
    if saturation is not None and math.isfinite(saturation) and saturation > queue:
        return saturation, f"endpoint picker saturation {saturation:.2f}"
    if queue <= 0:
        return 0.0, ""
    per = picker.waiting / serving
    return queue, f"endpoint picker: {picker.waiting} waiting, {per:.1f} per instance"


def ttft_pressure(
    p95_s: Mapping[str, float],
    samples: Mapping[str, int],
    slo_s: Mapping[str, float],
    min_samples: int = TTFT_MIN_SAMPLES,
) -> tuple[float, str]:
    """(worst P95 ÷ SLO over the tiers with an SLO and enough samples, that tier), the
    ratio counting only above 1 (a P95 within the SLO is no pressure)."""
    worst, tier = 0.0, ""
    for name, slo in sorted(slo_s.items()):
        p95 = p95_s.get(name)
        if p95 is None or slo <= 0 or samples.get(name, 0) < min_samples:
            continue
        ratio = p95 / slo
        if ratio > 1.0 and ratio > worst:
            worst, tier = ratio, name
    return worst, tier


def batch_capacity_tps(serving: int, theta_tps: float, release_below: float) -> float:
    """Batch tokens/s `serving` instances give under the trough release: each serves θ
    tokens/s at full load and the Queue Manager fills it only below `release_below` EMU
    (SageServe §6.2: 60 %)."""
    return max(0, serving) * max(0.0, theta_tps) * max(0.0, release_below)


def deadline_pressure(need_tps: float, capacity_tps: float) -> float:
    """Batch tokens/s the deadlines need ÷ the batch capacity; 0 with no need or no
    capacity (an endpoint with nothing serving is the floor rule's)."""
    if need_tps <= 0 or capacity_tps <= 0:
        return 0.0
    return need_tps / capacity_tps


def with_deadline_need(
    snap: EndpointSnapshot,
    need_tps: float,
    model_serving: int,
    theta_tps: float,
    release_below: float,
) -> EndpointSnapshot:
    """`snap` with its share of its model's batch deadline need and its batch capacity, as
    the decision step reads them (`deadline_pressure`).

    Why a share: the batch queue is global per model (SageServe §6.1), so the need is the
    model's, not an endpoint's; each serving endpoint takes the part of it its serving
    instances are of the `model_serving` instances of all the model's endpoints, so every
    endpoint of the model reads the same ratio (need ÷ the model's batch capacity) and the
    one that scales out first lowers it for all. `snap` unchanged when there is no need,
    no θ, or nothing serving there (bringing an endpoint back from zero is the floor
    rule's). `theta_tps` is θ (capacityTokensPerSecond, §6.3) and `release_below` the EMU
    under which the Queue Manager releases batch work (§6.2: 60 %)."""
    if need_tps <= 0 or theta_tps <= 0 or snap.serving <= 0:
        return snap
    share = need_tps * snap.serving / max(model_serving, snap.serving)
    capacity = batch_capacity_tps(snap.serving, theta_tps, release_below)
    return replace(snap, batch_need_tps=share, batch_capacity_tps=capacity)


def endpoint_pressure(ep: EndpointSnapshot) -> Pressure:
    """The queue-side signals of one endpoint snapshot."""
    ttft, tier = ttft_pressure(ep.ttft_p95_s, ep.ttft_samples, ep.ttft_slo_s)
    deadline = deadline_pressure(ep.batch_need_tps, ep.batch_capacity_tps)
    picker, picker_reason = picker_pressure(ep.picker, ep.serving)
    return Pressure(
        queue_pressure(ep.waiting, ep.serving),
        ttft,
        ep.waiting,
        tier,
        deadline,
        ep.batch_need_tps if deadline > 0 else 0.0,
        picker,
        picker_reason,
    )


def holds_scale_in(
    now: float, saturated_at: float | None, window_s: float = SCALE_IN_STABILIZATION_S
) -> bool:
    """Whether a scale-in waits: a queue-side signal was at its level within `window_s`."""
    return saturated_at is not None and now - saturated_at < window_s


def load(obs: EndpointObservation, scale_out_above: float) -> float:
    """The signal a strategy compares with its thresholds: the largest of EMU and the
    queue-side pressure put on EMU's scale (pressure 1 = the scale-out threshold)."""
    return max(obs.emu, scale_out_above * obs.pressure)


def load_reason(obs: EndpointObservation, scale_out_above: float) -> str:
    """What `load` is made of: EMU, or the queue signal that exceeds it."""
    if scale_out_above * obs.pressure > obs.emu:
        return f"{obs.pressure_reason} (EMU {obs.emu:.0%})"
    return f"EMU {obs.emu:.0%}"
