"""`sageserve router`: the OpenAI-compatible request path in front of the pod sets.

Why aiohttp: one well-kept library gives both the server (streamed responses, a request
body limit enforced while reading, cancellation when the client goes away) and the client
that forwards to vLLM, on one event loop; it is already in the dependency tree.

Per request: the body's bytes are claimed against `max_inflight_bytes` (429 past it,
before it is read), it is read up to `max_body_bytes` (413 past it) and must be JSON whose
numbers and options pass `dispatch.request_check` (400 naming the field otherwise, before
anything is counted); the model must be one a ModelDeployment serves (404); its tier comes
from `dispatch.identity` (400 naming the allowed tiers); the region header must name one of
the model's regions (400); the region and pod from `Fleet` (the `dispatch/` functions). A
model with no ready pod anywhere is *held* (at most `max_held_requests`, 429 past it): the
request waits (bounded) while `sageserve_router_held_requests` tells the operator that
demand waits, and the decision step scales that endpoint from zero; when the wait runs out
the client gets 503 with Retry-After (`dispatch.hold`, the rule and bounds the simulator
holds requests by). Every metric label comes from discovery's sets or a
fixed enum, never from a request's text. A pod that fails before the first byte is retried
once on another pod (and gets no new request for `eject_seconds`); after it, a streaming
client gets an error event. Requests go only to pods discovered in the cluster, never to a
host taken from the request.

Hostile or broken clients (docs/reliability.md): a connection with no request under way is
closed after `idle_timeout_seconds`, also one that never finishes its headers (slowloris);
a body must arrive within `body_timeout_seconds` (408); a declared body over the limit is
refused before a byte of it is read (413, with `Expect: 100-continue` before it is even
sent); who may use which model and tier is the caller's API key (`dispatch.identity`: 401
without one where keys are declared, another tenant's models do not exist for it, the tier
header only narrows among the key's tiers); a tier's rate limits (`router.limits`) answer
429 past their budget, as do the caps on held requests and on bodies in flight; a streamed
answer
whose pod stays silent `stall_timeout_seconds` counts as a failure before the first byte.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import web
from aiohttp.http import HttpVersion11
from aiohttp.typedefs import Handler

from sageserve.batch.api import PRINCIPAL
from sageserve.batch.limits import BadJson, load_json
from sageserve.dispatch.hold import HOLD_S, MAX_HELD, Hold, admit, hold_until, keep
from sageserve.dispatch.identity import ANONYMOUS, Principal, Refusal, bearer_key, choose_tier
from sageserve.dispatch.instance_order import engine_priority, waiting_for
from sageserve.dispatch.instance_picker import Arrival
from sageserve.dispatch.queue_manager import release_count
from sageserve.dispatch.request_check import (
    DEFAULT_MAX_OUTPUT_TOKENS,
    estimated_tokens,
    request_problem,
)
from sageserve.dispatch.tiers import TIER_HEADER
from sageserve.router.anticipate import Ticket, client_id
from sageserve.router.ejection import Ejections
from sageserve.router.fleet import Backend, Fleet, ModelRoute
from sageserve.router.limits import TierLimits, add_rate_headers
from sageserve.router.metrics import LIMIT_HELD_REQUESTS, LIMIT_INFLIGHT_BYTES, RouterMetrics
from sageserve.router.peers import FORWARDED_HEADER, IDENTITY_HEADERS
from sageserve.router.pool_switcher import Lease, PoolSwitcher, PoolSwitchFailed
from sageserve.router.usage import TAIL_BYTES, answered_tokens, reported_completion

log = logging.getLogger("sageserve.router")

#: The client's home region (the router's own region when absent).
REGION_HEADER = "x-sageserve-region"
#: The pod that answered, on every proxied answer (which pod the in-region picker chose).
POD_HEADER = "x-sageserve-pod"
#: Paths answered before discovery has listed the cluster (probes and metrics), and
#: without an API key.
PROBE_PATHS = frozenset({"/healthz", "/readyz", "/metrics"})

#: A refused body is read and thrown away this long at most, so that the client sees the
#: answer rather than a reset connection; then the connection is closed.
LINGER_SECONDS = 2.0
#: A pod that does not accept a connection in this long is down (fail over at once).
CONNECT_TIMEOUT_SECONDS = 5.0
#: Pending connections the kernel queues while the loop is busy (a burst of connections
#: must not be dropped at the door; capped by net.core.somaxconn).
BACKLOG = 4096


@dataclass(frozen=True)
class RouterConfig:
    max_body_bytes: int = 8 * 1024 * 1024
    #: A request for a model with no ready pod anywhere waits this long, then 503
    #: (`dispatch.hold.HOLD_S`, the simulator's hold).
    hold_seconds: float = HOLD_S
    retry_after_seconds: int = 30
    upstream_timeout_seconds: float = 600.0
    home_region: str | None = None
    #: A connection with no request under way is closed after this long, counted from
    #: the connection or the last answer: an idle or slowloris client holds ~6 KB of
    #: memory and a file descriptor until then (docs/reliability.md).
    idle_timeout_seconds: float = 75.0
    #: The whole request body must arrive in this long, else 408.
    body_timeout_seconds: float = 30.0
    #: A streamed answer whose pod sends nothing for this long (before the headers or
    #: between chunks) has failed; before the first byte it is retried elsewhere.
    #: Non-streamed answers come whole at the end, so only `upstream_timeout_seconds`
    #: bounds them.
    stall_timeout_seconds: float = 60.0
    #: A pod that failed before the first byte gets no new request for this long.
    eject_seconds: float = 30.0
    #: The most output tokens (`max_tokens`, `max_completion_tokens`) one request may ask
    #: for; more is a 400 before anything is counted (`dispatch.request_check`).
    max_output_tokens: int = DEFAULT_MAX_OUTPUT_TOKENS
    #: Requests waiting for a model with no ready pod, at most; past it 429 (a held
    #: request keeps its body and a connection until a pod comes or the hold runs out;
    #: `dispatch.hold.MAX_HELD`, the simulator's bound).
    max_held_requests: int = MAX_HELD
    #: Bytes of request bodies the router has at once (being read, held or forwarded,
    #: Batch API uploads included: `claim_bytes`); past it 429 before the body is read.
    #: A body of unknown length (chunked) counts as `max_body_bytes` until it has been read.
    max_inflight_bytes: int = 128 * 1024 * 1024
    #: region -> base URL of the router (or gateway) of the cluster that serves it
    #: (`router.peers`): a region of a model with no pod here is reached through it
    peers: Mapping[str, str] = field(default_factory=dict)


def openai_error(
    status: int, message: str, type_: str, param: str | None = None, code: str | None = None
) -> web.Response:
    """An error shaped as the OpenAI API shapes them."""
    body = {"error": {"message": message, "type": type_, "param": param, "code": code}}
    return web.json_response(body, status=status)


#: Seconds a client is asked to wait after a 429 for in-flight bytes (bodies come and go
#: in seconds; a held request waits for a model to start, `retry_after_seconds`).
BUSY_RETRY_AFTER_SECONDS = 5


@dataclass
class ByteBudget:
    """Bytes of request bodies the router has at once, against a limit: each request
    claims its declared length before its body is read and gives it back when answered,
    so a burst of large bodies costs at most the limit, not the burst."""

    limit: int
    used: int = 0

    def claim(self, size: int) -> ByteClaim | None:
        """`size` bytes claimed, or None when they would pass the limit."""
        if self.used + size > self.limit:
            return None
        self.used += size
        return ByteClaim(self, size)


@dataclass
class ByteClaim:
    budget: ByteBudget
    size: int

    def resize(self, size: int) -> None:
        """The body turned out `size` bytes (a chunked body, claimed at the most)."""
        self.budget.used += size - self.size
        self.size = size

    def release(self) -> None:
        self.budget.used -= self.size
        self.size = 0


#: An anonymous request for a model whose namespace lists keys.
ANONYMOUS_REFUSED = Refusal(
    401,
    "invalid_request_error",
    "an API key is required for this model: send Authorization: Bearer <key>",
)


def refusal_response(refusal: Refusal) -> web.Response:
    response = openai_error(refusal.status, refusal.message, refusal.kind, refusal.param)
    if refusal.status == 503:
        response.headers["Retry-After"] = "5"
    return response


def principal_of(request: web.Request) -> Principal:
    """The caller `_identified` found (anonymous for a request that skipped it)."""
    found = request.get(PRINCIPAL)
    return found if isinstance(found, Principal) else ANONYMOUS


@web.middleware
async def _openai_shaped(request: web.Request, handler: Handler) -> web.StreamResponse:
    """aiohttp's own refusals (no such path, a method the path does not take) answered as
    the OpenAI API answers errors, so a client's SDK can read every error the router gives."""
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400 or exc.content_type == "application/json":
            raise
        message = f"{request.method} {request.path}: {exc.reason}"
        response = openai_error(exc.status, message, "invalid_request_error")
        if exc.status == 405 and "Allow" in exc.headers:
            response.headers["Allow"] = exc.headers["Allow"]
        return response


