"""How many tokens an answer cost: the pod's own count when it reports one, else an estimate.

vLLM puts `usage` (prompt and completion tokens) in every non-streamed answer and in the last
event of a stream when the client asks for it (`stream_options.include_usage`); otherwise a
stream carries one event per generated token (or a few). The router keeps only the tail of
each answer, so counting costs no copy of the whole body.
"""

from __future__ import annotations

import re

#: Bytes of an answer's end kept to find its usage (the last event is a few hundred bytes).
TAIL_BYTES = 4096

_USAGE = re.compile(rb'"usage"\s*:\s*\{[^{}]*\}')
_FIELD = re.compile(rb'"(prompt_tokens|completion_tokens)"\s*:\s*(\d+)')


def reported_usage(tail: bytes) -> float | None:
    """Prompt + completion tokens of the last `usage` object in `tail`, if there is one."""
    found = None
    for found in _USAGE.finditer(tail):  # noqa: B007 — the last one is the answer's total
        pass
    if found is None:
        return None
    fields = dict(_FIELD.findall(found.group(0)))
    if not fields:
        return None
    return float(sum(int(v) for v in fields.values()))


def reported_completion(tail: bytes) -> int | None:
    """`completion_tokens` of the last `usage` object in `tail` (the pod's output count),
    if there is one: what the router's length predictor learns from."""
    found = None
    for found in _USAGE.finditer(tail):  # noqa: B007 — the last one is the answer's total
        pass
    if found is None:
        return None
    fields = dict(_FIELD.findall(found.group(0)))
    value = fields.get(b"completion_tokens")
    return int(value) if value is not None else None


def answered_tokens(
    tail: bytes, events: int, prompt_estimate: float, total_estimate: float
) -> float:
    """Tokens of one answer: its usage, else the prompt estimate plus one token per streamed
    event (events = 0 for an answer that was not streamed: then the whole estimate)."""
    usage = reported_usage(tail)
    if usage is not None:
        return usage
    if events > 0:
        return prompt_estimate + events
    return total_estimate
