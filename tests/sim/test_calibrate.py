"""θ calibration: the measured capacity is a real boundary of the instance model."""

from __future__ import annotations

import math

import pytest

from sageserve.core.types import Tier, TierKind
from sageserve.perf.model import VariantPerf
from sageserve.sim.calibrate import measure_capacity, probe
from sageserve.sim.scenario import default_scenario_dir, load_scenario

TIER = Tier(name="iw-f", kind=TierKind.INTERACTIVE, ttft_slo_s=1.0, priority=0)
SIZES = [(400, 300), (120, 40), (900, 250), (60, 500)]


@pytest.fixture(scope="module")
def perf() -> VariantPerf:
    sc = load_scenario(default_scenario_dir())
    return sc.catalog.get("llama-2-70b", "NVIDIA-H100-80GB-HBM3", 4)


def test_measured_capacity_holds_and_a_higher_rate_does_not(perf: VariantPerf) -> None:
    theta, probes = measure_capacity(
        perf, "h100-tp4", "m", TIER, SIZES, 0.7, steps=5, duration_s=900
    )
    assert 500 < theta < 1e6
    at = probe(perf, "h100-tp4", "m", TIER, SIZES, theta, 900)
    assert at.holds(1.0, 0.7)
    over = probe(perf, "h100-tp4", "m", TIER, SIZES, theta * 1.5, 900)
    assert not over.holds(1.0, 0.7)
    assert len(probes) >= 6


def test_longer_requests_lower_the_capacity(perf: VariantPerf) -> None:
    short, _ = measure_capacity(perf, "v", "m", TIER, [(100, 50)], 0.7, steps=4, duration_s=600)
    long, _ = measure_capacity(perf, "v", "m", TIER, [(2000, 800)], 0.7, steps=4, duration_s=600)
    assert long < short


def test_probe_of_an_idle_instance_is_fast_and_cool(perf: VariantPerf) -> None:
    p = probe(perf, "v", "m", TIER, SIZES, 50.0, 600)
    assert p.ttft_p95_s < 1.0 and p.mean_kv < 0.1 and math.isclose(p.finished_share, 1.0)
