"""A property-based fuzz of the router's OpenAI routes and the Batch API, over real HTTP.

One router (`app.serve`, as `sageserve router` runs it) listens on loopback for the whole
module, with the Batch API on SQLite and its releaser, in front of stand-in pods that
answer as vLLM does (JSON with `usage`, streams of `data:` events). It runs on an event
loop of its own in a background thread; hypothesis drives a synchronous `requests`
session against it. Three namespaces: `team-a` lists keys (`sk-a`), `team-b` lists its own
(`sk-b`, another tenant's key), `public` lists none (open: `auth="per-namespace"`).

For every answer: no 5xx, an error is OpenAI-shaped JSON (`{"error": {"message", "type",
"param", "code"}}`). At the end: the router still answers `/healthz`, and `/metrics` has
no more series than after a fixed warm-up plus a small constant, every label value one
the fleet names (a header value never becomes a label). `pytest -s` prints the counts.

Each hostile finding also has a test of its own at the end (non-finite numbers, deep
nesting, integers too long to convert, control characters in file names, malformed
multipart bodies, lone surrogates, unrouted paths), so a regression names itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import threading
import time
import urllib.parse
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import requests
from aiohttp import web
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from sageserve.batch import BatchStore
from sageserve.batch.api import BatchApi
from sageserve.dispatch.tiers import TierMatch
from sageserve.router.app import Router, RouterConfig, serve
from sageserve.router.fleet import Backend, Fleet, ModelRoute
from sageserve.router.metrics import RouterMetrics
from sageserve.router.release import BatchReleaser, ReleaseConfig

LLAMA = ModelRoute("team-a", "llama", "llama-8b", ("us-east", "us-west"), ("iw-f", "iw-n", "niw"))
QWEN = ModelRoute("team-b", "qwen", "qwen-7b", ("us-east",), ("iw-f",))
MISTRAL = ModelRoute("public", "mistral", "mistral-7b", ("us-east",), ("iw-f", "niw"))
#: served, but no pod anywhere: a request for it is held, then 503 (separate router only)
COLD = ModelRoute("public", "cold", "cold-1b", ("us-east",), ("iw-f",))
MODELS = (LLAMA, QWEN, MISTRAL)
KEYS = {"sk-a": "team-a", "sk-b": "team-b"}
#: every value a label of the router's series may take
NAMESPACES = {m.namespace for m in (*MODELS, COLD)}
DEPLOYMENTS = {m.name for m in (*MODELS, COLD)}
REGIONS = {r for m in (*MODELS, COLD) for r in m.regions}
TIERS = {t for m in (*MODELS, COLD) for t in m.tiers}
#: series the fuzz may add beyond the warm-up's (new status codes, shape buckets)
SERIES_SLACK = 64

MAX_BODY = 64 * 1024
MAX_UPLOAD = 32 * 1024
TIMEOUT = 30.0


# ---- stand-in pods ---------------------------------------------------------------------


def _error(status: int, message: str, param: str | None = None) -> web.Response:
    body = {
        "error": {"message": message, "type": "BadRequestError", "param": param, "code": status}
    }
    return web.json_response(body, status=status)


async def pod_answer(request: web.Request) -> web.StreamResponse:
    """What vLLM answers: 400 (OpenAI-shaped) for a `max_tokens` that is not a positive
    integer, else a completion with `usage`, or a stream of `data:` events ending with a
    usage event and `[DONE]`. The usage is fixed so that the shape series are too."""
    try:
        body = json.loads(await request.read())
    except ValueError:
        return _error(400, "the body is not JSON")
    if not isinstance(body, dict):
        return _error(400, "the body must be an object")
    max_tokens = body.get("max_tokens")
    if max_tokens is not None and (
        isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1
    ):
        return _error(400, "max_tokens must be a positive integer", "max_tokens")
    usage = {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}
    chat = request.path.endswith("/chat/completions")
    kind = "chat.completion" if chat else "text_completion"
    choice: dict[str, Any] = (
        {"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}
        if chat
        else {"index": 0, "text": "hi", "finish_reason": "stop"}
    )
    if body.get("stream") is not True:
        return web.json_response(
            {
                "id": "cmpl-1",
                "object": kind,
                "model": str(body.get("model")),
                "choices": [choice],
                "usage": usage,
            }
        )
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    for token in ("h", "i", "!"):
        event = {
            "id": "cmpl-1",
            "object": f"{kind}.chunk",
            "choices": [{"index": 0, "text": token}],
        }
        await response.write(f"data: {json.dumps(event)}\n\n".encode())
    last = {"id": "cmpl-1", "object": f"{kind}.chunk", "choices": [], "usage": usage}
    await response.write(f"data: {json.dumps(last)}\n\ndata: [DONE]\n\n".encode())
    return response


def pod_app() -> web.Application:
    app = web.Application(client_max_size=16 * 1024 * 1024)
    app.router.add_post("/v1/completions", pod_answer)
    app.router.add_post("/v1/chat/completions", pod_answer)
    return app


# ---- the router, on a loop of its own ----------------------------------------------------


@dataclass
class Served:
    """A router with the Batch API and its releaser, and two pods per served endpoint,
    running on an event loop in a background thread (`close()` stops it all)."""

    tmp: Path
    config: RouterConfig
    models: tuple[ModelRoute, ...] = MODELS
    url: str = ""
    router: Router | None = None
    loop: asyncio.AbstractEventLoop = field(default_factory=asyncio.new_event_loop)
    _stop: list[Any] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        port = asyncio.run_coroutine_threadsafe(self._up(), self.loop).result(TIMEOUT)
        self.url = f"http://127.0.0.1:{port}"

    async def _up(self) -> int:
        backends = []
        for m in self.models:
            if m is COLD:
                continue
            for region in m.regions:
                for i in range(2):
                    runner = web.AppRunner(pod_app())
                    await runner.setup()
                    await web.TCPSite(runner, "127.0.0.1", 0).start()
                    self._stop.append(runner.cleanup)
                    url = f"http://127.0.0.1:{runner.addresses[0][1]}"
                    pod = f"{m.name}-{region}-{i}"
                    backends.append(Backend(m.namespace, pod, m.name, region, "a100", url))
        fleet = Fleet(auth="per-namespace")
        fleet.set_models(self.models)
        niw = TierMatch("niw", batch=True, deadline_s=86400.0)
        fleet.set_tiers(
            "team-a",
            {
                "iw-f": TierMatch("iw-f", header_values=("interactive",), api_keys=("sk-a",)),
                "iw-n": TierMatch("iw-n", api_keys=("sk-a",)),
                "niw": TierMatch("niw", batch=True, deadline_s=86400.0, api_keys=("sk-a",)),
            },
        )
        fleet.set_tiers("team-b", {"iw-f": TierMatch("iw-f", api_keys=("sk-b",))})
        fleet.set_tiers("public", {"iw-f": TierMatch("iw-f"), "niw": niw})
        fleet.set_backends(backends)
        metrics = RouterMetrics()
        metrics.watch(fleet)
        store = BatchStore.open(f"sqlite:///{self.tmp}/queue.db")
        router = self.router = Router(fleet, self.config, metrics)
        releaser = BatchReleaser(
            store, router, metrics, "fuzz", ReleaseConfig(signal_s=0.2, finalize_s=0.5)
        )
        router.extra_routes = BatchApi(
            store,
            fleet.batch_tier,
            deadlines=lambda tier: (fleet.batch_tiers().get(tier) or TierMatch("")).deadline_s,
            max_upload_bytes=MAX_UPLOAD,
            accepted=releaser.accepted,
        ).add_routes
        bound: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        tasks: list[asyncio.Task[None]] = []

        async def ready(port: int) -> None:
            tasks.append(asyncio.create_task(releaser.run()))
            bound.set_result(port)

        tasks.append(asyncio.create_task(serve(router, "127.0.0.1", 0, ready)))

        async def down() -> None:
            for task in tasks:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            store.close()

        self._stop.insert(0, down)
        return await asyncio.wait_for(bound, TIMEOUT)

    async def _down(self) -> None:
        for stop in self._stop:
            await stop()

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self._down(), self.loop).result(TIMEOUT)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(TIMEOUT)
        self.loop.close()


@dataclass
class Tally:
    """Requests sent, by status class, and the series counts of `/metrics`."""

    classes: Counter[str] = field(default_factory=Counter)
    series_before: int = 0
    started: float = field(default_factory=time.monotonic)
    #: ids the Batch API returned, for later requests to name
    file_ids: list[str] = field(default_factory=list)
    batch_ids: list[str] = field(default_factory=list)

    @property
    def total(self) -> int:
        return sum(self.classes.values())


@dataclass(repr=False)
class Client:
    served: Served
    session: requests.Session
    tally: Tally

    def send(
        self,
        method: str,
        path: str,
        headers: dict[str, Any] | None = None,
        data: bytes | None = None,
    ) -> requests.Response:
        """One request; a 5xx or an error that is not OpenAI-shaped fails the test."""
        response = self.session.request(
            method, self.served.url + path, headers=headers, data=data, timeout=TIMEOUT
        )
        self.tally.classes[f"{response.status_code // 100}xx"] += 1
        assert response.status_code < 500, (method, path, headers, data, response.text)
        if response.status_code >= 400 and method != "HEAD":
            assert_openai_error(response)
        return response

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text("Client(...)")  # hypothesis' report of a failing case


def assert_openai_error(response: requests.Response) -> None:
    body = response.json()
    assert isinstance(body, dict) and set(body) == {"error"}, body
    error = body["error"]
    assert isinstance(error, dict), body
    assert {"message", "type", "param", "code"} <= set(error), body
    assert isinstance(error["message"], str) and error["message"], body
    assert isinstance(error["type"], str) and error["type"], body


def series(client: Client) -> list[tuple[str, dict[str, str]]]:
    """Every (sample name, labels) of `/metrics`."""
    r = client.session.get(client.served.url + "/metrics", timeout=TIMEOUT)
    assert r.status_code == 200
    return [
        (sample.name, dict(sample.labels))
        for family in text_string_to_metric_families(r.text)
        for sample in family.samples
    ]


def assert_labels_named_by_the_fleet(found: list[tuple[str, dict[str, str]]]) -> None:
    allowed = {
        "namespace": NAMESPACES | {""},
        "model_deployment": DEPLOYMENTS,
        "region": REGIONS | {""},
        "tier": TIERS | {""},
    }
    for name, labels in found:
        for label, values in allowed.items():
            if label in labels and name.startswith("sageserve_"):
                assert labels[label] in values, (name, labels)
        if "code" in labels:
            assert labels["code"].isdigit(), (name, labels)


WARM_UP: list[tuple[str, str, dict[str, str], dict[str, Any]]] = [
    (path, key, tier, body)
    for path, body in (
        ("/v1/completions", {"prompt": "hello", "max_tokens": 8}),
        ("/v1/completions", {"prompt": "hello", "max_tokens": 8, "stream": True}),
        ("/v1/completions", {"prompt": "hello", "max_tokens": "eight"}),  # the pod's 400
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "hi"}], "stream": True},
        ),
    )
    for key, tier in (
        ("sk-a", {}),
        ("sk-a", {"x-sageserve-tier": "iw-n"}),
        ("sk-a", {"x-sageserve-tier": "niw"}),
        ("sk-b", {}),
        ("", {}),
        ("", {"x-sageserve-tier": "niw"}),
    )
]


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Client]:
    config = RouterConfig(
        max_body_bytes=MAX_BODY, hold_seconds=0.5, body_timeout_seconds=5.0, eject_seconds=1.0
    )
    served = Served(tmp_path_factory.mktemp("fuzz"), config)
    session = requests.Session()
    the_client = Client(served, session, Tally())
    try:
        for path, key, tier, body in WARM_UP:
            model = {"sk-a": LLAMA, "sk-b": QWEN, "": MISTRAL}[key].served_name
            for region in ("us-east", "us-west"):
                headers = {**tier, "x-sageserve-region": region}
                if key:
                    headers["Authorization"] = f"Bearer {key}"
                data = json.dumps({**body, "model": model}).encode()
                r = session.post(served.url + path, headers=headers, data=data, timeout=TIMEOUT)
                assert r.status_code in (200, 400), r.text
        time.sleep(0.5)  # the releaser's first signals and finalize pass
        the_client.tally.series_before = len(series(the_client))
        yield the_client
    finally:
        session.close()
        served.close()


# ---- strategies ----------------------------------------------------------------------


class Raw(str):
    """JSON text written as is (NaN, Infinity, numbers Python would not write)."""


def dump(value: Any) -> str:
    """JSON text of `value`, with `Raw` pieces as they are."""
    if isinstance(value, Raw):
        return str(value)
    if isinstance(value, dict):
        return "{" + ",".join(f"{json.dumps(str(k))}:{dump(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ",".join(dump(v) for v in value) + "]"
    return json.dumps(value)


RAW_NUMBERS = st.sampled_from(
    [
        "NaN",
        "Infinity",
        "-Infinity",
        "1e400",
        "-1e400",
        "1e-400",
        "-0",
        "0.0",
        "1E+2",
        "123456789012345678901234567890",
        "-9223372036854775809",
        "9" * 4000,
        "9" * 5000,  # past Python's 4,300 digits for int()
        "1.5",
        "-1",
    ]
).map(Raw)
TEXT = st.text(max_size=24) | st.sampled_from(["", " ", "\x00", "\ud7ff", "\U0001f600" * 3])
#: JSON strings that decode to lone surrogates (valid JSON, not encodable as UTF-8)
SURROGATES = st.sampled_from(['"\\ud800"', '"a\\udfffb"', '"\\udc80\\ud800"']).map(Raw)
SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | TEXT
    | RAW_NUMBERS
)
ANY_JSON = st.recursive(
    SCALARS,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
#: nesting (a list inside a list, `depth` deep), past the readers' limit and Python's stack
NESTED = st.integers(min_value=1, max_value=6000).map(lambda d: Raw("[" * d + "]" * d))
ANY_VALUE = ANY_JSON | NESTED
NUMBERS = (
    st.integers(min_value=-(2**64), max_value=2**64)
    | st.floats(allow_nan=True, allow_infinity=True)
    | RAW_NUMBERS
    | st.booleans()
    | st.sampled_from([1, 8, 16, 256, 0, -1])
)
MODEL_NAMES = (
    st.sampled_from([m.served_name for m in MODELS] + [COLD.served_name.upper(), "gpt-4o"]) | TEXT
)
PROMPT = (
    st.text(max_size=200)
    | st.lists(st.text(max_size=20), max_size=4)
    | st.lists(st.integers(min_value=-5, max_value=2**40), max_size=8)
    | st.sampled_from(["x" * 20_000, "é" * 40_000, "x" * (MAX_BODY + 1)])
    | SURROGATES
)
MESSAGE = st.fixed_dictionaries(
    {"role": st.sampled_from(["user", "system", "assistant", "tool", ""]) | TEXT},
    optional={
        "content": st.text(max_size=80)
        | st.none()
        | st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": TEXT}), max_size=3)
        | ANY_JSON,
        "name": TEXT,
    },
)
COMMON_OPTIONAL = {
    "max_tokens": NUMBERS | ANY_VALUE,
    "max_completion_tokens": NUMBERS,
    "temperature": NUMBERS,
    "top_p": NUMBERS,
    "n": NUMBERS,
    "stream": st.booleans() | ANY_JSON,
    "stream_options": st.fixed_dictionaries({"include_usage": st.booleans()}) | ANY_JSON,
    "user": TEXT | ANY_JSON | SURROGATES,
    "stop": TEXT | st.lists(TEXT, max_size=3) | ANY_JSON | SURROGATES,
    "seed": NUMBERS,
    "logprobs": st.booleans() | NUMBERS,
    "extra_field": ANY_VALUE,
}
COMPLETION_BODY = st.fixed_dictionaries(
    {"model": MODEL_NAMES}, optional={"prompt": PROMPT | ANY_JSON, **COMMON_OPTIONAL}
)
CHAT_BODY = st.fixed_dictionaries(
    {"model": MODEL_NAMES},
    optional={"messages": st.lists(MESSAGE, max_size=4) | ANY_JSON, **COMMON_OPTIONAL},
)
#: a body whose fields are all of the wrong kind, or no object at all
HOSTILE_BODY = (
    st.dictionaries(
        st.sampled_from(["model", "prompt", "messages", "max_tokens", "stream", "user"]) | TEXT,
        ANY_VALUE,
        max_size=6,
    )
    | ANY_VALUE
)


def body_text(value: Any) -> bytes:
    return dump(value).encode("utf-8", "surrogatepass")


RAW_BODIES = st.sampled_from(
    [
        b"",
        b"{",
        b"null",
        b'{"model": "llama-8b", "model": 1}',
        b'{"model": "llama-8b"}  trailing',
        b'\xef\xbb\xbf{"model": "mistral-7b"}',
        '{"model": "mistral-7b"}'.encode("utf-16"),
        b"\xff\xfe\xfd",
        b'{"model": "mistral-7b", "prompt": "\\ud800"}',
        b'{"model": "mistral-7b", "max_tokens": 1e400}',
        b'{"model": "mistral-7b", "max_tokens": NaN, "stream": true}',
        b'{"model": "mistral-7b", "max_tokens": -Infinity}',
    ]
) | st.binary(max_size=64)
BODIES = (
    COMPLETION_BODY.map(body_text)
    | CHAT_BODY.map(body_text)
    | HOSTILE_BODY.map(body_text)
    | RAW_BODIES
)

#: header text as it may travel: visible ASCII, spaces and tabs inside, bytes over 0x7f
HEADER_TEXT = st.text(
    alphabet=st.characters(min_codepoint=0x20, max_codepoint=0xFF, exclude_characters="\x7f"),
    max_size=40,
).map(lambda s: s.strip(" \t").encode("latin-1"))
AUTHORIZATION = st.one_of(
    st.none(),
    st.sampled_from(
        ["Bearer sk-a", "Bearer sk-b", "bearer sk-a", "Bearer  sk-a ", "Bearer", "Basic c2stYQ=="]
    ).map(str.encode),
    HEADER_TEXT.map(lambda key: b"Bearer " + key),
    HEADER_TEXT,
)
TIER = (
    st.none()
    | st.sampled_from([*sorted(TIERS), "interactive", "IW-F"]).map(str.encode)
    | HEADER_TEXT
)
REGION = (
    st.none() | st.sampled_from([*sorted(REGIONS), "eu-west", ""]).map(str.encode) | HEADER_TEXT
)
CONTENT_TYPE = (
    st.none()
    | st.sampled_from(
        [
            "application/json",
            "application/json; charset=utf-16",
            "text/plain",
            "application/x-www-form-urlencoded",
        ]
    ).map(str.encode)
    | HEADER_TEXT
)


@st.composite
def headers(draw: st.DrawFn) -> dict[str, bytes]:
    out: dict[str, bytes] = {}
    for name, strategy in (
        ("Authorization", AUTHORIZATION),
        ("x-sageserve-tier", TIER),
        ("x-sageserve-region", REGION),
        ("Content-Type", CONTENT_TYPE),
    ):
        value = draw(strategy)
        if value is not None:
            out[name] = value
    extra = draw(st.none() | st.sampled_from(["X-Request-Id", "OpenAI-Organization", "User-Agent"]))
    if extra is not None:
        out[extra] = draw(HEADER_TEXT)
    return out


#: examples per test times this (`SAGESERVE_FUZZ_SCALE=10` for a longer run)
SCALE = float(os.environ.get("SAGESERVE_FUZZ_SCALE", "1"))


def fuzz_settings(n: int) -> settings:
    return settings(
        max_examples=max(1, int(n * SCALE)),
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )


# ---- the OpenAI routes -----------------------------------------------------------------


@pytest.mark.slow
@fuzz_settings(1200)
@given(head=headers(), key=st.sampled_from(["sk-a", "sk-b", ""]), body=BODIES)
def test_completions_and_chat_answer_below_500_with_openai_errors(
    client: Client, head: dict[str, bytes], key: str, body: bytes
) -> None:
    """Each body to both routes, with the random headers and with a key alone."""
    for path in ("/v1/completions", "/v1/chat/completions"):
        client.send("POST", path, head, body)
        client.send("POST", path, auth(key), body)


RANDOM_ID = st.text(max_size=30).map(lambda s: urllib.parse.quote(s, safe=""))
API_PATHS = st.one_of(
    st.sampled_from(
        [
            "/v1/models",
            "/v1/completions",
            "/v1/chat/completions",
            "/v1/files",
            "/v1/batches",
            "/v1/embeddings",
            "/v1",
            "/",
            "/v1/models/llama-8b",
            "/v1//completions",
            "/v1/completions/",
            "/v1/../v1/models",
            "/healthz",
            "/readyz",
        ]
    ),
    st.tuples(
        st.sampled_from(["/v1/files/", "/v1/batches/", "/v1/models/"]),
        RANDOM_ID,
        st.sampled_from(["", "/content", "/cancel", "/x"]),
    ).map("".join),
    st.tuples(
        st.sampled_from(["/v1/files", "/v1/batches", "/v1/models"]),
        st.dictionaries(
            st.sampled_from(["limit", "after", "purpose", "x"]),
            st.sampled_from(["1", "0", "-1", "20", "10001", "1e3", "NaN", "", "batch"]) | TEXT,
            max_size=3,
        ).map(lambda q: "?" + urllib.parse.urlencode(q) if q else ""),
    ).map("".join),
)


@fuzz_settings(1000)
@given(
    method=st.sampled_from(["GET", "POST", "DELETE", "PUT", "PATCH", "HEAD", "OPTIONS"]),
    path=API_PATHS,
    head=headers(),
    body=st.none() | BODIES,
)
@pytest.mark.slow
def test_any_route_and_method_answers_below_500(
    client: Client, method: str, path: str, head: dict[str, bytes], body: bytes | None
) -> None:
    """Each case with the random headers and with team-a's key."""
    client.send(method, path, head, body)
    client.send(method, path, {**head, **auth("sk-a")}, body)


