"""Seeds of a benchmark run and the spread of its figures over them.

Why: a figure from one seed is one draw of the workload; the project reports a benchmark's
figures on several seeds, each seed's row and the spread (mean, lowest, highest), from one
command, so `--seed 0,1,2` means the same in every `sageserve bench` command that takes it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass


def seed_list(value: str, option: str = "--seed") -> tuple[int, ...]:
    """Comma-separated non-negative seeds (`--seed 0,1,2`), each once; refused naming the
    option and the fix."""
    parts = [x.strip() for x in value.split(",") if x.strip()]
    if not parts:
        raise ValueError(f"{option}: give one seed or several, comma-separated (e.g. 0,1,2)")
    seeds: list[int] = []
    for x in parts:
        try:
            seed = int(x)
        except ValueError:
            raise ValueError(
                f"{option}: comma-separated non-negative integers (e.g. 0,1,2), got {value!r}"
            ) from None
        if seed < 0:
            raise ValueError(f"{option}: seeds must be >= 0, got {seed}")
        if seed in seeds:
            raise ValueError(f"{option}: seed {seed} is listed twice; list each seed once")
        seeds.append(seed)
    return tuple(seeds)


@dataclass(frozen=True)
class Spread:
    """One figure over the seeds: its mean, lowest and highest value (finite values only)."""

    mean: float
    low: float
    high: float
    n: int

    def format(self, spec: str = ".2f", suffix: str = "") -> str:
        if self.n == 0:
            return "-"
        mean, low, high = (format(v, spec) + suffix for v in (self.mean, self.low, self.high))
        return mean if self.n == 1 else f"{mean} [{low}, {high}]"


def spread(values: Sequence[float]) -> Spread:
    """The spread of `values`; a value that is not finite (a ratio over zero) is left out."""
    vals = [v for v in values if math.isfinite(v)]
    if not vals:
        return Spread(math.nan, math.nan, math.nan, 0)
    return Spread(sum(vals) / len(vals), min(vals), max(vals), len(vals))
