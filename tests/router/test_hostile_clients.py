"""One hostile client against a router in a process of its own, on SQLite and PostgreSQL.

The router (`tests/router/hostile_router.py`: `app.serve` with the Batch API and its
releaser, `--auth required`, two tenants) runs as a child process, so its memory is its
own and is read from `/proc/<pid>/status`; the stand-in pods run here, on a loop in a
background thread. This process is the client, over real HTTP on loopback: it tries every
way in that a hostile or careless client has, asserting the status a user would expect,
and counts what it sent, what it tried on another tenant's data (and how much of it
worked: none may), and every 5xx (none may come).

Two floods measure the router's peak RSS (`VmHWM`, reset before each through
`/proc/<pid>/clear_refs`) against the chart's memory limit for the router: concurrent
uploads (files of `{}` lines past the line cap, and files just under the byte cap), and
concurrent 7 MiB requests for a model with no ready pod, held until it gets one.

`pytest -s` prints one summary line per backend.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import re
import string
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import pytest
import requests
import yaml
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import select

import sageserve
from sageserve.batch import BatchStore
from sageserve.batch.api import DEFAULT_MAX_UPLOAD_BYTES
from sageserve.batch.limits import MAX_DEPTH
from sageserve.batch.schema import files as file_rows
from sageserve.batch.schema import requests as request_rows
from sageserve.batch.store import DEFAULT_MAX_REQUESTS
from sageserve.router.app import RouterConfig
from tests.batch import conftest as batch_fixtures
from tests.batch.test_api_tenants import dribble, raw_upload
from tests.router import hostile_router as child
from tests.router.test_fuzz_api import assert_openai_error, pod_app

#: the queue on SQLite and on a throwaway PostgreSQL, as the batch tests have it
pg_server, store_url = batch_fixtures.pg_server, batch_fixtures.store_url
REPO = Path(__file__).resolve().parents[2]
VALUES = REPO / "charts" / "sageserve" / "values.yaml"
TIMEOUT = 60.0
#: long enough for a file just under the upload cap to arrive, short for the dribbles
BODY_TIMEOUT_S = 6.0
#: the router's defaults, as the chart sets them
MAX_UPLOAD = DEFAULT_MAX_UPLOAD_BYTES
MAX_INFLIGHT = RouterConfig().max_inflight_bytes
#: fewer than the held flood, so that some of it meets this limit (and their bodies fit
#: the byte budget, so that the rest of the flood meets that one too)
MAX_HELD = 12
HELD_FLOOD, HELD_BODY = 24, 7 * 2**20
LINE_FLOOD, LINE_FLOOD_BYTES = 8, 4 * 2**20
#: more than the in-flight byte budget holds at once: the rest wait their turn (429)
NEAR_CAP_FILES = 4
A_FAST, A_LIMITED, A_BATCH, B = child.KEY_FAST, child.KEY_LIMITED, child.KEY_BATCH, child.KEY_B
LLAMA, COLD, QWEN = child.LLAMA.served_name, child.COLD.served_name, child.QWEN.served_name


def chart_memory_limit() -> int:
    """`router.resources.limits.memory` of the chart's values, in bytes."""
    values = yaml.safe_load(VALUES.read_text())
    quantity = str(values["router"]["resources"]["limits"]["memory"])
    found = re.fullmatch(r"(\d+)([KMGT]i?)?", quantity)
    assert found, quantity
    units = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}
    units |= {"K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}
    return int(found[1]) * units.get(found[2] or "", 1)


# ---- the stand-in pods, on a loop here ----------------------------------------------


@dataclass
class Pods:
    loop: asyncio.AbstractEventLoop = field(default_factory=asyncio.new_event_loop)
    urls: dict[str, str] = field(default_factory=dict)
    runners: list[web.AppRunner] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self._up(), self.loop).result(TIMEOUT)

    async def _up(self) -> None:
        for model, region in child.PODS:
            runner = web.AppRunner(pod_app())
            await runner.setup()
            await web.TCPSite(runner, "127.0.0.1", 0).start()
            self.runners.append(runner)
            port = runner.addresses[0][1]
            self.urls[child.pod_name(model, region)] = f"http://127.0.0.1:{port}"

    async def _down(self) -> None:
        for runner in self.runners:
            await runner.cleanup()

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self._down(), self.loop).result(TIMEOUT)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(TIMEOUT)
        self.loop.close()