# ---- the Batch API ---------------------------------------------------------------------


def batch_line(custom_id: Any, model: str, url: str = "/v1/chat/completions", **extra: Any) -> Any:
    body: dict[str, Any] = {"model": model, "messages": [{"role": "user", "content": "hi"}]}
    return {"custom_id": custom_id, "method": "POST", "url": url, "body": body, **extra}


VALID_LINE = st.builds(
    batch_line,
    custom_id=st.text(min_size=1, max_size=12),
    model=st.sampled_from([LLAMA.served_name, MISTRAL.served_name, QWEN.served_name, "nope"]),
    url=st.sampled_from(["/v1/chat/completions", "/v1/completions"]),
)
HOSTILE_LINE = st.one_of(
    VALID_LINE.map(lambda line: {**line, "body": {**line["body"], "max_tokens": Raw("NaN")}}),
    VALID_LINE.map(lambda line: {**line, "body": {**line["body"], "stream": True}}),
    st.fixed_dictionaries(
        {},
        optional={
            "custom_id": TEXT | ANY_JSON,
            "method": st.sampled_from(["POST", "GET", "post"]) | ANY_JSON,
            "url": st.sampled_from(["/v1/chat/completions", "/v1/embeddings"]) | ANY_JSON,
            "body": st.fixed_dictionaries({"model": MODEL_NAMES}, optional=COMMON_OPTIONAL)
            | ANY_VALUE,
        },
    ),
    ANY_VALUE,
)
LINES = st.lists(
    VALID_LINE.map(body_text)
    | HOSTILE_LINE.map(body_text)
    | st.sampled_from([b"", b"  ", b"\r", b"{not json", b"\xff\xfe", b"\x00"])
    | st.binary(max_size=40).filter(lambda b: b"\n" not in b),
    max_size=8,
)
#: a file name as a part header carries it: quoted, RFC 5987 (control characters
#: included, which the download's header must not carry), or none
FILENAME_TEXT = st.text(
    alphabet=st.characters(max_codepoint=0x2FFF, exclude_categories=("Cs",)), max_size=40
)
QUOTED_TEXT = st.text(
    alphabet=st.characters(max_codepoint=0x2FFF, exclude_categories=("Cc", "Cs")), max_size=40
)
FILENAME_PARAM = st.one_of(
    st.just(b""),
    QUOTED_TEXT.map(
        lambda s: b'; filename="' + s.replace("\\", "\\\\").replace('"', '\\"').encode() + b'"'
    ),
    FILENAME_TEXT.map(lambda s: b"; filename*=utf-8''" + urllib.parse.quote(s, safe="").encode()),
)
BOUNDARY = b"fuzzboundary7MA4YWxkTrZu0gW"


