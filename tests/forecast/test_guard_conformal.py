"""The drop guard and the conformal quantile: what is provisioned after a drop, and how
often the provisioned quantile covers the next hour's peak."""

from __future__ import annotations

import math

import numpy as np
import pytest

from sageserve.forecast import FORECASTERS, ForecastSpec, forecast_peak
from sageserve.forecast.api import upper_at
from sageserve.forecast.conformal import conformal_offset, conformal_quantile
from sageserve.forecast.guard import drop_floor
from sageserve.forecast.types import Conformal, DropGuard, FloatArray

from .test_forecast import diurnal
from .test_gaps import Collapse

H = 6  # 10-minute points an hour
GUARD = DropGuard()  # half the peak of the last 3 h, confirmed after 30 minutes


def hours(*levels: float) -> FloatArray:
    """A 10-minute series holding each level for an hour."""
    return np.repeat(np.asarray(levels, dtype=np.float64), H)


# (case, series, expected floor)
FLOORS: list[tuple[str, FloatArray, float]] = [
    ("steady: half the level", hours(100, 100, 100), 50.0),
    (
        "a peak 20 minutes ago counts",
        np.concatenate([hours(100, 100), [400.0, 400.0, 100.0, 100.0]]),
        200.0,
    ),
    ("a peak, then an hour at a quarter of it: confirmed", hours(100, 400, 100), 50.0),
    ("a peak four hours ago is out of reach", hours(400, 100, 100, 100), 50.0),
    (
        "a dip for 20 minutes: not confirmed",
        np.concatenate([hours(100, 100), [10.0, 10.0]]),
        50.0,
    ),
    (
        "30 minutes below the floor: confirmed, the floor follows the new level",
        np.concatenate([hours(100, 100), [10.0, 12.0, 10.0]]),
        6.0,
    ),
    ("no observation", np.zeros(0), 0.0),
]


@pytest.mark.parametrize(("case", "series", "floor"), FLOORS, ids=[c[0] for c in FLOORS])
def test_drop_floor_table(case: str, series: FloatArray, floor: float) -> None:
    gaps = np.zeros(series.size, dtype=np.bool_)
    assert drop_floor(series, gaps, 600.0, GUARD) == pytest.approx(floor), case


def test_a_drop_seen_only_through_gaps_is_not_confirmed() -> None:
    series = np.concatenate([hours(100, 100), [10.0, 10.0, 10.0]])
    gaps = np.zeros(series.size, dtype=np.bool_)
    gaps[-2] = True  # one of the three low points is a detected gap: not an observation
    assert drop_floor(series, gaps, 600.0, GUARD) == pytest.approx(50.0)
    gaps[: 2 * H] = True  # and a peak inside a gap is not a peak
    assert drop_floor(series, gaps, 600.0, GUARD) == pytest.approx(5.0)


def test_the_guard_reads_seconds_so_one_minute_steps_mean_the_same() -> None:
    minute = np.concatenate([np.full(120, 100.0), np.full(20, 10.0)])
    gaps = np.zeros(minute.size, dtype=np.bool_)
    assert drop_floor(minute, gaps, 60.0, GUARD) == pytest.approx(50.0)  # 20 min: not yet
    minute = np.concatenate([minute, np.full(10, 10.0)])  # 30 min: confirmed
    gaps = np.zeros(minute.size, dtype=np.bool_)
    assert drop_floor(minute, gaps, 60.0, GUARD) == pytest.approx(5.0)


def test_bad_guard_settings_name_the_field() -> None:
    with pytest.raises(ValueError, match=r"guard\.fraction"):
        DropGuard(fraction=1.5)
    with pytest.raises(ValueError, match=r"guard\.confirm_seconds"):
        DropGuard(confirm_seconds=4 * 3600.0)
    with pytest.raises(ValueError, match=r"conformal\.window_hours"):
        Conformal(window_hours=0)


