"""PromQL the operator sends and metrics it serves, checked with Prometheus's own promtool."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from sageserve.metrics import engines, picker, queries
from sageserve.metrics.exporter import OperatorMetrics
from sageserve.metrics.prometheus import kv_capacities

PROMTOOL = shutil.which("promtool")


def _promtool(*args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    assert PROMTOOL, "promtool missing: scripts/setup installs the Debian prometheus package"
    return subprocess.run([PROMTOOL, *args], input=stdin, capture_output=True, check=False)


@pytest.mark.integration
def test_every_query_is_valid_promql(tmp_path: Path) -> None:
    exprs = {
        "kv": queries.kv_usage_per_pod("llm"),
        "kv_blocks": queries.kv_blocks_per_pod("llm"),
        "waiting_pod": queries.waiting_per_pod("llm"),
        "held": queries.held_requests("llm"),
        "tps": queries.tokens_per_second("5m"),
        "waiting": queries.waiting_requests("llm"),
        "ttft_p95": queries.ttft_quantile(0.95),
        "deadline_need": queries.batch_deadline_need("llm"),
        "router_ttft_p95": queries.router_ttft_p95("llm"),
        "router_ttft_count": queries.router_ttft_count("llm"),
        "variant_tps": queries.variant_tokens_per_second("60s", "llm"),
        "variant_instances": queries.variant_instances("60s", "llm"),
        "variant_emu": queries.variant_emu("60s", "llm"),
        "kv_block_gauges": queries.kv_block_gauges_per_pod("llm"),
        **{
            f"{kind.name.lower()}_{name}": expr
            for kind, table in picker.PICKERS.items()
            for name, expr in (
                ("engine_queue", picker.engine_queue(table, "llm")),
                ("gateway_queue", picker.gateway_queue(table, "llm")),
                ("saturation", picker.saturation(table, "llm")),
                ("running", picker.running(table, "llm")),
            )
            if expr is not None
        },
    }
    rules = {
        "groups": [
            {"name": "g", "rules": [{"record": f"x:{k}", "expr": v} for k, v in exprs.items()]}
        ]
    }
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump(rules))
    result = _promtool("check", "rules", str(path))
    assert result.returncode == 0, result.stdout.decode() + result.stderr.decode()


@pytest.mark.parametrize(
    ("name", "matches"),
    [
        ("vllm:kv_cache_usage_perc", True),
        ("vllm_kv_cache_usage_perc", True),  # colon escaped by prometheus-client's OpenMetrics
        ("sglang:token_usage", True),
        ("sglang_token_usage", True),
        ("trtllm_kv_cache_utilization", True),
        ("vllm:gpu_cache_usage_perc", False),  # removed from vLLM: not read
        ("vllm:cpu_cache_usage_perc", False),
        ("vllmXkv_cache_usage_perc", False),
        ("trtllm:kv_cache_utilization", False),
    ],
)
def test_kv_usage_matches_every_engines_name_and_no_removed_one(name: str, matches: bool) -> None:
    pattern = engines.name_pattern(*engines.names(engines.Signal.KV_USAGE))
    assert bool(re.fullmatch(pattern, name)) is matches
    assert pattern in queries.kv_usage_per_pod()


def test_queries_group_by_model_deployment_and_region() -> None:
    for q in (queries.held_requests(), queries.tokens_per_second(), queries.waiting_requests()):
        assert f"by ({queries.GROUP_BY})" in q
    assert 'namespace="llm"' in queries.tokens_per_second(namespace="llm")


@pytest.mark.integration
def test_operator_metrics_pass_promtool_lint() -> None:
    m = OperatorMetrics()
    m.target_instances.labels("llm", "llama-2-70b", "us-east", "h100").set(12)
    m.solver_seconds.labels("highs", "optimal").observe(0.4)
    m.scaling_events.labels("llm", "llama-2-70b", "us-east", "out", "lt-ua").inc()
    m.donated_nodes.labels("us-east", "NVIDIA-H100-80GB-HBM3").set(3)
    m.batch_deadline_at_risk.labels("llm", "llama-2-70b").set(1)
    m.batch_deadline_shortfall.labels("llm", "llama-2-70b").set(2000.0)
    text = m.exposition()
    result = _promtool("check", "metrics", stdin=text)
    assert result.returncode == 0, result.stdout.decode() + result.stderr.decode()
    assert b'sageserve_target_instances{model="llama-2-70b",namespace="llm"' in text
    assert b"sageserve_scaling_events_total" in text
    # labelled as the routers' deadline need gauge, so the two join without relabelling
    assert b'sageserve_batch_deadline_at_risk{model_deployment="llama-2-70b"' in text


@pytest.mark.integration
def test_batch_received_counts_queued_work_once_where_it_was_accepted(tmp_path: Path) -> None:
    """β's batch load received (SageServe §6.3), evaluated by promtool on counters as the
    routers write them. Model m: the Batch API accepts 10 tok/s in us-east (the accepting
    router's home); the queue releases it where troughs are, so the router serves 5 tok/s
    of it in us-east and 4 tok/s in us-west under the batch tier. Received is 10 tok/s in
    us-east and 0 in us-west: not 10 + 4 (the work that ran in us-west was received once,
    in us-east). Model s has no queue, batch sent synchronously: what was served (2 tok/s)
    is what was received."""

    def series(name: str, model: str, region: str, per_minute: int) -> dict[str, str]:
        labels = f'namespace="llm", model_deployment="{model}", region="{region}", tier="niw"'
        return {"series": f"{name}_total{{{labels}}}", "values": f"0+{per_minute}x20"}

    def expected(model: str, region: str, value: float) -> dict[str, Any]:
        labels = f'{{model_deployment="{model}", namespace="llm", region="{region}"}}'
        return {"labels": labels, "value": value}

    accepted, served = queries.BATCH_ACCEPTED_TOKENS, queries.ROUTER_TOKENS
    test = {
        "rule_files": [],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [
                    series(accepted, "m", "us-east", 600),
                    series(served, "m", "us-east", 300),
                    series(served, "m", "us-west", 240),
                    series(served, "s", "us-east", 120),
                    # another namespace and an interactive tier are not batch received here
                    {
                        "series": f'{served}_total{{namespace="llm", model_deployment="s", '
                        'region="us-east", tier="iw-f"}',
                        "values": "0+6000x20",
                    },
                ],
                "promql_expr_test": [
                    {
                        "expr": queries.batch_received("5m", "llm", ["niw"]),
                        "eval_time": "15m",
                        "exp_samples": [
                            expected("m", "us-east", 10.0),
                            expected("m", "us-west", 0.0),
                            expected("s", "us-east", 2.0),
                        ],
                    }
                ],
            }
        ],
    }
    path = tmp_path / "received_test.yaml"
    path.write_text(yaml.safe_dump(test))
    result = _promtool("test", "rules", str(path))
    assert result.returncode == 0, result.stdout.decode() + result.stderr.decode()


def test_each_engines_kv_cache_size_is_read_in_tokens() -> None:
    """vLLM and SGLang put the size on an info gauge's labels, trtllm-serve in two gauges
    (`metrics.engines`); a pod with neither, or half of the gauges, has no known size."""
    info = [
        (
            {
                "__name__": "vllm:cache_config_info",
                "pod": "v",
                "num_gpu_blocks": "4000",
                "block_size": "16",
            },
            1.0,
        ),
        (
            {
                "__name__": "sglang:cache_config_info",
                "pod": "s",
                "num_pages": "9000",
                "page_size": "1",
            },
            1.0,
        ),
        ({"__name__": "vllm:cache_config_info", "pod": "bad", "num_gpu_blocks": "x"}, 1.0),
    ]
    gauges = [
        ({"__name__": "trtllm_kv_cache_max_blocks", "pod": "t"}, 2000.0),
        ({"__name__": "trtllm_kv_cache_tokens_per_block", "pod": "t"}, 32.0),
        ({"__name__": "trtllm_kv_cache_max_blocks", "pod": "half"}, 100.0),
    ]
    assert kv_capacities(info, gauges) == {"v": 64000.0, "s": 9000.0, "t": 64000.0}


def test_an_engine_without_a_series_says_so_rather_than_reading_zero() -> None:
    trt = engines.engine("trtllm")
    with pytest.raises(engines.MetricUnsupported, match="trtllm exports no KV-cache size"):
        trt.name(engines.Signal.CACHE_CONFIG)
    # and the selector built from the table leaves the engine out instead of matching nothing
    assert "trtllm" not in queries.kv_blocks_per_pod("llm")
    assert "trtllm_kv_cache_max_blocks" in queries.kv_block_gauges_per_pod("llm")


@pytest.mark.integration
def test_token_rates_count_every_engine_in_one_query(tmp_path: Path) -> None:
    """A namespace mixing engines: each pod's prompt tokens under its engine's name (vLLM's
    escaped by OpenMetrics), one rate per (model, region)."""

    def counter(name: str, model: str, pod: str, per_minute: int) -> dict[str, str]:
        labels = f'namespace="llm", model_deployment="{model}", region="r", pod="{pod}"'
        return {"series": f"{name}{{{labels}}}", "values": f"0+{per_minute}x20"}

    test = {
        "rule_files": [],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": [
                    counter("vllm_prompt_tokens_total", "a", "a-0", 600),
                    counter("sglang:prompt_tokens_total", "b", "b-0", 1200),
                    counter("trtllm_prompt_tokens_total", "c", "c-0", 60),
                    counter("trtllm_prompt_tokens_total", "c", "c-1", 60),
                ],
                "promql_expr_test": [
                    {
                        "expr": queries.prompt_tokens_per_second("5m", "llm"),
                        "eval_time": "15m",
                        "exp_samples": [
                            {
                                "labels": f'{{model_deployment="{m}", namespace="llm", '
                                'region="r"}',
                                "value": v,
                            }
                            for m, v in (("a", 10.0), ("b", 20.0), ("c", 2.0))
                        ],
                    }
                ],
            }
        ],
    }
    path = tmp_path / "engines_test.yaml"
    path.write_text(yaml.safe_dump(test))
    result = _promtool("test", "rules", str(path))
    assert result.returncode == 0, result.stdout.decode() + result.stderr.decode()
