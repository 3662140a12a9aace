"""Leave one trace out: the held-out trace's figures come from choices made on the others
only, and a user's series is read and held out the same way."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from sageserve.cli import app
from sageserve.commands.forecast import to_step
from sageserve.forecast.backtest import load_series_csv
from sageserve.forecast.loto import leave_one_out
from sageserve.forecast.types import Conformal, FloatArray, GapRule

from .test_forecast import diurnal

SMALL = {
    "candidates": ("persistence", "arima"),
    "conformals": (Conformal(window_hours=24), Conformal(window_hours=48, gamma=0.0)),
    "rules": (GapRule(drop_factor=2.0), GapRule(drop_factor=3.0)),
}


def traces() -> dict[str, FloatArray]:
    return {f"t{i}": diurnal(2.5, seed=i, noise=0.04 + 0.03 * i) for i in range(3)}


@pytest.mark.slow
def test_each_trace_is_reported_on_choices_made_on_the_others_only() -> None:
    series = traces()
    rows = leave_one_out(series, **SMALL)  # type: ignore[arg-type]
    assert [r.trace for r in rows] == ["t0", "t1", "t2"]
    for r in rows:
        assert r.trace not in r.chosen_on and len(r.chosen_on) == 2
        assert r.row.hours > 25 and r.baseline.method == "persistence"
        assert 0.0 <= r.row.coverage <= 1.0 and math.isfinite(r.row.mape)
    # Ruin t0: the choices reported on t0 cannot change (they never saw it) ...
    ruined = dict(series, t0=series["t0"][::-1] * 7.0)
    again = leave_one_out(ruined, **SMALL)  # type: ignore[arg-type]
    assert (again[0].method, again[0].conformal, again[0].rule) == (
        rows[0].method,
        rows[0].conformal,
        rows[0].rule,
    )


def test_an_external_series_is_held_out_from_all_the_traces() -> None:
    series = traces()
    user = {"user.csv": diurnal(2.5, seed=9, noise=0.06)}
    rows = leave_one_out({"t1": series["t1"]}, external=user, **SMALL)  # type: ignore[arg-type]
    assert [r.trace for r in rows] == ["user.csv"] and rows[0].chosen_on == ("t1",)
    with pytest.raises(ValueError, match="two traces"):
        leave_one_out({"t1": series["t1"]}, **SMALL)  # type: ignore[arg-type]


@pytest.mark.slow
def test_injected_gaps_scored_as_demand_wreck_the_figures_and_detection_restores_them() -> None:
    series = {"t0": diurnal(2.5, seed=0), "t1": diurnal(2.5, seed=1)}
    rows = leave_one_out(series, inject=12, **SMALL)  # type: ignore[arg-type]
    for r in rows:
        assert r.trace.endswith("12 injected gaps")
        assert r.unguarded is not None and r.unguarded_baseline is not None
        assert r.row.skipped > 0 and r.unguarded.skipped == 0
        assert r.unguarded.mape > 2 * r.row.mape


def test_a_users_csv_is_read_by_column_with_gaps(tmp_path: Path) -> None:
    path = tmp_path / "series.csv"
    path.write_text("time,tps\n0,10\n60,\n120,-3\n180,x\n240,20.5\n")
    values = load_series_csv(path)
    assert values[0] == 10.0 and values[-1] == 20.5 and np.isnan(values[1:4]).all()
    assert load_series_csv(path, "time")[-1] == 240.0
    with pytest.raises(ValueError, match="--csv-column"):
        load_series_csv(path, "tokens")
    empty = tmp_path / "empty.csv"
    empty.write_text("")
    with pytest.raises(ValueError, match="header"):
        load_series_csv(empty)


def test_minute_rows_are_averaged_to_the_traces_ten_minutes() -> None:
    minutes = np.concatenate([[99.0] * 3, np.arange(10.0), [np.nan] * 10])
    out = to_step(minutes, 60.0, 600.0)
    assert out[0] == pytest.approx(4.5) and np.isnan(out[1]) and out.size == 2
    with pytest.raises(ValueError, match="--step-seconds"):
        to_step(minutes, 70.0, 600.0)
    # Minutes lost by the collector are found at their own step and left out of the mean.
    busy = np.full(120, 100.0)
    busy[23:27] = 5.0
    assert to_step(busy, 60.0, 600.0)[2] == pytest.approx(100.0)


def test_the_cli_names_a_missing_column(tmp_path: Path) -> None:
    path = tmp_path / "series.csv"
    path.write_text("t,v\n0,1\n")
    result = CliRunner().invoke(
        app, ["forecast", "backtest", "--csv", str(path), "--csv-column", "tps"]
    )
    assert result.exit_code == 2
    assert "--csv-column" in result.output
