"""``sageserve bench layout``: OServe's layout search on one GPU type (OServe §4.3, §6.4).

What it measures, on a budget of GPUs of one type (default 16 H100) and the Azure 2023 code +
conversation traces:

1. request types: k-means on (log prompt, log output) over the traces (``--types``, default
   5; `forecast/request_types.py`), each type's rate over the traces' span;
2. the capacity table: every (TP, PP) layout of the model the catalogue offers (pipeline
   layouts derived from the TP profiles, `perf/pipeline.py`), its requests/s per type
   (`perf/capacity.py`);
3. the offered load: the traces' mix scaled so that the best homogeneous deployment (OServe's
   vLLM baseline, §6.1: identical replicas, the best strategy) could carry ``--load`` times
   less than offered, i.e. ``--load`` 1.2 offers 20 % more than that baseline can serve (the
   paper scales its traces to the cluster, "neither over- nor under-utilized");
4. Algorithm 1 (`plan/layout_search.py`) from the uniform pure-TP start: the chosen layout,
   its throughput Φ at the offered rates and its capacity at the mix (θ·Σλ), against the best
   homogeneous layout, and the search's wall time (OServe §6.4: ≤ 12 s on 16 GPUs; the goal
   here is ≤ 1 s). Then the assignment (`plan/oserve_assign.py`) of the chosen layout.

Benchmarks print figures; nothing here is asserted. The throughputs rest on derived profiles
(pipeline layouts) and on the analytical per-type capacity, not on measurements.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from sageserve.forecast.request_types import fit_request_types
from sageserve.perf.capacity import type_capacity
from sageserve.perf.model import load_catalog
from sageserve.plan.layout_search import (
    Evaluator,
    LayoutSpace,
    Strategy,
    best_homogeneous,
    describe,
    search_layout,
)
from sageserve.plan.oserve_assign import assign, mix_scale
from sageserve.sim.traces import request_trace

DEFAULT_TRACES = (
    Path("data/traces/azure-llm-2023/AzureLLMInferenceTrace_code.csv.gz"),
    Path("data/traces/azure-llm-2023/AzureLLMInferenceTrace_conv.csv.gz"),
)


def bench_layout_command(
    model: str,
    gpu_type: str,
    gpus: int,
    types: int,
    traces: Sequence[Path],
    load: float,
    seed: int,
    node_gpus: int,
    json_out: Path | None,
    console: Console,
) -> dict[str, Any]:
    if not load > 0:
        raise ValueError(f"--load: must be > 0, got {load}")
    rows = [r for path in traces for r in request_trace(path)]
    if not rows:
        raise ValueError("--trace: the traces hold no request")
    prompts = [float(r[1]) for r in rows]
    outputs = [float(r[2]) for r in rows]
    span = max(r[0] for r in rows) - min(r[0] for r in rows)
    t0 = time.perf_counter()
    kinds = fit_request_types(prompts, outputs, k=types, seed=seed)
    kmeans_s = time.perf_counter() - t0
    raw_rates = kinds.rates(prompts, outputs, max(span, 1.0))
    lengths = [kinds.centroid_tokens(j) for j in range(kinds.k)]

    t0 = time.perf_counter()
    cat = load_catalog()
    arch = cat.architecture(model)
    layouts = cat.layouts(model, gpu_type, gpus, node_gpus)
    capacity = {
        Strategy(v.tensor_parallel, v.pipeline_parallel): tuple(
            type_capacity(v, i, o) for i, o in lengths
        )
        for v in layouts
    }
    derived = {str(Strategy(v.tensor_parallel, v.pipeline_parallel)): v.derived for v in layouts}
    space = LayoutSpace(capacity, node_gpus=node_gpus, attention_heads=arch.attention_heads)
    table_s = time.perf_counter() - t0

    # Scale the mix so that the offered rates are `load` × what the best homogeneous
    # deployment can carry at this mix (its θ at the raw rates).
    raw_home, _ = best_homogeneous(space, raw_rates, gpus)
    theta_home, _ = mix_scale(raw_rates, [list(capacity[s]) for s in raw_home])
    rates = tuple(r * theta_home * load for r in raw_rates)
    demand = sum(rates)

    ev = Evaluator(space, rates)
    home, home_score = best_homogeneous(space, rates, gpus, ev)
    t0 = time.perf_counter()
    result = search_layout(space, rates, gpus, seed=seed)
    search_s = time.perf_counter() - t0
    plan = assign(rates, [list(capacity[s]) for s in result.layout])

    out: dict[str, Any] = {
        "model": model,
        "gpu_type": gpu_type,
        "gpus": gpus,
        "node_gpus": node_gpus,
        "seed": seed,
        "load": load,
        "types": [
            {
                "prompt_tokens": round(i, 1),
                "output_tokens": round(o, 1),
                "history_requests": kinds.counts[j],
                "rate": rates[j],
            }
            for j, (i, o) in enumerate(lengths)
        ],
        "offered": demand,
        "capacity_per_replica": {
            str(s): {"derived": derived[str(s)], "per_type": list(c)} for s, c in capacity.items()
        },
        "homogeneous": {
            "layout": describe(home),
            "throughput": home_score.throughput,
            "capacity_at_mix": home_score.scale * demand,
        },
        "search": {
            "layout": describe(result.layout),
            "throughput": result.score.throughput,
            "capacity_at_mix": result.score.scale * demand,
            "initial": describe(result.initial),
            "initial_throughput": result.initial_score.throughput,
            "initial_capacity_at_mix": result.initial_score.scale * demand,
            "iterations": result.iterations,
            "accepted": result.accepted,
            "evaluations": result.evaluations,
            "strategy_choice": result.strategy_choice,
            "idle_gpus": result.idle_gpus,
            "wall_s": search_s,
        },
        "assignment": {
            "replicas": [str(s) for s in result.layout],
            "weights": [list(w) for w in plan.weights],
            "unserved": list(plan.unserved),
            "utilisation": list(plan.utilisation),
        },
        "kmeans_s": kmeans_s,
        "capacity_table_s": table_s,
    }
    _print(out, console)
    if json_out is not None:
        json_out.write_text(json.dumps(out, indent=2) + "\n")
    return out


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.3f}×" if b > 0 else "n/a"


def _print(out: dict[str, Any], console: Console) -> None:
    console.print(
        f"OServe layout search: {out['model']} on {out['gpus']} × {out['gpu_type']} "
        f"(nodes of {out['node_gpus']}), seed {out['seed']}, offered load {out['load']:g} × "
        "the best homogeneous layout's capacity at the mix"
    )
    types = Table(title="request types (k-means on log lengths, Azure 2023 code + conversation)")
    for col in ("type", "prompt tokens", "output tokens", "history requests", "offered req/s"):
        types.add_column(col, justify="right")
    for j, t in enumerate(out["types"]):
        types.add_row(
            str(j),
            f"{t['prompt_tokens']:.0f}",
            f"{t['output_tokens']:.0f}",
            str(t["history_requests"]),
            f"{t['rate']:.3f}",
        )
    console.print(types)
    caps = Table(title="requests/s per replica and type (perf/capacity.py)")
    caps.add_column("layout")
    caps.add_column("profile")
    for j in range(len(out["types"])):
        caps.add_column(f"type {j}", justify="right")
    for name, c in out["capacity_per_replica"].items():
        caps.add_row(
            name, "derived" if c["derived"] else "table", *[f"{v:.3f}" for v in c["per_type"]]
        )
    console.print(caps)
    home, found = out["homogeneous"], out["search"]
    res = Table(title=f"offered {out['offered']:.3f} req/s")
    for col in ("deployment", "layout", "Φ req/s", "capacity at mix req/s", "vs homogeneous"):
        res.add_column(col, justify="right" if "req" in col or "vs" in col else "left")
    res.add_row(
        "best homogeneous",
        home["layout"],
        f"{home['throughput']:.3f}",
        f"{home['capacity_at_mix']:.3f}",
        "1.000×",
    )
    res.add_row(
        "uniform start",
        found["initial"],
        f"{found['initial_throughput']:.3f}",
        f"{found['initial_capacity_at_mix']:.3f}",
        f"{_ratio(found['initial_throughput'], home['throughput'])} Φ, "
        f"{_ratio(found['initial_capacity_at_mix'], home['capacity_at_mix'])} capacity",
    )
    res.add_row(
        "layout search",
        found["layout"],
        f"{found['throughput']:.3f}",
        f"{found['capacity_at_mix']:.3f}",
        f"{_ratio(found['throughput'], home['throughput'])} Φ, "
        f"{_ratio(found['capacity_at_mix'], home['capacity_at_mix'])} capacity",
    )
    console.print(res)
    console.print(
        f"search: {found['iterations']} iterations, {found['accepted']} accepted, "
        f"{found['evaluations']} deployments evaluated ({found['strategy_choice']}), "
        f"{found['idle_gpus']} idle GPUs, wall time {found['wall_s']:.3f} s (goal ≤ 1 s); "
        f"k-means {out['kmeans_s']:.2f} s, capacity table {out['capacity_table_s']:.3f} s"
    )
    a = out["assignment"]
    weights = Table(title="assignment of the chosen layout: share of each type per replica")
    weights.add_column("replica")
    for j in range(len(out["types"])):
        weights.add_column(f"type {j}", justify="right")
    weights.add_column("utilisation", justify="right")
    for k, name in enumerate(a["replicas"]):
        weights.add_row(name, *[f"{w:.3f}" for w in a["weights"][k]], f"{a['utilisation'][k]:.3f}")
    weights.add_row("unserved req/s", *[f"{u:.3f}" for u in a["unserved"]], "")
    console.print(weights)
