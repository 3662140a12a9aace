"""The frontier and the reading at the target, on tables: dominated points, ties, a single
point, a target out of reach, a target every point exceeds."""

from __future__ import annotations

import itertools
import math

import pytest

from sageserve.compare.frontier import (
    AtTarget,
    Point,
    TargetStatus,
    at_target,
    meets_batch_deadlines,
    pareto_front,
    saving,
)


def pts(*rows: tuple[str, float, float]) -> list[Point]:
    return [Point(label, gpu, att) for label, gpu, att in rows]


def labels(points: list[Point]) -> list[str]:
    return [p.label for p in points]


@pytest.mark.parametrize(
    ("rows", "front"),
    [
        # cheapest first, attainment rising: all on the front
        ([("a", 100, 0.90), ("b", 120, 0.95), ("c", 150, 0.99)], ["a", "b", "c"]),
        # b costs more than c and attains less: dominated
        ([("a", 100, 0.90), ("b", 160, 0.95), ("c", 150, 0.99)], ["a", "c"]),
        # the order of the runs does not matter
        ([("c", 150, 0.99), ("a", 100, 0.90), ("b", 120, 0.95)], ["a", "b", "c"]),
        # equal GPU-hours: the one attaining more
        ([("a", 100, 0.90), ("b", 100, 0.93)], ["b"]),
        # equal attainment: the cheaper
        ([("a", 110, 0.95), ("b", 100, 0.95)], ["b"]),
        # identical points: the first by label, once
        ([("z", 100, 0.95), ("m", 100, 0.95)], ["m"]),
        # a single point is its own front
        ([("only", 100, 0.5)], ["only"]),
        # a point without attainment (no request of the tier) is left out
        ([("a", 100, math.nan), ("b", 120, 0.95)], ["b"]),
        ([], []),
    ],
)
def test_pareto_front(rows: list[tuple[str, float, float]], front: list[str]) -> None:
    assert labels(pareto_front(pts(*rows))) == front


def test_the_front_rises_strictly_in_both_gpu_hours_and_attainment() -> None:
    rows = [(f"p{i}", 100 + (i * 37) % 50, 0.8 + ((i * 13) % 20) / 100) for i in range(40)]
    front = pareto_front(pts(*rows))
    for lo, hi in itertools.pairwise(front):
        assert lo.gpu_hours < hi.gpu_hours and lo.attainment < hi.attainment
    for p in pts(*rows):  # every point is matched or beaten by a front point
        assert any(f.gpu_hours <= p.gpu_hours and f.attainment >= p.attainment for f in front)


FRONT = pts(("0.8", 100.0, 0.90), ("0.6", 120.0, 0.94), ("0.5", 140.0, 0.96))


@pytest.mark.parametrize(
    ("target", "status", "gpu", "below", "above"),
    [
        (0.95, TargetStatus.INTERPOLATED, 130.0, "0.6", "0.5"),  # halfway between 0.94 and 0.96
        (0.92, TargetStatus.INTERPOLATED, 110.0, "0.8", "0.6"),
        (0.94, TargetStatus.EXACT, 120.0, None, "0.6"),  # on a point
        (0.96, TargetStatus.EXACT, 140.0, None, "0.5"),
        (0.85, TargetStatus.AT_MOST, 100.0, None, "0.8"),  # every point above: a bound
        (0.97, TargetStatus.UNREACHABLE, None, None, None),
    ],
)
def test_at_target(
    target: float, status: TargetStatus, gpu: float | None, below: str | None, above: str | None
) -> None:
    at = at_target(FRONT, target)
    assert at.status is status
    assert at.gpu_hours == (pytest.approx(gpu) if gpu is not None else None)
    assert (at.below.label if at.below else None) == below
    assert (at.above.label if at.above else None) == above


def test_unreachable_says_the_best_attainment_and_its_cost() -> None:
    at = at_target(FRONT, 0.97)
    assert at.best == FRONT[-1]
    assert "cannot reach 97.00%: best 96.00% at 140.0 GPU-h (0.5)" in at.describe()


