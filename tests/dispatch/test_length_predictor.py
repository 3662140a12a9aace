"""Output-length predictors (PreServe §4.2): chosen by name, honest about what they read,
scored on held-out requests."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from sageserve.dispatch.length_predictor import (
    DEFAULT_PREDICTOR,
    ClientQuantilePredictor,
    InputRegressionPredictor,
    LengthQuery,
    make_predictor,
    predictor_names,
    score,
)
from sageserve.sim import traces

AZ = Path(__file__).resolve().parents[2] / "data/traces/azure-llm-2023"


def test_every_predictor_is_chosen_by_name_and_the_default_is_not_the_oracle() -> None:
    assert {"client-quantile", "input-regression", "oracle"} <= set(predictor_names())
    assert DEFAULT_PREDICTOR != "oracle"
    with pytest.raises(ValueError, match=r"unknown length predictor 'bert'.*client-quantile"):
        make_predictor("bert")


@pytest.mark.parametrize("name", ["client-quantile", "input-regression"])
def test_only_the_oracle_reads_the_true_length(name: str) -> None:
    rng = random.Random(3)
    pred = make_predictor(name)
    for _ in range(1500):
        p = rng.randint(10, 4000)
        pred.observe(rng.randint(0, 3), p, rng.randint(1, 800))
    for c, p in [(0, 50), (1, 3000), (7, 700)]:
        a = pred.predict(LengthQuery(c, p, true_output=1))
        b = pred.predict(LengthQuery(c, p, true_output=100_000))
        assert a == b >= 1
    assert make_predictor("oracle").predict(LengthQuery(0, 5, true_output=321)) == 321


def test_client_quantile_learns_each_clients_median_and_lends_the_global_one() -> None:
    pred = ClientQuantilePredictor(min_samples=16, cold_start_tokens=77)
    assert pred.predict(LengthQuery(1, 100)) == 77  # nothing finished yet: the prior
    for i in range(101):
        pred.observe(1, 100, 10 + i)  # median 60
        pred.observe(2, 100, 1000 + 10 * i)  # median 1500
    assert pred.predict(LengthQuery(1, 100)) == pytest.approx(60, rel=0.05)
    assert pred.predict(LengthQuery(2, 100)) == pytest.approx(1500, rel=0.05)
    # a new client (too few of its own) gets the median of everyone's lengths
    pred.observe(3, 100, 5)
    assert 110 <= pred.predict(LengthQuery(3, 100)) <= 1000


@pytest.mark.slow
def test_input_regression_recovers_a_length_that_grows_with_the_prompt() -> None:
    rng = random.Random(1)
    pairs = []
    for _ in range(3000):
        p = int(10 ** rng.uniform(1, 4))
        pairs.append((p, max(1, round(3 * p**0.5 * rng.uniform(0.8, 1.25)))))
    pred = InputRegressionPredictor(pairs)
    for p in (30, 300, 3000, 9000):
        assert pred.predict(LengthQuery(0, p)) == pytest.approx(3 * p**0.5, rel=0.1)


def test_input_regression_learns_online_once_enough_requests_finished() -> None:
    pred = InputRegressionPredictor(first_fit=200)
    for i in range(199):
        pred.observe(0, 100 + i, 2 * (100 + i))
    assert pred.fit is None
    pred.observe(0, 299, 598)
    assert pred.fit is not None
    assert pred.predict(LengthQuery(0, 250)) == pytest.approx(500, rel=0.1)


def test_too_few_pairs_to_fit_is_refused_with_the_count() -> None:
    with pytest.raises(ValueError, match=r"at least 8 .* got 3"):
        InputRegressionPredictor([(1, 2), (3, 4), (5, 6)])


@pytest.mark.slow
def test_on_held_out_azure_conv_the_regression_beats_the_client_median() -> None:
    """Fit on the first 20 minutes of the hour, score on the other 38: the prompt length
    says much about a conversation's answer in this trace, so the regression must beat a
    predictor that ignores it, in MAE and in under-predictions by more than 2x."""
    rows = traces.request_trace(AZ / "AzureLLMInferenceTrace_conv.csv.gz")
    fit = [(0, p, o) for t, p, o in rows if t < 1200]
    held = [(0, p, o) for t, p, o in rows if t >= 1200]
    reg = score(InputRegressionPredictor([(p, o) for _, p, o in fit]), [], held)
    median = score(ClientQuantilePredictor(), fit, held)
    oracle = score(make_predictor("oracle"), fit, held)
    assert reg.requests == median.requests == len(held)
    assert reg.mae < median.mae
    assert reg.under_2x < median.under_2x
    assert oracle.mae == 0 and oracle.under_2x == 0
