"""A Batch API line is judged by the router's request rule (`dispatch.request_check`): a bad
number is that line's error, the other lines run, and nothing of it reaches the plan."""

from __future__ import annotations

import json
import math
from typing import Any

from sageserve.batch.jsonl import parse_input
from sageserve.dispatch.request_check import estimated_tokens

URL = "/v1/chat/completions"


def line(custom_id: str, **body: Any) -> str:
    payload = {"model": "m", "messages": [{"role": "user", "content": "hi"}], **body}
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": URL, "body": payload})


def test_a_bad_number_is_that_lines_error_and_the_rest_run() -> None:
    content = "\n".join(
        [
            line("ok", max_tokens=64, n=2),
            line("huge", max_tokens=10**15),  # the plan would have counted 1e15 tokens
            line("nan", max_tokens=math.nan),  # json.dumps writes the NaN literal
            line("n0", n=0),
            line("temp", temperature=True),
            line("ok2"),
        ]
    ).encode()
    parsed = parse_input(content, URL, lambda _m: "batch")
    assert [r.custom_id for r in parsed.requests] == ["ok", "ok2"]
    errors = {e.custom_id: (e.line, e.code, e.message) for e in parsed.errors}
    assert errors["huge"][:2] == (2, "invalid_request")
    assert errors["huge"][2].startswith("line 2: body.max_tokens must be an integer from 1")
    assert "body.max_tokens" in errors["nan"][2] and "finite" in errors["nan"][2]
    assert errors["n0"][2].startswith("line 4: body.n must be an integer from 1 to 128")
    assert errors["temp"][2].startswith("line 5: body.temperature must be a number")
    # what runs is counted with its n choices, and only that reaches the plan
    planned = sum(estimated_tokens(r.body)[1] for r in parsed.requests)
    assert planned < 1_000
