"""LT-I, LT-U and LT-UA: table tests of when each moves toward the hourly target."""

from __future__ import annotations

import pytest

from sageserve.core.snapshot import EndpointPlan
from sageserve.core.types import ActionKind, EndpointKey, EndpointObservation
from sageserve.pace import make_strategy
from sageserve.pace.longterm import LongTerm

#: A strategy with the endpoint's share of the plan in force.
Planned = tuple[LongTerm, EndpointPlan | None]

KEY = EndpointKey("llama-2-70b", "us-east")
OUT, IN = ActionKind.SCALE_OUT, ActionKind.SCALE_IN


def obs(
    time: float = 100.0,
    emu: float = 0.5,
    serving: int = 10,
    provisioning: int = 0,
    tps: float = 1000.0,
    lo: int = 2,
    hi: int = 40,
) -> EndpointObservation:
    return EndpointObservation(
        time=time,
        key=KEY,
        emu=emu,
        serving=serving,
        provisioning=provisioning,
        draining=0,
        min_instances=lo,
        max_instances=hi,
        tokens_per_s=tps,
    )


def planned(
    name: str, target: int, forecast: float = 1000.0, theta: float | None = None
) -> Planned:
    strategy = make_strategy(name)
    assert isinstance(strategy, LongTerm)
    return strategy, EndpointPlan(0.0, target, forecast, theta)


def decision(p: Planned, o: EndpointObservation) -> tuple[ActionKind, int] | None:
    action = p[0].step(o, p[1])
    return (action.kind, action.count) if action else None


@pytest.mark.parametrize(
    ("target", "o", "expected"),
    [
        (15, obs(), (OUT, 5)),  # the whole difference at once, whatever the EMU
        (4, obs(emu=0.9), (IN, 6)),
        (10, obs(), None),
        (60, obs(), (OUT, 30)),  # capped at maxInstances
        (0, obs(), (IN, 8)),  # floored at minInstances
        (15, obs(serving=10, provisioning=5), None),  # instances on their way count
    ],
)
def test_lt_immediate(target: int, o: EndpointObservation, expected: tuple | None) -> None:
    assert decision(planned("lt-i", target), o) == expected


@pytest.mark.parametrize(
    ("target", "o", "expected"),
    [
        (15, obs(emu=0.8), (OUT, 1)),  # one step, only above 70 %
        (15, obs(emu=0.6), None),
        (10, obs(emu=0.99), None),  # target reached: a burst is not followed
        (4, obs(emu=0.2), (IN, 1)),
        (4, obs(emu=0.4), None),
        (4, obs(emu=0.2, serving=9, provisioning=1), None),  # never in while coming up
        (15, obs(emu=0.8, serving=10, provisioning=5), None),
    ],
)
def test_lt_utilization(target: int, o: EndpointObservation, expected: tuple | None) -> None:
    assert decision(planned("lt-u", target), o) == expected


LAST_20_MIN = 3600 - 600  # 50 minutes into the hour


@pytest.mark.parametrize(
    ("target", "o", "expected"),
    [
        (10, obs(time=LAST_20_MIN, tps=6000.0), (OUT, 1)),  # ≥ 5x forecast, target reached
        (10, obs(time=600, tps=6000.0), None),  # same gap, but not in the last 20 min
        (10, obs(time=LAST_20_MIN, tps=4000.0), None),  # 4x is not enough
        (10, obs(time=LAST_20_MIN, tps=400.0, emu=0.5), (IN, 1)),  # ≤ 0.5x: keep going down
        (10, obs(time=LAST_20_MIN, tps=600.0, emu=0.5), None),
        (10, obs(time=LAST_20_MIN, tps=400.0, provisioning=1, serving=9), None),
        (15, obs(time=LAST_20_MIN, tps=6000.0, emu=0.5), None),  # target not reached yet
        (15, obs(time=LAST_20_MIN, emu=0.8), (OUT, 1)),  # LT-U rule still applies
        (10, obs(time=LAST_20_MIN, tps=60000.0, serving=40), None),  # at maxInstances
        # traffic steps need utilisation on their side: no flapping of quiet endpoints
        (10, obs(time=LAST_20_MIN, tps=6000.0, emu=0.2), None),  # 5x of little, idle
        (10, obs(time=LAST_20_MIN, tps=400.0, emu=0.75), None),  # 0.5x but busy
        # the valve: past the target above 90 % EMU, at any time of the hour
        (10, obs(time=600, emu=0.95), (OUT, 1)),
        (10, obs(time=600, emu=0.95, serving=40), None),  # not past maxInstances
        (10, obs(time=600, emu=0.85), None),
    ],
)
def test_lt_utilization_arima(target: int, o: EndpointObservation, expected: tuple | None) -> None:
    assert decision(planned("lt-ua", target), o) == expected


def test_lt_ua_sizes_a_traffic_step_by_what_one_instance_serves() -> None:
    # target at the floor (2) for a forecast of almost nothing; θ = 2,000 tokens/s each
    strategy = planned("lt-ua", 2, 100.0, 2000.0)
    quiet = obs(time=LAST_20_MIN, serving=2, tps=900.0)  # 9x the forecast, half of 1 instance
    assert decision(strategy, quiet) is None
    busy = obs(time=LAST_20_MIN + 60, serving=2, tps=5000.0)  # needs ⌈5000/2000⌉ = 3
    assert decision(strategy, busy) == (OUT, 1)
    assert decision(strategy, obs(time=LAST_20_MIN + 120, serving=3, tps=5000.0)) is None
    # without θ (a plan recorded before it existed) the proportional rule still applies
    legacy = planned("lt-ua", 2, forecast=100.0)
    assert decision(legacy, obs(time=LAST_20_MIN, serving=2, tps=900.0)) == (OUT, 1)


def test_lt_ua_scales_in_to_what_the_observed_load_needs() -> None:
    strategy = planned("lt-ua", 10, 10_000.0, 1000.0)
    assert decision(strategy, obs(time=LAST_20_MIN, tps=4000.0, emu=0.5)) == (IN, 1)
    assert decision(strategy, obs(time=LAST_20_MIN + 60, serving=4, tps=4000.0, emu=0.5)) is None


def test_lt_u_has_no_valve_and_lt_ua_s_valve_can_be_turned_off() -> None:
    assert decision(planned("lt-u", 10), obs(emu=0.99)) is None
    off = make_strategy("lt-ua", {"overload_emu": 1.0})
    assert isinstance(off, LongTerm)
    assert decision((off, EndpointPlan(0.0, 10, 1000.0)), obs(time=600, emu=0.99)) is None


def test_no_plan_means_no_action() -> None:
    strategy = make_strategy("lt-utilization-arima")
    assert strategy.step(obs(emu=0.99), None) is None


def test_only_lt_immediate_is_evaluated_every_pace_period() -> None:
    assert make_strategy("lt-immediate").periodic
    assert not make_strategy("lt-u").periodic
    assert all(make_strategy(n).plan_cadence.plans for n in ("lt-i", "lt-u", "lt-ua"))


def test_strategies_are_built_by_their_policy_names_with_paper_parameters() -> None:
    strategy = make_strategy("lt-utilization-arima", {"gap_window_s": 600})
    assert isinstance(strategy, LongTerm)
    assert strategy.params.gap_window_s == 600
    assert strategy.params.gap_scale_up_ratio == 5.0
    assert strategy.params.scale_out_above == 0.7
