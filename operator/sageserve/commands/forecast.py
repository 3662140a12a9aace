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
from sageserve.forecast.backtest import backtest, load_series_csv, load_servegen_aggregate
from sageserve.forecast.gaps import gap_mask
from sageserve.forecast.loto import GOALS as GOALS_LOTO
from sageserve.forecast.loto import HeldOut, leave_one_out
from sageserve.forecast.protocol import (
    CANDIDATES,
    GOALS,
    DayRange,
    ProtocolResult,
    Report,
    run_protocol,
)
from sageserve.forecast.types import FloatArray, ForecastSpec, GapRule

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
        cols = ("method", "hours", "skipped", "MAPE peak", "coverage", "mean over")
        widest = max(len(m) for m in methods)
        for col in (*cols, "fallbacks", "fits/s"):
            left = col == "method"  # never cut a method's name on a narrow terminal
            table.add_column(
                col,
                justify="left" if left else "right",
                no_wrap=True,
                min_width=widest if left else None,
            )
        for r in rows:
            table.add_row(
                r.method,
                str(r.hours),
                str(r.skipped),
                f"{r.mape:.1%}",
                f"{r.coverage:.0%}",
                f"{r.mean_over:.1%}",
                str(r.fallbacks),
                f"{r.fits_per_second:.0f}",
            )
        console.print(table)


def protocol_command(
    traces: list[Path],
    methods: list[str] | None,
    signal: str,
    spec: ForecastSpec,
    choose_days: DayRange,
    report_days: DayRange,
    console: Console,
) -> ProtocolResult:
    """``sageserve forecast backtest --choose-days 1-7 --report-days 8-14``: choose the method,
    the ensemble weights and the quantile on some days, report them on others and on the
    other traces (``forecast.protocol``), and print the tables."""
    series = {_short(t): load_servegen_aggregate(t, signal) for t in traces}
    candidates = tuple(methods) if methods else CANDIDATES
    with console.status("scoring") as status:
        result = run_protocol(
            series,
            spec,
            choose_days,
            report_days,
            candidates,
            progress=lambda what: status.update(f"scoring {escape(what)}"),
        )
    pick, rep = result.choose_days, result.report_days
    what = (
        f"{signal}/s, hourly decisions from h24, peak of [now+{spec.lead_seconds / 60:g} min, "
        f"now+{spec.horizon_seconds / 60:g} min]"
    )
    for name, rows in result.candidates.items():
        table = Table(title=escape(f"{name}: candidates ({what}), median point forecast"))
        for col in (
            "method",
            f"MAPE days {pick[0]}–{pick[1]}",
            f"MAPE days {rep[0]}–{rep[1]}",
            "hours",
            "gaps skipped",
        ):
            left = col == "method"
            table.add_column(
                col,
                justify="left" if left else "right",
                no_wrap=True,
                min_width=max(len(r.method) for r in rows) if left else None,
            )
        for row in rows:
            table.add_row(
                row.method,
                f"{row.choose.mape:.1%}",
                f"{row.report.mape:.1%}",
                f"{row.choose.hours} / {row.report.hours}",
                f"{row.choose.skipped} / {row.report.skipped}",
            )
        console.print(table)
    for name, qrows in result.quantiles.items():
        method = result.within[name][1].choice.method
        table = Table(
            title=escape(
                f"{name}: {method} (the out-of-sample choice) at each quantile — shown, not "
                "chosen from"
            )
        )
        for col in (
            "q",
            f"coverage days {pick[0]}–{pick[1]}",
            f"mean over days {pick[0]}–{pick[1]}",
            f"coverage days {rep[0]}–{rep[1]}",
            f"mean over days {rep[0]}–{rep[1]}",
        ):
            table.add_column(col, justify="right", no_wrap=True)
        for q in qrows:
            table.add_row(
                f"{q.quantile:g}",
                f"{q.choose.coverage:.0%}",
                f"{q.choose.mean_over:.1%}",
                f"{q.report.coverage:.0%}",
                f"{q.report.mean_over:.1%}",
            )
        console.print(table)
    within = [r for rows in result.within.values() for r in rows]
    console.print(_report_table(f"Within each trace, reported on days {rep[0]}–{rep[1]}", within))
    if result.cross:
        console.print(
            _report_table(
                f"Across traces: chosen on one trace's days {pick[0]}–{pick[1]}, reported on "
                f"another's days {rep[0]}–{rep[1]}",
                result.cross,
            )
        )
    goals = GOALS
    console.print(
        f"Rule (fixed in advance): lowest MAPE on the chosen-on days, then the smallest "
        f"quantile whose coverage there reaches {goals.coverage:.0%}. Goals on the reported "
        f"days: MAPE ≥ {goals.mape_gain:.0%} below persistence, coverage ≥ "
        f"{goals.coverage:.0%}, mean over-forecast ≤ {goals.mean_over:.0%}.",
        highlight=False,
    )
    for note in result.notes:
        console.print(f"note: {escape(note)}", highlight=False)
    return result


