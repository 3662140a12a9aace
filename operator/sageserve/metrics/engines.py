"""One table of the model-server metrics sageserve reads, per inference engine.

The names follow the model-server metrics protocol of the Gateway API Inference Extension
(proposal 003) as the llm-d router restates it per engine (`docs/plugin-metric-protocol.md`:
TotalQueuedRequests, TotalRunningRequests, KVCacheUtilization, BlockSize, NumGPUBlocks),
and each engine's own exporter for what that protocol does not cover (token counters, the
TTFT histogram): vLLM's `docs/usage/metrics.md`, SGLang's `production_metrics.md`,
TensorRT-LLM's `tensorrt_llm/metrics/collector.py` (trtllm-serve).

The table itself is `ENGINES` below, printed in docs/metrics.md: for each engine the
series of queued requests, running requests, KV-cache use (0–1), KV-cache size (vLLM's
and SGLang's `cache_config_info` labels, trtllm-serve's two gauges), prompt and generated
token counters, the TTFT histogram, and the path the server serves them on.

Triton's TensorRT-LLM backend is not an engine kind: its `nv_trt_llm_request_metrics` and
`nv_trt_llm_kv_cache_block_metrics` cover the queue and the KV cache, but it exports no
prompt/generated token counters and no TTFT histogram in seconds, which the forecaster and
the learned capacity read, and sageserve cannot render its model repository.

vLLM removed `vllm:gpu_cache_usage_perc` (the pre-V1 name of the KV gauge) and
`vllm:time_per_output_token_seconds`; neither is read.

Every query in `metrics.queries` is built from this table: one selector matches the
series of every engine kind at once (a pod exports only its own engine's names, and the
scrape configuration labels it with its ModelDeployment), so a namespace may mix engines
and every read stays one query. A signal an engine has no series for is `None` here and
its name is left out of the selector; `EngineMetrics.name` raises `MetricUnsupported`
naming the engine and the signal, so a caller never reads an absent series as zero.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from sageserve.metrics import vllm


class EngineKind(StrEnum):
    """The inference server a ModelDeployment's pods run (`spec.engine.kind`)."""

    VLLM = "vllm"
    SGLANG = "sglang"
    TRTLLM = "trtllm"


class Signal(StrEnum):
    """What sageserve reads from a model server, by its meaning."""

    WAITING = "queued requests"
    RUNNING = "running requests"
    KV_USAGE = "KV-cache usage"
    CACHE_CONFIG = "KV-cache size (info labels)"
    CACHE_BLOCKS = "KV-cache blocks (gauge)"
    CACHE_BLOCK_TOKENS = "KV-cache tokens per block (gauge)"
    PROMPT_TOKENS = "prompt tokens"
    GENERATION_TOKENS = "generated tokens"
    TTFT = "time to first token histogram"


class MetricUnsupported(LookupError):
    """An engine exports no series for a signal; the message names both."""


@dataclass(frozen=True)
class EngineMetrics:
    """The metric names one engine exports for each signal (None: no such series)."""

    kind: EngineKind
    waiting: str
    running: str
    kv_usage: str
    prompt_tokens: str
    generation_tokens: str
    ttft: str | None
    #: an info gauge whose labels size the KV cache, and those labels' names
    cache_config: str | None = None
    cache_blocks_label: str = "num_gpu_blocks"
    cache_block_size_label: str = "block_size"
    #: or two gauges: blocks in the KV cache, tokens per block
    cache_blocks: str | None = None
    cache_block_tokens: str | None = None
    #: HTTP path of the Prometheus exposition on the server's port
    metrics_path: str = "/metrics"

    def name(self, signal: Signal) -> str:
        """The series name of `signal`, or `MetricUnsupported` naming engine and signal."""
        found = {
            Signal.WAITING: self.waiting,
            Signal.RUNNING: self.running,
            Signal.KV_USAGE: self.kv_usage,
            Signal.CACHE_CONFIG: self.cache_config,
            Signal.CACHE_BLOCKS: self.cache_blocks,
            Signal.CACHE_BLOCK_TOKENS: self.cache_block_tokens,
            Signal.PROMPT_TOKENS: self.prompt_tokens,
            Signal.GENERATION_TOKENS: self.generation_tokens,
            Signal.TTFT: self.ttft,
        }[signal]
        if found is None:
            raise MetricUnsupported(f"engine {self.kind.value} exports no {signal.value} series")
        return found


ENGINES: dict[EngineKind, EngineMetrics] = {
    EngineKind.VLLM: EngineMetrics(
        kind=EngineKind.VLLM,
        waiting=vllm.REQUESTS_WAITING,
        running=vllm.REQUESTS_RUNNING,
        kv_usage=vllm.KV_CACHE_USAGE,
        prompt_tokens=vllm.PROMPT_TOKENS,
        generation_tokens=vllm.GENERATION_TOKENS,
        ttft=vllm.TTFT,
        cache_config=vllm.CACHE_CONFIG,
    ),
    EngineKind.SGLANG: EngineMetrics(
        kind=EngineKind.SGLANG,
        waiting="sglang:num_queue_reqs",
        running="sglang:num_running_reqs",
        kv_usage="sglang:token_usage",
        prompt_tokens="sglang:prompt_tokens_total",
        generation_tokens="sglang:generation_tokens_total",
        ttft="sglang:time_to_first_token_seconds",
        cache_config="sglang:cache_config_info",
        cache_blocks_label="num_pages",
        cache_block_size_label="page_size",
    ),
    EngineKind.TRTLLM: EngineMetrics(
        kind=EngineKind.TRTLLM,
        waiting="trtllm_num_requests_waiting",
        running="trtllm_num_requests_running",
        kv_usage="trtllm_kv_cache_utilization",
        prompt_tokens="trtllm_prompt_tokens_total",
        generation_tokens="trtllm_generation_tokens_total",
        ttft="trtllm_time_to_first_token_seconds",
        cache_blocks="trtllm_kv_cache_max_blocks",
        cache_block_tokens="trtllm_kv_cache_tokens_per_block",
        metrics_path="/prometheus/metrics",
    ),
}


def engine(kind: EngineKind | str) -> EngineMetrics:
    """The table's row for `kind`."""
    return ENGINES[EngineKind(kind)]


def names(signal: Signal) -> tuple[str, ...]:
    """Every engine's series name for `signal`, engines without one left out."""
    out: list[str] = []
    for row in ENGINES.values():
        try:
            out.append(row.name(signal))
        except MetricUnsupported:
            continue
    return tuple(out)


def name_pattern(*metric_names: str) -> str:
    """A regular expression matching `metric_names`, each with ':' or '_' after its engine
    prefix when it has a ':'.

    prometheus-client ≥ 0.22 escapes ':' to '_' in OpenMetrics samples unless the scraper
    negotiates UTF-8 names, so the same vLLM gauge reaches Prometheus 2.x as
    `vllm_kv_cache_usage_perc`; newer Prometheus keeps `vllm:kv_cache_usage_perc`. Names
    without ':' (trtllm-serve's) match as they are.
    """
    stems: dict[str, set[str]] = {}
    plain: set[str] = set()
    for n in metric_names:
        if ":" in n:
            prefix, stem = n.split(":", 1)
            stems.setdefault(prefix, set()).add(stem)
        else:
            plain.add(n)
    parts = [f"{p}[:_]({'|'.join(sorted(s))})" for p, s in sorted(stems.items())]
    parts += sorted(plain)
    return parts[0] if len(parts) == 1 else "(" + "|".join(parts) + ")"
