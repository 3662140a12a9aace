"""The realised future as a forecast (the achievable reference): what it gives the plan, and
that only a simulation may ask for it."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from sageserve.api.scaling_policy import ScalingPolicySpec
from sageserve.controller.pace_loop import PacePass, PaceState
from sageserve.forecast.realised import REALISED, realised_forecast
from sageserve.forecast.types import ForecastSpec
from sageserve.plan.cycle import run_plan_cycle
from tests.test_parity_operator_simulator import NS, model_deployment

HOUR = ForecastSpec(step_seconds=600.0, lead_seconds=0.0, horizon_seconds=3600.0)


@pytest.mark.parametrize(
    ("future", "spec", "peak", "path"),
    [
        # six 10-minute steps cover the hour: the peak is the largest of them
        ([1.0, 5.0, 3.0, 2.0, 2.0, 1.0, 99.0], HOUR, 5.0, (1.0, 5.0, 3.0, 2.0, 2.0, 1.0)),
        # a lead of 20 minutes: steps 3..6 are the planned window, the path keeps all six
        ([9.0, 9.0, 3.0, 4.0, 2.0, 1.0], ForecastSpec(600.0, 1200.0, 3600.0), 4.0,
         (9.0, 9.0, 3.0, 4.0, 2.0, 1.0)),
        # the run ends 20 minutes in: what there is
        ([2.0, 7.0], HOUR, 7.0, (2.0, 7.0)),
    ],
)  # fmt: skip
def test_the_realised_forecast_is_the_largest_step_of_the_planned_window(
    future: list[float], spec: ForecastSpec, peak: float, path: tuple[float, ...]
) -> None:
    fc = realised_forecast(future, spec)
    assert (fc.peak_tps, fc.upper_tps, fc.path_tps) == (peak, peak, path)
    assert fc.method == REALISED and fc.reliable


def test_no_realised_load_after_now_holds_the_plan() -> None:
    assert not realised_forecast([], HOUR).reliable


def _spec(method: str) -> ScalingPolicySpec:
    return ScalingPolicySpec.model_validate(
        {"strategy": "lt-utilization-arima", "forecast": {"method": method}}
    )


def test_the_plan_cycle_uses_the_realised_future_it_is_given() -> None:
    md = model_deployment()
    key = (md.metadata.name, md.spec.regions[0].name)
    future = {key: [1000.0] * 60}
    cycle = run_plan_cycle([md], _spec("realised"), {}, {}, {}, realised_tps=future)
    assert cycle.forecasts[key].method == REALISED
    assert cycle.forecasts[key].peak_tps == 1000.0


def test_a_plan_cycle_without_the_future_refuses_the_realised_method() -> None:
    with pytest.raises(ValueError, match=r"spec\.forecast\.method: 'realised'"):
        run_plan_cycle([model_deployment()], _spec("realised"), {}, {}, {})


class _Kube:
    def __init__(self) -> None:
        self.events: list[Any] = []

    def __getattr__(self, name: str) -> Any:
        return lambda *args, **kwargs: self.events.append((name, args, kwargs))


def test_the_operator_refuses_the_realised_forecast_naming_the_field() -> None:
    body = {
        "apiVersion": "sageserve.io/v1alpha1",
        "kind": "ScalingPolicy",
        "metadata": {"name": "p", "namespace": NS, "generation": 1},
        "spec": {"strategy": "lt-utilization-arima", "forecast": {"method": "realised"}},
    }
    state = PaceState()
    step = PacePass(_Kube(), body, state, logging.getLogger("t"))  # type: ignore[arg-type]
    assert step.ready() is False
    ready = next(c for c in state.conditions if c["type"] == "Ready")
    assert ready["status"] == "False" and ready["reason"] == "UnsupportedForecast"
    assert "spec.forecast.method" in ready["message"] and "sageserve simulate" in ready["message"]
