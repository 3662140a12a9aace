"""OServe layouts in the fleet simulator (`sageserve simulate`, `sim/layout_loop.py`): the
scenario loader's checks, and a run whose mix moves from short requests to long prompts,
where the layout loop switches to the pipeline variant make-before-break and the long-prompt
type is dispatched to it, with every request served."""

from __future__ import annotations

import gzip
import json
import random
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from sageserve.cli import app
from sageserve.sim.cluster import Cluster
from sageserve.sim.engine import Simulation
from sageserve.sim.scenario import load_scenario

# measured n per type (short, long prompt), the table the operator's loop is tested with: the
# pipeline serves long prompts five times better per replica, TP4 short ones nearly as well
# on half the GPUs
from tests.controller.test_layout_loop import TABLE

GPU = "NVIDIA-H100-80GB-HBM3"
TP4 = {
    "name": "tp4",
    "gpuType": GPU,
    "gpusPerInstance": 4,
    "capacityTokensPerSecond": 2650,
    "startupSeconds": 60,
}
TP4PP2 = {
    "name": "tp4pp2",
    "gpuType": GPU,
    "gpusPerInstance": 8,
    "tensorParallel": 4,
    "pipelineParallel": 2,
    "capacityTokensPerSecond": 2650,
    "startupSeconds": 60,
}
#: the mix moves at this second: short requests before, mostly long prompts after
MOVE_S = 1200.0


def node(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {
                "topology.kubernetes.io/region": "us-east",
                "nvidia.com/gpu.product": GPU,
                "sageserve.io/pool": "serving",
            },
        },
        "status": {"allocatable": {"nvidia.com/gpu": "8"}, "capacity": {"nvidia.com/gpu": "8"}},
    }


def trace(path: Path, seed: int = 3) -> int:
    """20 minutes of short requests (4/s), then 20 of long prompts (1.5/s) and short ones
    (1.5/s); Poisson arrivals. Returns the number of requests."""
    rng = random.Random(seed)
    rows: list[tuple[float, int, int]] = []
    for lo, hi, rate, shape in (
        (0.0, MOVE_S, 4.0, (100, 100)),
        (MOVE_S, 2 * MOVE_S, 1.5, (2000, 20)),
        (MOVE_S, 2 * MOVE_S, 1.5, (100, 100)),
    ):
        t = lo + rng.expovariate(rate)
        while t < hi:
            rows.append((t, *shape))
            t += rng.expovariate(rate)
    rows.sort()
    with gzip.open(path, "wt") as f:
        for t, p, o in rows:
            f.write(json.dumps({"timestamp": t * 1000, "input_length": p, "output_length": o}))
            f.write("\n")
    return len(rows)


def scenario(
    root: Path,
    variants: list[dict[str, Any]] | None = None,
    layouts: dict[str, Any] | None = None,
    config_map: bool = True,
    strategy: str = "reactive",
    startup_s: int = 60,
) -> Path:
    """A one-region scenario of Llama-2-70B on three 8-GPU H100 nodes, starting on 3 × TP4
    (its floor, so the reactive strategy holds 12 GPUs when the layout loop first sees them),
    under a policy with `spec.layouts` (the measured table in a ConfigMap)."""
    root.mkdir(parents=True, exist_ok=True)
    md = {
        "apiVersion": "sageserve.io/v1alpha1",
        "kind": "ModelDeployment",
        "metadata": {
            "name": "llama-2-70b",
            "annotations": {"sageserve.io/type-capacity": "llama-n"},
        },
        "spec": {
            "model": {"name": "meta-llama/Llama-2-70b-hf"},
            "variants": [
                {**v, "startupSeconds": startup_s}
                for v in (variants if variants is not None else [TP4, TP4PP2])
            ],
            "regions": [
                {"name": "us-east", "minInstances": 3, "maxInstances": 6, "initialInstances": 3}
            ],
            "tiers": ["iw-f"],
            "policyRef": {"name": "fleet"},
        },
    }
    cm = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "llama-n"},
        "data": {"type-capacity.yaml": yaml.safe_dump(TABLE)},
    }
    policy = {
        "apiVersion": "sageserve.io/v1alpha1",
        "kind": "ScalingPolicy",
        "metadata": {"name": "fleet"},
        "spec": {
            "strategy": strategy,
            "intervals": {"paceSeconds": 15, "cooldownSeconds": 15},
            "spot": {"redeploySeconds": 60},
            "layouts": layouts
            if layouts is not None
            else {
                "replanSeconds": 60,
                "historySeconds": 300,
                "confirmations": 1,
                "forecast": "persist",
            },
        },
    }
    tier = {
        "apiVersion": "sageserve.io/v1alpha1",
        "kind": "WorkloadTier",
        "metadata": {"name": "iw-f"},
        "spec": {"type": "interactive", "priority": 0, "slo": {"ttftP95Seconds": 5}},
    }
    docs = [md, policy, tier] + ([cm] if config_map else [])
    (root / "manifests.yaml").write_text(yaml.safe_dump_all(docs))
    (root / "nodes.yaml").write_text(yaml.safe_dump_all([node(f"n{i}") for i in range(3)]))
    trace(root / "mixed.jsonl.gz")
    (root / "workload.yaml").write_text(
        yaml.safe_dump(
            {
                "seed": 1,
                "window": {"start": 0, "duration": "40m"},
                "regionOrder": ["us-east"],
                "sources": [
                    {
                        "name": "mixed",
                        "type": "jsonl",
                        "path": "mixed.jsonl.gz",
                        "models": {"llama-2-70b": 1.0},
                        "regions": {"us-east": 1.0},
                        "tiers": {"iw-f": 1.0},
                    }
                ],
            }
        )
    )
    (root / "scenario.yaml").write_text(
        yaml.safe_dump(
            {
                "name": "layouts",
                "manifests": ["manifests.yaml"],
                "inventory": "nodes.yaml",
                "workload": "workload.yaml",
                "drain": "30m",
                "policies": [strategy],
            }
        )
    )
    return root


