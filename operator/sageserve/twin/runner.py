"""The live twin: pods in, simulated load through time, metrics out over HTTP.

Threads: one loop advances the simulation to the clock every `tick_s` and re-lists pods
every `refresh_s`; an HTTP server answers scrapes. One lock guards the simulation, so a
scrape sees a consistent instant.

HTTP:
- `GET /metrics/<namespace>/<pod>`: that pod's vLLM metrics (what its vLLM would serve);
  404 for a pod that does not serve, so Prometheus marks it down.
- `GET /metrics/pods`: every serving pod, with the pod labels on the series (for a
  scrape job with `honor_labels: true`).
- `GET /metrics`: the twin's own metrics (simulated time, lag, requests per endpoint).
- `GET /status`: JSON (time, speed, load, pods and their state).
- `POST /pods/<namespace>/<pod>/v1/completions` (and `/v1/chat/completions`): the pod's
  OpenAI API, answered with its simulated instance's timing (`twin.openai`).
- `POST /load` with `{"multiplier": 2.5, "endpoint": "*/bloom-176b/*"}`: change the load
  at run time (tests script rising and falling load with it); `POST /speed`
  with `{"speed": 60}`.

With `targets_file`, the twin writes a Prometheus file_sd file with one target per
serving pod (`__metrics_path__` = its path, labels = the pod labels), rewritten
atomically when the set changes and emptied on stop.

With `pod_listeners`, the twin also answers at each serving pod's own address, as its
vLLM server would: `http://<podIP>:<containerPort>/metrics`, `/health`,
`/v1/completions`, `/v1/chat/completions` (and, for a pooled pod's engine ports, `/sleep`,
`/wake_up`, `/is_sleeping`). Clients that find pods by their IP (an endpoint picker, a
router with its default backend URL) then reach them over plain HTTP. It needs pod IPs
this host can bind: the e2e kit gives KWOK pods loopback addresses. A pod whose address
cannot be bound is reported in `/status` (`listenerErrors`) and retried on each re-list.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections.abc import Callable, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote

from sageserve.twin import openai
from sageserve.twin.clock import AcceleratedClock
from sageserve.twin.exposition import POD_LABELS, encode, families, twin_families
from sageserve.twin.load import (
    ContextLengthExceeded,
    PodSample,
    PriorityRefused,
    TwinSim,
    endpoint_name,
)
from sageserve.twin.pods import PodInfo
from sageserve.twin.sleep_mode import EngineMode, OutOfMemory, PodEngines, transfer_seconds

log = logging.getLogger("sageserve.twin")


def pod_path(namespace: str, pod: str) -> str:
    return f"/metrics/{namespace}/{pod}"


def file_sd(pods: Sequence[PodInfo], address: str) -> list[dict[str, Any]]:
    """file_sd entries: one target per serving pod, labelled as the chart's scrape would."""
    out = []
    for p in sorted(pods, key=lambda p: p.key):
        if not p.serving:
            continue
        values = (p.namespace, p.model_deployment, p.region, p.variant, p.name)
        labels = dict(zip(POD_LABELS, values, strict=True))
        labels["__metrics_path__"] = pod_path(p.namespace, p.name)
        out.append({"targets": [address], "labels": labels})
    return out


