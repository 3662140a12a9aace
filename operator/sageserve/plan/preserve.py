"""PreServe's service-level window plan (PreServe §4.1, Alg. 2): instances per window from
separate forecasts of prompt and decode tokens.

Why separate: an instance's prefill and decode capacities differ, and the mix moves (a code
service sends long prompts for short answers, a chat service the reverse), so one token
total sized on one mix over- or under-provisions the other. PreServe forecasts prompt
tokens P̂ and decode tokens D̂ of the next window and takes

    N = max(P̂ / μ_p, D̂ / μ_d, (P̂ + D̂) / μ_t)

with μ_p, μ_d, μ_t the prompt, decode and total tokens/s one instance serves within the SLO
(`sageserve calibrate --preserve` measures them per variant; μ_t is the variant's θ,
`capacityTokensPerSecond`). Without μ_p and μ_d the plan sizes on μ_t alone and says so.

Settled here (the paper leaves them open):
- the forecaster is the policy's (`forecast/`, `forecast_peak`) on the series of window
  means (tokens/s per window), reaching two windows ahead: the peak of P̂_i and P̂_{i+1},
  the two steps of Alg. 2 (at a window's start its own total is not known yet);
- the forecast provisioned is the point forecast, or the upper quantile when the policy's
  `forecast.quantile` is above 0.5 (the same rule as the hourly cycle);
- N is rounded up and clamped to the region's [minInstances, maxInstances], and placed on
  the model's first variant (the one whose μ sized it);
- batch tiers add β, the policy's share of the last hour's batch rate, to P̂ and D̂ (the
  hourly cycle's buffer), since batch work is released into the troughs.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from sageserve.api.model_deployment import ModelDeployment, Variant
from sageserve.api.scaling_policy import ScalingPolicySpec
from sageserve.core.snapshot import Plan
from sageserve.core.types import EndpointKey
from sageserve.forecast.api import batch_buffer_tps, forecast_peak
from sageserve.forecast.types import ForecastSpec
from sageserve.plan.learned_capacity import ThetaTable, theta_of

#: (model, region) -> tokens/s per minute, oldest first, the last minute ending now.
PerEndpoint = Mapping[tuple[str, str], Sequence[float]]


@dataclass(frozen=True)
class ServiceRates:
    """μ of one variant: tokens/s one instance serves within the SLO (PreServe §4.1)."""

    total: float
    prefill: float | None = None
    decode: float | None = None

    @property
    def measured(self) -> bool:
        """Whether μ_p and μ_d are known (else sizing uses μ_t alone)."""
        return self.prefill is not None and self.decode is not None


def service_rates(variant: Variant, total: float | None = None) -> ServiceRates:
    """μ_t, μ_p, μ_d as the ModelDeployment records them (θ and the calibrated rates);
    `total` replaces μ_t where θ was learned from the fleet (`plan.learned_capacity`)."""
    return ServiceRates(
        variant.capacity_tokens_per_second if total is None else total,
        variant.prefill_tokens_per_second,
        variant.decode_tokens_per_second,
    )


def window_instances(prompt_tps: float, decode_tps: float, rates: ServiceRates) -> int:
    """N = ⌈max(P̂/μ_p, D̂/μ_d, (P̂ + D̂)/μ_t)⌉, the terms whose μ is known (PreServe Alg. 2).

    Rates and forecasts are both tokens/s, so the window's length cancels out."""
    p, d = max(0.0, prompt_tps), max(0.0, decode_tps)
    terms = [(p + d) / rates.total] if rates.total > 0 else []
    if rates.prefill:
        terms.append(p / rates.prefill)
    if rates.decode:
        terms.append(d / rates.decode)
    if not terms:
        raise ValueError("no service rate to size with: μ_t must be > 0")
    return math.ceil(max(terms) - 1e-9)


