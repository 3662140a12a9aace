"""Forecasting behaviour: robust fallbacks, calibrated upper quantile, β, backtest."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from sageserve.cli import app
from sageserve.commands.forecast import synthetic_series
from sageserve.forecast import FORECASTERS, ForecastSpec, batch_buffer_tps, forecast_peak
from sageserve.forecast.backtest import backtest, load_servegen_aggregate
from sageserve.forecast.types import FloatArray, PeakModel

TRACES = Path(__file__).resolve().parents[2] / "data" / "traces" / "servegen-bailian"
M_SMALL = TRACES / "language_m-small_aggregate_10min.csv"


def diurnal(days: float, seed: int = 0, noise: float = 0.05) -> FloatArray:
    rng = np.random.default_rng(seed)
    t = np.arange(int(days * 144)) / 144.0
    out: FloatArray = (
        1e4 * (1.0 + 0.5 * np.sin(2 * np.pi * t)) * np.exp(rng.normal(0, noise, t.size))
    )
    return out


def test_too_little_history_falls_back_to_the_named_baseline() -> None:
    fc = forecast_peak([100.0, 120.0, 110.0], method="arima")
    assert fc.method == "persistence"
    assert fc.requested == "arima"
    assert fc.fallback_reason is not None and "too little history" in fc.fallback_reason
    assert fc.peak_tps > 0


def test_collection_gaps_are_bridged_and_too_many_gaps_fall_back() -> None:
    y = diurnal(4)
    y[-100:-90] = np.nan  # a short gap: still the model
    fc = forecast_peak(y)
    assert fc.method == "ensemble" and fc.fallback_reason is None
    y[-30:] = np.nan  # most of the recent window missing
    fc = forecast_peak(y)
    assert fc.method == "persistence"
    assert fc.fallback_reason is not None and "gaps" in fc.fallback_reason
    assert math.isfinite(fc.upper_tps)


def test_a_fit_that_raises_never_reaches_the_caller() -> None:
    @dataclass(frozen=True)
    class Broken:
        name: str = "broken"

        def min_points(self, spec: ForecastSpec) -> int:
            return 1

        def fit(self, x: FloatArray, spec: ForecastSpec) -> PeakModel:
            raise np.linalg.LinAlgError("Schur decomposition solver error")

    FORECASTERS["broken"] = Broken
    try:
        fc = forecast_peak(diurnal(3), method="broken", fallback="moving-average")
    finally:
        del FORECASTERS["broken"]
    assert fc.method == "moving-average"
    assert fc.fallback_reason is not None and "LinAlgError" in fc.fallback_reason


def test_no_observations_is_flagged_unreliable_instead_of_guessing() -> None:
    fc = forecast_peak([math.nan] * 50)
    assert not fc.reliable
    assert fc.peak_tps == 0.0


def test_unknown_method_falls_back_and_says_so() -> None:
    fc = forecast_peak(diurnal(3), method="prophet")
    assert fc.method == "persistence"
    assert fc.fallback_reason is not None and "prophet" in fc.fallback_reason


@pytest.mark.slow
@pytest.mark.parametrize("method", sorted(FORECASTERS))
def test_every_method_gives_an_upper_quantile_at_or_above_its_point(method: str) -> None:
    fc = forecast_peak(synthetic_series(5, 600.0, seed=3), method=method)
    assert fc.method == method
    assert 0 < fc.peak_tps <= fc.upper_tps
    assert len(fc.path_tps) == 6


def test_seasonal_model_anticipates_the_morning_ramp_that_persistence_misses() -> None:
    y = diurnal(5, noise=0.02)
    # "now" = just before the steepest rise of the day (sin crosses zero upwards).
    now = 4 * 144
    actual = float(np.max(y[now : now + 6]))
    seasonal = forecast_peak(y[:now], method="arima")
    persistence = forecast_peak(y[:now], method="persistence")
    assert abs(seasonal.peak_tps - actual) < abs(persistence.peak_tps - actual)


def test_lead_and_horizon_select_the_windows_of_the_peak() -> None:
    assert ForecastSpec(lead_seconds=0, horizon_seconds=3600).steps() == (1, 6)
    assert ForecastSpec(lead_seconds=1200, horizon_seconds=3600).steps() == (3, 6)
    assert ForecastSpec(step_seconds=60, lead_seconds=1200, horizon_seconds=3600).steps() == (
        21,
        60,
    )


def test_batch_buffer_is_ten_percent_of_last_hours_batch_load() -> None:
    assert batch_buffer_tps([1000.0] * 6) == pytest.approx(100.0)
    assert batch_buffer_tps([0.0, 2000.0, math.nan]) == pytest.approx(100.0)
    assert batch_buffer_tps([]) == 0.0


@pytest.mark.skipif(not M_SMALL.is_file(), reason="bundled ServeGen aggregate missing")
def test_backtest_on_servegen_beats_persistence_and_covers_most_hours() -> None:
    series = load_servegen_aggregate(M_SMALL, "requests")[: 144 * 6]
    rows = {r.method: r for r in backtest(series, ["ensemble", "persistence"])}
    assert rows["ensemble"].hours > 100
    assert rows["ensemble"].mape < rows["persistence"].mape
    assert rows["ensemble"].coverage >= 0.7


def test_servegen_loader_turns_all_zero_windows_into_gaps(tmp_path: Path) -> None:
    path = tmp_path / "agg.csv"
    path.write_text(
        "window_start_s,total_rate_rps,input_tokens_mean_weighted,output_tokens_mean_weighted\n"
        "0,2.0,100,20\n600,0,100,20\n1200,1.0,,\n"
    )
    tokens = load_servegen_aggregate(path, "tokens")
    assert tokens[0] == 240.0 and math.isnan(tokens[1]) and tokens[2] == 0.0
    assert list(load_servegen_aggregate(path, "requests")[[0, 2]]) == [2.0, 1.0]


@pytest.mark.skipif(not M_SMALL.is_file(), reason="bundled ServeGen aggregate missing")
def test_backtest_cli_prints_one_row_per_method() -> None:
    result = CliRunner().invoke(
        app,
        [
            "forecast",
            "backtest",
            "--trace",
            str(M_SMALL),
            "--method",
            "persistence,moving-average",
            "--signal",
            "requests",
        ],
    )
    assert result.exit_code == 0, result.output
    assert "persistence" in result.output and "moving-average" in result.output
    assert "MAPE" in result.output