def write_atomically(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


class Twin:
    """The running twin. `start()` binds the port and starts the threads; `stop()` ends them."""

    def __init__(
        self,
        sim: TwinSim,
        clock: AcceleratedClock,
        list_pods: Callable[[], list[PodInfo]],
        host: str = "127.0.0.1",
        port: int = 0,
        targets_file: Path | None = None,
        refresh_s: float = 1.0,
        tick_s: float = 0.25,
        on_new_namespaces: Callable[[set[str]], None] | None = None,
        pod_listeners: bool = False,
    ) -> None:
        self.sim = sim
        self.clock = clock
        self.list_pods = list_pods
        self.targets_file = targets_file
        self.refresh_s = refresh_s
        self.tick_s = tick_s
        self.on_new_namespaces = on_new_namespaces
        self.pod_listeners = pod_listeners
        #: (address, port) → the listener answering for one pod there (`pod_listeners`)
        self.listeners: dict[tuple[str, int], PodListener] = {}
        #: (address, port) → why it could not be bound (retried on each re-list)
        self.listener_errors: dict[tuple[str, int], str] = {}
        self.lock = threading.RLock()
        self.stopped = threading.Event()
        self.pods: list[PodInfo] = []
        #: sleep state of each serving pooled pod's engines (`twin.sleep_mode`)
        self.engines: dict[tuple[str, str], PodEngines] = {}
        self._targets_text: str | None = None
        self.lag_s = 0.0
        self.list_errors = 0
        self.server = ThreadingHTTPServer((host, port), _handler(self))
        self.server.daemon_threads = True
        self.host, self.port = str(self.server.server_address[0]), self.server.server_address[1]
        self._threads: list[threading.Thread] = []

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    # ---- life cycle ---------------------------------------------------------------------

    def start(self) -> Twin:
        self.refresh()
        for target, name in ((self.server.serve_forever, "http"), (self._loop, "loop")):
            t = threading.Thread(target=target, name=f"twin-{name}", daemon=True)
            t.start()
            self._threads.append(t)
        return self

    def stop(self) -> None:
        self.stopped.set()
        self.server.shutdown()
        self.server.server_close()
        for t in self._threads:
            t.join(timeout=10)
        for listener in self.listeners.values():
            listener.close()
        self.listeners = {}
        if self.targets_file is not None:
            write_atomically(self.targets_file, "[]\n")

    def __enter__(self) -> Twin:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()

    def _loop(self) -> None:
        next_refresh = time.monotonic() + self.refresh_s
        while not self.stopped.wait(self.tick_s):
            try:
                if time.monotonic() >= next_refresh:
                    next_refresh = time.monotonic() + self.refresh_s
                    self.refresh()
                else:
                    self.step()
            except Exception:  # the API server away, a bad pod: keep serving what we have
                log.exception("twin pass failed; retrying")

    def step(self) -> None:
        """Advance the simulation to the clock."""
        target = self.clock.now()
        started = time.monotonic()
        with self.lock:
            self.sim.advance(target)
        took = time.monotonic() - started
        self.lag_s = max(0.0, self.clock.now() - self.sim.now)
        if took > 5 * max(self.tick_s, 0.2):
            log.warning("simulating %.1f s of trace took %.1f s of wall time", target, took)

    def refresh(self) -> None:
        """Re-list pods, match the simulated fleet to them, rewrite the targets file."""
        try:
            pods = self.list_pods()
        except Exception as exc:
            self.list_errors += 1
            log.warning("listing pods failed (keeping the last list): %s", exc)
            self.step()
            return
        with self.lock:
            self.sim.advance(self.clock.now())
            known = dict(self.sim.problems)
            # new endpoints, and pods still without a profile: (re)read perf-profile annotations
            namespaces = {
                p.namespace for p in pods if p.endpoint not in self.sim.endpoints or p.name in known
            }
            if namespaces and self.on_new_namespaces is not None:
                self.on_new_namespaces(namespaces)
            added, removed = self.sim.sync(pods)
            self.pods = pods
            self._sync_engines()
            problems = {k: v for k, v in self.sim.problems.items() if known.get(k) != v}
        for problem in problems.values():
            log.error("%s", problem)
        for name in added:
            log.info("pod %s serves", name)
        for name in removed:
            log.info("pod %s stopped serving", name)
        if self.targets_file is not None:
            text = json.dumps(file_sd(pods, self.address), indent=1) + "\n"
            if text != self._targets_text:
                write_atomically(self.targets_file, text)
                self._targets_text = text
        if self.pod_listeners:
            self._sync_listeners(pods)

    def _sync_listeners(self, pods: Sequence[PodInfo]) -> None:
        """One listener per (pod IP, port) of every serving pod; closed when the pod stops
        serving or its address now belongs to another pod."""
        wanted = pod_addresses(pods)
        for key, listener in list(self.listeners.items()):
            if wanted.get(key) != listener.target:
                listener.close()
                del self.listeners[key]
                log.info("pod %s/%s: stopped listening on %s:%d", *listener.target[:2], *key)
        self.listener_errors = {k: v for k, v in self.listener_errors.items() if k in wanted}
        for key, target in wanted.items():
            if key in self.listeners:
                continue
            try:
                self.listeners[key] = PodListener(self, key, target)
            except OSError as exc:
                if key not in self.listener_errors:
                    log.warning(
                        "pod %s/%s: cannot listen on %s:%d (%s); is its pod IP an address of "
                        "this host?",
                        *target[:2],
                        *key,
                        exc,
                    )
                self.listener_errors[key] = str(exc)
                continue
            self.listener_errors.pop(key, None)
            log.info("pod %s/%s: listening on %s:%d", *target[:2], *key)

    def _sync_engines(self) -> None:
        """Sleep state for every serving pooled pod (all engines asleep when it appears,
        as its launcher leaves them); gone with the pod. Call under the lock."""
        live = {}
        for key, tp in self.sim.pods.items():
            if not tp.info.engines:
                continue
            found = self.engines.get(key)
            if found is None:
                perf = tp.instance.perf
                try:
                    cost = transfer_seconds(perf.model, perf.gpu_type, perf.gpus)
                except KeyError as exc:
                    log.warning("pod %s/%s: no switch time (%s); 1 s", *key, exc)
                    cost = 1.0
                found = PodEngines.of(list(tp.info.engines), tp.info.awake_quota, cost)
            live[key] = found
        self.engines = live

    # ---- what the HTTP server answers ---------------------------------------------------

    def samples(self) -> list[PodSample]:
        with self.lock:
            return self.sim.samples()

    def status(self) -> dict[str, Any]:
        with self.lock:
            sim = self.sim
            samples = sim.samples()
            endpoints = {
                endpoint_name(ep): {
                    "arrived": e.arrived,
                    "rejected": e.rejected,
                    "refused": e.refused,
                    "lost": e.lost,
                    "servingPods": sorted(e.pods),
                    "loadMultiplier": sim.load.multiplier(ep, sim.now),
                }
                for ep, e in sorted(sim.endpoints.items())
            }
            pods = [
                {
                    "namespace": p.namespace,
                    "name": p.name,
                    "endpoint": endpoint_name(p.endpoint),
                    "phase": p.phase,
                    "serving": p.serving,
                    "node": p.node,
                }
                for p in self.pods
            ]
            engines = {
                f"{ns}/{pod}": e.state(sim.now) for (ns, pod), e in sorted(self.engines.items())
            }
        listeners: dict[str, list[str]] = {}
        for (address, port), listener in sorted(self.listeners.copy().items()):
            listeners.setdefault("/".join(listener.target[:2]), []).append(f"{address}:{port}")
        errors = {f"{a}:{p}": why for (a, p), why in sorted(self.listener_errors.copy().items())}
        return {
            "simTime": sim.now,
            "speed": self.clock.speed,
            "lagSeconds": self.lag_s,
            "overrides": sim.load.overrides(),
            "endpoints": endpoints,
            "pods": pods,
            "problems": dict(sim.problems),
            "engines": engines,
            "listeners": listeners,
            "listenerErrors": errors,
            "samples": {
                f"{s.pod.namespace}/{s.pod.name}": {
                    "kvUsage": round(s.kv_usage, 4),
                    "running": s.running,
                    "waiting": s.waiting,
                    "promptTokens": s.counters.prompt_tokens,
                    "generationTokens": s.counters.generation_tokens,
                }
                for s in samples
            },
        }

    def own_metrics(self) -> tuple[bytes, str]:
        with self.lock:
            sim = self.sim
            eps = {
                ep: {
                    "arrived": float(e.arrived),
                    "rejected": float(e.rejected),
                    "refused": float(e.refused),
                    "lost": float(e.lost),
                    "serving_pods": float(len(e.pods)),
                    "load_multiplier": sim.load.multiplier(ep, sim.now),
                }
                for ep, e in sim.endpoints.items()
            }
            now = sim.now
        return encode(twin_families(now, self.clock.speed, self.lag_s, eps), None)


#: (namespace, pod, engine port): whom a pod listener answers for; the engine port is set
#: for a pooled pod's engine (the router's `{port}`), None for a plain vLLM pod
ListenerTarget = tuple[str, str, int | None]


def pod_addresses(pods: Sequence[PodInfo]) -> dict[tuple[str, int], ListenerTarget]:
    """(pod IP, port) → the pod answering there, for every serving pod with an IP: a pooled
    pod at each engine's port, any other at each port its vLLM container declares."""
    out: dict[tuple[str, int], ListenerTarget] = {}
    for p in sorted(pods, key=lambda p: p.key):
        if not p.serving or not p.pod_ip:
            continue
        if p.engines:
            for e in p.engines:
                out[(p.pod_ip, e.port)] = (p.namespace, p.name, e.port)
        else:
            for port in p.ports:
                out[(p.pod_ip, port)] = (p.namespace, p.name, None)
    return out


#: What a pod's own server answers, mapped onto the twin's paths (`pod_listener_path`).
POD_API = ("/v1/completions", "/v1/chat/completions", "/sleep", "/wake_up", "/is_sleeping")


def pod_listener_path(target: ListenerTarget, raw_path: str) -> str | None:
    """The twin path that answers `raw_path` sent to one pod's own address (None: 404).

    `/metrics` is that pod's vLLM metrics, `/health` the server's liveness, `/v1/...` and
    the sleep-mode endpoints its API; the twin's controls (`/load`, `/speed`, `/status`)
    are not a pod's and stay on the twin's own address."""
    namespace, pod, port = target
    path, sep, query = raw_path.partition("?")
    path = path.rstrip("/")
    if path == "/metrics":
        return pod_path(quote(namespace, safe=""), quote(pod, safe=""))
    if path == "/health":
        return "/healthz"
    if path in POD_API:
        engine = f"/port/{port}" if port is not None else ""
        return f"/pods/{quote(namespace, safe='')}/{quote(pod, safe='')}{engine}{path}{sep}{query}"
    return None


class PodListener:
    """An HTTP server on one pod's (IP, port), answering as that pod's vLLM server."""

    def __init__(self, twin: Twin, address: tuple[str, int], target: ListenerTarget) -> None:
        self.address, self.target = address, target
        self.server = ThreadingHTTPServer(address, _handler(twin, target))
        self.server.daemon_threads = True
        self.thread = threading.Thread(
            target=self.server.serve_forever, name=f"twin-pod-{address[0]}:{address[1]}"
        )
        self.thread.daemon = True
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=10)


