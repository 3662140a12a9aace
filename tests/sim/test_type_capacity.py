"""n_{k,j} measured on the simulator at an SLO (`sim/type_capacity.py`, `calibrate --by-type`).

Why: the layout search and the assignment read n; a measured n must behave as a capacity at
an SLO (a looser SLO never gives less), refuse what vLLM refuses (a request longer than the
context gets 0), be deterministic, and round-trip through the file the bench reads. No
wall-clock assertion.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

from sageserve.cli import app
from sageserve.commands.calibrate_types import ByTypeCalibration, calibrate_by_type_command
from sageserve.forecast.request_types import RequestTypes, fit_request_types
from sageserve.perf.model import VariantPerf, load_catalog
from sageserve.plan.layout_search import Strategy
from sageserve.sim.scenario import default_scenario_dir
from sageserve.sim.type_capacity import (
    CapacityContext,
    ProbeSettings,
    SloSpec,
    TypeCapacityTable,
    bisect_rate,
    capacity_table,
    measure_type_capacity,
)

H100 = "NVIDIA-H100-80GB-HBM3"
SCENARIO = default_scenario_dir().parent / "oserve-mixed"
FAST = ProbeSettings(requests=300, steps=4, max_doublings=2, drain_s=300.0)


def _setup() -> tuple[VariantPerf, RequestTypes, list[tuple[int, int]]]:
    perf = load_catalog().layout("llama-2-70b", H100, 4, 1)
    sizes = [(300, 120), (350, 90), (280, 150), (2000, 15), (1900, 20), (2100, 12)]
    types = fit_request_types([p for p, _ in sizes], [o for _, o in sizes], 2, 0)
    return perf, types, sizes[:3]


def test_a_looser_slo_never_gives_a_lower_rate() -> None:
    perf, types, sizes = _setup()
    slos = [
        SloSpec(0.5, 0.03, 0.9),
        SloSpec(5.0, 0.1, 0.9),
        SloSpec(5.0, 0.2, 0.9),
        SloSpec(5.0, 0.2, 0.5),
        SloSpec(30.0, 1.0, 0.5),
    ]
    ns = [measure_type_capacity(perf, types, sizes, slo, FAST)[0] for slo in slos]
    assert all(b >= a for a, b in itertools.pairwise(ns)), ns
    assert ns[-1] > 0
    # deterministic for a seed
    again = measure_type_capacity(perf, types, sizes, slos[2], FAST)[0]
    assert again == ns[2]


def test_a_request_longer_than_the_context_gets_zero() -> None:
    perf, types, _ = _setup()
    n, probes = measure_type_capacity(perf, types, [(4000, 500)], SloSpec(), FAST)
    assert n == 0.0 and probes == []
    # half of the type too long: refused requests miss the SLO, 90 % is out of reach
    n, _ = measure_type_capacity(perf, types, [(4000, 500), (300, 50)], SloSpec(), FAST)
    assert n == 0.0


def test_bisection_finds_the_threshold_of_a_monotone_predicate() -> None:
    got = bisect_rate(lambda r: r <= 7.3, hi=2.0, steps=10, max_doublings=4)
    assert 7.3 - 16 / 2**10 <= got <= 7.3
    assert bisect_rate(lambda r: False, hi=2.0, steps=5, max_doublings=4) == 0.0


@pytest.mark.slow
def test_calibrate_by_type_on_a_tiny_setting_writes_a_table_the_bench_can_read(
    tmp_path: Path,
) -> None:
    cfg = ByTypeCalibration(
        scenario=SCENARIO,
        types=2,
        hours=(0,),
        span_s=120.0,
        settings=FAST,
        strategies=("TP4", "TP8"),
    )
    console = Console(record=True, width=200)
    out = tmp_path / "n.json"
    table = calibrate_by_type_command(cfg, out, console)
    assert "n (req/s per replica)" in console.export_text()
    assert set(table.capacity) == {"TP4", "TP8"}
    for name, row in table.capacity.items():
        assert len(row) == 2 and all(x >= 0 for x in row)
        assert len(table.analytical[name]) == 2
    assert len(table.centroids) == 2
    doc = json.loads(out.read_text())
    assert doc["kind"] == "sageserve.io/type-capacity"
    assert doc["slo"] == {"ttftSeconds": 5.0, "tpotSeconds": 0.2, "attainment": 0.9}
    loaded = TypeCapacityTable.load(out)
    assert loaded.capacity == table.capacity
    # YAML too
    table.save(tmp_path / "n.yaml")
    assert TypeCapacityTable.load(tmp_path / "n.yaml").capacity == table.capacity
    # the measured source reads the file when its types match, refuses when they do not
    cat = load_catalog()
    perf = {Strategy(4, 1): cat.layout("llama-2-70b", H100, 4, 1)}
    from sageserve.commands.bench_oserve import part
    from sageserve.sim.scenario import load_scenario

    reqs = part(sorted(load_scenario(SCENARIO).requests(), key=lambda r: r.arrival), (0,), 120.0)
    types = fit_request_types(
        [r.prompt_tokens for r in reqs], [r.output_tokens for r in reqs], 2, 0
    )
    ctx = CapacityContext(perf, types, [], file=out)
    assert capacity_table("measured", ctx)[Strategy(4, 1)] == tuple(table.capacity["TP4"])
    other = fit_request_types([10, 20, 3000, 3100], [5, 6, 700, 800], 2, 0)
    with pytest.raises(ValueError, match="not the ones fitted here"):
        capacity_table("measured", CapacityContext(perf, other, [], file=out))
    with pytest.raises(ValueError, match="unknown capacity source"):
        capacity_table("magic", ctx)


@pytest.mark.slow
def test_the_cli_flag_runs() -> None:
    res = CliRunner().invoke(
        app,
        [
            "calibrate",
            "--by-type",
            "--types",
            "2",
            "--hours",
            "0",
            "--span",
            "60",
            "--requests",
            "200",
            "--steps",
            "2",
            "--strategies",
            "TP4",
        ],
    )
    assert res.exit_code == 0, res.output
    assert "TP4" in res.output


@pytest.mark.slow
def test_bench_capacity_auto_chooses_the_source_on_the_tuning_hours() -> None:
    from sageserve.commands.bench_oserve import OServeBench, run_bench

    cfg = OServeBench(
        scenario=SCENARIO,
        tuning_hours=(0,),
        held_out_hours=(4,),
        span_s=60.0,
        replan_s=30.0,
        startup_s=20.0,
        drain_s=300.0,
        types=2,
        strategies=("TP4", "TP8"),
        capacity="auto",
    )
    out = run_bench(cfg)
    tuned = out["capacity_tuning"]
    assert set(tuned) == {"analytical", "measured"}
    best = max(tuned, key=lambda n: (round(tuned[n]["goodput"], 6), -tuned[n]["p99_e2e_s"]))
    assert out["capacity_source"] == best
    assert set(out["results"]) == {"static", "per-hour reload", "heterogeneous"}
