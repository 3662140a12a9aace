"""``sageserve bench pool``: GPUs for a long tail of models, pooled or not (Aegaeon).

On the long-tail scenario (``scenarios/long-tail``: every ServeGen m-large client as its own
fine-tuned model) it measures, with ``sim.pool_serving``:

1. **GPUs and GPU-hours at the target per-token attainment** (Aegaeon §7.1: 90 % of tokens by
   their deadlines, TTFT 10 s, TBT 100 ms) for one dedicated instance per model with
   scale-to-zero, request-level switching (ServerlessLLM-like; the fewest instances that
   reach the target), static multiplexing of ≤ 2 models per instance (MuxServe-like) and the
   pool: first as ``plan.pool_sizing.size_pool`` sizes it from the window's rates, then the fewest
   decode instances that reach the target, and what ``sageserve router`` runs on
   Kubernetes: request-level switching on vLLM sleep mode (``dispatch.pool_switch``, the
   ModelPool's default two models awake per pod; the fewest pods that reach the target).
   ``pooled`` is the research variant (token-level switching, which stock vLLM cannot do).
   Fixed pools are paid for the whole window.
2. **Goodput at 0.1 requests/s per model** (Aegaeon §7.2, Fig. 11a): on a fixed number of
   GPUs, the most models (Poisson arrivals, request sizes drawn from the scenario) each
   strategy serves at the target, times 0.1 requests/s.
3. **Simulator speed** with pooled instances: simulated requests per wall-second of the
   sized pool's run.

``--sized`` measures the pool as ``plan.pool_sizing`` sizes it against the baselines
without any search (a run per strategy; the router's rule, the slowest to simulate, is
left out): the dedicated baseline with the scenario's per-model floor and engine start-up,
dedicated scale-to-zero with no start-up (generous), request-level switching on as many
GPUs as the sized pool and on the fewest instances reaching the target (a bisection of
cheap runs), mux2, and the pool; then the goodput of each on a fixed number of GPUs.

``--seed 0,1,2`` runs the whole report once per seed, each on requests drawn with that
seed (``sim.longtail.load_long_tail``: the per-client rates of each 10-minute window are the
trace's, fixed; the seed draws the arrival times within each window and each request's
sizes; the goodput runs' Poisson arrivals and sizes follow the same seed), then prints the
spread of every figure (mean [lowest, highest]). Without ``--seed``: the scenario file's
seed, and seed 7 for the goodput runs.

Benchmarks print figures; nothing here is asserted.
"""

from __future__ import annotations

import dataclasses
import json
import math
import random
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from sageserve.api.model_pool import DEFAULT_AWAKE_PER_INSTANCE
from sageserve.commands.seeds import Spread, spread
from sageserve.plan.pool_sizing import PoolPlan, PoolShape, size_pool, theta_at_tbt
from sageserve.sim.longtail import LongTail, load_long_tail
from sageserve.sim.pool_serving import PoolOutcome, PoolRequest, simulate_pool

GOODPUT_RATE = 0.1  # requests/s per model (Aegaeon Fig. 11a)


def tail_attainment(o: PoolOutcome, models: Sequence[str]) -> float:
    """Per-token attainment over ``models`` only: the long tail, which the strategies serve
    differently (the hot models have the same dedicated instances in every strategy)."""
    tokens = sum(o.per_model[m].tokens for m in models if m in o.per_model)
    met = sum(o.per_model[m].on_time for m in models if m in o.per_model)
    return met / tokens if tokens else 1.0


def smallest_meeting(
    run: Callable[[int], PoolOutcome],
    lo: int,
    hi: int,
    target: float,
    score: Callable[[PoolOutcome], float] = lambda o: o.attainment,
) -> tuple[int, PoolOutcome] | None:
    """The smallest n in [lo, hi] whose run's ``score`` reaches ``target`` (bisection: more
    capacity never lowers attainment), with its outcome; None when even ``hi`` does not."""
    top = run(hi)
    if score(top) < target:
        return None
    best = (hi, top)
    while lo < best[0]:
        mid = (lo + best[0]) // 2
        out = run(mid)
        if score(out) >= target:
            best = (mid, out)
        else:
            lo = mid + 1
    return best


