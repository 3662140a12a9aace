"""Request-level switching on a pool of sleep-mode engines: which pod, what to put to sleep,
what has been idle too long (`dispatch.pool_switch`), as tables."""

from __future__ import annotations

import pytest

from sageserve.dispatch.pool_switch import (
    EngineState,
    WakePlan,
    choose_pod,
    idle_models,
    plan_wake,
)

AWAKE = EngineState(awake=True)


def awake(last_used: float, busy: int = 0) -> EngineState:
    return EngineState(awake=True, busy=busy, last_used=last_used)


WAKING = EngineState(awake=False, switching=True)


@pytest.mark.parametrize(
    ("engines", "quota", "expected"),
    [
        pytest.param({}, 2, WakePlan("m", wake=True), id="empty-pod-wakes"),
        pytest.param({"m": awake(5)}, 1, WakePlan("m", wake=False), id="awake-nothing-to-do"),
        pytest.param({"a": awake(1)}, 2, WakePlan("m", wake=True), id="free-slot"),
        pytest.param(
            {"a": awake(3), "b": awake(1)},
            2,
            WakePlan("m", wake=True, sleep=("b",)),
            id="full-lru-idle-sleeps-first",
        ),
        pytest.param(
            {"a": awake(3), "b": awake(1, busy=2)},
            2,
            WakePlan("m", wake=True, sleep=("a",)),
            id="busy-model-is-never-put-to-sleep",
        ),
        pytest.param(
            {"a": awake(3, busy=1), "b": awake(1, busy=1)},
            2,
            WakePlan("m", wake=False, wait=True),
            id="every-awake-model-busy-waits",
        ),
        pytest.param(
            {"a": awake(3), "b": WAKING},
            2,
            WakePlan("m", wake=True, sleep=("a",)),
            id="a-waking-model-holds-its-slot",
        ),
        pytest.param(
            {"m": WAKING, "a": awake(1)},
            2,
            WakePlan("m", wake=False, wait=True),
            id="being-woken-by-another-request-waits",
        ),
        pytest.param(
            {"a": awake(4), "b": awake(2), "c": awake(3)},
            2,
            WakePlan("m", wake=True, sleep=("b", "c")),
            id="over-quota-after-a-quota-cut-sleeps-enough",
        ),
        pytest.param(
            {"m": EngineState(last_used=9), "a": awake(1)},
            1,
            WakePlan("m", wake=True, sleep=("a",)),
            id="asleep-model-state-is-ignored",
        ),
    ],
)
def test_plan_wake(engines: dict[str, EngineState], quota: int, expected: WakePlan) -> None:
    assert plan_wake(engines, "m", quota) == expected


def test_plan_wake_refuses_a_quota_below_one() -> None:
    with pytest.raises(ValueError, match="quota"):
        plan_wake({}, "m", 0)


@pytest.mark.parametrize(
    ("pods", "load", "expected"),
    [
        pytest.param([], None, None, id="no-pod"),
        pytest.param(
            [("p0", {"a": awake(1), "b": awake(2)}), ("p1", {"m": awake(1)})],
            {"p1": 900.0},
            "p1",
            id="awake-beats-less-loaded",
        ),
        pytest.param(
            [("p0", {"m": awake(1)}), ("p1", {"m": awake(1)})],
            {"p0": 50.0, "p1": 10.0},
            "p1",
            id="among-awake-the-least-loaded",
        ),
        pytest.param(
            [("p0", {"a": awake(1), "b": awake(2)}), ("p1", {"m": WAKING})],
            None,
            "p1",
            id="waking-beats-a-new-switch",
        ),
        pytest.param(
            [("p0", {"a": awake(1), "b": awake(2)}), ("p1", {"a": awake(1)})],
            None,
            "p1",
            id="free-slot-beats-eviction",
        ),
        pytest.param(
            [
                ("p0", {"a": awake(1, busy=1), "b": awake(2, busy=1)}),
                ("p1", {"a": awake(1), "b": awake(2)}),
            ],
            None,
            "p1",
            id="eviction-beats-waiting",
        ),
        pytest.param(
            [("p1", {"a": awake(1, busy=1)}), ("p0", {"a": awake(1, busy=1)})],
            None,
            "p0",
            id="all-busy-by-name",
        ),
    ],
)
def test_choose_pod(
    pods: list[tuple[str, dict[str, EngineState]]],
    load: dict[str, float] | None,
    expected: str | None,
) -> None:
    assert choose_pod(pods, "m", 2, load) == expected


def test_choose_pod_with_every_awake_model_busy_takes_the_least_loaded_to_wait_on() -> None:
    pods = [("p0", {"a": awake(1, busy=1)}), ("p1", {"b": awake(1, busy=3)})]
    assert choose_pod(pods, "m", 1, {"p0": 80.0, "p1": 20.0}) == "p1"
    assert plan_wake(pods[1][1], "m", 1).wait


@pytest.mark.parametrize(
    ("engines", "now", "expected"),
    [
        pytest.param({"a": awake(0), "b": awake(50)}, 60, ["a"], id="only-past-the-limit"),
        pytest.param({"a": awake(0), "b": awake(-10)}, 60, ["b", "a"], id="oldest-first"),
        pytest.param({"a": awake(0, busy=1)}, 600, [], id="busy-never"),
        pytest.param({"a": EngineState(last_used=0)}, 600, [], id="asleep-already"),
        pytest.param(
            {"a": EngineState(awake=True, switching=True)}, 600, [], id="mid-switch-never"
        ),
        pytest.param({"a": awake(0)}, 60 - 1e-6, [], id="just-under"),
    ],
)
def test_idle_models(engines: dict[str, EngineState], now: float, expected: list[str]) -> None:
    assert idle_models(engines, now, 60.0) == expected
