"""The one percentile every printed latency figure uses: its definition, as a table."""

from __future__ import annotations

import math
import statistics

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from sageserve.core.percentile import percentile, percentiles

HUNDRED = [float(v) for v in range(1, 101)]


@pytest.mark.parametrize(
    ("values", "q", "expected"),
    [
        (HUNDRED, 99, 99.01),  # rank 0.99 × 99 = 98.01: between the 99th and the 100th
        (HUNDRED, 50, 50.5),
        (HUNDRED, 0, 1.0),
        (HUNDRED, 100, 100.0),
        ([3.0], 99, 3.0),
        ([1.0, 2.0, 3.0, 4.0], 95, 3.85),
        # an unfinished request (inf) counts against a percentile whose rank touches it
        ([*HUNDRED[:99], math.inf], 99, math.inf),
        ([*HUNDRED[:99], math.inf], 98, 98.02),
        ([math.inf, math.inf], 50, math.inf),
    ],
)
def test_percentile_interpolates_between_the_closest_ranks(
    values: list[float], q: float, expected: float
) -> None:
    assert percentile(values, q) == pytest.approx(expected)


def test_no_values_give_nan_for_every_percentile_asked() -> None:
    assert all(math.isnan(v) for v in percentiles([], [50, 95, 99]))


@pytest.mark.parametrize("q", [-1.0, 100.5, 0.99e3])
def test_a_percentile_outside_0_to_100_is_refused_with_an_example(q: float) -> None:
    with pytest.raises(ValueError, match=r"outside 0–100; give e\.g\. 99 for P99"):
        percentile(HUNDRED, q)


def test_nan_among_the_values_is_refused_rather_than_spread_into_the_figure() -> None:
    with pytest.raises(ValueError, match="NaN"):
        percentile([1.0, math.nan, math.inf], 50)


@given(
    st.lists(st.floats(-1e6, 1e6, allow_nan=False), min_size=2, max_size=60),
    st.integers(1, 99),
)
def test_agrees_with_the_standard_library_inclusive_method(values: list[float], q: int) -> None:
    cuts = statistics.quantiles(values, n=100, method="inclusive")
    assert percentile(values, q) == pytest.approx(cuts[q - 1], rel=1e-9, abs=1e-6)
    assert percentile(np.asarray(values), q) == percentile(values, q)
