"""The one percentile every figure sageserve prints is computed with.

Latency percentiles appear in `simulate`'s summary, in every benchmark and in the SLO
checks of calibration; if each computed its own (nearest rank here, floor index there,
interpolated elsewhere), two tables of the same run could disagree in the last digit and a
reader could not tell a policy's effect from a definition's. One definition:

- **linear interpolation between the closest ranks** (NumPy's default `np.percentile`,
  Python's `statistics.quantiles(method="inclusive")`, Hyndman & Fan type 7): the value at
  rank q/100 × (n − 1), counted from 0;
- **infinite values** stand for requests that never finished (a benchmark counts them
  against its P99): a percentile whose rank touches one is infinite, rather than NumPy's
  NaN from ∞ − ∞;
- no values: NaN (callers that print "-" or treat "no data" as a failed SLO decide that
  themselves).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numpy.typing import ArrayLike


def percentiles(values: ArrayLike, qs: Sequence[float]) -> list[float]:
    """The qs-th percentiles (each 0–100) of `values`, in the order asked."""
    for q in qs:
        if not 0.0 <= q <= 100.0:
            raise ValueError(f"percentile q={q} is outside 0–100; give e.g. 99 for P99")
    a = np.asarray(values, dtype=np.float64).ravel()
    if a.size == 0:
        return [float("nan")] * len(qs)
    if np.isfinite(a).all():
        return [float(v) for v in np.percentile(a, list(qs))]
    if np.isnan(a).any() or np.isneginf(a).any():
        raise ValueError("percentile of values holding NaN or -inf: drop or count them first")
    a = np.sort(a)
    out = []
    for q in qs:
        pos = q / 100.0 * (a.size - 1)
        lo = int(np.floor(pos))
        hi = min(lo + 1, a.size - 1)
        frac = pos - lo
        if np.isinf(a[lo]) or (frac > 0.0 and np.isinf(a[hi])):
            out.append(float("inf"))
        else:
            out.append(float(a[lo] + (a[hi] - a[lo]) * frac))
    return out


def percentile(values: ArrayLike, q: float) -> float:
    """The q-th percentile (0–100) of `values` (see the module doc for the definition)."""
    return percentiles(values, [q])[0]
