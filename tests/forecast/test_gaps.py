"""Gaps are missing data, never demand: detection, the forecaster's use of
it, the floor, and the backtest's skipping of gap hours."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pytest

from sageserve.forecast import FORECASTERS, ForecastSpec, forecast_peak
from sageserve.forecast.backtest import load_servegen_aggregate, score_hours, summarize
from sageserve.forecast.gap_harness import detect, inject_gaps
from sageserve.forecast.gaps import gap_mask, gap_points, partial_gaps, recent_level, spikes
from sageserve.forecast.types import DropGuard, FloatArray, GapRule, IntArray, PeakModel

from .test_forecast import TRACES, diurnal

LEVEL = 1000.0


def steady(n: int = 40, **points: float) -> FloatArray:
    """A steady 10-minute series at LEVEL with ``p<i>=value`` overrides."""
    out = np.full(n, LEVEL)
    for key, value in points.items():
        out[int(key[1:])] = value
    return out


def where(mask: np.typing.NDArray[np.bool_]) -> list[int]:
    return [int(i) for i in np.flatnonzero(mask)]


# (case, series, trailing, expected gap indices)
DETECTION: list[tuple[str, FloatArray, bool, list[int]]] = [
    ("steady: nothing", steady(), True, []),
    ("one point 20x down", steady(p10=50.0), True, [10]),
    ("an exact zero in a busy series", steady(p10=0.0), True, [10]),
    ("two points down, one of them zero", steady(p20=0.0, p21=30.0), True, [20, 21]),
    ("a run of three at 4 %: a gap", steady(p20=40.0, p21=40.0, p22=40.0), True, [20, 21, 22]),
    ("a point at 30 % of the level: a gap", steady(p10=300.0), True, [10]),
    ("a point at half the level: demand", steady(p10=500.0), True, []),
    ("two separate gaps in one hour", steady(p10=20.0, p14=20.0), True, [10, 14]),
    (
        "a NaN inside the run does not break it",
        steady(p10=20.0, p11=math.nan, p12=20.0),
        True,
        [10, 12],
    ),
    (
        "two hours at a quarter of the level and back: a gap",
        steady(60, **{f"p{i}": 250.0 for i in range(20, 32)}),
        True,
        list(range(20, 32)),
    ),
    (
        "over two hours down and back: a real lull",
        steady(60, **{f"p{i}": 250.0 for i in range(20, 33)}),
        True,
        [],
    ),
    ("trailing point: not come back yet, a gap for the forecaster", steady(p39=20.0), True, [39]),
    ("trailing point: the backtest judges interior points only", steady(p39=20.0), False, []),
    (
        "trailing run of three hours: a real decline",
        steady(60, **{f"p{i}": 20.0 for i in range(42, 60)}),
        True,
        [],
    ),
    ("leading point", steady(p0=20.0), True, [0]),
]


@pytest.mark.parametrize(
    ("case", "series", "trailing", "expected"), DETECTION, ids=[c[0] for c in DETECTION]
)
def test_partial_gaps_table(
    case: str, series: FloatArray, trailing: bool, expected: list[int]
) -> None:
    assert where(partial_gaps(series, 600.0, trailing=trailing)) == expected, case


def test_a_level_that_drops_for_good_is_demand_not_a_gap() -> None:
    series = np.concatenate([np.full(30, LEVEL), np.full(30, LEVEL / 20)])
    assert where(partial_gaps(series)) == []


def test_dips_of_a_sparse_series_are_real() -> None:
    # Minute-level tokens of a few bursty clients: zeros every few points are demand.
    rng = np.random.default_rng(7)
    series = rng.gamma(0.7, 100.0, 600) * (rng.random(600) > 0.15)
    assert partial_gaps(series, 60.0).sum() == 0


def test_a_noisy_level_hides_a_tenfold_dip() -> None:
    # The level itself swings by 10x: a 10x dip is within its noise (the robust-σ test).
    series = np.tile([1500.0, 150.0, 1000.0, 200.0], 10)
    series[21] = 30.0
    assert where(partial_gaps(series)) == []


def test_widths_are_in_seconds_so_every_granularity_means_the_same() -> None:
    assert gap_points(GapRule(), 600.0) == (12, 6)
    assert gap_points(GapRule(), 60.0) == (120, 60)
    minute = np.full(300, LEVEL)
    minute[100:110] = 0.0  # a 10-minute collection gap seen at 1-minute steps
    assert where(partial_gaps(minute, 60.0)) == list(range(100, 110))
    minute = np.concatenate([minute, np.full(200, LEVEL)])
    minute[250:400] = 0.0  # 150 minutes: longer than a gap, a real lull
    assert where(partial_gaps(minute, 60.0)) == list(range(100, 110))


def test_gap_mask_adds_missing_and_negative_points() -> None:
    series = steady(p5=math.nan, p10=-1.0, p20=20.0)
    assert where(gap_mask(series)) == [5, 10, 20]
    assert where(gap_mask(series, rule=GapRule(enabled=False))) == [5, 10]


def test_recent_level_skips_gaps_and_looks_back_past_them() -> None:
    series = np.array([100.0, 200.0, 300.0, 5.0, math.nan])
    mask = gap_mask(series, rule=GapRule(min_context=2))
    assert where(mask) == [3, 4]
    assert recent_level(series, mask, 2) == pytest.approx(250.0)
    assert recent_level(series, np.ones(5, dtype=np.bool_), 2) is None


# (case, series, expected spike indices): hostile or broken readings of the token rate
SPIKES: list[tuple[str, FloatArray, list[int]]] = [
    ("steady: nothing", steady(), []),
    ("a target scraped twice for a point: 2x is demand", steady(p10=2 * LEVEL), []),
    ("a 30x burst: demand", steady(p10=30 * LEVEL), []),
    ("a broken exporter's 1e30", steady(p10=1e30), [10]),
    ("exactly 100x up: absurd", steady(p10=100 * LEVEL), [10]),
    ("two absurd points in a row", steady(p20=1e12, p21=1e15), [20, 21]),
    ("a level that rises 200x for good: demand", np.repeat([LEVEL, 200 * LEVEL], 20), []),
    ("a zero next to it does not hide it", steady(p9=0.0, p10=1e9), [10]),
]


@pytest.mark.parametrize(("case", "series", "expected"), SPIKES, ids=[c[0] for c in SPIKES])
def test_absurd_spikes_table(case: str, series: FloatArray, expected: list[int]) -> None:
    assert where(spikes(series)) == expected, case


def test_the_bursts_of_a_sparse_series_are_real() -> None:
    # Minute-level tokens of a few bursty clients: mostly idle, bursts of 1,000x are demand.
    rng = np.random.default_rng(11)
    series = rng.gamma(0.3, 100.0, 600) * (rng.random(600) > 0.5)
    assert spikes(series, 60.0).sum() == 0
    assert spikes(series, 60.0, GapRule(spike_factor=0)).sum() == 0


def test_not_finite_negative_and_absurd_rates_are_not_demand() -> None:
    """Impossible readings: a Prometheus answer with NaN, +Inf, a negative or an absurd rate
    is ignored and reported (``Forecast.gaps``, ``status.plan.forecasts[].ignoredPoints``),
    never provisioned for."""
    clean = diurnal(6, noise=0.05)
    broken = clean.copy()
    broken[[200, 400, 600, 790]] = [math.nan, math.inf, -5.0, 1e30]
    assert where(gap_mask(broken)) == [200, 400, 600, 790]
    reference, fc = forecast_peak(clean), forecast_peak(broken)
    assert fc.gaps == 4 and fc.fallback_reason is None
    assert fc.upper_tps == pytest.approx(reference.upper_tps, rel=0.03)
    assert math.isfinite(fc.upper_tps)


def gappy(days: float = 6) -> tuple[FloatArray, FloatArray, list[int]]:
    """A diurnal series and a copy with partial gaps (x0.05, x0.03), one at the very end."""
    clean = diurnal(days, noise=0.05)
    series = clean.copy()
    at = [300, 301, 500, 650, 700, 800, 801]
    series[at] *= 0.05
    series[-1] *= 0.03
    return clean, series, [*at, series.size - 1]


def test_partial_gaps_in_a_series_are_detected_and_forecast_around() -> None:
    clean, series, at = gappy()
    assert where(partial_gaps(series)) == at
    assert where(partial_gaps(clean)) == []
    level = float(np.median(clean[-6:]))
    reference = forecast_peak(clean)
    fc = forecast_peak(series)
    assert fc.gaps == len(at)
    assert fc.method == "ensemble" and fc.fallback_reason is None
    # Missing, not a lull: the forecast is the one the clean series gives (within 3 %) ...
    assert fc.upper_tps == pytest.approx(reference.upper_tps, rel=0.03)
    assert fc.peak_tps == pytest.approx(reference.peak_tps, rel=0.03)
    # ... where reading the gaps as demand would provision less than half the recent level.
    blind = forecast_peak(
        series, ForecastSpec(gaps=GapRule(enabled=False), guard=DropGuard(enabled=False))
    )
    assert blind.upper_tps < 0.5 * level
    assert fc.upper_tps >= 0.5 * level


@dataclass(frozen=True)
class Collapse:
    """A model that was right at every past origin and forecasts almost nothing now (so the
    calibration cannot correct it): what a gap read as demand can do, in the extreme."""

    name: str = "collapse"

    def min_points(self, spec: ForecastSpec) -> int:
        return 1

    def fit(self, x: FloatArray, spec: ForecastSpec) -> PeakModel:
        return _Collapsed(x, spec.steps()[1])


@dataclass(frozen=True)
class _Collapsed:
    x: FloatArray
    last: int

    def path(self, origin: int) -> FloatArray:
        out: FloatArray = self.paths(np.array([origin]))[0]
        return out

    def paths(self, origins: IntArray) -> FloatArray:
        idx = np.clip(origins[:, None] + np.arange(self.last)[None, :], 0, self.x.size - 1)
        out: FloatArray = np.where(origins[:, None] >= self.x.size, math.log1p(1.0), self.x[idx])
        return out


@pytest.mark.parametrize(
    ("case", "gap", "floored"),
    [
        ("a partial gap within a day: floored at half the recent level", 0.02, True),
        ("a missing point within a day: floored too", math.nan, True),
        ("no gap: the model's number stands", 1.0, False),
    ],
)
def test_no_forecast_below_half_the_recent_level_because_of_a_gap(
    case: str, gap: float, floored: bool
) -> None:
    series = diurnal(3, noise=0.02)
    series[-40] *= gap
    mask = gap_mask(series)
    level = recent_level(series, mask, 6)
    assert level is not None
    FORECASTERS["collapse"] = Collapse
    try:
        unguarded = ForecastSpec(guard=DropGuard(enabled=False))  # the gap floor alone
        fc = forecast_peak(series, unguarded, method="collapse", quantiles=(0.95,))
    finally:
        del FORECASTERS["collapse"]
    assert fc.method == "collapse", case
    assert fc.floored is floored, case
    if floored:
        assert fc.upper_tps == pytest.approx(0.5 * level)
        assert fc.peak_tps == pytest.approx(0.5 * level)
        assert fc.uppers[0][1] == pytest.approx(0.5 * level)
        assert min(fc.path_tps) == pytest.approx(0.5 * level)
        assert any("gap floor" in note for note in fc.notes)
    else:
        assert fc.upper_tps < 0.5 * level


def test_backtest_does_not_score_an_hour_whose_actual_window_is_a_gap() -> None:
    clean = diurnal(4, noise=0.05)
    series = clean.copy()
    series[3 * 144 + 62] *= 0.05  # inside the actual window of the decision at 3d + 10 h
    series[3 * 144 + 90] = math.nan  # and one inside that of 3d + 15 h
    scores = score_hours(series, "persistence", start_seconds=3 * 86400.0)
    assert [t // 6 for t in scores.skipped] == [3 * 24 + 10, 3 * 24 + 15]
    row = summarize(scores)
    assert (row.hours, row.skipped) == (22, 2)
    full = summarize(score_hours(clean, "persistence", start_seconds=3 * 86400.0))
    assert (full.hours, full.skipped) == (24, 0)


def week(days: int = 7, seed: int = 3) -> FloatArray:
    """A 10-minute series with a deep nightly trough (10 % of the daytime peak, reached
    over hours) and a weekend (days 5 and 6 at 40 % of the weekdays, easing in over six
    hours), with 8 % noise."""
    rng = np.random.default_rng(seed)
    t = np.arange(days * 144) / 144.0
    hour = (t % 1.0) * 24
    daily = 0.1 + 0.9 * np.clip(np.sin(np.pi * (hour - 6) / 16), 0, None) ** 2
    weekend = np.interp(t, [0, 5, 5.25, 7], [1.0, 1.0, 0.4, 0.4])
    out: FloatArray = 1e4 * daily * weekend * np.exp(rng.normal(0, 0.08, t.size))
    return out


def test_a_nightly_trough_and_a_weekend_are_demand_not_gaps() -> None:
    for seed in range(5):
        series = week(seed=seed)
        assert series.min() < 0.05 * series.max()  # the trough is deep
        assert where(gap_mask(series, trailing=False)) == [], seed


def test_the_bundled_traces_troughs_and_weekends_are_not_gaps() -> None:
    for name in ("m-small", "m-large"):
        for signal in ("tokens", "requests"):
            series = load_servegen_aggregate(
                TRACES / f"language_{name}_aggregate_10min.csv", signal
            )
            assert where(partial_gaps(series, trailing=False)) == [], (name, signal)


def test_injected_partial_gaps_are_found_in_series_the_rule_was_not_written_for() -> None:
    """Gaps keeping 0–30 % of the level for 10 minutes to two hours, at random places in
    a synthetic week and in the bundled traces: most are found, few flags are wrong."""
    week_score = detect(week(), GapRule(), seeds=(0, 1, 2))
    assert week_score.recall >= 0.85 and week_score.precision >= 0.95
    trace = load_servegen_aggregate(TRACES / "language_m-large_aggregate_10min.csv")
    trace_score = detect(trace, GapRule(), seeds=(0, 1, 2))
    assert trace_score.recall >= 0.85 and trace_score.precision >= 0.95
    assert trace_score.gaps_found >= 0.85 * trace_score.gaps


def test_gaps_are_injected_where_the_mask_says() -> None:
    series = np.full(500, LEVEL)
    gappy, truth = inject_gaps(series, seed=4, count=5)
    assert 5 <= truth.sum() <= 60
    assert np.all(gappy[truth] <= 0.3 * LEVEL) and np.all(gappy[~truth] == LEVEL)
    assert np.array_equal(inject_gaps(series, seed=4, count=5)[0], gappy)


@pytest.mark.parametrize(
    "series",
    [
        np.concatenate([np.zeros(30), np.full(30, LEVEL)]),  # a model asked for from now on
        np.concatenate([np.zeros(20), [LEVEL, 1.0, LEVEL], np.zeros(20)]),  # one burst
        np.concatenate([np.full(20, LEVEL), np.zeros(40)]),  # a model no longer asked for
        np.zeros(60),
        # busy, a few idle points, one request, idle: the level after the run is zero
        np.concatenate([np.full(20, LEVEL), np.zeros(5), [LEVEL], np.zeros(20)]),
    ],
    ids=["starts-idle", "one-burst-in-idle", "goes-idle", "idle", "busy-then-idle"],
)
def test_an_idle_series_has_no_level_to_fall_from(series: FloatArray) -> None:
    """A pooled model's rates are zero most of the time: zero is demand, never a gap's
    reference level."""
    for trailing in (True, False):
        assert where(partial_gaps(series, 600.0, trailing=trailing)) == []
