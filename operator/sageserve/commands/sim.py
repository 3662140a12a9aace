"""Bodies of `sageserve simulate` and `sageserve bench sim` (cli.py keeps only the wiring)."""

from __future__ import annotations

import resource
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from rich import box
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from sageserve.core.types import Request
from sageserve.sim.bounds import (
    bounds_dict,
    bounds_work,
    describe_bounds,
    peak_at_slo,
    tightest_bound,
)
from sageserve.sim.deadlines import describe
from sageserve.sim.reference import (
    REFERENCE_POLICY,
    REFERENCE_SETTING,
    describe_reference,
    reference_dict,
)
from sageserve.sim.results import REFUSED_NO_INSTANCE, layout_rows
from sageserve.sim.run import Comparison, run_policies, write_outputs
from sageserve.sim.scenario import default_scenario_dir, load_scenario, with_policy_settings

#: The batch deadline columns (`sim.deadlines.describe`): header -> cell key.
NIW_COLUMNS = (
    ("NIW by deadline", "attainment"),
    ("NIW in time", "served"),
    ("NIW missed", "missed"),
    ("NIW beyond horizon", "waiting"),
)


def comparison_table(cmp: Comparison, title: str) -> Table:
    """The printed table: cost, IW TTFT, SLO attainment per tier and, next to it, the batch
    deadline accounting (SageServe §6.3: NIW work is judged on its 24 h deadline, so work
    queued past the window with a later deadline is shown apart, not as a miss). GPU-hours
    cover the window; "drain GPU-h" is what the fleet held after it until the run stopped.
    Requests held for a model with nothing serving and refused (`dispatch.hold`) get their
    own column, among the unfinished, when a run had any."""
    tiers = sorted({t for r in cmp.table for t in r["slo"]})
    end_s = float(cmp.summary["scenario"]["window"]["end_s"])
    batch = any(r.get("niw", {}).get("entries") for r in cmp.table)
    table = Table(title=title, box=box.SIMPLE_HEAD)
    for col in (
        "policy",
        "inst-h",
        "vs 1st",
        "GPU-h",
        "prov GPU-h",
        "spot GPU-h",
        "drain GPU-h",
        "IW TTFT p95 s",
    ):
        table.add_column(col, justify="right" if col != "policy" else "left", no_wrap=True)
    for t in tiers:
        table.add_column(f"SLO {t}", justify="right", no_wrap=True)
    for head, _ in NIW_COLUMNS if batch else ():
        table.add_column(head, justify="right", no_wrap=True)
    table.add_column("unfinished", justify="right", no_wrap=True)
    held = any(r.get("refused_no_instance") for r in cmp.table)
    if held:
        table.add_column(REFUSED_NO_INSTANCE, justify="right", no_wrap=True)
    table.add_column("scalings", justify="right", no_wrap=True)
    for r in cmp.table:
        p95 = r["iw_ttft_p95_s"]
        cells = describe(r.get("niw", {}), end_s)
        table.add_row(
            r["policy"],
            f"{r['instance_hours']:.1f}",
            f"{r['vs_first']:+.1%}",
            f"{r['gpu_hours']:.1f}",
            f"{r['provisioning_gpu_hours']:.1f}",
            f"{r['donated_gpu_hours']:.1f}",
            f"{r['after_window_gpu_hours']:.1f}",
            f"{p95:.3f}" if p95 is not None else "-",
            *[f"{r['slo'].get(t, float('nan')):.2%}" for t in tiers],
            *[cells[key] for _, key in (NIW_COLUMNS if batch else ())],
            str(r["unfinished"]),
            *([str(r.get("refused_no_instance", 0))] if held else []),
            str(r["scale_events"]),
        )
    return table


def layouts_table(cmp: Comparison) -> Table | None:
    """OServe layouts per policy and (model, region, GPU type): switches and the layout in
    force at the end; None when no run had layouts."""
    rows = layout_rows(cmp.summary)
    if not rows:
        return None
    table = Table(title="OServe layouts", box=box.SIMPLE_HEAD)
    for col in ("policy", "model/region/GPU type", "re-plans", "switches", "finished"):
        table.add_column(col, no_wrap=True)
    for col in ("abandoned", "layout at the end", "replicas"):
        table.add_column(col, no_wrap=True)
    for r in rows:
        table.add_row(
            r["policy"],
            r["group"],
            str(r["replans"]),
            str(r["switches"]),
            str(r["finished"]),
            str(r["abandoned"]),
            r["layout"],
            r["replicas"],
        )
    return table


