"""Many sporadic models on few GPUs: the pooled scheduler (Aegaeon §4) and its baselines."""

from __future__ import annotations

import math
import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sageserve.perf.model import load_catalog
from sageserve.perf.switch import AEGAEON_BETA, switch_seconds
from sageserve.sim.pool_serving import PoolRequest, PoolSetup, simulate_pool, tokens_on_time

H100 = "NVIDIA-H100-80GB-HBM3"
A100 = "NVIDIA-A100-SXM4-80GB"


def _setup(model: str = "llama-2-70b", gpu: str = H100) -> PoolSetup:
    return PoolSetup.from_profile(load_catalog().get(model, gpu, 4))


def _poisson(models: int, rate: float, end: float, seed: int = 1) -> list[PoolRequest]:
    rng = random.Random(seed)
    out = []
    for m in range(models):
        t = 0.0
        while True:
            t += rng.expovariate(rate)
            if t >= end:
                break
            out.append(PoolRequest(t, f"m{m}", rng.randint(100, 2000), rng.randint(20, 400)))
    out.sort(key=lambda r: r.t)
    return out


@pytest.mark.parametrize(
    ("first_index", "start", "step", "count", "expected"),
    [
        # arrival 0, TTFT 10, TBT 0.1: token k is due at 10 + (k − 1) × 0.1
        (1, 0.0, 0.05, 5, 5),  # early and faster than the TBT: all met
        (1, 9.95, 0.2, 3, 0),  # token 1 at 10.15: late, and slower than the TBT after it
        (2, 10.0, 0.05, 4, 4),  # token 2 at 10.05 ≤ 10.1, and the stream gains on its deadlines
        (2, 20.0, 0.05, 10, 0),  # 10 s late: 10 tokens cannot catch up 10 s at 50 ms of slack
        (2, 10.5, 0.05, 20, 11),  # 0.4 s late, 50 ms gained per token: met from token 11 on
        (2, 9.0, 0.2, 20, 10),  # slower than the TBT: a 1.1 s lead lasts 10 tokens
        (2, 10.0, 0.1, 7, 7),  # exactly at the TBT from an on-time start
        (3, 0.0, 0.01, 0, 0),  # nothing emitted
    ],
)
def test_tokens_on_time_table(
    first_index: int, start: float, step: float, count: int, expected: int
) -> None:
    got = tokens_on_time(0.0, 10.0, 0.1, first_index, start, step, count)
    brute = sum(
        1
        for j in range(1, count + 1)
        if start + j * step <= 10.0 + (first_index + j - 2) * 0.1 + 1e-9
    )
    assert got == brute
    assert got == expected


def test_switch_cost_is_the_papers_eq4_on_the_per_gpu_shard() -> None:
    setup = _setup()
    # Llama-2-70B: 68.98e9 params × 2 B over 4 GPUs, 64 GB/s each, × β = 0.625
    assert setup.switch_s == pytest.approx(68.98e9 * 2 / 4 / 64e9 * AEGAEON_BETA)
    assert setup.load_s == pytest.approx(setup.switch_s / AEGAEON_BETA)
    assert switch_seconds(26e9, 1, 32.0) == pytest.approx(26 / 32 * 0.625)  # 13B, PCIe 4.0


def test_one_model_with_room_meets_every_deadline() -> None:
    reqs = _poisson(1, 0.5, 600.0)
    out = simulate_pool("pooled", reqs, _setup(), start_s=0.0, end_s=600.0, prefill=1, decode=1)
    assert out.finished == out.requests == len(reqs)
    assert out.attainment == pytest.approx(1.0)


def test_token_level_switching_beats_request_level_on_the_same_gpus() -> None:
    # 40 models at 0.1 requests/s on 12 instances of 4×H100: more models are active at once
    # than instances, so request-level switching queues whole requests (head-of-line)
    reqs = _poisson(40, 0.1, 900.0)
    setup = _setup()
    pooled = simulate_pool("pooled", reqs, setup, start_s=0, end_s=900, prefill=2, decode=10)
    request = simulate_pool("request", reqs, setup, start_s=0, end_s=900, instances=12)
    assert pooled.gpus == request.gpus == 48
    assert pooled.attainment > request.attainment + 0.05
    assert request.ttft_p95_s > pooled.ttft_p95_s


def test_request_level_switching_needs_no_switch_when_the_model_is_loaded() -> None:
    reqs = _poisson(1, 0.05, 600.0)
    out = simulate_pool("request", reqs, _setup(), start_s=0, end_s=600, instances=2)
    assert out.switches == 1
    assert out.attainment == pytest.approx(1.0)


def test_mux2_places_two_models_per_instance() -> None:
    reqs = _poisson(5, 0.05, 300.0)
    out = simulate_pool(
        "mux2", reqs, _setup(), start_s=0, end_s=300, models=[f"m{i}" for i in range(5)]
    )
    assert out.gpus == math.ceil(5 / 2) * 4
    assert out.gpu_hours == pytest.approx(out.gpus * 300 / 3600)