def _short(trace: Path) -> str:
    """``language_m-small_aggregate_10min.csv`` → ``m-small``."""
    name = trace.name.removesuffix("_aggregate_10min.csv")
    return name.split("_", 1)[1] if "_" in name else name


def _report_table(title: str, reports: list[Report]) -> Table:
    table = Table(title=escape(title))
    widest = max((len(r.choice.method) for r in reports), default=6)
    for col, left, wrap in (
        ("reading", True, False),
        ("chosen on", True, True),
        ("reported on", True, True),
        ("method", True, False),
        ("q", False, False),
        ("MAPE", False, False),
        ("persistence", False, False),
        ("vs persistence", False, False),
        ("coverage", False, False),
        ("mean over", False, False),
        ("hours (gaps skipped)", False, False),
        ("goals missed", True, True),
    ):
        table.add_column(
            col,
            justify="left" if left else "right",
            no_wrap=not wrap,
            min_width=widest if col == "method" else None,
        )
    for r in reports:
        missed = [k for k, ok in r.met().items() if not ok]
        table.add_row(
            r.protocol,
            escape(r.choice.on),
            escape(r.on),
            escape(r.choice.method),
            f"{r.choice.quantile:g}",
            f"{r.row.mape:.1%}",
            f"{r.baseline.mape:.1%}",
            f"{-r.gain:+.0%}",
            f"{r.row.coverage:.0%}",
            f"{r.row.mean_over:.1%}",
            f"{r.row.hours} ({r.row.skipped})",
            ", ".join(missed) or "none",
        )
    return table


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


def to_step(
    values: FloatArray, step_seconds: float, target_seconds: float, rule: GapRule | None = None
) -> FloatArray:
    """``values`` at ``step_seconds`` as means over ``target_seconds`` windows, counted back
    from the last row. Gaps are found at the series' own step first (``forecast.gaps`` with
    ``rule``) and left out of the means, so a window that lost some of its rows is the mean
    of the rest; a window with no observation stays a gap."""
    k = round(target_seconds / step_seconds)
    if step_seconds <= 0 or k < 1 or abs(k * step_seconds - target_seconds) > 1e-6:
        raise ValueError(
            f"--step-seconds {step_seconds:g}: {target_seconds:g} must be a whole multiple of it"
        )
    if k == 1:
        return values
    values = np.where(gap_mask(values, step_seconds, rule, trailing=False), np.nan, values)
    whole = values[values.size % k :].reshape(-1, k)
    ok = np.isfinite(whole)
    sums = np.where(ok, whole, 0.0).sum(axis=1)
    counts = ok.sum(axis=1)
    out: FloatArray = np.where(counts > 0, sums / np.maximum(counts, 1), np.nan)
    return out


