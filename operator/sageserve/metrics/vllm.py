"""The vLLM metrics sageserve reads (the default engine of `metrics.engines`' table).

vLLM removed `vllm:gpu_cache_usage_perc` (the pre-V1 name of the KV gauge) and
`vllm:time_per_output_token_seconds`; neither is read. Every series carries
`model_name`; the scrape configuration adds the pod set's `namespace`, `pod`,
`model_deployment`, `region` and `variant` from the pod labels (for every engine alike).
"""

from __future__ import annotations

#: Fraction (0–1) of KV-cache blocks in use: SageServe's effective memory utilisation.
KV_CACHE_USAGE = "vllm:kv_cache_usage_perc"
#: Requests in the running batch and in the queue.
REQUESTS_RUNNING = "vllm:num_requests_running"
REQUESTS_WAITING = "vllm:num_requests_waiting"
#: Token counters; their rates sum to the tokens/s the forecaster and LT-UA use.
PROMPT_TOKENS = "vllm:prompt_tokens_total"
GENERATION_TOKENS = "vllm:generation_tokens_total"
#: Latency histograms (seconds) for SLO attainment.
TTFT = "vllm:time_to_first_token_seconds"
E2E = "vllm:e2e_request_latency_seconds"
#: Cache configuration (an info metric whose `num_gpu_blocks` label sizes the KV cache).
CACHE_CONFIG = "vllm:cache_config_info"

#: Labels the scrape configuration attaches from the pod (see the Helm chart's PodMonitor).
LABEL_MODEL_DEPLOYMENT = "model_deployment"
LABEL_REGION = "region"
LABEL_VARIANT = "variant"
LABEL_NAMESPACE = "namespace"
LABEL_POD = "pod"

#: Buckets (seconds) of vLLM's TTFT histogram, so the twin's histograms aggregate with real ones.
TTFT_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
)
