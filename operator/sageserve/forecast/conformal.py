"""The provisioned quantile, calibrated online on the forecaster's recent errors.

SageServe provisions for an upper quantile of the next hour's peak (SageServe §6.3; the
ScalingPolicy's ``forecast.quantile``). The quantile of a fitted model's errors over a fixed
week is calibrated on the past week: when the traffic turns burstier, the same quantile
covers fewer hours (79–80 % at q0.85 on the bundled traces' second week). Conformal
prediction fixes the coverage without trusting a distribution:

- *split conformal* over a rolling window: the upper forecast is the point forecast plus the
  ``⌈(n + 1) q⌉``-th smallest of the last ``window_hours`` hourly log errors (actual peak −
  forecast peak), which covers ``q`` of the next hour when the errors are exchangeable;
- *adaptive conformal inference* (Gibbs & Candès, 2021) on top: the level asked of that
  window moves by ``gamma × (miss − (1 − q))`` after each hour, replayed over the errors in
  order, so that a run of misses raises it and a run of easy hours lowers it: the long-run
  share of hours covered tends to ``q`` whatever the drift.

Pure: the errors are the forecaster's own, replayed from horizon-aligned past origins of the
history it is given (``forecast.api``), so the operator's plan loop and the simulator, which
call the same ``forecast_peak`` on the same history, get the same number; nothing is kept
between calls.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from sageserve.forecast.types import Conformal, FloatArray


def conformal_quantile(window: FloatArray, level: float) -> float:
    """The split-conformal quantile of ``window`` at ``level``: its ⌈(n + 1) level⌉-th
    smallest value (the largest when that rank passes n; the smallest at level ≤ 0)."""
    values = np.sort(window[np.isfinite(window)])
    n = values.size
    if n == 0:
        return math.nan
    rank = math.ceil((n + 1) * level - 1e-9)
    return float(values[min(max(rank, 1), n) - 1])


def conformal_offset(
    errors: Sequence[float] | FloatArray, quantile: float, rule: Conformal
) -> float | None:
    """Log offset to add to the model's peak for its upper ``quantile`` (see the module).

    ``errors`` are log(actual peak) − log(forecast peak) of past hourly decisions, oldest
    first; NaN marks a decision whose actual window held a gap (not scored, skipped). None
    when fewer than ``rule.min_errors`` are finite or the rule is disabled."""
    e = np.asarray(errors, dtype=np.float64)
    e = e[np.isfinite(e)]
    if not rule.enabled or e.size < rule.min_errors:
        return None
    target = 1.0 - quantile  # the miss rate asked
    alpha = target
    if rule.gamma > 0:
        # Every window the replay reads, sorted once (NaN padding sorts last): each hour is
        # then a rank lookup, what ``conformal_quantile`` would return on ``e[t - w : t]``.
        w = rule.window_hours
        padded = np.concatenate([np.full(w, np.nan), e])
        windows = np.sort(sliding_window_view(padded, w)[: e.size], axis=1)
        for t in range(rule.min_errors, e.size):
            n = min(t, w)
            rank = math.ceil((n + 1) * (1.0 - alpha) - 1e-9)
            miss = float(e[t] > windows[t, min(max(rank, 1), n) - 1])
            alpha += rule.gamma * (target - miss)
    return conformal_quantile(e[-rule.window_hours :], 1.0 - alpha)
