"""`sageserve bench pool`: the seeds option, the spread over seeds, and a `--sized` run on a
few minutes of the small-models scenario (the table's structure and what must hold whatever
the figures; no latency or wall-clock assertion).

Why: the Aegaeon figures are reported per seed with their spread from one command; the
sized report must keep its baselines what they claim to be (the floored dedicated fleet up
the whole window, request-level on the pool's GPUs, mux2 within two models per GPU).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sageserve.cli import app
from sageserve.commands.bench_pool import (
    SIZED_DEDICATED_FLOOR,
    SIZED_DEDICATED_ZERO,
    SIZED_MUX2,
    SIZED_POOLED,
    SIZED_REQUEST_EQUAL,
    SIZED_REQUEST_FEWEST,
)
from sageserve.commands.seeds import seed_list, spread

SCENARIO = Path(__file__).resolve().parents[2] / "scenarios" / "aegaeon-small-models"


@pytest.mark.parametrize(
    ("value", "seeds"),
    [("0", (0,)), ("0,1,2", (0, 1, 2)), (" 3 , 7 ", (3, 7)), ("5,", (5,))],
)
def test_seed_lists_parse(value: str, seeds: tuple[int, ...]) -> None:
    assert seed_list(value) == seeds


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("", "give one seed"),
        ("a", "non-negative integers"),
        ("0,1.5", "non-negative integers"),
        ("-1", ">= 0"),
        ("1,2,1", "listed twice"),
    ],
)
def test_bad_seed_lists_are_refused_naming_the_option(value: str, says: str) -> None:
    with pytest.raises(ValueError, match="--seed") as e:
        seed_list(value)
    assert says in str(e.value)


def test_the_spread_is_mean_lowest_highest_of_finite_values() -> None:
    s = spread([3.0, 1.0, 2.0, math.inf])
    assert (s.mean, s.low, s.high, s.n) == (2.0, 1.0, 3.0, 3)
    assert s.format(".1f", "x") == "2.0x [1.0x, 3.0x]"
    assert spread([4.0]).format(".1f") == "4.0"
    assert spread([math.nan]).format() == "-"


def test_the_cli_refuses_a_bad_seed_before_running() -> None:
    r = CliRunner().invoke(app, ["bench", "pool", "-s", str(SCENARIO), "--sized", "--seed", "0,x"])
    assert r.exit_code == 2
    assert "--seed" in r.output


@pytest.mark.slow
def test_a_sized_run_on_two_seeds_reports_each_and_the_spread(tmp_path: Path) -> None:
    out = tmp_path / "pool.json"
    r = CliRunner().invoke(
        app,
        [
            "bench",
            "pool",
            "-s",
            str(SCENARIO),
            "--sized",
            "--hours",
            "0.05",
            "--goodput-gpus",
            "2",
            "--goodput-minutes",
            "1",
            "--seed",
            "0,1",
            "--json",
            str(out),
        ],
        env={"COLUMNS": "220"},
    )
    assert r.exit_code == 0, r.output
    assert "(seed 0)" in r.output and "(seed 1)" in r.output
    assert "over seeds 0, 1" in r.output
    doc = json.loads(out.read_text())
    runs = doc["runs"]
    assert [x["seed"] for x in runs] == [0, 1]
    names = [
        SIZED_DEDICATED_FLOOR,
        SIZED_DEDICATED_ZERO,
        SIZED_REQUEST_EQUAL,
        SIZED_REQUEST_FEWEST,
        SIZED_MUX2,
        SIZED_POOLED,
    ]
    for run in runs:
        assert run["mode"] == "sized" and run["reference"] == SIZED_POOLED
        rows = {x["strategy"]: x for x in run["strategies"]}
        assert list(rows) == names
        sizing = run["sizing"]
        hot_gpus = sum(sizing["dedicated"].values())
        pooled = rows[SIZED_POOLED]
        assert pooled["gpus"] == sizing["prefill_instances"] + sizing["decode_instances"] + hot_gpus
        # request-level on exactly the pool's GPUs
        assert rows[SIZED_REQUEST_EQUAL]["gpus"] == pooled["gpus"]
        # the floor keeps one instance per model up over the whole window
        floor = rows[SIZED_DEDICATED_FLOOR]
        assert floor["gpus"] == run["models"]
        assert floor["gpu_hours"] == pytest.approx(floor["gpus"] * run["window_hours"])
        assert rows[SIZED_DEDICATED_ZERO]["gpu_hours"] <= floor["gpu_hours"] + 1e-9
        cold = run["models"] - len(sizing["dedicated"])
        assert rows[SIZED_MUX2]["gpus"] == math.ceil(cold / 2) + hot_gpus
        fewest = rows[SIZED_REQUEST_FEWEST]
        if "gpus" in fewest:
            assert fewest["tail_attainment"] >= run["target_attainment"]
        for x in rows.values():
            if "gpus" in x:
                assert 0.0 <= x["tail_attainment"] <= 1.0
        good = run["goodput"]
        assert good["seed"] == run["seed"]
        assert 0 <= good["dedicated_models"] <= good["gpus"]
        assert 0 <= good["mux2_models"] <= 2 * good["gpus"]
    # the spread covers every strategy over both seeds
    sp = doc["spread"]
    assert sp["seeds"] == [0, 1]
    for name in names[:3] + names[4:]:
        x = sp["strategies"][name]
        assert x["runs"] == 2
        assert x["gpu_hours"]["low"] <= x["gpu_hours"]["mean"] <= x["gpu_hours"]["high"]
    assert sp["strategies"][SIZED_POOLED]["vs_reference"]["mean"] == pytest.approx(1.0)
    assert set(sp["goodput"]) == {
        "pooled_models",
        "request_level_models",
        "mux2_models",
        "dedicated_models",
    }
