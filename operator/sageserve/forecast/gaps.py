"""Collection gaps are missing data, never demand.

SageServe's load predictor (SageServe §6.3) forecasts the next hour's peak from the recorded
tokens/s. A recorder does not only lose whole windows (NaN, or exact zeros in ServeGen): when
some scrape targets are down, or a collector drops part of a window, the recorded rate falls
to a fraction of its level (0–30 % of it, for ten minutes or for two hours) and comes back.
Read as demand, such a stretch is a lull; the model learns it, its calibration errors
widen, a gap at the end of the history pulls the next hour's forecast (and so the fleet)
down, and a backtest that scores it as the actual peak reports errors of 100 %. These pure
functions tell such points apart so that the forecaster treats them as missing and the
backtest does not score them:

- ``partial_gaps``: the points of runs that enter and leave by a deep step (``GapRule``);
- ``spikes``: the mirror image, short points two orders of magnitude *above* a steady
  level (a target scraped twice, a broken exporter): not demand to provision for;
- ``gap_mask``: those plus the points already missing (NaN, ±Inf, negative counter resets);
- ``recent_level``: the level a gap must not pull a forecast below (``floor_fraction`` of it).

Why these tests: a run ``drop_factor`` (2.5×) below the median of the hour on *both* sides,
entered by a step, means the rate fell at once and came back, which demand does not do (a
nightly trough or a weekend moves by a few percent a step); the robust-σ test (MAD of the
log steps on each side) keeps a sparse, bursty series, whose dips are real, from being read
as gappy; so does the crowding test (more drops in one context than a gap may hold means the
series is sparse, not gappy). The thresholds were chosen by injecting gaps at random places
into the bundled traces (``forecast.gap_harness``). At the end of the history the rate has
not come back yet: a trailing drop is treated as a gap
(``trailing=True``) for ``trailing_seconds`` only; if it lasts longer it counts as demand
(the drop guard, ``forecast.guard``, holds the next hour up until the drop is confirmed).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from sageserve.forecast.types import BoolArray, FloatArray, GapRule

#: 1.4826 × MAD estimates σ for Gaussian data.
MAD_TO_SIGMA = 1.4826
#: A run's level is taken as at least this share of the level before it when judging whether
#: it stepped back up, so that a lost window (0) followed by a thin one (3 %) is one gap.
RUN_FLOOR = 0.02
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

    A gap is a *run* that enters and leaves by a step: it starts at a point at least
    ``drop_factor`` below the level before it (the median of the ``context`` points before;
    at the start of the series or after missing data, the level after it), and goes on while
    points stay that far below that level (NaN in between do not break it). It is a gap when
    it holds at most ``max_seconds`` of points, every point of it is also that far below the
    level *after* it (the rate came back: a level that stays down is a real decline), the
    drop exceeds ``min_sigmas`` robust σ of the log context on both sides (a bursty series'
    dips are within its noise), and no more than ``max_neighbours`` other runs deep by the
    level tests start in its context (a series full of dips is sparse, not gappy). A real
    trough or weekend moves the level by a few percent a step and never enters by a step.
    ``trailing=False`` does not flag a run cut by the end of the series (the backtest, which
    sees the future, judges interior runs only; the forecaster, which does not, keeps the
    default and treats a trailing run of at most ``trailing_seconds`` as a gap).
    """
    rule = rule or GapRule()
    values = np.asarray(series, dtype=np.float64)
    n = values.size
    out: BoolArray = np.zeros(n, dtype=np.bool_)
    width, context = gap_points(rule, step_seconds)
    trail = max(1, round(rule.trailing_seconds / step_seconds))
    if not rule.enabled or n < rule.min_context + 1:
        return out
    observed = np.isfinite(values) & (values >= 0)
    clean = np.where(observed, values, np.nan)
    pad = np.concatenate([np.full(context, np.nan), clean, np.full(context, np.nan)])
    windows = sliding_window_view(pad, context)
    before, after = windows[:n], windows[context + 1 : context + 1 + n]
    # Each side's level (the median of its observations, NaN with fewer than min_context)
    # for every point at once, by a rolling median: only the points that step down from it
    # are looked at one by one, so a long 1-minute history stays fast.
    levels = _side_levels(clean, context, rule.min_context)
    entry = np.where(np.isfinite(levels[0]), levels[0], levels[1])
    with np.errstate(invalid="ignore"):
        maybe = np.flatnonzero(observed & (entry > 0) & (clean * rule.drop_factor <= entry))
    if maybe.size == 0:
        return out
    runs: list[tuple[int, int, float]] = []  # first, last, margin of the drop over the noise
    i_next = 0
    for i in maybe:
        if i < i_next:
            continue  # inside a run already judged
        judged = _judge_run(
            int(i), clean, observed, (before, after), levels, rule, width, trailing, trail
        )
        if judged is not None:
            i_next, run = judged
            if run is not None:
                runs.append(run)
    starts = np.array([r[0] for r in runs], dtype=np.int64)
    for first, last, margin in runs:
        if margin < 0:
            continue  # within the noise of its context
        lo, hi = first - context, last + context
        crowd = int(np.count_nonzero((starts >= lo) & (starts <= hi))) - 1
        if crowd > rule.max_neighbours:
            continue  # crowded by other drops: a sparse series, not a gap
        out[first : last + 1] = observed[first : last + 1]
    return out


