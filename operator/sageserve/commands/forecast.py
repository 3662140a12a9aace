"""Bodies of ``sageserve forecast backtest`` and ``sageserve bench forecast`` (kept out of
cli.py so the CLI module stays a thin, fast-importing shell)."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from sageserve.forecast.api import forecast_peak
from sageserve.forecast.backtest import backtest, load_servegen_aggregate
from sageserve.forecast.types import FloatArray, ForecastSpec

# arima-classic (plain ARIMA(3,1,2), SageServe §6.3) takes ~0.5 s a fit: add it with --method.
DEFAULT_METHODS = [
    "ensemble",
    "arima",
    "peak-regression",
    "persistence",
    "seasonal-naive",
    "moving-average",
]


def backtest_command(
    traces: list[Path],
    methods: list[str],
    signal: str,
    spec: ForecastSpec,
    start_hours: float,
    console: Console,
) -> None:
    for trace in traces:
        series = load_servegen_aggregate(trace, signal)
        rows = backtest(series, methods, spec, start_seconds=start_hours * 3600.0)
        table = Table(
            title=escape(
                f"{trace.name} ({signal}/s, decision every hour from h{start_hours:g}, "
                f"peak of [now+{spec.lead_seconds / 60:g} min, "
                f"now+{spec.horizon_seconds / 60:g} min], "
                f"provisioned = q{spec.quantile:g})"
            )
        )
        for col in ("method", "hours", "MAPE peak", "coverage", "mean over", "fallbacks", "fits/s"):
            table.add_column(col, justify="left" if col == "method" else "right", no_wrap=True)
        for r in rows:
            table.add_row(
                r.method,
                str(r.hours),
                f"{r.mape:.1%}",
                f"{r.coverage:.0%}",
                f"{r.mean_over:.1%}",
                str(r.fallbacks),
                f"{r.fits_per_second:.0f}",
            )
        console.print(table)


def synthetic_series(days: int, step_seconds: float, seed: int) -> FloatArray:
    """A diurnal, bursty tokens/s series (for benchmarks without trace data)."""
    rng = np.random.default_rng(seed)
    n = int(days * 86400 / step_seconds)
    t = np.arange(n) * step_seconds / 86400.0
    level = 5e4 * rng.uniform(0.5, 2.0)
    diurnal = 1.0 + 0.4 * np.sin(2 * np.pi * (t + rng.uniform()))
    noise = np.exp(np.cumsum(rng.normal(0, 0.02, n)) * 0.3 + rng.normal(0, 0.08, n))
    bursts = 1.0 + (rng.random(n) < 0.01) * rng.uniform(0.5, 2.0, n)
    out: FloatArray = level * diurnal * noise * bursts
    return out


def bench_forecast_command(series: int, methods: list[str], console: Console) -> None:
    """Fit ``series`` different 14-day series per method, single-threaded, and print fits/s
    (a fit = one full ``forecast_peak`` call: fit, calibration and fallback checks)."""
    spec = ForecastSpec()
    data = [synthetic_series(14, spec.step_seconds, seed) for seed in range(series)]
    table = Table(title=f"forecast_peak on {series} synthetic 14-day 10-min series, 1 thread")
    for col in ("method", "fits", "seconds", "fits/s", "ms/fit", "fallbacks"):
        table.add_column(col, justify="left" if col == "method" else "right", no_wrap=True)
    for method in methods:
        forecast_peak(data[0], spec, method=method)  # imports and caches are not fits
        start = time.perf_counter()
        fallbacks = sum(forecast_peak(y, spec, method=method).method != method for y in data)
        seconds = time.perf_counter() - start
        table.add_row(
            method,
            str(series),
            f"{seconds:.2f}",
            f"{series / seconds:.0f}",
            f"{1000 * seconds / series:.1f}",
            str(fallbacks),
        )
    console.print(table)
