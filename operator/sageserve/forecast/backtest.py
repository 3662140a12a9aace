"""Rolling-origin backtest of forecasters on a recorded series.

Protocol: a decision every ``every_seconds`` (hourly, as in SageServe §6.3) from
``start_seconds`` (day 2); each method sees only the history before the decision and
forecasts the peak of the next horizon. Scored per decision hour whose actual window holds
no gap (NaN or a partial gap, ``forecast.gaps``; the skipped hours are counted):
- MAPE of the point peak forecast,
- coverage: share of hours where the provisioned (upper) forecast ≥ the actual peak,
- mean over-forecast: mean over hours of max(0, provisioned − actual) / actual, i.e. the
  capacity provisioned beyond the actual peak, as a share of it,
- fallbacks and fit throughput.
"""

from __future__ import annotations

import csv
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from sageserve.forecast.api import forecast_peak
from sageserve.forecast.gaps import gap_mask
from sageserve.forecast.types import FloatArray, Forecast, ForecastSpec, GapRule


@dataclass(frozen=True)
class BacktestRow:
    method: str
    hours: int
    mape: float
    coverage: float
    mean_over: float
    fallbacks: int
    fits_per_second: float
    skipped: int = 0
    """Decision hours not scored: their actual window holds a gap (``forecast.gaps``)."""
    quantile: float = math.nan
    """The provisioned quantile that ``coverage`` and ``mean_over`` are measured at."""


@dataclass(frozen=True)
class HourScore:
    """One scored decision: what happened and what was forecast."""

    origin: int
    """Index of the first window after the decision (the decision is at origin × step)."""
    actual: float
    peak: float
    uppers: tuple[float, ...]
    """Provisioned forecast at each quantile of ``Scores.quantiles``."""
    fallback: bool
    seconds: float
    forecast: Forecast | None = None
    """The whole forecast: what ``forecast.api.upper_at`` replays other conformal rules on."""


@dataclass(frozen=True)
class Scores:
    """Every decision of one method on one series, before any choice of hours or quantile:
    the out-of-sample protocol (``forecast.protocol``) selects on some hours, reports on
    others, from one run."""

    method: str
    quantiles: tuple[float, ...]
    hours: tuple[HourScore, ...]
    skipped: tuple[int, ...]
    """Origins whose actual window holds a gap: never scored."""


def load_servegen_aggregate(path: str | Path, signal: str = "tokens") -> FloatArray:
    """A ServeGen ``*_aggregate_10min.csv`` as a 10-minute series.

    ``signal="tokens"``: tokens/s = request rate × (mean input + mean output tokens) of the
    enclosing 6-h window; ``"requests"``: requests/s. Windows where every client is 0 are
    collection gaps in ServeGen (see data/traces/servegen/README.md) and become NaN.
    """
    if signal not in ("tokens", "requests"):
        raise ValueError(f"signal must be tokens or requests, got {signal!r}")
    values: list[float] = []
    with open(path, newline="") as handle:
        for row in csv.DictReader(handle):
            rate = float(row["total_rate_rps"])
            if rate <= 0:
                values.append(math.nan)
                continue
            if signal == "requests":
                values.append(rate)
                continue
            tin = _num(row.get("input_tokens_mean_weighted"))
            tout = _num(row.get("output_tokens_mean_weighted"))
            values.append(rate * (tin + tout))
    return np.asarray(values, dtype=np.float64)


def load_series_csv(
    path: str | Path, column: str | None = None, signal: str = "tokens"
) -> FloatArray:
    """A user's series: one row per step, oldest first, with a header. ``column`` names the
    value column (default: the only column, else the last one); empty or non-numeric cells
    and negative values are gaps (NaN). A ServeGen ``*_aggregate_10min.csv`` is read as
    ``load_servegen_aggregate`` reads it (``signal``)."""
    with open(path, newline="") as handle:
        reader = csv.DictReader(handle)
        fields = list(reader.fieldnames or [])
        if "total_rate_rps" in fields and column is None:
            return load_servegen_aggregate(path, signal)
        if not fields:
            raise ValueError(f"{path}: no header row; the first row must name the columns")
        name = column if column is not None else fields[-1]
        if name not in fields:
            raise ValueError(
                f"{path}: no column {name!r}; --csv-column must be one of {', '.join(fields)}"
            )
        values = [_cell(row.get(name)) for row in reader]
    if not values:
        raise ValueError(f"{path}: no rows under the header")
    return np.asarray(values, dtype=np.float64)


