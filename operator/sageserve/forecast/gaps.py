"""Collection gaps are missing data, never demand.

SageServe's load predictor (SageServe §6.3) forecasts the next hour's peak from the recorded
tokens/s. A recorder does not only lose whole windows (NaN, or exact zeros in ServeGen): when
some scrape targets are down, or a collector drops part of a window, the recorded rate falls
by an order of magnitude for one or two points and comes back. Read as demand, such a point
is a lull; the model learns it, its calibration errors widen, and a gap at the end of the
history pulls the next hour's forecast (and so the fleet) down. These pure functions tell
such points apart so that the forecaster treats them as missing and the backtest does not
score them:

- ``partial_gaps``: the points of short, deep, isolated drops (``GapRule``);
- ``spikes``: the mirror image, short isolated points two orders of magnitude *above* a
  steady level (a target scraped twice, a broken exporter): not demand to provision for;
- ``gap_mask``: those plus the points already missing (NaN, ±Inf, negative counter resets);
- ``recent_level``: the level a gap must not pull a forecast below (``floor_fraction`` of it).

Why these tests: a drop of ``drop_factor`` (10×) below the median on *both* sides means the
rate came back; the robust-σ test (MAD of the log context) keeps a sparse, bursty series,
whose dips are real, from being read as gappy; so does the crowding test (more short drops in
one context than a gap run may hold means the series is sparse, not gappy). At the end of
the history the rate has not come back yet: a trailing drop of at most ``max_seconds`` is
treated as a gap (``trailing=True``); if it lasts longer it is a real decline and counts again.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from dataclasses import replace

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from sageserve.forecast.types import BoolArray, FloatArray, GapRule

#: 1.4826 × MAD estimates σ for Gaussian data.
MAD_TO_SIGMA = 1.4826
#: Zeros enter the log context as this fraction of the level (log(0) is −∞).
LOG_FLOOR = 1e-3


def gap_points(rule: GapRule, step_seconds: float) -> tuple[int, int]:
    """(longest partial gap, context per side) in points of ``step_seconds``."""
    width = max(1, round(rule.max_seconds / step_seconds))
    context = max(rule.min_context, math.ceil(rule.context_seconds / step_seconds - 1e-9))
    return width, context


def partial_gaps(
    series: Sequence[float] | FloatArray,
    step_seconds: float = 600.0,
    rule: GapRule | None = None,
    trailing: bool = True,
) -> BoolArray:
    """Mask of the points of ``series`` that are partial collection gaps (see the module).

    A point is a candidate when it is observed and at least ``drop_factor`` below the median
    of each side's ``context`` (a side with fewer than ``min_context`` observations, such as
    the end of the history or the edge of a NaN run, does not vote) and the drop is at least
    ``min_sigmas`` robust σ of the context's log. Consecutive candidates (NaN in between do not
    break a run) form a run; a run is a gap when it has at most ``max_seconds`` of points and
    no more than ``max_neighbours`` other drops (runs deep by the level test alone) start in
    its context: one other gap nearby is a gappy recorder, more is a sparse series whose dips
    are real. ``trailing=False`` does not flag a run
    whose later side is cut by the end of the series (the backtest, which sees the future,
    judges interior points only there; the forecaster, which does not, keeps the default).
    """
    rule = rule or GapRule()
    values = np.asarray(series, dtype=np.float64)
    n = values.size
    out: BoolArray = np.zeros(n, dtype=np.bool_)
    width, context = gap_points(rule, step_seconds)
    if not rule.enabled or n < rule.min_context + 1:
        return out
    observed = np.isfinite(values) & (values >= 0)
    clean = np.where(observed, values, np.nan)
    pad = np.concatenate([np.full(context, np.nan), clean, np.full(context, np.nan)])
    windows = sliding_window_view(pad, context)
    before, after = windows[:n], windows[context + 1 : context + 1 + n]
    # Cheap necessary condition first (a median is at most its side's max): only the few
    # points this leaves need the medians, so a long 1-minute history stays fast.
    highs = sliding_window_view(np.nan_to_num(pad, nan=-np.inf), context).max(axis=1)
    around = np.maximum(highs[:n], highs[context + 1 : context + 1 + n])
    with np.errstate(invalid="ignore"):
        maybe = np.flatnonzero(observed & (clean * rule.drop_factor <= around))
    level = np.full(n, np.nan)
    votes_after = np.zeros(n, dtype=np.bool_)
    if maybe.size:
        sides = before[maybe], after[maybe]
        votes_before = np.isfinite(sides[0]).sum(axis=1) >= rule.min_context
        votes_after[maybe] = np.isfinite(sides[1]).sum(axis=1) >= rule.min_context
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN sides: no vote
            med_before = np.nanmedian(sides[0], axis=1)
            med_after = np.nanmedian(sides[1], axis=1)
        level[maybe] = np.fmin(
            np.where(votes_before, med_before, np.nan),
            np.where(votes_after[maybe], med_after, np.nan),
        )
    with np.errstate(invalid="ignore"):
        deep = observed & (level > 0) & (clean * rule.drop_factor <= level)
    ratio = deep.copy()  # deep by the level test alone: what crowds a context
    for i in np.flatnonzero(deep):
        both = np.concatenate([before[i], after[i]])
        both = both[np.isfinite(both)]
        logs = np.log(np.maximum(both, level[i] * LOG_FLOOR))
        centre = float(np.median(logs))
        sigma = MAD_TO_SIGMA * float(np.median(np.abs(logs - centre)))
        drop = math.log(level[i]) - math.log(max(float(clean[i]), level[i] * LOG_FLOOR))
        deep[i] = drop >= rule.min_sigmas * sigma
    events = np.zeros(n + 1, dtype=np.int64)  # events[k]: drop runs starting before k
    for first, _ in _runs(ratio, observed):
        events[first + 1] += 1
    events = np.cumsum(events)
    for start, end in _runs(deep, observed):
        count = int(deep[start : end + 1].sum())
        if count > width:
            continue  # too long: a real lull or decline
        if not trailing and end + context >= n and not votes_after[end]:
            continue  # cut by the end of the series: has not come back yet
        lo, hi = max(0, start - context), min(n, end + context + 1)
        if int(events[hi] - events[lo]) - 1 > rule.max_neighbours:
            continue  # crowded by other drops: a sparse series, not a gap
        out[start : end + 1] = deep[start : end + 1]
    return out


def spikes(
    series: Sequence[float] | FloatArray,
    step_seconds: float = 600.0,
    rule: GapRule | None = None,
    trailing: bool = True,
) -> BoolArray:
    """Mask of the points of ``series`` that are absurd spikes: ``partial_gaps`` of the
    reciprocal series at ``spike_factor`` (a point 100× above the level on both sides is a
    drop of 100× in 1/x), so the same steadiness and crowding tests keep a bursty series'
    real bursts. Zeros have no reciprocal and do not vote."""
    rule = rule or GapRule()
    values = np.asarray(series, dtype=np.float64)
    if rule.spike_factor <= 0:
        return np.zeros(values.size, dtype=np.bool_)
    with np.errstate(divide="ignore", invalid="ignore"):
        inverse = np.where(values > 0, 1.0 / values, np.nan)
    return partial_gaps(
        inverse, step_seconds, replace(rule, drop_factor=rule.spike_factor), trailing
    )


def _runs(flags: BoolArray, observed: BoolArray) -> list[tuple[int, int]]:
    """(first, last) index of each run of ``flags``; unobserved points do not break a run."""
    idx = np.flatnonzero(observed)
    f = flags[idx].astype(np.int8)
    edges = np.diff(np.concatenate([[0], f, [0]]))
    starts, ends = np.flatnonzero(edges == 1), np.flatnonzero(edges == -1) - 1
    return [(int(idx[a]), int(idx[b])) for a, b in zip(starts, ends, strict=True)]


def gap_mask(
    series: Sequence[float] | FloatArray,
    step_seconds: float = 600.0,
    rule: GapRule | None = None,
    trailing: bool = True,
) -> BoolArray:
    """Every point that is not demand: missing (NaN, ±Inf, negative), a partial gap or an
    absurd spike."""
    values = np.asarray(series, dtype=np.float64)
    with np.errstate(invalid="ignore"):
        missing = ~(np.isfinite(values) & (values >= 0))
    out: BoolArray = (
        missing
        | partial_gaps(values, step_seconds, rule, trailing)
        | spikes(values, step_seconds, rule, trailing)
    )
    return out


def recent_level(
    series: Sequence[float] | FloatArray, mask: BoolArray, points: int
) -> float | None:
    """Median of the last ``points`` observations that are not gaps (looking further back
    when the last ``points`` are all gaps); None when the series has none."""
    values = np.asarray(series, dtype=np.float64)
    good = np.flatnonzero(~mask)
    if good.size == 0:
        return None
    return float(np.median(values[good[-max(1, points) :]]))