@pytest.mark.parametrize(
    ("target", "status", "gpu"),
    [
        (0.90, TargetStatus.EXACT, 100.0),
        (0.80, TargetStatus.AT_MOST, 100.0),
        (0.95, TargetStatus.UNREACHABLE, None),
    ],
)
def test_a_single_point(target: float, status: TargetStatus, gpu: float | None) -> None:
    at = at_target(pts(("only", 100.0, 0.90)), target)
    assert (at.status, at.gpu_hours) == (status, gpu)


def test_no_point_is_unreachable_without_a_best() -> None:
    at = at_target([], 0.95)
    assert at.status is TargetStatus.UNREACHABLE and at.best is None
    assert at.describe() == "no point with an attainment"


def test_interpolation_reads_the_front_not_the_dominated_points() -> None:
    # b (160 GPU-h, 0.95) is dominated by c; the reading at 0.95 is between a and c
    front = pareto_front(pts(("a", 100, 0.90), ("b", 160, 0.95), ("c", 150, 1.0)))
    at = at_target(front, 0.95)
    assert at.status is TargetStatus.INTERPOLATED
    assert at.gpu_hours == pytest.approx(125.0)


def exact(gpu: float) -> AtTarget:
    return AtTarget(0.95, TargetStatus.INTERPOLATED, gpu)


def bound(gpu: float) -> AtTarget:
    return AtTarget(0.95, TargetStatus.AT_MOST, gpu)


@pytest.mark.parametrize(
    ("policy", "baseline", "text"),
    [
        (exact(90.0), exact(100.0), "-10.0%"),
        (bound(90.0), exact(100.0), "≤ -10.0%"),  # the policy may need less still
        (exact(110.0), bound(100.0), "≥ +10.0%"),  # the baseline may need less
    ],
)
def test_saving(policy: AtTarget, baseline: AtTarget, text: str) -> None:
    s = saving(policy, baseline)
    assert s is not None and str(s) == text


def test_no_saving_between_two_bounds_or_without_a_number() -> None:
    assert saving(bound(90.0), bound(100.0)) is None
    assert saving(AtTarget(0.95, TargetStatus.UNREACHABLE, None), exact(100.0)) is None


@pytest.mark.parametrize(
    ("rows", "front"),
    [
        # the cheapest point reached its attainment by missing batch deadlines: off the front,
        # and the next cheapest that meets them takes its place
        ([("cheap", 90, 0.97, 12), ("a", 100, 0.95, 0), ("b", 120, 0.99, 0)], ["a", "b"]),
        # a missing point no longer dominates: b, which it beat, is back on the front
        ([("a", 100, 0.90, 0), ("m", 110, 0.99, 1), ("b", 150, 0.95, 0)], ["a", "b"]),
        # served late counts as much as unserved: one miss is enough
        ([("m", 100, 0.99, 1)], []),
        # no misses: as before
        ([("a", 100, 0.90, 0), ("b", 120, 0.95, 0)], ["a", "b"]),
    ],
)
def test_a_point_that_misses_niw_deadlines_is_kept_off_the_frontier(
    rows: list[tuple[str, float, float, int]], front: list[str]
) -> None:
    points = [Point(label, gpu, att, missed) for label, gpu, att, missed in rows]
    assert labels(pareto_front(points)) == front
    assert labels(meets_batch_deadlines(points)) == [r[0] for r in rows if r[3] == 0]


def test_the_target_is_read_only_off_points_that_meet_niw_deadlines() -> None:
    points = [Point("cheap", 80, 0.96, 3), Point("a", 100, 0.90, 0), Point("b", 140, 0.98, 0)]
    at = at_target(pareto_front(points), 0.95)
    assert at.status is TargetStatus.INTERPOLATED
    assert at.gpu_hours == pytest.approx(125.0)  # between a and b, not "cheap"'s 80
