"""Simulated time for the twin: wall time, optionally accelerated.

Why a clock object instead of `time.time()`: tests of the closed loop need hours of trace
in minutes, and unit tests need time that moves only when they say so. The twin reads time
only through `Clock.now()`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Protocol


class Clock(Protocol):
    """Simulated seconds (trace time) now."""

    def now(self) -> float: ...


class AcceleratedClock:
    """Simulated time = `start` + `speed` × wall seconds since creation.

    Changing the speed keeps time continuous (no jump), so a test can run the quiet part
    of a trace fast and the interesting part at real pace.
    """

    def __init__(
        self,
        speed: float = 1.0,
        start: float = 0.0,
        wall: Callable[[], float] = time.monotonic,
    ) -> None:
        if speed <= 0:
            raise ValueError(f"speed must be positive, got {speed}")
        self._wall = wall
        self._lock = threading.Lock()
        self._speed = speed
        self._origin_wall = wall()
        self._origin_sim = start

    @property
    def speed(self) -> float:
        return self._speed

    def now(self) -> float:
        with self._lock:
            return self._origin_sim + (self._wall() - self._origin_wall) * self._speed

    def set_speed(self, speed: float) -> None:
        """Run `speed` times faster than wall time from now on."""
        if speed <= 0:
            raise ValueError(f"speed must be positive, got {speed}")
        with self._lock:
            wall = self._wall()
            self._origin_sim += (wall - self._origin_wall) * self._speed
            self._origin_wall = wall
            self._speed = speed


class ManualClock:
    """Time that moves only when told (unit tests, backfill)."""

    def __init__(self, start: float = 0.0) -> None:
        self.t = start

    def now(self) -> float:
        return self.t

    def advance(self, seconds: float) -> float:
        self.t += seconds
        return self.t