def largest_meeting(
    run: Callable[[int], PoolOutcome],
    lo: int,
    hi: int,
    target: float,
    score: Callable[[PoolOutcome], float] = lambda o: o.attainment,
) -> tuple[int, PoolOutcome | None]:
    """The largest n in [lo, hi] whose run's ``score`` reaches ``target`` (0 when none does)."""
    best: tuple[int, PoolOutcome | None] = (0, None)
    while lo <= hi:
        mid = (lo + hi) // 2
        out = run(mid)
        if score(out) >= target:
            best = (mid, out)
            lo = mid + 1
        else:
            hi = mid - 1
    return best


def pool_shape(lt: LongTail) -> PoolShape:
    """The sizing's view of one pooled instance, from the scenario's own requests."""
    n = max(1, len(lt.requests))
    prompt = sum(r.prompt for r in lt.requests) / n
    output = sum(r.output for r in lt.requests) / n
    s = lt.setup
    return PoolShape(
        region="pool",
        gpu_type=lt.perf.gpu_type,
        gpus_per_instance=lt.perf.gpus,
        # the planner's θ was measured against a TTFT target; a per-token SLO also caps the
        # decoding step, which caps the batch: the smaller of the two
        theta_tps=min(
            lt.theta_tps,
            theta_at_tbt(lt.perf.decode, lt.perf.kv_capacity_tokens, s.tbt_s, prompt, output),
        ),
        # one request per batch, half-way through its output: the typical decoding batch
        # of a sporadic model
        decode_step_s=lt.perf.decode(prompt + output / 2),
        prefill_s=lt.perf.prefill(prompt),
        switch_s=s.switch_s,
        ttft_s=s.ttft_s,
        tbt_s=s.tbt_s,
        target_attainment=lt.target_attainment,
        q_max_s=s.q_max_s,
    )


def _synthetic(lt: LongTail, models: int, seconds: float, seed: int) -> list[PoolRequest]:
    rng = random.Random(seed)
    sizes = [(r.prompt, r.output) for r in lt.requests]
    out: list[PoolRequest] = []
    for m in range(models):
        t = 0.0
        while True:
            t += rng.expovariate(GOODPUT_RATE)
            if t >= seconds:
                break
            p, o = sizes[rng.randrange(len(sizes))]
            out.append(PoolRequest(t, f"m{m}", p, o))
    out.sort(key=lambda r: r.t)
    return out


def _header(lt: LongTail, console: Console) -> None:
    s = lt.setup
    window_h = (lt.end_s - lt.start_s) / 3600.0
    console.print(
        f"[bold]{lt.name}[/] (seed {lt.seed}): {len(lt.models)} models, {len(lt.requests):,} "
        f"requests over {window_h:g} h ({lt.refused:,} longer than {lt.perf.model}'s context "
        f"refused); {lt.perf.model} on {lt.perf.gpus}x {lt.perf.gpu_type}; switch "
        f"{s.switch_s:.3f} s (Aegaeon Eq. 4), load {s.load_s:.3f} s + engine start-up "
        f"{s.startup_s:g} s (request-level, scale-from-zero)"
    )


def _plan(lt: LongTail, console: Console) -> tuple[PoolShape, PoolPlan]:
    shape = pool_shape(lt)
    plan = size_pool(lt.forecasts(), shape, lt.dedicated_threshold)
    console.print(
        f"sizing: E\\[m] = {plan.expected_active:.2f} active of {len(plan.pooled)} pooled models, "
        f"{plan.models_per_decode_instance} per decode instance (decode step "
        f"{shape.decode_step_s * 1000:.1f} ms, TBT {lt.setup.tbt_s * 1000:.0f} ms), "
        f"{plan.prefill_instances} prefill + {plan.decode_instances} decode instances, "
        f"{len(plan.dedicated)} dedicated models ({plan.dedicated_gpus} GPUs, θ "
        f"{shape.theta_tps:,.0f} tokens/s)"
    )
    return shape, plan


def _row(name: str, o: PoolOutcome | None, cold: Sequence[str], note: str) -> dict[str, Any]:
    if o is None:
        return {"strategy": name, "note": note}
    return {
        "strategy": name,
        "gpus": o.gpus,
        "gpu_hours": o.gpu_hours,
        "tail_attainment": tail_attainment(o, cold),
        "attainment": o.attainment,
        "ttft_p95_s": o.ttft_p95_s,
        "switches": o.switches,
        "requests_per_wall_s": o.requests_per_wall_s,
        "note": note,
    }


