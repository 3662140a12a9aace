"""The event queue every simulated world shares: its order, its bounds, its staleness rule."""

from __future__ import annotations

import math

import pytest

from sageserve.sim.events import INSTANCE, EventQueue, fire, is_stale


@pytest.mark.parametrize(
    ("pushes", "order"),
    [
        # time first
        ([(3.0, 0, "c"), (1.0, 0, "a"), (2.0, 0, "b")], ["a", "b", "c"]),
        # ties in push order
        ([(1.0, 0, "x"), (1.0, 0, "y"), (1.0, 0, "z")], ["x", "y", "z"]),
        # kind takes no part: a higher kind pushed first runs first
        ([(5.0, 2, "call"), (5.0, 1, "ready"), (5.0, 0, "inst")], ["call", "ready", "inst"]),
        # ties stay in push order among earlier and later times
        (
            [(2.0, 0, "b1"), (1.0, 1, "a"), (2.0, 1, "b2"), (0.5, 2, "first"), (2.0, 0, "b3")],
            ["first", "a", "b1", "b2", "b3"],
        ),
        # objects that cannot be compared never are
        ([(1.0, 0, {"k": 1}), (1.0, 0, {"k": 2})], [{"k": 1}, {"k": 2}]),
    ],
)
def test_events_run_by_time_then_push_order(
    pushes: list[tuple[float, int, object]], order: list[object]
) -> None:
    q = EventQueue()
    for when, kind, obj in pushes:
        q.push(when, kind, obj)
    assert [obj for _, _, _, obj in q.pop_due(math.inf)] == order
    assert not q


@pytest.mark.parametrize(
    ("until", "due", "left"),
    [
        (0.5, [], 3),
        (1.0, ["a"], 2),  # an event at exactly `until` is due
        (1.5, ["a"], 2),
        (2.0, ["a", "b"], 1),
        (10.0, ["a", "b", "c"], 0),
    ],
)
def test_pop_due_stops_at_the_bound(until: float, due: list[str], left: int) -> None:
    q = EventQueue()
    for when, name in ((2.0, "b"), (1.0, "a"), (3.0, "c")):
        q.push(when, 0, name)
    assert [e[3] for e in q.pop_due(until)] == due
    assert len(q) == left
    assert q.peek_time() == {3: 1.0, 2: 2.0, 1: 3.0, 0: math.inf}[left]


def test_events_pushed_while_popping_run_when_due_by_the_bound() -> None:
    q = EventQueue()
    q.push(1.0, 0, "a")
    seen = []
    for when, _, _, obj in q.pop_due(2.0):
        seen.append(obj)
        if obj == "a":
            q.push(when, 0, "same time")  # after everything already due at 1.0
            q.push(1.5, 0, "before the bound")
            q.push(2.5, 0, "after the bound")
    assert seen == ["a", "same time", "before the bound"]
    assert q.peek_time() == 2.5


def test_schedule_pushes_an_instance_event() -> None:
    q = EventQueue()
    q.push(1.0, 2, "call")
    q.schedule("inst", 1.0)
    assert q.pop() == (1.0, 1, 2, "call")
    assert q.pop() == (1.0, 2, INSTANCE, "inst")
    assert q.seq == 2
    with pytest.raises(IndexError):
        q.pop()


class _Inst:
    def __init__(self, event_time: float) -> None:
        self.event_time = event_time
        self.updates: list[float] = []

    def update(self, now: float) -> None:
        self.updates.append(now)


@pytest.mark.parametrize(
    ("event_time", "popped_at", "fired", "event_time_after"),
    [
        (4.0, 4.0, True, math.inf),  # the instance's pending event: consumed, then updated
        (6.0, 4.0, False, 6.0),  # rescheduled later since: stale, nothing happens
        (2.0, 4.0, False, 2.0),  # rescheduled earlier since: stale
        (math.inf, 4.0, False, math.inf),  # nothing pending (already fired): stale
    ],
)
def test_an_instance_event_is_stale_once_the_instance_rescheduled(
    event_time: float, popped_at: float, fired: bool, event_time_after: float
) -> None:
    inst = _Inst(event_time)
    assert is_stale(inst, popped_at) is not fired
    assert fire(inst, popped_at) is fired
    assert inst.updates == ([popped_at] if fired else [])
    assert inst.event_time == event_time_after


def test_a_rescheduled_instance_runs_once_at_its_latest_time() -> None:
    q = EventQueue()
    inst = _Inst(math.inf)
    for when in (5.0, 3.0, 4.0):  # the instance moves its one pending event twice
        inst.event_time = when
        q.schedule(inst, when)
    for when, _, kind, obj in q.pop_due(10.0):
        assert kind == INSTANCE and obj is inst
        fire(inst, when)
    assert inst.updates == [4.0]