@st.composite
def multipart(draw: st.DrawFn) -> tuple[bytes, bytes]:
    """(content type, body) of an upload: parts named purpose, file or anything, in any
    order, with random file names and JSONL content."""
    parts = []
    polite = draw(st.booleans())  # half of them as an SDK sends them, but for the content
    purpose = draw(st.sampled_from([b"batch", b"batch_output", b"", b"fine-tune"]) | HEADER_TEXT)
    lines = draw(LINES)
    ending = draw(st.sampled_from([b"\n", b"\r\n"]))
    content = ending.join(lines) + draw(st.sampled_from([b"", ending]))
    if draw(st.sampled_from([b"x" * (MAX_UPLOAD + 1), b""])) and draw(st.booleans()):
        content = b"x" * (MAX_UPLOAD + 1)
    names = draw(
        st.lists(st.sampled_from(["purpose", "file", "other", "", "FILE"]), min_size=0, max_size=4)
    )
    if polite:
        names, purpose = ["purpose", "file"], b"batch"
    for name in names:
        header = b'Content-Disposition: form-data; name="' + name.encode() + b'"'
        if name == "purpose":
            parts.append(header + b"\r\n\r\n" + purpose)
        else:
            header += draw(FILENAME_PARAM)
            kind = draw(st.sampled_from([b"application/jsonl", b"application/octet-stream", b""]))
            if kind:
                header += b"\r\nContent-Type: " + kind
            parts.append(header + b"\r\n\r\n" + content)
    body = b"".join(b"--" + BOUNDARY + b"\r\n" + p + b"\r\n" for p in parts)
    body += b"--" + BOUNDARY + b"--\r\n"
    content_type = b"multipart/form-data; boundary=" + BOUNDARY
    content_type = (
        content_type
        if polite
        else draw(
            st.sampled_from(
                [
                    b"multipart/form-data; boundary=" + BOUNDARY,
                    b'multipart/form-data; boundary="' + BOUNDARY + b'"',
                    b"multipart/mixed; boundary=" + BOUNDARY,
                    b"application/json",
                ]
            )
        )
    )
    return content_type, body


