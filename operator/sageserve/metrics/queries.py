"""PromQL for the signals the policy core consumes, grouped by (model deployment, region).

Pure string builders, so the exact queries are visible, testable against a real Prometheus,
and shared by the operator and the documentation.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from sageserve.metrics import vllm
from sageserve.metrics.engines import Signal, name_pattern, names

__all__ = ["name_pattern"]

GROUP_BY = f"{vllm.LABEL_NAMESPACE}, {vllm.LABEL_MODEL_DEPLOYMENT}, {vllm.LABEL_REGION}"


def _selector(namespace: str | None, *metric_names: str) -> str:
    matchers = [f'__name__=~"{name_pattern(*metric_names)}"']
    if namespace:
        matchers.append(f'{vllm.LABEL_NAMESPACE}="{namespace}"')
    return "{" + ", ".join(matchers) + "}"


def engine_selector(signal: Signal, namespace: str | None = None, suffix: str = "") -> str:
    """Every engine kind's series of `signal` (`metrics.engines`), `suffix` appended to each
    name (`_bucket` of a histogram)."""
    return _selector(namespace, *(n + suffix for n in names(signal)))


def kv_usage_per_pod(namespace: str | None = None) -> str:
    """KV-cache usage (0–1) of every pod, whichever engine it runs."""
    return engine_selector(Signal.KV_USAGE, namespace)


def kv_blocks_per_pod(namespace: str | None = None) -> str:
    """The engines' cache-configuration info gauges of every pod (vLLM's `num_gpu_blocks`
    and `block_size` labels, SGLang's `num_pages` and `page_size`), which size the pod's KV
    cache, so that EMU can be Σ used ÷ Σ capacity (`core.snapshot.emu`)."""
    return engine_selector(Signal.CACHE_CONFIG, namespace)


def kv_block_gauges_per_pod(namespace: str | None = None) -> str:
    """The engines' KV-cache size gauges of every pod (trtllm-serve's blocks and tokens per
    block), the metric name kept so the reader tells them apart."""
    metric_names = names(Signal.CACHE_BLOCKS) + names(Signal.CACHE_BLOCK_TOKENS)
    return _selector(namespace, *metric_names)


def waiting_per_pod(namespace: str | None = None) -> str:
    """Requests queued in every pod, whichever engine it runs."""
    return engine_selector(Signal.WAITING, namespace)


def token_rate(counter: Signal, window: str = "1m", namespace: str | None = None) -> str:
    """Tokens/s of one token counter (`Signal.PROMPT_TOKENS` or `Signal.GENERATION_TOKENS`,
    every engine's name) per (model, region) over `window`."""
    return f"sum by ({GROUP_BY}) (rate({engine_selector(counter, namespace)}[{window}]))"


def prompt_tokens_per_second(window: str = "1m", namespace: str | None = None) -> str:
    """Prompt (prefill) tokens/s per (model, region): PreServe's P series (§4.1)."""
    return token_rate(Signal.PROMPT_TOKENS, window, namespace)


def generation_tokens_per_second(window: str = "1m", namespace: str | None = None) -> str:
    """Generated (decode) tokens/s per (model, region): PreServe's D series (§4.1)."""
    return token_rate(Signal.GENERATION_TOKENS, window, namespace)


def tokens_per_second(window: str = "1m", namespace: str | None = None) -> str:
    """Input + output tokens/s per (model, region) over `window`: the forecaster's series."""
    # Two sums, not one rate over both names: rate() drops the metric name, and two series
    # of one pod with the same labels are an error in Prometheus 2.x.
    prompt = prompt_tokens_per_second(window, namespace)
    output = generation_tokens_per_second(window, namespace)
    return f"(({prompt}) + ({output})) or ({prompt}) or ({output})"


#: per pod set: (model deployment, region, variant)
GROUP_BY_VARIANT = f"{GROUP_BY}, {vllm.LABEL_VARIANT}"


def variant_tokens_per_second(window: str = "1m", namespace: str | None = None) -> str:
    """Prompt + generated tokens/s per (model, region, variant) over `window`: what a pod set's
    instances served together, the learned θ's numerator (`plan.learned_capacity`)."""
    parts = [
        f"sum by ({GROUP_BY_VARIANT}) (rate({engine_selector(c, namespace)}[{window}]))"
        for c in (Signal.PROMPT_TOKENS, Signal.GENERATION_TOKENS)
    ]
    return f"(({parts[0]}) + ({parts[1]})) or ({parts[0]}) or ({parts[1]})"


def variant_instances(window: str = "1m", namespace: str | None = None) -> str:
    """Pods reporting KV usage per (model, region, variant), averaged over `window`."""
    sel = kv_usage_per_pod(namespace)
    return f"avg_over_time((count by ({GROUP_BY_VARIANT}) ({sel}))[{window}:])"


def variant_emu(window: str = "1m", namespace: str | None = None) -> str:
    """EMU per (model, region, variant): its pods' KV usage averaged over `window` (the pods
    of one pod set share one KV-cache size, so the mean is Σ used ÷ Σ capacity)."""
    sel = kv_usage_per_pod(namespace)
    return f"avg by ({GROUP_BY_VARIANT}) (avg_over_time({sel}[{window}]))"


def waiting_requests(namespace: str | None = None) -> str:
    """Queued requests per (model, region)."""
    return f"sum by ({GROUP_BY}) ({waiting_per_pod(namespace)})"


def ttft_quantile(q: float, window: str = "5m", namespace: str | None = None) -> str:
    """The q-quantile of time to first token per (model, region) over `window`."""
    sel = engine_selector(Signal.TTFT, namespace, "_bucket")
    return f"histogram_quantile({q}, sum by ({GROUP_BY}, le) (rate({sel}[{window}])))"


#: The router's time to first byte per endpoint, tier and whether the answer streams (a
#: histogram with vLLM's TTFT buckets, `router.metrics`).
ROUTER_TTFT = "sageserve_router_ttft_seconds"


def _streamed(namespace: str | None) -> str:
    ns = f'{vllm.LABEL_NAMESPACE}="{namespace}", ' if namespace else ""
    return "{" + ns + 'stream="true"}'


def router_ttft_p95(namespace: str | None = None, window: str = "1m") -> str:
    """Each tier's P95 time to first token per (model, region) over `window`, as the
    routers measured it on streamed answers (a non-streamed answer's first byte is its
    end): the TTFT side of the decision step's queue pressure (`pace.pressure`)."""
    sel = f"{ROUTER_TTFT}_bucket{_streamed(namespace)}"
    return f"histogram_quantile(0.95, sum by ({GROUP_BY}, tier, le) (increase({sel}[{window}])))"


def router_ttft_count(namespace: str | None = None, window: str = "1m") -> str:
    """Streamed first tokens counted per (model, region, tier) over `window` (too few: no
    signal)."""
    sel = f"{ROUTER_TTFT}_count{_streamed(namespace)}"
    return f"sum by ({GROUP_BY}, tier) (increase({sel}[{window}]))"


#: The router's gauge of requests it holds for an endpoint with no ready pod (scale from
#: zero: the activator pattern of Knative and KEDA's HTTP add-on).
HELD_REQUESTS = "sageserve_router_held_requests"


def held_requests(namespace: str | None = None) -> str:
    """Requests held by the router per (model, region): demand for an endpoint at zero."""
    matcher = f'{{{vllm.LABEL_NAMESPACE}="{namespace}"}}' if namespace else ""
    return f"sum by ({GROUP_BY}) ({HELD_REQUESTS}{matcher})"


#: The router's gauge of each pod's projected KV usage over the look-ahead, by quantile
#: (`dispatch.anticipator.projection_quantiles`; PreServe §4.3.1).
PROJECTED_KV = "sageserve_router_projected_kv_usage"


def projected_kv_per_pod(namespace: str | None = None) -> str:
    """Each pod's projected KV-usage quantiles, summed over router replicas (each projects
    only the requests it sent; the sum of their quantiles is at least the quantile of the
    sum, so the operator errs toward capacity)."""
    matcher = f'{{{vllm.LABEL_NAMESPACE}="{namespace}"}}' if namespace else ""
    return f"sum by ({vllm.LABEL_POD}, quantile) ({PROJECTED_KV}{matcher})"


#: The router's gauge of interactive-tier requests in flight on each pod (Chiron's
#: interactive backpressure counts the pods with at least one; `pace.chiron`).
POD_INTERACTIVE = "sageserve_router_pod_interactive_in_flight"


def pod_interactive_in_flight(namespace: str | None = None) -> str:
    """Each pod's interactive requests in flight, summed over router replicas (each counts
    only what it sent)."""
    matcher = f'{{{vllm.LABEL_NAMESPACE}="{namespace}"}}' if namespace else ""
    return f"sum by ({vllm.LABEL_POD}) ({POD_INTERACTIVE}{matcher})"


#: The router's counter of tokens answered per endpoint and tier.
ROUTER_TOKENS = "sageserve_router_tokens"

#: The router's counter of answered requests per endpoint by (prompt, output) length bucket
#: (`prompt_le`, `output_le`: `forecast.request_types.SHAPE_BOUNDS`): OServe's history of
#: request types (§5.1), read by the operator's layout loop.
REQUEST_SHAPES = "sageserve_router_request_shapes"


def request_shapes(namespace: str, model: str, region: str, seconds: int) -> str:
    """Requests the routers answered per (prompt_le, output_le) bucket for one (model,
    region) over the last `seconds`: the history OServe's request types are fitted on (§5.1),
    summed over router replicas."""
    matchers = (
        f'{vllm.LABEL_NAMESPACE}="{namespace}", {vllm.LABEL_MODEL_DEPLOYMENT}="{model}", '
        f'{vllm.LABEL_REGION}="{region}"'
    )
    return (
        f"sum by (prompt_le, output_le) "
        f"(increase({REQUEST_SHAPES}_total{{{matchers}}}[{int(seconds)}s]))"
    )


def request_shape_rates(namespace: str, model: str, region: str, window: str) -> str:
    """Requests/s the routers answered per (prompt_le, output_le) bucket for one (model,
    region) over `window`, summed over router replicas: evaluated on a grid (a range query),
    the per-step series of each bucket the layout loop forecasts per type (OServe §5.1)."""
    matchers = (
        f'{vllm.LABEL_NAMESPACE}="{namespace}", {vllm.LABEL_MODEL_DEPLOYMENT}="{model}", '
        f'{vllm.LABEL_REGION}="{region}"'
    )
    return f"sum by (prompt_le, output_le) (rate({REQUEST_SHAPES}_total{{{matchers}}}[{window}]))"


def router_tokens(window: str, namespace: str, tiers: Sequence[str]) -> str:
    """Tokens/s the router answered per (model, region) for `tiers` over `window`: the
    batch share of served load when the tiers are the batch ones, with no PromQL from the
    user."""
    return (
        f"sum by ({GROUP_BY}) (rate({ROUTER_TOKENS}_total{{{_tiers(namespace, tiers)}}}[{window}]))"
    )


#: Tokens of Batch API requests accepted into the router's queue.
BATCH_ACCEPTED_TOKENS = "sageserve_batch_accepted_tokens"


def batch_received(window: str, namespace: str, tiers: Sequence[str]) -> str:
    """Batch load *received* per (model, region): SageServe's β is 10 % of the batch load
    received in the last hour (§6.3), not of what the troughs let through.

    A model whose routers count Batch API acceptances (`sageserve_batch_accepted_tokens`,
    in the accepting router's home region) is read from that counter alone: its tokens in
    the regions that accepted, 0 in every other region where it served batch tiers. Why
    not add what the router served: the released queue work is served through the router
    in whichever region has a trough and counted there in `sageserve_router_tokens` under
    its batch tier, so accepted + served would count it twice, once where it was accepted
    and again where it ran; and the two are one series, so synchronous batch-tier requests
    of such a model are not told apart and not counted. A model with no acceptance series
    (batch sent synchronously only) is read from what the router served of its batch
    tiers, per region: each such request is served once, where it was received. The
    simulator counts received batch the same way (`sim.engine`: per home region, 0
    elsewhere)."""
    queued = (
        f"sum by ({GROUP_BY}) "
        f"(rate({BATCH_ACCEPTED_TOKENS}_total{{{_tiers(namespace, tiers)}}}[{window}]))"
    )
    served = router_tokens(window, namespace, tiers)
    model = f"{vllm.LABEL_NAMESPACE}, {vllm.LABEL_MODEL_DEPLOYMENT}"
    return f"({queued}) or (({served}) unless on ({model}) ({queued})) or (0 * ({served}))"


def _tiers(namespace: str, tiers: Sequence[str]) -> str:
    names = "|".join(re.escape(t) for t in sorted(tiers))
    return f'{vllm.LABEL_NAMESPACE}="{namespace}", tier=~"{names}"'


#: Tokens/s a model's batch queue needs so that every queued request finishes by its
#: deadline, earliest deadline first (`dispatch.deadlines.required_tps`), as each router
#: replica reads the shared queue (labels: namespace, model_deployment).
BATCH_DEADLINE_NEED = "sageserve_batch_deadline_need_tokens_per_second"


def batch_deadline_need(namespace: str) -> str:
    """Tokens/s each model's batch queue needs to meet every deadline (SageServe §6.3's
    24-hour NIW deadline), per (namespace, model_deployment). Every router replica reads
    the same shared queue, so the replicas' figures are one figure: their largest, not
    their sum."""
    return (
        f"max by ({vllm.LABEL_NAMESPACE}, {vllm.LABEL_MODEL_DEPLOYMENT}) "
        f'({BATCH_DEADLINE_NEED}{{{vllm.LABEL_NAMESPACE}="{namespace}"}})'
    )


#: Requests the router received per pooled model (`router/pool_switcher.py`), labelled with the pool
#: as `model_deployment` and the pooled model as `model`.
ROUTER_POOL_REQUESTS = "sageserve_router_pool_requests"


def pool_requests(window: str, namespace: str, pool: str) -> str:
    """Requests/s per (pooled model, region) of one ModelPool over `window`, the pooled
    model's name in `model_deployment` so the series key as every endpoint's do."""
    selector = f'namespace="{namespace}", model_deployment="{pool}"'
    inner = f"rate({ROUTER_POOL_REQUESTS}_total{{{selector}}}[{window}])"
    moved = f'label_replace({inner}, "model_deployment", "$1", "model", "(.+)")'
    return f"sum by ({GROUP_BY}) ({moved})"