def test_a_collapsing_forecast_is_not_provisioned_below_half_the_last_hours() -> None:
    """The plan provisions no hour below half of what the last three hours peaked at, even
    when the model forecasts almost nothing, until the drop is seen for 30 minutes."""
    series = diurnal(3, noise=0.02)
    recent_peak = float(series[-3 * H :].max())
    FORECASTERS["collapse"] = Collapse
    try:
        fc = forecast_peak(series, method="collapse", quantiles=(0.95,))
        off = forecast_peak(series, ForecastSpec(guard=DropGuard(enabled=False)), method="collapse")
        dropped = np.concatenate([series, np.full(3, 0.01 * recent_peak)])
        confirmed = forecast_peak(dropped, method="collapse")
    finally:
        del FORECASTERS["collapse"]
    assert off.upper_tps < 0.01 * recent_peak
    assert fc.upper_tps == pytest.approx(0.5 * recent_peak)
    assert fc.uppers[0][1] == pytest.approx(0.5 * recent_peak)
    assert fc.peak_tps < 0.01 * recent_peak  # the point forecast is the model's own
    assert fc.floored and any("drop guard" in note for note in fc.notes)
    assert confirmed.upper_tps < 0.01 * recent_peak  # a confirmed drop is followed


def test_conformal_quantile_is_the_finite_sample_rank() -> None:
    window = np.arange(1.0, 11.0)  # 1..10
    assert conformal_quantile(window, 0.5) == 6.0  # ⌈11 × 0.5⌉ = 6th
    assert conformal_quantile(window, 0.85) == 10.0  # ⌈9.35⌉ = 10th
    assert conformal_quantile(window, 0.99) == 10.0  # past n: the largest
    assert conformal_quantile(window, -0.2) == 1.0
    assert math.isnan(conformal_quantile(np.array([math.nan]), 0.5))


def test_adaptive_level_rises_after_a_run_of_misses() -> None:
    rng = np.random.default_rng(1)
    calm = rng.normal(0.0, 0.05, 150)
    stormy = np.concatenate([calm, rng.normal(0.0, 0.25, 30)])
    split = Conformal(window_hours=72, gamma=0.0)
    adaptive = Conformal(window_hours=72, gamma=0.05)
    assert conformal_offset(stormy, 0.85, adaptive) > conformal_offset(stormy, 0.85, split)
    assert conformal_offset(calm[:5], 0.85, adaptive) is None  # too few errors
    gaps = np.concatenate([calm, [math.nan] * 10])
    assert conformal_offset(gaps, 0.85, split) == conformal_offset(calm, 0.85, split)


def coverage(series: FloatArray, spec: ForecastSpec, start: int) -> float:
    hits = []
    for t in range(start, series.size - H, H):
        fc = forecast_peak(series[:t], spec, method="arima")
        hits.append(fc.upper_tps >= series[t : t + H].max())
    return float(np.mean(hits))


@pytest.mark.slow
def test_coverage_holds_when_the_noise_doubles() -> None:
    """Five calm days, then three twice as noisy: the week-long quantile keeps the calm
    days' width and misses; the rolling conformal one follows the change."""
    calm = diurnal(5, seed=3, noise=0.05)
    noisy = diurnal(3, seed=4, noise=0.10)
    series = np.concatenate([calm, noisy])
    start = calm.size + 24 * H  # the last two noisy days
    week = ForecastSpec(conformal=Conformal(enabled=False))
    rolling = ForecastSpec(conformal=Conformal(window_hours=24, gamma=0.02))
    assert coverage(series, rolling, start) >= 0.8
    assert coverage(series, rolling, start) > coverage(series, week, start)


def test_upper_at_replays_what_forecast_peak_provisions() -> None:
    series = diurnal(8, seed=5, noise=0.08)
    for rule in (Conformal(window_hours=24), Conformal(window_hours=168, gamma=0.0)):
        fc = forecast_peak(series, ForecastSpec(conformal=rule), quantiles=(0.9,))
        base = forecast_peak(series)
        assert upper_at(base, 0.85, rule) == pytest.approx(fc.upper_tps, rel=1e-9)
        assert upper_at(base, 0.9, rule) == pytest.approx(fc.uppers[0][1], rel=1e-9)