# ---- the router, a child process ------------------------------------------------------


@dataclass
class RouterProcess:
    process: subprocess.Popen[str]
    url: str
    log: Path

    @property
    def pid(self) -> int:
        return self.process.pid

    def memory(self) -> dict[str, int]:
        """VmRSS and VmHWM of the router, in bytes."""
        found: dict[str, int] = {}
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            name, _, value = line.partition(":")
            if name in ("VmRSS", "VmHWM"):
                found[name] = int(value.split()[0]) * 1024
        return found

    def reset_peak(self) -> None:
        """VmHWM back to the current RSS (`clear_refs` 5, Linux 4.0 and later)."""
        Path(f"/proc/{self.pid}/clear_refs").write_text("5")

    def scale(self) -> None:
        """The cold model's pod listed: its held requests are served."""
        stdin, stdout = self.process.stdin, self.process.stdout
        assert stdin is not None and stdout is not None
        stdin.write("scale\n")
        stdin.flush()
        assert stdout.readline().strip() == "scaled"

    def close(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()
        try:
            self.process.wait(TIMEOUT)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(TIMEOUT)


def start_router(store_url: str, pods: Pods, log: Path) -> RouterProcess:
    spec = {
        "store_url": store_url,
        "pods": pods.urls,
        "body_timeout_s": BODY_TIMEOUT_S,
        "hold_seconds": 60.0,
        "max_held_requests": MAX_HELD,
        "max_inflight_bytes": MAX_INFLIGHT,
        "max_upload_bytes": MAX_UPLOAD,
    }
    paths = [str(Path(sageserve.__file__).resolve().parents[1]), str(REPO)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([*paths, os.environ.get("PYTHONPATH", "")])}
    err: IO[str] = log.open("w")
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.router.hostile_router", json.dumps(spec)],
        cwd=REPO,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=err,
        text=True,
    )
    err.close()
    assert process.stdout is not None
    first = process.stdout.readline()
    assert first.startswith("port "), (first, log.read_text())
    return RouterProcess(process, f"http://127.0.0.1:{int(first.split()[1])}", log)


# ---- the hostile client ------------------------------------------------------------------


@dataclass
class Hostile:
    """Sends requests and counts: inputs tried, cross-tenant attempts and successes, 5xx."""

    url: str
    session: requests.Session = field(default_factory=requests.Session)
    tried: int = 0
    server_errors: list[str] = field(default_factory=list)
    cross: int = 0
    crossed: list[str] = field(default_factory=list)
    statuses: Counter[int] = field(default_factory=Counter)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def counted(self, status: int, what: str) -> None:
        with self.lock:
            self.tried += 1
            self.statuses[status] += 1
            if status >= 500:
                self.server_errors.append(what)

    def send(
        self,
        method: str,
        path: str,
        key: str | None,
        expect: int | tuple[int, ...],
        headers: dict[str, str] | None = None,
        session: requests.Session | None = None,
        **kwargs: Any,
    ) -> requests.Response:
        """One request; its status must be one of `expect`, an error OpenAI-shaped."""
        sent = dict(headers or {})
        if key is not None:
            sent["Authorization"] = f"Bearer {key}"
        r = (session or self.session).request(
            method, self.url + path, headers=sent, timeout=TIMEOUT, **kwargs
        )
        self.counted(r.status_code, f"{method} {path} {headers}: {r.status_code} {r.text[:200]}")
        expected = (expect,) if isinstance(expect, int) else expect
        assert r.status_code in expected, (method, path, key, headers, r.status_code, r.text)
        if r.status_code >= 400:
            assert_openai_error(r)
        return r

    def across(
        self, method: str, path: str, key: str | None, expect: int, **kwargs: Any
    ) -> requests.Response:
        """A request for another tenant's model or object: it must fail as `expect`."""
        with self.lock:
            self.cross += 1
        try:
            return self.send(method, path, key, expect, **kwargs)
        except AssertionError:
            with self.lock:
                self.crossed.append(f"{method} {path} as {key}")
            raise

    def listing(self, path: str, key: str, foreign: set[str]) -> list[str]:
        """A listing another tenant asks for: 200, none of `foreign` in it."""
        with self.lock:
            self.cross += 1
        ids = [obj["id"] for obj in self.send("GET", path, key, 200).json()["data"]]
        if foreign & set(ids):
            with self.lock:
                self.crossed.append(f"GET {path} as {key} listed {foreign & set(ids)}")
        return ids

    def error(self, r: requests.Response) -> dict[str, Any]:
        error: dict[str, Any] = r.json()["error"]
        return error


