"""Metrics faults on the real API server and Prometheus: a third of
a model's pods no longer scraped, a Prometheus slower than the pace interval, a Prometheus
restart.

What the platform team sees: a partial reading is never taken for a load drop (no
scale-in, `Degraded=True/MetricsPartial` naming the endpoint and how many pods report) and
pacing resumes once every pod reports; a slow or absent Prometheus holds every size
(`Degraded` says which), each query is given up within the pace interval, no query is
started while one is outstanding, and pacing resumes once Prometheus answers again.
"""

from __future__ import annotations

import json
import select
import socket
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from e2e_helpers import eventually
from fault_kit import events, figure, steady, wait_condition
from kopf.testing import KopfRunner
from operator_kit import (
    MODEL,
    FakeVllm,
    apply,
    model_deployment,
    operator_args,
    operator_env,
    pod_names,
    replicas,
    scaling_policy,
)

from e2e import prometheus as prometheus_proc
from e2e import state
from sageserve.metrics.prometheus import PodLoad, PrometheusReader

pytestmark = pytest.mark.slow
REGION = "us-central"
#: SAGESERVE_REPORT_AFTER_SECONDS in these tests (60 s by default): partial data lasting this
#: long is reported (shorter: a new pod not scraped yet)
BOUND = 10
PACE_S = 2  # scaling_policy's paceSeconds


def scraped(prometheus_url: str, port: int) -> bool:
    """Whether Prometheus has scraped the target on `port` (its `up` is 1)."""
    query = urllib.parse.urlencode({"query": f'up{{instance="127.0.0.1:{port}"}}'})
    with urllib.request.urlopen(f"{prometheus_url}/api/v1/query?{query}", timeout=10) as resp:
        result = json.loads(resp.read())["data"]["result"]
    return any(r["value"][1] == "1" for r in result)


def loads(prometheus_url: str, namespace: str) -> dict[str, PodLoad]:
    """Every pod's KV usage as the operator's own query reads it now."""
    return PrometheusReader(prometheus_url, timeout_s=10).pod_loads(namespace)


