"""The one entry point the planner uses: ``forecast_peak`` never raises.

Upper quantile: a point forecast of a peak is biased low (the max of a noisy path exceeds the
max of its mean path), which is why a plain ARIMA(3,1,2) fell below the actual peak in
64–72 % of hours. We calibrate empirically instead of trusting a Gaussian interval: the fitted
model is replayed from the last ``calibration_origins`` horizon-aligned origins in its own
history (origins whose actual window holds a gap are left out), and the log errors
e = log(actual peak) − log(predicted peak), oldest first, give
- the point forecast: predicted peak × exp(median e) (median-unbiased), and
- the provisioned (upper) forecast: predicted peak × exp(the conformal quantile of e), the
  split-conformal quantile of the last ``spec.conformal.window_hours`` errors at the level
  adaptive conformal inference replays to (``forecast.conformal``).
With fewer than ``MIN_CALIBRATION`` past origins, a Gaussian interval from the one-step
volatility is used and a note says so. What is provisioned is then floored: at half the
recent level while a gap is within the model's reach, and at the drop guard's floor
(``forecast.guard``: half the last hours' peak until a drop is confirmed).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from sageserve.forecast.conformal import conformal_offset
from sageserve.forecast.gaps import gap_mask, recent_level
from sageserve.forecast.guard import drop_floor
from sageserve.forecast.methods import DAY_SECONDS, gaussian_z, get_forecaster
from sageserve.forecast.types import (
    BoolArray,
    Conformal,
    FloatArray,
    Forecast,
    ForecastSpec,
    PeakModel,
)

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
    collection gaps (``forecast.gaps.partial_gaps``: a run down to a fraction of the level
    and back, also at the very end of the history) are treated as missing before anything
    is fitted, and while a gap is within the model's reach (a day and a horizon back: the
    seasonal lags and peak features of SageServe §6.3's predictor) no number comes out below
    ``spec.gaps.floor_fraction`` of the recent level. Nothing is provisioned below the drop
    guard's floor (``forecast.guard``: half the last hours' peak until a drop is confirmed).
    """
    spec = spec or ForecastSpec()
    values = np.asarray(history_tps, dtype=np.float64)
    mask = gap_mask(values, spec.step_seconds, spec.gaps)
    raw = np.where(mask, np.nan, values)
    origins = max(calibration_origins, spec.conformal.origins if spec.conformal.enabled else 0)
    fc = _forecast(raw, spec, method, fallback, origins, tuple(quantiles))
    fc = replace(fc, gaps=int(mask.sum()))
    if not fc.reliable:
        return fc
    _, last = spec.steps()
    reach = round(DAY_SECONDS / spec.step_seconds) + last
    if spec.gaps.enabled and mask[-reach:].any():
        level = recent_level(values, mask, max(last, 1))
        if level is not None:
            fc = _floor(fc, spec.gaps.floor_fraction * level, "gap floor", raise_point=True)
    guard = drop_floor(values, mask, spec.step_seconds, spec.guard)
    # The guard bounds what is provisioned: the uppers, and the point only at a quantile
    # ≤ 0.5, where the point is what the plan provisions (plan.cycle).
    return _floor(fc, guard, "drop guard", raise_point=spec.quantile <= 0.5)


def _floor(fc: Forecast, floor: float, why: str, raise_point: bool) -> Forecast:
    """``fc`` with no provisioned number (and, with ``raise_point``, no point forecast)
    below ``floor``, saying so when it bound. The gap floor raises the point too: a gap is
    missing data, and the point must not read it as a lull."""
    if floor <= 0:
        return fc
    fc = replace(fc, floor_tps=max(fc.floor_tps, floor))
    if fc.upper_tps >= floor and (fc.peak_tps >= floor or not raise_point):
        return fc
    return replace(
        fc,
        peak_tps=max(fc.peak_tps, floor) if raise_point else fc.peak_tps,
        upper_tps=max(fc.upper_tps, floor),
        uppers=tuple((q, max(u, floor)) for q, u in fc.uppers),
        path_tps=tuple(max(v, floor) for v in fc.path_tps),
        floored=True,
        notes=(*fc.notes, f"{why}: raised to {floor:.4g} tokens/s"),
    )


