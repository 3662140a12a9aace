"""PromQL for the signals the policy core consumes, grouped by (model deployment, region).

Pure string builders, so the exact queries are visible, testable against a real Prometheus,
and shared by the operator and the documentation.
"""

from __future__ import annotations

from sageserve.metrics import vllm

GROUP_BY = f"{vllm.LABEL_NAMESPACE}, {vllm.LABEL_MODEL_DEPLOYMENT}, {vllm.LABEL_REGION}"


def _selector(namespace: str | None) -> str:
    return f'{{{vllm.LABEL_NAMESPACE}="{namespace}"}}' if namespace else ""


def kv_usage_per_pod(namespace: str | None = None) -> str:
    """KV-cache usage (0–1) of every pod, under the new name or else the legacy one."""
    sel = _selector(namespace)
    return f"({vllm.KV_CACHE_USAGE}{sel} or {vllm.KV_CACHE_USAGE_LEGACY}{sel})"


def emu(namespace: str | None = None) -> str:
    """Effective memory utilisation per (model, region): mean KV usage over its pods.

    SageServe defines it as Σ KV used / Σ KV capacity; within one variant every pod has the
    same capacity, so the mean is that ratio. Pods of different variants are weighted
    equally here; `Observation` builders that know capacities can weight them.
    """
    return f"avg by ({GROUP_BY}) ({kv_usage_per_pod(namespace)})"


def tokens_per_second(window: str = "1m", namespace: str | None = None) -> str:
    """Input + output tokens/s per (model, region) over `window`: the forecaster's series."""
    sel = _selector(namespace)
    return (
        f"sum by ({GROUP_BY}) (rate({vllm.PROMPT_TOKENS}{sel}[{window}]) "
        f"+ rate({vllm.GENERATION_TOKENS}{sel}[{window}]))"
    )


def waiting_requests(namespace: str | None = None) -> str:
    """Queued requests per (model, region)."""
    return f"sum by ({GROUP_BY}) ({vllm.REQUESTS_WAITING}{_selector(namespace)})"


def ttft_quantile(q: float, window: str = "5m", namespace: str | None = None) -> str:
    """The q-quantile of time to first token per (model, region) over `window`."""
    sel = _selector(namespace)
    return (
        f"histogram_quantile({q}, sum by ({GROUP_BY}, le) "
        f"(rate({vllm.TTFT}_bucket{sel}[{window}])))"
    )
