"""`sageserve bench oserve` on a tiny slice of the oserve-mixed day: the table's structure and
what must hold whatever the figures (no latency or wall-clock assertion).

Why: the benchmark is the issue's evidence; it must run end to end, report the three
deployments on the same held-out requests, and keep its baselines what they claim to be
(static: one layout, never switched; reload: homogeneous layouts only, switched only at hour
boundaries).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

from sageserve.cli import app
from sageserve.commands.bench_oserve import OServeBench, bench_oserve_command
from sageserve.sim.scenario import default_scenario_dir

SCENARIO = default_scenario_dir().parent / "oserve-mixed"


@pytest.mark.slow
def test_the_benchmark_runs_on_a_slice_and_reports_the_three_deployments(
    tmp_path: Path,
) -> None:
    cfg = OServeBench(
        scenario=SCENARIO,
        tuning_hours=(0,),
        held_out_hours=(4, 5),
        span_s=90.0,
        replan_s=30.0,
        startup_s=20.0,
        drain_s=900.0,
        strategies=("TP4", "TP8", "TP4xPP2"),
        capacity="analytical",  # `auto` and `measured`: tests/sim/test_type_capacity.py
    )
    console = Console(record=True, width=250)
    out = bench_oserve_command(cfg, tmp_path / "o.json", console)
    text = console.export_text()
    for needle in (
        "held-out hours: P99 latency and throughput at SLO",
        "hetero P99 e2e gain",
        "hetero goodput gain",
        "per held-out hour",
    ):
        assert needle in text
    assert (tmp_path / "o.json").exists()
    res = out["results"]
    assert set(res) == {"static", "per-hour reload", "heterogeneous"}
    n = {r["requests"] for r in res.values()}
    assert len(n) == 1 and n.pop() > 0  # the same held-out arrivals for every deployment
    for r in res.values():
        assert r["finished"] <= r["requests"]
        assert r["goodput"] <= r["throughput"] + 1e-12
        assert len(r["per_hour"]) == 2
    # static: the tuning winner, never switched
    assert out["static_layout"] in out["tuning"]
    assert res["static"]["switches"] == 0
    assert [x["layout"] for x in res["static"]["layouts"]] == [out["static_layout"]]
    # reload: one homogeneous layout per held-out hour, at most one switch per boundary
    assert len(out["reload_schedule"]) == 2
    assert all(" + " not in lay for lay in out["reload_schedule"])
    assert res["per-hour reload"]["switches"] <= 1
    # heterogeneous: re-planned every interval, every request dispatched to a layout
    het = res["heterogeneous"]
    assert het["replans"] >= 1
    assert sum(het["requests_per_strategy"].values()) == het["requests"]
    # the start layout chosen by simulation on the tuning hours (the default): distinct
    # candidates, the best homogeneous among them, the winner by the bench's "best" rule
    assert cfg.start == "simulated" and cfg.dispatch == "weighted-overflow"
    cands = out["start_candidates"]
    assert len({(c["capacity"], c["layout"]) for c in cands}) == len(cands) >= 1
    assert out["static_layout"] in {c["layout"] for c in cands}

    def score(c: dict[str, float]) -> tuple[float, float]:
        return (round(c["goodput"], 6), -c["p99_e2e_s"])

    best = max(score(c) for c in cands)
    won = [c for c in cands if score(c) == best]
    assert (out["capacity_source"], out["hetero_initial"]) in {
        (c["capacity"], c["layout"]) for c in won
    }
    assert het["overflows"] >= 0


@pytest.mark.slow
def test_the_earlier_rules_stay_selectable(tmp_path: Path) -> None:
    # --start search --dispatch weighted: the search's layout unchecked, strict weights
    cfg = OServeBench(
        scenario=SCENARIO,
        tuning_hours=(0,),
        held_out_hours=(4,),
        span_s=60.0,
        replan_s=30.0,
        startup_s=20.0,
        drain_s=600.0,
        strategies=("TP4", "TP4xPP2"),
        capacity="analytical",
        start="search",
        dispatch="weighted",
    )
    out = bench_oserve_command(cfg, None, Console(record=True, width=250))
    assert out["start_candidates"] == []
    assert out["results"]["heterogeneous"]["overflows"] == 0


@pytest.mark.parametrize(
    ("option", "value"), [("--dispatch", "round-robin"), ("--start", "random")]
)
def test_the_cli_refuses_an_unknown_dispatch_or_start(option: str, value: str) -> None:
    r = CliRunner().invoke(app, ["bench", "oserve", option, value, "--span", "10"])
    assert r.exit_code == 2
    assert value in r.output


@pytest.mark.slow
def test_the_cli_refuses_an_unknown_layout() -> None:
    r = CliRunner().invoke(
        app,
        ["bench", "oserve", "--strategies", "TP3", "--span", "10", "--tuning-hours", "0"],
    )
    assert r.exit_code == 2
    assert "TP3" in r.output