def upper_at(fc: Forecast, quantile: float, rule: Conformal) -> float:
    """What ``forecast_peak`` would provision at ``quantile`` had its spec asked for the
    conformal ``rule``: the same correction, replayed on the errors the forecast carries
    (``Forecast.calibration``), then the same floors. Lets a backtest compare conformal
    windows from one fit per hour. A forecast without calibration errors (a model's own
    interval, or too little history) keeps its upper forecast."""
    if not fc.calibration or not math.isfinite(fc.model_peak_log + fc.point_log):
        return fc.upper_tps
    offset = conformal_offset(fc.calibration, quantile, rule)
    if offset is None:
        return fc.upper_tps
    high = max(fc.model_peak_log + offset, fc.point_log)
    with np.errstate(over="ignore"):
        upper = float(np.expm1(high))
    return max(upper, fc.floor_tps, 0.0)


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
    missing: BoolArray = ~observed
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
            return _run(
                forecaster.name, method, x, spec, calibration_origins, None, quantiles, missing
            )
    except Exception as exc:  # the contract: never raise into the caller
        reason = f"{method} failed: {type(exc).__name__}: {exc}"
    try:
        return _run(fallback, method, x, spec, calibration_origins, reason, quantiles, missing)
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
    missing: BoolArray | None = None,
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
    errors = _calibration_errors(model, x, first, last, origins, missing)
    scored = errors[np.isfinite(errors)]
    upper_path = getattr(model, "upper_path", None)
    wanted = (spec.quantile, *quantiles)
    calibration: tuple[float, ...] = ()
    if upper_path is not None:
        # A Gaussian interval at spec.quantile: other quantiles scale with z.
        top = float(np.max(np.asarray(upper_path)[first - 1 : last]))
        z = gaussian_z(spec.quantile)
        point = peak
        highs = [peak + (top - peak) * gaussian_z(q) / z if z > 0 else top for q in wanted]
        notes.append("upper from the model's prediction interval")
    elif scored.size >= MIN_CALIBRATION:
        point = peak + float(np.median(scored[-CALIBRATION_ORIGINS:]))
        offsets = [conformal_offset(errors, q, spec.conformal) for q in wanted]
        highs = [
            peak + (o if o is not None else float(np.quantile(scored, q)))
            for o, q in zip(offsets, wanted, strict=True)
        ]
        if spec.conformal.enabled and all(o is not None for o in offsets):
            calibration = tuple(float(v) for v in errors)
    else:
        vol = float(np.std(np.diff(x[-max(last * 6, 12) :]))) if x.size > 2 else 0.0
        point = peak
        highs = [peak + gaussian_z(q) * vol * math.sqrt(last) for q in wanted]
        notes.append(f"only {scored.size} calibration origins: Gaussian upper quantile")
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
        calibration=calibration,
        model_peak_log=peak,
        point_log=point,
    )


def _calibration_errors(
    model: PeakModel,
    x: FloatArray,
    first: int,
    last: int,
    origins: int,
    missing: BoolArray | None = None,
) -> FloatArray:
    """Log errors (actual − predicted peak) of the model replayed from the last ``origins``
    horizon-aligned origins, oldest first; NaN where the actual window holds a gap
    (``missing``): a gap is not an actual peak to be calibrated on."""
    n = x.size
    starts = np.array(
        [n - k * last for k in range(origins, 0, -1) if n - k * last >= max(12, last)],
        dtype=np.int64,
    )
    if starts.size == 0:
        return np.zeros(0)
    predicted = model.paths(starts)[:, first - 1 : last].max(axis=1)
    window = starts[:, None] + np.arange(first - 1, last)[None, :]
    actual = x[window].max(axis=1)
    out: FloatArray = actual - predicted
    if missing is not None:
        out = np.where(missing[window].any(axis=1), np.nan, out)
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
