"""Measure θ (`capacityTokensPerSecond`) of each variant on the scenario's own request mix.

Why: the planner turns forecast tokens/s into instances by dividing by θ. A θ that is too
high under-provisions (LT-I then misses the interactive SLO on every request), one that is
too low wastes GPUs. θ is not a property of the hardware alone: it depends on the prompt
and output lengths of the traffic. So we measure it with the simulator's own instance model:
one instance of the variant, pinned (min = max = 1), fed Poisson arrivals whose sizes are
drawn from the scenario's requests for that model, at increasing token rates.

θ is the highest rate at which, after a warm-up, the instance holds both
- the tightest interactive tier's TTFT at P95 (the SLO the plan must keep), and
- a mean KV-cache use at or below the scale-out threshold (so LT-U/UA's reactive layer does
  not immediately fight the plan).
The search is a bisection on the rate; each probe is a short, deterministic simulation.

With `preserve=True` it also measures PreServe's μ_p and μ_d (PreServe §4.1, Alg. 1: the
most prompt and decode tokens/s one instance serves within the SLO). The paper takes the
best window of a serving history whose mix varies; here the mix is made to vary: μ_p is
the prompt share of θ measured on the quarter of the requests with the highest prompt share
(the most prefill-heavy mix the traffic holds), μ_d the output share of θ on the quarter
with the highest output share. μ_t is θ on the whole mix. The three are written as the
variant's `prefillTokensPerSecond`, `decodeTokensPerSecond` and `capacityTokensPerSecond`.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from sageserve.core.percentile import percentile
from sageserve.core.types import Request, Tier
from sageserve.pace.base import make_strategy
from sageserve.perf.model import VariantPerf
from sageserve.sim.cluster import Node
from sageserve.sim.engine import ModelSetup, RegionPlacement, SimConfig, Simulation
from sageserve.sim.scenario import PERF_PROFILE_ANNOTATION, Scenario

_REGION = "calibration"


@dataclass(frozen=True)
class Probe:
    """One simulated rate and what the instance did under it."""

    tokens_per_s: float
    ttft_p95_s: float
    mean_kv: float
    finished_share: float

    def holds(self, ttft_slo_s: float, kv_target: float) -> bool:
        return (
            self.ttft_p95_s <= ttft_slo_s
            and self.mean_kv <= kv_target
            and self.finished_share >= 0.99
        )


@dataclass(frozen=True)
class Capacity:
    """θ of one (model, variant) and the probes that found it."""

    model: str
    variant: str
    configured_tps: float
    measured_tps: float
    mean_request_tokens: float
    probes: tuple[Probe, ...]
    #: μ_p and μ_d (PreServe), when measured (`calibrate(..., preserve=True)`)
    prefill_tps: float | None = None
    decode_tps: float | None = None


def request_sizes(
    scenario: Scenario, limit_per_model: int = 20000, seed: int = 7
) -> dict[str, list[tuple[int, int]]]:
    """(prompt, output) tokens of the scenario's requests per model (a uniform sample)."""
    rng = random.Random(seed)
    out: dict[str, list[tuple[int, int]]] = {}
    seen: dict[str, int] = {}
    for req in scenario.requests():
        bucket = out.setdefault(req.model, [])
        n = seen.get(req.model, 0) + 1
        seen[req.model] = n
        if len(bucket) < limit_per_model:
            bucket.append((req.prompt_tokens, req.output_tokens))
        else:  # reservoir sampling keeps the sample uniform over the whole window
            j = rng.randrange(n)
            if j < limit_per_model:
                bucket[j] = (req.prompt_tokens, req.output_tokens)
    return out


def _arrivals(
    model: str,
    tier: Tier,
    sizes: Sequence[tuple[int, int]],
    rate_tps: float,
    duration_s: float,
    seed: int,
) -> Iterator[Request]:
    rng = random.Random(seed)
    mean_tokens = sum(p + o for p, o in sizes) / len(sizes)
    per_s = rate_tps / mean_tokens
    t, n = 0.0, 0
    while True:
        t += rng.expovariate(per_s)
        if t >= duration_s:
            return
        p, o = sizes[rng.randrange(len(sizes))]
        yield Request(n, t, model, tier, _REGION, p, o)
        n += 1


def probe(
    perf: VariantPerf,
    variant: str,
    model: str,
    tier: Tier,
    sizes: Sequence[tuple[int, int]],
    rate_tps: float,
    duration_s: float = 1800.0,
    warmup_s: float = 300.0,
    seed: int = 1,
) -> Probe:
    """Run one pinned instance at `rate_tps` and measure TTFT P95 and mean KV use."""
    cfg = SimConfig(
        models=(ModelSetup(model, ((variant, perf),), (RegionPlacement(_REGION, 1, 1, 1),)),),
        nodes=(Node("calibration-0", _REGION, perf.gpu_type, "serving", max(8, perf.gpus)),),
        start_s=0.0,
        end_s=duration_s,
        drain_s=600.0,
        seed=seed,
        region_order=(_REGION,),
    )
    reqs = list(_arrivals(model, tier, sizes, rate_tps, duration_s, seed))
    sim = Simulation(cfg, make_strategy("reactive"), reqs)
    res = sim.run()
    stats = res.stats.get((tier.name, model))
    ttft = np.asarray(stats.ttft) if stats is not None else np.zeros(0)
    # KV use after the warm-up only (the instance starts empty); TTFT over every request,
    # which the short empty start makes at most slightly optimistic
    kv = [m.emu for m in res.minutes if m.minute * 60.0 >= warmup_s and m.minute * 60 <= duration_s]
    finished = stats.finished if stats is not None else 0
    return Probe(
        tokens_per_s=rate_tps,
        ttft_p95_s=percentile(ttft, 95) if ttft.size else math.inf,
        mean_kv=float(np.mean(kv)) if kv else 0.0,
        finished_share=finished / max(1, len(reqs)),
    )


