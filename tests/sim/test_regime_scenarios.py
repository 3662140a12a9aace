"""The regime scenarios run: PreServe's memory-bound 7B on A40s and OServe's crossing mix
simulate a short slice, and Aegaeon's small-model long tail charges its baselines start-up
and floors."""

from __future__ import annotations

from dataclasses import replace

import pytest

from sageserve.sim.engine import Simulation
from sageserve.sim.longtail import load_long_tail
from sageserve.sim.pool_serving import simulate_pool
from sageserve.sim.scenario import default_scenario_dir, load_scenario

ROOT = default_scenario_dir().parent


@pytest.mark.slow
def test_preserve_memory_bound_serves_a_slice_on_single_a40s() -> None:
    sc = load_scenario(ROOT / "preserve-memory-bound")
    cfg = sc.sim_config()
    cfg = replace(cfg, end_s=cfg.start_s + 300.0, drain_s=300.0)
    result = Simulation(cfg, sc.strategy("reactive"), sc.requests()).run()
    assert result.arrived > 1000
    assert result.finished > 0.9 * result.arrived


@pytest.mark.slow
def test_aegaeon_small_models_dedicated_floor_holds_every_model_for_the_window() -> None:
    lt = load_long_tail(ROOT / "aegaeon-small-models", hours=0.25)
    assert lt.perf.gpus == 1 and lt.setup.startup_s > 0 and lt.setup.dedicated_floor == 1
    reqs = [r for r in lt.requests if r.t < lt.start_s + 900.0]
    floor = simulate_pool(
        "dedicated", reqs, lt.setup, start_s=lt.start_s, end_s=lt.end_s, models=lt.models
    )
    assert floor.gpu_hours == pytest.approx(len(lt.models) * 0.25)
    assert floor.switches == 0  # nothing starts cold: every model is up from the start
    zero = replace(lt.setup, dedicated_floor=0)
    scaled = simulate_pool("dedicated", reqs, zero, start_s=lt.start_s, end_s=lt.end_s)
    assert scaled.gpu_hours < floor.gpu_hours


@pytest.mark.slow
def test_a_floor_above_one_is_refused_with_the_field_named() -> None:
    lt_setup = load_long_tail(ROOT / "aegaeon-small-models", hours=0.01).setup
    with pytest.raises(ValueError, match=r"pool\.dedicatedMinInstances"):
        replace(lt_setup, dedicated_floor=2)


@pytest.mark.slow
def test_oserve_crossing_serves_a_slice_on_codellama_34b() -> None:
    sc = load_scenario(ROOT / "oserve-crossing")
    cfg = sc.sim_config()
    cfg = replace(cfg, end_s=cfg.start_s + 300.0, drain_s=300.0)
    result = Simulation(cfg, sc.strategy("reactive"), sc.requests()).run()
    assert result.arrived > 1000
    assert result.finished > 0.9 * result.arrived
