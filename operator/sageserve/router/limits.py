"""The router's side of per-tenant rate limits: the tier's limits (WorkloadTier
`spec.limits`, carried by discovery into `TierMatch.limits`) applied to a client's request
once its tier is chosen, before it is held or sent (`dispatch.rate_limit` decides).

A refused request is answered 429 with `Retry-After` and an error shaped as OpenAI shapes
its own (`type` "requests" or "tokens", `code` "rate_limit_exceeded", the limit and its
value in the message); every answer of a limited tier carries OpenAI's
`x-ratelimit-{limit,remaining,reset}-{requests,tokens}` headers, so a client can pace
itself before it is refused. Only client requests pass here: Batch API lines the Queue
Manager releases (`Router.execute`) are paced by the queue, not rate limited.

The buckets live in this router replica: with R replicas behind a Service, a key may get
up to R times its budget (docs/router.md).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

from aiohttp import web

from sageserve.dispatch.identity import Principal
from sageserve.dispatch.rate_limit import (
    MAX_BUCKETS,
    LimitState,
    RateLimiter,
    Verdict,
    rate_limit_headers,
    retry_after_header,
)
from sageserve.router.fleet import Fleet, ModelRoute
from sageserve.router.metrics import RouterMetrics

#: The `x-ratelimit-*` headers of this request's answer (set when its tier is limited).
RATE_HEADERS = web.RequestKey("sageserve.rate_limit_headers", dict)

_PER_MINUTE = {"requests": "requests per minute (RPM)", "tokens": "tokens per minute (TPM)"}


class TierLimits:
    """Applies each tier's limits to the requests of its callers."""

    def __init__(
        self,
        fleet: Fleet,
        metrics: RouterMetrics,
        clock: Callable[[], float] = time.monotonic,
        max_buckets: int = MAX_BUCKETS,
    ) -> None:
        self.fleet = fleet
        self.metrics = metrics
        #: seconds on a monotonic clock; tests pass their own so that nothing sleeps
        self.clock = clock
        self.limiter = RateLimiter(max_buckets)

    def check(
        self,
        request: web.Request,
        model: ModelRoute,
        tier: str,
        principal: Principal,
        tokens: float,
    ) -> web.Response | None:
        """None to go on (the headers noted for the answer), else the 429 to answer.
        `tokens` is the request's estimated cost (`dispatch.request_check.estimated_tokens`)."""
        match = self.fleet.tiers.get(model.namespace, {}).get(tier)
        if match is None or match.limits is None:
            return None
        verdict = self.limiter.admit(
            model.namespace, tier, principal.key_id, match.limits, tokens, self.clock()
        )
        request[RATE_HEADERS] = rate_limit_headers(verdict)
        refused = verdict.refused_by
        if refused is None:
            return None
        self.metrics.limited(model.namespace, tier, refused.kind)
        return too_many(tier, refused, verdict, match.limits.per_tier)


def too_many(tier: str, refused: LimitState, verdict: Verdict, per_tier: bool) -> web.Response:
    """The 429: which limit, its value, what was asked, and when to come back."""
    whose = "shared by the tier's API keys" if per_tier else "per API key"
    limit = f"{tier!r} on {_PER_MINUTE[refused.kind]} ({whose})"
    asked = f"Limit {refused.limit}, Requested {math.ceil(refused.cost)}"
    if refused.too_large:
        message = (
            f"Request too large for tier {limit}: {asked}. The estimate is prompt "
            "characters ÷ 4 plus max_tokens: lower max_tokens or the prompt; waiting "
            "will not help."
        )
    else:
        wait = retry_after_header(verdict.retry_after)
        message = f"Rate limit reached for tier {limit}: {asked}. Please try again in {wait}s."
    body = {
        "error": {
            "message": message,
            "type": refused.kind,
            "param": None,
            "code": "rate_limit_exceeded",
        }
    }
    response = web.json_response(body, status=429)
    if not refused.too_large:
        response.headers["Retry-After"] = retry_after_header(verdict.retry_after)
    return response


async def add_rate_headers(request: web.Request, response: web.StreamResponse) -> None:
    """`on_response_prepare`: a limited tier's `x-ratelimit-*` headers on its answer, the
    proxied one included (added as it is prepared, before its first byte)."""
    headers: dict[str, Any] | None = request.get(RATE_HEADERS)
    if headers:
        response.headers.update(headers)


__all__ = ["RATE_HEADERS", "TierLimits", "add_rate_headers", "too_many"]
