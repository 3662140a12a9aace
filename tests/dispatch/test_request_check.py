"""The request rule (`dispatch.request_check`) as a table: each row a body, the field blamed.

Like Kubernetes' replica calculator tests: one row per case, the expected outcome beside
it, so a reader sees every limit at once and a change to one shows up as one row."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from sageserve.dispatch.request_check import (
    DEFAULT_MAX_TOKENS,
    choices,
    output_budget,
    request_problem,
)

M = {"model": "m"}

#: (name, extra fields, chat, blamed param or None when valid)
CASES: list[tuple[str, dict[str, Any], bool, str | None]] = [
    ("minimal", {}, False, None),
    (
        "every field valid",
        {
            "max_tokens": 16,
            "n": 2,
            "best_of": 3,
            "temperature": 0.7,
            "top_p": 1,
            "presence_penalty": -2,
            "frequency_penalty": 2.0,
            "logprobs": 5,
            "seed": 42,
            "stream": True,
            "stop": ["\n", "END"],
            "user": "u-1",
        },
        False,
        None,
    ),
    ("chat logprobs switch", {"logprobs": True, "top_logprobs": 20}, True, None),
    ("nulls are absent", {"max_tokens": None, "n": None, "stop": None, "user": None}, False, None),
    ("max_tokens at the cap", {"max_tokens": 131_072}, False, None),
    ("model missing", {"model": None}, False, "model"),
    ("model empty", {"model": ""}, False, "model"),
    ("max_tokens NaN", {"max_tokens": math.nan}, False, "max_tokens"),
    ("max_tokens Infinity", {"max_tokens": math.inf}, False, "max_tokens"),
    ("max_tokens -1e12", {"max_tokens": -1e12}, False, "max_tokens"),
    ("max_tokens 1e15", {"max_tokens": 10**15}, False, "max_tokens"),
    ("max_tokens over the cap", {"max_tokens": 131_073}, False, "max_tokens"),
    ("max_tokens 0", {"max_tokens": 0}, False, "max_tokens"),
    ("max_tokens float", {"max_tokens": 8.0}, False, "max_tokens"),
    ("max_tokens string", {"max_tokens": "8"}, False, "max_tokens"),
    ("max_tokens true", {"max_tokens": True}, False, "max_tokens"),
    ("max_completion_tokens -1", {"max_completion_tokens": -1}, True, "max_completion_tokens"),
    ("n 0", {"n": 0}, False, "n"),
    ("n 129", {"n": 129}, False, "n"),
    ("n true", {"n": True}, False, "n"),
    ("best_of below n", {"n": 4, "best_of": 2}, False, "best_of"),
    ("temperature 2.5", {"temperature": 2.5}, False, "temperature"),
    ("temperature -0.1", {"temperature": -0.1}, False, "temperature"),
    ("temperature false", {"temperature": False}, False, "temperature"),
    ("top_p 0", {"top_p": 0}, False, "top_p"),
    ("top_p 1.01", {"top_p": 1.01}, False, "top_p"),
    ("presence_penalty -3", {"presence_penalty": -3}, False, "presence_penalty"),
    ("frequency_penalty '1'", {"frequency_penalty": "1"}, False, "frequency_penalty"),
    ("completions logprobs 21", {"logprobs": 21}, False, "logprobs"),
    ("completions logprobs true", {"logprobs": True}, False, "logprobs"),
    ("chat logprobs 5", {"logprobs": 5}, True, "logprobs"),
    ("chat top_logprobs 21", {"top_logprobs": 21}, True, "top_logprobs"),
    ("seed 2**64", {"seed": 2**64}, False, "seed"),
    ("seed 1.5", {"seed": 1.5}, False, "seed"),
    ("stream 'yes'", {"stream": "yes"}, False, "stream"),
    ("stream 1", {"stream": 1}, False, "stream"),
    ("stop five strings", {"stop": ["a", "b", "c", "d", "e"]}, False, "stop"),
    ("stop a number", {"stop": 7}, False, "stop"),
    ("stop list with a number", {"stop": ["a", 1]}, False, "stop"),
    ("user 257 characters", {"user": "u" * 257}, False, "user"),
    ("user a number", {"user": 12}, False, "user"),
    ("NaN deep in another field", {"logit_bias": {"50256": math.nan}}, False, "logit_bias"),
    ("-Infinity in messages", {"messages": [{"role": "user", "x": -math.inf}]}, True, "messages"),
]


@pytest.mark.parametrize(("name", "extra", "chat", "blamed"), CASES, ids=[c[0] for c in CASES])
def test_the_rule_blames_the_field_a_client_got_wrong(
    name: str, extra: dict[str, Any], chat: bool, blamed: str | None
) -> None:
    problem = request_problem({**M, **extra}, chat=chat)
    if blamed is None:
        assert problem is None, problem
        return
    assert problem is not None, name
    assert problem.param == blamed
    assert problem.message.startswith(blamed)  # the message names the field first


def test_nan_and_infinity_read_by_pythons_json_reader_are_refused() -> None:
    """Python's `json.loads` turns the literals into floats: the rule sees them."""
    body = json.loads('{"model": "m", "max_tokens": NaN, "temperature": Infinity}')
    problem = request_problem(body, chat=False)
    assert problem is not None and problem.param == "max_tokens"
    assert "finite" in problem.message


def test_the_bound_on_output_tokens_is_the_callers() -> None:
    assert request_problem({**M, "max_tokens": 5000}, chat=False, max_output_tokens=4096)
    assert request_problem({**M, "max_tokens": 4096}, chat=False, max_output_tokens=4096) is None


def test_a_message_says_what_to_send() -> None:
    problem = request_problem({**M, "max_tokens": -1e12}, chat=False)
    assert problem is not None
    assert (
        "integer from 1 to 131072" in problem.message and "got -1000000000000.0" in problem.message
    )


BUDGETS: list[tuple[dict[str, Any], int]] = [
    ({}, DEFAULT_MAX_TOKENS),
    ({"max_tokens": 100}, 100),
    ({"max_completion_tokens": 50}, 50),
    ({"max_tokens": None, "max_completion_tokens": 50}, 50),
    ({"max_tokens": 100, "n": 8}, 800),  # n choices cost n output budgets
    ({"max_tokens": 100, "n": 2, "best_of": 5}, 500),  # best_of sequences are generated
    # bodies that skipped the rule still count a bounded budget
    ({"max_tokens": math.nan}, DEFAULT_MAX_TOKENS),
    ({"max_tokens": -1e12}, DEFAULT_MAX_TOKENS),
    ({"max_tokens": 10**15}, 131_072),
    ({"max_tokens": 10, "n": 10**9}, 10 * 128),
    ({"max_tokens": 10, "n": True}, 10),
]


@pytest.mark.parametrize(("extra", "budget"), BUDGETS)
def test_the_output_budget_counts_every_choice_and_stays_bounded(
    extra: dict[str, Any], budget: int
) -> None:
    assert output_budget({**M, **extra}) == budget


def test_choices_is_n_or_best_of() -> None:
    assert choices({}) == 1
    assert choices({"n": 3}) == 3
    assert choices({"n": 3, "best_of": 4}) == 4
