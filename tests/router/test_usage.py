"""Tokens of an answer: the pod's usage when it reports one, else the router's estimate."""

from __future__ import annotations

import pytest

from sageserve.router.usage import answered_tokens, reported_usage

PLAIN = (
    b'{"id":"c1","choices":[{"text":"hi"}],'
    b'"usage":{"prompt_tokens":12,"completion_tokens":8,"total_tokens":20}}'
)
STREAM_WITH_USAGE = (
    b'data: {"choices":[{"delta":{"content":"a"}}]}\n\n'
    b'data: {"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":1,"total_tokens":6}}\n\n'
    b"data: [DONE]\n\n"
)


@pytest.mark.parametrize(
    ("tail", "events", "expected"),
    [
        (PLAIN, 0, 20.0),  # an answer with usage: the pod's count
        (STREAM_WITH_USAGE, 2, 6.0),  # a stream that asked for usage
        (b'data: {"choices":[{"delta":{"content":"a"}}]}\n\n', 7, 30.0 + 7),  # one per event
        (b'{"choices":[{"text":"hi"}]}', 0, 286.0),  # no usage, not streamed: the estimate
        (b'{"usage":{"prompt_tokens":"x"}}', 0, 286.0),  # garbled usage: the estimate
    ],
)
def test_answered_tokens(tail: bytes, events: int, expected: float) -> None:
    assert answered_tokens(tail, events, 30.0, 286.0) == expected


def test_the_last_usage_of_a_tail_counts() -> None:
    tail = (
        b'"usage":{"prompt_tokens":1,"completion_tokens":1} ... '
        b'"usage":{"prompt_tokens":3,"completion_tokens":4}'
    )
    assert reported_usage(tail) == 7.0
