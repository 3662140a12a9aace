"""The `preserve` strategy in the simulator: a window plan every window, the fleet moved to
it, and the in-window scale-up from the instances' projected KV usage (PreServe §4.3.2)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sageserve.core.snapshot import Plan
from sageserve.core.types import (
    IW_F,
    ActionKind,
    EndpointKey,
    EndpointObservation,
    ScalingAction,
)
from sageserve.pace import make_strategy
from sageserve.sim.engine import Simulation
from sageserve.sim.scenario import load_scenario
from tests.sim.helpers import config, flat_perf, poisson

TINY = Path(__file__).parent / "fixtures" / "tiny"


class Recording:
    """A strategy that records every action of the one it wraps, with what it saw."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.actions: list[tuple[EndpointObservation, ScalingAction]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def step(self, obs: EndpointObservation, plan: Any) -> ScalingAction | None:
        action = self.inner.step(obs, plan)
        if action is not None:
            self.actions.append((obs, action))
        return action


def test_preserve_plans_each_window_and_moves_the_fleet_to_it() -> None:
    sc = load_scenario(TINY)
    strategy = Recording(sc.strategy("preserve"))
    cfg = sc.sim_config()
    assert strategy.plan_cadence.interval_s == 600.0  # preserve.windowSeconds' default
    inner = sc.planner_for(strategy)
    plans: list[Plan] = []

    def planner(*args, **kwargs):  # type: ignore[no-untyped-def]
        plan = inner(*args, **kwargs)
        plans.append(plan)
        return plan

    Simulation(cfg, strategy, sc.requests(), None, planner, sc.history(cfg.history_minutes)).run()
    # no history before a trace that starts at 0: the first window plan is at 10 min
    assert [p.computed_at for p in plans] == [600.0, 1200.0]
    moves = [(o, a) for o, a in strategy.actions if a.reason.startswith("PreServe: window")]
    assert moves, "no window boundary moved the fleet"
    for obs, action in moves:
        plan = max((p for p in plans if p.computed_at <= obs.time), key=lambda p: p.computed_at)
        assert obs.time - plan.computed_at < 60.0  # at the window's start
        sign = 1 if action.kind is ActionKind.SCALE_OUT else -1
        target = max(obs.min_instances, min(obs.max_instances, plan.targets[obs.key]))
        assert obs.active + sign * action.count == target


def test_static_holds_one_size_per_endpoint_from_the_first_minute() -> None:
    sc = load_scenario(TINY)
    strategy = sc.strategy("static")
    cfg = sc.sim_config()
    planner = sc.planner_for(strategy)
    result = Simulation(cfg, strategy, sc.requests(), None, planner, None).run()
    later = [m for m in result.minutes if 2 <= m.minute <= 20]
    sizes = {(m.model, m.region, m.serving + m.provisioning) for m in later}
    assert len({(model, region) for model, region, _ in sizes}) == len(sizes)  # never changes
    assert result.events.get("scale_in", 0) == 0


def test_in_window_an_instance_projected_to_overflow_brings_one_more() -> None:
    """The window plan says 1 instance; requests with long outputs fill its KV cache: the
    projection (the simulator's anticipators, as a router's would be) adds instances within
    the window, which no reactive rule does here (the plan is in force)."""
    perf = flat_perf(prefill_s=0.01, decode_s=0.02, kv=40_000, gpus=8)
    cfg = config(perf, initial=1, lo=1, hi=3, end_s=900.0)
    key = EndpointKey("m", "r1")

    def planner(now, *_, **_kw):  # type: ignore[no-untyped-def]
        return Plan(now, {(key, "v"): 1})

    reqs = poisson(1.0, 900.0, [IW_F], prompt=2000, output=1500, seed=3)
    history = ({("m", "r1"): [1.0]}, {})  # some history: the plan is in force from the start
    strategy = Recording(make_strategy("preserve"))
    result = Simulation(cfg, strategy, reqs, None, planner, history).run()
    most = max(m.serving + m.provisioning for m in result.minutes)
    assert most > 1
    reasons = [a.reason for _, a in strategy.actions if a.kind is ActionKind.SCALE_OUT]
    assert reasons and all("projected above 95%" in r for r in reasons), reasons
