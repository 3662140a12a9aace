"""Leave one trace out: every tunable chosen on the other traces, reported on the held-out one.

A forecaster (SageServe §6.3's load predictor) whose method, conformal window and gap
thresholds were picked on the traffic it is then scored on says little about the next
user's traffic. Here, for each trace:

1. **Gap detector**: the thresholds (``gap_harness.RULES``) with the best F1 at finding
   partial gaps injected into the *other* traces (``gap_harness.choose_rule``).
2. **Method**: the candidate (``CANDIDATES``: persistence, both components, two ensemble
   weightings) with the lowest mean MAPE of the next-hour peak over the other traces,
   with that detector.
3. **Conformal rule**: the window and adaptive step (``CONFORMALS``) whose coverage of the
   asked quantile, pooled over the other traces' hours, is closest to it (ties: less
   over-provisioning), replayed from one fit per hour (``forecast.api.upper_at``).
4. **Report** on the held-out trace, with all three: MAPE vs persistence, coverage of the
   quantile asked, hours provisioned below half the actual peak, mean over-provisioning.

An external series (a user's CSV) is held out from all the bundled traces the same way.
Hours whose actual window holds a gap (detected or missing) are neither trained on as
demand (the forecaster treats them as missing) nor scored (``backtest.score_hours``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np

from sageserve.forecast.api import upper_at
from sageserve.forecast.backtest import Scores, score_hours
from sageserve.forecast.gap_harness import RULES, Detection, choose_rule, detect, inject_gaps
from sageserve.forecast.types import Conformal, FloatArray, ForecastSpec, GapRule

CANDIDATES: tuple[str, ...] = (
    "persistence",
    "arima",
    "peak-regression",
    "ensemble[1:1]",
    "ensemble[1:2]",
)
CONFORMALS: tuple[Conformal, ...] = tuple(
    Conformal(window_hours=w, gamma=g) for w in (24, 72, 168) for g in (0.0, 0.02, 0.05)
)
BASELINE = "persistence"


@dataclass(frozen=True)
class Goals:
    mape_gain: float = 0.15
    """MAPE of the next-hour peak at least this much (relative) below persistence's."""
    coverage_points: float = 0.03
    """Coverage within this of the quantile asked."""
    below_half: int = 0
    """Hours provisioned below half the actual peak."""


GOALS = Goals()


@dataclass(frozen=True)
class Reading:
    """One method's forecasts on one trace at one quantile and conformal rule."""

    method: str
    hours: int
    skipped: int
    mape: float
    coverage: float
    below_half: int
    mean_over: float


def read(scores: Scores, quantile: float, rule: Conformal) -> Reading:
    """``scores`` provisioned at ``quantile`` under ``rule`` (replayed: ``upper_at``)."""
    hours = scores.hours
    actual = np.array([h.actual for h in hours])
    peak = np.array([h.peak for h in hours])
    upper = np.array(
        [upper_at(h.forecast, quantile, rule) if h.forecast else h.uppers[0] for h in hours]
    )
    n = len(hours)
    nan = math.nan
    return Reading(
        method=scores.method,
        hours=n,
        skipped=len(scores.skipped),
        mape=float(np.mean(np.abs(peak - actual) / actual)) if n else nan,
        coverage=float(np.mean(upper >= actual)) if n else nan,
        below_half=int(np.sum(upper < 0.5 * actual)),
        mean_over=float(np.mean(np.maximum(0.0, upper - actual) / actual)) if n else nan,
    )


@dataclass(frozen=True)
class HeldOut:
    """What was chosen on the other traces, and how it reads on the held-out one."""

    trace: str
    chosen_on: tuple[str, ...]
    rule: GapRule
    detection: Detection
    """The chosen detector on gaps injected into the held-out trace (shown, not chosen on)."""
    method: str
    conformal: Conformal
    quantile: float
    row: Reading
    baseline: Reading
    unguarded: Reading | None = None
    """The same hours with detection off (only with injected gaps): what gaps cost."""
    unguarded_baseline: Reading | None = None

    @property
    def gain(self) -> float:
        if not (self.baseline.mape > 0):
            return math.nan
        return 1.0 - self.row.mape / self.baseline.mape

    def missed(self, goals: Goals = GOALS) -> list[str]:
        out = []
        if not self.gain >= goals.mape_gain:
            out.append("MAPE vs persistence")
        if not abs(self.row.coverage - self.quantile) <= goals.coverage_points + 1e-9:
            out.append("coverage")
        if self.row.below_half > goals.below_half:
            out.append("below half")
        return out