@pytest.mark.usefixtures("restore_node_pools")
def test_a_third_of_the_pods_unscraped_holds_scale_in_and_says_how_many_report(
    kubeconfig: Path,
    namespace: str,
    prometheus_url: str,
    prometheus_targets_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    operator_env(monkeypatch, kubeconfig, namespace, prometheus_url, 0)
    monkeypatch.setenv("SAGESERVE_REPORT_AFTER_SECONDS", str(BOUND))
    fake = FakeVllm()
    fake.set(0.9)
    target = fake.scrape(prometheus_targets_dir, namespace, REGION, kubeconfig)

    def size() -> int | None:
        return replicas(kubeconfig, namespace, REGION)

    try:
        with KopfRunner(operator_args(namespace), timeout=600) as runner:
            apply(kubeconfig, namespace, scaling_policy("reactive"))
            apply(kubeconfig, namespace, model_deployment([REGION], gpus=2, lo=1, hi=3))
            eventually(lambda: size() == 3, 120, "scale-out to 3 at 90 % KV")
            pods = eventually(
                lambda: (
                    (names := pod_names(kubeconfig, namespace, REGION))
                    and len(names) == 3
                    and names
                ),
                60,
                "3 pods",
            )
            busy = pods[0]
            # steady load, unevenly spread: one pod at 90 %, two at 15 % (EMU 40 %: no action)
            fake.set_pod(busy, 0.9)
            own_port = fake.own[busy][1]
            eventually(lambda: scraped(prometheus_url, own_port), 60, "the busy pod's target")
            fake.kv.labels(MODEL).set(0.15)

            def spread() -> bool:
                now = loads(prometheus_url, namespace)
                return len(now) == 3 and sorted(x.kv_usage for x in now.values()) == [
                    0.15,
                    0.15,
                    0.9,
                ]

            eventually(spread, 60, "KV 90/15/15 % in Prometheus", interval=1)
            wait_condition(kubeconfig, namespace, "Degraded", "False", 60)
            steady(size, 3 * PACE_S, "the pod set at a steady 40 % EMU")

            # the busy pod's target vanishes: the two that report say 15 %
            silenced = time.monotonic()
            fake.silent.add(busy)
            eventually(
                lambda: busy not in loads(prometheus_url, namespace), 60, "the pod unscraped"
            )
            gone = time.monotonic()
            degraded = wait_condition(
                kubeconfig, namespace, "Degraded", "True", 60 + BOUND, "MetricsPartial"
            )
            detected = time.monotonic()
            assert f"{MODEL}/{REGION}" in degraded["message"], degraded
            assert "2 of 3 pods reporting" in degraded["message"], degraded
            steady(size, 5 * PACE_S, "the pod set with a third of its pods unscraped")
            assert events(kubeconfig, namespace, "ScaledIn") == []
            warned = events(kubeconfig, namespace, "MetricsPartial")
            assert any(
                e["type"] == "Warning" and "2 of 3 pods reporting" in e["message"] for e in warned
            ), warned

            # the load really dropped meanwhile; every pod reports again: scale-in follows
            fake.set_pod(busy, 0.15)
            fake.silent.discard(busy)
            eventually(lambda: len(loads(prometheus_url, namespace)) == 3, 60, "every pod scraped")
            back = time.monotonic()
            eventually(lambda: (size() or 3) < 3, 60, "scale-in once every pod reports")
            resumed = time.monotonic() - back
            wait_condition(kubeconfig, namespace, "Degraded", "False", 30, "MetricsAvailable")
            # within one pace interval of the data, with generous slack for a busy machine
            assert resumed < 5 * PACE_S, resumed
            figure(
                "partial metrics",
                f"1 of 3 pods unscraped: gone from Prometheus {gone - silenced:.1f} s after its "
                f"target vanished; MetricsPartial {detected - gone:.1f} s after "
                f"(bound {BOUND} s); 0 scale-ins while 2 of 3 reported 15 %; scale-in "
                f"{resumed:.1f} s after every pod was back in Prometheus",
            )
        assert runner.exception is None, runner.output
    finally:
        target.unlink(missing_ok=True)
        fake.close()


def client_gone(conn: socket.socket, seconds: float) -> bool:
    """Wait `seconds`; True as soon as the client closes its end (it gave up)."""
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        readable, _, _ = select.select([conn], [], [], min(0.05, left))
        if readable:
            try:
                if not conn.recv(1, socket.MSG_PEEK):
                    return True
            except OSError:
                return True
    return False


class SlowProxy:
    """A real HTTP proxy in front of Prometheus that answers after `delay_s`, counting the
    queries in flight (from arrival until answered or given up by the client)."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.delay_s = 0.0
        self.lock = threading.Lock()
        self.in_flight = 0
        self.max_in_flight = 0
        self.requests = 0
        #: (seconds each query was outstanding, whether the client gave up, the delay)
        self.held: list[tuple[float, bool, float]] = []
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                started, delay = time.monotonic(), proxy.delay_s
                with proxy.lock:
                    proxy.requests += 1
                    proxy.in_flight += 1
                    proxy.max_in_flight = max(proxy.max_in_flight, proxy.in_flight)
                abandoned = False
                try:
                    if client_gone(self.connection, delay):
                        abandoned = True
                        return
                    try:
                        url = proxy.upstream + self.path
                        with urllib.request.urlopen(url, timeout=30) as resp:
                            status, body = resp.status, resp.read()
                    except urllib.error.HTTPError as err:
                        status, body = err.code, err.read()
                    except OSError as err:
                        status, body = 502, str(err).encode()
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                except OSError:
                    abandoned = True
                finally:
                    with proxy.lock:
                        proxy.in_flight -= 1
                        proxy.held.append((time.monotonic() - started, abandoned, delay))

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def reset(self) -> None:
        with self.lock:
            self.max_in_flight, self.requests, self.held = self.in_flight, 0, []

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.usefixtures("restore_node_pools")
def test_a_slow_or_restarted_prometheus_holds_sizes_without_piling_up_queries(
    kubeconfig: Path,
    namespace: str,
    prometheus_url: str,
    prometheus_targets_dir: Path,
    e2e_cluster: state.ClusterState,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    proxy = SlowProxy(prometheus_url)
    operator_env(monkeypatch, kubeconfig, namespace, proxy.url, 0)
    fake = FakeVllm()
    fake.set(0.5)
    target = fake.scrape(prometheus_targets_dir, namespace, REGION, kubeconfig)

    def size() -> int | None:
        return replicas(kubeconfig, namespace, REGION)

    try:
        # 1. queries slower than the pace interval (the proxy answers after 10 s)
        with KopfRunner(operator_args(namespace), timeout=600) as runner:
            apply(kubeconfig, namespace, scaling_policy("reactive"))
            apply(kubeconfig, namespace, model_deployment([REGION], gpus=2, lo=1, hi=3))
            eventually(lambda: size() == 1, 60, "the pod set at 1")
            wait_condition(kubeconfig, namespace, "Degraded", "False", 60)
            proxy.delay_s = 10.0
            slow_from = time.monotonic()
            proxy.reset()
            fake.set(0.9)  # would scale out, were it read
            degraded = wait_condition(
                kubeconfig, namespace, "Degraded", "True", 60, "PrometheusSlow"
            )
            detected = time.monotonic() - slow_from
            assert f"pace interval ({PACE_S} s)" in degraded["message"], degraded
            steady(size, 6 * PACE_S, "the pod set while Prometheus is slow")
            with proxy.lock:
                held = [(t, gave_up) for t, gave_up, delay in proxy.held if delay]
                asked, most = proxy.requests, proxy.max_in_flight
            assert most == 1, f"{most} queries in flight at once"
            assert held and all(gave_up for _, gave_up in held), held
            longest = max(t for t, _ in held)
            assert longest < PACE_S + 4, f"a query outstanding {longest:.1f} s"
            assert asked >= 3, f"{asked} queries in {time.monotonic() - slow_from:.0f} s"
            slow_for = time.monotonic() - slow_from
            proxy.delay_s = 0.0
            fast_from = time.monotonic()
            eventually(lambda: size() == 2, 60, "scale-out once Prometheus is fast again")
            recovered = time.monotonic() - fast_from
            wait_condition(kubeconfig, namespace, "Degraded", "False", 30)
            assert recovered < 5 * PACE_S, recovered
            figure(
                "slow Prometheus",
                f"answers delayed 10 s (pace interval {PACE_S} s): PrometheusSlow after "
                f"{detected:.1f} s; {asked} queries in {slow_for:.0f} s, at most {most} in "
                f"flight, each given up after at most {longest:.1f} s; 0 actions; scale-out "
                f"{recovered:.1f} s after it was fast again",
            )
        assert runner.exception is None, runner.output

        # 2. Prometheus restarted (stopped 10 s, its port refusing connections)
        monkeypatch.setenv("SAGESERVE_PROMETHEUS_URL", prometheus_url)
        with KopfRunner(operator_args(namespace), timeout=600) as runner:
            eventually(lambda: size() == 3, 60, "the pod set at its maximum")
            wait_condition(kubeconfig, namespace, "Degraded", "False", 60)
            root = Path(e2e_cluster.prometheus_dir)
            outcome: dict[str, float] = {}

            def restart() -> None:
                outcome["unavailable"] = prometheus_proc.restart(root, down_s=10)

            restarting = threading.Thread(target=restart, name="prometheus-restart")
            restarting.start()
            away = wait_condition(
                kubeconfig, namespace, "Degraded", "True", 60, "PrometheusUnreachable"
            )
            fake.set(0.1)  # would scale in, were it read
            sizes = set()
            while restarting.is_alive():
                sizes.add(size())
                time.sleep(0.5)
            restarting.join()
            assert "unavailable" in outcome, "Prometheus did not come back"
            assert sizes == {3}, f"sizes while Prometheus was away: {sizes}"
            ready = time.monotonic()
            eventually(lambda: (size() or 3) < 3, 90, "scale-in once Prometheus is back")
            resumed = time.monotonic() - ready
            wait_condition(kubeconfig, namespace, "Degraded", "False", 60)
            assert prometheus_url.rsplit(":", 1)[1] in away["message"], away
            # the first scrape after the restart takes up to a scrape interval (5 s) + slack
            assert resumed < 30, resumed
            figure(
                "Prometheus restart",
                f"unavailable {outcome['unavailable']:.1f} s (10 s down + its start): "
                f"PrometheusUnreachable, size held at 3 with 10 % KV; scale-in "
                f"{resumed:.1f} s after it was ready (its first scrape)",
            )
        assert runner.exception is None, runner.output
    finally:
        proxy.close()
        target.unlink(missing_ok=True)
        fake.close()
