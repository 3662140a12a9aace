"""Forecasting strategies and their registry.

All methods work on x = log(1 + tokens/s): load is multiplicative (a 20 % burst is 20 % at any
level), the log makes errors symmetric in ratio terms, and the back-transform can never
produce negative demand.

- ``arima`` (default): an ARIMA-family model with a daily seasonal term, AR(p) on log load with
  lags 1..p plus lags s and s+1 (s = one day in steps), fitted by conditional least squares
  through statsmodels' ``AutoReg``. Conditional least squares has a closed form, so a fit is a
  few milliseconds and cannot fail to converge; the daily lag is what lets it anticipate the
  diurnal ramp that a short-window ARIMA(3,1,2) misses.
- ``arima-classic``: the paper's set-up as measured in the issue, ARIMA(3,1,2) by statsmodels'
  state-space MLE on the last 6 h; slow (~100 ms+ a fit) and kept for comparison.
- ``peak-regression``: a direct regression of the horizon's log peak (see the class).
- ``ensemble``: weighted mean of ``arima`` and ``peak-regression`` in log space (default of
  ``forecast_peak``: most accurate on the ServeGen backtest).
- ``persistence``, ``seasonal-naive``, ``moving-average``: baselines and fallbacks.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from sageserve.forecast.types import FloatArray, Forecaster, ForecastSpec, IntArray, PeakModel

DAY_SECONDS = 86400.0


def _season(spec: ForecastSpec) -> int:
    return max(1, round(DAY_SECONDS / spec.step_seconds))


@dataclass
class _ARPeak:
    """Fitted AR recursion; ``path(origin)`` replays it from any origin (for calibration)."""

    x: FloatArray
    const: float
    coefs: FloatArray
    lags: tuple[int, ...]
    last: int

    def path(self, origin: int) -> FloatArray:
        out: FloatArray = self.paths(np.array([origin]))[0]
        return out

    def paths(self, origins: IntArray) -> FloatArray:
        """All origins at once: the recursion is vectorised across origins."""
        span = max(self.lags)
        idx = origins[:, None] - span + np.arange(span)[None, :]
        buf = np.empty((origins.size, span + self.last))
        # Early origins (calibration) are padded with the oldest value.
        buf[:, :span] = self.x[np.clip(idx, 0, None)]
        for h in range(self.last):
            col = span + h
            value = np.full(origins.size, self.const)
            for a, lag in zip(self.coefs, self.lags, strict=True):
                value += float(a) * buf[:, col - lag]
            buf[:, col] = value
        out: FloatArray = buf[:, span:]
        return out


@dataclass(frozen=True)
class SeasonalAR:
    """The default ``arima`` method (see module docstring)."""

    name: str = "arima"
    p: int = 3
    window_days: float = 14.0
    seasonal: bool = True

    def lags(self, spec: ForecastSpec, n: int) -> tuple[int, ...]:
        s = _season(spec)
        base = tuple(range(1, self.p + 1))
        if self.seasonal and n >= 2 * s + self.p + 10:
            return (*base, s, s + 1)
        return base

    def min_points(self, spec: ForecastSpec) -> int:
        return max(self.p + 12, int(spec.min_history_seconds // spec.step_seconds))

    def fit(self, x: FloatArray, spec: ForecastSpec) -> PeakModel:
        from statsmodels.tsa.ar_model import AutoReg

        window = int(self.window_days * DAY_SECONDS // spec.step_seconds)
        lags = self.lags(spec, len(x))
        fit_x = x[-max(window, max(lags) + self.p + 12) :]
        res = AutoReg(fit_x, lags=list(lags), trend="c").fit()
        params = np.asarray(res.params, dtype=np.float64)
        if not np.all(np.isfinite(params)):
            raise FloatingPointError("non-finite AR coefficients")
        _, last = spec.steps()
        return _ARPeak(x, float(params[0]), params[1:], lags, last)


@dataclass
class _DirectPeak:
    x: FloatArray
    coefs: FloatArray
    first: int
    last: int
    season: int

    def path(self, origin: int) -> FloatArray:
        out: FloatArray = self.paths(np.array([origin]))[0]
        return out

    def paths(self, origins: IntArray) -> FloatArray:
        feats = _peak_features(self.x, origins, self.last, self.season)
        return np.repeat((feats @ self.coefs)[:, None], self.last, axis=1)


def _peak_features(x: FloatArray, origins: IntArray, last: int, season: int) -> FloatArray:
    """Regressors of the next horizon's log peak known at each origin (one row per origin):
    1, last value, last horizon's max and mean, the horizon before's max, and the same
    horizon one day earlier (the last horizon's max when there is no day of history)."""
    o = origins[:, None]
    steps = np.arange(last)[None, :]
    recent = x[np.clip(o - last + steps, 0, None)]
    before = x[np.clip(o - 2 * last + steps, 0, None)]
    day = o - season + steps
    yesterday = np.where(
        origins >= season, x[np.clip(day, 0, None)].max(axis=1), recent.max(axis=1)
    )
    out: FloatArray = np.column_stack(
        [
            np.ones(origins.size),
            x[origins - 1],
            recent.max(axis=1),
            recent.mean(axis=1),
            yesterday,
            before.max(axis=1),
        ]
    )
    return out


@dataclass(frozen=True)
class PeakRegression:
    """Direct model of the horizon's log peak: linear (ridge) regression on the last value, the
    last horizon's max and mean, the horizon before's max and the same window one day earlier,
    fitted on horizon-aligned origins of the last ``window_days``. It targets the quantity the
    planner needs (the peak) instead of deriving it from a mean path, which removes the
    peak-of-the-mean-path bias."""

    name: str = "peak-regression"
    window_days: float = 14.0
    ridge: float = 1e-3

    def min_points(self, spec: ForecastSpec) -> int:
        _, last = spec.steps()
        return max(int(spec.min_history_seconds // spec.step_seconds), 8 * last)

    def fit(self, x: FloatArray, spec: ForecastSpec) -> PeakModel:
        first, last = spec.steps()
        s = _season(spec)
        count = int(self.window_days * DAY_SECONDS // (last * spec.step_seconds))
        origins = np.arange(x.size - last, 2 * last, -last, dtype=np.int64)[:count]
        if origins.size < 8:
            raise ValueError(f"only {origins.size} training origins")
        feats = _peak_features(x, origins, last, s)
        target = x[origins[:, None] + np.arange(first - 1, last)[None, :]].max(axis=1)
        gram = feats.T @ feats + self.ridge * np.eye(feats.shape[1])
        coefs = np.linalg.solve(gram, feats.T @ target)
        return _DirectPeak(x, coefs, first, last, s)


@dataclass
class _MeanPeak:
    parts: tuple[PeakModel, ...]
    weights: tuple[float, ...]

    def path(self, origin: int) -> FloatArray:
        out: FloatArray = self.paths(np.array([origin]))[0]
        return out

    def paths(self, origins: IntArray) -> FloatArray:
        total = sum(
            w * part.paths(origins) for part, w in zip(self.parts, self.weights, strict=True)
        )
        out: FloatArray = np.asarray(total, dtype=np.float64) / sum(self.weights)
        return out


@dataclass(frozen=True)
class Ensemble:
    """Weighted mean (in log space) of the seasonal ARIMA path and the direct peak regression:
    their errors are only partly correlated, so the mean is more accurate than either. Weight
    1 : 2 was chosen on the ServeGen backtest over all 14 days; ``sageserve forecast backtest
    --choose-days 1-7 --report-days 8-14`` chooses the weights (``ensemble[a:b]``) on days it
    does not report (docs/forecast.md, out of sample)."""

    name: str = "ensemble"
    weights: tuple[float, float] = (1.0, 2.0)

    def min_points(self, spec: ForecastSpec) -> int:
        return max(SeasonalAR().min_points(spec), PeakRegression().min_points(spec))

    def fit(self, x: FloatArray, spec: ForecastSpec) -> PeakModel:
        parts: tuple[Forecaster, Forecaster] = (SeasonalAR(), PeakRegression())
        used = [(p, w) for p, w in zip(parts, self.weights, strict=True) if w > 0]
        return _MeanPeak(tuple(p.fit(x, spec) for p, _ in used), tuple(w for _, w in used))


@dataclass
class _ClassicPeak:
    mean_path: FloatArray
    upper_path: FloatArray | None
    x: FloatArray
    last: int

    def path(self, origin: int) -> FloatArray:
        if origin == len(self.x):
            return self.mean_path
        # Past origins (calibration) would need a refit each; use persistence of the level.
        return np.full(self.last, self.x[origin - 1])

    def paths(self, origins: IntArray) -> FloatArray:
        return np.array([self.path(int(o)) for o in origins]).reshape(-1, self.last)


#: The orders the AIC search tries: p, q ≤ 3 with one difference (SageServe §6.3).
AIC_ORDERS: tuple[tuple[int, int, int], ...] = tuple((p, 1, q) for p in range(4) for q in range(4))


@dataclass(frozen=True)
class ClassicARIMA:
    """ARIMA(p, d, q) by state-space MLE on a short window: the paper's plain ARIMA
    (SageServe §6.3, Appendix B), kept as the baseline the other methods are measured against.

    The order is `spec.arima_order` (the policy's `forecast.order`) when set, otherwise the
    one of `AIC_ORDERS` with the least AIC on the fit window, as the paper chooses it. The
    search costs up to 16 fits per forecast; orders that do not converge are skipped."""

    name: str = "arima-classic"
    window_hours: float = 6.0

    def min_points(self, spec: ForecastSpec) -> int:
        order = spec.arima_order or max(AIC_ORDERS, key=sum)
        return max(sum(order) + 8, int(spec.min_history_seconds // spec.step_seconds))

    def fit(self, x: FloatArray, spec: ForecastSpec) -> PeakModel:
        window = int(self.window_hours * 3600 // spec.step_seconds)
        _, last = spec.steps()
        orders = (spec.arima_order,) if spec.arima_order else AIC_ORDERS
        res = best_arima(x[-window:], orders)
        fc = res.get_forecast(last)
        mean = np.asarray(fc.predicted_mean, dtype=np.float64)
        upper = np.asarray(fc.conf_int(alpha=2 * (1 - spec.quantile))[:, 1], dtype=np.float64)
        return _ClassicPeak(mean, upper, x, last)


def best_arima(x: FloatArray, orders: Sequence[tuple[int, int, int]]) -> Any:
    """The fitted ARIMA of least AIC among `orders` (statsmodels' results object); raises
    the last fit's error when none converges (the caller falls back to a baseline)."""
    import warnings

    from statsmodels.tools.sm_exceptions import ConvergenceWarning
    from statsmodels.tsa.arima.model import ARIMA

    best: Any = None
    error: Exception | None = None
    for order in orders:
        with warnings.catch_warnings():
            warnings.simplefilter("error", ConvergenceWarning)
            warnings.simplefilter("ignore", UserWarning)
            try:
                res = ARIMA(x, order=order).fit()
            except (ConvergenceWarning, ValueError, np.linalg.LinAlgError) as exc:
                error = exc
                continue
        if best is None or res.aic < best.aic:
            best = res
    if best is None:
        raise error or ValueError("no ARIMA order to fit")
    return best


@dataclass
class _Baseline:
    x: FloatArray
    last: int
    rule: Callable[[FloatArray, int], float]

    def path(self, origin: int) -> FloatArray:
        return np.full(self.last, self.rule(self.x[:origin], self.last))

    def paths(self, origins: IntArray) -> FloatArray:
        return np.array([self.path(int(o)) for o in origins]).reshape(-1, self.last)


@dataclass(frozen=True)
class Persistence:
    """Next horizon's peak = the peak of the last horizon-long stretch."""

    name: str = "persistence"

    def min_points(self, spec: ForecastSpec) -> int:
        return 1

    def fit(self, x: FloatArray, spec: ForecastSpec) -> PeakModel:
        _, last = spec.steps()
        return _Baseline(x, last, lambda h, k: float(np.max(h[-k:])))


@dataclass(frozen=True)
class SeasonalNaive:
    """Next horizon's peak = the peak of the same stretch one day earlier."""

    name: str = "seasonal-naive"

    def min_points(self, spec: ForecastSpec) -> int:
        return _season(spec)

    def fit(self, x: FloatArray, spec: ForecastSpec) -> PeakModel:
        first, last = spec.steps()
        s = _season(spec)

        def rule(h: FloatArray, k: int) -> float:
            n = len(h)
            lo, hi = n - s + first - 1, n - s + last
            return float(np.max(h[max(lo, 0) : max(hi, 1)]))

        return _Baseline(x, last, rule)


@dataclass(frozen=True)
class MovingAverage:
    """Next horizon's peak = mean of the last horizon-long stretch (SageServe App. B's MA)."""

    name: str = "moving-average"

    def min_points(self, spec: ForecastSpec) -> int:
        return 1

    def fit(self, x: FloatArray, spec: ForecastSpec) -> PeakModel:
        _, last = spec.steps()
        return _Baseline(x, last, lambda h, k: float(np.log(np.mean(np.expm1(h[-k:])) + 1.0)))


FORECASTERS: dict[str, Callable[[], Forecaster]] = {
    "arima": SeasonalAR,
    "arima-classic": ClassicARIMA,
    "peak-regression": PeakRegression,
    "ensemble": Ensemble,
    "persistence": Persistence,
    "seasonal-naive": SeasonalNaive,
    "moving-average": MovingAverage,
}


#: ``ensemble[a:b]``: the ensemble with weights a (arima) : b (peak-regression).
_WEIGHTED = re.compile(r"ensemble\[(\d+(?:\.\d+)?):(\d+(?:\.\d+)?)\]")


def get_forecaster(name: str) -> Forecaster:
    """The strategy registered under ``name``; KeyError lists the known names.

    ``ensemble[a:b]`` is the ensemble with its weights spelt out (arima : peak-regression),
    so that a backtest can choose the weights on some days and report them on others."""
    weighted = _WEIGHTED.fullmatch(name)
    if weighted is not None:
        weights = (float(weighted.group(1)), float(weighted.group(2)))
        if sum(weights) <= 0:
            raise KeyError(f"forecaster {name!r}: the weights must not both be 0")
        return Ensemble(name=name, weights=weights)
    try:
        return FORECASTERS[name]()
    except KeyError:
        known = ", ".join(sorted(FORECASTERS))
        raise KeyError(f"unknown forecaster {name!r}; known: {known}, ensemble[a:b]") from None


def gaussian_z(q: float) -> float:
    """Standard normal quantile (Acklam-free: via erfinv-by-bisection, q in (0, 1))."""
    lo, hi = -10.0, 10.0
    for _ in range(80):
        mid = (lo + hi) / 2
        if 0.5 * (1 + math.erf(mid / math.sqrt(2))) < q:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2