@dataclass(frozen=True)
class Choices:
    rule: GapRule
    method: str
    conformal: Conformal


Progress = Callable[[str], None]


class _Cache:
    """Scores per (trace, method, detector): each is computed once."""

    def __init__(self, spec: ForecastSpec, progress: Progress | None) -> None:
        self.spec = spec
        self.progress = progress
        self.done: dict[tuple[str, str, GapRule], Scores] = {}

    def get(self, name: str, series: FloatArray, method: str, rule: GapRule) -> Scores:
        key = (name, method, rule)
        if key not in self.done:
            if self.progress is not None:
                self.progress(f"{name}: {method}")
            self.done[key] = score_hours(series, method, replace(self.spec, gaps=rule))
        return self.done[key]


def choose(
    series: Mapping[str, FloatArray],
    spec: ForecastSpec,
    cache: _Cache,
    candidates: Sequence[str] = CANDIDATES,
    conformals: Sequence[Conformal] = CONFORMALS,
    rules: Sequence[GapRule] = RULES,
) -> Choices:
    """Every tunable, chosen on ``series`` only (see the module)."""
    rule, _ = choose_rule(series, rules, spec.step_seconds)
    q = spec.quantile
    base = Conformal()
    mapes = {
        m: float(np.mean([read(cache.get(n, y, m, rule), q, base).mape for n, y in series.items()]))
        for m in candidates
    }
    method = min((m for m in mapes if math.isfinite(mapes[m])), key=lambda m: mapes[m])
    picked = [cache.get(n, y, method, rule) for n, y in series.items()]

    def cost(c: Conformal) -> tuple[float, float]:
        readings = [read(s, q, c) for s in picked]
        hours = sum(r.hours for r in readings)
        cover = sum(r.coverage * r.hours for r in readings) / hours if hours else math.nan
        over = sum(r.mean_over * r.hours for r in readings) / hours if hours else math.nan
        return abs(cover - q), over

    conformal = min(conformals, key=cost)
    return Choices(rule, method, conformal)


def leave_one_out(
    traces: Mapping[str, FloatArray],
    spec: ForecastSpec | None = None,
    external: Mapping[str, FloatArray] | None = None,
    inject: int = 0,
    candidates: Sequence[str] = CANDIDATES,
    conformals: Sequence[Conformal] = CONFORMALS,
    rules: Sequence[GapRule] = RULES,
    progress: Progress | None = None,
) -> list[HeldOut]:
    """One ``HeldOut`` per trace (chosen on the others) and per external series (chosen on
    all ``traces``). ``inject`` > 0 drops that many partial gaps (``gap_harness``, seed 0)
    into each held-out series before it is forecast and scored, and adds the readings with
    detection off beside."""
    spec = spec or ForecastSpec()
    cache = _Cache(spec, progress)
    plan: list[tuple[str, FloatArray, dict[str, FloatArray]]] = []
    if len(traces) >= 2:
        for name, y in traces.items():
            plan.append((name, y, {n: v for n, v in traces.items() if n != name}))
    for name, y in (external or {}).items():
        if not traces:
            raise ValueError("an external series needs bundled traces to choose on")
        plan.append((name, y, dict(traces)))
    if not plan:
        raise ValueError("leave one trace out needs at least two traces (or an external one)")
    out: list[HeldOut] = []
    for name, y, others in plan:
        pick = choose(others, spec, cache, candidates, conformals, rules)
        held = y
        label = name
        if inject > 0:
            held, _ = inject_gaps(y, seed=0, count=inject)
            label = f"{name} + {inject} injected gaps"
        row = read(cache.get(label, held, pick.method, pick.rule), spec.quantile, pick.conformal)
        base = read(cache.get(label, held, BASELINE, pick.rule), spec.quantile, pick.conformal)
        blind = blind_base = None
        if inject > 0:
            off = replace(pick.rule, enabled=False)
            blind = read(cache.get(label, held, pick.method, off), spec.quantile, pick.conformal)
            blind_base = read(cache.get(label, held, BASELINE, off), spec.quantile, pick.conformal)
        out.append(
            HeldOut(
                trace=label,
                chosen_on=tuple(others),
                rule=pick.rule,
                detection=detect(y, pick.rule, spec.step_seconds),
                method=pick.method,
                conformal=pick.conformal,
                quantile=spec.quantile,
                row=row,
                baseline=base,
                unguarded=blind,
                unguarded_baseline=blind_base,
            )
        )
    return out
