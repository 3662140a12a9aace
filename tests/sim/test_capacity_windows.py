"""The simulator learns θ from its own minutes (`sim.capacity_windows`) and plans with it
once trusted; without `spec.capacity.learn` it counts nothing and plans as before."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sageserve.core.snapshot import Plan
from sageserve.sim.engine import Simulation
from sageserve.sim.results import capacity_summary
from sageserve.sim.scenario import load_scenario, with_policy_settings

TINY = Path(__file__).parent / "fixtures" / "tiny"
KEYS = {("llama-2-70b", "h100-tp4", "us-east"), ("llama-2-70b", "h100-tp4", "us-west")}
CADENCE = ["intervals.planSeconds=300", "forecastGap.windowSeconds=60"]


Seen = list[tuple[float, Mapping[tuple[str, str, str], float] | None]]


def run(settings: list[str]) -> tuple[Seen, Any, Simulation]:
    sc = with_policy_settings(load_scenario(TINY), CADENCE + settings)
    strategy = sc.strategy("lt-ua")
    cfg = sc.sim_config()
    inner = sc.planner_for(strategy)
    seen: Seen = []

    def planner(
        *args: Any, capacity: Mapping[tuple[str, str, str], float] | None = None, **kwargs: Any
    ) -> Plan:
        seen.append((args[0] - cfg.start_s, capacity))
        return inner(*args, capacity=capacity, **kwargs)

    sim = Simulation(cfg, strategy, sc.requests(), None, planner, sc.history(cfg.history_minutes))
    return seen, sim.run(), sim


def test_a_learning_run_plans_with_the_theta_its_minutes_taught_once_trusted() -> None:
    seen, result, sim = run(
        ["capacity.learn=true", "capacity.minWindows=8", "capacity.minEmu=0.001"]
    )
    # a plan before 8 minutes were seen keeps the declared θ; later ones get the learned one
    assert any(t < 8 * 60 for t, _ in seen) and any(t > 8 * 60 for t, _ in seen)
    assert all(c is None for t, c in seen if t < 8 * 60)
    learned = [c for t, c in seen if t > 8 * 60]
    # each region plans with its own θ (some may not be trusted yet in the first plans)
    assert all(c is not None and set(c) <= KEYS for c in learned)
    assert learned[-1] is not None and set(learned[-1]) == KEYS
    rows = capacity_summary(result.capacity)
    assert {(r["region"], r["declared_tps"]) for r in rows} == {("us-east", 400), ("us-west", 400)}
    assert all(r["windows"] >= r["qualifying"] >= 8 and r["trusted"] for r in rows)
    # bounded by the declared θ × [0.5, 2]
    assert all(200 <= r["in_force_tps"] <= 800 for r in rows)
    assert all(200 <= learned[-1][k] <= 800 for k in KEYS)
    # batch deadlines are judged with the largest θ the last plan sized with
    assert sim.deadline_theta("llama-2-70b") == max(learned[-1].values())


def test_without_learning_nothing_is_counted_and_the_plan_keeps_the_declared_theta() -> None:
    seen, result, sim = run([])
    assert seen and all(c is None for _, c in seen)
    assert result.capacity is None
    assert sim.deadline_theta("llama-2-70b") == 400  # the declared θ