#: The bundled 10-minute traces, relative to the repository root.
BUNDLED = Path("data/traces/servegen-bailian")


def bundled_traces(root: Path = BUNDLED) -> list[Path]:
    """The bundled ServeGen aggregates; ValueError naming ``--trace`` when absent."""
    found = sorted(root.glob("*_aggregate_10min.csv"))
    if not found:
        raise ValueError(
            f"no bundled traces under {root} (run from the repository root, or pass --trace)"
        )
    return found


def loto_command(
    traces: list[Path],
    csvs: list[Path],
    column: str | None,
    step_seconds: float,
    signal: str,
    spec: ForecastSpec,
    inject: int,
    console: Console,
) -> list[HeldOut]:
    """``sageserve forecast backtest --leave-one-out``: every tunable chosen on the other
    traces, reported on the held-out one (``forecast.loto``); ``--csv`` holds a user's series
    out from all the bundled ones."""
    series = {_short(t): load_servegen_aggregate(t, signal) for t in traces or bundled_traces()}
    external = {
        c.name: to_step(
            load_series_csv(c, column, signal), step_seconds, spec.step_seconds, spec.gaps
        )
        for c in csvs
    }
    with console.status("scoring") as status:
        rows = leave_one_out(
            series,
            spec,
            external,
            inject,
            progress=lambda what: status.update(f"scoring {escape(what)}"),
        )
    table = Table(
        title=escape(
            f"Leave one trace out ({signal}/s, hourly decisions from h24, peak of "
            f"[now+{spec.lead_seconds / 60:g} min, now+{spec.horizon_seconds / 60:g} min], "
            f"q{spec.quantile:g} asked)"
        )
    )
    for col in (
        "held out",
        "chosen on",
        "detector",
        "method",
        "conformal",
        "MAPE",
        "persistence",
        "vs persistence",
        "coverage",
        "below half",
        "mean over",
        "hours (gaps skipped)",
        "injected gaps found",
        "goals missed",
    ):
        left = col in ("held out", "chosen on", "detector", "method", "conformal", "goals missed")
        table.add_column(col, justify="left" if left else "right", overflow="fold")
    for r in rows:
        d = r.detection
        table.add_row(
            escape(r.trace),
            escape(", ".join(r.chosen_on)),
            f"{r.rule.drop_factor:g}x, {r.rule.min_sigmas:g}σ",
            escape(r.method),
            f"{r.conformal.window_hours} h, γ {r.conformal.gamma:g}",
            f"{r.row.mape:.1%}",
            f"{r.baseline.mape:.1%}",
            f"{-r.gain:+.0%}",
            f"{r.row.coverage:.1%}",
            str(r.row.below_half),
            f"{r.row.mean_over:.1%}",
            f"{r.row.hours} ({r.row.skipped})",
            f"P {d.precision:.0%} R {d.recall:.0%}",
            ", ".join(r.missed()) or "none",
        )
    console.print(table)
    for r in rows:
        if r.unguarded is not None and r.unguarded_baseline is not None:
            console.print(
                f"{escape(r.trace)} with detection off: {escape(r.method)} MAPE "
                f"{r.unguarded.mape:.1%}, persistence {r.unguarded_baseline.mape:.1%}, "
                f"coverage {r.unguarded.coverage:.1%}, below half {r.unguarded.below_half}, "
                f"hours {r.unguarded.hours} ({r.unguarded.skipped} skipped)",
                highlight=False,
            )
    goals = GOALS_LOTO
    console.print(
        f"Goals on the held-out trace: MAPE ≥ {goals.mape_gain:.0%} below persistence, "
        f"coverage within {goals.coverage_points:.0%} of the quantile asked, "
        f"{goals.below_half} hours provisioned below half the actual peak. Injected gaps found: "
        "the chosen detector on partial gaps injected into the held-out trace (5 seeds).",
        highlight=False,
    )
    return rows
