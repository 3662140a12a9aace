"""The decision step: hold rules, from zero, cooldowns, the split over variants, drains."""

from __future__ import annotations

from dataclasses import replace

import pytest

from sageserve.core.snapshot import EndpointSnapshot, InstanceView, Plan, Snapshot
from sageserve.core.types import ActionKind, EndpointKey
from sageserve.pace import make_strategy
from sageserve.pace.base import simulation_only, sizes_pools
from sageserve.pace.step import StepState, decide, split_over_variants

KEY = EndpointKey("llama", "us-east")
REACTIVE = make_strategy("reactive")
LT_I = make_strategy("lt-immediate")


def inst(name: str, used: float, variant: str = "h100", cap: float = 100.0, waiting: int = 0):
    return InstanceView(name, variant, used, cap, waiting)


def endpoint(
    *instances: InstanceView,
    serving: int | None = None,
    replicas: dict[str, int] | None = None,
    waiting: int = 0,
    lo: int = 1,
    hi: int = 10,
) -> EndpointSnapshot:
    n = len(instances) if serving is None else serving
    return EndpointSnapshot(
        key=KEY,
        min_instances=lo,
        max_instances=hi,
        replicas=replicas if replicas is not None else {"h100": n},
        serving=n,
        instances=instances,
        waiting=waiting,
        variants=("h100", "a100"),
    )


def step(ep: EndpointSnapshot, t: float = 100.0, state: StepState | None = None, strategy=REACTIVE):
    return decide(t, Snapshot(t, {ep.key: ep}), None, state or StepState(), strategy)


def test_emu_weighs_each_instance_by_its_kv_capacity() -> None:
    ep = endpoint(inst("a", 90, cap=100), inst("b", 10, "a100", cap=900))
    assert ep.emu == pytest.approx(0.1)  # (90 + 10) / 1000, not the mean 0.46


@pytest.mark.parametrize(
    ("ep", "kind", "count"),
    [
        (endpoint(inst("a", 80), inst("b", 80)), ActionKind.SCALE_OUT, 1),
        (endpoint(inst("a", 10), inst("b", 10)), ActionKind.SCALE_IN, 1),
        (endpoint(inst("a", 50), inst("b", 50)), None, 0),
        # nothing serving, requests waiting: from zero (not "EMU 100 %" nor "EMU 0")
        (endpoint(serving=0, replicas={"h100": 0}, waiting=3, lo=0), ActionKind.SCALE_OUT, 1),
        # nothing serving, nothing waiting, floor 0: stays at zero
        (endpoint(serving=0, replicas={"h100": 0}, lo=0), None, 0),
        # below the floor: back to it, whatever the load
        (endpoint(inst("a", 10), lo=3), ActionKind.SCALE_OUT, 2),
        # a scale-in written (replicas 1) whose pod still serves: not taken again below
        # the floor (a slow controller-manager, a cooldown shorter than pod deletion)
        (endpoint(inst("a", 5), inst("b", 5), replicas={"h100": 1}), None, 0),
        # ... while an endpoint with room above its floor may still go on down
        (
            endpoint(inst("a", 5), inst("b", 5), inst("c", 5), replicas={"h100": 2}),
            ActionKind.SCALE_IN,
            1,
        ),
    ],
)
def test_one_step_per_endpoint(ep: EndpointSnapshot, kind: ActionKind | None, count: int) -> None:
    decisions = step(ep).decisions
    assert [(d.kind, d.count) for d in decisions] == ([(kind, count)] if kind else [])


def test_missing_data_holds_and_says_why() -> None:
    out = step(endpoint(serving=3, replicas={"h100": 3}))
    assert out.decisions == []
    assert [h.key for h in out.held] == [KEY]
    assert "none of 3" in out.held[0].reason


def test_partial_data_never_scales_in_but_may_scale_out() -> None:
    quiet = step(endpoint(inst("a", 5), serving=3, replicas={"h100": 3}))
    assert quiet.decisions == [] and "1 of 3" in quiet.held[0].reason
    busy = step(endpoint(inst("a", 95), serving=3, replicas={"h100": 3}))
    assert [d.kind for d in busy.decisions] == [ActionKind.SCALE_OUT]


def test_partial_data_is_reported_whatever_the_strategy_wanted_once_it_has_lasted() -> None:
    steady = endpoint(inst("a", 50), inst("b", 50), serving=3, replicas={"h100": 3})
    first = step(steady, t=100.0)
    assert [(h.reporting, h.serving, h.since, h.partial) for h in first.held] == [
        (2, 3, 100.0, True)
    ]
    assert "2 of 3" in first.held[0].reason
    # with a grace: silent at first (a new pod's first scrape), reported once it lasts
    snap = Snapshot(100.0, {KEY: steady})
    early = decide(100.0, snap, None, StepState(), REACTIVE, report_partial_after_s=30)
    assert early.held == [] and early.state.partial_since == {KEY: 100.0}
    later = decide(130.0, snap, None, early.state, REACTIVE, report_partial_after_s=30)
    assert [h.since for h in later.held] == [100.0]
    # every pod reports again: cleared, a scale-in follows at once
    quiet = endpoint(inst("a", 5), inst("b", 5), inst("c", 5))
    back = decide(131.0, Snapshot(131.0, {KEY: quiet}), None, later.state, REACTIVE, 30)
    assert back.held == [] and back.state.partial_since == {}
    assert [d.kind for d in back.decisions] == [ActionKind.SCALE_IN]


