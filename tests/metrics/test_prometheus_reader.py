"""The Prometheus reader's time bound: one request at a time, each within the timeout and
the caller's deadline, nothing retried; a slow answer is `MetricsTooSlow`."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from sageserve.metrics.prometheus import (
    MetricsTooSlow,
    MetricsUnavailable,
    PrometheusReader,
    request_timeout,
)

ANSWER = {
    "status": "success",
    "data": {
        "resultType": "vector",
        "result": [
            {
                "metric": {"namespace": "llm", "model_deployment": "m", "region": "r"},
                "value": [0, "5"],
            }
        ],
    },
}


class Stub:
    """A Prometheus API stand-in answering after `delay_s` with `status`; counts requests."""

    def __init__(self) -> None:
        self.delay_s = 0.0
        self.status = 200
        self.requests = 0
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                stub.requests += 1
                time.sleep(stub.delay_s)
                body = json.dumps(ANSWER).encode()
                try:
                    self.send_response(stub.status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                except OSError:  # the client gave up
                    pass

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture
def stub() -> Iterator[Stub]:
    s = Stub()
    yield s
    s.server.shutdown()
    s.server.server_close()


def test_request_timeout_is_the_timeout_or_what_is_left_of_the_deadline() -> None:
    assert request_timeout(10.0, None, 5.0) == 10.0
    assert request_timeout(10.0, 8.0, 5.0) == 3.0
    assert request_timeout(1.0, 8.0, 5.0) == 1.0
    with pytest.raises(MetricsTooSlow):
        request_timeout(10.0, 5.0, 5.0)


def test_an_answer_in_time_is_read(stub: Stub) -> None:
    assert PrometheusReader(stub.url, timeout_s=2).instant("up") == {("llm", "m", "r"): 5.0}


def test_a_slow_answer_is_given_up_at_the_timeout_and_not_retried(stub: Stub) -> None:
    stub.delay_s = 3.0
    started = time.monotonic()
    with pytest.raises(MetricsTooSlow, match=r"within 0\.5 s"):
        PrometheusReader(stub.url, timeout_s=0.5).instant("up")
    assert time.monotonic() - started < 2.5
    assert stub.requests == 1


def test_reads_share_the_deadline(stub: Stub) -> None:
    stub.delay_s = 0.3
    reader = PrometheusReader(stub.url, timeout_s=10, deadline=time.monotonic() + 0.5)
    reader.instant("up")  # 0.3 s of the 0.5
    with pytest.raises(MetricsTooSlow):
        reader.instant("up")  # cut at what is left (0.2 s)
    with pytest.raises(MetricsTooSlow, match="past the deadline"):
        reader.instant("up")  # not even started
    assert stub.requests == 2


def test_an_error_status_is_unavailable_at_once(stub: Stub) -> None:
    stub.status = 503
    started = time.monotonic()
    with pytest.raises(MetricsUnavailable) as err:
        PrometheusReader(stub.url, timeout_s=2).instant("up")
    assert not isinstance(err.value, MetricsTooSlow)
    assert time.monotonic() - started < 1.5 and stub.requests == 1  # no retry with backoff


def test_nothing_listening_is_unavailable_at_once() -> None:
    started = time.monotonic()
    with pytest.raises(MetricsUnavailable):
        PrometheusReader("http://127.0.0.1:1", timeout_s=2).instant("up")
    assert time.monotonic() - started < 1.5


def test_request_shape_series_reads_each_bucket_on_the_grid_gaps_as_nan(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    reader = PrometheusReader("http://127.0.0.1:1")
    asked: dict[str, object] = {}

    def fake(expr: str, start_time: object, end_time: object, step: str, timeout: float) -> object:
        asked.update(expr=expr, step=step)
        start = start_time.timestamp()  # type: ignore[attr-defined]
        return [
            {
                "metric": {"prompt_le": "128", "output_le": "256"},
                "values": [[start, "0.5"], [start + 120, "1.5"]],
            },
            {"metric": {}, "values": [[start, "9"]]},  # no bucket labels: left out
        ]

    monkeypatch.setattr(reader._prom, "custom_query_range", fake)
    got = reader.request_shape_series("llm", "m", "r1", 180, 60)
    assert list(got) == [("128", "256")]
    values = got[("128", "256")]
    assert values[0] == 0.5 and values[2] == 1.5 and values[1] != values[1]  # NaN
    assert asked["step"] == "60s"
    expr = str(asked["expr"])
    assert "rate(sageserve_router_request_shapes_total{" in expr and "[60s]" in expr
    assert 'model_deployment="m"' in expr and "sum by (prompt_le, output_le)" in expr
