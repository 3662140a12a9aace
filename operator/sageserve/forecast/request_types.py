"""Request types for OServe: k-means on (log prompt length, log output length) (OServe §5.1).

Why types: a layout's capacity depends on what it serves (long prompts with short answers are
compute-bound, short prompts with long answers memory-bound, §1), so OServe forecasts and
assigns per type rather than one aggregate rate; its S1 step clusters historical requests by
(input length, output length) with k-means, and its evaluation uses 4 types (short/long input
× short/long output).

Settled here ([GAP] in the paper, which gives neither the scale nor k):
- lengths enter as log(1 + tokens): they span 1–8,000 prompt and 1–5,000 output tokens in the
  Azure traces (§2), and in linear units the few long prompts decide every distance, folding
  all short requests into one type; in logs a 2× difference weighs the same at 100 and at
  4,000 tokens, which is how step times scale;
- k defaults to 4, the paper's count; fewer distinct requests than k give fewer types;
- types are numbered by their centroid (prompt, then output), so a refit on similar history
  keeps the numbering and a type's id means the same thing from one window to the next;
- the output length is the real one in history and the *predicted* one at dispatch (the
  router does not know the real one yet; `dispatch/length_predictor.py`), the same function
  classifies both.

Deterministic for a seed: scikit-learn's KMeans with `random_state=seed` and a fixed
`n_init`; no wall clock, no global state.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

#: the paper's four types: short/long input × short/long output (OServe §6, Table 1)
DEFAULT_TYPES = 4

#: Upper bounds (tokens) of the log-2 buckets in which `sageserve router` counts finished
#: requests by (prompt, output) length (`sageserve_router_request_shapes_total`, labels
#: `prompt_le`, `output_le`): the operator's history for the types. Log-2, because the
#: types are fitted in log space (above): a bucket's width is one unit of the same scale at
#: every length, and 18 × 18 bounds keep a model-region under 400 series at most.
SHAPE_BOUNDS: tuple[int, ...] = tuple(2**i for i in range(18))  # 1 … 131,072
SHAPE_OVERFLOW = "+Inf"

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]


def _features(prompt_tokens: Sequence[float], output_tokens: Sequence[float]) -> FloatArray:
    p = np.asarray(prompt_tokens, dtype=np.float64)
    o = np.asarray(output_tokens, dtype=np.float64)
    if p.shape != o.shape or p.ndim != 1:
        raise ValueError(
            f"prompt_tokens and output_tokens: one length each per request, got {p.shape} "
            f"and {o.shape}"
        )
    if np.any(~np.isfinite(p)) or np.any(~np.isfinite(o)) or np.any(p < 0) or np.any(o < 0):
        raise ValueError("prompt_tokens and output_tokens: finite and >= 0 tokens")
    return np.column_stack((np.log1p(p), np.log1p(o)))


@dataclass(frozen=True)
class RequestTypes:
    """Fitted types: centroids in log(1 + tokens), numbered by (prompt, output)."""

    log_centroids: tuple[tuple[float, float], ...]
    #: how many history requests fell in each type
    counts: tuple[int, ...]

    @property
    def k(self) -> int:
        return len(self.log_centroids)

    def centroid_tokens(self, j: int) -> tuple[float, float]:
        """Type j's representative (prompt, output) tokens: the centroid back in tokens (a
        geometric mean of the type's lengths)."""
        lp, lo = self.log_centroids[j]
        return float(np.expm1(lp)), float(np.expm1(lo))

    def classify(self, prompt_tokens: Sequence[float], output_tokens: Sequence[float]) -> IntArray:
        """The nearest type of each request (log space)."""
        x = _features(prompt_tokens, output_tokens)
        if x.shape[0] == 0:
            return np.zeros(0, dtype=np.int64)
        c = np.asarray(self.log_centroids, dtype=np.float64)
        d = ((x[:, None, :] - c[None, :, :]) ** 2).sum(axis=2)
        return np.asarray(d.argmin(axis=1), dtype=np.int64)

    def rates(
        self,
        prompt_tokens: Sequence[float],
        output_tokens: Sequence[float],
        duration_s: float,
    ) -> tuple[float, ...]:
        """Requests/s of each type over a window of `duration_s` seconds."""
        if not duration_s > 0:
            raise ValueError(f"duration_s: must be > 0, got {duration_s}")
        labels = self.classify(prompt_tokens, output_tokens)
        counts = np.bincount(labels, minlength=self.k)
        return tuple(float(c) / duration_s for c in counts)


def shape_bucket(tokens: float) -> str:
    """The `prompt_le` / `output_le` label of a request of `tokens` tokens: the smallest
    bound ≥ tokens, `+Inf` beyond the last."""
    for bound in SHAPE_BOUNDS:
        if tokens <= bound:
            return str(bound)
    return SHAPE_OVERFLOW


def bucket_tokens(le: str) -> float:
    """A bucket's representative length: the geometric mean of its bounds (the centre in log
    space, where the types live); twice the last bound for `+Inf`. Raises ValueError on a
    label that is not a bucket bound."""
    if le == SHAPE_OVERFLOW:
        return 2.0 * SHAPE_BOUNDS[-1]
    upper = int(le)
    if upper not in SHAPE_BOUNDS:
        raise ValueError(f"le: not a shape bucket bound: {le!r}")
    return 1.0 if upper == 1 else float(np.sqrt(upper * (upper // 2)))


def fit_request_types(
    prompt_tokens: Sequence[float],
    output_tokens: Sequence[float],
    k: int = DEFAULT_TYPES,
    seed: int = 0,
    n_init: int = 10,
    weights: Sequence[float] | None = None,
) -> RequestTypes:
    """k-means over a history window of requests (see the module docstring).

    `weights`: requests per point, when a point stands for many (the router's shape buckets:
    each bucket's representative lengths, weighted by its count); `counts` then sums them."""
    if k < 1:
        raise ValueError(f"k: must be >= 1, got {k}")
    x = _features(prompt_tokens, output_tokens)
    w = None if weights is None else np.asarray(weights, dtype=np.float64)
    if w is not None and (w.shape != (x.shape[0],) or np.any(~np.isfinite(w)) or np.any(w < 0)):
        raise ValueError("weights: one finite weight >= 0 per request")
    if w is not None:
        x = x[w > 0]
        w = w[w > 0]
    if x.shape[0] == 0:
        raise ValueError("prompt_tokens: the history window holds no request")
    k_eff = min(k, int(np.unique(x, axis=0).shape[0]))
    from sklearn.cluster import KMeans  # here: importing scikit-learn takes seconds

    km = KMeans(n_clusters=k_eff, n_init=n_init, random_state=seed).fit(x, sample_weight=w)
    centers = np.asarray(km.cluster_centers_, dtype=np.float64)
    order = sorted(range(k_eff), key=lambda i: (centers[i, 0], centers[i, 1]))
    rank = {old: new for new, old in enumerate(order)}
    labels = np.asarray([rank[int(v)] for v in km.labels_], dtype=np.int64)
    counts = np.bincount(labels, weights=w, minlength=k_eff)
    return RequestTypes(
        log_centroids=tuple((float(centers[i, 0]), float(centers[i, 1])) for i in order),
        counts=tuple(round(float(c)) for c in counts),
    )
