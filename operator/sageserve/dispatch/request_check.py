"""One rule for the numbers and options of an OpenAI completions or chat request.

Why here, pure and first: the router counts a request's work (its EMU estimate, the spill
ledger, the Queue Manager's trough) and the Batch API's plan counts its tokens *from the
body*. A `max_tokens` of NaN, Infinity or -1e12, or an `n` of 8 that nobody multiplies,
poisons those sums for everyone. So a body is checked before anything is counted, by the
same function on both paths: the router answers 400 naming the field
(`router.app.Router._parse`), a Batch API line becomes that line's error
(`batch.jsonl._request_problem`).

Checked by JSON type and range, as the OpenAI API documents them (vLLM's own limits where
it is stricter): a bool is not a number (Python's `True == 1` would let it pass), a float
is not an integer, and NaN or Infinity (which Python's JSON reader accepts as literals)
is refused wherever it appears in the body. Fields not named here go to the pod as sent;
the pod judges them.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeGuard

#: The most output tokens one request may ask for unless the router is told otherwise
#: (`--max-output-tokens`): 128 Ki, the longest context of the models served today.
DEFAULT_MAX_OUTPUT_TOKENS = 131_072
#: Output budget assumed for a request without `max_tokens` (vLLM's default is up to the
#: context; a fixed estimate keeps the in-flight accounting bounded).
DEFAULT_MAX_TOKENS = 256
#: OpenAI's bound on `n` (choices per request); `best_of` likewise.
MAX_CHOICES = 128
#: `stop`: one string or a list of at most this many (OpenAI's bound).
MAX_STOP = 4
#: `user`: the end-user id a client passes along (OpenAI recommends a hash; 256 keeps
#: per-client state small).
MAX_USER_CHARS = 256
#: `top_logprobs` (chat) and `logprobs` (completions): vLLM's default `max_logprobs`.
MAX_LOGPROBS = 20
#: `seed`: a signed 64-bit integer, as vLLM takes it.
SEED_RANGE = (-(2**63), 2**63 - 1)


@dataclass(frozen=True)
class RequestProblem:
    """What is wrong with a request body: the field to blame (OpenAI's `param`) and a
    message that names it, what was sent and what to send instead."""

    param: str
    message: str


def _is_int(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return _is_int(value) or (isinstance(value, float) and math.isfinite(value))


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _integer(body: Mapping[str, Any], name: str, low: int, high: int, what: str) -> str | None:
    value = body.get(name)
    if value is None:
        return None
    if not _is_int(value) or not low <= value <= high:
        return f"{name} must be an integer from {low} to {high} ({what}); got {_shown(value)}"
    return None


def _number(
    body: Mapping[str, Any], name: str, low: float, high: float, low_open: bool = False
) -> str | None:
    value = body.get(name)
    if value is None:
        return None
    if not _is_number(value) or (value <= low if low_open else value < low) or value > high:
        bracket = "(" if low_open else "from "
        span = f"{bracket}{low:g}, {high:g}]" if low_open else f"{bracket}{low:g} to {high:g}"
        return f"{name} must be a number {span}; got {_shown(value)}"
    return None


def _bool(body: Mapping[str, Any], name: str) -> str | None:
    value = body.get(name)
    if value is None or isinstance(value, bool):
        return None
    return f"{name} must be true or false; got {_shown(value)}"


def _stop(body: Mapping[str, Any]) -> str | None:
    value = body.get("stop")
    if value is None or isinstance(value, str):
        return None
    if (
        isinstance(value, list)
        and len(value) <= MAX_STOP
        and all(isinstance(s, str) for s in value)
    ):
        return None
    return f"stop must be a string or a list of at most {MAX_STOP} strings; got {_shown(value)}"


def _user(body: Mapping[str, Any]) -> str | None:
    value = body.get("user")
    if value is None or (isinstance(value, str) and len(value) <= MAX_USER_CHARS):
        return None
    return (
        f"user must be a string of at most {MAX_USER_CHARS} characters (an id of the end "
        f"user, e.g. a hash); got {_shown(value)}"
    )


def _logprobs(body: Mapping[str, Any], chat: bool) -> str | None:
    """Chat takes `logprobs` as a switch and `top_logprobs` as the count; completions
    takes the count as `logprobs`."""
    if chat:
        return _bool(body, "logprobs")
    return _integer(body, "logprobs", 0, MAX_LOGPROBS, "the most likely tokens to return")


def _top_logprobs(body: Mapping[str, Any], chat: bool) -> str | None:
    if not chat:
        return None
    what = "the most likely tokens to return per position"
    return _integer(body, "top_logprobs", 0, MAX_LOGPROBS, what)


def _not_finite(body: Mapping[str, Any]) -> str | None:
    """The top-level field under which a NaN or ±Infinity hides, anywhere in the body
    (a walk with its own stack: JSON's depth is bounded by the reader, not here)."""
    for name, value in body.items():
        stack = [value]
        while stack:
            item = stack.pop()
            if isinstance(item, float) and not math.isfinite(item):
                return str(name)
            if isinstance(item, dict):
                stack.extend(item.values())
            elif isinstance(item, list):
                stack.extend(item)
    return None


def request_problem(
    body: Mapping[str, Any], chat: bool, max_output_tokens: int = DEFAULT_MAX_OUTPUT_TOKENS
) -> RequestProblem | None:
    """The first problem of a completions (`chat` False) or chat completions body, or None.

    `max_output_tokens` bounds `max_tokens` and `max_completion_tokens` (the router's
    `--max-output-tokens`: a model's context, or a fleet-wide cap)."""
    model = body.get("model")
    if not isinstance(model, str) or not model:
        return RequestProblem("model", "model: required, the name of a served model")
    bad = _not_finite(body)
    if bad is not None:
        return RequestProblem(
            bad, f"{bad}: NaN and Infinity are not JSON numbers; send a finite number"
        )
    checks: list[tuple[str, str | None]] = [
        ("max_tokens", _integer(body, "max_tokens", 1, max_output_tokens, "output tokens")),
        (
            "max_completion_tokens",
            _integer(body, "max_completion_tokens", 1, max_output_tokens, "output tokens"),
        ),
        ("n", _integer(body, "n", 1, MAX_CHOICES, "choices to generate")),
        ("best_of", _integer(body, "best_of", 1, MAX_CHOICES, "candidates to choose from")),
        ("temperature", _number(body, "temperature", 0.0, 2.0)),
        ("top_p", _number(body, "top_p", 0.0, 1.0, low_open=True)),
        ("presence_penalty", _number(body, "presence_penalty", -2.0, 2.0)),
        ("frequency_penalty", _number(body, "frequency_penalty", -2.0, 2.0)),
        ("logprobs", _logprobs(body, chat)),
        ("top_logprobs", _top_logprobs(body, chat)),
        ("seed", _integer(body, "seed", *SEED_RANGE, "a 64-bit integer")),
        ("stream", _bool(body, "stream")),
        ("stop", _stop(body)),
        ("user", _user(body)),
    ]
    for param, message in checks:
        if message is not None:
            return RequestProblem(param, message)
    n, best_of = body.get("n"), body.get("best_of")
    if _is_int(n) and _is_int(best_of) and best_of < n:
        return RequestProblem(
            "best_of", f"best_of must be at least n ({n}); got {best_of}: raise best_of or lower n"
        )
    return None


def choices(body: Mapping[str, Any]) -> int:
    """How many sequences the pod generates for a request: `n`, or `best_of` when larger
    (1 when neither is a valid count)."""
    counts = [v for v in (body.get("n"), body.get("best_of")) if _is_int(v)]
    return min(max([1, *counts]), MAX_CHOICES)


def output_budget(
    body: Mapping[str, Any], max_output_tokens: int = DEFAULT_MAX_OUTPUT_TOKENS
) -> int:
    """The output tokens a request may cost: its `max_tokens` (else
    `max_completion_tokens`, else `DEFAULT_MAX_TOKENS`) times its `choices`. Bounded even
    for a body that skipped `request_problem` (a Batch API line queued before this rule):
    an invalid budget counts as the default, a valid one at most `max_output_tokens`."""
    budget = DEFAULT_MAX_TOKENS
    for name in ("max_tokens", "max_completion_tokens"):
        value = body.get(name)
        if value is not None:
            if _is_int(value) and value >= 1:
                budget = min(value, max_output_tokens)
            break
    return budget * choices(body)


def estimated_tokens(
    body: Mapping[str, Any], max_output_tokens: int = DEFAULT_MAX_OUTPUT_TOKENS
) -> tuple[float, float]:
    """(prompt, prompt + output budget) in tokens: prompt characters ÷ 4, and `max_tokens`
    times the choices generated (`n`, `best_of`): the router's estimate of a request's
    work before the pod reports it, and the tokens a Batch API request is queued with (its
    deadline need and its service time, `batch.store`). Finite and bounded whatever the
    body says (`output_budget`), since EMU, the spill ledger and the batch plan add it up."""
    prompt = body.get("prompt") or body.get("messages") or ""
    chars = len(prompt) if isinstance(prompt, str) else len(json.dumps(prompt))
    budget = output_budget(body, max_output_tokens)
    return chars / 4.0, chars / 4.0 + budget


__all__ = [
    "DEFAULT_MAX_OUTPUT_TOKENS",
    "DEFAULT_MAX_TOKENS",
    "MAX_CHOICES",
    "MAX_LOGPROBS",
    "MAX_STOP",
    "MAX_USER_CHARS",
    "RequestProblem",
    "choices",
    "estimated_tokens",
    "output_budget",
    "request_problem",
]
