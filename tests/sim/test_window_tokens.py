"""PreServe's window plan in the simulator reads what the operator's window loop reads: per
served (model, region) and minute, prompt and generated tokens/s of all traffic and batch
tokens/s served, split by `plan.preserve.window_inputs` (PreServe §4.1, Alg. 2)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from sageserve.core.snapshot import Plan
from sageserve.plan.preserve import BATCH_MINUTES, plan_window, window_inputs
from sageserve.sim.engine import Simulation
from sageserve.sim.scenario import load_scenario
from sageserve.sim.window_tokens import WindowTokens

TINY = Path(__file__).parent / "fixtures" / "tiny"
EAST, WEST = ("m", "us-east"), ("m", "us-west")


def test_each_minute_closes_with_tokens_per_second_for_every_key() -> None:
    wt = WindowTokens()
    wt.count(EAST, 600, 1200, batch=False)
    wt.count(EAST, 60, 60, batch=True)
    wt.roll([EAST])
    wt.count(WEST, 120, 0, batch=True)  # a key served for the first time in minute 2
    wt.roll([EAST])
    assert wt.minutes == 2
    assert wt.prompt == {EAST: [11.0, 0.0], WEST: [0.0, 2.0]}
    assert wt.decode == {EAST: [21.0, 0.0], WEST: [0.0, 0.0]}
    assert wt.batch == {EAST: [2.0, 0.0], WEST: [0.0, 2.0]}  # one total, prompt + output


@pytest.mark.parametrize(
    ("prompt", "decode", "batch", "expected"),
    [
        # batch out of the minute's traffic in its prompt : generated share (3 : 1)
        ([300.0], [100.0], [40.0], ([270.0], [90.0], [30.0], [10.0])),
        # no batch counted for the key: all of it interactive, no β
        ([300.0], [100.0], None, ([300.0], [100.0], None, None)),
    ],
)
def test_window_inputs_take_batch_out_of_the_traffic(
    prompt: list[float],
    decode: list[float],
    batch: list[float] | None,
    expected: tuple[list[float], list[float], list[float] | None, list[float] | None],
) -> None:
    p, d, bp, bd = window_inputs(
        {EAST: prompt}, {EAST: decode}, {EAST: batch} if batch is not None else {}
    )
    assert (p[EAST], d[EAST], bp.get(EAST), bd.get(EAST)) == expected


def test_beta_is_the_last_hour_of_batch_however_long_the_history() -> None:
    minutes = 150
    batch = [100.0] * (minutes - BATCH_MINUTES) + [20.0] * BATCH_MINUTES
    p, _, bp, _ = window_inputs({EAST: [1000.0] * minutes}, {EAST: [0.0] * minutes}, {EAST: batch})
    assert bp[EAST] == [20.0] * BATCH_MINUTES
    assert p[EAST][:2] == [900.0, 900.0] and p[EAST][-1] == 980.0


def test_the_simulators_window_plan_is_the_operators_function_on_the_runs_counts() -> None:
    """Every window plan of a `preserve` run equals `plan_window` over `window_inputs` of the
    counts the run made (served region, all tiers, batch served), the call the operator's
    window loop makes on Prometheus' counts."""
    sc = load_scenario(TINY)
    strategy = sc.strategy("preserve")
    cfg = sc.sim_config()
    inner = sc.planner_for(strategy)
    assert sc.policy is not None
    seen: list[tuple[Plan, Plan, int]] = []

    def planner(*args: Any, tokens: WindowTokens | None = None, **kwargs: Any) -> Plan:
        assert tokens is not None, "a preserve run hands its counts to the window planner"
        plan = inner(*args, tokens=tokens, **kwargs)
        now, current = args[0], args[3]
        expected = plan_window(
            sc.models,
            sc.policy.spec,
            *window_inputs(tokens.prompt, tokens.decode, tokens.batch),
            current,
        ).in_force(now)
        seen.append((plan, expected, sum(map(sum, tokens.prompt.values()))))
        return plan

    Simulation(cfg, strategy, sc.requests(), None, planner, sc.history(cfg.history_minutes)).run()
    assert seen
    for plan, expected, _ in seen:
        assert plan == expected
    assert all(counted > 0 for *_, counted in seen)  # the run's traffic, not an empty series
