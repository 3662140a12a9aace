"""OServe's request types (forecast/request_types.py): k-means on log lengths."""

from __future__ import annotations

import numpy as np
import pytest

from sageserve.forecast.request_types import fit_request_types


def _history(seed: int = 0) -> tuple[list[float], list[float]]:
    rng = np.random.default_rng(seed)
    # code-like: long prompts, short outputs; chat-like: short prompts, long outputs
    code_p = rng.lognormal(np.log(2000), 0.2, 300)
    code_o = rng.lognormal(np.log(15), 0.2, 300)
    chat_p = rng.lognormal(np.log(100), 0.2, 200)
    chat_o = rng.lognormal(np.log(400), 0.2, 200)
    return list(np.concatenate([code_p, chat_p])), list(np.concatenate([code_o, chat_o]))


def test_two_separated_populations_become_two_types_numbered_by_prompt() -> None:
    p, o = _history()
    t = fit_request_types(p, o, k=2, seed=0)
    assert t.counts == (200, 300)  # type 0: the short prompts (chat), type 1: code
    chat_p, chat_o = t.centroid_tokens(0)
    code_p, code_o = t.centroid_tokens(1)
    assert 80 < chat_p < 125 and 320 < chat_o < 500
    assert 1600 < code_p < 2500 and 12 < code_o < 19
    assert list(t.classify([150, 3000], [600, 10])) == [0, 1]


def test_deterministic_for_a_seed() -> None:
    p, o = _history(3)
    assert fit_request_types(p, o, k=4, seed=5) == fit_request_types(p, o, k=4, seed=5)


def test_rates_per_type_over_the_window() -> None:
    p, o = _history()
    t = fit_request_types(p, o, k=2, seed=0)
    assert t.rates(p, o, duration_s=100.0) == pytest.approx((2.0, 3.0))


def test_fewer_distinct_requests_than_k_give_fewer_types() -> None:
    t = fit_request_types([10, 10, 5000], [100, 100, 5], k=4)
    assert t.k == 2 and t.counts == (2, 1)


def test_bad_history_is_refused() -> None:
    with pytest.raises(ValueError, match="history window holds no request"):
        fit_request_types([], [])
    with pytest.raises(ValueError, match="one length each"):
        fit_request_types([1, 2], [1])
    with pytest.raises(ValueError, match="k: must be >= 1"):
        fit_request_types([1], [1], k=0)
