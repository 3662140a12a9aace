"""The operator's windows for θ learned from the fleet (`plan.learned_capacity`).

Read from Prometheus at each plan, over the policy's `spec.capacity.historySeconds` on a
one-minute grid: per pod set (model, region, variant) the prompt + generated tokens/s its
pods served (vLLM's counters), the pods reporting and their mean KV usage, and per (model,
region) each tier's TTFT P95 and first tokens counted by the routers (streamed answers).
A window is one grid point; the learning rule is the pure step's, shared with the
simulator (`sim/capacity_windows.py`). Reading the whole history at each plan keeps the
operator stateless: a restart learns the same θ.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from sageserve.metrics import queries, vllm
from sageserve.metrics.prometheus import PrometheusReader
from sageserve.plan.learned_capacity import (
    CapacityKey,
    CapacityWindow,
    LearnedCapacity,
    tier_slo_met,
)

#: the grid of the windows, seconds (PreServe §4.1 profiles per window; one minute is the
#: decision step's TTFT window in both worlds)
STEP_S = 60.0

#: (model, region) → tier → one value per grid point
TierSeries = Mapping[tuple[str, str], Mapping[str, Sequence[float]]]


def _finite(v: float) -> bool:
    return math.isfinite(v)


def windows_from_series(
    times: Sequence[float],
    tokens: Mapping[CapacityKey, Sequence[float]],
    instances: Mapping[CapacityKey, Sequence[float]],
    emu: Mapping[CapacityKey, Sequence[float]],
    ttft_p95: TierSeries,
    ttft_count: TierSeries,
    slo_s: Mapping[str, float],
) -> list[CapacityWindow]:
    """One window per pod set and grid point where its pods reported: keys are (model,
    variant, region); a point Prometheus has no value for (NaN) is a gap, not a zero."""
    out: list[CapacityWindow] = []
    for key in sorted(instances):
        model, variant, region = key
        pods, tps, kv = instances[key], tokens.get(key, ()), emu.get(key, ())
        p95 = ttft_p95.get((model, region), {})
        count = ttft_count.get((model, region), {})
        for i, at in enumerate(times):
            n = pods[i] if i < len(pods) else math.nan
            t = tps[i] if i < len(tps) else math.nan
            u = kv[i] if i < len(kv) else math.nan
            if not (_finite(n) and n > 0 and _finite(t) and _finite(u)):
                continue
            tier_p95 = {k: v[i] for k, v in p95.items() if i < len(v) and _finite(v[i])}
            tier_n = {k: round(v[i]) for k, v in count.items() if i < len(v) and _finite(v[i])}
            met = tier_slo_met(tier_p95, tier_n, slo_s)
            out.append(CapacityWindow(at, model, variant, region, t, n, u, met))
    return out


def read_windows(
    reader: PrometheusReader,
    namespace: str,
    slo_s: Mapping[str, float],
    end: float,
    seconds: float,
) -> list[CapacityWindow]:
    """The windows of `namespace` over the last `seconds` ending at `end` (Unix time);
    raises `MetricsUnavailable` when Prometheus does not answer."""
    window = f"{int(STEP_S)}s"
    n = max(1, int(seconds // STEP_S))
    times = [end - (n - 1 - i) * STEP_S for i in range(n)]

    def per_pod_set(expr: str) -> dict[CapacityKey, list[float]]:
        out: dict[CapacityKey, list[float]] = {}
        for labels, values in reader.series(expr, end, seconds, STEP_S):
            if labels.get(vllm.LABEL_NAMESPACE, namespace) != namespace:
                continue
            key = (
                labels.get(vllm.LABEL_MODEL_DEPLOYMENT, ""),
                labels.get(vllm.LABEL_VARIANT, ""),
                labels.get(vllm.LABEL_REGION, ""),
            )
            if all(key):
                out[key] = values
        return out

    def per_tier(expr: str) -> dict[tuple[str, str], dict[str, list[float]]]:
        out: dict[tuple[str, str], dict[str, list[float]]] = {}
        for labels, values in reader.series(expr, end, seconds, STEP_S):
            if labels.get(vllm.LABEL_NAMESPACE, namespace) != namespace:
                continue
            key = (labels.get(vllm.LABEL_MODEL_DEPLOYMENT, ""), labels.get(vllm.LABEL_REGION, ""))
            tier = labels.get("tier", "")
            if all(key) and tier:
                out.setdefault(key, {})[tier] = values
        return out

    return windows_from_series(
        times,
        per_pod_set(queries.variant_tokens_per_second(window, namespace)),
        per_pod_set(queries.variant_instances(window, namespace)),
        per_pod_set(queries.variant_emu(window, namespace)),
        per_tier(queries.router_ttft_p95(namespace, window)),
        per_tier(queries.router_ttft_count(namespace, window)),
        slo_s,
    )


def interactive_slos(tiers: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """Each interactive WorkloadTier's TTFT SLO (seconds), by name, from the objects."""
    out: dict[str, float] = {}
    for t in tiers:
        spec = t.get("spec") or {}
        slo = (spec.get("slo") or {}).get("ttftP95Seconds")
        if spec.get("type") == "interactive" and slo is not None:
            out[str(t["metadata"]["name"])] = float(slo)
    return out


def capacity_status(
    learned: Mapping[CapacityKey, LearnedCapacity], now: datetime
) -> dict[str, list[dict[str, Any]]]:
    """`status.capacity` of each ModelDeployment, by name."""
    out: dict[str, list[dict[str, Any]]] = {}
    for (model, variant, region), lc in sorted(learned.items()):
        entry: dict[str, Any] = {
            "variant": variant,
            "region": region,
            "declaredTokensPerSecond": round(lc.declared_tps, 3),
            "inForceTokensPerSecond": round(lc.in_force_tps, 3),
            "windows": lc.windows,
            "qualifyingWindows": lc.qualifying,
            "trusted": lc.trusted,
            "learnedAt": now.isoformat(),
        }
        if lc.learned_tps is not None:
            entry["learnedTokensPerSecond"] = round(lc.learned_tps, 3)
        out.setdefault(model, []).append(entry)
    return out
