"""Batch deadline accounting (`sim.deadlines`, `sim.results`): every batch request lands in
exactly one class, work waiting on a deadline after the horizon is not a miss, and the EDF
feasibility check says when that waiting is hopeless."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sageserve.cli import app
from sageserve.core.types import IW_F, NIW, Request
from sageserve.pace import make_strategy
from sageserve.sim.deadlines import (
    PendingWork,
    account,
    describe,
    edf_feasible,
    totals,
)
from sageserve.sim.engine import RunResult, Simulation, TierModelStats
from sageserve.sim.results import batch_totals, comparison_rows, policy_summary
from tests.sim.helpers import config, flat_perf

H = 100.0  # the horizon of the hand-built cases


def W(deadline: float, tokens: float = 10.0) -> PendingWork:
    return PendingWork(deadline, tokens)


@pytest.mark.parametrize(
    ("pending", "capacity", "feasible"),
    [
        ([], 1.0, True),  # nothing waits
        ([W(110, 100)], 10.0, True),  # exactly fits: 10 s × 10 tokens/s
        ([W(110, 101)], 10.0, False),  # one token too many
        ([W(200, 500), W(120, 150)], 10.0, True),  # EDF: 150 by 120 (200), 650 by 200 (1000)
        ([W(200, 500), W(120, 250)], 10.0, False),  # 250 due by 120, only 200 fit
        ([W(300, 500), W(150, 400), W(200, 300)], 10.0, True),  # 400/500, 700/1000, 1200/2000
        ([W(300, 500), W(150, 600), W(200, 300)], 10.0, False),  # 600 due by 150 > 500
        ([W(100, 1)], 10.0, False),  # due at the horizon itself: no time left
    ],
)
def test_edf_feasibility_compares_tokens_due_with_capacity_until_each_deadline(
    pending: list[PendingWork], capacity: float, feasible: bool
) -> None:
    assert edf_feasible(pending, H, capacity) is feasible


@pytest.mark.parametrize(
    ("pending", "dropped", "capacity", "expected"),
    [
        # deadline inside the horizon, unfinished: a miss
        ([W(90)], 0, 10.0, (0, 1, 0, None, True)),
        # deadline exactly at the horizon: inside
        ([W(H)], 0, 10.0, (0, 1, 0, None, True)),
        # deadline beyond the horizon: waiting, not a miss; feasible
        ([W(150, 100)], 0, 10.0, (0, 0, 1, 150.0, True)),
        # beyond the horizon but more than the largest fleet can serve by then
        ([W(150, 1000)], 0, 10.0, (0, 0, 1, 150.0, False)),
        # beyond, capacity unknown: feasibility unknown
        ([W(150)], 0, 0.0, (0, 0, 1, 150.0, None)),
        # a mix, and a dropped request (never served: a miss wherever its deadline is)
        ([W(50), W(300, 10), W(120, 10)], 2, 10.0, (0, 3, 2, 120.0, True)),
    ],
)
def test_unfinished_work_is_classified_by_its_deadline_against_the_horizon(
    pending: list[PendingWork],
    dropped: int,
    capacity: float,
    expected: tuple[int, int, int, float | None, bool | None],
) -> None:
    a = account(0, 0, pending, dropped, H, capacity)
    got = (
        a.served_late,
        a.missed,
        a.queued_beyond_horizon,
        a.earliest_pending_deadline_s,
        a.feasible_at_max,
    )
    assert got == expected


@pytest.mark.parametrize(
    ("served", "late", "pending", "attainment", "misses"),
    [
        (8, 2, [], 0.8, 2),  # served late counts against attainment
        (8, 0, [W(90), W(95)], 0.8, 2),  # unfinished inside the horizon too
        (8, 0, [W(150)] * 100, 1.0, 0),  # waiting beyond the horizon does not
        (0, 0, [W(150)], None, 0),  # nothing known yet: no attainment
    ],
)
def test_deadline_attainment_is_over_requests_whose_deadline_lies_inside_the_horizon(
    served: int, late: int, pending: list[PendingWork], attainment: float | None, misses: int
) -> None:
    a = account(served, late, pending, 0, H, 1e9)
    assert a.deadline_attainment == (pytest.approx(attainment) if attainment else None)
    assert a.misses == misses


def _stats(finished: int, late: int, dropped: int = 0, refused: int = 0) -> TierModelStats:
    st = TierModelStats()
    st.finished, st.deadline_miss, st.slo_met = finished, late, finished - late
    st.dropped, st.refused = dropped, refused
    return st


def _result(**kw: object) -> RunResult:
    base: dict[str, object] = {
        "policy": "p",
        "start_s": 0.0,
        "end_s": 80.0,
        "arrived": 0,
        "finished": 0,
        "unfinished_by_key": {},
        "stats": {},
        "gpu_seconds": {},
        "instance_seconds": {},
        "events": {},
        "minutes": [],
        "sim_events": 0,
        "preemptions": 0,
    }
    base.update(kw)
    return RunResult(**base)  # type: ignore[arg-type]


def test_summary_reports_the_classes_for_batch_tiers_only_and_they_add_up() -> None:
    r = _result(
        arrived=26,
        finished=15,
        refused=1,
        unfinished_by_key={("NIW", "m"): 5, ("IW-F", "m"): 1},
        stats={("NIW", "m"): _stats(10, 3, dropped=1, refused=1), ("IW-F", "m"): _stats(5, 0)},
        batch_deadlines={"NIW": 86400.0},
        pending={("NIW", "m"): [W(90), W(150, 100), W(400, 100), W(200, 100)]},
        capacity_at_max_tps={"m": 10.0},
        horizon_s=H,
    )
    p = policy_summary(r, 1.0)
    niw, iwf = p["tiers"]["NIW"]["m"], p["tiers"]["IW-F"]["m"]
    assert "served_by_deadline" not in iwf  # interactive tiers keep today's fields
    assert (niw["served_by_deadline"], niw["served_late"], niw["missed"]) == (7, 3, 2)
    assert niw["queued_beyond_horizon"] == 3
    assert niw["earliest_pending_deadline_s"] == 150.0
    assert niw["feasible_at_max"] is True  # 100 by 150 (500), 200 by 200, 300 by 400
    assert niw["deadline_attainment"] == pytest.approx(7 / 12, abs=1e-5)
    assert niw["horizon_s"] == H and niw["capacity_at_max_tps"] == 10.0
    classes = ("served_by_deadline", "served_late", "missed", "queued_beyond_horizon")
    assert sum(niw[k] for k in classes) == niw["finished"] + niw["unfinished"]
    # existing fields keep their meaning: unfinished still counts against slo_attainment
    assert niw["deadline_misses"] == 3
    assert niw["slo_attainment"] == pytest.approx(7 / 15, abs=1e-5)
    b = batch_totals(p)
    assert (b["misses"], b["queued_beyond_horizon"], b["feasible_at_max"]) == (5, 3, True)


def test_a_run_without_horizon_or_capacity_is_judged_at_the_window_end_and_unknown() -> None:
    r = _result(
        unfinished_by_key={("NIW", "m"): 2},
        stats={("NIW", "m"): _stats(0, 0)},
        batch_deadlines={"NIW": 86400.0},
        pending={("NIW", "m"): [W(79), W(81)]},
    )
    niw = policy_summary(r, 1.0)["tiers"]["NIW"]["m"]
    assert (niw["missed"], niw["queued_beyond_horizon"], niw["feasible_at_max"]) == (1, 1, None)
    assert niw["horizon_s"] == 80.0


def test_totals_pool_the_models_and_any_infeasible_queue_makes_the_whole_infeasible() -> None:
    a = account(5, 1, [W(150, 1000)], 0, H, 10.0).as_dict()  # infeasible
    b = account(4, 0, [W(120)], 0, H, 0.0).as_dict()  # unknown
    c = account(1, 0, [], 0, H, 10.0).as_dict()
    t = totals([a, b, c, {"finished": 3}])  # an interactive entry is ignored
    assert (t["served_by_deadline"], t["misses"], t["queued_beyond_horizon"]) == (10, 1, 2)
    assert t["deadline_attainment"] == pytest.approx(10 / 11)
    assert t["earliest_pending_deadline_s"] == 120.0
    assert t["feasible_at_max"] is False
    assert totals([b, c])["feasible_at_max"] is None
    assert totals([c])["feasible_at_max"] is True
    assert totals([])["feasible_at_max"] is None and totals([])["deadline_attainment"] is None


def test_comparison_rows_carry_the_batch_totals() -> None:
    r = _result(
        unfinished_by_key={("NIW", "m"): 1},
        stats={("NIW", "m"): _stats(4, 1)},
        batch_deadlines={"NIW": 86400.0},
        pending={("NIW", "m"): [W(50)]},
        horizon_s=H,
    )
    doc = {"policies": {"p": policy_summary(r, 1.0)}}
    (row,) = comparison_rows(doc, {"p": (r, 1.0)}, ["IW-F"])
    assert row["niw"]["misses"] == 2 and row["niw"]["deadline_attainment"] == pytest.approx(0.6)


def test_the_engine_records_unfinished_batch_work_with_deadlines_and_capacity() -> None:
    """One instance serving one sequence at a time, a 60 s window and a 30 s drain: a long
    batch request is still unfinished at the horizon (its 24 h deadline lies beyond it); a
    batch request with a 20 s deadline and 100 s of decode cannot make it whatever the
    order (its slack runs out, it takes the instance, and is still running at the horizon):
    a miss inside the horizon; the interactive one is served."""
    perf = flat_perf(prefill_s=0.05, decode_s=0.5, max_seqs=1)
    cfg = config(perf, initial=1, lo=1, hi=1, end_s=60.0, drain_s=30.0)
    cfg = replace(cfg, models=(replace(cfg.models[0], capacity_tps=7.0),))
    short = replace(NIW, name="NIW-S", deadline_s=20.0)
    reqs = [
        Request(0, 1.0, "m", IW_F, "r1", 10, 2),
        Request(1, 2.0, "m", NIW, "r1", 10, 400),  # 200 s of decode: running at the end
        Request(2, 3.0, "m", short, "r1", 10, 200),  # 100 s of decode: due at 23 s
    ]
    r = Simulation(cfg, make_strategy("reactive"), reqs).run()
    assert r.horizon_s == 90.0
    assert r.capacity_at_max_tps == {"m": 7.0}
    assert r.batch_deadlines == {"NIW": NIW.deadline_s, "NIW-S": 20.0}
    p = policy_summary(r, 1.0)
    assert "served_by_deadline" not in p["tiers"]["IW-F"]["m"]
    niw, niw_s = p["tiers"]["NIW"]["m"], p["tiers"]["NIW-S"]["m"]
    assert (niw["queued_beyond_horizon"], niw["missed"], niw["feasible_at_max"]) == (1, 0, True)
    assert niw["earliest_pending_deadline_s"] == pytest.approx(2.0 + 86400.0)
    assert (niw_s["missed"], niw_s["queued_beyond_horizon"]) == (1, 0)
    assert niw_s["deadline_attainment"] == 0.0
    assert batch_totals(p)["misses"] == 1


@pytest.mark.parametrize(
    ("entries", "cells"),
    [
        ([], {"attainment": "-", "served": "-", "missed": "-", "waiting": "-"}),
        (
            [account(9, 1, [W(90)], 0, H, 10.0).as_dict()],
            {"attainment": "81.82%", "served": "9", "missed": "2 (1 late)", "waiting": "0"},
        ),
        (
            [account(3, 0, [W(80 + 7200, 10)], 0, H, 10.0).as_dict()],
            {
                "attainment": "100.00%",
                "served": "3",
                "missed": "0",
                "waiting": "1 (due ≥ end+2.0h, feasible)",
            },
        ),
        (
            [account(0, 0, [W(150, 1e6)], 0, H, 10.0).as_dict()],
            {
                "attainment": "-",
                "served": "0",
                "missed": "0",
                "waiting": "1 (due ≥ end+0.0h, INFEASIBLE)",
            },
        ),
    ],
)
def test_the_printed_cells_say_attainment_misses_and_what_waits(
    entries: list[dict[str, object]], cells: dict[str, str]
) -> None:
    assert describe(totals(entries), 80.0) == cells


TINY = Path(__file__).parent / "fixtures" / "tiny"


@pytest.mark.slow
def test_simulate_reports_the_batch_classes_and_they_add_up(tmp_path: Path) -> None:
    """The tiny scenario with a 40-minute batch deadline and no drain: the batch work still
    queued or running when the 20-minute window ends is due after it, so it is queued beyond
    the horizon (feasible at maxInstances), not missed: the deadline attainment stays whole
    where the SLO attainment, which counts it as failed, does not."""
    sc = tmp_path / "sc"
    shutil.copytree(TINY, sc)
    data = (Path(__file__).parents[2] / "data").resolve()
    for name, old, new in (
        ("workload.yaml", "../../../../data", str(data)),
        ("tiers.yaml", "deadlineSeconds: 86400", "deadlineSeconds: 2400"),
        ("scenario.yaml", "drain: 30m", "drain: 0s"),
    ):
        f = sc / name
        f.write_text(f.read_text().replace(old, new))
    out = tmp_path / "out"
    args = ["simulate", "-s", str(sc), "-o", str(out), "-p", "reactive"]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    assert "NIW by deadline" in res.output and "feasible" in res.output
    assert "NIW by deadline" in (out / "report.html").read_text()
    p = json.loads((out / "summary.json").read_text())["policies"]["reactive"]
    niw = p["tiers"]["niw"]["llama-2-70b"]
    assert niw["horizon_s"] == 1200.0
    assert niw["capacity_at_max_tps"] == 400.0 * 12  # θ × maxInstances over both regions
    classes = ("served_by_deadline", "served_late", "missed", "queued_beyond_horizon")
    batch_arrived = niw["finished"] + niw["unfinished"] + niw["refused"]
    assert sum(niw[k] for k in classes) == batch_arrived - niw["refused"]
    assert niw["served_by_deadline"] > 0 and niw["queued_beyond_horizon"] > 0
    assert niw["missed"] == niw["served_late"] == 0
    assert niw["earliest_pending_deadline_s"] >= 2400.0
    assert niw["feasible_at_max"] is True
    assert niw["deadline_attainment"] == 1.0 > niw["slo_attainment"]
    for tier in ("iw-f", "iw-n"):  # interactive tiers keep today's fields
        assert "served_by_deadline" not in p["tiers"][tier]["llama-2-70b"]


@pytest.mark.parametrize(
    ("released", "want"),
    [
        ({}, {}),
        (
            {"m": {"trough": 3, "promoted": 1}},
            {"m": {"released_in_troughs": 3, "promoted": 1, "promoted_share": 0.25}},
        ),
        (
            {"b": {"trough": 0, "promoted": 2}, "a": {"trough": 5, "promoted": 0}},
            {
                "a": {"released_in_troughs": 5, "promoted": 0, "promoted_share": 0.0},
                "b": {"released_in_troughs": 0, "promoted": 2, "promoted_share": 1.0},
            },
        ),
        (
            {"m": {"trough": 0, "promoted": 0}},
            {"m": {"released_in_troughs": 0, "promoted": 0, "promoted_share": None}},
        ),
    ],
)
def test_the_summary_says_how_batch_left_the_queue(
    released: dict[str, dict[str, int]], want: dict[str, dict[str, object]]
) -> None:
    p = policy_summary(_result(batch_released=released), 1.0)
    assert p["batch_queue"] == want
    assert list(p["batch_queue"]) == sorted(want)
