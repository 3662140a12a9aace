"""How well the gap detector finds partial collection gaps it was not tuned on.

A detector tuned to the gaps of the bundled traces (SageServe §6.3's predictor trained on
them) says little about a user's series. This harness measures it on gaps whose places are
known: it takes a recorded series, drops a random stretch of points (10 minutes to two hours
at random places, ``GAP_POINTS``) to 0–30 % of their level (a collector that lost part of its
targets, ``DEPTH``), over several seeds, and counts the points the detector flags
(``forecast.gaps.gap_mask``, the one the forecaster and the backtest use):

- recall: injected points flagged / injected points;
- precision: injected points flagged / points flagged that were not already missing (a flag
  on a point that was not injected counts against it, even where the recording may hold a
  real gap of its own).

Pure and seeded: the same series, rule and seeds give the same figures.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from sageserve.forecast.gaps import gap_mask
from sageserve.forecast.types import BoolArray, FloatArray, GapRule

#: Injected gap lengths, in points (10-minute steps: 10 minutes to two hours).
GAP_POINTS: tuple[int, int] = (1, 12)
#: Share of the level an injected gap keeps.
DEPTH: tuple[float, float] = (0.0, 0.3)
#: Injected gaps per series and seed.
GAPS_PER_SERIES = 20
SEEDS: tuple[int, ...] = (0, 1, 2, 3, 4)


@dataclass(frozen=True)
class Detection:
    """Point-level detection of injected gaps, summed over seeds."""

    injected: int
    found: int
    flagged: int
    """Points flagged that were observed in the recording (not already NaN)."""
    gaps: int
    gaps_found: int
    """Injected gaps with at least half their points flagged."""

    @property
    def recall(self) -> float:
        return self.found / self.injected if self.injected else math.nan

    @property
    def precision(self) -> float:
        return self.found / self.flagged if self.flagged else math.nan

    @property
    def f1(self) -> float:
        p, r = self.precision, self.recall
        return 2 * p * r / (p + r) if p + r > 0 else 0.0


def inject_gaps(
    series: FloatArray,
    seed: int,
    count: int = GAPS_PER_SERIES,
    points: tuple[int, int] = GAP_POINTS,
    depth: tuple[float, float] = DEPTH,
    spacing: int = 12,
) -> tuple[FloatArray, BoolArray]:
    """``series`` with ``count`` partial gaps at random places (at least ``spacing`` points
    apart, on observed points only) and the mask of the injected points."""
    rng = np.random.default_rng(seed)
    out = series.copy()
    truth: BoolArray = np.zeros(series.size, dtype=np.bool_)
    busy: BoolArray = ~np.isfinite(series)
    for _ in range(count):
        for _try in range(50):
            length = int(rng.integers(points[0], points[1] + 1))
            start = int(rng.integers(0, max(1, series.size - length)))
            lo, hi = max(0, start - spacing), min(series.size, start + length + spacing)
            if busy[lo:hi].any():
                continue
            out[start : start + length] *= rng.uniform(*depth)
            truth[start : start + length] = True
            busy[start : start + length] = True
            break
    return out, truth


def detect(
    series: FloatArray,
    rule: GapRule,
    step_seconds: float = 600.0,
    seeds: Sequence[int] = SEEDS,
    count: int = GAPS_PER_SERIES,
) -> Detection:
    """Inject gaps into ``series`` once per seed and score ``rule``'s detection of them."""
    injected = found = flagged = gaps = gaps_found = 0
    missing = ~np.isfinite(series)
    for seed in seeds:
        gappy, truth = inject_gaps(series, seed, count)
        mask = gap_mask(gappy, step_seconds, rule, trailing=False) & ~missing
        injected += int(truth.sum())
        found += int((mask & truth).sum())
        flagged += int(mask.sum())
        for start, end in _spans(truth):
            gaps += 1
            gaps_found += int(2 * mask[start:end].sum() >= end - start)
    return Detection(injected, found, flagged, gaps, gaps_found)


def _spans(flags: BoolArray) -> list[tuple[int, int]]:
    edges = np.diff(np.concatenate([[0], flags.astype(np.int8), [0]]))
    return list(
        zip(
            (int(v) for v in np.flatnonzero(edges == 1)),
            (int(v) for v in np.flatnonzero(edges == -1)),
            strict=True,
        )
    )


#: Detector thresholds a leave-one-trace-out report chooses among (drop factor, σ).
RULES: tuple[GapRule, ...] = tuple(
    GapRule(drop_factor=d, min_sigmas=s) for d in (2.0, 2.5, 3.0) for s in (2.0, 3.0, 4.0)
)


def choose_rule(
    series: Mapping[str, FloatArray],
    rules: Sequence[GapRule] = RULES,
    step_seconds: float = 600.0,
    seeds: Sequence[int] = SEEDS,
) -> tuple[GapRule, Detection]:
    """The rule with the highest F1 on ``series`` pooled (ties: the first, the least eager)."""
    best: tuple[GapRule, Detection] | None = None
    for rule in rules:
        scores = [detect(y, rule, step_seconds, seeds) for y in series.values()]
        pooled = Detection(*(sum(getattr(d, f) for d in scores) for f in _FIELDS))
        if best is None or pooled.f1 > best[1].f1 + 1e-12:
            best = (rule, pooled)
    if best is None:
        raise ValueError("rules: no detector rule to choose from")
    return best


_FIELDS = ("injected", "found", "flagged", "gaps", "gaps_found")
