"""``sageserve calibrate --by-type``: n_{k,j} per layout and request type, measured on the
simulator at the benchmark's SLO (`sim/type_capacity.py` says how).

The request types are the k-means types of `forecast/request_types.py` fitted on the
scenario's requests of `hours` (the same fit `sageserve bench oserve` makes on its tuning
hours: same hours, k and seed give the same types, which the file records so the bench can
check), the layouts every (TP, PP) of `PerfCatalog.layouts` on the GPU budget.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from sageserve.forecast.request_types import fit_request_types
from sageserve.perf.model import load_catalog
from sageserve.plan.layout_search import Strategy
from sageserve.sim.oserve_fleet import LayoutBudget
from sageserve.sim.scenario import load_scenario
from sageserve.sim.type_capacity import (
    CapacityContext,
    ProbeSettings,
    SloSpec,
    TypeCapacityTable,
    TypeProbe,
    calibrate_types,
    capacity_table,
)


@dataclass(frozen=True)
class ByTypeCalibration(LayoutBudget):
    """What `calibrate --by-type` measures (the CLI's options)."""

    hours: tuple[int, ...] = (0, 1, 2, 3)
    span_s: float = 3600.0
    slo: SloSpec = field(default_factory=SloSpec)
    settings: ProbeSettings = field(default_factory=ProbeSettings)


def calibrate_by_type(cfg: ByTypeCalibration, console: Console | None = None) -> TypeCapacityTable:
    """Measure n_{k,j} for every layout and type (module doc)."""
    from sageserve.commands.bench_oserve import part

    t0 = time.perf_counter()
    sc = load_scenario(cfg.scenario)
    requests = sorted(sc.requests(), key=lambda r: r.arrival)
    window = part(requests, cfg.hours, cfg.span_s)
    if not window:
        raise ValueError(f"no request in hours {list(cfg.hours)} of {cfg.scenario}")
    prompts = [r.prompt_tokens for r in window]
    outputs = [r.output_tokens for r in window]
    types = fit_request_types(prompts, outputs, cfg.types, cfg.settings.seed)
    cat = load_catalog()
    perf = cfg.layouts(cat)
    sizes = list(zip(prompts, outputs, strict=True))
    probes = 0

    def on_probe(s: Strategy, j: int, p: TypeProbe) -> None:
        nonlocal probes
        probes += 1

    measured = calibrate_types(perf, types, sizes, cfg.slo, cfg.settings, on_probe)
    analytical = capacity_table("analytical", CapacityContext(perf, types, sizes))
    return TypeCapacityTable(
        model=cfg.model,
        gpu_type=cfg.gpu_type,
        slo=cfg.slo,
        centroids=[types.centroid_tokens(j) for j in range(types.k)],
        capacity={str(s): list(row) for s, row in measured.items()},
        analytical={str(s): list(row) for s, row in analytical.items()},
        derived={str(s): bool(v.derived) for s, v in perf.items()},
        settings=cfg.settings,
        source={
            "scenario": str(cfg.scenario),
            "hours": list(cfg.hours),
            "spanSeconds": cfg.span_s,
            "kmeansSeed": cfg.settings.seed,
            "requests": len(window),
            "typeRequests": list(types.counts),
            "probes": probes,
            "wallSeconds": round(time.perf_counter() - t0, 2),
        },
    )


def print_table(table: TypeCapacityTable, console: Console) -> None:
    slo = table.slo
    t = Table(
        title=f"n (req/s per replica) of {table.model} on {table.gpu_type}, measured at TTFT ≤ "
        f"{slo.ttft_s:g} s and ≤ {slo.tpot_s:g} s per output token for "
        f"{100 * slo.attainment:g} % of requests (analytical in brackets)"
    )
    t.add_column("layout")
    for j, (p, o) in enumerate(table.centroids):
        t.add_column(f"type {j}\n{p:.0f} / {o:.0f} tok", justify="right")
    t.add_column("GPUs", justify="right")
    for name, row in table.capacity.items():
        ana = table.analytical.get(name, [])
        cells = [
            f"{n:.2f} ({ana[j]:.2f})" if j < len(ana) else f"{n:.2f}" for j, n in enumerate(row)
        ]
        label = name + (" (derived)" if table.derived.get(name) else "")
        gpus = _gpus(name)
        t.add_row(label, *cells, str(gpus))
    console.print(t)
    src: dict[str, Any] = table.source
    console.print(
        f"{src.get('requests', 0)} requests of hours {src.get('hours')} in "
        f"{len(table.centroids)} types {src.get('typeRequests')}; {src.get('probes')} probes of "
        f"{table.settings.requests} arrivals; wall time {src.get('wallSeconds')} s"
    )


def _gpus(name: str) -> int:
    tp, _, pp = name.removeprefix("TP").partition("xPP")
    return int(tp) * (int(pp) if pp else 1)


def calibrate_by_type_command(
    cfg: ByTypeCalibration, out: Path | None, console: Console
) -> TypeCapacityTable:
    table = calibrate_by_type(cfg, console)
    print_table(table, console)
    if out is not None:
        table.save(out)
        console.print(f"wrote {out}")
    return table
