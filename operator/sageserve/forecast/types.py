"""Value types of the forecasting layer: what is asked, what comes back, the strategy interface.

Units: every series is **tokens per second** per (model, region) (paper ambiguity #2 settled:
the planner's ρ and θ are both tokens/s), one value per window of ``step_seconds``. A value of
NaN is a *gap* (the collector saw nothing: missing data); 0 is a real, observed zero load.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]


@dataclass(frozen=True)
class GapRule:
    """When a recorded drop is a *collection gap* (missing data) rather than a lull in demand.

    A partial gap is a run (at most ``max_seconds``) entered by a step of at least
    ``drop_factor`` below the level, whose points all stay that far below the level on *both*
    sides (the rate comes back), where that level is steady
    (the drop is at least ``min_sigmas`` robust standard deviations of the surrounding log
    values) and no other drop crowds the context (a series full of dips is sparse, not
    gappy). Exact zeros in a busy series qualify; NaN is a gap already. See
    ``sageserve.forecast.gaps``.
    """

    drop_factor: float = 2.5
    """A gap keeps at most 40 % of the level (partial collection keeps 0–30 % of it); demand
    does not fall 2.5× within a step and come back."""
    max_seconds: float = 7200.0
    """Longest partial gap (two hours); a longer drop is read as a real lull or decline."""
    trailing_seconds: float = 1200.0
    """Longest drop at the very end of the history still treated as a gap: the rate has not
    come back yet, so after two 10-minute points it counts as demand (the drop guard,
    ``forecast.guard``, still keeps the next hour above half the recent peak until the drop
    is confirmed)."""
    context_seconds: float = 3600.0
    """The level on each side is the median of this much history (an hour)."""
    min_context: int = 3
    """Fewest observed points a side needs to define its level."""
    max_neighbours: int = 1
    """Other drops allowed in the context; more means a sparse series whose dips are real."""
    min_sigmas: float = 3.0
    """The drop must exceed this many robust (MAD) standard deviations of the context's log."""
    spike_factor: float = 100.0
    """A short, isolated point this many times *above* the level on both sides (and steady
    around it, as for drops) is a recording artefact, not demand: two orders of magnitude,
    what a target scraped twice, a counter read across a reset or a broken exporter gives,
    and beyond what a burst of real users does within ten minutes. 0 disables it."""
    floor_fraction: float = 0.5
    """No forecast below this share of the recent level when a gap is within the model's reach
    (no forecast provisions less than half of the recent level because of a gap)."""
    enabled: bool = True


@dataclass(frozen=True)
class Conformal:
    """How the provisioned quantile is calibrated (``forecast.conformal``)."""

    window_hours: int = 72
    """Errors of the last this many hourly decisions set the quantile (three days: recent
    enough to follow a change of burstiness, long enough for a q0.85 quantile)."""
    gamma: float = 0.02
    """Adaptive step per hour (0: plain split conformal on the window)."""
    warmup_hours: int = 96
    """Errors before the window that the adaptive level is replayed over first."""
    min_errors: int = 8
    """Fewer errors than this: no conformal quantile (the caller uses a Gaussian one)."""
    enabled: bool = True

    def __post_init__(self) -> None:
        if self.window_hours < 1:
            raise ValueError(f"conformal.window_hours must be ≥ 1, got {self.window_hours}")
        if not 0.0 <= self.gamma < 1.0:
            raise ValueError(f"conformal.gamma must be in [0, 1), got {self.gamma}")

    @property
    def origins(self) -> int:
        """Past origins the forecaster replays for it."""
        return self.window_hours + self.warmup_hours


@dataclass(frozen=True)
class DropGuard:
    """The drop guard's settings (``forecast.guard``)."""

    fraction: float = 0.5
    """The floor is this share of the recent peak."""
    lookback_seconds: float = 3 * 3600.0
    """The recent peak is the largest observation of this much history (three hours)."""
    confirm_seconds: float = 1800.0
    """A drop is confirmed once every observation of this much history lies below the floor."""
    enabled: bool = True

    def __post_init__(self) -> None:
        if not 0.0 <= self.fraction <= 1.0:
            raise ValueError(f"guard.fraction must be in [0, 1], got {self.fraction}")
        if self.confirm_seconds > self.lookback_seconds:
            raise ValueError(
                f"guard.confirm_seconds ({self.confirm_seconds:g}) must not exceed "
                f"guard.lookback_seconds ({self.lookback_seconds:g}): a drop is confirmed "
                "within the hours the peak is taken from"
            )