def test_dedicated_scales_to_zero_and_pays_only_while_up() -> None:
    # two requests an hour apart: the instance starts twice and is down in between
    reqs = [PoolRequest(10.0, "a", 500, 50), PoolRequest(3610.0, "a", 500, 50)]
    setup = _setup()
    out = simulate_pool("dedicated", reqs, setup, start_s=0, end_s=7200)
    assert out.switches == 2  # two cold starts
    assert out.gpus == 4
    assert out.gpu_hours < 4 * 2 * (setup.keep_alive_s + 60) / 3600
    assert out.attainment == pytest.approx(1.0)


def test_hot_models_are_served_by_their_own_instances() -> None:
    reqs = _poisson(3, 0.2, 300.0)
    out = simulate_pool(
        "pooled", reqs, _setup(), start_s=0, end_s=300, prefill=1, decode=1, hot={"m0": 2}
    )
    assert out.gpus == (1 + 1 + 2) * 4
    assert out.per_model["m0"].finished == out.per_model["m0"].arrived


def test_bad_strategy_and_sizes_are_refused_naming_the_field() -> None:
    with pytest.raises(ValueError, match="strategy: unknown 'fast'"):
        simulate_pool("fast", [], _setup(), start_s=0, end_s=1)
    with pytest.raises(ValueError, match="prefill/decode"):
        simulate_pool("pooled", [], _setup(), start_s=0, end_s=1, prefill=1, decode=0)
    with pytest.raises(ValueError, match="end_s"):
        simulate_pool("pooled", [], _setup(), start_s=5, end_s=1, prefill=1, decode=1)


@settings(max_examples=25, deadline=None)
@given(
    models=st.integers(1, 12),
    rate=st.floats(0.01, 0.5),
    decode=st.integers(1, 3),
    seed=st.integers(0, 10_000),
)
@pytest.mark.slow
def test_pooled_scheduler_starves_no_model_and_keeps_turns_within_quota(
    models: int, rate: float, decode: int, seed: int
) -> None:
    reqs = _poisson(models, rate, 300.0, seed)
    setup = _setup("llama-3-1-8b", A100)
    out = simulate_pool(
        "pooled", reqs, setup, start_s=0, end_s=300, prefill=1, decode=decode, drain_s=3600
    )
    # every model's every request is served, however busy the others are
    for name, counts in out.per_model.items():
        assert counts.finished == counts.arrived, name
    # no turn is longer than Q_MAX (Eqs. 2-3 cap the quota there)
    assert out.longest_turn_s <= setup.q_max_s + 1e-9
    assert 0 <= out.tokens_on_time <= out.tokens


# ---- the router's request-level rule (dispatch.pool_switch), simulated -------------------------


def _router(reqs: list[PoolRequest], pods: int = 1, **kw: float) -> tuple[PoolSetup, Any]:
    setup = _setup()
    out = simulate_pool("router", reqs, setup, start_s=0, end_s=600, instances=pods, **kw)
    return setup, out


def test_the_router_rule_holds_a_request_until_the_busy_model_is_idle_then_swaps_it() -> None:
    # one pod, one model awake at a time: b waits for a to finish, then a sleeps, b wakes
    alone = [PoolRequest(0.0, "a", 500, 300)]
    setup, a = _router(alone, awake_per_instance=1)
    assert a.switches == 1 and setup.load_s < a.ttft_p95_s < 2 * setup.load_s  # wake, prefill
    both = [*alone, PoolRequest(1.0, "b", 500, 10)]
    _, out = _router(both, awake_per_instance=1)
    assert out.finished == 2 and out.switches == 2
    # b's first token (the larger of the two) after a's 300 tokens, a's sleep and b's wake
    assert out.ttft_p95_s > 5.0 + 2 * setup.load_s


def test_the_router_rule_wakes_a_second_model_beside_a_busy_one_when_the_quota_allows() -> None:
    reqs = [PoolRequest(0.0, "a", 500, 300), PoolRequest(1.0, "b", 500, 10)]
    setup, out = _router(reqs, awake_per_instance=2)
    assert out.finished == 2 and out.switches == 2
    assert out.ttft_p95_s < 2 * setup.load_s  # b woke at once, nothing put to sleep


def test_the_router_rule_sends_a_model_to_the_pod_where_it_is_awake() -> None:
    # the second request finds a awake (and busy) on one pod: no wake on the idle pod
    reqs = [PoolRequest(0.0, "a", 500, 300), PoolRequest(30.0, "a", 500, 300)]
    _, out = _router(reqs, pods=2, awake_per_instance=1)
    assert out.finished == 2 and out.switches == 1


@pytest.mark.parametrize(("idle_sleep_s", "wakes"), [(60.0, 2), (1000.0, 1)])
def test_the_router_rule_puts_an_idle_model_to_sleep(idle_sleep_s: float, wakes: int) -> None:
    reqs = [PoolRequest(0.0, "a", 500, 20), PoolRequest(300.0, "a", 500, 20)]
    _, out = _router(reqs, awake_per_instance=1, idle_sleep_s=idle_sleep_s)
    assert out.finished == 2 and out.switches == wakes
