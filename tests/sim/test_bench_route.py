"""`sageserve bench route`: every router gets a row per rate on a JSON-lines trace, with
the predictors scored on the part of the trace they were not fitted on."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sageserve.cli import app
from sageserve.commands.bench_route import isolated_normalized_latency
from sageserve.perf.model import load_catalog


def test_a_request_alone_costs_its_prefill_plus_one_decode_step_per_token() -> None:
    perf = load_catalog().get("llama-2-70b", "NVIDIA-H100-80GB-HBM3", 4)
    got = isolated_normalized_latency(perf, 1000, 101)
    want = (perf.prefill(1000) + sum(perf.decode(1000 + i) for i in range(1, 101))) / 101
    assert got == pytest.approx(want, rel=0.01)


def test_bench_route_prints_each_router_at_each_rate(tmp_path: Path) -> None:
    rng = random.Random(0)
    lines = []
    for i in range(400):
        p = rng.randint(50, 3000)
        lines.append({"timestamp": 1500 * i, "input_length": p, "output_length": max(1, p // 10)})
    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(json.dumps(x) + "\n" for x in lines))
    res = CliRunner().invoke(
        app,
        [
            "bench",
            "route",
            "--trace",
            str(trace),
            "--instances",
            "2",
            "--rates",
            "1,3",
            "--routers",
            "least-request,preserve,preserve@oracle",
            "--fit-minutes",
            "3",
        ],
        env={"COLUMNS": "200"},
    )
    assert res.exit_code == 0, res.output
    assert "input-regression" in res.output and "client-quantile" in res.output
    assert "(280 requests)" in res.output  # held out: the 10 minutes after the first 3
    for rate in ("1 requests/s", "3 requests/s"):
        assert rate in res.output
    assert res.output.count("preserve@oracle") == 2


def test_bench_route_refuses_a_split_that_leaves_nothing_to_fit(tmp_path: Path) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"timestamp": 0, "input_length": 5, "output_length": 5}\n')
    res = CliRunner().invoke(app, ["bench", "route", "--trace", str(trace)])
    assert res.exit_code == 2
    assert "need at least 8 to fit" in res.output


def test_kv_tokens_replaces_the_profiles_kv_capacity(tmp_path: Path) -> None:
    """The instances run with the KV capacity asked for (the header says it); a capacity
    below one token is refused."""
    rng = random.Random(1)
    lines = []
    for i in range(400):
        p = rng.randint(500, 3000)
        lines.append({"timestamp": 300 * i, "input_length": p, "output_length": 400})
    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(json.dumps(x) + "\n" for x in lines))
    args = ["bench", "route", "--trace", str(trace), "--instances", "2", "--rates", "4"]
    args += ["--routers", "least-request", "--fit-minutes", "0.5"]
    small = CliRunner().invoke(app, [*args, "--kv-tokens", "8000"], env={"COLUMNS": "200"})
    assert small.exit_code == 0, small.output
    assert "(KV 8,000 tokens)" in small.output
    bad = CliRunner().invoke(app, [*args, "--kv-tokens", "0"])
    assert bad.exit_code == 2 and "--kv-tokens must be ≥ 1" in bad.output
