"""The operator bench at CI size: 20 ModelDeployments × 3 regions on 200 KWOK nodes.

`python -m e2e.bench_operator` starts its own private cluster (its own state dir, never the
session's, whose 12-node inventory other tests count on), runs the bench
(`e2e/operator_bench.py`) with the real operator process on it, and writes its figures as
JSON. Asserted is behaviour only —
every pod set appeared, every endpoint reached the plan's target, every spec edit reached
its pod sets, the operator stayed up — never wall-clock figures, which depend on the machine.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from e2e.operator_bench import (
    BenchConfig,
    BenchError,
    ClusterTarget,
    inventory_nodes,
    serving_pods,
)

REPO = Path(__file__).resolve().parents[2]


def test_bench_operator_small_fleet_reaches_every_target(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    env = dict(os.environ)
    env["SAGESERVE_E2E_STATE"] = str(tmp_path / "cluster")
    env.pop("KUBECONFIG", None)
    sizes = ["--models", "20", "--nodes", "200", "--changes", "10"]
    proc = subprocess.run(
        [sys.executable, "-m", "e2e.bench_operator", *sizes, "--output", str(out)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    result = json.loads(out.read_text())
    assert result["pod_sets"] == 20 * 3 * 2
    assert result["first_reconcile_s"] > 0
    assert result["pods_ready_s"] is not None, "some pods never became Ready"
    assert result["plan_status"] in ("optimal", "feasible", "shortfall"), result["plan_status"]
    assert result["plan_round_s"] is not None
    assert result["endpoints_at_target"] == result["endpoints"] == 60
    assert result["changes_seen"] == result["changes"] == 10
    assert result["rss_peak_mb"] > 0
    assert "plan + reconcile round" in proc.stdout
    assert not (tmp_path / "cluster" / "state.json").exists(), "the private cluster was left up"


def test_inventory_spreads_nodes_over_regions_gpu_types_and_pools() -> None:
    nodes = inventory_nodes(48)
    labels = [n["metadata"]["labels"] for n in nodes]
    pairs = {(x["topology.kubernetes.io/region"], x["nvidia.com/gpu.product"]) for x in labels}
    assert len(pairs) == 6
    pools = [x["sageserve.io/pool"] for x in labels]
    assert pools.count("spot") == 48 // 4
    assert len({n["metadata"]["name"] for n in nodes}) == 48


def test_the_bench_defaults_to_two_hundred_models() -> None:
    assert BenchConfig().models == 200


def test_the_bench_on_a_running_cluster_needs_one_and_says_how_to_get_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in ("KUBECONFIG", "SAGESERVE_PROMETHEUS_URL", "SAGESERVE_PROMETHEUS_TARGETS_DIR"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(BenchError, match=r"python -m e2e\.bench_operator"):
        ClusterTarget.from_env()
    monkeypatch.setenv("KUBECONFIG", "/k")
    monkeypatch.setenv("SAGESERVE_PROMETHEUS_URL", "http://p")
    monkeypatch.setenv("SAGESERVE_PROMETHEUS_TARGETS_DIR", "/t")
    assert ClusterTarget.from_env() == ClusterTarget("/k", "http://p", Path("/t"))
    assert ClusterTarget.from_env(kubeconfig="/other").kubeconfig == "/other"


def test_the_stand_in_reports_load_for_exactly_the_serving_pods() -> None:
    def pod(name: str, ready: bool, terminating: bool = False) -> dict[str, object]:
        meta: dict[str, object] = {
            "name": name,
            "labels": {
                "sageserve.io/model-deployment": "m000",
                "sageserve.io/region": "us-east",
                "sageserve.io/variant": "a100",
            },
        }
        if terminating:
            meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
        status = {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}
        return {"metadata": meta, "status": status}

    other = {"metadata": {"name": "x", "labels": {}}, "status": {}}
    pods = [pod("b", True), pod("a", True), pod("loading", False), pod("gone", True, True), other]
    assert serving_pods(pods) == [
        ("a", "m000", "us-east", "a100"),
        ("b", "m000", "us-east", "a100"),
    ]