def capacity_table(cmp: Comparison) -> Table | None:
    """θ learned from the run per policy and (model, variant, region), next to the declared
    one, with the evidence; None when no run learned θ (`spec.capacity.learn`)."""
    rows = [
        (policy, e)
        for policy, p in cmp.summary["policies"].items()
        for e in p.get("capacity") or []
    ]
    if not rows:
        return None
    table = Table(title="θ learned from the fleet (tokens/s per instance)", box=box.SIMPLE_HEAD)
    for col in ("policy", "model/variant/region", "declared", "learned", "in force"):
        table.add_column(col, no_wrap=True)
    for col in ("windows", "qualifying", "trusted"):
        table.add_column(col, no_wrap=True)
    for policy, e in rows:
        learned = e["learned_tps"]
        table.add_row(
            policy,
            f"{e['model']}/{e['variant']}/{e['region']}",
            f"{e['declared_tps']:.0f}",
            "-" if learned is None else f"{learned:.0f}",
            f"{e['in_force_tps']:.0f}",
            str(e["windows"]),
            str(e["qualifying"]),
            "yes" if e["trusted"] else "no",
        )
    return table


def attainment_by_day_table(cmp: Comparison) -> Table | None:
    """SLO attainment per tier by day of arrival, when the window spans more than one day:
    a day of a long run read like a one-day run of the same traffic."""
    days = max((len(v) for r in cmp.table for v in r["slo_by_day"].values()), default=0)
    if days < 2:
        return None
    table = Table(title="SLO attainment by day of arrival", box=box.SIMPLE_HEAD)
    table.add_column("policy", no_wrap=True)
    table.add_column("tier", no_wrap=True)
    for d in range(days):
        table.add_column(f"day {d + 1}", justify="right", no_wrap=True)
    for r in cmp.table:
        for tier, values in sorted(r["slo_by_day"].items()):
            table.add_row(
                r["policy"], tier, *[f"{v:.2%}" if v is not None else "-" for v in values]
            )
    return table


def simulate(
    scenario: Path | None,
    policies: list[str] | None,
    out: Path,
    seed: int | None,
    report: bool,
    console: Console,
    settings: list[str] | None = None,
    reference: bool = False,
    picker: str | None = None,
) -> Comparison:
    sc = (
        with_policy_settings(load_scenario(scenario or default_scenario_dir()), settings or [])
        .with_seed(seed)
        .with_picker(picker)
    )
    names = policies or sc.policies
    console.print(
        f"scenario [bold]{sc.name}[/bold]: {len(sc.models)} models, {len(sc.nodes)} nodes, "
        f"window {sc.workload.duration_s / 3600:.1f} h, policies {', '.join(names)}, "
        f"picker {sc.picker}" + (f", policy settings {' '.join(settings)}" if settings else "")
    )
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.percentage:>5.1f}%"),
        TimeElapsedColumn(),
        console=console,
        transient=False,
    ) as prog:
        tasks = {n: prog.add_task(n, total=1.0) for n in names}

        def on_progress(name: str, frac: float) -> None:
            prog.update(tasks[name], completed=min(1.0, max(0.0, frac)))

        cmp = run_policies(sc, names, seed, on_progress)
        runs = list(cmp.summary["policies"].values())
        if reference:
            ref_task = prog.add_task(f"reference ({REFERENCE_POLICY}, realised)", total=1.0)
            ref = run_policies(
                with_policy_settings(sc, [REFERENCE_SETTING]),
                [REFERENCE_POLICY],
                seed,
                lambda _n, frac: prog.update(ref_task, completed=min(1.0, max(0.0, frac))),
            )
            cmp.summary["reference"] = reference_dict(ref.table[0])
            runs += ref.summary["policies"].values()
        bounds_task = prog.add_task("bounds", total=None)
        bounds = bounds_work(sc).at_capacity(peak_at_slo(runs))
        prog.update(bounds_task, total=1.0, completed=1.0)
    cmp.summary["bounds"] = bounds_dict(bounds)
    cmp.summary["policy_settings"] = list(settings or [])
    paths = write_outputs(out, cmp, report)
    wide = console if console.is_terminal else Console(width=240)
    wide.print(comparison_table(cmp, f"{sc.name}: {len(names)} policies"))
    by_day = attainment_by_day_table(cmp)
    if by_day is not None:
        wide.print(by_day)
    layouts = layouts_table(cmp)
    if layouts is not None:
        wide.print(layouts)
    learned = capacity_table(cmp)
    if learned is not None:
        wide.print(learned)
    lower = tightest_bound(cmp.summary["bounds"])
    which = (
        "capacity-at-SLO bound" if bounds.capacity_bound_gpu_hours is not None else "lower bound"
    )
    rows = [(r["policy"], r["gpu_hours"]) for r in cmp.table]
    if "reference" in cmp.summary:
        rows.append(("reference", cmp.summary["reference"]["gpu_hours"]))
    wide.print(
        f"bounds: {describe_bounds(cmp.summary['bounds'])}"
        + (
            "; " + ", ".join(f"{p} {g / lower:.2f}x" for p, g in rows) + f" the {which}"
            if lower > 0
            else ""
        )
    )
    if "reference" in cmp.summary:
        wide.print(describe_reference(cmp.summary["reference"]))
    for line in pool_lines(cmp.summary):
        wide.print(line)
    for line in plan_lines(cmp.summary):
        wide.print(line)
    console.print("wrote " + ", ".join(str(p) for p in paths))
    return cmp