def _get(twin: Twin, path: str, accept: str | None) -> tuple[int, bytes, str]:
    """Status, body and content type of a GET."""
    if path == "/metrics":
        return (200, *twin.own_metrics())
    if path == "/metrics/pods":
        return (200, *encode(families(twin.samples(), True), accept))
    if path.startswith("/metrics/"):
        parts = [unquote(p) for p in path.split("/")[2:]]
        found = [s for s in twin.samples() if [s.pod.namespace, s.pod.name] == parts]
        if not found:
            return 404, b"no such serving pod\n", "text/plain"
        return (200, *encode(families(found, False), accept))
    if path == "/status":
        return 200, (json.dumps(twin.status(), indent=1) + "\n").encode(), "application/json"
    if path in ("", "/healthz"):
        return 200, b"ok\n", "text/plain"
    return 404, b"not found\n", "text/plain"


def _post(twin: Twin, path: str, body: Any) -> bool:
    """Apply a POST; False for an unknown path. KeyError, ValueError, TypeError: bad body."""
    if path == "/load":
        twin.sim.load.set(float(body["multiplier"]), str(body.get("endpoint", "*")))
    elif path == "/speed":
        with twin.lock:
            twin.sim.advance(twin.clock.now())
            twin.clock.set_speed(float(body["speed"]))
    else:
        return False
    return True


