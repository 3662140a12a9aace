"""The twin's pods answer the OpenAI API, with the timing of their simulated instance.

A request to `/pods/<namespace>/<pod>/v1/completions` (or `/chat/completions`) joins that
pod's simulated vLLM instance (`TwinSim.submit`): it queues, is prefilled and decoded with
the pod's other simulated work, raises its KV usage and lands in its counters. The HTTP
answer follows the simulation: nothing is sent before the simulated first token; then
tokens stream at the instance's current decode step (simulated seconds ÷ the twin's speed),
and the rest is flushed when the simulated request finishes. Prompt tokens are the prompt's
characters ÷ 4; output tokens `max_tokens` (16 when absent). The text is filler: the twin
measures timing, not language.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

from sageserve.sim.instance import Job

DEFAULT_MAX_TOKENS = 16
#: How often a waiting HTTP thread looks at its simulated request (wall seconds).
POLL_S = 0.02


def request_tokens(body: dict[str, Any]) -> tuple[int, int]:
    """(prompt tokens, output tokens) of an OpenAI request body."""
    prompt = body.get("prompt") if "prompt" in body else body.get("messages", "")
    text = prompt if isinstance(prompt, str) else json.dumps(prompt)
    output = body.get("max_tokens") or body.get("max_completion_tokens") or DEFAULT_MAX_TOKENS
    return max(1, len(text) // 4), max(1, int(output))


def request_priority(body: dict[str, Any]) -> int:
    """vLLM's `priority` of a request body (0 when absent; lower is served first by an
    engine run with `--scheduling-policy priority`). Raises ValueError when it is not an
    integer, as vLLM's request validation does."""
    value = body.get("priority", 0)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"priority must be an integer, got {value!r}")
    return value


def tokens_as_simulated(
    job: Job,
    lock: threading.RLock,
    step_s: Callable[[], float],
    stopped: threading.Event,
    timeout_s: float = 600.0,
) -> Iterator[int]:
    """Yield how many new tokens to send, as the simulated request produces them."""
    deadline = time.monotonic() + timeout_s
    total = job.req.output_tokens
    sent = 0
    while sent < total and time.monotonic() < deadline and not stopped.is_set():
        with lock:
            started, done = job.first_token >= 0, job.done or job.finish_time >= 0
        if done:
            yield total - sent
            return
        if started:
            yield 1
            sent += 1
            time.sleep(max(POLL_S, step_s()))
        else:
            time.sleep(POLL_S)
    if sent < total and not stopped.is_set():
        yield total - sent


def chunk(model: str, chat: bool, n: int, rid: str) -> dict[str, Any]:
    """One streamed chunk carrying `n` filler tokens."""
    text = " tok" * n
    if chat:
        choice = {"index": 0, "delta": {"content": text}, "finish_reason": None}
        return {"id": rid, "object": "chat.completion.chunk", "model": model, "choices": [choice]}
    choice_c = {"index": 0, "text": text, "finish_reason": None}
    return {"id": rid, "object": "text_completion", "model": model, "choices": [choice_c]}


def final(model: str, chat: bool, prompt: int, output: int, rid: str) -> dict[str, Any]:
    """The whole answer of a non-streamed request."""
    text = " tok" * output
    usage = {"prompt_tokens": prompt, "completion_tokens": output, "total_tokens": prompt + output}
    if chat:
        msg = {"role": "assistant", "content": text}
        choice = {"index": 0, "message": msg, "finish_reason": "length"}
        return {
            "id": rid,
            "object": "chat.completion",
            "model": model,
            "choices": [choice],
            "usage": usage,
        }
    choice_c = {"index": 0, "text": text, "finish_reason": "length"}
    return {
        "id": rid,
        "object": "text_completion",
        "model": model,
        "choices": [choice_c],
        "usage": usage,
    }


def context_length_error(message: str) -> dict[str, Any]:
    """The 400 body for a request beyond the model's context: vLLM's message, in the
    OpenAI API's error shape with its code `context_length_exceeded`, so a client that
    handles OpenAI's error handles the twin's."""
    return {
        "error": {
            "message": message,
            "type": "invalid_request_error",
            "param": "messages",
            "code": "context_length_exceeded",
        }
    }


def invalid_request(message: str, param: str) -> dict[str, Any]:
    """A 400 body in the OpenAI API's error shape naming the field at fault."""
    return {"error": {"message": message, "type": "invalid_request_error", "param": param}}


def new_id() -> str:
    return f"cmpl-{uuid.uuid4().hex[:16]}"
