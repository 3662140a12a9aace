"""The one entry point the planner uses: ``forecast_peak`` never raises.

Upper quantile: a point forecast of a peak is biased low (the max of a noisy path exceeds the
max of its mean path), which is why a plain ARIMA(3,1,2) fell below the actual peak in
64–72 % of hours. We calibrate empirically instead of trusting a Gaussian interval: the fitted
model is replayed from the last ``calibration_origins`` horizon-aligned origins in its own
history, and the log errors e = log(actual peak) − log(predicted peak) give
- the point forecast: predicted peak × exp(median e) (median-unbiased), and
- the provisioned (upper) forecast: predicted peak × exp(quantile_q e).
With fewer than ``MIN_CALIBRATION`` past origins, a Gaussian interval from the one-step
volatility is used and a note says so.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from sageserve.forecast.gaps import gap_mask, recent_level
from sageserve.forecast.methods import DAY_SECONDS, gaussian_z, get_forecaster
from sageserve.forecast.types import FloatArray, Forecast, ForecastSpec, PeakModel

MIN_CALIBRATION = 8
POINT_QUANTILE = 0.5
CALIBRATION_ORIGINS = 168


def forecast_peak(
    history_tps: Sequence[float] | FloatArray,
    spec: ForecastSpec | None = None,
    method: str = "ensemble",
    fallback: str = "persistence",
    calibration_origins: int = CALIBRATION_ORIGINS,
    quantiles: Sequence[float] = (),
) -> Forecast:
    """Forecast the peak tokens/s over [now + lead, now + horizon] from ``history_tps``.

    Pure: "now" is the end of the history. Any failure of ``method`` (too little history, too
    many gaps, an exception or non-convergence in the fit, a non-finite result) falls back to
    ``fallback`` and the result says which method ran and why. ``quantiles`` adds the upper
    forecast at each of those quantiles (``Forecast.uppers``) from the same fit.

    Gaps are missing data, never demand: NaN, negative values and partial
    collection gaps (``forecast.gaps.partial_gaps``: a run down to a fraction of the level and back,
    also at the very end of the history) are treated as missing before anything is fitted,
    and while a gap is within the model's reach (a day and a horizon back: the seasonal lags
    and peak features of SageServe §6.3's predictor) no number comes out below
    ``spec.gaps.floor_fraction`` of the recent level.
    """
    spec = spec or ForecastSpec()
    values = np.asarray(history_tps, dtype=np.float64)
    mask = gap_mask(values, spec.step_seconds, spec.gaps)
    raw = np.where(mask, np.nan, values)
    fc = _forecast(raw, spec, method, fallback, calibration_origins, tuple(quantiles))
    fc = replace(fc, gaps=int(mask.sum()))
    _, last = spec.steps()
    reach = round(DAY_SECONDS / spec.step_seconds) + last
    if not fc.reliable or not spec.gaps.enabled or not mask[-reach:].any():
        return fc
    level = recent_level(values, mask, max(last, 1))
    return _floor(fc, spec.gaps.floor_fraction * level) if level is not None else fc


def _floor(fc: Forecast, floor: float) -> Forecast:
    """``fc`` with no number below ``floor`` (the gap floor), saying so when it bound."""
    if floor <= 0 or (fc.upper_tps >= floor and fc.peak_tps >= floor):
        return fc
    return replace(
        fc,
        peak_tps=max(fc.peak_tps, floor),
        upper_tps=max(fc.upper_tps, floor),
        uppers=tuple((q, max(u, floor)) for q, u in fc.uppers),
        path_tps=tuple(max(v, floor) for v in fc.path_tps),
        floored=True,
        notes=(*fc.notes, f"gap floor: raised to {floor:.4g} tokens/s (half the recent level)"),
    )


def _forecast(
    raw: FloatArray,
    spec: ForecastSpec,
    method: str,
    fallback: str,
    calibration_origins: int,
    quantiles: tuple[float, ...],
) -> Forecast:
    """``forecast_peak`` on a history whose gaps are NaN already."""
    observed = np.isfinite(raw)
    if raw.size == 0 or not observed.any():
        return Forecast(
            0.0,
            0.0,
            spec.quantile,
            "none",
            method,
            "no observations in the history",
            reliable=False,
        )
    x = _prepare(raw)
    reason: str | None = None
    try:
        forecaster = get_forecaster(method)
        need = forecaster.min_points(spec)
        window = raw[-need:] if need > 0 else raw
        gaps = float(np.mean(~np.isfinite(window)))
        if raw.size < need:
            reason = f"too little history: {raw.size} points, {method} needs {need}"
        elif gaps > spec.max_gap_fraction:
            reason = f"too many gaps: {gaps:.0%} of the last {need} points are missing"
        else:
            return _run(forecaster.name, method, x, spec, calibration_origins, None, quantiles)
    except Exception as exc:  # the contract: never raise into the caller
        reason = f"{method} failed: {type(exc).__name__}: {exc}"
    try:
        return _run(fallback, method, x, spec, calibration_origins, reason, quantiles)
    except Exception as exc:
        last = float(np.expm1(x[-1]))
        return Forecast(
            last,
            last,
            spec.quantile,
            "last-value",
            method,
            f"{reason}; fallback {fallback} failed too: {exc}",
            uppers=tuple((q, last) for q in quantiles),
        )


def _run(
    name: str,
    requested: str,
    x: FloatArray,
    spec: ForecastSpec,
    origins: int,
    reason: str | None,
    quantiles: tuple[float, ...] = (),
) -> Forecast:
    forecaster = get_forecaster(name)
    if x.size < forecaster.min_points(spec) and name != requested:
        # The fallback itself lacks history: persistence needs just one point.
        forecaster = get_forecaster("persistence")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = forecaster.fit(x, spec)
    first, last = spec.steps()
    path = model.path(len(x))
    if path.shape[0] < last or not np.all(np.isfinite(path)):
        raise FloatingPointError(f"{name} produced a non-finite forecast")
    peak = float(np.max(path[first - 1 : last]))
    notes: list[str] = []
    errors = _calibration_errors(model, x, first, last, origins)
    upper_path = getattr(model, "upper_path", None)
    wanted = (spec.quantile, *quantiles)
    if upper_path is not None:
        # A Gaussian interval at spec.quantile: other quantiles scale with z.
        top = float(np.max(np.asarray(upper_path)[first - 1 : last]))
        z = gaussian_z(spec.quantile)
        point = peak
        highs = [peak + (top - peak) * gaussian_z(q) / z if z > 0 else top for q in wanted]
        notes.append("upper from the model's prediction interval")
    elif errors.size >= MIN_CALIBRATION:
        point = peak + float(np.quantile(errors, POINT_QUANTILE))
        highs = [peak + float(np.quantile(errors, q)) for q in wanted]
    else:
        vol = float(np.std(np.diff(x[-max(last * 6, 12) :]))) if x.size > 2 else 0.0
        point = peak
        highs = [peak + gaussian_z(q) * vol * math.sqrt(last) for q in wanted]
        notes.append(f"only {errors.size} calibration origins: Gaussian upper quantile")
    with np.errstate(over="ignore"):  # an overflow is refused just below, not printed
        point_tps = float(np.expm1(point))
        upper_all = [float(np.expm1(max(h, point))) for h in highs]
    if not all(math.isfinite(v) for v in (point_tps, *upper_all)):
        raise FloatingPointError(f"{name} produced a non-finite forecast")
    return Forecast(
        peak_tps=max(point_tps, 0.0),
        upper_tps=max(upper_all[0], 0.0),
        quantile=spec.quantile,
        method=forecaster.name,
        requested=requested,
        fallback_reason=reason,
        path_tps=tuple(float(v) for v in np.maximum(np.expm1(path), 0.0)),
        notes=tuple(notes),
        uppers=tuple((q, max(u, 0.0)) for q, u in zip(quantiles, upper_all[1:], strict=True)),
    )


def _calibration_errors(
    model: PeakModel, x: FloatArray, first: int, last: int, origins: int
) -> FloatArray:
    n = x.size
    starts = np.array(
        [n - k * last for k in range(1, origins + 1) if n - k * last >= max(12, last)],
        dtype=np.int64,
    )
    if starts.size == 0:
        return np.zeros(0)
    predicted = model.paths(starts)[:, first - 1 : last].max(axis=1)
    window = starts[:, None] + np.arange(first - 1, last)[None, :]
    actual = x[window].max(axis=1)
    out: FloatArray = actual - predicted
    return out


def _prepare(raw: FloatArray) -> FloatArray:
    """log(1 + tokens/s) with gaps filled by linear interpolation (ends: nearest value).
    Negative values (counter resets) are treated as gaps too."""
    values = np.where(raw >= 0, raw, np.nan)
    ok = np.isfinite(values)
    idx = np.arange(values.size)
    filled = np.interp(idx, idx[ok], values[ok])
    return np.log1p(filled)


def batch_buffer_tps(batch_tps_last_hour: Sequence[float], fraction: float = 0.1) -> float:
    """β (paper ambiguity #5, paper's definition): 10 % of the batch (NIW) load received in the
    past hour, as a rate. ``batch_tps_last_hour`` are the batch tokens/s per window covering the
    last hour; their mean × 3600 is the hour's batch tokens, and 10 % of that spread over the
    hour is 0.1 × the mean rate (`fraction`, the ScalingPolicy's batchBufferFraction).
    (The reference repo adds 10 % of the largest NIW prompt.)
    Gaps (NaN) are ignored; no data gives 0."""
    values = np.asarray(batch_tps_last_hour, dtype=np.float64)
    values = values[np.isfinite(values)]
    if values.size == 0:
        return 0.0
    return fraction * float(np.mean(np.maximum(values, 0.0)))