def window_means(per_minute: Sequence[float], window_s: float) -> list[float]:
    """Mean tokens/s of each whole window of `per_minute`, the last window ending now
    (a partial window at the start is dropped)."""
    per = max(1, round(window_s / 60.0))
    values = np.asarray(per_minute, dtype=np.float64)
    whole = (len(values) // per) * per
    if whole == 0:
        return []
    return [float(v) for v in values[len(values) - whole :].reshape(-1, per).mean(axis=1)]


def window_forecast_spec(policy: ScalingPolicySpec) -> ForecastSpec:
    """The forecaster's settings for windows: step = window, two windows ahead."""
    w = float(policy.preserve.window_seconds)
    f = policy.forecast
    return ForecastSpec(
        step_seconds=w,
        lead_seconds=0.0,
        horizon_seconds=2 * w,
        quantile=f.quantile,
        min_history_seconds=max(3 * w, float(f.training_window_seconds)),
        arima_order=(f.order.p, f.order.d, f.order.q) if f.order else None,
    )


def window_history_minutes(policy: ScalingPolicySpec) -> int:
    """Minutes of per-minute history a window plan reads: enough whole windows for the
    policy's forecaster to fit on (its `min_points` on the window grid: 15 windows, 150
    minutes, for the default seasonal AR) and at least the training window. Fewer, and
    every window plan would run on the fallback forecaster. The operator reads this much
    (`controller.window_loop`), and so does the simulator."""
    from sageserve.forecast.methods import get_forecaster

    spec = window_forecast_spec(policy)
    try:
        points = get_forecaster(policy.forecast.method.value).min_points(spec)
    except KeyError:
        points = 0
    return math.ceil(max(points * spec.step_seconds, spec.min_history_seconds) / 60.0)


def apportion_batch(
    prompt: Sequence[float], decode: Sequence[float], batch: Sequence[float]
) -> tuple[list[float], list[float], list[float], list[float]]:
    """(interactive prompt, interactive decode, batch prompt, batch decode) tokens/s per
    minute: each minute's batch tokens/s split in that minute's prompt : generated
    proportion of all traffic (a router counts batch tokens as one total). A gap in any
    series stays a gap; batch never exceeds the traffic (an interactive rate is ≥ 0)."""
    out: tuple[list[float], list[float], list[float], list[float]] = ([], [], [], [])
    for p, d, b in zip(prompt, decode, batch, strict=False):
        if not (math.isfinite(p) and math.isfinite(d) and math.isfinite(b)):
            nan = math.nan
            for series, v in zip(out, (p, d, nan, nan), strict=True):
                series.append(v)
            continue
        total = max(0.0, p) + max(0.0, d)
        share = max(0.0, p) / total if total > 0 else 0.5
        bp, bd = max(0.0, b) * share, max(0.0, b) * (1.0 - share)
        for series, v in zip(out, (max(0.0, p - bp), max(0.0, d - bd), bp, bd), strict=True):
            series.append(v)
    return out


#: The window plan reads the last hour of batch as its buffer β (`plan_window`).
BATCH_MINUTES = 60


def window_inputs(
    prompt: PerEndpoint, decode: PerEndpoint, batch: PerEndpoint
) -> tuple[PerEndpoint, PerEndpoint, PerEndpoint, PerEndpoint]:
    """`plan_window`'s inputs from what a cluster counts per (model, serving region) and
    minute: prompt and generated tokens/s of all traffic, and batch tokens/s served (one
    total), over the same minutes. Where batch is counted, it is taken out of prompt and
    decode (`apportion_batch`) and its last hour is β; elsewhere all traffic is
    interactive. The operator's window loop and the simulator's window planner both call
    this, so a window is planned alike from alike counts."""
    prompt, decode = dict(prompt), dict(decode)
    batch_prompt: dict[tuple[str, str], list[float]] = {}
    batch_decode: dict[tuple[str, str], list[float]] = {}
    for key, b in batch.items():
        if key in prompt and key in decode:
            prompt[key], decode[key], bp, bd = apportion_batch(prompt[key], decode[key], b)
            batch_prompt[key], batch_decode[key] = bp[-BATCH_MINUTES:], bd[-BATCH_MINUTES:]
    return prompt, decode, batch_prompt, batch_decode


@dataclass(frozen=True)
class WindowForecast:
    """P̂ and D̂ of one endpoint (tokens/s, β included), what made them, and N."""

    prompt_tps: float
    decode_tps: float
    instances: int
    method: str
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class WindowPlan:
    """One window's plan: instances per (model, region, variant) and the forecasts."""

    targets: dict[tuple[str, str, str], int]
    forecasts: dict[tuple[str, str], WindowForecast] = field(default_factory=dict)
    rates: dict[tuple[str, str], ServiceRates] = field(default_factory=dict)

    def in_force(self, computed_at: float) -> Plan:
        """The plan the decision step follows (its `forecasts` are P̂ + D̂ tokens/s)."""
        return Plan(
            computed_at,
            {(EndpointKey(m, r), v): n for (m, r, v), n in self.targets.items()},
            {
                EndpointKey(m, r): f.prompt_tps + f.decode_tps
                for (m, r), f in self.forecasts.items()
            },
            {EndpointKey(m, r): rt.total for (m, r), rt in self.rates.items()},
        )


def _provisioned(
    history: Sequence[float], spec: ForecastSpec, method: str, fallback: str
) -> tuple[float, str, tuple[str, ...], bool]:
    fc = forecast_peak(window_means(history, spec.step_seconds), spec, method, fallback)
    value = fc.upper_tps if spec.quantile > 0.5 else fc.peak_tps
    notes = fc.notes + ((fc.fallback_reason,) if fc.fallback_reason else ())
    return max(0.0, value), fc.method, notes, fc.reliable


def plan_window(
    mds: Sequence[ModelDeployment],
    policy: ScalingPolicySpec,
    prompt_tps: PerEndpoint,
    decode_tps: PerEndpoint,
    batch_prompt_tps: PerEndpoint,
    batch_decode_tps: PerEndpoint,
    current: Mapping[tuple[str, str, str], int],
    theta: ThetaTable | None = None,
    held_regions: frozenset[str] = frozenset(),
) -> WindowPlan:
    """The window plan of `mds` from interactive prompt / decode tokens/s per minute (ending
    now) and the last hour's batch prompt / decode tokens/s per minute; `theta` the learned
    θ in force per (md, variant, region), μ_t there. An endpoint in `held_regions` (its
    cluster is silent, `plan.member_clusters`) keeps `current`, every variant as it is."""
    spec = window_forecast_spec(policy)
    method, fallback = policy.forecast.method.value, policy.forecast.fallback.value
    fraction = policy.forecast.batch_buffer_fraction
    targets: dict[tuple[str, str, str], int] = {}
    forecasts: dict[tuple[str, str], WindowForecast] = {}
    rates: dict[tuple[str, str], ServiceRates] = {}
    for md in mds:
        name = md.metadata.name
        first = md.spec.variants[0]
        for region in md.spec.regions:
            key = (name, region.name)
            mu = service_rates(first, theta_of(name, first, region.name, theta))
            rates[key] = mu
            if region.name in held_regions:
                kept = {
                    v.name: current.get((name, region.name, v.name), 0) for v in md.spec.variants
                }
                for vname, n in kept.items():
                    targets[(name, region.name, vname)] = n
                note = ("its cluster is silent: held at the plan in force",)
                forecasts[key] = WindowForecast(0.0, 0.0, sum(kept.values()), "held", note)
                continue
            p, how, p_notes, p_ok = _provisioned(prompt_tps.get(key, []), spec, method, fallback)
            d, _, d_notes, d_ok = _provisioned(decode_tps.get(key, []), spec, method, fallback)
            p += batch_buffer_tps(batch_prompt_tps.get(key, []), fraction)
            d += batch_buffer_tps(batch_decode_tps.get(key, []), fraction)
            notes = tuple(dict.fromkeys(p_notes + d_notes))
            if not mu.measured:
                notes += (
                    f"{first.name}: μ_p/μ_d not calibrated, sized on θ = "
                    f"{mu.total:g} tokens/s alone (sageserve calibrate --preserve)",
                )
            if p_ok and d_ok:
                n = window_instances(p, d, mu)
            else:  # no usable history: hold what runs (never scale on missing data)
                n = sum(current.get((name, region.name, v.name), 0) for v in md.spec.variants)
                notes += ("no usable history: holding the current size",)
            n = max(region.min_instances, min(region.max_instances, n))
            forecasts[key] = WindowForecast(p, d, n, how, notes)
            for v in md.spec.variants:
                targets[(name, region.name, v.name)] = n if v is first else 0
    return WindowPlan(targets, forecasts, rates)


__all__ = [
    "ServiceRates",
    "WindowForecast",
    "WindowPlan",
    "plan_window",
    "service_rates",
    "window_forecast_spec",
    "window_history_minutes",
    "window_instances",
    "window_means",
]