def _print_rows(
    rows: Sequence[dict[str, Any]],
    title: str,
    target: float,
    reference: str,
    console: Console,
) -> None:
    ref = next((r for r in rows if r["strategy"] == reference and "gpus" in r), None)
    t = Table(title=title)
    cols = (
        "strategy",
        "GPUs",
        "GPU-h",
        f"÷ {reference.split(',')[0]} GPU-h",
        "tail attainment",
        "at target",
        "all models",
        "TTFT p95 s",
        "switches",
        "note",
    )
    for col in cols:
        t.add_column(col, justify="left" if col in ("strategy", "note") else "right")
    for r in rows:
        if "gpus" not in r:
            t.add_row(escape(r["strategy"]), *["-"] * 8, escape(r["note"]))
            continue
        ratio = (
            f"{r['gpu_hours'] / ref['gpu_hours']:.2f}x"
            if ref is not None and ref["gpu_hours"] > 0
            else "-"
        )
        t.add_row(
            escape(r["strategy"]),
            str(r["gpus"]),
            f"{r['gpu_hours']:,.2f}",
            ratio,
            f"{r['tail_attainment']:.2%}",
            "yes" if r["tail_attainment"] >= target else "no",
            f"{r['attainment']:.2%}",
            f"{r['ttft_p95_s']:.2f}",
            f"{r['switches']:,}",
            escape(r["note"]),
        )
    console.print(t)


def _goodput_runs(
    lt: LongTail,
    n_inst: int,
    seconds: float,
    synth_seed: int,
    strategies: Sequence[str],
    router_awake: int,
    console: Console,
) -> dict[str, int]:
    """The most models each strategy serves at the target on ``n_inst`` instances, each model
    at GOODPUT_RATE (Aegaeon Fig. 11a); the same synthetic arrivals for every strategy."""
    s = lt.setup
    target = lt.target_attainment
    budget = n_inst * lt.perf.gpus
    cache: dict[int, list[PoolRequest]] = {}

    def synth(m: int) -> list[PoolRequest]:
        if m not in cache:
            cache.clear()
            cache[m] = _synthetic(lt, m, seconds, synth_seed)
        return cache[m]

    def names(m: int) -> list[str]:
        return [f"m{i}" for i in range(m)]

    def run(strategy: str, m: int) -> PoolOutcome:
        common: dict[str, Any] = {"start_s": 0.0, "end_s": seconds}
        if strategy == "pooled":
            outs = [
                simulate_pool("pooled", synth(m), s, prefill=p, decode=n_inst - p, **common)
                for p in range(1, min(3, n_inst - 1) + 1)
            ]
            return max(outs, key=lambda o: o.attainment)
        if strategy == "request":
            return simulate_pool("request", synth(m), s, instances=n_inst, **common)
        if strategy == "router":
            return simulate_pool(
                "router", synth(m), s, instances=n_inst, awake_per_instance=router_awake, **common
            )
        if strategy == "mux2":
            return simulate_pool("mux2", synth(m), s, models=names(m), **common)
        if strategy == "dedicated":
            return simulate_pool("dedicated", synth(m), s, models=names(m), **common)
        raise ValueError(f"goodput: unknown strategy {strategy!r}")

    def within_budget(o: PoolOutcome) -> float:
        # a strategy whose fleet grows with the models (mux2, dedicated) must fit the GPUs
        return o.attainment if o.gpus <= budget else -1.0

    hi_of = {"mux2": 2 * n_inst, "dedicated": n_inst}
    out: dict[str, int] = {}
    for strategy in strategies:
        hi = hi_of.get(strategy, max(4, int(n_inst * 16)))
        with console.status(f"goodput: {strategy}"):
            m, _ = largest_meeting(partial(run, strategy), 1, hi, target, within_budget)
        out[strategy] = m
    return out


