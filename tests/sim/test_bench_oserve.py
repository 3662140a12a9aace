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


CROSSING = default_scenario_dir().parent / "oserve-crossing"


def test_the_cli_refuses_a_bad_seed_list_naming_the_option() -> None:
    r = CliRunner().invoke(app, ["bench", "oserve", "--seed", "0,zero", "--span", "10"])
    assert r.exit_code == 2
    assert "--seed" in r.output


@pytest.mark.slow
def test_a_workload_seed_redraws_which_requests_a_thinned_trace_keeps() -> None:
    # oserve-crossing replays its traces at 0.7 times their rates: the seed picks the requests
    from itertools import takewhile

    from sageserve.sim.scenario import load_scenario

    scenario = load_scenario(CROSSING)

    def first_minutes(seed: int | None) -> list[tuple[float, int, int]]:
        reqs = takewhile(lambda r: r.arrival < 300.0, scenario.with_seed(seed).requests())
        return [(r.arrival, r.prompt_tokens, r.output_tokens) for r in reqs]

    three = first_minutes(3)
    assert three and three == first_minutes(3)
    assert three != first_minutes(4)
    assert three != first_minutes(None)  # None: the scenario's own seed
    # the kept requests are the trace's own: another seed keeps a different subset of them
    assert set(three) & set(first_minutes(4))


@pytest.mark.slow
def test_two_seeds_report_each_run_and_the_spread(tmp_path: Path) -> None:
    import dataclasses

    from sageserve.commands.bench_oserve import DEPLOYMENTS, bench_oserve_seeds

    base = OServeBench(
        scenario=CROSSING,
        model="codellama-34b",
        gpus=8,
        tuning_hours=(0,),
        held_out_hours=(4,),
        span_s=60.0,
        replan_s=30.0,
        startup_s=20.0,
        drain_s=600.0,
        strategies=("TP1", "TP2"),
        capacity="analytical",
    )
    cfgs = [dataclasses.replace(base, seed=s, workload_seed=s) for s in (0, 1)]
    console = Console(record=True, width=250)
    doc = bench_oserve_seeds(cfgs, tmp_path / "o.json", console)
    text = console.export_text()
    assert "per seed: goodput req/s / P99 e2e s" in text
    assert "over seeds 0, 1: mean [lowest, highest]" in text
    assert (tmp_path / "o.json").exists()
    runs = doc["runs"]
    assert [r["config"]["seed"] for r in runs] == [0, 1]
    assert [r["config"]["workload_seed"] for r in runs] == [0, 1]
    sp = doc["spread"]
    assert sp["seeds"] == [0, 1]
    for name in DEPLOYMENTS:
        g = sp["deployments"][name]["goodput"]
        vals = [r["results"][name]["goodput"] for r in runs]
        assert g["n"] == 2
        assert g["low"] == min(vals) and g["high"] == max(vals)
    ratios = [
        r["results"]["heterogeneous"]["goodput"] / r["results"]["static"]["goodput"]
        for r in runs
        if r["results"]["static"]["goodput"] > 0 and r["results"]["heterogeneous"]["goodput"] > 0
    ]
    if ratios:
        got = sp["hetero_gain_vs"]["static"]["goodput"]["mean"]
        assert got == pytest.approx(sum(ratios) / len(ratios))
