"""No hour provisioned below half of what the last hours saw, unless the drop is confirmed.

A forecast of the next hour's peak (SageServe §6.3) can fall far below the traffic of the
hour before: a gap the detector missed, a model that extrapolates a steep evening ramp, a
calibration that tightened on calm hours. Provisioning on it releases instances that the
traffic, if it has not really gone, needs within minutes (a scale-out then takes a cold
start). The guard floors what is provisioned at ``fraction`` × the largest observation of
the last ``lookback_seconds`` (gaps excluded), and lifts the floor only once the drop is
*confirmed*: the last ``confirm_seconds`` of observations all lie below it. Then the floor
follows the new level (``fraction`` × their largest), so a real decline is followed after
``confirm_seconds`` and a brief dip never is.

Pure: the floor is a function of the history the forecaster is given, applied inside
``forecast_peak``, the path both the operator's plan loop and the simulator call.
"""

from __future__ import annotations

import numpy as np

from sageserve.forecast.types import BoolArray, DropGuard, FloatArray


def drop_floor(values: FloatArray, gaps: BoolArray, step_seconds: float, guard: DropGuard) -> float:
    """The least that may be provisioned after ``values`` (see the module); 0 without
    observations or when the guard is off. ``gaps`` marks the points that are not demand."""
    if not guard.enabled or guard.fraction <= 0 or values.size == 0:
        return 0.0
    back = max(1, round(guard.lookback_seconds / step_seconds))
    confirm = max(1, round(guard.confirm_seconds / step_seconds))
    recent = values[-back:][~gaps[-back:]]
    if recent.size == 0:
        return 0.0
    floor = guard.fraction * float(np.max(recent))
    last = values[-confirm:][~gaps[-confirm:]]
    if last.size == confirm and float(np.max(last)) < floor:
        return guard.fraction * float(np.max(last))  # confirmed: follow the new level
    return floor
