"""The endpoint picker's series as sageserve reads them: the table's names are the pickers'
own, and the queries built from it give each pool's waiting, saturation and running as
Prometheus evaluates them (promtool) on series written as the pickers write them."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from sageserve.core.snapshot import PickerSignals
from sageserve.metrics import picker
from sageserve.metrics.picker import PICKERS, PickerKind

PROMTOOL = shutil.which("promtool")
POOL = "llama-us-east"


def test_the_table_names_each_pickers_own_series() -> None:
    """Names and labels as GAIE's `pkg/epp/metrics/metrics.go` (v1.3.0, v1.5.0) and the
    llm-d router's `pkg/epp/metrics/llm_d_router_metrics.go` register them."""
    gaie, llmd = PICKERS[PickerKind.GAIE], PICKERS[PickerKind.LLM_D]
    assert (gaie.average_queue, gaie.ready_pods) == (
        "inference_pool_average_queue_size",
        "inference_pool_ready_pods",
    )
    assert gaie.gateway_queue == "inference_extension_flow_control_queue_size"
    assert gaie.saturation == "inference_extension_flow_control_pool_saturation"
    assert gaie.average_running == "inference_pool_average_running_requests"
    assert (llmd.average_queue, llmd.ready_pods) == (
        "llm_d_epp_average_queue_size",
        "llm_d_epp_ready_endpoints",
    )
    assert llmd.gateway_queue == "llm_d_epp_flow_control_queue_size"
    assert llmd.saturation == "llm_d_epp_flow_control_pool_saturation"
    assert llmd.average_running == "llm_d_epp_average_running_requests"
    assert PickerKind.NONE not in PICKERS


def _series(name: str, labels: dict[str, str], value: float) -> dict[str, str]:
    inner = ", ".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    return {"series": f"{name}{{{inner}}}", "values": f"{value}x5"}


def _epp_series(table: picker.PickerMetrics) -> list[dict[str, str]]:
    """Two picker replicas in front of one pool of 3 ready pods: each reports the pool's
    mean engine queue 4 and mean running 7; each holds its own flow-control queue (10 and
    5 requests over two fairness flows); saturation per stage (decode the largest). A pool
    of another namespace must not leak in."""
    out: list[dict[str, str]] = []
    for replica in ("epp-0", "epp-1"):
        target = {"namespace": "llm", "pod": replica, "job": "epp"}
        pool = {**target, "name": POOL}
        out += [
            _series(table.average_queue, pool, 4),
            _series(table.ready_pods, pool, 3),
        ]
        if table.average_running:
            out.append(_series(table.average_running, pool, 7))
    for replica, flows in (("epp-0", (6, 4)), ("epp-1", (5, 0))):
        for i, held in enumerate(flows):
            labels = {
                "namespace": "llm",
                "pod": replica,
                "inference_pool": POOL,
                "fairness_id": f"f{i}",
                "priority": "0",
                "model_name": "llama",
                "target_model_name": "llama",
            }
            out.append(_series(table.gateway_queue, labels, held))
    assert table.saturation
    saturated = {"namespace": "llm", "inference_pool": POOL}
    if table.kind is PickerKind.LLM_D:  # per stage; `effective` is their largest
        for stage, value in (("prefill", 0.9), ("decode", 1.3), ("effective", 1.3)):
            out.append(_series(table.saturation, {**saturated, "stage": stage}, value))
    else:  # one gauge per replica
        out.append(_series(table.saturation, {**saturated, "pod": "epp-0"}, 1.3))
        out.append(_series(table.saturation, {**saturated, "pod": "epp-1"}, 1.2))
    other = {"namespace": "other", "pod": "x", "name": POOL}
    out += [_series(table.average_queue, other, 100), _series(table.ready_pods, other, 9)]
    return out


def _expect(expr: str | None, value: float) -> dict[str, Any]:
    assert expr is not None
    return {
        "expr": expr,
        "eval_time": "2m",
        "exp_samples": [
            {"labels": f'{{inference_pool="{POOL}", namespace="llm"}}', "value": value}
        ],
    }


@pytest.mark.integration
@pytest.mark.parametrize("kind", [PickerKind.GAIE, PickerKind.LLM_D])
def test_each_pools_signals_as_prometheus_evaluates_the_queries(
    kind: PickerKind, tmp_path: Path
) -> None:
    assert PROMTOOL, "promtool missing: scripts/setup installs the Debian prometheus package"
    table = PICKERS[kind]
    test = {
        "rule_files": [],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": _epp_series(table),
                "promql_expr_test": [
                    # mean 4 × 3 ready pods; the replicas' figures are one (the largest)
                    _expect(picker.engine_queue(table, "llm"), 12),
                    # each replica's own queue: 6 + 4 + 5 + 0
                    _expect(picker.gateway_queue(table, "llm"), 15),
                    _expect(picker.saturation(table, "llm"), 1.3),
                    _expect(picker.running(table, "llm"), 21),
                ],
            }
        ],
    }
    path = tmp_path / "picker_test.yaml"
    path.write_text(yaml.safe_dump(test))
    result = subprocess.run(
        [PROMTOOL, "test", "rules", str(path)], capture_output=True, check=False
    )
    assert result.returncode == 0, result.stdout.decode() + result.stderr.decode()
    signals = picker.combine({POOL: 12.0}, {POOL: 15.0}, {POOL: 1.3}, {POOL: 21.0})
    assert signals == {POOL: PickerSignals(27, 1.3, 21)}


def test_a_picker_without_flow_control_reports_the_engines_queue_alone() -> None:
    assert picker.combine({POOL: 12.0}, {}, {}, {}) == {POOL: PickerSignals(12, None, None)}


def test_a_pool_the_picker_is_silent_on_is_absent_not_idle() -> None:
    """Held requests of a pool with no engine-queue gauge do not make it a reading: the pace
    loop names the pool (`PickerSignals` condition) instead of pacing it on a zero."""
    assert picker.combine({}, {POOL: 5.0}, {POOL: 1.0}, {}) == {}


def test_the_reader_asks_the_four_queries_and_keys_each_pool_by_name() -> None:
    """`PrometheusReader.picker_signals` against a Prometheus API stand-in answering each of
    the table's queries (the values promtool computed above)."""
    import json
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    from urllib.parse import parse_qs, urlparse

    from sageserve.metrics.prometheus import PrometheusReader

    table = PICKERS[PickerKind.LLM_D]
    answers = {
        picker.engine_queue(table, "llm"): 12,
        picker.gateway_queue(table, "llm"): 15,
        picker.saturation(table, "llm"): 1.3,
        picker.running(table, "llm"): 21,
    }
    asked: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            query = parse_qs(urlparse(self.path).query)["query"][0]
            asked.append(query)
            value = answers.get(query)
            metric = {"namespace": "llm", "inference_pool": POOL}
            result = [] if value is None else [{"metric": metric, "value": [0, str(value)]}]
            body = json.dumps(
                {"status": "success", "data": {"resultType": "vector", "result": result}}
            ).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        reader = PrometheusReader(f"http://127.0.0.1:{server.server_address[1]}")
        got = reader.picker_signals("llm", PickerKind.LLM_D)
        assert reader.picker_signals("llm", PickerKind.NONE) == {}
    finally:
        server.shutdown()
        server.server_close()
    assert got == {POOL: PickerSignals(27, 1.3, 21)}
    assert sorted(asked) == sorted(answers)  # four queries, nothing asked for `none`
