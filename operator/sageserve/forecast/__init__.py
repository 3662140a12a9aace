"""Forecasts of tokens/s per (model, region): ARIMA-family models and baselines behind one
interface, a robust entry point that never raises, the batch buffer β, and backtesting."""

from sageserve.forecast.api import batch_buffer_tps, forecast_peak
from sageserve.forecast.methods import FORECASTERS, get_forecaster
from sageserve.forecast.types import Forecast, Forecaster, ForecastSpec

__all__ = [
    "FORECASTERS",
    "Forecast",
    "ForecastSpec",
    "Forecaster",
    "batch_buffer_tps",
    "forecast_peak",
    "get_forecaster",
]
