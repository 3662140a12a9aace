"""Every bundled scenario loads, names only known strategies, and gives the LT planner history.

Why: a scenario is what a user runs first; a renamed strategy or a window that starts at the
trace's first minute (LT strategies would then hold their initial sizes for an hour) should
fail here, not after a 10-minute simulation.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from sageserve.sim.scenario import default_scenario_dir, load_scenario

ROOT = default_scenario_dir().parent
BUNDLED = sorted(p.parent.name for p in ROOT.glob("*/scenario.yaml"))


def test_the_documented_scenarios_are_bundled() -> None:
    assert {
        "default",
        "peak-day",
        "servegen-week",
        "fleet-scale",
        "fleet-scale-6h",
        "fleet-scale-1h",
    } <= set(BUNDLED)


@pytest.mark.slow
@pytest.mark.parametrize("name", BUNDLED)
def test_a_bundled_scenario_loads_with_its_strategies(name: str) -> None:
    sc = load_scenario(ROOT / name)
    assert sc.models and sc.nodes and sc.policies
    for policy in sc.policies:
        assert sc.strategy(policy).name == policy
    if any(p.startswith("lt") for p in sc.policies):
        interactive, _batch = sc.history(60)  # the hour the first plan forecasts from
        assert sum(sum(v) for v in interactive.values()) > 0, f"{Path(name)}: no history"


@pytest.mark.slow
@pytest.mark.parametrize("name", BUNDLED)
def test_a_bundled_scenario_maps_its_traces_to_models_whose_context_holds_them(
    name: str,
) -> None:
    """Over the first hour of the window (the whole windows are in docs/simulator.md,
    `python -m sageserve.sim.context`): ServeGen m-large asks for more than Bloom-176B's
    2,048 and Llama-2-70B's 4,096 tokens, and the overflow models take every such request,
    so nothing is refused at arrival."""
    from dataclasses import replace

    from sageserve.sim.context import refusals

    sc = load_scenario(ROOT / name)
    pooled = {m.name for pool in sc.pools for m in pool.spec.models}
    assert set(sc.contexts()) == {md.metadata.name for md in sc.models} | pooled  # all have one
    rows = refusals(sc, replace(sc.workload, duration_s=3600.0))
    assert sum(sum(r.requests.values()) for r in rows) > 0
    for r in rows:
        assert not r.refused, f"{name}: {r.source} has requests no model holds: {r.refused}"