def completion(model: str = LLAMA, **extra: Any) -> dict[str, Any]:
    return {"model": model, "prompt": "hello", "max_tokens": 8, **extra}


def chat(model: str = LLAMA, **extra: Any) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": "hi"}], **extra}


def batch_line(custom_id: str, model: str = LLAMA) -> str:
    body = {"model": model, "messages": [{"role": "user", "content": custom_id}]}
    line = {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions"}
    return json.dumps({**line, "body": body})


def multipart(content: bytes, filename: str = "in.jsonl") -> tuple[bytes, str]:
    """A multipart upload body (built once, sent as is by many threads)."""
    boundary = "hostileboundary7f3a"
    head = (
        f"--{boundary}\r\n"
        'Content-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n'
        f"--{boundary}\r\n"
        f'Content-Disposition: form-data; name="file"; filename="{filename}"\r\n'
        "Content-Type: application/jsonl\r\n\r\n"
    ).encode()
    tail = f"\r\n--{boundary}--\r\n".encode()
    return head + content + tail, f"multipart/form-data; boundary={boundary}"


def upload(h: Hostile, key: str, content: bytes, expect: int = 200) -> requests.Response:
    body, content_type = multipart(content)
    return h.send("POST", "/v1/files", key, expect, {"Content-Type": content_type}, data=body)


def series(h: Hostile) -> set[tuple[str, frozenset[tuple[str, str]]]]:
    text = h.session.get(h.url + "/metrics", timeout=TIMEOUT).text
    return {
        (s.name, frozenset(s.labels.items()))
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def sample(h: Hostile, name: str, **labels: str) -> float:
    text = h.session.get(h.url + "/metrics", timeout=TIMEOUT).text
    return sum(
        s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
    )


def until(
    check: Callable[[], bool], what: str | Callable[[], str], seconds: float = TIMEOUT
) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, what() if callable(what) else what
        time.sleep(0.05)


# ---- the attacks ---------------------------------------------------------------------


def no_key_or_a_wrong_one(h: Hostile) -> None:
    """Every route without a key, with an unknown one, or another scheme: 401."""
    routes: list[tuple[str, str, dict[str, Any]]] = [
        ("POST", "/v1/completions", {"json": completion()}),
        ("POST", "/v1/chat/completions", {"json": chat()}),
        ("GET", "/v1/models", {}),
        ("GET", "/v1/files", {}),
        ("GET", "/v1/batches", {}),
        (
            "POST",
            "/v1/batches",
            {"json": {"input_file_id": "file-x", "endpoint": "/v1/chat/completions"}},
        ),
        ("POST", "/v1/files", {"data": b"x", "headers": {"Content-Type": "text/plain"}}),
    ]
    for method, path, kwargs in routes:
        for key in (None, "sk-nope", "sk-a-fas", "sk-a-fast2", "\u00e9t\u00e9"):
            h.send(method, path, key, 401, **kwargs)
        for scheme in ("Basic c2stYS1mYXN0Og==", "sk-a-fast", "Bearer"):
            headers = {"Authorization": scheme, **kwargs.get("headers", {})}
            rest = {k: v for k, v in kwargs.items() if k != "headers"}
            h.send(method, path, None, 401, headers=headers, **rest)


def other_tenants_models(h: Hostile) -> None:
    """team-b's key on team-a's models: 404, as a model that does not exist; the model
    lists are each tenant's own."""
    for path, body in (("/v1/completions", completion), ("/v1/chat/completions", chat)):
        for model in (LLAMA, COLD):
            r = h.across("POST", path, B, 404, json=body(model))
            served = h.error(r)["message"].split("served models:")[1]
            assert h.error(r)["param"] == "model" and LLAMA not in served
        r = h.across("POST", path, A_FAST, 404, json=body(QWEN))
        assert QWEN not in h.error(r)["message"].split("served models:")[1]
        assert h.send("POST", path, B, 200, json=body(QWEN)).status_code == 200
        h.send("POST", path, A_FAST, 200, json=body(LLAMA))
    with h.lock:
        h.cross += 2
    mine = [m["id"] for m in h.send("GET", "/v1/models", B, 200).json()["data"]]
    theirs = [m["id"] for m in h.send("GET", "/v1/models", A_FAST, 200).json()["data"]]
    if set(mine) != {QWEN}:
        h.crossed.append(f"GET /v1/models as {B}: {mine}")
    if set(theirs) != {LLAMA, COLD}:
        h.crossed.append(f"GET /v1/models as {A_FAST}: {theirs}")


def tiers_a_key_may_not_use(h: Hostile) -> None:
    """The tier header narrows among the key's tiers, never grants one."""
    for header in ("iw-f", "interactive", "iw-n"):
        r = h.send(
            "POST", "/v1/completions", A_BATCH, 403, {"x-sageserve-tier": header}, json=completion()
        )
        assert h.error(r)["param"] == "x-sageserve-tier" and "niw" in h.error(r)["message"]
    r = h.send(
        "POST", "/v1/completions", A_FAST, 403, {"x-sageserve-tier": "niw"}, json=completion()
    )
    assert "iw-f" in h.error(r)["message"]
    # team-b's key names a tier of team-a's that its own model does not serve
    h.send("POST", "/v1/completions", B, 400, {"x-sageserve-tier": "iw-n"}, json=completion(QWEN))


def numbers_no_request_may_carry(h: Hostile) -> None:
    """Non-finite, negative, huge or boolean counts: 400 naming the field."""
    raw = {
        "max_tokens": ["NaN", "Infinity", "-Infinity", "-1e12", "1e15", "-1", "0", "1e400"],
        "n": ["0", "1000", "true", "-1", "NaN", "2.5"],
        "max_completion_tokens": ["NaN", "1e15"],
        "best_of": ["0", "1000"],
    }
    for path, start in (
        ("/v1/completions", '{"model": "llama-8b", "prompt": "hi"'),
        (
            "/v1/chat/completions",
            '{"model": "llama-8b", "messages": [{"role": "user", "content": "hi"}]',
        ),
    ):
        for name, values in raw.items():
            if name == "best_of" and "chat" in path:
                continue
            for value in values:
                data = f'{start}, "{name}": {value}}}'.encode()
                headers = {"Content-Type": "application/json"}
                r = h.send("POST", path, A_FAST, 400, headers, data=data)
                assert h.error(r)["param"] == name, (name, value, r.text)


def headers_that_name_nothing(h: Hostile) -> int:
    """Random region and tier headers: 400 (or 403), and not one new series in /metrics.
    Returns how many were sent."""
    h.send("POST", "/v1/completions", A_FAST, 200, json=completion())
    before = series(h)
    rng = random.Random(11)
    sent = 0
    for i in range(60):
        junk = "".join(
            rng.choices(string.ascii_letters + string.digits + "-_.", k=rng.randint(1, 40))
        )
        header = "x-sageserve-region" if i % 2 == 0 else "x-sageserve-tier"
        for key, model in ((A_FAST, LLAMA), (B, QWEN)):
            r = h.send("POST", "/v1/completions", key, 400, {header: junk}, json=completion(model))
            assert h.error(r)["param"] == header
            sent += 1
    # a served tier the key may not use, and a served region of another tenant's model
    h.send("POST", "/v1/completions", A_FAST, 403, {"x-sageserve-tier": "iw-n"}, json=completion())
    h.send(
        "POST", "/v1/completions", B, 400, {"x-sageserve-region": "us-west"}, json=completion(QWEN)
    )
    after = series(h)
    assert after - before == set(), sorted(after - before)[:10]
    return sent


def bodies_nested_too_deep(h: Hostile) -> None:
    deep = "[" * 200_000 + "]" * 200_000
    headers = {"Content-Type": "application/json"}
    for path, start in (
        ("/v1/completions", '{"model": "llama-8b", "prompt": '),
        ("/v1/chat/completions", '{"model": "llama-8b", "messages": '),
        ("/v1/batches", '{"endpoint": "/v1/chat/completions", "input_file_id": '),
    ):
        r = h.send(
            "POST",
            path,
            A_BATCH if "batches" in path else A_FAST,
            400,
            headers,
            data=(start + deep + "}").encode(),
        )
        assert str(MAX_DEPTH) in h.error(r)["message"]
    r = h.send("POST", "/v1/completions", A_FAST, 400, headers, data=b"{" * 100_000)
    assert "JSON" in h.error(r)["message"]


@dataclass
class TeamA:
    """team-a's Batch API objects: a finished batch, its files."""

    input_file: str
    batch: str
    output_file: str
    error_file: str

    @property
    def ids(self) -> set[str]:
        return {self.input_file, self.batch, self.output_file, self.error_file}


def team_a_runs_a_batch(h: Hostile) -> TeamA:
    """A batch of two good lines and one nested too deep: that line's error, the others run."""
    nested = json.dumps(
        {"custom_id": "deep", "method": "POST", "url": "/v1/chat/completions", "body": 1}
    )
    lines = [
        batch_line("one"),
        nested.replace("1}", "[" * 100_000 + "]" * 100_000 + "}"),
        batch_line("two"),
    ]
    file = upload(h, A_BATCH, ("\n".join(lines) + "\n").encode()).json()
    body = {"input_file_id": file["id"], "endpoint": "/v1/chat/completions"}
    batch = h.send("POST", "/v1/batches", A_BATCH, 200, json=body).json()
    assert batch["request_counts"] == {"total": 3, "completed": 0, "failed": 1}
    done: dict[str, Any] = {}

    def finished() -> bool:
        done.update(h.send("GET", f"/v1/batches/{batch['id']}", A_BATCH, 200).json())
        return done["status"] == "completed"

    until(finished, f"batch {batch['id']} did not complete")
    assert done["request_counts"] == {"total": 3, "completed": 2, "failed": 1}
    errors = h.send("GET", f"/v1/files/{done['error_file_id']}/content", A_BATCH, 200).text
    [error] = [json.loads(x) for x in errors.splitlines()]
    assert (
        error["error"]["code"] == "invalid_json_line"
        and str(MAX_DEPTH) in error["error"]["message"]
    )
    return TeamA(file["id"], batch["id"], done["output_file_id"], done["error_file_id"])


def another_tenants_batch_objects(h: Hostile, a: TeamA) -> None:
    """team-b (and the same calls anonymously: 401) on team-a's ids: 404, never data."""
    for file_id in (a.input_file, a.output_file, a.error_file):
        for method, path in (
            ("GET", f"/v1/files/{file_id}"),
            ("GET", f"/v1/files/{file_id}/content"),
            ("DELETE", f"/v1/files/{file_id}"),
        ):
            r = h.across(method, path, B, 404)
            assert h.error(r)["code"] == "not_found"
            h.send(method, path, None, 401)
        body = {"input_file_id": file_id, "endpoint": "/v1/chat/completions"}
        r = h.across("POST", "/v1/batches", B, 400, json=body)
        assert h.error(r)["param"] == "input_file_id" and "no such file" in h.error(r)["message"]
    for method, path in (
        ("GET", f"/v1/batches/{a.batch}"),
        ("POST", f"/v1/batches/{a.batch}/cancel"),
    ):
        r = h.across(method, path, B, 404)
        assert h.error(r)["code"] == "not_found"
    for path in (
        "/v1/files",
        "/v1/files?purpose=batch_output",
        "/v1/batches",
        "/v1/files?limit=10000",
    ):
        h.listing(path, B, a.ids)
    for path in (f"/v1/batches?after={a.batch}", f"/v1/files?after={a.input_file}"):
        h.across("GET", path, B, 400)
    # team-b's own work stays its own; team-a's is untouched by the attempts
    theirs = upload(h, B, (batch_line("b", QWEN) + "\n").encode()).json()
    assert h.listing("/v1/files", B, a.ids) == [theirs["id"]]
    mine = set(h.listing("/v1/files", A_BATCH, {theirs["id"]}))
    assert {a.input_file, a.output_file, a.error_file} <= mine
    assert h.send("GET", f"/v1/batches/{a.batch}", A_BATCH, 200).json()["status"] == "completed"
    # a batch over team-a's model from team-b's own file: that model is not team-b's
    body = {"input_file_id": theirs["id"], "endpoint": "/v1/chat/completions"}
    h.send("POST", "/v1/batches", B, 200, json=body)  # qwen-7b is team-b's: accepted
    line = (batch_line("x", LLAMA) + "\n").encode()
    foreign = upload(h, B, line).json()
    body = {"input_file_id": foreign["id"], "endpoint": "/v1/chat/completions"}
    with h.lock:
        h.cross += 1
    r = h.send("POST", "/v1/batches", B, (200, 400), json=body)
    if r.status_code == 200:
        assert r.json()["request_counts"]["failed"] == 1  # the line's error, never run
        if r.json()["request_counts"]["completed"]:
            h.crossed.append("a batch of team-b ran team-a's model")


def a_filename_with_cr_lf(h: Hostile) -> None:
    body, content_type = raw_upload("evil%0D%0ASet-Cookie%3A%20x%3D1%22.jsonl", b'{"x": 1}\n')
    file = h.send(
        "POST", "/v1/files", A_BATCH, 200, {"Content-Type": content_type}, data=body
    ).json()
    assert "\r" not in file["filename"] and "\n" not in file["filename"]
    r = h.send("GET", f"/v1/files/{file['id']}/content", A_BATCH, 200)
    assert r.content == b'{"x": 1}\n' and "Set-Cookie" not in r.headers
    disposition = r.headers["Content-Disposition"]
    assert "\r" not in disposition and "\n" not in disposition


def dribbled_bodies(h: Hostile) -> None:
    """A body that never finishes, on each route that reads one: 408, connection closed."""
    upload_body, content_type = raw_upload("in.jsonl", (batch_line("a") + "\n").encode())
    heads = [
        (
            f"POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\n"
            f"Content-Type: {kind}\r\nContent-Length: {size}\r\n\r\n",
            start,
        )
        for path, key, kind, size, start in (
            ("/v1/completions", A_FAST, "application/json", 1000, b'{"model": "llama-8b", '),
            ("/v1/batches", A_BATCH, "application/json", 1000, b'{"input_file_id": '),
            ("/v1/files", A_BATCH, content_type, len(upload_body) + 100, upload_body),
        )
    ]

    async def all_at_once() -> list[tuple[bytes, bytes]]:
        return list(await asyncio.gather(*(dribble(h.url, head, start) for head, start in heads)))

    for response, after in asyncio.run(all_at_once()):
        status = int(response.split(b" ", 2)[1])
        h.counted(status, f"dribbled: {response[:200]!r}")
        assert status == 408, response
        assert after == b""


def a_tier_rate_limit(h: Hostile) -> None:
    for _ in range(child.RATE_LIMIT_RPM):
        h.send("POST", "/v1/completions", A_LIMITED, 200, json=completion())
    r = h.send("POST", "/v1/completions", A_LIMITED, 429, json=completion())
    assert int(r.headers["Retry-After"]) > 0
    # another key of the tenant is not limited by it
    h.send("POST", "/v1/completions", A_FAST, 200, json=completion())


@dataclass
class Flood:
    before: int
    peak: int
    after: int

    def mib(self) -> str:
        before, peak, after = (round(x / 2**20) for x in (self.before, self.peak, self.after))
        return f"{before} -> peak {peak} -> {after} MiB"


def upload_flood(h: Hostile, router: RouterProcess) -> Flood:
    """Files of `{}` lines past the line cap, and files just under the byte cap, all at
    once: the former 400 while they stream, the latter stored, as many at once as the
    in-flight byte budget holds (the others 429 with Retry-After, their bodies unread);
    after the flood, such a file is stored."""
    lines, line_type = multipart(b"{}\n" * (LINE_FLOOD_BYTES // 3))
    per_line = (MAX_UPLOAD - 4096) // (DEFAULT_MAX_REQUESTS - 1000)
    pad = "x" * (per_line - len('{"custom_id": "", "pad": ""}') - 8)
    near = "".join(
        f'{{"custom_id": "{i:06d}", "pad": "{pad}"}}\n' for i in range(DEFAULT_MAX_REQUESTS - 1000)
    ).encode()
    last = MAX_UPLOAD - 1024 - len(near)  # the file 1 KiB under the cap
    near += b'{"pad": "' + b"x" * (last - len('{"pad": ""}\n')) + b'"}\n'
    assert len(near) == MAX_UPLOAD - 1024
    near_body, near_type = multipart(near)
    del near
    router.reset_peak()
    before = router.memory()["VmRSS"]

    def one(data: bytes, content_type: str, expect: int) -> requests.Response:
        with requests.Session() as session:
            headers = {"Content-Type": content_type}
            return h.send("POST", "/v1/files", A_BATCH, expect, headers, session, data=data)

    with ThreadPoolExecutor(LINE_FLOOD + NEAR_CAP_FILES) as pool:
        flood = [pool.submit(one, lines, line_type, (400, 429)) for _ in range(LINE_FLOOD)]
        flood += [pool.submit(one, near_body, near_type, (200, 429)) for _ in range(NEAR_CAP_FILES)]
        answers = [f.result() for f in flood]
    memory = router.memory()
    for r in answers:
        if r.status_code == 429:
            assert int(r.headers["Retry-After"]) > 0
            assert h.error(r)["code"] == "max_inflight_bytes"
    assert all(
        h.error(r)["code"] == "too_many_requests"
        for r in answers[:LINE_FLOOD]
        if r.status_code == 400
    )
    # which of them the budget admits depends on the order they arrive in; once the
    # flood has been answered its bytes are released and a file just under the cap fits
    stored = [r.json()["id"] for r in answers[LINE_FLOOD:] if r.status_code == 200]
    stored.append(one(near_body, near_type, 200).json()["id"])
    for file_id in stored:
        h.send("DELETE", f"/v1/files/{file_id}", A_BATCH, 200)
    return Flood(before, memory["VmHWM"], memory["VmRSS"])


def held_flood(h: Hostile, router: RouterProcess) -> Flood:
    """Large requests for a model with no ready pod, all at once: up to the held and
    in-flight byte limits they wait, the rest 429 with Retry-After; once the model has
    a pod every held request is served."""
    payload = json.dumps(completion(COLD, prompt="x" * HELD_BODY)).encode()
    headers = {"Content-Type": "application/json"}
    router.reset_peak()
    before = router.memory()["VmRSS"]

    def one() -> requests.Response:
        with requests.Session() as session:
            return h.send(
                "POST", "/v1/completions", A_FAST, (200, 429), headers, session, data=payload
            )

    with ThreadPoolExecutor(HELD_FLOOD) as pool:
        flood: list[Future[requests.Response]] = [pool.submit(one) for _ in range(HELD_FLOOD)]
        held = dict(namespace="team-a", model_deployment="cold")
        until(
            lambda: (
                sum(f.done() for f in flood) == HELD_FLOOD - MAX_HELD
                and sample(h, "sageserve_router_held_requests", **held) == MAX_HELD
            ),
            lambda: (
                f"the held flood did not settle: {sum(f.done() for f in flood)} answered, "
                f"{sample(h, 'sageserve_router_held_requests', **held)} held, "
                f"{[f.result().status_code for f in flood if f.done()]}"
            ),
            seconds=20,
        )
        refused = [f.result() for f in flood if f.done()]
        held_memory = router.memory()
        router.scale()
        answers = [f.result() for f in flood]
    codes = Counter()
    for r in refused:
        assert r.status_code == 429 and int(r.headers["Retry-After"]) > 0
        codes[h.error(r)["code"]] += 1
    assert set(codes) <= {"max_held_requests", "max_inflight_bytes"} and codes["max_held_requests"]
    assert sum(r.status_code == 200 for r in answers) == MAX_HELD
    memory = router.memory()
    assert held_memory["VmHWM"] <= memory["VmHWM"]
    return Flood(before, memory["VmHWM"], memory["VmRSS"])


def deleted_files_prompts_are_gone(h: Hostile, a: TeamA, store_url: str) -> None:
    h.send("DELETE", f"/v1/files/{a.input_file}", A_BATCH, 200)
    h.send("GET", f"/v1/files/{a.input_file}/content", A_BATCH, 404)
    store = BatchStore.open(store_url)
    try:
        with store.engine.connect() as conn:
            bodies = (
                conn.execute(select(request_rows.c.body).where(request_rows.c.batch_id == a.batch))
                .scalars()
                .all()
            )
            kept = (
                conn.execute(select(file_rows.c.id).where(file_rows.c.id == a.input_file))
                .scalars()
                .all()
            )
    finally:
        store.close()
    assert len(bodies) == 3 and bodies == [None] * 3
    assert kept == []
    # the results stay until the batch's own retention
    h.send("GET", f"/v1/files/{a.output_file}/content", A_BATCH, 200)


# ---- the test ------------------------------------------------------------------------


@pytest.mark.slow
def test_a_hostile_client_gets_nothing_of_another_tenant_no_5xx_and_bounded_memory(
    store_url: str, tmp_path: Path
) -> None:
    limit = chart_memory_limit()
    backend = store_url.split(":", 1)[0]
    pods = Pods()
    router = start_router(store_url, pods, tmp_path / "router.log")
    h = Hostile(router.url)
    try:
        until(lambda: h.session.get(h.url + "/readyz", timeout=TIMEOUT).ok, "router not ready")
        # slow clients hold their connections through everything else, until 408
        slow = ThreadPoolExecutor(1).submit(dribbled_bodies, h)
        no_key_or_a_wrong_one(h)
        other_tenants_models(h)
        tiers_a_key_may_not_use(h)
        numbers_no_request_may_carry(h)
        headers_that_name_nothing(h)
        bodies_nested_too_deep(h)
        a = team_a_runs_a_batch(h)
        another_tenants_batch_objects(h, a)
        a_filename_with_cr_lf(h)
        a_tier_rate_limit(h)
        uploads = upload_flood(h, router)
        held = held_flood(h, router)
        deleted_files_prompts_are_gone(h, a, store_url)
        slow.result(TIMEOUT)
        assert h.session.get(h.url + "/healthz", timeout=TIMEOUT).text == "ok"
    finally:
        h.session.close()
        router.close()
        pods.close()
        log = router.log.read_text()
    print(
        f"\nhostile clients [{backend}]: {h.tried} inputs tried, {h.cross} cross-tenant "
        f"attempts, {len(h.crossed)} succeeded, {len(h.server_errors)} 5xx; router RSS "
        f"upload flood {uploads.mib()}, held flood {held.mib()}, "
        f"limit {limit / 2**20:.0f} MiB; statuses {dict(sorted(h.statuses.items()))}"
    )
    assert h.crossed == []
    assert h.server_errors == []
    assert "Traceback" not in log, log[-4000:]
    assert uploads.peak < limit and held.peak < limit