def auth(key: str) -> dict[str, bytes]:
    return {"Authorization": f"Bearer {key}".encode()} if key else {}


KEY = st.sampled_from(["sk-a", "sk-a", "sk-b", "", "", "sk-nobody"])


@pytest.mark.slow
@fuzz_settings(600)
@given(upload=multipart(), key=KEY, create=st.booleans())
def test_uploads_and_batches_of_them_answer_below_500(
    client: Client, upload: tuple[bytes, bytes], key: str, create: bool
) -> None:
    content_type, body = upload
    r = client.send("POST", "/v1/files", {**auth(key), "Content-Type": content_type}, body)
    if r.status_code != 200:
        return
    file_id = r.json()["id"]
    client.tally.file_ids.append(file_id)
    assert client.send("GET", f"/v1/files/{file_id}", auth(key)).status_code == 200
    content = client.send("GET", f"/v1/files/{file_id}/content", auth(key))
    assert content.status_code == 200
    if create:
        spec = {"input_file_id": file_id, "endpoint": "/v1/chat/completions"}
        r = client.send("POST", "/v1/batches", auth(key), json.dumps(spec).encode())
        if r.status_code == 200:
            client.tally.batch_ids.append(r.json()["id"])


BATCH_SPEC = st.fixed_dictionaries(
    {},
    optional={
        "input_file_id": st.just("<file>") | TEXT | ANY_JSON,
        "endpoint": st.sampled_from(["/v1/chat/completions", "/v1/completions", "/v1/embeddings"])
        | TEXT
        | ANY_JSON,
        "completion_window": st.sampled_from(
            ["24h", "1m", "59s", "30d", "31d", "0h", "-1h", "1e400h", "9" * 400 + "h", "24h\n"]
        )
        | TEXT
        | ANY_JSON,
        "metadata": st.dictionaries(TEXT, TEXT, max_size=20) | ANY_JSON,
        "extra": ANY_VALUE,
    },
)


