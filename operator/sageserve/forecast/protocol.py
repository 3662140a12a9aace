"""Out-of-sample scoring of the forecaster: choose on some days, report on others,
so that no figure is tuned on the days it is reported on.

SageServe's load predictor (SageServe §6.3) is judged by how well the next hour's peak is
forecast. A forecaster whose method, ensemble weights and provisioned quantile were picked on
the days it is then scored on looks better than it will on the next week. This protocol
cannot flatter:

1. Every candidate (``CANDIDATES``: the baselines, both components and ensemble weights) is
   run once per series with rolling origins (``backtest.score_hours``), the upper forecast at
   every quantile of ``QUANTILES`` from the same fit.
2. **Choose** on the choose days only, by a rule fixed in advance: the candidate with the
   lowest MAPE of the next-hour peak; then the smallest quantile whose coverage reaches the
   target (85 %), or the largest when none does.
3. **Report** that choice on the report days, beside persistence on the same hours; the
   goals (``GOALS``) are checked there.

Three readings per series: *in-sample* (chosen on the report days themselves: the flattering
number, for comparison), *out-of-sample* (chosen on the choose days), the *shipped default*
(``ensemble`` at q0.85, chosen on all 14 days of these traces before this protocol existed);
and *cross-trace*: chosen on one series' choose days, reported on another's report days.
Decisions whose actual window holds a gap are never scored (``forecast.gaps``).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from sageserve.forecast.backtest import BacktestRow, Scores, score_hours, summarize
from sageserve.forecast.methods import DAY_SECONDS
from sageserve.forecast.types import FloatArray, ForecastSpec

#: Method and weight candidates (``ensemble[a:b]`` = arima : peak-regression weights).
CANDIDATES: tuple[str, ...] = (
    "persistence",
    "moving-average",
    "seasonal-naive",
    "arima",
    "peak-regression",
    "ensemble[3:1]",
    "ensemble[2:1]",
    "ensemble[1:1]",
    "ensemble[1:2]",
    "ensemble[1:3]",
)
#: Provisioned quantiles the choice picks from.
QUANTILES: tuple[float, ...] = (0.7, 0.75, 0.8, 0.85, 0.9, 0.95)
#: What the shipped defaults are (``forecast_peak``'s method, ``ForecastSpec.quantile``).
SHIPPED: tuple[str, float] = ("ensemble", 0.85)
BASELINE = "persistence"


@dataclass(frozen=True)
class Goals:
    """The forecast's goals on the reported days: MAPE below persistence's, coverage of the
    upper quantile, mean over-provisioning."""

    mape_gain: float = 0.15
    """MAPE of the next-hour peak at least this much (relative) below persistence's."""
    coverage: float = 0.85
    mean_over: float = 0.20


GOALS = Goals()

DayRange = tuple[int, int]
"""First and last day, 1-based and inclusive (day 1 = the series' first 24 hours)."""


def parse_days(text: str) -> DayRange:
    """``"1-7"`` → (1, 7); ``"8"`` → (8, 8). ValueError says what is accepted."""
    match = re.fullmatch(r"\s*(\d+)\s*(?:[-–]\s*(\d+))?\s*", text)
    if match is None:
        raise ValueError(f"days must look like 1-7 or 8, got {text!r}")
    lo = int(match.group(1))
    hi = int(match.group(2) or lo)
    if lo < 1 or hi < lo:
        raise ValueError(f"days {text!r}: the first day is 1 and a range runs forwards")
    return lo, hi


