"""`sageserve bench tiers`: FCFS, EDF, PF and DPA on one fixed fleet, IW-F and IW-N per
policy over seeds (SageServe v3 Fig. 15), every policy of a seed on the same requests."""

from __future__ import annotations

import json
import random
from pathlib import Path

from typer.testing import CliRunner

from sageserve.cli import app
from sageserve.commands.bench_tiers import normal_tier, workload


def _trace(tmp_path: Path) -> Path:
    """A burst every minute: 60 requests within a second, then nothing."""
    rng = random.Random(0)
    lines = []
    for minute in range(20):
        for _ in range(60):
            t = minute * 60_000 + rng.randint(0, 1000)
            p = rng.randint(500, 1500)
            lines.append({"timestamp": t, "input_length": p, "output_length": 50})
    lines.sort(key=lambda x: x["timestamp"])
    path = tmp_path / "bursts.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return path


def test_one_seed_gives_every_policy_the_same_requests(tmp_path: Path) -> None:
    from sageserve.sim import traces

    rows = traces.request_trace(_trace(tmp_path))
    normal = normal_tier(60.0)
    a = workload(rows, 5, None, 0.5, normal, "m", seed=7)
    b = workload(rows, 5, None, 0.5, normal, "m", seed=7)
    assert [(q.arrival, q.tier.name, q.prompt_tokens) for q in a] == [
        (q.arrival, q.tier.name, q.prompt_tokens) for q in b
    ]
    other = workload(rows, 5, None, 0.5, normal, "m", seed=8)
    assert [q.tier.name for q in other] != [q.tier.name for q in a]


def test_bench_tiers_pf_serves_iw_f_first(tmp_path: Path) -> None:
    out = tmp_path / "tiers.json"
    res = CliRunner().invoke(
        app,
        [
            "bench",
            "tiers",
            "--trace",
            str(_trace(tmp_path)),
            "--instances",
            "1",
            "--minutes",
            "3",
            "--seeds",
            "1",
            "--policies",
            "fcfs,pf",
            "--json",
            str(out),
        ],
        env={"COLUMNS": "220"},
    )
    assert res.exit_code == 0, res.output
    doc = json.loads(out.read_text())["results"]
    fcfs, pf = doc["fcfs"], doc["pf"]
    # the bursts queue: under PF the fast tier's Q3 TTFT drops and the normal tier's grows
    assert pf["IW-F"][0]["ttft_q3_s"] < fcfs["IW-F"][0]["ttft_q3_s"]
    assert pf["IW-N"][0]["ttft_q3_s"] > fcfs["IW-N"][0]["ttft_q3_s"]
    assert pf["IW-F"][0]["requests"] == fcfs["IW-F"][0]["requests"]


def test_an_unknown_policy_is_refused_naming_the_known_ones(tmp_path: Path) -> None:
    res = CliRunner().invoke(
        app, ["bench", "tiers", "--trace", str(_trace(tmp_path)), "--policies", "fcfs,lifo"]
    )
    assert res.exit_code == 2
    assert "unknown policy 'lifo'" in res.output and "dpa" in res.output
