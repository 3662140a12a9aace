"""Output-length predictors behind one small interface, chosen by name (PreServe §4.2).

PreServe's request load predictor estimates each request's response length before it is
served, so that the router and the load anticipator can reason about the KV cache a request
*will* hold rather than the one it holds now. The paper's predictor reads the prompt text
(a prompt-tuned DistilBERT); no public trace carries text, so the predictors here read what a
router does know of a request: its client (API key) and its prompt length.

- `client-quantile`: the running median of each client's past output lengths, on a
  log-spaced histogram (constant time and memory per client); a client with too few
  finished requests borrows the median of all clients, and before any request has finished
  a fixed prior is used (the paper's "default strategies until sufficient data").
- `input-regression`: a median (quantile 0.5) regression of log output length on a
  piecewise-linear basis of log prompt length, fitted with statsmodels' `QuantReg` on real
  (input, output) pairs. The median minimises the absolute error, the paper's MAE. The knot
  count is chosen on the last quarter of the fit data (chronological), never on the data a
  score is reported on. Without pairs it learns online from finished requests, refitting
  at 1k, 2k, 4k, ... observations.
- `oracle`: the true length. Only a benchmark's upper bound: no router knows it, so it is
  never a default (`DEFAULT_PREDICTOR`).

`score` reports the paper's MAE and the share of requests under-predicted by more than 2×
(those the anticipator must extend, §4.3.1) on held-out requests, prequentially (each
request predicted before it is observed).
"""

from __future__ import annotations

import math
import warnings
from bisect import bisect_left
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from itertools import accumulate
from typing import Any, Protocol

import numpy as np

#: The predictor the simulator uses when none is named: online, needs no training data.
DEFAULT_PREDICTOR = "client-quantile"


@dataclass(frozen=True, slots=True)
class LengthQuery:
    """What is asked of a predictor about one request. `true_output` is the length the
    request will turn out to have: only the `oracle` reads it."""

    client: int
    prompt_tokens: int
    true_output: int = 0


class LengthPredictor(Protocol):
    """Predicts a request's output tokens at arrival; learns from finished requests."""

    name: str

    def predict(self, q: LengthQuery) -> int:
        """Predicted output tokens, at least 1."""
        ...

    def observe(self, client: int, prompt_tokens: int, output_tokens: int) -> None:
        """A request finished with `output_tokens` output tokens."""
        ...


_REGISTRY: dict[str, Callable[..., LengthPredictor]] = {}


def register_predictor(
    name: str,
) -> Callable[[Callable[..., LengthPredictor]], Callable[..., LengthPredictor]]:
    """Class decorator: make a predictor available to `make_predictor(name)`."""

    def deco(factory: Callable[..., LengthPredictor]) -> Callable[..., LengthPredictor]:
        _REGISTRY[name] = factory
        return factory

    return deco


def predictor_names() -> list[str]:
    return sorted(_REGISTRY)


def make_predictor(name: str, **params: Any) -> LengthPredictor:
    """The predictor registered as `name`, built with `params`."""
    factory = _REGISTRY.get(name)
    if factory is None:
        raise ValueError(
            f"unknown length predictor {name!r}: choose one of {', '.join(predictor_names())}"
        )
    return factory(**params)


# ---- client-quantile ------------------------------------------------------------------------

#: clients whose history `client-quantile` keeps, the least recently seen forgotten first
#: (a forgotten client borrows all clients' median again until it has `min_samples`)
DEFAULT_MAX_CLIENTS = 10_000

#: histogram buckets per doubling of the length: 2^(1/8) ≈ 9 % wide, so the median read
#: from the histogram is within ±4.5 % of the sample median
_PER_OCTAVE = 8


def _bucket(x: int) -> int:
    """The log-spaced bucket a length falls in."""
    return math.floor(math.log2(max(1, x)) * _PER_OCTAVE)


class _LogHistogram:
    """Counts of lengths on log-spaced buckets; quantiles in O(buckets), cached."""

    __slots__ = ("_cache", "_counts", "_keys", "n")

    def __init__(self) -> None:
        #: the buckets seen, in increasing order, and their counts in that order
        self._keys: list[int] = []
        self._counts: list[int] = []
        self.n = 0
        self._cache: dict[float, int] = {}

    @property
    def counts(self) -> dict[int, int]:
        """Lengths counted per bucket."""
        return dict(zip(self._keys, self._counts, strict=True))

    def add(self, x: int) -> None:
        self.add_bucket(_bucket(x))

    def add_bucket(self, b: int) -> None:
        """Count one length in bucket `b` (`_bucket`)."""
        keys = self._keys
        i = bisect_left(keys, b)
        if i < len(keys) and keys[i] == b:
            self._counts[i] += 1
        else:
            keys.insert(i, b)
            self._counts.insert(i, 1)
        self.n += 1
        if self._cache:
            self._cache.clear()

    def quantile(self, q: float) -> int:
        got = self._cache.get(q)
        if got is not None:
            return got
        # the first bucket whose cumulative count reaches q × n
        i = bisect_left(list(accumulate(self._counts)), q * self.n)
        out = (
            max(1, round(2.0 ** ((self._keys[i] + 0.5) / _PER_OCTAVE)))
            if i < len(self._keys)
            else 1
        )
        self._cache[q] = out
        return out