def pod_route(path: str) -> tuple[str, str, int | None, list[str]] | None:
    """(namespace, pod, port, the rest) of `/pods/<namespace>/<pod>[/port/<n>]/<rest>`:
    the port names one engine of a pooled pod (the router's `{port}`)."""
    parts = [unquote(p) for p in path.split("/")[2:]]
    if len(parts) < 3:
        return None
    namespace, pod, rest = parts[0], parts[1], parts[2:]
    port: int | None = None
    if len(rest) >= 2 and rest[0] == "port":
        try:
            port = int(rest[1])
        except ValueError:
            return None
        rest = rest[2:]
    return namespace, pod, port, rest


def wait_simulated(twin: Twin, until: float, timeout_s: float = 600.0) -> bool:
    """Block until the simulation reaches `until` (False: the twin stopped or timed out)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and not twin.stopped.is_set():
        with twin.lock:
            twin.sim.advance(twin.clock.now())
            if twin.sim.now >= until:
                return True
        time.sleep(openai.POLL_S)
    return False


def _serve_sleep(handler: Any, twin: Twin, method: str, path: str, query: str) -> bool:
    """vLLM's sleep-mode API of one engine of a pooled pod (`twin.sleep_mode`); False when
    `path` is not one of its endpoints."""
    route = pod_route(path)
    if route is None or route[3] not in (["sleep"], ["wake_up"], ["is_sleeping"]):
        return False
    namespace, pod, port, rest = route
    what = rest[0]
    handler.rfile.read(int(handler.headers.get("Content-Length") or 0))  # (vLLM takes none)
    if (what == "is_sleeping") != (method == "GET"):
        handler._json(405, {"error": {"message": f"{method} {what}: method not allowed"}})
        return True
    with twin.lock:
        engines = twin.engines.get((namespace, pod))
        model = engines.model_at(port, None) if engines else None
        if engines is not None and model is None and port is None and len(engines.engines) == 1:
            model = next(iter(engines.engines))
    if engines is None or model is None:
        handler._json(404, {"error": {"message": f"no sleep-mode engine at {path}"}})
        return True
    if what == "is_sleeping":
        with twin.lock:
            handler._json(200, {"is_sleeping": engines.is_sleeping(model, twin.sim.now)})
        return True
    if what == "sleep" and "level=2" in query:
        handler._json(400, {"error": {"message": "the twin emulates level 1 only"}})
        return True
    try:
        with twin.lock:
            twin.sim.advance(twin.clock.now())
            now = twin.sim.now
            done = engines.wake(model, now) if what == "wake_up" else engines.sleep(model, now)
    except OutOfMemory as exc:
        handler._json(500, {"error": {"message": str(exc), "type": "InternalServerError"}})
        return True
    log.info("pod %s/%s: %s %s (%.3f s simulated)", namespace, pod, what, model, done - now)
    if not wait_simulated(twin, done):
        handler._json(503, {"error": {"message": "the twin stopped"}})
        return True
    handler._send(200, b"", "application/json")
    return True


def _refused(exc: ContextLengthExceeded | PriorityRefused) -> dict[str, Any]:
    """vLLM's 400 for a request it refuses before the engine sees it."""
    if isinstance(exc, ContextLengthExceeded):
        return openai.context_length_error(str(exc))
    return openai.invalid_request(str(exc), "priority")


