"""The fluid lower bound: its cost model never undercuts the perf curves, its LP moves work
only where the SLOs allow, and no simulated run that keeps its SLOs goes below it."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from sageserve.perf.model import PiecewiseLinear
from sageserve.sim.bounds import (
    bounds_dict,
    bounds_work,
    describe_bounds,
    gpu_hour_bounds,
    peak_at_slo,
    tightest_bound,
)
from sageserve.sim.lower_bound import (
    ModelWork,
    RequestCost,
    WindowLoad,
    capacity_bound,
    cheapest_prefill_s_per_token,
    decode_support_line,
    solve_model,
)
from sageserve.sim.reference import REFERENCE_POLICY, REFERENCE_SETTING
from sageserve.sim.run import run_policies
from sageserve.sim.scenario import load_scenario, with_policy_settings

TINY = Path(__file__).parent / "fixtures" / "tiny"
MEASURED_DECODE = PiecewiseLinear(  # the bundled Llama-2-70B TP4 decode curve's shape
    (128.0, 256.0, 512.0, 16384.0, 32768.0), (0.0284, 0.0300, 0.0294, 0.0369, 0.0524)
)


@pytest.mark.parametrize(
    ("points", "max_tokens", "expected"),
    [
        ([(1.0, 0.5)], 100, 0.005),  # flat: the largest step is cheapest per token
        ([(100.0, 1.0), (1000.0, 4.0)], 2000, 1.0 / 250),  # extrapolated slope: 7/2000
        ([(100.0, 1.0), (1000.0, 4.0)], 500, 1.0 / 200),  # 2.333/500 vs 1/100
        ([(128.0, 0.05), (1024.0, 0.1), (16384.0, 1.7)], 16384, 0.1 / 1024),
    ],
)
def test_cheapest_prefill_is_the_least_seconds_per_token_of_any_allowed_step(
    points: list[tuple[float, float]], max_tokens: int, expected: float
) -> None:
    curve = PiecewiseLinear.from_points(points)
    got = cheapest_prefill_s_per_token(curve, max_tokens)
    grid = np.linspace(1, max_tokens, 4001)
    assert got == pytest.approx(min(expected, min(curve(x) / x for x in grid)), rel=1e-3)
    assert got <= min(curve(x) / x for x in grid) + 1e-12


@pytest.mark.parametrize(
    "curve",
    [
        PiecewiseLinear((0.0, 1000.0), (0.02, 0.04)),  # linear: the line is the curve
        PiecewiseLinear((128.0, 1000.0, 2000.0), (0.02, 0.021, 0.05)),  # convex kink
        PiecewiseLinear((128.0, 1000.0, 2000.0), (0.02, 0.04, 0.041)),  # concave
        MEASURED_DECODE,  # a dip, then extrapolation to the KV capacity
    ],
)
def test_the_decode_line_stays_under_the_curve_and_never_goes_negative(
    curve: PiecewiseLinear,
) -> None:
    kv = 40_000
    a, b = decode_support_line(curve, kv)
    assert a >= 0 and b >= 0
    for x in np.linspace(0, kv, 2001):
        assert a + b * x <= curve(float(x)) + 1e-12


def test_a_linear_decode_curve_is_its_own_line() -> None:
    assert decode_support_line(PiecewiseLinear((0.0, 1000.0), (0.02, 0.04)), 5000) == (
        pytest.approx(0.02),
        pytest.approx(2e-5),
    )


def test_request_cost_by_hand() -> None:
    cost = RequestCost(
        gpus=4, prefill_s_per_token=1e-4, iteration_s=0.02, context_s_per_token=1e-6,
        max_num_seqs=100,
    )  # fmt: skip
    prefill, decode = cost.gpu_seconds(prompt=1000, output=11)
    assert prefill == pytest.approx(4 * 1000 * 1e-4)
    # 10 iterations, each 0.02 s shared by 100 sequences plus 1,001 tokens of context
    assert decode == pytest.approx(4 * 10 * (0.02 / 100 + 1001 * 1e-6))
    assert cost.gpu_seconds(prompt=10, output=1)[1] == 0.0  # the prefill makes the only token


def work(arrived: dict[int, float], due: dict[int, float], minutes: int, floor: float = 0.0):
    a, d = np.zeros(minutes), np.zeros(minutes)
    for t, v in arrived.items():
        a[t] = v
    for t, v in due.items():
        d[t] = v
    return ModelWork(floor, a, d)


@pytest.mark.parametrize(
    ("w", "gpu_hours"),
    [
        # due as it arrives: 120 GPU-s in each of 3 minutes = 2 GPUs for 3 minutes
        (work({0: 120, 1: 120, 2: 120}, {0: 120, 1: 120, 2: 120}, 3), 6 / 60),
        # the floor holds when the work fits under it
        (work({0: 30}, {0: 30}, 3, floor=1.0), 3 / 60),
        # batch due in 10 minutes spreads over them: 600 GPU-s = 10 GPU-minutes, at the floor
        (work({0: 600}, {9: 600}, 10, floor=1.0), 10 / 60),
        # due in 5: 2 GPUs for 5 minutes, then the floor for 5
        (work({0: 600}, {4: 600}, 10, floor=1.0), 15 / 60),
        # due after the window: not required (the run may serve it in the unpaid drain)
        (work({0: 600}, {}, 10, floor=1.0), 10 / 60),
        # batch arriving with the minute-0 peak waits for the trough of minute 1 (at the floor
        # of 2 GPUs) instead of buying 2 more GPUs in minute 0 ...
        (work({0: 240, 2: 240}, {0: 120, 2: 360}, 3, floor=2.0), 8 / 60),
        # ... which it must buy when the same work is due at once
        (work({0: 240, 2: 240}, {0: 240, 2: 240}, 3, floor=2.0), 10 / 60),
    ],
)
def test_the_lp_moves_work_only_where_its_deadlines_allow(w: ModelWork, gpu_hours: float) -> None:
    assert solve_model(w) == pytest.approx(gpu_hours, abs=1e-9)


def token_load(arrived: dict[int, float], due: dict[int, float], minutes: int) -> WindowLoad:
    tw = work(arrived, due, minutes, floor=1.0)
    return WindowLoad({}, {}, {"m": tw}, {("m", "tp1"): 1, ("m", "tp4"): 4})


@pytest.mark.parametrize(
    ("peaks", "gpu_hours"),
    [
        # 1,200 tokens/s per GPU on TP4 (4,800 per instance) beats 1,000 on TP1: the
        # 120,000 interactive tokens of minute 0 take 100 GPU-s in it (100/60 GPUs), minute 1
        # sits at the floor of 1 GPU
        ({("m", "tp1"): 1000.0, ("m", "tp4"): 4800.0}, (100 / 60 + 1) / 60),
        # only TP1 measured: 120 GPU-s in minute 0
        ({("m", "tp1"): 1000.0}, (2 + 1) / 60),
        # a model no run measured keeps its peak-efficiency figure
        ({("other", "tp1"): 1000.0}, 0.5),
    ],
)
def test_the_capacity_bound_sizes_at_the_best_measured_tokens_per_gpu(
    peaks: dict[tuple[str, str], float], gpu_hours: float
) -> None:
    load = token_load({0: 120_000.0}, {0: 120_000.0}, 2)
    assert capacity_bound(load, peaks, {"m": 0.5}).gpu_hours == pytest.approx(gpu_hours)


def test_the_fleets_capacity_is_the_most_any_run_measured() -> None:
    runs = [
        {"capacity_at_slo_tps": {"m": {"tp4": 4000.0, "tp8": 5000.0}}},
        {"capacity_at_slo_tps": {"m": {"tp4": 4400.0}}},
        {},  # a scenario without a ScalingPolicy measures nothing
    ]
    assert peak_at_slo(runs) == {("m", "tp4"): 4400.0, ("m", "tp8"): 5000.0}


def test_bounds_are_printed_and_kept_in_the_summary() -> None:
    b = gpu_hour_bounds(load_scenario(TINY))
    d = bounds_dict(b)
    assert d["floor_gpu_hours"] <= d["lower_bound_gpu_hours"] + 1e-9
    text = describe_bounds(d)
    assert "lower bound" in text and "not a bound" in text
    older = {"floor_gpu_hours": 1.0, "oracle_gpu_hours": 2.0}  # a summary from before it
    assert "lower bound" not in describe_bounds(older)


@pytest.mark.slow
@pytest.mark.parametrize(("scale", "floor", "seed"), [(1.0, 0, 5), (2.0, 0, 6), (2.0, 1, 7)])
def test_no_run_that_keeps_its_slos_uses_fewer_gpu_hours_than_the_bound(
    scale: float, floor: int, seed: int
) -> None:
    sc = load_scenario(TINY)
    for md in sc.models:
        for region in md.spec.regions:
            region.min_instances = floor
    wl = sc.workload
    sc.workload = dataclasses.replace(
        wl,
        seed=seed,
        sources=[dataclasses.replace(s, rate_scale=scale) for s in wl.sources],
    )
    bw = bounds_work(sc)
    bound = bw.bounds.lower_bound_gpu_hours
    assert bound > 0
    cmp = run_policies(sc, ["reactive", "reactive-paper", "siloed", "lt-ua", "static", "chiron"])
    # the achievable reference: LT-UA with the realised future as its forecast
    ref = run_policies(with_policy_settings(sc, [REFERENCE_SETTING]), [REFERENCE_POLICY])
    runs = [*cmp.summary["policies"].values(), *ref.summary["policies"].values()]
    at_capacity = bounds_dict(bw.at_capacity(peak_at_slo(runs)))
    assert at_capacity["capacity_bound_gpu_hours"] >= bound - 1e-6
    kept = 0
    for row in [*cmp.table, *ref.table]:
        if all(v >= 1.0 for v in row["slo"].values()):
            kept += 1
            assert row["gpu_hours"] >= bound - 1e-6, row["policy"]
            assert row["gpu_hours"] >= tightest_bound(at_capacity) - 1e-3, row["policy"]
    assert kept >= 1  # the property was exercised
