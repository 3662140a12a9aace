"""`arima-classic` chooses its order by AIC as the paper does, and honours a fixed one."""

from __future__ import annotations

import numpy as np
import pytest

from sageserve.api.scaling_policy import ScalingPolicySpec
from sageserve.forecast.api import forecast_peak
from sageserve.forecast.methods import AIC_ORDERS, best_arima
from sageserve.plan.cycle import forecast_spec


def _ar2(n: int = 150, seed: int = 7) -> np.ndarray:
    """A random walk whose steps follow AR(2): ARIMA(2, 1, 0) is the true order."""
    rng = np.random.default_rng(seed)
    e = rng.normal(0, 1, n)
    dx = np.zeros(n)
    for t in range(2, n):
        dx[t] = 0.6 * dx[t - 1] - 0.3 * dx[t - 2] + e[t]
    return 100 + np.cumsum(dx)


@pytest.mark.slow
def test_the_search_tries_p_and_q_up_to_3_and_keeps_the_least_aic() -> None:
    assert len(AIC_ORDERS) == 16 and max(p for p, _, _ in AIC_ORDERS) == 3
    x = _ar2()
    best = best_arima(x, AIC_ORDERS)
    fixed = best_arima(x, [(0, 1, 0)])
    assert best.aic <= fixed.aic
    assert best.aic <= best_arima(x, [(2, 1, 0)]).aic + 1e-9
    p, _, q = best.model.order
    assert (p, q) != (0, 0)  # the AR structure is found


def test_the_policys_order_reaches_the_forecaster() -> None:
    fixed = ScalingPolicySpec.model_validate({"forecast": {"order": {"p": 1, "d": 1, "q": 0}}})
    assert forecast_spec(fixed).arima_order == (1, 1, 0)
    assert forecast_spec(ScalingPolicySpec.model_validate({})).arima_order is None
    x = list(np.exp(np.clip(_ar2(200) / 20, 0, 10)))
    spec = forecast_spec(
        ScalingPolicySpec.model_validate(
            {
                "forecast": {
                    "granularitySeconds": 600,
                    "trainingWindowSeconds": 6 * 3600,
                    "method": "arima-classic",
                    "order": {"p": 1, "d": 1, "q": 0},
                }
            }
        )
    )
    fc = forecast_peak(x, spec, method="arima-classic")
    assert fc.method == "arima-classic" and fc.fallback_reason is None