def _serve_openai(handler: Any, twin: Twin, path: str) -> None:
    """`/pods/<namespace>/<pod>[/port/<n>]/v1/completions` or `.../v1/chat/completions`."""
    route = pod_route(path)
    if route is None or route[3] not in (
        ["v1", "completions"],
        ["v1", "chat", "completions"],
    ):
        handler._json(404, {"error": {"message": f"no such API: {path}"}})
        return
    namespace, pod, port, rest = route
    chat = rest[1] == "chat"
    length = int(handler.headers.get("Content-Length") or 0)
    try:
        body = json.loads(handler.rfile.read(length) or b"{}")
        prompt, output = openai.request_tokens(body)
        priority = openai.request_priority(body)
    except (ValueError, TypeError) as exc:
        handler._json(400, {"error": {"message": f"bad request: {exc}"}})
        return
    if not _until_awake(handler, twin, namespace, pod, port, body):
        return
    try:
        with twin.lock:
            job = twin.sim.submit(namespace, pod, prompt, output, priority)
        if job is None:  # a pod that became Ready since the last listing: list again once
            twin.refresh()
            with twin.lock:
                job = twin.sim.submit(namespace, pod, prompt, output, priority)
    except (ContextLengthExceeded, PriorityRefused) as exc:
        handler._json(400, _refused(exc))
        return
    with twin.lock:
        serving = twin.sim.pods.get((namespace, pod))
    if job is None or serving is None:
        handler._json(404, {"error": {"message": f"pod {namespace}/{pod} does not serve"}})
        return
    inst = serving.instance

    def step_s() -> float:
        return (inst.iter_time or openai.POLL_S) / twin.clock.speed

    model, rid = str(body.get("model", "")), openai.new_id()
    tokens = openai.tokens_as_simulated(job, twin.lock, step_s, twin.stopped)
    if not body.get("stream"):
        for _ in tokens:
            pass
        handler._json(200, openai.final(model, chat, prompt, output, rid))
        return
    handler.send_response(200)
    handler.send_header("Content-Type", "text/event-stream")
    handler.end_headers()
    try:
        for n in tokens:
            data = json.dumps(openai.chunk(model, chat, n, rid))
            handler.wfile.write(f"data: {data}\n\n".encode())
            handler.wfile.flush()
        handler.wfile.write(b"data: [DONE]\n\n")
    except (BrokenPipeError, ConnectionResetError):
        log.debug("client of %s/%s went away mid-stream", namespace, pod)