def measure_capacity(
    perf: VariantPerf,
    variant: str,
    model: str,
    tier: Tier,
    sizes: Sequence[tuple[int, int]],
    kv_target: float = 0.7,
    steps: int = 9,
    duration_s: float = 1800.0,
    on_probe: Callable[[Probe], None] | None = None,
) -> tuple[float, list[Probe]]:
    """Bisection on the token rate: the highest rate that holds the SLO and the KV target."""
    slo = tier.ttft_slo_s if tier.ttft_slo_s is not None else math.inf
    probes: list[Probe] = []

    def run(rate: float) -> bool:
        p = probe(perf, variant, model, tier, sizes, rate, duration_s)
        probes.append(p)
        if on_probe is not None:
            on_probe(p)
        return p.holds(slo, kv_target)

    lo, hi = 0.0, 1000.0
    while run(hi):  # grow until the instance no longer holds
        lo, hi = hi, hi * 2
        if hi > 1e7:
            return lo, probes
    for _ in range(steps):
        mid = (lo + hi) / 2
        if run(mid):
            lo = mid
        else:
            hi = mid
    return lo, probes


def skewed_mix(
    sizes: Sequence[tuple[int, int]], prompt_heavy: bool, share: float = 0.25
) -> list[tuple[int, int]]:
    """The `share` of `sizes` with the highest prompt share (or output share) of their
    tokens: the most prefill- (decode-) heavy mix the traffic holds."""

    def weight(s: tuple[int, int]) -> float:
        p, o = s
        return (p if prompt_heavy else o) / max(1, p + o)

    ranked = sorted(sizes, key=weight, reverse=True)
    return ranked[: max(1, math.ceil(len(ranked) * share))]


def token_share(sizes: Sequence[tuple[int, int]], prompt: bool) -> float:
    """Prompt (or output) tokens ÷ all tokens of `sizes`."""
    total = sum(p + o for p, o in sizes)
    part = sum(p if prompt else o for p, o in sizes)
    return part / total if total else 0.0


def service_rates(
    perf: VariantPerf,
    variant: str,
    model: str,
    tier: Tier,
    sizes: Sequence[tuple[int, int]],
    kv_target: float,
    duration_s: float = 1800.0,
    on_probe: Callable[[Probe], None] | None = None,
) -> tuple[float, float]:
    """(μ_p, μ_d): prompt tokens/s at θ of the prefill-heavy mix, output tokens/s at θ of
    the decode-heavy mix (see the module doc)."""
    heavy_p = skewed_mix(sizes, prompt_heavy=True)
    heavy_d = skewed_mix(sizes, prompt_heavy=False)
    theta_p, _ = measure_capacity(
        perf, variant, model, tier, heavy_p, kv_target, duration_s=duration_s, on_probe=on_probe
    )
    theta_d, _ = measure_capacity(
        perf, variant, model, tier, heavy_d, kv_target, duration_s=duration_s, on_probe=on_probe
    )
    return theta_p * token_share(heavy_p, True), theta_d * token_share(heavy_d, False)


def calibrate(
    scenario: Scenario,
    kv_target: float | None = None,
    duration_s: float = 1800.0,
    on_probe: Callable[[str, str, Probe], None] | None = None,
    preserve: bool = False,
) -> list[Capacity]:
    """θ of every (model, variant) of the scenario, against its tightest interactive tier."""
    interactive = [t for t in scenario.tiers.values() if t.interactive and t.ttft_slo_s]
    if not interactive:
        raise ValueError("the scenario has no interactive tier with a TTFT SLO to calibrate for")
    tier = min(interactive, key=lambda t: float(t.ttft_slo_s or math.inf))
    if kv_target is None:
        sp = scenario.policy.spec if scenario.policy is not None else None
        kv_target = sp.thresholds.scale_out_emu if sp is not None else 0.7
    sizes = request_sizes(scenario)
    out: list[Capacity] = []
    for md in scenario.models:
        name = md.metadata.name
        if not sizes.get(name):
            continue
        pname = md.metadata.annotations.get(PERF_PROFILE_ANNOTATION, name)
        mean_tokens = sum(p + o for p, o in sizes[name]) / len(sizes[name])
        for v in md.spec.variants:
            perf = scenario.catalog.get(pname, v.gpu_type, v.gpus_per_instance)

            def report(p: Probe, _m: str = name, _v: str = v.name) -> None:
                if on_probe is not None:
                    on_probe(_m, _v, p)

            theta, probes = measure_capacity(
                perf,
                v.name,
                name,
                tier,
                sizes[name],
                kv_target,
                duration_s=duration_s,
                on_probe=report,
            )
            mu_p: float | None = None
            mu_d: float | None = None
            if preserve:
                mu_p, mu_d = service_rates(
                    perf, v.name, name, tier, sizes[name], kv_target, duration_s, report
                )
            out.append(
                Capacity(
                    name,
                    v.name,
                    float(v.capacity_tokens_per_second),
                    theta,
                    mean_tokens,
                    tuple(probes),
                    mu_p,
                    mu_d,
                )
            )
    return out
