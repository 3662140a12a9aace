"""Rolling-origin backtest of forecasters on a recorded series.

Protocol: a decision every ``every_seconds`` (hourly, as in SageServe §6.3) from
``start_seconds`` (day 2); each method sees only the history before the decision and
forecasts the peak of the next horizon. Scored per decision hour whose actual window has data:
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
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from sageserve.forecast.api import forecast_peak
from sageserve.forecast.types import FloatArray, ForecastSpec


@dataclass(frozen=True)
class BacktestRow:
    method: str
    hours: int
    mape: float
    coverage: float
    mean_over: float
    fallbacks: int
    fits_per_second: float


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


def _num(text: str | None) -> float:
    try:
        value = float(text) if text not in (None, "") else 0.0
    except ValueError:
        return 0.0
    return value if math.isfinite(value) else 0.0


def backtest(
    series: FloatArray,
    methods: list[str],
    spec: ForecastSpec | None = None,
    start_seconds: float = 86400.0,
    every_seconds: float = 3600.0,
) -> list[BacktestRow]:
    spec = spec or ForecastSpec()
    step = spec.step_seconds
    first, last = spec.steps()
    origins = range(int(start_seconds // step), series.size - last + 1, int(every_seconds // step))
    rows: list[BacktestRow] = []
    for method in methods:
        ape: list[float] = []
        covered: list[bool] = []
        over: list[float] = []
        fallbacks = 0
        fit_time = 0.0
        for t in origins:
            window = series[t + first - 1 : t + last]
            if not np.isfinite(window).any():
                continue
            actual = float(np.nanmax(window))
            if actual <= 0:
                continue
            t0 = time.perf_counter()
            fc = forecast_peak(series[:t], spec, method=method)
            fit_time += time.perf_counter() - t0
            fallbacks += fc.method != method
            ape.append(abs(fc.peak_tps - actual) / actual)
            covered.append(fc.upper_tps >= actual)
            over.append(max(0.0, fc.upper_tps - actual) / actual)
        hours = len(ape)
        rows.append(
            BacktestRow(
                method=method,
                hours=hours,
                mape=float(np.mean(ape)) if ape else math.nan,
                coverage=float(np.mean(covered)) if covered else math.nan,
                mean_over=float(np.mean(over)) if over else math.nan,
                fallbacks=fallbacks,
                fits_per_second=hours / fit_time if fit_time > 0 else math.inf,
            )
        )
    return rows
