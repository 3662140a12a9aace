"""The realised future as a forecast: the achievable reference of a simulation.

Why: the lower bound (`sim.lower_bound`) is a fluid LP no scaler can reach, so a gap to it
mixes what forecasting loses with what pacing, start-up delays and instance granularity
lose. LT-UA planning on the load that actually came (exactly what its forecaster would have
been asked: each step's interactive tokens/s over [now + lead, now + horizon]) keeps every
other rule of the run and removes only the forecast's error; what is left to the bound is
not the forecaster's. Only a simulation knows the future, so the operator refuses the
method (`REALISED_ONLY_IN_SIMULATION`).
"""

from __future__ import annotations

from collections.abc import Sequence

from sageserve.forecast.types import Forecast, ForecastSpec

#: `spec.forecast.method` of the realised future.
REALISED = "realised"

REALISED_ONLY_IN_SIMULATION = (
    "spec.forecast.method: 'realised' plans on the load that will arrive, which only a "
    "simulation knows (sageserve simulate --reference); the operator cannot run it, choose "
    "a forecaster such as arima or ensemble"
)


def realised_forecast(future_tps: Sequence[float], spec: ForecastSpec) -> Forecast:
    """A forecast whose path is `future_tps` (one mean per `spec.step_seconds` step after
    now) and whose peak and upper quantile are its largest value over the steps covering
    [now + lead, now + horizon]. Unreliable (the plan then holds, as after a failed fit)
    when the future holds no step of that window (the run ends before it)."""
    first, last = spec.steps()
    path = tuple(max(0.0, float(v)) for v in future_tps[:last])
    window = path[first - 1 : last]
    if not window:
        return Forecast(
            0.0, 0.0, spec.quantile, "none", REALISED, "no realised load after now", False
        )
    peak = max(window)
    return Forecast(
        peak_tps=peak,
        upper_tps=peak,
        quantile=spec.quantile,
        method=REALISED,
        requested=REALISED,
        path_tps=path,
        notes=("the realised future (simulation only)",),
    )
