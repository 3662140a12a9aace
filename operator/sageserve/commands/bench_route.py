"""`sageserve bench route`: in-region instance pickers on a fixed fleet (PreServe §5, RQ3).

PreServe's routing experiment: a fixed set of instances (no scaling) serves a request trace
at a sweep of rates, once per router, and the routers are compared on P99 normalized
latency (end to end ÷ output tokens), TTFT and SLO attainment. A request meets the SLO when
its normalized latency is at most 3× what it would be served alone: the paper states one
figure, 3× an isolated request's (0.2 s for LLaMA-2-7B), but one figure for every request
fails short answers to long prompts (whose normalized latency is mostly prefill) at any
load, so each request is held to its own isolated latency here.

Held out, as the predictors require: the first `fit_minutes` of the trace fit the
`input-regression` predictor and warm the online `client-quantile` one; only the rest is
replayed and scored. Each rate compresses (or stretches) the replayed part's timestamps so
its mean rate is the one asked for, keeping the trace's burst shape. The simulated fleet
is the simulator's own (`sim.engine`, continuous batching, KV cache, preemption), pinned
at `instances` instances of one perf-profile variant; requests longer than the model's
context are refused at arrival and counted apart, as in `sageserve simulate`.

Figures are printed, never asserted.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

from sageserve.core.percentile import percentile
from sageserve.core.types import IW_F, Request
from sageserve.dispatch.length_predictor import (
    ClientQuantilePredictor,
    InputRegressionPredictor,
    LengthPredictor,
    OraclePredictor,
    PredictorScore,
    score,
)
from sageserve.pace import make_strategy
from sageserve.perf.model import VariantPerf, load_catalog
from sageserve.sim import traces
from sageserve.sim.cluster import Node
from sageserve.sim.engine import ModelSetup, RegionPlacement, SimConfig, Simulation
from sageserve.sim.instance import Job

#: Routers compared by default: picker, or picker@predictor. The last two are oracles.
DEFAULT_ROUTERS = (
    "round-robin",
    "least-request",
    "min-usage",
    "token-jsq",
    "preserve",
    "token-jsq@oracle",
    "preserve@oracle",
)
#: PreServe §5: the SLO is 3× the normalized latency of an isolated request.
SLO_FACTOR = 3.0
#: The issue's reference point: the highest rate where least-request meets the SLO for
#: this share of requests.
LR_ATTAINMENT = 0.85


@dataclass(frozen=True)
class RouteResult:
    router: str
    rate: float
    requests: int
    refused: int
    norm_p99_s: float
    ttft_p99_s: float
    ttft_mean_s: float
    attainment: float
    preemptions: int


def isolated_normalized_latency(perf: VariantPerf, prompt: int, output: int) -> float:
    """Normalized latency of one request alone on an instance: its prefill, then one
    decode iteration per further token, at its mean context (exact where the decode curve
    is linear over the request's context range)."""
    t = perf.prefill(prompt) + (output - 1) * perf.decode(prompt + output / 2.0)
    return t / max(1, output)


class _Judged(Simulation):
    """The simulator, counting the requests that finish within their own SLO."""

    met = 0
    slo: dict[int, float]

    def on_finish(self, job: Job, now: float) -> None:
        super().on_finish(job, now)
        if now >= 0:
            req = job.req
            norm = (now - req.arrival + job.net_delay) / max(1, req.output_tokens)
            if norm <= self.slo[req.id]:
                self.met += 1


def _predictors(
    fit: Sequence[tuple[float, int, int]], kind: str
) -> Callable[[str], LengthPredictor]:
    pairs = [(p, o) for _, p, o in fit]

    def make(_model: str) -> LengthPredictor:
        if kind == "oracle":
            return OraclePredictor()
        if kind == "input-regression":
            return InputRegressionPredictor(pairs)
        cq = ClientQuantilePredictor()
        for p, o in pairs:
            cq.observe(0, p, o)
        return cq

    return make


def pinned_fleet(perf: VariantPerf, instances: int, end_s: float, drain_s: float) -> SimConfig:
    """A fixed fleet of `instances` instances of one variant in one region, one node each,
    min = max = initial (no autoscaling): the benchmarks' fleet, where only the rule under
    test decides, over [0, `end_s`] and a drain of `drain_s`."""
    return SimConfig(
        models=(
            ModelSetup(
                perf.model,
                (("v", perf),),
                (RegionPlacement("r1", instances, instances, instances),),
                perf.context_length,
            ),
        ),
        nodes=tuple(
            Node(f"n{i}", "r1", perf.gpu_type, "serving", perf.gpus) for i in range(instances)
        ),
        start_s=0.0,
        end_s=end_s,
        drain_s=drain_s,
        region_order=("r1",),
    )


def run_once(
    perf: VariantPerf,
    instances: int,
    replay: Sequence[tuple[float, int, int]],
    fit: Sequence[tuple[float, int, int]],
    rate: float,
    picker: str,
    predictor: str,
    slo_factor: float = SLO_FACTOR,
) -> RouteResult:
    """One router at one rate: the replayed part compressed to `rate` requests/s."""
    span = replay[-1][0] if replay[-1][0] > 0 else 1.0
    factor = (len(replay) / span) / rate  # new time = old time × factor
    reqs = [
        Request(i, t * factor, perf.model, IW_F, "r1", p, o) for i, (t, p, o) in enumerate(replay)
    ]
    cfg = replace(
        pinned_fleet(perf, instances, reqs[-1].arrival + 1.0, 4 * 3600.0),
        picker=picker,
        predictor=predictor,
    )
    sim = _Judged(cfg, make_strategy("reactive"), reqs, predictors=_predictors(fit, predictor))
    sim.slo = {
        q.id: slo_factor * isolated_normalized_latency(perf, q.prompt_tokens, q.output_tokens)
        for q in reqs
    }
    r = sim.run()
    st = r.stats.get((IW_F.name, perf.model))
    norm = np.frombuffer(st.norm, dtype=np.float64) if st else np.empty(0)
    ttft = np.frombuffer(st.ttft, dtype=np.float64) if st else np.empty(0)
    refused = r.refused
    served = len(reqs) - refused  # unfinished count as misses
    met = sim.met
    return RouteResult(
        router=f"{picker}@{predictor}",
        rate=rate,
        requests=len(reqs),
        refused=refused,
        norm_p99_s=percentile(norm, 99),
        ttft_p99_s=percentile(ttft, 99),
        ttft_mean_s=float(ttft.mean()) if ttft.size else math.nan,
        attainment=met / served if served else math.nan,
        preemptions=r.preemptions,
    )


def _split(router: str, default_predictor: str) -> tuple[str, str]:
    picker, _, pred = router.partition("@")
    return picker, pred or default_predictor


def bench_route_command(
    trace: Path,
    instances: int,
    rates: Sequence[float] | None,
    routers: Sequence[str],
    predictor: str,
    fit_minutes: float,
    model: str,
    gpu_type: str,
    gpus: int,
    console: Console,
    kv_tokens: int | None = None,
) -> list[RouteResult]:
    """`kv_tokens` replaces the profile's KV capacity per instance (a memory-bound fleet,
    as PreServe's LLaMA-2-7B on one A40, so the memory penalty can act)."""
    rows = traces.request_trace(trace)
    fit = [r for r in rows if r[0] < fit_minutes * 60.0]
    held = [r for r in rows if r[0] >= fit_minutes * 60.0]
    if len(fit) < 8 or not held:
        raise ValueError(
            f"{trace}: {len(fit)} requests in the first {fit_minutes:g} min and {len(held)} "
            "after: need at least 8 to fit and one to replay (change --fit-minutes)"
        )
    t0 = held[0][0]
    replay = [(t - t0, p, o) for t, p, o in held]
    perf = load_catalog().get(model, gpu_type, gpus)
    if kv_tokens is not None:
        if kv_tokens < 1:
            raise ValueError(f"--kv-tokens must be ≥ 1, got {kv_tokens}")
        perf = replace(perf, kv_capacity_tokens=kv_tokens)

    # the predictors on the held-out part (prequential for the online one)
    held3 = [(0, p, o) for _, p, o in held]
    scores: dict[str, PredictorScore] = {
        "client-quantile": score(ClientQuantilePredictor(), [(0, p, o) for _, p, o in fit], held3),
        "input-regression": score(InputRegressionPredictor([(p, o) for _, p, o in fit]), [], held3),
    }
    tab = Table(title=f"output-length predictors on {trace.name}, held out ({len(held)} requests)")
    for c in ("predictor", "MAE tokens", "under-predicted > 2×", "over-predicted > 2×"):
        tab.add_column(c, justify="right")
    for name, s in scores.items():
        tab.add_row(name, f"{s.mae:.1f}", f"{s.under_2x:.1%}", f"{s.over_2x:.1%}")
    console.print(tab)

    med_p = int(np.median([p for _, p, _ in replay]))
    med_o = int(np.median([o for _, _, o in replay]))
    slo = SLO_FACTOR * isolated_normalized_latency(perf, med_p, med_o)
    natural = len(replay) / max(1e-9, replay[-1][0])
    console.print(
        f"{instances} × {model} on {perf.gpus}× {perf.gpu_type} (KV {perf.kv_capacity_tokens:,} "
        f"tokens); fit on the first {fit_minutes:g} min ({len(fit)} requests), replay the rest "
        f"({len(replay)} requests, {natural:.2f} req/s as recorded); SLO: normalized latency ≤ "
        f"3× its own alone (a median request, {med_p} → {med_o} tokens: {slo:.4f} s)"
    )
    rate_list = list(rates) if rates else [round(natural * m, 2) for m in (1, 2, 3, 4, 5, 6)]
    results: list[RouteResult] = []
    for rate in rate_list:
        tab = Table(title=f"{rate:g} requests/s")
        for c in (
            "router",
            "norm. latency P99 s",
            "TTFT P99 s",
            "TTFT mean s",
            "SLO attainment",
            "preemptions",
            "refused",
            "wall s",
        ):
            tab.add_column(c, justify="right")
        for router in routers:
            picker, pred = _split(router, predictor)
            w = time.perf_counter()
            res = replace(run_once(perf, instances, replay, fit, rate, picker, pred), router=router)
            results.append(res)
            tab.add_row(
                router,
                f"{res.norm_p99_s:.4f}",
                f"{res.ttft_p99_s:.3f}",
                f"{res.ttft_mean_s:.3f}",
                f"{res.attainment:.1%}",
                str(res.preemptions),
                str(res.refused),
                f"{time.perf_counter() - w:.1f}",
            )
        console.print(tab)
    _verdict(results, console)
    return results


def _verdict(results: Sequence[RouteResult], console: Console) -> None:
    """PreServe against the second-best non-oracle router at the highest rate where
    least-request still meets the SLO for 85 % of requests."""
    lr = [r for r in results if r.router == "least-request" and r.attainment >= LR_ATTAINMENT]
    if not lr:
        console.print("least-request meets the SLO for 85 % of requests at no rate tried")
        return
    rate = max(r.rate for r in lr)
    at = [r for r in results if r.rate == rate]
    pre = next((r for r in at if r.router == "preserve"), None)
    others = [r for r in at if "oracle" not in r.router and r.router != "preserve"]
    if pre is None or not others:
        return
    best = min(others, key=lambda r: r.norm_p99_s)
    cut = 1.0 - pre.norm_p99_s / best.norm_p99_s
    console.print(
        f"at {rate:g} req/s (highest rate with least-request ≥ 85 %): preserve P99 normalized "
        f"latency {pre.norm_p99_s:.4f} s against {best.router}'s {best.norm_p99_s:.4f} s "
        f"({cut:+.1%} lower; goal ≥ 45 %), SLO attainment {pre.attainment:.1%} (goal ≥ 98 %)"
    )