class Router:
    """The request handlers over one `Fleet`."""

    def __init__(
        self,
        fleet: Fleet,
        config: RouterConfig,
        metrics: RouterMetrics,
        extra_routes: Callable[[web.Application], None] | None = None,
        limits: TierLimits | None = None,
    ) -> None:
        self.fleet = fleet
        self.config = config
        self.metrics = metrics
        self.extra_routes = extra_routes  # the Batch API's, when the router has a queue
        self.session: aiohttp.ClientSession | None = None
        self.ejected = Ejections(config.eject_seconds)
        #: request-level switching of pooled models (None: the router serves no pool)
        self.pools: PoolSwitcher | None = None
        #: each tier's rate limits (WorkloadTier spec.limits), applied in `forward`
        self.limits = limits or TierLimits(fleet, metrics)
        #: request bodies the router has (`max_inflight_bytes`), requests held
        #: (`max_held_requests`)
        self.body_bytes = ByteBudget(config.max_inflight_bytes)
        self.held = 0
        metrics.body_bytes(lambda: self.body_bytes.used)

    def app(self) -> web.Application:
        app = web.Application(
            client_max_size=self.config.max_body_bytes,
            middlewares=[_openai_shaped, self._after_listing, self._identified],
        )
        if self.extra_routes is not None:
            self.extra_routes(app)
        app.router.add_get("/v1/models", self.models)
        app.router.add_post("/v1/completions", self.forward, expect_handler=self._expect)
        app.router.add_post("/v1/chat/completions", self.forward, expect_handler=self._expect)
        app.router.add_get("/metrics", self.own_metrics)
        app.router.add_get("/healthz", self.healthz)
        app.router.add_get("/readyz", self.readyz)
        app.on_response_prepare.append(add_rate_headers)
        app.on_startup.append(self._open)
        app.on_cleanup.append(self._close)
        return app

    async def _open(self, _: web.Application) -> None:
        timeout = aiohttp.ClientTimeout(total=self.config.upstream_timeout_seconds)
        self.session = aiohttp.ClientSession(timeout=timeout, auto_decompress=False)

    async def _close(self, _: web.Application) -> None:
        if self.session is not None:
            await self.session.close()

    async def healthz(self, _: web.Request) -> web.Response:
        return web.Response(text="ok")

    @web.middleware
    async def _after_listing(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """A replica just started does not know yet which models, tiers and pods exist: an
        API request waits (at most the hold time) for discovery's first lists instead of
        being refused as an unknown model or a Batch API line as unservable."""
        if request.path not in PROBE_PATHS and not self.fleet.listed.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.fleet.listed.wait(), self.config.hold_seconds)
        return await handler(request)

    @web.middleware
    async def _identified(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """Every API call is made by someone: the key decides who (`dispatch.identity`), and
        a call without a valid key where one is required ends here, before its body is
        read."""
        if request.path in PROBE_PATHS:
            return await handler(request)
        found = self.fleet.authenticate(bearer_key(request.headers.get("Authorization")))
        if isinstance(found, Refusal):
            return refusal_response(found)
        request[PRINCIPAL] = found
        return await handler(request)

    async def readyz(self, _: web.Request) -> web.Response:
        """Ready once discovery has listed the cluster: a replica that has not yet would
        hold every request (the readiness probe keeps Services off it meanwhile)."""
        if self.fleet.listed.is_set():
            return web.Response(text="ok")
        return web.Response(status=503, text="discovery has not listed the cluster yet")

    async def own_metrics(self, _: web.Request) -> web.Response:
        body, content_type = self.metrics.exposition()
        return web.Response(body=body, headers={"Content-Type": content_type})

    async def models(self, request: web.Request) -> web.Response:
        data = [
            {"id": m.served_name, "object": "model", "owned_by": f"{m.namespace}/{m.name}"}
            for m in self.fleet.models_for(principal_of(request))
        ]
        return web.json_response({"object": "list", "data": data})

    # ---- one request ------------------------------------------------------------------

    def _too_large(self) -> web.Response:
        response = openai_error(
            413,
            f"request body over {self.config.max_body_bytes} bytes; send a smaller "
            "request (the router's --max-body-bytes)",
            "invalid_request_error",
        )
        response.force_close()  # what is left of the body is thrown away, then closed
        return response

    def _declared_too_large(self, request: web.Request) -> bool:
        length = request.content_length
        return length is not None and length > self.config.max_body_bytes

    async def _expect(self, request: web.Request) -> web.StreamResponse | None:
        """`Expect: 100-continue`: refuse a body declared too large before it is sent, else
        tell the client to go on (aiohttp's default handler, which checks nothing)."""
        if self._declared_too_large(request):
            return self._too_large()
        if self.body_bytes.used + (request.content_length or 0) > self.body_bytes.limit:
            return self._over_bytes()  # claimed by the handler; a polite client sends nothing
        expect = request.headers.get("Expect", "").lower()
        if request.version == HttpVersion11 and expect == "100-continue":
            await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        elif expect:
            return openai_error(417, f"unknown Expect: {expect}", "invalid_request_error")
        return None

    def _busy(self, limit: str, message: str, retry_after: int) -> web.Response:
        """429 for a router at one of its limits (a client should come back, not give up):
        OpenAI's shape, the limit named in `code`, counted by limit."""
        self.metrics.refused(limit)
        response = openai_error(429, message, "rate_limit_error", None, limit)
        response.headers["Retry-After"] = str(retry_after)
        return response

    def claim_bytes(self, size: int) -> Callable[[], None] | None:
        """`size` bytes of a body another handler reads (a Batch API upload) claimed
        against `max_inflight_bytes`: the function that gives them back, or None past the
        limit (counted as refused; the handler answers 429)."""
        claim = self.body_bytes.claim(size)
        if claim is None:
            self.metrics.refused(LIMIT_INFLIGHT_BYTES)
            return None
        return claim.release

    def _claim_body(self, request: web.Request) -> ByteClaim | web.Response:
        """The body's bytes claimed before it is read (its declared length, else the most
        a body may be), or 429 with the body unread (thrown away, then closed)."""
        declared = request.content_length
        size = declared if declared is not None else self.config.max_body_bytes
        claim = self.body_bytes.claim(size)
        return claim if claim is not None else self._over_bytes()

    def _over_bytes(self) -> web.Response:
        response = self._busy(
            LIMIT_INFLIGHT_BYTES,
            f"the router has {self.body_bytes.used} bytes of requests in flight, its limit "
            f"is {self.config.max_inflight_bytes} (--max-inflight-bytes); retry shortly",
            BUSY_RETRY_AFTER_SECONDS,
        )
        response.force_close()
        return response

    async def _read(self, request: web.Request) -> bytes | None:
        """The whole body (None past `max_body_bytes`), read here rather than with
        `request.read()`, which keeps a copy on the request until it is answered: a held
        or forwarded request then costs its parsed body alone, not its bytes as well."""
        body = bytearray()
        while chunk := await request.content.readany():
            body += chunk
            if len(body) > self.config.max_body_bytes:
                return None
        return bytes(body)

    async def _parse(
        self, request: web.Request, claim: ByteClaim | None = None
    ) -> dict[str, Any] | web.Response:
        if self._declared_too_large(request):
            return self._too_large()  # not a byte of it read; the rest is thrown away
        try:
            raw = await asyncio.wait_for(self._read(request), self.config.body_timeout_seconds)
        except TimeoutError:
            response = openai_error(
                408,
                f"the request body did not arrive within {self.config.body_timeout_seconds:g} s",
                "invalid_request_error",
            )
            response.force_close()
            return response
        if raw is None:
            return self._too_large()  # a body without a length: refused at the limit
        if claim is not None:
            claim.resize(len(raw))
        try:
            body = load_json(raw)
        except BadJson as exc:
            return openai_error(
                400,
                f"the body is not JSON a request can be read from: {exc}",
                "invalid_request_error",
            )
        if not isinstance(body, dict):
            return openai_error(400, "the body must be a JSON object", "invalid_request_error")
        chat = request.path.endswith("/chat/completions")
        problem = request_problem(body, chat, self.config.max_output_tokens)
        if problem is not None:
            return openai_error(400, problem.message, "invalid_request_error", problem.param)
        return body

    async def forward(self, request: web.Request) -> web.StreamResponse:
        if self._declared_too_large(request):
            return self._too_large()  # 413 before 429: waiting would not help it
        claim = self._claim_body(request)
        if isinstance(claim, web.Response):
            return claim
        try:
            return await self._forward(request, claim)
        finally:
            claim.release()

    def _home(self, request: web.Request, model: ModelRoute) -> str | web.Response | None:
        """The client's home region: the region header when the model is served there
        (400 naming the model's regions otherwise: a region is a label of the router's
        metrics and a key of its spill ledger, so it comes from the configured set, never
        from the client's text), else the router's own."""
        header = request.headers.get(REGION_HEADER)
        if not header:
            return self.config.home_region
        if header in model.regions:
            return header
        shown = header if len(header) <= 64 else header[:61] + "..."
        return openai_error(
            400,
            f"{REGION_HEADER}: {shown!r} is not a region {model.served_name} is served in; "
            f"use one of {', '.join(model.regions) or 'none yet'}, or send none",
            "invalid_request_error",
            REGION_HEADER,
        )

    async def _forward(self, request: web.Request, claim: ByteClaim) -> web.StreamResponse:
        started = time.monotonic()
        parsed = await self._parse(request, claim)
        if isinstance(parsed, web.Response):
            return parsed
        body = parsed
        principal = principal_of(request)
        model = self.fleet.model_for(principal, body["model"])
        if model is None and principal.anonymous and body["model"] in self.fleet.models:
            return refusal_response(ANONYMOUS_REFUSED)
        if model is None:
            served = ", ".join(m.served_name for m in self.fleet.models_for(principal))
            return openai_error(
                404,
                f"model {body['model']!r} is not served here; served models: "
                f"{served or 'none yet'}",
                "invalid_request_error",
                "model",
            )
        tier = choose_tier(
            principal,
            request.headers.get(TIER_HEADER),
            model.tiers,
            self.fleet.tiers.get(model.namespace, {}),
        )
        if isinstance(tier, Refusal):
            return refusal_response(tier)
        home = self._home(request, model)
        if isinstance(home, web.Response):
            return home
        _, tokens = estimated_tokens(body, self.config.max_output_tokens)
        limited = self.limits.check(request, model, tier, principal, tokens)
        if limited is not None:
            return limited
        # a request another cluster's router forwarded is served here, never sent on
        peers = () if request.headers.get(FORWARDED_HEADER) else tuple(self.config.peers)
        region = await self._region_or_hold(model, home, tokens, peers)
        if isinstance(region, web.Response):
            return region
        if region is None:
            self.metrics.count(model, self._held_region(model, home), tier, 503)
            return web.json_response(
                {
                    "error": {
                        "message": f"no instance of {model.served_name} is ready yet; it is "
                        "being started, retry later",
                        "type": "server_error",
                        "param": None,
                        "code": "model_starting",
                    }
                },
                status=503,
                headers={"Retry-After": str(self.config.retry_after_seconds)},
            )
        return await self._serve_in(
            request, body, principal, model, home, region, tier, started, tokens, peers
        )

    async def _serve_in(
        self,
        request: web.Request,
        body: dict[str, Any],
        principal: Principal,
        model: ModelRoute,
        home: str | None,
        region: str,
        tier: str,
        started: float,
        tokens: float,
        peers: tuple[str, ...],
    ) -> web.StreamResponse:
        """Serve the request in `region`: through its cluster's router when it is a peer's
        region with no pod here (here after all if the peer fails before answering), else
        on a pod here (batch waiting for a trough first)."""
        user = body.get("user")
        client = client_id(principal.key_id or (str(user) if user else None))
        if region in peers and not self.fleet.backends.get((model.namespace, model.name, region)):
            peered = await self._to_peer(request, body, model, region, tier, started, client)
            if peered is not None:
                return peered
            local = self.fleet.choose_region(model, home, tokens)
            if local is None:
                return self._peer_failed(model, region, tier)
            region = local
        if self.fleet.is_batch(model, tier):
            await self._until_trough(model, region, tier)
        body = self._with_priority(body, model, tier)
        return await self._send(request, body, model, region, tier, started, tokens, client)

    def _peer_failed(self, model: ModelRoute, region: str, tier: str) -> web.Response:
        self.metrics.count(model, region, tier, 502)
        return openai_error(
            502,
            f"the router of region {region} failed before answering, and no pod of "
            f"{model.served_name} is ready in this cluster",
            "server_error",
        )

    def _with_priority(self, body: dict[str, Any], model: ModelRoute, tier: str) -> dict[str, Any]:
        """The body as the pod gets it: vLLM's `priority` set from the request's tier (its
        identity's, SageServe v3 §6.5) by the model's policy's instance order
        (`dispatch.instance_order.engine_priority`), never the client's own (a client
        cannot raise its place in the engine's queue); none under FCFS."""
        if self.pools is not None and self.pools.serves(model):
            # a ModelPool's engines run vLLM's default FCFS scheduler
            return {k: v for k, v in body.items() if k != "priority"}
        match = self.fleet.tiers.get(model.namespace, {}).get(tier)
        waiting = waiting_for(
            time.time(),
            match.ttft_slo_s if match is not None else None,
            match.priority if match is not None else 0,
            match is not None and match.batch,
        )
        priority = engine_priority(model.instance_scheduling, waiting)
        if priority is None:
            if "priority" not in body:
                return body
            return {k: v for k, v in body.items() if k != "priority"}
        return {**body, "priority": priority}

    async def _until_trough(self, model: ModelRoute, region: str, tier: str) -> None:
        """A batch-tier request sent synchronously yields to interactive work: it waits
        (bounded by the hold time, then is served anyway, never dropped) until its region's
        EMU is low enough for the Queue Manager to release batch work (SageServe §6.2), by
        the model's policy's release rules (`ModelRoute.release_rules`)."""
        endpoint = (model.namespace, model.name, region)
        deadline = time.monotonic() + self.config.hold_seconds

        def releasable() -> int:
            fleet = self.fleet
            return release_count(
                fleet.estimated_emu(endpoint), model.release_rules, fleet.waiting(endpoint)
            )

        if releasable() > 0:
            return
        with self.metrics.deferring(model, region, tier):
            while releasable() == 0:
                waiter = self.fleet.changed
                try:
                    await asyncio.wait_for(waiter.wait(), deadline - time.monotonic())
                except TimeoutError:
                    return

    @staticmethod
    def _held_region(model: ModelRoute, home: str | None) -> str:
        """The region a held request's demand is published for: home when the model is
        served there, else the model's first region."""
        if home in model.regions:
            return str(home)
        return model.regions[0] if model.regions else ""

    async def _region_or_hold(
        self, model: ModelRoute, home: str | None, tokens: float, peers: tuple[str, ...] = ()
    ) -> str | web.Response | None:
        """A region with a ready pod (or one of `peers`, served by another cluster's
        router), waiting (bounded) while the model comes from zero; 429 when
        `max_held_requests` already wait (each holds its body and connection)."""
        region = self.fleet.choose_region(model, home, tokens, peers=peers)
        if region is not None:
            return region
        if admit(self.held, self.config.max_held_requests) is Hold.BUSY:
            return self._busy(
                LIMIT_HELD_REQUESTS,
                f"{self.held} requests already wait for models to start, the router's limit "
                f"(--max-held-requests {self.config.max_held_requests}); "
                f"{model.served_name} is being started, retry later",
                self.config.retry_after_seconds,
            )
        since = time.monotonic()
        deadline = hold_until(since, self.config.hold_seconds)
        self.held += 1
        try:
            with self.metrics.holding(model, self._held_region(model, home)):
                while (
                    region is None
                    and keep(time.monotonic() - since, self.config.hold_seconds) is Hold.HOLD
                ):
                    waiter = self.fleet.changed
                    try:
                        await asyncio.wait_for(waiter.wait(), deadline - time.monotonic())
                    except TimeoutError:
                        break
                    region = self.fleet.choose_region(model, home, tokens, peers=peers)
        finally:
            self.held -= 1
        return region

    async def _send(
        self,
        request: web.Request,
        body: dict[str, Any],
        model: ModelRoute,
        region: str,
        tier: str,
        started: float,
        tokens: float,
        client: int = 0,
    ) -> web.StreamResponse:
        failures: list[str] = []
        arrival = self.fleet.arrival(model, client, estimated_tokens(body)[0])
        for backend in self._backends(model, region, arrival):
            try:
                lease = await self._awake(model, backend)
            except PoolSwitchFailed as exc:
                log.warning("pool: %s", exc)
                failures.append(f"{backend.pod}: {exc}")
                continue
            backend = lease.backend if lease else backend
            self.fleet.start(backend, tokens)
            ticket = self.fleet.track(backend, model, client, arrival)
            try:
                with (
                    self.metrics.flying(model, backend.region, tier),
                    self.metrics.interactive_on_pod(
                        model, backend.region, backend.pod, not self.fleet.is_batch(model, tier)
                    ),
                ):
                    response = await self._proxy(
                        request, body, backend, model, tier, started, ticket
                    )
            except _BeforeFirstByte as exc:
                log.warning("pod %s failed before the first byte: %s", backend.pod, exc)
                failures.append(f"{backend.pod}: {exc}")
                self.ejected.eject(backend.pod, time.monotonic())
                continue
            finally:
                self.fleet.finish(backend, tokens)
                if lease is not None and self.pools is not None:
                    self.pools.release(lease)
                self.fleet.anticipators.release(ticket)
            return response
        self.metrics.count(model, region, tier, 502)
        reasons = "; ".join(failures) or "no ready pod left"
        return openai_error(
            502, f"every pod tried failed before answering ({reasons})", "server_error"
        )

    def _backends(
        self, model: ModelRoute, region: str, arrival: Arrival | None = None
    ) -> Iterator[Backend]:
        """The pod to try, then (after a failure before the first byte) one other pod: in
        `region` first, then any region of the model; pods that failed lately only when
        no other is left."""
        tried: frozenset[str] = frozenset()
        for attempt in range(2):
            avoid = tried | self.ejected.active(time.monotonic())
            backend = (
                self.fleet.choose_backend(model, region, avoid, arrival)
                or self._elsewhere(model, avoid, arrival)
                or self.fleet.choose_backend(model, region, tried, arrival)
                or self._elsewhere(model, tried, arrival)
            )
            if backend is not None and self.pools is not None and self.pools.serves(model):
                backend = self._pooled_choice(model, backend, avoid) or backend
            if backend is None:
                return
            tried |= {backend.pod}
            if attempt:
                self.metrics.retries.labels(model.namespace, model.name, backend.region).inc()
            yield backend

    def _pooled_choice(
        self, model: ModelRoute, chosen: Backend, avoid: frozenset[str]
    ) -> Backend | None:
        """For a pooled model, the pod of `chosen`'s region where it is awake (else the one
        to wake it on): `dispatch.pool_switch.choose_pod`."""
        assert self.pools is not None
        pods = self.fleet.backends.get(chosen.endpoint, [])
        return self.pools.prefer(
            model, [b for b in pods if b.pod not in avoid], self.fleet.remaining
        )

    async def _awake(self, model: ModelRoute, backend: Backend) -> Lease | None:
        """For a pooled model: its engine on `backend`'s pod awake and leased to this
        request, the request held meanwhile (as one waiting for a model from zero)."""
        if self.pools is None or not self.pools.serves(model):
            return None
        deadline = time.monotonic() + self.config.hold_seconds
        with self.metrics.holding(model, backend.region):
            return await self.pools.acquire(model, backend, deadline)

    async def execute(
        self, path: str, body: dict[str, Any], model: ModelRoute, region: str, tier: str
    ) -> tuple[int, Any] | None:
        """Run one request without a client (a Batch API line the Queue Manager released):
        the same pods, accounting, retry and metrics as a client's request, the answer read
        whole. None when every pod tried failed before answering (the caller requeues)."""
        assert self.session is not None
        started = time.monotonic()
        prompt, tokens = estimated_tokens(body, self.config.max_output_tokens)
        body = self._with_priority({**body, "stream": False}, model, tier)
        user = body.get("user")
        client = client_id(str(user) if user else None)
        arrival = self.fleet.arrival(model, client, prompt)
        for backend in self._backends(model, region, arrival):
            try:
                lease = await self._awake(model, backend)
            except PoolSwitchFailed as exc:
                log.warning("pool: %s", exc)
                continue
            backend = lease.backend if lease else backend
            self.fleet.start(backend, tokens)
            ticket = self.fleet.track(backend, model, client, arrival)
            try:
                with self.metrics.flying(model, backend.region, tier):
                    async with self.session.post(backend.url.rstrip("/") + path, json=body) as r:
                        status, payload = r.status, await r.read()
            except (aiohttp.ClientError, TimeoutError) as exc:
                log.warning("pod %s failed a batch request: %s", backend.pod, exc)
                continue
            finally:
                self.fleet.finish(backend, tokens)
                if lease is not None and self.pools is not None:
                    self.pools.release(lease)
                self.fleet.anticipators.release(ticket)
            if status >= 500:
                log.warning("pod %s answered a batch request with HTTP %d", backend.pod, status)
                continue
            elapsed = time.monotonic() - started
            self.metrics.count(model, backend.region, tier, status)
            self.metrics.e2e(model, backend.region, tier, elapsed)
            if status < 400:
                used = answered_tokens(payload[-TAIL_BYTES:], 0, prompt, tokens)
                self.metrics.served(model, backend.region, tier, used)
                out = reported_completion(payload[-TAIL_BYTES:])
                self.fleet.anticipators.answered(ticket, out)
                self.metrics.normalized(model, backend.region, tier, elapsed, out)
                self.metrics.shape(model, backend.region, used - (out or 0), out)
            try:
                return status, json.loads(payload)
            except (json.JSONDecodeError, UnicodeDecodeError):
                return status, payload.decode(errors="replace")
        return None

    async def _to_peer(
        self,
        request: web.Request,
        body: dict[str, Any],
        model: ModelRoute,
        region: str,
        tier: str,
        started: float,
        client: int,
    ) -> web.StreamResponse | None:
        """The request forwarded to the router of `region`'s cluster (`router.peers`) with
        the caller's key and tier header, marked so it goes no further; the peer sets the
        engine priority from the identity it sees. What is sent counts toward the region's
        EMU estimate until Prometheus reads it, as for a pod. None when the peer failed
        before the first byte (the caller serves it here if it can)."""
        url = self.config.peers[region]
        peer = Backend(model.namespace, f"peer/{region}", model.name, region, "", url)
        headers = {h: v for h in (*IDENTITY_HEADERS, TIER_HEADER) if (v := request.headers.get(h))}
        headers[FORWARDED_HEADER] = self.config.home_region or "1"
        forwarded = {k: v for k, v in body.items() if k != "priority"}
        prompt, tokens = estimated_tokens(body, self.config.max_output_tokens)
        self.fleet.start(peer, tokens)
        ticket = self.fleet.track(peer, model, client, self.fleet.arrival(model, client, prompt))
        try:
            with self.metrics.flying(model, region, tier):
                return await self._proxy(
                    request, forwarded, peer, model, tier, started, ticket, headers
                )
        except _BeforeFirstByte as exc:
            log.warning("peer router of %s (%s) failed before the first byte: %s", region, url, exc)
            return None
        finally:
            self.fleet.finish(peer, tokens)
            self.fleet.anticipators.release(ticket)

    def _elsewhere(
        self, model: ModelRoute, tried: frozenset[str], arrival: Arrival | None = None
    ) -> Backend | None:
        for region in model.regions:
            backend = self.fleet.choose_backend(model, region, tried, arrival)
            if backend is not None:
                return backend
        return None

    async def _proxy(
        self,
        request: web.Request,
        body: dict[str, Any],
        backend: Backend,
        model: ModelRoute,
        tier: str,
        started: float,
        ticket: Ticket,
        headers: Mapping[str, str] | None = None,
    ) -> web.StreamResponse:
        """The answer of `backend` (a pod, or a peer router with `headers`) streamed to the
        client as it comes."""
        assert self.session is not None
        ants = self.fleet.anticipators
        url = backend.url.rstrip("/") + request.path
        stream = bool(body.get("stream"))
        timeout = aiohttp.ClientTimeout(
            total=self.config.upstream_timeout_seconds,
            sock_connect=CONNECT_TIMEOUT_SECONDS,
            sock_read=self.config.stall_timeout_seconds if stream else None,
        )
        try:
            upstream = await self.session.post(url, json=body, timeout=timeout, headers=headers)
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise _BeforeFirstByte(str(exc) or type(exc).__name__) from exc
        async with upstream:
            if upstream.status >= 500:
                raise _BeforeFirstByte(f"HTTP {upstream.status}")
            response = web.StreamResponse(status=upstream.status)
            response.content_type = upstream.content_type
            response.headers[POD_HEADER] = backend.pod
            first = True
            tail, events = b"", 0
            try:
                async for chunk in upstream.content.iter_any():
                    if first:
                        await response.prepare(request)
                        self.metrics.ttft(
                            model, backend.region, tier, time.monotonic() - started, stream
                        )
                        first = False
                        ants.first_byte(ticket)
                    await response.write(chunk)
                    tail = (tail + chunk)[-TAIL_BYTES:]
                    new = chunk.count(b"data: ") if stream else 0
                    events += new
                    ants.streamed(ticket, new)
            except (aiohttp.ClientError, TimeoutError) as exc:
                if first:
                    raise _BeforeFirstByte(str(exc) or type(exc).__name__) from exc
                if stream:
                    reason = str(exc) or type(exc).__name__
                    error = {"error": {"message": f"the pod failed mid-stream: {reason}"}}
                    await response.write(f"data: {json.dumps(error)}\n\n".encode())
            if first:
                await response.prepare(request)
            await response.write_eof()
        elapsed = time.monotonic() - started
        self.metrics.count(model, backend.region, tier, upstream.status)
        self.metrics.e2e(model, backend.region, tier, elapsed)
        if upstream.status < 400:
            prompt, total = estimated_tokens(body, self.config.max_output_tokens)
            done = max(events - 1, 0)  # the last event of a stream is [DONE]
            used = answered_tokens(tail, done, prompt, total)
            self.metrics.served(model, backend.region, tier, used)
            out = reported_completion(tail) or (done or None)
            ants.answered(ticket, out)
            self.metrics.normalized(model, backend.region, tier, elapsed, out)
            self.metrics.shape(model, backend.region, used - (out or 0), out)
        return response


class _BeforeFirstByte(Exception):
    """The pod failed before anything reached the client: safe to retry elsewhere."""


async def serve(
    router: Router, host: str, port: int, ready: Callable[[int], Awaitable[None]] | None = None
) -> None:
    """Run the router until cancelled; `ready(port)` once it listens."""
    raise_open_files_limit()
    runner = web.AppRunner(
        router.app(),
        handler_cancellation=True,
        keepalive_timeout=router.config.idle_timeout_seconds,
        lingering_time=LINGER_SECONDS,
    )
    await runner.setup()
    site = web.TCPSite(runner, host, port, backlog=BACKLOG)
    await site.start()
    bound = int(runner.addresses[0][1])  # the bound port, when asked for 0
    if ready is not None:
        await ready(bound)
    try:
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()


def raise_open_files_limit() -> int:
    """The soft limit on open files raised to the hard one; the new soft limit.

    Every client connection is a file descriptor, and distributions default the soft
    limit to 1,024: ten thousand held connections must meet the idle timeout, not EMFILE
    (Go's runtime raises it the same way at start-up)."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        wanted = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
            soft = wanted
        except (ValueError, OSError):
            pass
    return int(soft)


def run_loop(main: Coroutine[Any, Any, None], loop: str = "asyncio") -> None:
    """Run the router's event loop: asyncio's own, or uvloop's when asked for and installed
    (`sageserve bench router` measures both; neither wins consistently at P99, docs/router.md)."""
    if loop == "uvloop":
        try:
            import uvloop
        except ImportError as exc:
            raise RuntimeError("--event-loop uvloop: install uvloop (pip install uvloop)") from exc
        uvloop.run(main)
        return
    asyncio.run(main)