def plan_lines(summary: dict[str, Any]) -> list[str]:
    """One line per planning policy: how many plans, the slowest solve, the widest gap and
    the regions a silent cluster kept out (`sim.results.plans_summary`)."""
    out = []
    for name, doc in summary["policies"].items():
        plans = doc.get("plans")
        if not plans:
            continue
        gap = plans["max_gap"]
        held = plans.get("held_regions")
        out.append(
            f"plans: {name} {plans['cycles']} solved, slowest {plans['max_solve_s']:.3f} s, "
            f"mean {plans['mean_solve_s']:.3f} s"
            + (f", widest MIP gap {gap:.4%}" if gap is not None else "")
            + (
                f"; {plans['cycles_holding_regions']} held {', '.join(held)} (silent cluster)"
                if held
                else ""
            )
        )
    return out


def pool_lines(doc: dict[str, Any]) -> list[str]:
    """One line per policy and ModelPool: pods per region (initial → end, max), wakes,
    requests served and the pooled IW attainment; a pool the strategy does not size says
    so with the operator's `Sized` reason."""
    out = []
    for policy, pdoc in doc["policies"].items():
        for name, pool in (pdoc.get("pools") or {}).items():
            regions = ", ".join(
                f"{r} {x['pods']['initial']}→{x['pods']['end']} pods (max {x['pods']['max']}), "
                f"{x['wakes']} wakes, {x['served']}/{x['requests']} served"
                for r, x in pool["regions"].items()
            )
            sized = pool["sized"]
            how = "sized by the plan" if sized["status"] else f"not sized ({sized['reason']})"
            out.append(f"pool {name} under {policy}: {regions}; {how}")
    return out


