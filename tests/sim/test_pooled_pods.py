"""`sageserve simulate` with a ModelPool: loading, the router's rule, the plan's pool sizes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from sageserve.core.types import Request
from sageserve.pace.base import make_strategy
from sageserve.sim.engine import Simulation
from sageserve.sim.run import run_policies
from sageserve.sim.scenario import load_scenario
from tests.sim.pool_scenario import pool_scenario


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, f"{old!r} not in {path}"
    path.write_text(text.replace(old, new))


def test_a_scenario_with_a_model_pool_loads_with_its_pods_profile_and_switch_time(
    tmp_path: Path,
) -> None:
    sc = load_scenario(pool_scenario(tmp_path / "s"))
    assert [p.metadata.name for p in sc.pools] == ["tail"]
    (pool,) = sc.sim_config().pools
    assert pool.models == tuple(f"ft-{i}" for i in range(8))
    # a pod: Llama-2-70B on 4 H100s, its GPU-hours counted as the pool's
    assert (pool.perf.model, pool.perf.gpus) == ("tail", 4)
    # one engine's weights over each GPU's host link, as the twin charges a switch
    assert pool.switch_s == pytest.approx(0.539, abs=0.001)
    assert sc.contexts()["ft-3"] == sc.contexts()["llama-2-70b"]


@pytest.mark.parametrize(
    ("file", "old", "new", "error"),
    [
        (
            "workload.yaml",
            "ft-0: 1",
            "ft-0: 1, nope: 1",
            r"sources\[pooled\]\.models names model 'nope', which is neither a "
            r"ModelDeployment nor a pooled model",
        ),
        (
            "pool.yaml",
            "gpuType: NVIDIA-H100-80GB-HBM3",
            "gpuType: NVIDIA-A100-SXM4-80GB",
            r"ModelPool tail: spec\.variant\.gpuType NVIDIA-A100-SXM4-80GB: no node of the "
            r"inventory has this GPU type",
        ),
        (
            "pool.yaml",
            "gpusPerInstance: 4",
            "gpusPerInstance: 16",
            r"spec\.variant\.gpusPerInstance 16: the largest NVIDIA-H100-80GB-HBM3 node has 8",
        ),
        (
            "pool.yaml",
            "{name: ft-0, model: acme/ft-0}",
            "{name: llama-2-70b, model: acme/ft-0}",
            r"spec\.models\[\]\.name 'llama-2-70b' is also a ModelDeployment",
        ),
        (
            "pool.yaml",
            "tiers: [iw-f, iw-n]",
            "tiers: [iw-f]",
            r"sources\[pooled\]\.tiers: iw-n not in ModelPool tail's spec\.tiers",
        ),
        (
            "pool.yaml",
            "  annotations: {sageserve.io/perf-profile: llama-2-70b}\n",
            "",
            r"no perf profile 'tail' on 4×NVIDIA-H100-80GB-HBM3 .*sageserve\.io/perf-profile",
        ),
        (
            "pool.yaml",
            "awakePerInstance: 2",
            "awakePerInstance: 0",
            r"(?s)pool\.yaml: invalid ModelPool: .*spec\.awakePerInstance",
        ),
    ],
)
def test_the_loader_refuses_a_pool_it_cannot_run_naming_the_field(
    tmp_path: Path, file: str, old: str, new: str, error: str
) -> None:
    root = pool_scenario(tmp_path / "s")
    _edit(root / file, old, new)
    with pytest.raises(ValueError, match=error):
        load_scenario(root)


def test_a_sleeping_model_is_woken_and_its_first_token_waits_for_the_switch(
    tmp_path: Path,
) -> None:
    sc = load_scenario(pool_scenario(tmp_path / "s"))
    cfg = sc.sim_config()
    switch = cfg.pools[0].switch_s
    tier = sc.tiers["iw-n"]
    t0 = cfg.start_s
    # one pod, two models awake at most: ft-0 asleep, then awake; ft-1 takes the free
    # slot; ft-2 finds both idle and puts the least recently used (ft-0) to sleep first
    arrivals = [(10.0, "ft-0"), (30.0, "ft-0"), (50.0, "ft-1"), (70.0, "ft-2")]
    reqs = [
        Request(i, t0 + t, model, tier, "us-east", 800, 20) for i, (t, model) in enumerate(arrivals)
    ]
    # longer than the base model's 4,096-token context: refused at arrival, as vLLM does
    reqs.append(Request(9, t0 + 90.0, "ft-3", tier, "us-east", 4000, 200))
    sim = Simulation(cfg, make_strategy("reactive"), iter(reqs))
    result = sim.run()
    assert result.refused == 1 and result.stats[("iw-n", "ft-3")].refused == 1
    ttft = {m: list(result.stats[("iw-n", m)].ttft) for m in ("ft-0", "ft-1", "ft-2")}
    served_awake = ttft["ft-0"][1]  # prefill alone
    assert ttft["ft-0"][0] == pytest.approx(served_awake + switch, abs=0.005)
    assert ttft["ft-1"][0] == pytest.approx(served_awake + switch, abs=0.005)
    assert ttft["ft-2"][0] == pytest.approx(served_awake + 2 * switch, abs=0.005)
    region = result.pools["tail"]["regions"]["us-east"]
    assert (region["requests"], region["served"], region["wakes"]) == (4, 4, 3)
    assert region["sleeps"] >= 1


def _pool(doc: dict[str, Any]) -> dict[str, Any]:
    pool: dict[str, Any] = doc["pools"]["tail"]
    return pool


@pytest.mark.slow
def test_lt_ua_resizes_the_pool_when_its_models_get_busy_and_reactive_keeps_its_size(
    tmp_path: Path,
) -> None:
    # quiet for 3 hours (the forecaster's history), then ~0.1 requests/s over 8 models
    sc = load_scenario(pool_scenario(tmp_path / "s", quiet_rps=0.0002, busy_rps=0.1))
    cmp = run_policies(sc, ["lt-ua", "reactive"])
    lt, reactive = (cmp.summary["policies"][p] for p in ("lt-ua", "reactive"))
    for doc in (lt, reactive):
        pool = _pool(doc)
        east = pool["regions"]["us-east"]
        # every pooled request is served: held while its model wakes, never lost
        assert east["requests"] > 500
        assert east["served"] == east["requests"]
        assert east["held_at_end"] == 0
        assert sum(t["unfinished"] for t in pool["tiers"].values()) == 0
        assert sum(t["finished"] for t in pool["tiers"].values()) == east["requests"]
        assert east["gpu_hours"]["internal"] > 0
    # LT-UA: the first plan (quiet history) keeps one pod; the next, with the busy hour in
    # its history, grows the pool
    lt_pods = _pool(lt)["regions"]["us-east"]["pods"]
    assert lt_pods["by_minute"][0] == 1
    assert lt_pods["end"] > 1 and lt_pods["max"] <= 4
    assert _pool(lt)["sized"]["status"] is True
    # reactive does not size pools: one pod throughout, and the summary says why
    r_pool = _pool(reactive)
    assert r_pool["regions"]["us-east"]["pods"]["max"] == 1
    assert r_pool["sized"]["status"] is False
    assert r_pool["sized"]["reason"] == "StrategyDoesNotSizePools"
    assert "spec.policyRef.name" in r_pool["sized"]["message"]
    # the busy hour on one pod means more waking and waiting than on the resized pool
    assert r_pool["regions"]["us-east"]["wakes"] > _pool(lt)["regions"]["us-east"]["wakes"]


@pytest.mark.slow
def test_the_plan_grant_is_applied_new_pods_from_the_inventory_and_drained_pods_donated(
    tmp_path: Path,
) -> None:
    from sageserve.core.snapshot import Plan
    from sageserve.plan.pool_cycle import PoolTarget
    from sageserve.sim.pooled_pods import PoolObservation

    sc = load_scenario(pool_scenario(tmp_path / "s", quiet_rps=0.0002, busy_rps=0.05))
    cfg = sc.sim_config()
    grants = [3, 1]  # the first plan grants 3 pods, the next ones 1
    seen: list[dict[tuple[str, str], int]] = []

    def planner(*_args: Any, pools: PoolObservation | None = None) -> Plan:
        assert pools is not None  # lt-* sizes pools: the planner gets them
        seen.append(dict(pools.current))
        n = grants[min(len(seen), len(grants)) - 1]
        pools.granted = (
            PoolTarget("tail", "us-east", "NVIDIA-H100-80GB-HBM3", {}, 0.0, 0, n, n, {}),
        )
        return Plan(_args[0], {})

    history = sc.history(cfg.history_minutes)  # so that the first plan is at the start
    strategy = make_strategy("lt-immediate")
    result = Simulation(cfg, strategy, sc.requests(), planner=planner, history=history).run()
    assert seen[:2] == [{("tail", "us-east"): 1}, {("tail", "us-east"): 3}]
    east = result.pools["tail"]["regions"]["us-east"]
    by_minute = east["pods"]["by_minute"]
    assert max(by_minute[:60]) == 3 and by_minute[-1] == 1
    assert east["served"] == east["requests"] > 100
    assert result.events["scale_in"] == 2
    donated = sum(
        sec
        for (m, _r, state), sec in result.gpu_seconds.items()
        if m == "tail" and state.name == "SPOT"
    )
    assert donated > 0  # the drained pods' GPUs went back to spot
