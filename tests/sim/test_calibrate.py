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


@pytest.mark.slow
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


@pytest.mark.slow
def test_longer_requests_lower_the_capacity(perf: VariantPerf) -> None:
    short, _ = measure_capacity(perf, "v", "m", TIER, [(100, 50)], 0.7, steps=4, duration_s=600)
    long, _ = measure_capacity(perf, "v", "m", TIER, [(2000, 800)], 0.7, steps=4, duration_s=600)
    assert long < short


def test_probe_of_an_idle_instance_is_fast_and_cool(perf: VariantPerf) -> None:
    p = probe(perf, "v", "m", TIER, SIZES, 50.0, 600)
    assert p.ttft_p95_s < 1.0 and p.mean_kv < 0.1 and math.isclose(p.finished_share, 1.0)


def test_skewed_mixes_take_the_most_prompt_and_decode_heavy_quarters() -> None:
    from sageserve.sim.calibrate import skewed_mix, token_share

    sizes = [
        (900, 100),
        (100, 900),
        (500, 500),
        (800, 10),
        (10, 800),
        (300, 300),
        (50, 50),
        (1, 19),
    ]
    assert skewed_mix(sizes, prompt_heavy=True) == [(800, 10), (900, 100)]
    assert skewed_mix(sizes, prompt_heavy=False) == [(10, 800), (1, 19)]
    assert token_share([(300, 100)], prompt=True) == pytest.approx(0.75)
    assert token_share([(300, 100)], prompt=False) == pytest.approx(0.25)


@pytest.mark.slow
def test_prefill_and_decode_rates_are_each_above_the_mixed_share(perf: VariantPerf) -> None:
    """μ_p (μ_d) is measured on the mix that loads prefill (decode) most, so each exceeds
    the prompt (output) share of θ on the mixed traffic: one instance serves more of one
    kind of token when the other kind does not compete for it."""
    from sageserve.sim.calibrate import service_rates, token_share

    sizes = [
        (1800, 20),
        (1500, 40),
        (60, 600),
        (80, 900),
        (400, 300),
        (300, 200),
        (900, 90),
        (50, 700),
    ]
    theta, _ = measure_capacity(perf, "v", "m", TIER, sizes, 0.7, steps=4, duration_s=600)
    mu_p, mu_d = service_rates(perf, "v", "m", TIER, sizes, 0.7, duration_s=600)
    assert mu_p > theta * token_share(sizes, prompt=True)
    assert mu_d > theta * token_share(sizes, prompt=False)