def bench_sim(
    scenario: Path | None,
    policy: str,
    hours: float | None,
    console: Console,
    sim_only: bool = True,
) -> dict[str, float]:
    """Time one policy over a scenario; figures are printed, never asserted.

    Three figures: loading the trace tables (one-off), the streamed run (requests generated
    from the traces while simulating, what `simulate` does) and, when `sim_only`, a second
    run over the same requests held in memory, which isolates the simulator itself.
    """
    import itertools

    from sageserve.sim.engine import Simulation

    sc = load_scenario(scenario or default_scenario_dir())
    if hours is not None:
        sc.workload.duration_s = hours * 3600.0
    cfg = sc.sim_config()
    t0 = time.perf_counter()
    stream = sc.requests()
    first = next(stream, None)  # heapq.merge pulls every source: the tables load here
    load_s = time.perf_counter() - t0
    reqs = itertools.chain([first] if first is not None else [], stream)
    t0 = time.perf_counter()
    cpu0 = time.process_time()
    strat = sc.strategy(policy)
    # a plan-following strategy plans from the history before the window, as in `simulate`
    history = sc.history(cfg.history_minutes) if strat.plan_cadence.plans else None
    pool_history = sc.pool_history(cfg.history_minutes) if history is not None else None

    def simulation(requests: Iterable[Request]) -> Simulation:
        planner = sc.planner_for(strat) if history is not None else None
        return Simulation(cfg, strat, requests, None, planner, history, pool_history=pool_history)

    res = simulation(reqs).run()
    wall = time.perf_counter() - t0
    cpu = time.process_time() - cpu0
    figures = {
        "requests": float(res.arrived),
        "events": float(res.sim_events),
        "trace_load_s": load_s,
        "streamed_wall_s": wall,
        "streamed_requests_per_wall_s": res.arrived / wall,
        "streamed_requests_per_cpu_s": res.arrived / cpu if cpu else 0.0,
        "streamed_events_per_wall_s": res.sim_events / wall,
    }
    if sim_only:
        held = list(sc.requests())
        t0 = time.perf_counter()
        cpu0 = time.process_time()
        res2 = simulation(held).run()
        wall2 = time.perf_counter() - t0
        cpu2 = time.process_time() - cpu0
        del held
        figures.update(
            {
                "sim_only_requests_per_wall_s": res2.arrived / wall2,
                "sim_only_requests_per_cpu_s": res2.arrived / cpu2 if cpu2 else 0.0,
                "sim_only_events_per_wall_s": res2.sim_events / wall2,
            }
        )
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    figures["peak_rss_mb"] = rss / 1024 if sys.platform != "darwin" else rss / 1024 / 1024
    t = Table(
        title=f"sageserve bench sim: {sc.name}, {policy}, "
        f"{sc.workload.duration_s / 3600:.1f} h window"
    )
    t.add_column("figure")
    t.add_column("value", justify="right")
    for k, v in figures.items():
        t.add_row(k, f"{v:,.1f}")
    console.print(t)
    return figures


def calibrate_command(
    scenario: Path | None,
    kv_target: float | None,
    minutes: float,
    console: Console,
    preserve: bool = False,
) -> list[Any]:
    """Measure θ per (model, variant) and print it next to the manifests' value; with
    `preserve`, PreServe's μ_p and μ_d too, and the variant fields to set."""
    from sageserve.sim.calibrate import calibrate

    sc = load_scenario(scenario or default_scenario_dir())
    with Progress(
        TextColumn("{task.description}"), TimeElapsedColumn(), console=console, transient=True
    ) as prog:
        task = prog.add_task("probing")

        def on_probe(model: str, variant: str, p: Any) -> None:
            prog.update(task, description=f"{model}/{variant}: {p.tokens_per_s:,.0f} tokens/s")

        caps = calibrate(sc, kv_target, minutes * 60.0, on_probe, preserve)
    t = Table(title=f"θ (capacityTokensPerSecond) measured on {sc.name}'s request mix")
    for col in ("model", "variant", "tokens/request", "configured", "measured", "probes"):
        t.add_column(col, justify="left" if col in ("model", "variant") else "right")
    for c in caps:
        t.add_row(
            c.model,
            c.variant,
            f"{c.mean_request_tokens:,.0f}",
            f"{c.configured_tps:,.0f}",
            f"{c.measured_tps:,.0f}",
            str(len(c.probes)),
        )
    console.print(t)
    if preserve:
        console.print("PreServe service rates (set them on each ModelDeployment variant):")
        for c in caps:
            mu_p = f"{c.prefill_tps:.0f}" if c.prefill_tps else "n/a"
            mu_d = f"{c.decode_tps:.0f}" if c.decode_tps else "n/a"
            console.print(
                f"  {c.model}/{c.variant}: capacityTokensPerSecond: {c.measured_tps:.0f}, "
                f"prefillTokensPerSecond: {mu_p}, decodeTokensPerSecond: {mu_d}"
            )
    return caps