@pytest.mark.slow
@fuzz_settings(1000)
@given(spec=BATCH_SPEC | HOSTILE_BODY, key=KEY, which=st.integers(min_value=0))
def test_batch_creates_answer_below_500(client: Client, spec: Any, key: str, which: int) -> None:
    """Each spec as team-a and with the random key."""
    files = client.tally.file_ids
    if isinstance(spec, dict) and spec.get("input_file_id") == "<file>":
        spec = {**spec, "input_file_id": files[which % len(files)] if files else "file-none"}
    for caller in ("sk-a", key):
        r = client.send("POST", "/v1/batches", auth(caller), body_text(spec))
        if r.status_code == 200:
            client.tally.batch_ids.append(r.json()["id"])


@fuzz_settings(900)
@given(
    route=st.sampled_from(
        [
            ("GET", "/v1/files/{}"),
            ("GET", "/v1/files/{}/content"),
            ("DELETE", "/v1/files/{}"),
            ("GET", "/v1/batches/{}"),
            ("POST", "/v1/batches/{}/cancel"),
        ]
    ),
    raw_id=RANDOM_ID,
    which=st.integers(min_value=0),
    key=KEY,
)
@pytest.mark.slow
def test_gets_cancels_and_deletes_of_any_id_answer_below_500(
    client: Client, route: tuple[str, str], raw_id: str, which: int, key: str
) -> None:
    """Each case twice: an id the Batch API returned, and a random one."""
    method, template = route
    ids = client.tally.file_ids if "/files/" in template else client.tally.batch_ids
    for object_id in (ids[which % len(ids)] if ids else "file-none", raw_id or "-"):
        client.send(method, template.format(object_id), auth(key))