@dataclass(frozen=True)
class ForecastSpec:
    """What to forecast.

    The history ends at "now" (the last value is the window [now − step, now)). The answer is
    the peak over the windows that intersect [now + lead, now + horizon]; the paper plans on
    the max over the next hour, the reference repo on [t + 20 min, t + 60 min].
    """

    step_seconds: float = 600.0
    lead_seconds: float = 0.0
    horizon_seconds: float = 3600.0
    quantile: float = 0.85
    """Upper quantile of the peak that capacity is provisioned for (coverage target)."""
    min_history_seconds: float = 6 * 3600.0
    """Less history than this makes the model-based methods fall back to a baseline."""
    max_gap_fraction: float = 0.2
    """A fit window with more gaps than this falls back to a baseline."""
    gaps: GapRule = field(default_factory=GapRule)
    """Partial collection gaps: detected, treated as missing, floored (``forecast.gaps``)."""
    conformal: Conformal = field(default_factory=Conformal)
    """How the provisioned quantile is calibrated online (``forecast.conformal``)."""
    guard: DropGuard = field(default_factory=DropGuard)
    """The floor under what is provisioned after a drop (``forecast.guard``)."""
    arima_order: tuple[int, int, int] | None = None
    """``arima-classic``'s (p, d, q); None: chosen by AIC (SageServe §6.3)."""

    def steps(self) -> tuple[int, int]:
        """1-based first and last forecast step covering [now + lead, now + horizon]."""
        first = int(self.lead_seconds // self.step_seconds) + 1
        last = max(first, int(np.ceil(self.horizon_seconds / self.step_seconds - 1e-9)))
        return first, last


@dataclass(frozen=True)
class Forecast:
    """Forecast of one series. ``method`` is what produced the numbers; when it differs from
    ``requested``, ``fallback_reason`` says why (surfaced in ScalingPolicy status)."""

    peak_tps: float
    """Point forecast of the peak over [now + lead, now + horizon]."""
    upper_tps: float
    """Upper ``quantile`` of that peak: what to provision for."""
    quantile: float
    method: str
    requested: str
    fallback_reason: str | None = None
    reliable: bool = True
    """False when there was no usable observation at all (the caller must hold sizes)."""
    path_tps: tuple[float, ...] = field(default_factory=tuple)
    """Point forecast per step 1..last (for the plan's per-window ρ)."""
    notes: tuple[str, ...] = field(default_factory=tuple)
    uppers: tuple[tuple[float, float], ...] = field(default_factory=tuple)
    """(quantile, upper tokens/s) for each extra quantile asked of ``forecast_peak`` (the
    backtest's quantile grid: one fit, every quantile)."""
    gaps: int = 0
    """History points treated as missing: NaN, ±Inf, negative, partial gaps or absurd spikes
    (``forecast.gaps``)."""
    floored: bool = False
    """True when a floor raised it: the gap floor (``GapRule.floor_fraction`` of the recent
    level) or the drop guard (``DropGuard``)."""
    floor_tps: float = 0.0
    """The floor under what is provisioned (the larger of the gap floor and the guard's)."""
    calibration: tuple[float, ...] = field(default_factory=tuple)
    """The conformal correction's input: log errors of the model's past hourly forecasts,
    oldest first (NaN: a gap hour); empty when the upper came from elsewhere."""
    model_peak_log: float = float("nan")
    """log(1 + the model's peak) before any correction."""
    point_log: float = float("nan")
    """log(1 + the point forecast) before any floor."""


class PeakModel(Protocol):
    """A fitted model that predicts the peak (log scale) from any origin of its history."""

    def path(self, origin: int) -> FloatArray:
        """Log-scale point path for steps 1..last after ``origin`` (uses x[:origin] only)."""
        ...

    def paths(self, origins: IntArray) -> FloatArray:
        """``path`` for many origins at once, shape (len(origins), last)."""
        ...


class Forecaster(Protocol):
    """A forecasting strategy, chosen by name from the registry (like cluster-autoscaler's
    expanders). ``fit`` gets the log-transformed, gap-filled history and may raise: the
    robust wrapper in ``forecast.api`` turns any failure into a named fallback."""

    @property
    def name(self) -> str: ...

    def min_points(self, spec: ForecastSpec) -> int:
        """Fewest history points this method needs."""
        ...

    def fit(self, x: FloatArray, spec: ForecastSpec) -> PeakModel:
        """Fit on ``x`` (log(1 + tokens/s), no NaN)."""
        ...