def _judge_run(
    i: int,
    clean: FloatArray,
    observed: BoolArray,
    sides: tuple[FloatArray, FloatArray],
    levels: tuple[FloatArray, FloatArray],
    rule: GapRule,
    width: int,
    trailing: bool,
    trail: int,
) -> tuple[int, tuple[int, int, float] | None] | None:
    """The run that enters at ``i`` (a step down from the level before it, or after it where
    the level before is unknown): the next index to look at, and (first, last, margin of
    the drop over ``min_sigmas`` σ) when the run is short and came back, else None."""
    n = clean.size
    before, after = sides
    level = float(levels[0][i]) if math.isfinite(levels[0][i]) else float(levels[1][i])
    if not level > 0:
        return i + 1, None  # nothing to drop from (an idle series, a model never asked for)
    # Extend while the points stay that far below the level and do not step back up from
    # the run (NaN does not break it): a gap ends by a step, as it began.
    j, count, last = i, 0, i
    while j < n and count <= width:
        if observed[j]:
            so_far = max(float(np.nanmedian(clean[i : j + 1])), RUN_FLOOR * level)
            if clean[j] * rule.drop_factor > level or clean[j] > rule.drop_factor * so_far:
                break
            count += 1
            last = j
        j += 1
    if count > width:
        return j, None  # too long: a real lull or decline
    run = clean[i : last + 1]
    depth = float(np.nanmedian(run))
    post = float(levels[1][last]) if math.isfinite(levels[1][last]) else None
    if post is None and (not trailing or count > trail):
        return last + 1, None  # cut by the end (or missing data): not seen to come back
    if post is not None and (depth * rule.drop_factor > post or float(np.nanmax(run)) > post):
        return last + 1, None  # the level after it is down too: a real decline, not a gap
    ref = level if post is None else min(level, post)
    if not ref > 0:
        return last + 1, None  # back to nothing after it: no level the run fell from
    sigma = max(_step_sigma(before[i], ref), _step_sigma(after[last], ref))
    drop = math.log(ref) - math.log(max(depth, ref * LOG_FLOOR))
    return last + 1, (i, last, drop - rule.min_sigmas * sigma)


def _step_sigma(side: FloatArray, ref: float) -> float:
    """Robust σ of one side's point noise: the MAD of its log steps (a trend, such as the
    ramp into a trough, moves every step alike and does not count), over √2 (a step holds two
    points' noise); 0 when the side has fewer than three observations."""
    ok = side[np.isfinite(side)]
    if ok.size < 3:
        return 0.0
    steps = np.diff(np.log(np.maximum(ok, ref * LOG_FLOOR)))
    centre = float(np.median(steps))
    return MAD_TO_SIGMA * float(np.median(np.abs(steps - centre))) / math.sqrt(2.0)


def _side_levels(
    clean: FloatArray, context: int, min_context: int
) -> tuple[FloatArray, FloatArray]:
    """Per point, the median of the observations among the ``context`` points before it and
    among the ``context`` points after it; NaN where a side has fewer than ``min_context``."""
    import pandas as pd  # a C rolling median; imported here, as statsmodels imports it anyway

    def rolling(x: FloatArray) -> FloatArray:
        med = pd.Series(x).rolling(context, min_periods=min_context).median().to_numpy()
        out: FloatArray = np.concatenate([[np.nan], med[:-1]])  # the points before, not it
        return out

    return rolling(clean), rolling(clean[::-1])[::-1]


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