# ---- the loader ------------------------------------------------------------------------------


def test_a_policy_with_layouts_loads_tp4_and_the_pipeline_variant(tmp_path: Path) -> None:
    cfg = load_scenario(scenario(tmp_path / "s")).sim_config()
    assert cfg.layouts is not None
    (lm,) = cfg.layouts.models
    (group,) = lm.groups
    assert [str(group.strategy(v)) for v in group.variants] == ["TP4", "TP4xPP2"]
    assert lm.measured is not None and lm.measured.gpu_type == GPU
    perf = dict(cfg.models[0].variants)
    # the pipeline variant runs the (TP4, PP2) profile, not the TP8 table of its 8 GPUs
    assert (perf["tp4pp2"].tensor_parallel, perf["tp4pp2"].pipeline_parallel) == (4, 2)
    assert perf["tp4pp2"].derived and not perf["tp4"].derived


@pytest.mark.parametrize(
    ("variants", "config_map", "expect"),
    [
        (
            [TP4, {**TP4, "name": "tp4b"}],
            True,
            "ModelDeployment llama-2-70b: spec.variants[tp4b]: same tensorParallel × "
            "pipelineParallel 4 × 1 as variant tp4 on NVIDIA-H100-80GB-HBM3; OServe layouts "
            "need one variant per parallelism: change one, or remove it",
        ),
        (
            [TP4PP2, {**TP4PP2, "name": "pp2b", "gpusPerInstance": 8, "tensorParallel": None}],
            True,
            "ModelDeployment llama-2-70b: spec.variants[pp2b]: same tensorParallel × "
            "pipelineParallel 4 × 2 as variant tp4pp2",
        ),
        (
            [TP4],
            True,
            "scenario layouts: ScalingPolicy fleet sets spec.layouts, but no ModelDeployment "
            "lists two or more variants of one GPU type",
        ),
        (
            [TP4, TP4PP2],
            False,
            "ModelDeployment llama-2-70b: ConfigMap default/llama-n (annotation "
            "sageserve.io/type-capacity) does not exist; create it with the file of "
            "`sageserve calibrate --by-type --out n.yaml` under the key type-capacity.yaml",
        ),
        (
            [TP4, {**TP4PP2, "name": "tp2pp4", "tensorParallel": 2, "pipelineParallel": 4}],
            True,
            "ModelDeployment llama-2-70b: spec.variants[tp2pp4] (tensorParallel 2 × "
            "pipelineParallel 4): no tensor-parallel profile for llama-2-70b on "
            "2x NVIDIA-H100-80GB-HBM3 to derive PP=4 from; measured TP sizes: [4, 8]",
        ),
    ],
    ids=["same-tp-pp", "same-tp-pp-derived-tp", "one-variant", "no-configmap", "no-tp2-profile"],
)
def test_a_layouts_policy_the_simulator_cannot_run_is_refused_naming_the_field(
    tmp_path: Path, variants: list[dict[str, Any]], config_map: bool, expect: str
) -> None:
    variants = [{k: v for k, v in x.items() if v is not None} for x in variants]
    sc = load_scenario(scenario(tmp_path / "s", variants, config_map=config_map))
    with pytest.raises(ValueError) as err:
        sc.sim_config()
    assert str(err.value).startswith(expect)


