"""PreServe's normalized latency (end to end ÷ output tokens) in the simulator's summary:
its percentiles and the peak of its 5-minute means."""

from __future__ import annotations

import pytest

from sageserve.core.types import IW_F, Request
from sageserve.pace import make_strategy
from sageserve.sim.engine import Simulation
from sageserve.sim.results import policy_summary
from tests.sim.helpers import config, flat_perf


def test_a_lone_requests_normalized_latency_is_its_latency_per_output_token() -> None:
    # prefill 0.1 s gives the first token, then 10 decode iterations of 0.01 s: 0.2 s
    reqs = [Request(0, 1.0, "m", IW_F, "r1", 100, 11)]
    sim = Simulation(config(flat_perf(), initial=1, end_s=60.0), make_strategy("reactive"), reqs)
    s = policy_summary(sim.run(), 1.0)
    got = s["tiers"]["IW-F"]["m"]["normalized_latency_s"]
    assert got["p50"] == got["p99"] == pytest.approx(0.2 / 11, rel=1e-3)
    assert got["peak_5min_mean"] == pytest.approx(0.2 / 11, rel=1e-3)
    assert s["normalized_latency_s"] == got


def test_the_peak_is_the_worst_five_minute_mean_not_the_worst_request() -> None:
    """Minutes 0-5: one request alone (0.2 s for 11 tokens). Minutes 5-10: a burst of 40
    long prompts at once on one instance queue behind each other's prefills, so their mean
    is higher; the peak is that bucket's mean, below its slowest request."""
    reqs = [Request(0, 10.0, "m", IW_F, "r1", 100, 11)]
    reqs += [Request(i, 400.0, "m", IW_F, "r1", 16_000, 11) for i in range(1, 41)]
    sim = Simulation(
        config(flat_perf(kv=2_000_000), initial=1, lo=1, hi=1, end_s=900.0),
        make_strategy("reactive"),
        reqs,
    )
    r = sim.run()
    st = r.stats[("IW-F", "m")]
    burst = list(st.norm)[1:]
    got = policy_summary(r, 1.0)["normalized_latency_s"]
    assert got["peak_5min_mean"] == pytest.approx(sum(burst) / len(burst), rel=1e-3)
    assert got["peak_5min_mean"] < max(burst)
    assert got["peak_5min_mean"] > 0.2 / 11