def series_days(size: int, spec: ForecastSpec) -> int:
    """Whole days a series of ``size`` windows spans."""
    return int(size * spec.step_seconds // DAY_SECONDS)


def day_origins(days: DayRange, spec: ForecastSpec) -> range:
    """Decision origins whose whole actual window [now + lead, now + horizon] lies in
    ``days``: no chosen-on decision looks at a reported day, and the reverse."""
    first, last = spec.steps()
    per_day = DAY_SECONDS / spec.step_seconds
    lo = math.ceil((days[0] - 1) * per_day) - (first - 1)
    hi = math.floor(days[1] * per_day) - last
    return range(max(lo, 0), max(hi + 1, 0))


def label(name: str, days: DayRange) -> str:
    span = f"day {days[0]}" if days[0] == days[1] else f"days {days[0]}–{days[1]}"
    return f"{name} {span}"


@dataclass(frozen=True)
class Choice:
    """What the rule chose on the choose hours, and how it scored there."""

    method: str
    quantile: float
    on: str
    row: BacktestRow


@dataclass(frozen=True)
class Report:
    """A choice scored on the report hours, beside persistence on the same hours."""

    protocol: str
    choice: Choice
    on: str
    row: BacktestRow
    baseline: BacktestRow

    @property
    def gain(self) -> float:
        """Relative MAPE reduction against persistence (0.15 = 15 % below it)."""
        if not (self.baseline.mape > 0):
            return math.nan
        return 1.0 - self.row.mape / self.baseline.mape

    def met(self, goals: Goals = GOALS) -> dict[str, bool]:
        return {
            "MAPE vs persistence": self.gain >= goals.mape_gain,
            "coverage": self.row.coverage >= goals.coverage,
            "mean over": self.row.mean_over <= goals.mean_over,
        }


@dataclass(frozen=True)
class CandidateRow:
    """One candidate's MAPE on the choose and the report hours of one series."""

    method: str
    choose: BacktestRow
    report: BacktestRow


@dataclass(frozen=True)
class QuantileRow:
    """The out-of-sample method at one quantile, on the choose and the report hours: shown,
    never chosen from (how far calibration drifts between the two)."""

    quantile: float
    choose: BacktestRow
    report: BacktestRow


@dataclass(frozen=True)
class ProtocolResult:
    choose_days: DayRange
    report_days: DayRange
    within: dict[str, list[Report]]
    """Per series: in-sample, out-of-sample, shipped default."""
    cross: list[Report]
    candidates: dict[str, list[CandidateRow]]
    quantiles: dict[str, list[QuantileRow]]
    """Per series: the out-of-sample choice's method at every quantile of the grid."""
    notes: list[str]


def choose(
    scores: Mapping[str, Scores], origins: range, on: str, target: float = GOALS.coverage
) -> Choice:
    """The rule, fixed before any reported number is seen: lowest MAPE, then the smallest
    quantile whose coverage reaches ``target`` (the largest when none does)."""
    rows = {m: summarize(s, None, origins) for m, s in scores.items()}
    scored = [m for m, r in rows.items() if r.hours > 0 and math.isfinite(r.mape)]
    if not scored:
        raise ValueError(f"no scored decision on {on}")
    best = min(scored, key=lambda m: rows[m].mape)
    grid = scores[best].quantiles
    by_q = [summarize(scores[best], q, origins) for q in grid]
    reached = [r for r in by_q if r.coverage >= target]
    pick = reached[0] if reached else by_q[-1]
    return Choice(best, pick.quantile, on, pick)


def report(
    protocol: str, choice: Choice, scores: Mapping[str, Scores], origins: range, on: str
) -> Report:
    row = summarize(scores[choice.method], choice.quantile, origins)
    baseline = summarize(scores[BASELINE], choice.quantile, origins)
    return Report(protocol, choice, on, row, baseline)


def run_protocol(
    series: Mapping[str, FloatArray],
    spec: ForecastSpec | None = None,
    choose_days: DayRange = (1, 7),
    report_days: DayRange = (8, 14),
    candidates: Sequence[str] = CANDIDATES,
    quantiles: Sequence[float] = QUANTILES,
    target: float = GOALS.coverage,
    progress: Callable[[str], None] | None = None,
) -> ProtocolResult:
    """Score every candidate once per series, then choose and report (see the module)."""
    spec = spec or ForecastSpec()
    if choose_days[1] >= report_days[0]:
        raise ValueError(
            f"choose days {choose_days[0]}-{choose_days[1]} must end before the report days "
            f"{report_days[0]}-{report_days[1]} begin: otherwise the choice sees what it is "
            "scored on"
        )
    grid = tuple(sorted({*quantiles, SHIPPED[1]}))
    methods = list(dict.fromkeys([*candidates, BASELINE]))
    notes: list[str] = []
    shortest = min(series_days(y.size, spec) for y in series.values())
    if shortest < report_days[0]:
        raise ValueError(
            f"a series spans {shortest} days only: nothing to report on days "
            f"{report_days[0]}-{report_days[1]}"
        )
    if shortest < report_days[1]:
        notes.append(
            f"the shortest series spans {shortest} days: reporting days "
            f"{report_days[0]}-{shortest}, not {report_days[0]}-{report_days[1]}"
        )
        report_days = (report_days[0], shortest)
    scores: dict[str, dict[str, Scores]] = {}
    for name, y in series.items():
        scores[name] = {}
        for m in methods:
            if progress is not None:
                progress(f"{name}: {m}")
            scores[name][m] = score_hours(y, m, spec, grid)
    pick_o, report_o = day_origins(choose_days, spec), day_origins(report_days, spec)
    shipped_method = SHIPPED[0] if SHIPPED[0] in methods else "ensemble[1:2]"
    within: dict[str, list[Report]] = {}
    table: dict[str, list[CandidateRow]] = {}
    drift: dict[str, list[QuantileRow]] = {}
    for name, by_method in scores.items():
        rep_on = label(name, report_days)
        readings = [
            report(
                "in-sample",
                choose(by_method, report_o, rep_on, target),
                by_method,
                report_o,
                rep_on,
            ),
            report(
                "out-of-sample",
                choose(by_method, pick_o, label(name, choose_days), target),
                by_method,
                report_o,
                rep_on,
            ),
        ]
        if shipped_method in by_method:
            fixed = Choice(
                shipped_method,
                SHIPPED[1],
                "days 1–14, both traces (before)",
                summarize(by_method[shipped_method], SHIPPED[1], pick_o),
            )
            readings.append(report("shipped default", fixed, by_method, report_o, rep_on))
        within[name] = readings
        chosen = by_method[readings[1].choice.method]
        drift[name] = [
            QuantileRow(q, summarize(chosen, q, pick_o), summarize(chosen, q, report_o))
            for q in chosen.quantiles
        ]
        table[name] = [
            CandidateRow(m, summarize(s, None, pick_o), summarize(s, None, report_o))
            for m, s in by_method.items()
        ]
    cross = [
        report(
            "cross-trace",
            choose(scores[a], pick_o, label(a, choose_days), target),
            scores[b],
            report_o,
            label(b, report_days),
        )
        for a in scores
        for b in scores
        if a != b
    ]
    return ProtocolResult(choose_days, report_days, within, cross, table, drift, notes)