def test_layouts_with_the_siloed_strategy_are_refused(tmp_path: Path) -> None:
    sc = load_scenario(scenario(tmp_path / "s"))
    with pytest.raises(ValueError, match=r"spec\.layouts needs one unified pod set per variant"):
        Simulation(sc.sim_config(), sc.strategy("siloed"), sc.requests())


# ---- a run -----------------------------------------------------------------------------------


def test_the_mix_moves_to_long_prompts_and_the_run_switches_to_the_pipeline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # what serves when each TP4 instance is stopped
    stops: list[dict[str, int]] = []
    real = Cluster.scale_in

    def scale_in(self: Cluster, key: Any, now: float, variant: Any = None, *a: Any) -> Any:
        ep = self.endpoints[key]
        stops.append({d.variant: len(d.instances) for d in ep.deployments} | {"of": variant})
        return real(self, key, now, variant, *a)

    monkeypatch.setattr(Cluster, "scale_in", scale_in)
    root = scenario(tmp_path / "s")
    out = tmp_path / "out"
    res = CliRunner().invoke(
        app, ["simulate", "-s", str(root), "-o", str(out), "--no-report"], env={"COLUMNS": "240"}
    )
    assert res.exit_code == 0, res.output
    doc = json.loads((out / "summary.json").read_text())["policies"]["reactive"]
    # every request is served
    requests = doc["requests"]
    assert requests["arrived"] > 0
    assert requests["finished"] == requests["arrived"] and requests["unfinished"] == 0

    # the printed table names the switch and the layout at the end
    assert "OServe layouts" in res.output
    assert f"llama-2-70b/us-east/{GPU}" in res.output and "TP4xPP2 + TP4" in res.output

    layouts = doc["layouts"]
    group = layouts["groups"][f"llama-2-70b/us-east/{GPU}"]
    # short requests only: TP4 × 3 kept; once long prompts come, one TP4 makes way for the
    # pipeline, make-before-break (12 of the 24 GPUs are free)
    assert (group["switches"], group["switches_finished"], group["switches_abandoned"]) == (1, 1, 0)
    started, finished = group["events"]
    assert MOVE_S < started["t"] < finished["t"]
    assert started["message"].startswith("switching TP4 ×3 → TP4xPP2 + TP4 (gain ")
    assert "make-before-break" in started["message"]
    assert group["layout"] == "TP4xPP2 + TP4"
    assert group["replicas"] == {"tp4": 1, "tp4pp2": 1}
    # the TP4 instances went only once the pipeline served
    assert [s["of"] for s in stops] == ["tp4", "tp4"]
    assert all(s["tp4pp2"] == 1 for s in stops)

    # by type: long prompts to the pipeline, short requests to TP4
    dispatched = layouts["dispatched"]["llama-2-70b/us-east"]
    short, long_ = dispatched["type 0"], dispatched["type 1"]
    assert long_["tp4pp2"] > long_["tp4"]
    assert short["tp4"] > 10 * short.get("tp4pp2", 0)


def test_the_shape_counter_counts_as_the_routers_metric_and_reads_back_like_prometheus() -> None:
    """Answered requests per log-2 (prompt, output) bucket, the labels of
    `sageserve_router_request_shapes_total`; `counts` over the history in whole minutes,
    `series` as `rate()` per step, missing (NaN) before the run's first minute."""
    from sageserve.sim.layout_loop import ShapeCounter

    shapes = ShapeCounter(keep_minutes=10)
    for n in (3, 0, 6):  # three minutes
        for _ in range(n):
            shapes.count("m", "r", 1500, 20)  # buckets 2048 and 32
        shapes.count("m", "other-region", 100, 100)
        shapes.count("m", "r", 100, 0)  # no output known: not counted, as the router
        shapes.roll()
    assert shapes.counts("m", "r", 3600) == {("2048", "32"): 9.0}
    assert shapes.counts("m", "r", 60) == {("2048", "32"): 6.0}
    series = shapes.series("m", "r", 300, 60)[("2048", "32")]
    assert series[:2] == pytest.approx([float("nan")] * 2, nan_ok=True)
    assert series[2:] == [3 / 60, 0.0, 6 / 60]
    two_minutes = shapes.series("m", "r", 240, 120)[("2048", "32")]
    assert two_minutes[0] != two_minutes[0] and two_minutes[1] == (0 + 6) / 120
