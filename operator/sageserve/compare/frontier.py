"""The frontier of GPU-hours against SLO attainment, and a policy's cost at a target.

Why a frontier: each policy has knobs that trade GPU-hours for attainment (reactive its
scale-out threshold, the LT strategies the forecast quantile and LT-UA's valve, SageServe
§6.4). A fair comparison asks what each policy pays for the same SLO, so every policy is
summarised by the cheapest way it found to reach each attainment: the Pareto front of its
points (no other point of the policy costs no more and attains at least as much), and its
GPU-hours at a target read off that front. The earlier equal-SLO comparison did the same by
hand (docs/policy-comparison.md): linear between the two runs that bracket the target.

A point that misses a batch (NIW) deadline inside its horizon is kept off the front: its
GPU-hours were bought by leaving batch work unserved, so placing it on the frontier would
let a policy look cheaper for the same interactive attainment by breaking the other SLO
SageServe serves (§6.3, the 24 h deadline; §7 compares policies that meet both). Batch work
still queued with a deadline after the horizon is not a miss (`sim.deadlines`).

Pure functions only, so the rules (ties, a single point, a target out of reach) are tested
on tables.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum


@dataclass(frozen=True)
class Point:
    """One run: its label (the knob settings), GPU-hours and attainment (0..1), and how
    many batch deadlines inside the horizon it missed (served late or not served)."""

    label: str
    gpu_hours: float
    attainment: float
    niw_missed: int = 0


class TargetStatus(StrEnum):
    """How a policy's GPU-hours at the target were obtained."""

    EXACT = "exact"  # a point attains the target exactly
    INTERPOLATED = "interpolated"  # linear between the two front points that bracket it
    AT_MOST = "at-most"  # every point is above the target: the cheapest is an upper bound
    UNREACHABLE = "unreachable"  # no point reaches the target


@dataclass(frozen=True)
class AtTarget:
    """A policy's GPU-hours at the target attainment, and how they were read."""

    target: float
    status: TargetStatus
    gpu_hours: float | None
    below: Point | None = None  # the front point just under the target (interpolation)
    above: Point | None = None  # the cheapest front point at or above it
    best: Point | None = None  # the highest attainment reached (said when unreachable)

    def describe(self) -> str:
        """One line for a table: what the number is, or why there is none."""
        if self.status is TargetStatus.UNREACHABLE:
            if self.best is None:
                return "no point with an attainment"
            return (
                f"cannot reach {self.target:.2%}: best {self.best.attainment:.2%} "
                f"at {self.best.gpu_hours:,.1f} GPU-h ({self.best.label})"
            )
        if self.status is TargetStatus.AT_MOST:
            assert self.above is not None
            return (
                f"every point is above the target; the cheapest ({self.above.label}, "
                f"{self.above.attainment:.2%}) bounds it"
            )
        if self.status is TargetStatus.EXACT:
            assert self.above is not None
            return f"at {self.above.label}"
        assert self.below is not None and self.above is not None
        return f"between {self.below.label} and {self.above.label}"


def usable(points: Iterable[Point]) -> list[Point]:
    """Points with a finite attainment and GPU-hours (a run without requests of the tier
    has no attainment, and cannot be placed on the frontier)."""
    return [p for p in points if math.isfinite(p.attainment) and math.isfinite(p.gpu_hours)]


def meets_batch_deadlines(points: Iterable[Point]) -> list[Point]:
    """Points that missed no batch deadline inside their horizon: the only ones a frontier
    may hold (see the module doc)."""
    return [p for p in points if p.niw_missed <= 0]


def pareto_front(points: Iterable[Point]) -> list[Point]:
    """The Pareto front, cheapest first: attainment rises strictly along it.

    Only usable points that meet every batch deadline inside the horizon take part
    (`meets_batch_deadlines`).

    A point is kept when no other point costs no more GPU-hours and attains at least as
    much. Ties: of points with equal GPU-hours the most attaining is kept; of identical
    points the first by label (so the front does not depend on the order of the runs).
    """
    front: list[Point] = []
    best = -math.inf
    for p in sorted(
        meets_batch_deadlines(usable(points)), key=lambda p: (p.gpu_hours, -p.attainment, p.label)
    ):
        if p.attainment > best:
            front.append(p)
            best = p.attainment
    return front


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=0.0, abs_tol=1e-12)


def at_target(front: Sequence[Point], target: float) -> AtTarget:
    """GPU-hours needed for `target` attainment, read off a front from `pareto_front`.

    - a front point at the target: its GPU-hours (`exact`);
    - the target between two front points: linear between them (`interpolated`), the
      estimate the earlier hand-made comparison used; it assumes nothing better lies
      between two knob settings, so a finer grid can only lower it;
    - every point above the target: the cheapest point's GPU-hours, an upper bound
      (`at-most`): the sweep did not go cheap enough to find where the policy drops below;
    - no point reaching it: no number (`unreachable`), with the best attainment reached.
    """
    if not front:
        return AtTarget(target, TargetStatus.UNREACHABLE, None)
    reaching = [p for p in front if p.attainment >= target or _close(p.attainment, target)]
    if not reaching:
        return AtTarget(target, TargetStatus.UNREACHABLE, None, best=front[-1])
    above = reaching[0]
    if _close(above.attainment, target):
        return AtTarget(target, TargetStatus.EXACT, above.gpu_hours, above=above)
    under = [p for p in front if p.attainment < target and not _close(p.attainment, target)]
    if not under:
        return AtTarget(target, TargetStatus.AT_MOST, above.gpu_hours, above=above)
    below = under[-1]
    share = (target - below.attainment) / (above.attainment - below.attainment)
    gpu = below.gpu_hours + share * (above.gpu_hours - below.gpu_hours)
    return AtTarget(target, TargetStatus.INTERPOLATED, gpu, below=below, above=above)


@dataclass(frozen=True)
class Saving:
    """A policy's GPU-hours at the target relative to the baseline's (−0.1: 10 % fewer).

    `relation` says what is known: "=" (both read off their fronts), "≤" (the policy's
    figure is an upper bound, so the true ratio is at most this) or "≥" (the baseline's is).
    """

    ratio: float
    relation: str

    def __str__(self) -> str:
        value = f"{self.ratio:+.1%}"
        return value if self.relation == "=" else f"{self.relation} {value}"


def saving(policy: AtTarget, baseline: AtTarget) -> Saving | None:
    """`policy` against `baseline` at the target; None when either has no number, or when
    both are upper bounds (two bounds of the same direction say nothing about the ratio)."""
    if policy.gpu_hours is None or baseline.gpu_hours is None or baseline.gpu_hours <= 0:
        return None
    p_bound = policy.status is TargetStatus.AT_MOST
    b_bound = baseline.status is TargetStatus.AT_MOST
    if p_bound and b_bound:
        return None
    relation = "≤" if p_bound else "≥" if b_bound else "="
    return Saving(policy.gpu_hours / baseline.gpu_hours - 1.0, relation)