@register_predictor("client-quantile")
class ClientQuantilePredictor:
    """Per client (API key): the `quantile` of its past output lengths (PreServe §4.2's
    request load predictor without prompt text: a client's own history is the best cheap
    evidence of how long its answers run).

    At most `max_clients` histograms, the least recently seen client's forgotten first:
    the router's clients are API keys and `user` strings, which a caller can invent by
    the thousand, and each costs a histogram."""

    name = "client-quantile"

    def __init__(
        self,
        quantile: float = 0.5,
        min_samples: int = 16,
        cold_start_tokens: int = 256,
        max_clients: int = DEFAULT_MAX_CLIENTS,
    ) -> None:
        if not 0.0 < quantile < 1.0:
            raise ValueError(f"quantile must be in (0, 1), got {quantile}")
        if cold_start_tokens < 1:
            raise ValueError(f"cold_start_tokens must be ≥ 1, got {cold_start_tokens}")
        if max_clients < 1:
            raise ValueError(f"max_clients must be ≥ 1, got {max_clients}")
        self.quantile = quantile
        self.min_samples = min_samples
        self.cold_start_tokens = cold_start_tokens
        self.max_clients = max_clients
        #: per client, in order of last use (a dict keeps insertion order: LRU by re-insert)
        self._clients: dict[int, _LogHistogram] = {}
        self._all = _LogHistogram()

    @property
    def clients(self) -> int:
        """Clients whose history is kept (at most `max_clients`)."""
        return len(self._clients)

    def predict(self, q: LengthQuery) -> int:
        h = self._clients.pop(q.client, None)
        if h is not None:
            self._clients[q.client] = h  # most recently used
            if h.n >= self.min_samples:
                return h.quantile(self.quantile)
        if self._all.n:
            return self._all.quantile(self.quantile)
        return self.cold_start_tokens

    def observe(self, client: int, prompt_tokens: int, output_tokens: int) -> None:
        h = self._clients.pop(client, None)
        if h is None:
            h = _LogHistogram()
        self._clients[client] = h
        while len(self._clients) > self.max_clients:
            del self._clients[next(iter(self._clients))]
        b = _bucket(output_tokens)
        h.add_bucket(b)
        self._all.add_bucket(b)


# ---- input-regression -----------------------------------------------------------------------


def _basis(log_p: np.ndarray, knots: np.ndarray) -> np.ndarray:
    cols = [np.ones_like(log_p), log_p]
    cols += [np.maximum(0.0, log_p - k) for k in knots]
    return np.column_stack(cols)


def _fit_quantreg(log_p: np.ndarray, log_o: np.ndarray, knots: np.ndarray) -> np.ndarray:
    from statsmodels.regression.quantile_regression import QuantReg

    with warnings.catch_warnings():  # IterationLimitWarning, ConvergenceWarning: still usable
        warnings.simplefilter("ignore")
        res = QuantReg(log_o, _basis(log_p, knots)).fit(q=0.5, max_iter=2000)
    return np.asarray(res.params, dtype=np.float64)


@dataclass
class RegressionFit:
    """A fitted median regression of log output on log prompt length."""

    knots: np.ndarray
    params: np.ndarray
    #: the knot counts tried and their validation MAE (tokens), for the record
    validation: dict[int, float] = field(default_factory=dict)

    def predict(self, prompt_tokens: int) -> int:
        lp = math.log(max(1, prompt_tokens))
        x = self.params[0] + self.params[1] * lp
        for k, c in zip(self.knots.tolist(), self.params[2:].tolist(), strict=True):
            if lp > k:
                x += c * (lp - k)
        return max(1, round(math.exp(min(x, 20.0))))


