"""Run a scenario under several policies and write the results (what `sageserve simulate` does).

Each policy replays the same request stream (same seed) on a fresh copy of the cluster, so
the only difference between two runs is the policy.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sageserve.sim.engine import PerKeySeries, RunResult, Simulation
from sageserve.sim.results import (
    comparison_rows,
    summary,
    write_minutes,
    write_summary,
)
from sageserve.sim.scenario import Scenario


@dataclass
class Comparison:
    summary: dict[str, Any]
    table: list[dict[str, Any]]
    runs: dict[str, tuple[RunResult, float]]


def run_policies(
    scenario: Scenario,
    policies: Sequence[str],
    seed: int | None = None,
    on_progress: Callable[[str, float], None] | None = None,
) -> Comparison:
    """Simulate `policies` one after the other; progress is reported as a 0..1 fraction."""
    scenario = scenario.with_seed(seed)
    cfg = scenario.sim_config()
    span = max(1e-9, cfg.end_s - cfg.start_s)
    runs: dict[str, tuple[RunResult, float]] = {}
    history: tuple[PerKeySeries, PerKeySeries] | None = None  # read once, for every LT run
    pool_history: PerKeySeries | None = None
    for name in policies:
        strategy = scenario.strategy(name)
        cb = None
        if on_progress is not None:

            def cb(t: float, _n: str = name) -> None:
                on_progress(_n, (t - cfg.start_s) / span)

        t0 = time.perf_counter()
        planner = None
        if strategy.plan_cadence.plans:
            planner = scenario.planner_for(strategy)
            if history is None:
                history = scenario.history(cfg.history_minutes)
                pool_history = scenario.pool_history(cfg.history_minutes)
        result = Simulation(
            cfg,
            strategy,
            scenario.requests(),
            cb,
            planner,
            history if planner else None,
            pool_history=pool_history if planner else None,
        ).run()
        runs[name] = (result, time.perf_counter() - t0)
        if on_progress is not None:
            on_progress(name, 1.0)
    interactive = [n for n, t in scenario.tiers.items() if t.interactive]
    meta = {
        "name": scenario.name,
        "window": {"start_s": cfg.start_s, "end_s": cfg.end_s},
        "seed": cfg.seed,
    }
    doc = summary(meta, runs)
    return Comparison(doc, comparison_rows(doc, runs, interactive), runs)


def write_outputs(out: Path, cmp: Comparison, report: bool = True) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / "summary.json", out / "minutes.csv"]
    write_summary(paths[0], cmp.summary)
    write_minutes(paths[1], cmp.runs)
    if report:
        from sageserve.sim.report import write_report

        paths.append(write_report(out, cmp.summary, cmp.runs, cmp.table))
    return paths