def _full_run(
    lt: LongTail,
    goodput_gpus: int,
    goodput_minutes: float,
    console: Console,
    router_awake: int,
    synth_seed: int,
) -> dict[str, Any]:
    """Every strategy at the fewest instances meeting the target (module doc, 1-3)."""
    s = lt.setup
    target = lt.target_attainment
    window_h = (lt.end_s - lt.start_s) / 3600.0
    models = lt.models
    _header(lt, console)
    _shape, plan = _plan(lt, console)
    hot = plan.dedicated
    cold = [m for m in models if m not in hot]
    common: dict[str, Any] = {"start_s": lt.start_s, "end_s": lt.end_s, "hot": hot}
    reqs = lt.requests
    rows: list[dict[str, Any]] = []

    def tail(o: PoolOutcome) -> float:
        return tail_attainment(o, cold)

    def row(name: str, o: PoolOutcome | None, note: str = "") -> None:
        rows.append(_row(name, o, cold, note))

    with console.status("dedicated, scale-to-zero"):
        ded = simulate_pool("dedicated", reqs, s, models=lt.models, **common)
    if s.dedicated_floor:
        row("dedicated (floor 1/model)", ded, f"start-up {s.cold_start_s:g} s; GPUs = peak")
    else:
        row("dedicated (scale-to-zero)", ded, f"keep-alive {s.keep_alive_s:g} s; GPUs = peak")
    with console.status("mux2"):
        mux = simulate_pool("mux2", reqs, s, models=cold, **common)
    row("mux2 (<= 2 per instance)", mux, "static, optimistic (no interference)")

    def req_run(n: int) -> PoolOutcome:
        return simulate_pool("request", reqs, s, instances=n, **common)

    with console.status("request-level: searching the fewest instances"):
        found = smallest_meeting(req_run, 1, max(1, len(cold)), target, tail)
    row(
        "request-level (ServerlessLLM-like)",
        found[1] if found else None,
        f"{found[0]} instances, fewest at target" if found else "target not reached",
    )

    def router_run(n: int) -> PoolOutcome:
        return simulate_pool(
            "router", reqs, s, instances=n, awake_per_instance=router_awake, **common
        )

    with console.status("router (request-level on vLLM sleep mode): fewest pods"):
        found_router = smallest_meeting(router_run, 1, max(1, len(cold)), target, tail)
    row(
        f"router (sleep mode, {router_awake} awake per pod)",
        found_router[1] if found_router else None,
        f"{found_router[0]} pods, fewest at target; what sageserve router runs"
        if found_router
        else "target not reached",
    )
    with console.status("pooled: the sized plan"):
        sized = simulate_pool(
            "pooled",
            reqs,
            s,
            prefill=plan.prefill_instances,
            decode=plan.decode_instances,
            **common,
        )
    row(
        "pooled, as sized (plan.pool_sizing)",
        sized,
        f"{plan.prefill_instances}P + {plan.decode_instances}D from E[m]",
    )
    pooled_best: tuple[int, int, PoolOutcome] | None = None
    with console.status("pooled: searching the fewest decode instances"):
        for p in range(plan.prefill_instances, plan.prefill_instances + 3):

            def pooled_run(d: int, p: int = p) -> PoolOutcome:
                return simulate_pool("pooled", reqs, s, prefill=p, decode=d, **common)

            got = smallest_meeting(pooled_run, 1, max(1, len(cold)), target, tail)
            if got is not None and (
                pooled_best is None or p + got[0] < pooled_best[0] + pooled_best[1]
            ):
                pooled_best = (p, got[0], got[1])
    reference = "pooled, fewest at target"
    if pooled_best is not None:
        row(reference, pooled_best[2], f"{pooled_best[0]}P + {pooled_best[1]}D")
    else:
        row(reference, None, "target not reached")
    _print_rows(
        rows,
        f"GPUs at >= {target:.0%} per-token attainment of the long tail ({window_h:g} h)",
        target,
        reference,
        console,
    )
    best_pool = pooled_best[2] if pooled_best else None
    if best_pool is not None and best_pool.gpu_hours > 0:
        console.print(
            f"dedicated / pooled GPU-hours: {ded.gpu_hours / best_pool.gpu_hours:.2f}x "
            f"(goal >= 5x); dedicated long-tail attainment {tail(ded):.2%}; hot models "
            f"({len(hot)}, {plan.dedicated_gpus} GPUs) are the same in every row"
        )

    # goodput at 0.1 requests/s per model, on a fixed number of GPUs
    n_inst = max(2, goodput_gpus // lt.perf.gpus)
    good = _goodput_runs(
        lt,
        n_inst,
        goodput_minutes * 60.0,
        synth_seed,
        ("pooled", "request", "router"),
        router_awake,
        console,
    )
    gp_m, gr_m, gro_m = good["pooled"], good["request"], good["router"]
    console.print(
        f"goodput at {GOODPUT_RATE} requests/s per model on {n_inst * lt.perf.gpus} GPUs "
        f"({n_inst} instances, {goodput_minutes:g} min): pooled {gp_m} models "
        f"({gp_m * GOODPUT_RATE:.1f} requests/s), request-level {gr_m} models "
        f"({gr_m * GOODPUT_RATE:.1f} requests/s)"
        + (f": {gp_m / gr_m:.2f}x (goal >= 2x)" if gr_m else "")
        + f"; router (sleep mode, {router_awake} awake per pod) {gro_m} models"
    )
    speed = sized.requests_per_wall_s
    console.print(
        f"simulator speed, pooled: {speed:,.0f} simulated requests per wall-second "
        f"({sized.requests / sized.cpu_s if sized.cpu_s else 0:,.0f} per CPU-second; "
        f"{sized.requests:,} requests in {sized.wall_s:.1f} s; goal >= 20,000)"
    )
    return {
        **_run_head(lt, plan),
        "mode": "search",
        "reference": reference,
        "strategies": rows,
        "goodput": _goodput_head(
            n_inst * lt.perf.gpus,
            goodput_minutes,
            synth_seed,
            pooled_models=gp_m,
            request_level_models=gr_m,
            router_models=gro_m,
        ),
        "sim_requests_per_wall_s": speed,
    }


def _goodput_head(gpus: int, minutes: float, seed: int, **models: int) -> dict[str, Any]:
    """The goodput runs' settings and the models each deployment served within its SLO."""
    return {
        "gpus": gpus,
        "minutes": minutes,
        "seed": seed,
        "rate_per_model": GOODPUT_RATE,
        **models,
    }


def _run_head(lt: LongTail, plan: PoolPlan) -> dict[str, Any]:
    return {
        "scenario": lt.name,
        "seed": lt.seed,
        "models": len(lt.models),
        "requests": len(lt.requests),
        "refused": lt.refused,
        "window_hours": (lt.end_s - lt.start_s) / 3600.0,
        "target_attainment": lt.target_attainment,
        "sizing": {
            "expected_active": plan.expected_active,
            "models_per_decode_instance": plan.models_per_decode_instance,
            "prefill_instances": plan.prefill_instances,
            "decode_instances": plan.decode_instances,
            "dedicated": plan.dedicated,
        },
    }


#: the rows of a ``--sized`` run, in order (names stay the same across seeds)
SIZED_DEDICATED_FLOOR = "dedicated, floor + start-up"
SIZED_DEDICATED_ZERO = "dedicated, scale-to-zero"
SIZED_REQUEST_EQUAL = "request-level, pool's GPUs"
SIZED_REQUEST_FEWEST = "request-level, fewest at target"
SIZED_MUX2 = "mux2 (MuxServe-like)"
SIZED_POOLED = "pooled, as sized"


def _sized_run(
    lt: LongTail,
    goodput_gpus: int,
    goodput_minutes: float,
    console: Console,
    synth_seed: int,
) -> dict[str, Any]:
    """The sized pool against every baseline, one run each (module doc, ``--sized``)."""
    s = lt.setup
    target = lt.target_attainment
    window_h = (lt.end_s - lt.start_s) / 3600.0
    _header(lt, console)
    _shape, plan = _plan(lt, console)
    hot = plan.dedicated
    cold = [m for m in lt.models if m not in hot]
    common: dict[str, Any] = {"start_s": lt.start_s, "end_s": lt.end_s, "hot": hot}
    reqs = lt.requests
    rows: list[dict[str, Any]] = []
    with console.status("dedicated with the scenario's floor and start-up"):
        ded = simulate_pool("dedicated", reqs, s, models=lt.models, **common)
    rows.append(
        _row(
            SIZED_DEDICATED_FLOOR,
            ded,
            cold,
            f"floor {s.dedicated_floor}/model, start-up {s.startup_s:g} s",
        )
    )
    bare = dataclasses.replace(s, dedicated_floor=0, startup_s=0.0)
    with console.status("dedicated, scale-to-zero, no start-up"):
        zero = simulate_pool("dedicated", reqs, bare, models=lt.models, **common)
    rows.append(
        _row(
            SIZED_DEDICATED_ZERO,
            zero,
            cold,
            f"keep-alive {s.keep_alive_s:g} s, no start-up (generous); GPUs = peak",
        )
    )
    pool_instances = plan.prefill_instances + plan.decode_instances

    def req_run(n: int) -> PoolOutcome:
        return simulate_pool("request", reqs, s, instances=n, **common)

    with console.status("request-level (ServerlessLLM-like) on the pool's GPUs"):
        req_equal = req_run(pool_instances)
    rows.append(
        _row(
            SIZED_REQUEST_EQUAL,
            req_equal,
            cold,
            f"{pool_instances} instances, ServerlessLLM-like",
        )
    )
    with console.status("request-level: the fewest instances at target"):
        found = smallest_meeting(
            req_run, 1, max(1, len(cold)), target, lambda o: tail_attainment(o, cold)
        )
    if found is None:
        rows.append(_row(SIZED_REQUEST_FEWEST, None, cold, "target not reached"))
    else:
        rows.append(_row(SIZED_REQUEST_FEWEST, found[1], cold, f"{found[0]} instances (bisection)"))
    with console.status("mux2"):
        mux = simulate_pool("mux2", reqs, s, models=cold, **common)
    rows.append(_row(SIZED_MUX2, mux, cold, "<= 2 per instance, static, no interference"))
    with console.status("pooled: the sized plan"):
        pooled = simulate_pool(
            "pooled",
            reqs,
            s,
            prefill=plan.prefill_instances,
            decode=plan.decode_instances,
            **common,
        )
    rows.append(
        _row(
            SIZED_POOLED,
            pooled,
            cold,
            f"{plan.prefill_instances}P + {plan.decode_instances}D (plan.pool_sizing)",
        )
    )
    _print_rows(
        rows,
        f"the sized pool and the baselines, one run each ({window_h:g} h; target "
        f">= {target:.0%} per-token attainment of the long tail)",
        target,
        SIZED_POOLED,
        console,
    )
    n_inst = max(2, goodput_gpus // lt.perf.gpus)
    good = _goodput_runs(
        lt,
        n_inst,
        goodput_minutes * 60.0,
        synth_seed,
        ("pooled", "request", "mux2", "dedicated"),
        1,
        console,
    )
    console.print(
        f"goodput at {GOODPUT_RATE} requests/s per model on {n_inst * lt.perf.gpus} GPUs "
        f"({n_inst} instances, {goodput_minutes:g} min, seed {synth_seed}), models served at "
        f">= {target:.0%}: pooled {good['pooled']}, request-level {good['request']}, mux2 "
        f"{good['mux2']}, dedicated {good['dedicated']}"
        + (
            f"; pooled / request-level {good['pooled'] / good['request']:.2f}x"
            if good["request"]
            else ""
        )
    )
    return {
        **_run_head(lt, plan),
        "mode": "sized",
        "reference": SIZED_POOLED,
        "strategies": rows,
        "goodput": _goodput_head(
            n_inst * lt.perf.gpus,
            goodput_minutes,
            synth_seed,
            pooled_models=good["pooled"],
            request_level_models=good["request"],
            mux2_models=good["mux2"],
            dedicated_models=good["dedicated"],
        ),
        "sim_requests_per_wall_s": pooled.requests_per_wall_s,
    }


def spread_of_runs(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Every figure that each run has, over the runs: per strategy its GPU-hours, peak GPUs,
    tail attainment, switches and GPU-hours over the reference pool's; the goodput models."""
    out: dict[str, Any] = {"seeds": [r["seed"] for r in runs], "strategies": {}, "goodput": {}}
    names = [r["strategy"] for r in runs[0]["strategies"]]
    for name in names:
        per: list[dict[str, Any]] = []
        for run in runs:
            row = next((x for x in run["strategies"] if x["strategy"] == name), None)
            ref = next((x for x in run["strategies"] if x["strategy"] == run["reference"]), None)
            if row is None or "gpus" not in row:
                continue
            ratio = (
                row["gpu_hours"] / ref["gpu_hours"]
                if ref is not None and "gpus" in ref and ref["gpu_hours"] > 0
                else math.nan
            )
            met = row["tail_attainment"] >= run["target_attainment"]
            per.append({**row, "vs_reference": ratio, "at_target": met})
        out["strategies"][name] = {
            "runs": len(per),
            "at_target": sum(1 for x in per if x["at_target"]),
            **{
                key: dataclasses.asdict(spread([x[key] for x in per]))
                for key in ("gpu_hours", "gpus", "tail_attainment", "switches", "vs_reference")
            },
        }
    keys = [k for k in runs[0]["goodput"] if k.endswith("_models")]
    for k in keys:
        out["goodput"][k] = dataclasses.asdict(spread([r["goodput"][k] for r in runs]))
    return out


def _print_spread(runs: Sequence[dict[str, Any]], sp: dict[str, Any], console: Console) -> None:
    def f(d: dict[str, Any], spec: str, suffix: str = "") -> str:
        return Spread(**d).format(spec, suffix)

    reference = runs[0]["reference"]
    t = Table(
        title=f"over seeds {', '.join(str(x) for x in sp['seeds'])}: mean \\[lowest, highest]"
    )
    for col in (
        "strategy",
        "GPU-h",
        f"÷ {reference.split(',')[0]} GPU-h",
        "peak GPUs",
        "tail attainment",
        "seeds at target",
        "switches",
    ):
        t.add_column(col, justify="left" if col == "strategy" else "right")
    for name, x in sp["strategies"].items():
        pct = {k: v * 100 for k, v in x["tail_attainment"].items() if k != "n"}
        pct["n"] = x["tail_attainment"]["n"]
        t.add_row(
            name,
            f(x["gpu_hours"], ".2f"),
            f(x["vs_reference"], ".2f", "x"),
            f(x["gpus"], ".1f"),
            f(pct, ".2f", " %"),
            f"{x['at_target']} of {x['runs']}",
            f(x["switches"], ",.0f"),
        )
    console.print(t)
    console.print(
        "goodput (models served at "
        f"{GOODPUT_RATE} requests/s each): "
        + ", ".join(
            f"{k.removesuffix('_models').replace('_', '-')} {f(v, '.1f')}"
            for k, v in sp["goodput"].items()
        )
    )


def bench_pool_command(
    scenario: Path,
    hours: float | None,
    goodput_gpus: int,
    goodput_minutes: float,
    out_json: Path | None,
    console: Console,
    router_awake: int = DEFAULT_AWAKE_PER_INSTANCE,
    seeds: Sequence[int | None] = (None,),
    sized: bool = False,
) -> dict[str, Any]:
    """One report per seed (``None``: the scenario's seed), then the spread over the seeds;
    the figures of the one run, or ``{"runs": [...], "spread": {...}}`` for several."""
    if not seeds:
        raise ValueError("--seed: give one seed or several, comma-separated (e.g. 0,1,2)")
    if goodput_minutes <= 0:
        raise ValueError(f"--goodput-minutes: must be > 0, got {goodput_minutes}")
    if goodput_gpus < 1:
        raise ValueError(f"--goodput-gpus: must be >= 1, got {goodput_gpus}")
    runs: list[dict[str, Any]] = []
    for seed in seeds:
        lt = load_long_tail(scenario, hours, seed)
        synth_seed = 7 if seed is None else seed
        if sized:
            runs.append(_sized_run(lt, goodput_gpus, goodput_minutes, console, synth_seed))
        else:
            runs.append(
                _full_run(lt, goodput_gpus, goodput_minutes, console, router_awake, synth_seed)
            )
    # one run: its figures, as before seeds existed; several: each run and the spread
    result: dict[str, Any] = runs[0]
    if len(runs) > 1:
        result = {"runs": runs, "spread": spread_of_runs(runs)}
        _print_spread(runs, result["spread"], console)
    if out_json is not None:
        out_json.write_text(json.dumps(result, indent=2, default=_default))
        console.print(f"written: {out_json}")
    return result


def _default(o: object) -> object:
    if isinstance(o, float) and not math.isfinite(o):
        return None
    return str(o)