def _until_awake(
    handler: Any, twin: Twin, namespace: str, pod: str, port: int | None, body: Any
) -> bool:
    """For a pooled pod: the request's engine must be awake (one waking is waited for); a
    sleeping engine answers 503 as vLLM does. True: go on serving."""
    with twin.lock:
        engines = twin.engines.get((namespace, pod))
        if engines is None:
            return True
        model = engines.model_at(port, str(body.get("model", "")))
        if model is None:
            handler._json(
                404,
                {"error": {"message": f"model {body.get('model')!r} has no engine on {pod}"}},
            )
            return False
        twin.sim.advance(twin.clock.now())
        engines.settle(twin.sim.now)
        state = engines.engines[model]
        waking_until = state.until if state.mode is EngineMode.WAKING else None
        awake = state.mode is EngineMode.AWAKE
    if awake:
        return True
    if waking_until is not None and wait_simulated(twin, waking_until):
        return True
    handler._json(
        503,
        {
            "error": {
                "message": f"model {model} is sleeping: POST /wake_up first",
                "type": "ServiceUnavailableError",
            }
        },
    )
    return False


def _as_pod(handler: Any, pod: ListenerTarget | None) -> bool:
    """For a pod listener (`pod` set), rewrite the request path to the twin's; False when
    it has none (then answered 404 here)."""
    if pod is None:
        return True
    path = pod_listener_path(pod, handler.path)
    if path is None:
        handler._send(404, b"not found\n", "text/plain")
        return False
    handler.path = path
    return True


def _handler(twin: Twin, pod: ListenerTarget | None = None) -> type[BaseHTTPRequestHandler]:
    """The twin's HTTP handler; with `pod`, the one behind that pod's own address, where
    each path is first rewritten to the twin path answering for the pod
    (`pod_listener_path`) and any other is a 404."""

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            log.debug("http: " + format, *args)

        def _send(self, code: int, body: bytes, content_type: str) -> None:
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _json(self, code: int, obj: Any) -> None:
            self._send(code, (json.dumps(obj, indent=1) + "\n").encode(), "application/json")

        def parse_request(self) -> bool:
            return super().parse_request() and _as_pod(self, pod)

        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0].rstrip("/")
            if path.startswith("/pods/") and _serve_sleep(self, twin, "GET", path, ""):
                return
            self._send(*_get(twin, path, self.headers.get("Accept")))

        def do_POST(self) -> None:
            path, _, query = self.path.partition("?")
            path = path.rstrip("/")
            if path.startswith("/pods/") and _serve_sleep(self, twin, "POST", path, query):
                return
            if path.startswith("/pods/"):
                _serve_openai(self, twin, path)
                return
            length = int(self.headers.get("Content-Length") or 0)
            try:
                body = json.loads(self.rfile.read(length) or b"{}")
                if not _post(twin, path, body):
                    self._send(404, b"not found\n", "text/plain")
                    return
            except (KeyError, ValueError, TypeError) as exc:
                self._json(400, {"error": str(exc)})
                return
            self._json(200, twin.status())

    return Handler
