"""Reading an OpenAI batch input file: one request per line, each line judged on its own.

Why per line: a batch of thousands of requests should not fail because one line is bad
(bad input loses nothing). A malformed line, a line for a model this router does not serve
for batch work, a url that is not the batch's endpoint or a repeated ``custom_id`` becomes
a line of the errors file naming its line number and the fix; every other line runs. A
line nested deeper than ``limits.MAX_DEPTH`` is one of those errors, found by counting
brackets before ``json.loads`` would recurse into it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from sageserve.batch.limits import BadJson, load_json
from sageserve.dispatch.request_check import estimated_tokens

#: The endpoints a batch may target (OpenAI's Batch API also has embeddings; the pods
#: here serve completions).
ENDPOINTS = ("/v1/chat/completions", "/v1/completions")
MAX_CUSTOM_ID = 512

#: served model name -> its batch tier, or None when the model is not served for batch
KnownModels = Callable[[str], str | None]


def request_tokens(body: Mapping[str, Any]) -> int:
    """The tokens a queued request is counted with: the router's estimate of a client's
    request of this body (prompt ÷ 4 characters + output budget, `estimated_tokens`),
    rounded up. Its share of the model's deadline need and its expected service time in
    the promotion rule (SageServe §6.2, §6.3), as `BatchQueueManager` is given them."""
    return math.ceil(estimated_tokens(body)[1])


@dataclass(frozen=True)
class ParsedLine:
    """A line that can run."""

    line: int
    custom_id: str
    model: str
    tier: str
    body: dict[str, Any]


@dataclass(frozen=True)
class LineError:
    """A line that cannot run, with OpenAI's error code and a message naming the line."""

    line: int
    custom_id: str | None
    code: str
    message: str


@dataclass(frozen=True)
class ParsedFile:
    requests: list[ParsedLine]
    errors: list[LineError]

    @property
    def total(self) -> int:
        return len(self.requests) + len(self.errors)


def parse_input(content: bytes, endpoint: str, known_models: KnownModels) -> ParsedFile:
    """Split ``content`` into runnable requests and line errors (blank lines are skipped;
    line numbers count every physical line from 1)."""
    requests: list[ParsedLine] = []
    errors: list[LineError] = []
    seen: dict[str, int] = {}
    for number, raw in enumerate(content.split(b"\n"), start=1):
        if not raw.strip():
            continue
        parsed = _parse_line(number, raw, endpoint, known_models)
        if isinstance(parsed, LineError):
            errors.append(parsed)
            continue
        first = seen.get(parsed.custom_id)
        if first is not None:
            errors.append(
                LineError(
                    number,
                    parsed.custom_id,
                    "duplicate_custom_id",
                    f"line {number}: custom_id {parsed.custom_id!r} was already used on line "
                    f"{first}: give every request of a file its own custom_id",
                )
            )
            continue
        seen[parsed.custom_id] = number
        requests.append(parsed)
    return ParsedFile(requests, errors)


def _parse_line(
    number: int, raw: bytes, endpoint: str, known_models: KnownModels
) -> ParsedLine | LineError:
    try:
        obj = load_json(raw)
    except BadJson as exc:
        return LineError(
            number,
            None,
            "invalid_json_line",
            f"line {number} is not JSON a request can be read from ({exc}): each line must be "
            'one UTF-8 JSON object {"custom_id", "method", "url", "body"}',
        )
    if not isinstance(obj, dict):
        return LineError(
            number,
            None,
            "invalid_json_line",
            f"line {number} is a JSON {type(obj).__name__}, not an object: each line must be "
            '{"custom_id", "method", "url", "body"}',
        )
    custom_id = obj.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id or len(custom_id) > MAX_CUSTOM_ID:
        return LineError(
            number,
            None,
            "missing_required_parameter",
            f"line {number}: custom_id is missing or not a string of 1-{MAX_CUSTOM_ID} "
            "characters: give every request a custom_id to find its result by",
        )
    problem = _request_problem(number, obj, endpoint)
    if problem is not None:
        code, message = problem
        return LineError(number, custom_id, code, message)
    body: dict[str, Any] = obj["body"]
    model: str = body["model"]
    tier = known_models(model)
    if tier is None:
        return LineError(
            number,
            custom_id,
            "model_not_found",
            f"line {number}: model {model!r} is not served here for batch work: use the "
            "served name of a model with a batch tier (GET /v1/models lists the served names)",
        )
    return ParsedLine(number, custom_id, model, tier, body)


def _request_problem(number: int, obj: dict[str, Any], endpoint: str) -> tuple[str, str] | None:
    """The (code, message) of what is wrong with a line's method, url or body, if any."""
    method = obj.get("method")
    if method != "POST":
        return (
            "invalid_request",
            f"line {number}: method must be 'POST', got {method!r}",
        )
    url = obj.get("url")
    if url != endpoint:
        return (
            "invalid_url",
            f"line {number}: url {url!r} is not the batch's endpoint {endpoint!r}: every line "
            "of a batch goes to the endpoint the batch was created with",
        )
    body = obj.get("body")
    if not isinstance(body, dict):
        return (
            "missing_required_parameter",
            f"line {number}: body must be a JSON object, the request to send to {endpoint}",
        )
    model = body.get("model")
    if not isinstance(model, str) or not model:
        return (
            "missing_required_parameter",
            f"line {number}: body.model is required, the served name of a model",
        )
    if body.get("stream"):
        return (
            "invalid_request",
            f"line {number}: body.stream must be false or absent: batch results are "
            "written whole to the output file",
        )
    # the router's rule, so a line is refused for what a request would be refused for
    # and no line's max_tokens or n reaches the plan unchecked
    from sageserve.dispatch.request_check import request_problem

    problem = request_problem(body, chat=endpoint == "/v1/chat/completions")
    if problem is not None:
        return ("invalid_request", f"line {number}: body.{problem.message}")
    return None