def _cell(text: str | None) -> float:
    try:
        value = float(text) if text not in (None, "") else math.nan
    except ValueError:
        return math.nan
    return value if math.isfinite(value) and value >= 0 else math.nan


def _num(text: str | None) -> float:
    try:
        value = float(text) if text not in (None, "") else 0.0
    except ValueError:
        return 0.0
    return value if math.isfinite(value) else 0.0


def score_hours(
    series: FloatArray,
    method: str,
    spec: ForecastSpec | None = None,
    quantiles: Sequence[float] = (),
    start_seconds: float = 86400.0,
    every_seconds: float = 3600.0,
    gap_rule: GapRule | None = None,
) -> Scores:
    """Rolling-origin forecasts of ``method`` on ``series``, one per decision (see the module).

    The forecaster sees only ``series[:origin]`` (gaps and all: it detects them itself, as in
    the operator). Scoring sees the whole series, so the gaps of the actual window are judged
    with both sides known; a decision whose actual window holds one is skipped, not scored:
    a gap is missing data, and its max understates the peak.
    """
    spec = spec or ForecastSpec()
    grid = tuple(quantiles) or (spec.quantile,)
    step = spec.step_seconds
    first, last = spec.steps()
    mask = gap_mask(series, step, gap_rule or spec.gaps, trailing=False)
    origins = range(int(start_seconds // step), series.size - last + 1, int(every_seconds // step))
    hours: list[HourScore] = []
    skipped: list[int] = []
    for t in origins:
        window = slice(t + first - 1, t + last)
        if mask[window].any():
            skipped.append(t)
            continue
        actual = float(np.max(series[window]))
        if actual <= 0:
            continue  # an observed, real zero peak: no relative error to score
        t0 = time.perf_counter()
        fc = forecast_peak(series[:t], spec, method=method, quantiles=grid)
        seconds = time.perf_counter() - t0
        hours.append(
            HourScore(
                origin=t,
                actual=actual,
                peak=fc.peak_tps,
                uppers=tuple(u for _, u in fc.uppers),
                fallback=fc.method != method,
                seconds=seconds,
                forecast=fc,
            )
        )
    return Scores(method, grid, tuple(hours), tuple(skipped))


def summarize(
    scores: Scores, quantile: float | None = None, origins: range | None = None
) -> BacktestRow:
    """The scores of the decisions in ``origins`` (all when None) at ``quantile`` (the first
    of the grid when None): MAPE, coverage, mean over-forecast, skipped gap hours."""
    k = scores.quantiles.index(quantile) if quantile is not None else 0
    hours = [h for h in scores.hours if origins is None or h.origin in origins]
    skipped = sum(1 for t in scores.skipped if origins is None or t in origins)
    actual = np.array([h.actual for h in hours])
    peak = np.array([h.peak for h in hours])
    upper = np.array([h.uppers[k] for h in hours])
    fit_time = sum(h.seconds for h in hours)
    n = len(hours)
    return BacktestRow(
        method=scores.method,
        hours=n,
        mape=float(np.mean(np.abs(peak - actual) / actual)) if n else math.nan,
        coverage=float(np.mean(upper >= actual)) if n else math.nan,
        mean_over=float(np.mean(np.maximum(0.0, upper - actual) / actual)) if n else math.nan,
        fallbacks=sum(h.fallback for h in hours),
        fits_per_second=n / fit_time if fit_time > 0 else math.inf,
        skipped=skipped,
        quantile=scores.quantiles[k],
    )


def backtest(
    series: FloatArray,
    methods: list[str],
    spec: ForecastSpec | None = None,
    start_seconds: float = 86400.0,
    every_seconds: float = 3600.0,
) -> list[BacktestRow]:
    """One row per method over every decision from ``start_seconds``, at ``spec.quantile``."""
    spec = spec or ForecastSpec()
    return [
        summarize(score_hours(series, m, spec, (), start_seconds, every_seconds)) for m in methods
    ]