# ---- after the fuzz --------------------------------------------------------------------


def test_after_the_fuzz_the_router_is_up_and_its_series_are_bounded(client: Client) -> None:
    """Last of the module's shared-router tests (file order): the router still answers,
    and no request of the fuzz turned into a label value."""
    health = client.session.get(client.served.url + "/healthz", timeout=TIMEOUT)
    assert health.status_code == 200
    found = series(client)
    assert_labels_named_by_the_fleet(found)
    tally = client.tally
    print(
        f"\nfuzz: {tally.total} requests "
        + " ".join(f"{k}={v}" for k, v in sorted(tally.classes.items()))
        + f"; files {len(tally.file_ids)} batches {len(tally.batch_ids)}"
        + f"; series {tally.series_before} before, {len(found)} after"
        + f"; {time.monotonic() - tally.started:.0f} s"
    )
    assert len(found) <= tally.series_before + SERIES_SLACK


# ---- each hostile finding, one test apart -----------------------------------------------
#
# They run on a router of their own (`spare`, which also serves a model with no pod), so
# that their answers and labels stay out of the fuzz's counts and series.


@pytest.fixture(scope="module")
def spare(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    config = RouterConfig(max_body_bytes=MAX_BODY, hold_seconds=0.05)
    served = Served(tmp_path_factory.mktemp("spare"), config, models=(*MODELS, COLD))
    yield served
    served.close()


def post(served: Served, path: str, data: bytes, **headers: Any) -> requests.Response:
    return requests.post(served.url + path, data=data, headers=headers, timeout=TIMEOUT)


def upload(served: Served, part: bytes, content: bytes = b"", **headers: Any) -> requests.Response:
    """`POST /v1/files` with `part` as the file part's header (after its name)."""
    body = (
        b"--" + BOUNDARY + b'\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n'
        b"--"
        + BOUNDARY
        + b'\r\nContent-Disposition: form-data; name="file"'
        + part
        + b"\r\n\r\n"
        + content
        + b"\r\n--"
        + BOUNDARY
        + b"--\r\n"
    )
    headers.setdefault("Content-Type", b"multipart/form-data; boundary=" + BOUNDARY)
    return post(served, "/v1/files", body, **headers)


def batch_of(served: Served, line: bytes) -> requests.Response:
    """A batch created from a one-line file."""
    r = upload(served, b'; filename="in.jsonl"', line)
    assert r.status_code == 200, r.text
    spec = {"input_file_id": r.json()["id"], "endpoint": "/v1/completions"}
    return post(served, "/v1/batches", json.dumps(spec).encode())


def refused_with_400(r: requests.Response) -> None:
    assert r.status_code == 400, r.text
    assert_openai_error(r)


DEEP = b"[" * 5000 + b"]" * 5000
LONG_INT = b"1" + b"0" * 5000  # over Python's 4,300-digit limit on int(str)


def test_a_non_finite_max_tokens_leaves_the_load_estimate_finite(spare: Served) -> None:
    for value in (b"1e400", b"Infinity", b"NaN"):
        body = b'{"model": "mistral-7b", "max_tokens": ' + value + b"}"
        assert post(spare, "/v1/completions", body).status_code < 500
    assert spare.router is not None
    sent = dict(spare.router.fleet.sent)
    assert all(math.isfinite(v) for v in sent.values()), sent


@settings(max_examples=20, deadline=None, database=None, phases=[Phase.generate])
@given(region=HEADER_TEXT)
def test_a_region_header_never_becomes_a_label_value(spare: Served, region: bytes) -> None:
    r = post(spare, "/v1/completions", b'{"model": "cold-1b"}', **{"x-sageserve-region": region})
    # a region the model serves: held, then 503 (no pod); any other: 400 naming them
    assert r.status_code in (400, 503), r.text
    found = requests.get(spare.url + "/metrics", timeout=TIMEOUT)
    assert found.status_code == 200, found.text
    samples = [
        (s.name, dict(s.labels))
        for family in text_string_to_metric_families(found.text)
        for s in family.samples
    ]
    assert_labels_named_by_the_fleet(samples)


@pytest.mark.parametrize("where", ["completions", "batch-create", "batch-line"])
def test_deeply_nested_json_is_a_400(spare: Served, where: str) -> None:
    if where == "completions":
        r = post(spare, "/v1/completions", b'{"model": "mistral-7b", "x": ' + DEEP + b"}")
    elif where == "batch-create":
        r = post(spare, "/v1/batches", b'{"input_file_id": ' + DEEP + b"}")
    else:
        r = batch_of(spare, b'{"custom_id": "a", "body": ' + DEEP + b"}")
        assert r.status_code == 200, r.text  # the line is one of the batch's errors
        return
    refused_with_400(r)


@pytest.mark.parametrize("where", ["completions", "batch-create", "batch-line"])
def test_an_integer_too_long_to_convert_is_a_400(spare: Served, where: str) -> None:
    if where == "completions":
        r = post(
            spare, "/v1/completions", b'{"model": "mistral-7b", "max_tokens": ' + LONG_INT + b"}"
        )
    elif where == "batch-create":
        r = post(spare, "/v1/batches", b'{"input_file_id": ' + LONG_INT + b"}")
    else:
        r = batch_of(spare, b'{"custom_id": "a", "n": ' + LONG_INT + b"}")
        assert r.status_code == 200, r.text
        return
    refused_with_400(r)


@pytest.mark.parametrize("control", [b"%0D%0A", b"%01", b"%7F"])
def test_a_file_named_with_control_characters_can_be_downloaded(
    spare: Served, control: bytes
) -> None:
    r = upload(spare, b"; filename*=utf-8''in" + control + b"X-Injected%3A%201.jsonl", b"{}\n")
    assert r.status_code == 200, r.text
    content = requests.get(f"{spare.url}/v1/files/{r.json()['id']}/content", timeout=TIMEOUT)
    assert content.status_code == 200
    assert "X-Injected" not in content.headers


@pytest.mark.parametrize(
    "case",
    ["control-char-in-part-header", "filename-not-utf8", "no-boundary", "boundary-absent"],
)
def test_a_malformed_multipart_upload_is_answered_below_500(spare: Served, case: str) -> None:
    if case == "control-char-in-part-header":
        r = upload(spare, b'; filename="\x01.jsonl"')  # aiohttp's InvalidHeader
    elif case == "filename-not-utf8":
        r = upload(spare, b'; filename="\x80.jsonl"')  # decoded to a lone surrogate
        assert r.status_code == 200, r.text  # kept, under a name that can be stored and sent
        assert r.json()["filename"].isprintable() and "\udc80" not in r.json()["filename"]
        return
    elif case == "no-boundary":
        r = post(spare, "/v1/files", b"x", **{"Content-Type": "multipart/form-data"})
    else:
        ct = b"multipart/form-data; boundary=" + BOUNDARY
        r = post(spare, "/v1/files", b"not multipart", **{"Content-Type": ct})
    refused_with_400(r)


@pytest.mark.parametrize("where", ["input_file_id", "custom_id"])
def test_a_lone_surrogate_in_a_batch_id_is_refused_below_500(spare: Served, where: str) -> None:
    if where == "input_file_id":
        body = b'{"input_file_id": "\\ud800", "endpoint": "/v1/completions"}'
        r = post(spare, "/v1/batches", body)
        assert r.status_code == 400, r.text
    else:
        line = b'{"custom_id": "\\ud800", "method": "POST", "url": "/v1/completions", '
        r = batch_of(spare, line + b'"body": {"model": "mistral-7b"}}')
        assert r.status_code == 200, r.text


@pytest.mark.parametrize(("method", "path"), [("GET", "/v1/embeddings"), ("PUT", "/v1/models")])
def test_an_unrouted_request_is_answered_openai_shaped(
    spare: Served, method: str, path: str
) -> None:
    r = requests.request(method, spare.url + path, timeout=TIMEOUT)
    assert r.status_code in (404, 405)
    assert_openai_error(r)