def test_partial_data_is_reported_during_a_cooldown_too() -> None:
    busy = endpoint(inst("a", 95), serving=3, replicas={"h100": 3})
    first = step(busy, t=0.0)
    assert first.decisions and first.held
    again = step(busy, t=1.0, state=first.state)  # in the cooldown: no action, still said
    assert again.decisions == [] and [h.key for h in again.held] == [KEY]


def test_missing_data_is_not_partial() -> None:
    out = step(endpoint(serving=3, replicas={"h100": 3}))
    assert [(h.reporting, h.serving, h.partial) for h in out.held] == [(0, 3, False)]


def test_cooldown_is_kept_in_the_state_the_caller_stores() -> None:
    first = step(endpoint(inst("a", 90)), t=0.0)
    assert first.decisions and first.state.last_event == {KEY: 0.0}
    assert step(endpoint(inst("a", 90)), t=14.9, state=first.state).decisions == []
    assert step(endpoint(inst("a", 90)), t=15.0, state=first.state).decisions


def test_no_scale_in_where_an_earlier_one_is_stuck_and_no_cooldown_is_spent_on_it() -> None:
    quiet = endpoint(inst("a", 10), inst("b", 10))
    stuck = step(replace(quiet, stuck_terminating=1), t=0.0)
    assert stuck.decisions == [] and stuck.state.last_event == {}
    busy = step(replace(endpoint(inst("a", 90), inst("b", 90)), stuck_terminating=1), t=0.0)
    assert [d.kind for d in busy.decisions] == [ActionKind.SCALE_OUT]
    # the stuck pod is gone a second later: the scale-in goes at once, no cooldown to wait
    freed = step(quiet, t=1.0, state=stuck.state)
    assert [d.kind for d in freed.decisions] == [ActionKind.SCALE_IN]


def test_scale_in_drains_the_least_loaded_instance() -> None:
    out = step(endpoint(inst("a", 20), inst("b", 5), inst("c", 10, waiting=1)))
    assert [d.drain for d in out.decisions] == [("b",)]


def test_the_plans_gpu_type_split_is_executed() -> None:
    plan = Plan(0.0, {(KEY, "h100"): 1, (KEY, "a100"): 3})
    ep = endpoint(inst("a", 10), replicas={"h100": 1, "a100": 0})
    out = decide(10.0, Snapshot(10.0, {KEY: ep}), plan, StepState(), LT_I)
    assert [d.replicas for d in out.decisions] == [{"a100": 3}]


def test_a_newer_plan_replaces_the_one_in_force_an_older_does_not() -> None:
    old, new = Plan(0.0, {(KEY, "h100"): 2}), Plan(10.0, {(KEY, "h100"): 5})
    state = decide(10.0, Snapshot(10.0, {}), new, StepState(), LT_I).state
    assert decide(11.0, Snapshot(11.0, {}), old, state, LT_I).state.plan == new


@pytest.mark.parametrize(
    ("kind", "count", "replicas", "targets", "expected"),
    [
        (
            ActionKind.SCALE_OUT,
            3,
            {"h100": 4, "a100": 1},
            {"h100": 5, "a100": 4},
            {"h100": 5, "a100": 3},
        ),
        (ActionKind.SCALE_OUT, 1, {"h100": 4, "a100": 6}, {}, {"h100": 5}),
        (ActionKind.SCALE_IN, 2, {"h100": 4, "a100": 6}, {}, {"a100": 4}),
        (ActionKind.SCALE_IN, 5, {"h100": 1}, {}, {"h100": 0}),
        (ActionKind.SCALE_OUT, 1, {}, {}, {"h100": 1}),
    ],
)
def test_split_over_variants(kind, count, replicas, targets, expected) -> None:  # type: ignore[no-untyped-def]
    assert split_over_variants(kind, count, replicas, ("h100", "a100"), targets) == expected


def test_the_api_enum_and_the_registry_name_the_same_strategies() -> None:
    from sageserve.api.scaling_policy import Strategy
    from sageserve.pace import available_strategies

    assert sorted(s.value for s in Strategy) == available_strategies()


@pytest.mark.parametrize(
    ("name", "refused", "pools"),
    [
        ("reactive", None, False),
        ("reactive-paper", None, False),
        ("siloed", "separate interactive and batch pod sets", False),
        ("static", "whole trace's peak", False),
        ("preserve", None, False),
        ("lt-immediate", None, True),
        ("lt-utilization", None, True),
        ("lt-utilization-arima", None, True),
    ],
)
def test_what_the_operator_runs_and_which_plans_size_pools_follow_from_the_strategy(
    name: str, refused: str | None, pools: bool
) -> None:
    strategy = make_strategy(name)
    why = simulation_only(strategy)
    assert (why is None) == (refused is None)
    if refused is not None:
        assert why is not None and refused in why and "sageserve simulate" in why
    assert sizes_pools(strategy) is pools
