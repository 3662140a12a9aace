"""GPU-hour bounds: the floor is minInstances for the window; the oracle sits between the
floor and the fleet at maxInstances, and falls as θ rises."""

from __future__ import annotations

from pathlib import Path

import pytest

from sageserve.sim.bounds import gpu_hour_bounds
from sageserve.sim.scenario import load_scenario

TINY = Path(__file__).parent / "fixtures" / "tiny"


def test_floor_is_min_instances_over_the_window() -> None:
    b = gpu_hour_bounds(load_scenario(TINY))
    # two regions × minInstances 1 × 4 GPUs × 20 minutes
    assert b.floor_gpu_hours == pytest.approx(2 * 1 * 4 * 20 / 60)
    assert b.floor_gpu_hours <= b.oracle_gpu_hours <= 2 * 6 * 4 * 20 / 60


def test_oracle_falls_as_theta_rises_down_to_the_floor() -> None:
    sc = load_scenario(TINY)
    base = gpu_hour_bounds(sc).oracle_gpu_hours
    variant = sc.models[0].spec.variants[0]
    variant.capacity_tokens_per_second *= 4
    faster = gpu_hour_bounds(sc).oracle_gpu_hours
    variant.capacity_tokens_per_second = 1e12
    b = gpu_hour_bounds(sc)
    assert faster < base
    assert b.oracle_gpu_hours == pytest.approx(b.floor_gpu_hours)
