"""Body of `sageserve compare` (cli.py keeps only the wiring): sweep each policy's knobs on
a scenario, run every point in parallel, and compare the policies at equal SLO.

Why: at the paper's thresholds (SageServe §7.1: 70 / 30 % EMU) the policies deliver
different SLOs, so their GPU-hours are not comparable; the fair measure is GPU-hours at the
same IW-F attainment, read off each policy's frontier (docs/policy-comparison.md).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from rich import box
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Table

from sageserve.compare.grid import expand, parse_grid
from sageserve.compare.output import (
    POINT_HEAD,
    SCHEMA,
    TARGET_HEAD,
    group,
    point_rows,
    retarget,
    summary_doc,
    target_rows,
    write_report,
    write_summary,
)
from sageserve.compare.runner import (
    Outcome,
    Task,
    bounds_task,
    make_backend,
    reference_task,
    run_all,
)
from sageserve.pace.base import make_strategy
from sageserve.sim.bounds import BoundsWork, bounds_dict, describe_bounds, peak_at_slo
from sageserve.sim.reference import describe_reference
from sageserve.sim.scenario import (
    Scenario,
    default_scenario_dir,
    load_scenario,
    with_policy_settings,
)

DEFAULT_POLICIES = ("reactive", "lt-i", "lt-u", "lt-ua")


def slo_tier(sc: Scenario, tier: str | None) -> str:
    """The tier whose attainment is compared: `tier`, else the interactive tier with the
    tightest TTFT SLO (IW-F in the bundled scenarios: TTFT ≤ 1 s at P95)."""
    if tier is not None:
        if tier not in sc.tiers:
            raise ValueError(f"--tier {tier!r}: the scenario has {', '.join(sorted(sc.tiers))}")
        return tier
    inter = [t for t in sc.tiers.values() if t.interactive and t.ttft_slo_s is not None]
    if not inter:
        raise ValueError("the scenario has no interactive tier with a TTFT SLO; pass --tier")
    return min(inter, key=lambda t: (t.ttft_slo_s or 0.0, t.name)).name


def slo_text(sc: Scenario, tier: str) -> str:
    """The compared tier with its TTFT SLO, e.g. `iw-f (TTFT ≤ 1 s)`: what attainment
    counts, said before anything runs."""
    slo = sc.tiers[tier].ttft_slo_s
    return tier if slo is None else f"{tier} (TTFT ≤ {slo:g} s)"


def _table(title: str, head: Sequence[str], rows: Sequence[Sequence[str]]) -> Table:
    t = Table(title=title, box=box.SIMPLE_HEAD)
    for h in head:
        t.add_column(h, justify="left" if h in ("policy", "point", "how", "note") else "right")
    for r in rows:
        t.add_row(*r)
    return t


def compare(
    scenario: Path | None,
    policies: Sequence[str] | None,
    target: float,
    out: Path,
    console: Console,
    workers: int | None = None,
    address: str | None = None,
    grids: Sequence[str] = (),
    settings: Sequence[str] = (),
    seed: int | None = None,
    tier: str | None = None,
    bounds: bool = True,
    report: bool = True,
    reference: bool = False,
) -> dict[str, Any]:
    """Run the comparison, write `summary.json` (and the report) into `out`, print the
    tables; returns the summary document. Bad input (policy, setting, grid, tier, target)
    is a ValueError or KeyError before anything runs."""
    if not 0.0 < target <= 1.0:
        raise ValueError(f"--target {target}: an attainment between 0 and 1, e.g. 0.95")
    root = (scenario or default_scenario_dir()).resolve()
    sc = with_policy_settings(load_scenario(root), settings)
    names = list(dict.fromkeys(policies or DEFAULT_POLICIES))
    for n in names:
        make_strategy(n)  # KeyError naming the available strategies
    scale_in = sc.policy.spec.thresholds.scale_in_emu if sc.policy is not None else 0.3
    jobs = expand(names, parse_grid(grids), settings, scale_in)
    for job in jobs:  # every point checked as a manifest, before any run
        with_policy_settings(sc, job.settings)
    the_tier = slo_tier(sc, tier)
    tasks = [Task(i, str(root), job, seed) for i, job in enumerate(jobs)]
    # plan-using strategies run longest (hourly forecast + ILP): start them first
    order = sorted(
        tasks, key=lambda t: (not make_strategy(t.job.policy).plan_cadence.plans, t.index)
    )

    backend = make_backend(workers, address)
    console.print(
        f"scenario [bold]{sc.name}[/bold]: {len(jobs)} runs "
        f"({', '.join(f'{n} {sum(j.policy == n for j in jobs)}' for n in names)}) on "
        f"{backend.description}; {slo_text(sc, the_tier)} attainment, target {target:.2%}"
        + (f", settings {' '.join(settings)}" if settings else "")
    )
    t0 = time.perf_counter()
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.percentage:>5.1f}%"),
        TimeElapsedColumn(),
        TextColumn("{task.fields[status]}"),
        console=console,
        disable=not console.is_terminal,  # a log gets one line per finished run instead
    ) as prog:
        bars: dict[int, TaskID] = {
            t.index: prog.add_task(t.job.run_id, total=1.0, status="queued", start=False)
            for t in tasks
        }
        started: set[int] = set()
        finished: list[int] = []

        def on_progress(index: int, fraction: float) -> None:
            if index not in started:
                started.add(index)
                prog.start_task(bars[index])
            prog.update(bars[index], completed=fraction, status="running")

        def on_done(o: Outcome) -> None:
            if o.task.index not in started:
                prog.start_task(bars[o.task.index])
            if o.result is not None:
                status = f"done, {o.result['wall_s']:.0f} s"
                prog.update(bars[o.task.index], completed=1.0, status=status)
            else:
                status = f"[red]failed[/red]: {escape(str(o.error))}"
                prog.update(bars[o.task.index], status=status)
            prog.stop_task(bars[o.task.index])
            finished.append(o.task.index)
            if not console.is_terminal:
                run = f"{len(finished)}/{len(tasks)} {escape(o.task.job.run_id)}"
                console.print(f"{run}: {status}", highlight=False)

        extra = courtesy_runs(str(root), seed, settings, bounds, reference)
        try:
            outcomes, extra_results = run_all(
                backend, order, on_progress, on_done, list(extra.values())
            )
        finally:
            backend.close()
    outcomes.sort(key=lambda o: o.task.index)
    found = dict(zip(extra, extra_results, strict=True))
    wall = time.perf_counter() - t0
    failed = [o for o in outcomes if o.error is not None]
    doc = summary_doc(
        group(outcomes, the_tier, target),
        {
            "name": sc.name,
            "path": str(root),
            "window": {"start_s": sc.workload.start_s, "end_s": sc.workload.end_s},
            "seed": sc.workload.seed if seed is None else seed,
        },
        the_tier,
        target,
        settings,
        bounds_of(found.get("bounds"), outcomes),
        {
            "backend": backend.description,
            "count": len(tasks),
            "failed": len(failed),
            "wall_s": round(wall, 1),
        },
    )
    doc["reference"] = found.get("reference")
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "summary.json"]
    write_summary(paths[0], doc)
    if report:
        paths.append(write_report(out, doc))
    wide = print_tables(doc, console)
    for o in failed:
        wide.print(f"[red]failed[/red] {o.task.job.run_id}: {o.error}")
    console.print(f"{len(tasks)} runs in {wall:.0f} s; wrote " + ", ".join(map(str, paths)))
    console.print(escape(doc["recommendation"]), style="bold", highlight=False)
    return doc


def bounds_of(work: BoundsWork | None, outcomes: Sequence[Outcome]) -> dict[str, float] | None:
    """The summary's bounds: those of the request stream, with the capacity-at-SLO bound at
    the capacity the runs measured (`sim.bounds`)."""
    if work is None:
        return None
    measured = peak_at_slo(o.result["summary"] for o in outcomes if o.result is not None)
    return bounds_dict(work.at_capacity(measured))


def courtesy_runs(
    root: str, seed: int | None, settings: Sequence[str], bounds: bool, reference: bool
) -> dict[str, tuple[Callable[..., Any], tuple[Any, ...]]]:
    """What runs beside the sweep, by its key in the summary: the bounds, the achievable
    reference (`sim.reference`)."""
    extra: dict[str, tuple[Callable[..., Any], tuple[Any, ...]]] = {}
    if bounds:
        extra["bounds"] = (bounds_task, (root, seed))
    if reference:
        extra["reference"] = (reference_task, (root, seed, tuple(settings)))
    return extra


def print_tables(doc: dict[str, Any], console: Console) -> Console:
    """Every point, then each policy at the target, then the bounds; returns the console
    used (a wide one when the output is not a terminal, so that files keep whole rows)."""
    wide = console if console.is_terminal else Console(width=180)
    name = doc["scenario"].get("name")
    wide.print(_table(f"{name}: every point", POINT_HEAD, point_rows(doc)))
    wide.print(
        _table(
            f"{name}: GPU-hours at {doc['target']:.2%} {doc['tier']} attainment",
            TARGET_HEAD,
            target_rows(doc),
        )
    )
    if doc["bounds"]:
        wide.print(f"bounds: {describe_bounds(doc['bounds'])}")
    if doc.get("reference"):
        wide.print(describe_reference(doc["reference"], doc.get("tier")))
    return wide


def reread(
    summary: Path, target: float, out: Path, console: Console, report: bool = True
) -> dict[str, Any]:
    """`sageserve compare --from summary.json`: a finished comparison read at another
    target, without running anything again."""
    if not 0.0 < target <= 1.0:
        raise ValueError(f"--target {target}: an attainment between 0 and 1, e.g. 0.95")
    doc = json.loads(summary.read_text())
    if doc.get("schema") != SCHEMA:
        raise ValueError(f"{summary}: not a `sageserve compare` summary (schema {SCHEMA})")
    if (out / "summary.json").resolve() == summary.resolve():
        raise ValueError(f"--out {out}: would overwrite {summary}; choose another directory")
    doc = retarget(doc, target)
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "summary.json"]
    write_summary(paths[0], doc)
    if report:
        paths.append(write_report(out, doc))
    print_tables(doc, console)
    console.print(f"read {summary} at {target:.2%}; wrote " + ", ".join(map(str, paths)))
    console.print(escape(doc["recommendation"]), style="bold", highlight=False)
    return doc