def fit_regression(
    pairs: Sequence[tuple[int, int]], knot_choices: Sequence[int] = (0, 4, 8, 16, 32)
) -> RegressionFit:
    """Median regression on (prompt, output) pairs in time order: each knot count is fitted
    on the first three quarters and scored (MAE) on the last quarter; the best is refitted
    on all pairs. Knots sit at quantiles of log prompt length."""
    if len(pairs) < 8:
        raise ValueError(
            f"input-regression needs at least 8 (input, output) pairs, got {len(pairs)}"
        )
    arr = np.asarray(pairs, dtype=np.float64)
    log_p = np.log(np.maximum(1.0, arr[:, 0]))
    log_o = np.log(np.maximum(1.0, arr[:, 1]))

    def knots_for(lp: np.ndarray, n: int) -> np.ndarray:
        if n <= 0:
            return np.empty(0)
        return np.unique(np.quantile(lp, np.linspace(0.0, 1.0, n + 2)[1:-1]))

    cut = (3 * len(arr)) // 4
    scores: dict[int, float] = {}
    for n in knot_choices:
        kn = knots_for(log_p[:cut], n)
        if len(kn) + 2 > cut // 4:  # too few points per segment to fit
            continue
        fit = RegressionFit(kn, _fit_quantreg(log_p[:cut], log_o[:cut], kn))
        pred = np.array([fit.predict(int(p)) for p in arr[cut:, 0]])
        scores[n] = float(np.mean(np.abs(pred - arr[cut:, 1])))
    best = min(scores, key=lambda n: (scores[n], n)) if scores else 0
    kn = knots_for(log_p, best)
    return RegressionFit(kn, _fit_quantreg(log_p, log_o, kn), scores)


@register_predictor("input-regression")
class InputRegressionPredictor:
    """Output length from prompt length by median regression (see `fit_regression`).

    With `pairs` it is fitted once, on them; without, it learns online, refitting on the
    last `window` finished requests at 1k, 2k, 4k, ... observations (then every `window`),
    and predicts the running median of what it has seen until the first fit."""

    name = "input-regression"

    def __init__(
        self,
        pairs: Iterable[tuple[int, int]] = (),
        window: int = 20_000,
        first_fit: int = 1000,
        cold_start_tokens: int = 256,
    ) -> None:
        given = list(pairs)
        self.fit: RegressionFit | None = fit_regression(given) if given else None
        self.online = not given
        self._seen: deque[tuple[int, int]] = deque(maxlen=window)
        self._n = 0
        self._next_fit = first_fit
        self._window = window
        self._fallback = ClientQuantilePredictor(cold_start_tokens=cold_start_tokens)

    def predict(self, q: LengthQuery) -> int:
        if self.fit is None:
            return self._fallback.predict(LengthQuery(0, q.prompt_tokens))
        return self.fit.predict(q.prompt_tokens)

    def observe(self, client: int, prompt_tokens: int, output_tokens: int) -> None:
        if not self.online:
            return
        self._seen.append((prompt_tokens, output_tokens))
        self._fallback.observe(0, prompt_tokens, output_tokens)
        self._n += 1
        if self._n >= self._next_fit:
            self.fit = fit_regression(list(self._seen))
            self._next_fit = min(2 * self._next_fit, self._n + self._window)


# ---- oracle ----------------------------------------------------------------------------------


@register_predictor("oracle")
class OraclePredictor:
    """The true output length: a benchmark's upper bound on what prediction can give, never
    a default (no router knows a request's length before it is served)."""

    name = "oracle"

    def predict(self, q: LengthQuery) -> int:
        return max(1, q.true_output)

    def observe(self, client: int, prompt_tokens: int, output_tokens: int) -> None:
        return None


# ---- scoring ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class PredictorScore:
    """Held-out accuracy: MAE in tokens, shares of requests predicted below half and above
    twice their true length."""

    requests: int
    mae: float
    under_2x: float
    over_2x: float


def score(
    predictor: LengthPredictor,
    warm: Iterable[tuple[int, int, int]],
    held_out: Iterable[tuple[int, int, int]],
) -> PredictorScore:
    """Score on `held_out` (client, prompt, output) rows after observing the `warm` rows;
    each held-out row is predicted first and observed after (prequential), as a running
    router learns from requests that finished before the next one arrives."""
    for c, p, o in warm:
        predictor.observe(c, p, o)
    n = 0
    err = 0.0
    under = over = 0
    for c, p, o in held_out:
        d = predictor.predict(LengthQuery(c, p, o))
        n += 1
        err += abs(d - o)
        under += d * 2 < o
        over += d > 2 * o
        predictor.observe(c, p, o)
    if n == 0:
        raise ValueError("no held-out request to score on")
    return PredictorScore(n, err / n, under / n, over / n)


__all__ = [
    "DEFAULT_MAX_CLIENTS",
    "DEFAULT_PREDICTOR",
    "ClientQuantilePredictor",
    "InputRegressionPredictor",
    "LengthPredictor",
    "LengthQuery",
    "OraclePredictor",
    "PredictorScore",
    "RegressionFit",
    "fit_regression",
    "make_predictor",
    "predictor_names",
    "register_predictor",
    "score",
]
