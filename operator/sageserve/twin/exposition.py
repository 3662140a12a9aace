"""vLLM's Prometheus metrics for simulated pods, in the names current vLLM releases use.

Built with prometheus-client's metric families and encoders, as vLLM itself serves them,
so content negotiation (OpenMetrics or text 0.0.4) and name escaping are the real ones:
Prometheus 2.x asking for OpenMetrics stores `vllm_kv_cache_usage_perc`, a text-format
scraper `vllm:kv_cache_usage_perc`; the operator's queries accept both.

Per pod the series carry only `model_name`, like a vLLM server; the scrape configuration
adds namespace, model_deployment, region, variant and pod from the pod's labels (the
twin's file_sd targets carry them, as a pod scrape of real vLLM must). `with_pod_labels`
puts those labels on the series themselves, for one endpoint serving every pod
(`/metrics/pods`) and for the backfill, where no scrape adds them.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import Collector, CollectorRegistry

from sageserve.metrics import vllm
from sageserve.twin.load import PodSample

#: Labels a scrape of the pod adds (see `runner.file_sd`), in this order.
POD_LABELS = (
    vllm.LABEL_NAMESPACE,
    vllm.LABEL_MODEL_DEPLOYMENT,
    vllm.LABEL_REGION,
    vllm.LABEL_VARIANT,
    vllm.LABEL_POD,
)
#: vLLM's block size (tokens per KV block), for `vllm:cache_config_info`.
BLOCK_SIZE = 16


def pod_label_values(s: PodSample) -> tuple[str, ...]:
    p = s.pod
    return (p.namespace, p.model_deployment, p.region, p.variant, p.name)


def families(
    samples: Sequence[PodSample],
    with_pod_labels: bool = False,
    histograms: bool = True,
) -> list[Metric]:
    """The vLLM metric families of `samples` (one pod, or many with `with_pod_labels`)."""
    names = ["model_name", *(POD_LABELS if with_pod_labels else ())]

    def labels(s: PodSample) -> list[str]:
        model = s.pod.model_name or s.pod.model_deployment
        return [model, *(pod_label_values(s) if with_pod_labels else ())]

    kv = GaugeMetricFamily(
        vllm.KV_CACHE_USAGE, "KV-cache usage. 1 means 100 percent usage.", labels=names
    )
    running = GaugeMetricFamily(
        vllm.REQUESTS_RUNNING, "Number of requests in model execution batches.", labels=names
    )
    waiting = GaugeMetricFamily(
        vllm.REQUESTS_WAITING, "Number of requests waiting to be processed.", labels=names
    )
    prompt = CounterMetricFamily(
        vllm.PROMPT_TOKENS, "Number of prefill tokens processed.", labels=names
    )
    generation = CounterMetricFamily(
        vllm.GENERATION_TOKENS, "Number of generation tokens processed.", labels=names
    )
    success = CounterMetricFamily(
        "vllm:request_success",
        "Count of successfully processed requests.",
        labels=[*names, "finished_reason"],
    )
    preemptions = CounterMetricFamily(
        "vllm:num_preemptions", "Cumulative number of preemption from the engine.", labels=names
    )
    config = GaugeMetricFamily(
        vllm.CACHE_CONFIG,
        "Information of the LLMEngine CacheConfig",
        labels=[*names, "block_size", "num_gpu_blocks"],
    )
    ttft = HistogramMetricFamily(
        vllm.TTFT, "Histogram of time to first token in seconds.", labels=names
    )
    e2e = HistogramMetricFamily(
        vllm.E2E, "Histogram of e2e request latency in seconds.", labels=names
    )
    for s in samples:
        lv = labels(s)
        c = s.counters
        kv.add_metric(lv, s.kv_usage)
        running.add_metric(lv, s.running)
        waiting.add_metric(lv, s.waiting)
        prompt.add_metric(lv, c.prompt_tokens)
        generation.add_metric(lv, c.generation_tokens)
        success.add_metric([*lv, "length"], c.requests_finished)
        preemptions.add_metric(lv, c.preemptions)
        blocks = s.kv_capacity_tokens // BLOCK_SIZE
        config.add_metric([*lv, str(BLOCK_SIZE), str(blocks)], 1.0)
        if histograms:
            ttft.add_metric(lv, c.ttft.cumulative(), c.ttft.total)
            e2e.add_metric(lv, c.e2e.cumulative(), c.e2e.total)
    out: list[Metric] = [kv, running, waiting, prompt, generation, success, preemptions, config]
    if histograms:
        out += [ttft, e2e]
    return out


class _Fixed(Collector):
    def __init__(self, metrics: Iterable[Metric]) -> None:
        self.metrics = list(metrics)

    def collect(self) -> Iterator[Metric]:
        return iter(self.metrics)


def encode(metrics: Iterable[Metric], accept: str | None) -> tuple[bytes, str]:
    """(body, content type) for an HTTP request with this Accept header."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Fixed(metrics))
    encoder, content_type = choose_encoder(accept or "")
    return encoder(registry), content_type


def twin_families(
    sim_time: float,
    speed: float,
    lag_s: float,
    endpoints: Mapping[tuple[str, str, str], Mapping[str, float]],
) -> list[Metric]:
    """The twin's own metrics: simulated time, lag behind the clock, load per endpoint."""
    t = GaugeMetricFamily("sageserve_twin_sim_time_seconds", "Simulated (trace) time.")
    t.add_metric([], sim_time)
    s = GaugeMetricFamily("sageserve_twin_speed", "Simulated seconds per wall second.")
    s.add_metric([], speed)
    lag = GaugeMetricFamily(
        "sageserve_twin_lag_seconds", "How far the simulation trails its clock (simulated s)."
    )
    lag.add_metric([], lag_s)
    names = ["namespace", "model_deployment", "region"]
    out: list[Metric] = [t, s, lag]
    for metric, doc, kind in (
        ("arrived", "Requests the trace sent to the endpoint.", "counter"),
        ("rejected", "Requests refused: no serving pod.", "counter"),
        (
            "refused",
            "Requests refused at arrival: prompt + output beyond the model's context length "
            "(vLLM's HTTP 400).",
            "counter",
        ),
        ("lost", "Requests lost with a pod that stopped, or too long for its KV cache.", "counter"),
        ("serving_pods", "Pods of the endpoint that serve.", "gauge"),
        ("load_multiplier", "Current multiplier of the trace's request rate.", "gauge"),
    ):
        family: Metric
        if kind == "counter":
            family = CounterMetricFamily(f"sageserve_twin_requests_{metric}", doc, labels=names)
        else:
            family = GaugeMetricFamily(f"sageserve_twin_{metric}", doc, labels=names)
        for ep, values in sorted(endpoints.items()):
            family.add_metric(list(ep), values[metric])
        out.append(family)
    return out
