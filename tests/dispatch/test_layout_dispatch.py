"""The dispatch rule by request type (OServe §4.2) the simulator's harness and the router
share: the nearest type, smooth weighted round robin over per-type weights, the overflow
test."""

from __future__ import annotations

import math
from collections import Counter

import pytest

from sageserve.dispatch.layout_dispatch import (
    OVERFLOW_RATIO,
    OVERFLOW_TOKENS,
    TypeWeights,
    nearest_type,
    overflow,
)

#: two types: short (100 prompt, 20 output) and long (2,000 prompt, 300 output) in log space
CENTROIDS = ((math.log1p(100), math.log1p(20)), (math.log1p(2000), math.log1p(300)))


@pytest.mark.parametrize(
    ("prompt", "output", "type_"),
    [
        (100, 20, 0),
        (90, 25, 0),
        (2000, 300, 1),
        (4000, 10, 1),  # a long prompt decides a short answer's type
        (0, 0, 0),
        (-5, -1, 0),  # negative lengths count as 0
    ],
)
def test_a_request_goes_to_the_nearest_centroid_in_log_space(
    prompt: float, output: float, type_: int
) -> None:
    assert nearest_type(CENTROIDS, prompt, output) == type_


def test_a_tie_and_no_centroid_give_the_lower_type() -> None:
    same = ((1.0, 1.0), (1.0, 1.0))
    assert nearest_type(same, 5, 5) == 0
    assert nearest_type((), 5, 5) == 0


@pytest.mark.parametrize(
    ("weights", "n"),
    [
        ({"a": 2.0, "b": 1.0}, 300),
        ({"a": 0.5, "b": 0.3, "c": 0.2}, 1000),
        ({"a": 1 / 3, "b": 1 / 3, "c": 1 / 3}, 301),
        ({"a": 0.9, "b": 0.1}, 57),
        ({"a": 1.0}, 10),
    ],
)
def test_after_n_requests_each_key_is_within_one_request_of_its_share(
    weights: dict[str, float], n: int
) -> None:
    tw = TypeWeights({0: weights})
    total = sum(weights.values())
    seen: Counter[str] = Counter()
    for i in range(1, n + 1):
        pick = tw.choose(0, set(weights))
        assert pick is not None
        seen[pick] += 1
        for k, w in weights.items():  # at every prefix, not only at the end
            assert abs(seen[k] - i * w / total) < 1.0 + 1e-9


def test_the_exact_sequence_and_its_tie_break_by_the_greatest_key() -> None:
    tw = TypeWeights({0: {"a": 1.0, "b": 1.0}})
    # credits tie at every first step: the greatest key first, then alternation
    assert [tw.choose(0, {"a", "b"}) for _ in range(4)] == ["b", "a", "b", "a"]
    tw = TypeWeights({0: {"a": 2.0, "b": 1.0}})
    assert [tw.choose(0, {"a", "b"}) for _ in range(6)] == ["a", "b", "a", "a", "b", "a"]


def test_types_keep_separate_turns() -> None:
    tw = TypeWeights({0: {"a": 1.0, "b": 1.0}, 1: {"a": 1.0}})
    assert tw.choose(0, {"a", "b"}) == "b"
    assert tw.choose(1, {"a", "b"}) == "a"
    assert tw.choose(0, {"a", "b"}) == "a"


def test_an_absent_key_is_skipped_and_its_credit_left_as_it_was() -> None:
    tw = TypeWeights({0: {"a": 1.0, "b": 1.0, "c": 2.0}})
    present = {"a", "b", "c"}
    assert tw.choose(0, present) == "c"  # credits a 1, b 1, c 2 - 4 = -2
    frozen = tw.credit(0, "a")
    for _ in range(10):  # a's pods gone: b and c share in 1 : 2, a's credit untouched
        assert tw.choose(0, {"b", "c"}) in {"b", "c"}
    assert tw.credit(0, "a") == frozen
    # a returns with the credit it left with: no catch-up burst for the time away
    picks = [tw.choose(0, present) for _ in range(8)]
    assert picks.count("a") == 2


def test_no_present_key_no_weights_or_a_zero_weight_give_none() -> None:
    tw: TypeWeights[str] = TypeWeights({0: {"a": 1.0, "b": 0.0}})
    assert tw.choose(0, {"b"}) is None  # weight 0 is no weight
    assert tw.choose(0, set()) is None
    assert tw.choose(3, {"a"}) is None  # a type without weights
    assert tw.of(0) == {"a": 1.0}
    assert tw.of(3) == {}
    assert TypeWeights[str]().choose(0, {"a"}) is None


def test_new_weights_start_every_credit_again() -> None:
    tw = TypeWeights({0: {"a": 1.0, "b": 1.0}})
    assert tw.choose(0, {"a", "b"}) == "b"
    tw.set({0: {"a": 1.0, "b": 1.0}})
    assert tw.credit(0, "a") == tw.credit(0, "b") == 0.0
    assert tw.choose(0, {"a", "b"}) == "b"


@pytest.mark.parametrize(
    ("preferred", "alternative", "ratio", "tokens", "out"),
    [
        (0.0, 0.0, OVERFLOW_RATIO, OVERFLOW_TOKENS, False),  # nothing queues: the weights
        (1024.0, 0.0, OVERFLOW_RATIO, OVERFLOW_TOKENS, False),  # at the floor: stays
        (1025.0, 0.0, OVERFLOW_RATIO, OVERFLOW_TOKENS, True),  # above it against an idle one
        (2524.0, 1000.0, OVERFLOW_RATIO, OVERFLOW_TOKENS, False),  # 1.5 × 1000 + 1024 exactly
        (2525.0, 1000.0, OVERFLOW_RATIO, OVERFLOW_TOKENS, True),
        (50_000.0, 40_000.0, OVERFLOW_RATIO, OVERFLOW_TOKENS, False),  # both busy: no gain
        (5.0, 1.0, 2.0, 0.0, True),  # the threshold's parts are parameters
        (2.0, 1.0, 2.0, 0.0, False),
    ],
)
def test_a_request_overflows_only_when_its_preferred_replica_is_swamped(
    preferred: float, alternative: float, ratio: float, tokens: float, out: bool
) -> None:
    assert overflow(preferred, alternative, ratio, tokens) is out
