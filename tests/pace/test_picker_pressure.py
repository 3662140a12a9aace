"""The endpoint picker's signals as pressure (`pace.pressure.picker_pressure`): one table
row at a time, then through the decision step. The picker's queue is read on the backlog's
scale, its saturation as it is, and the step reads the larger of the picker's and the
engines' pressure, never their sum."""

from __future__ import annotations

import pytest

from sageserve.core.snapshot import EndpointSnapshot, InstanceView, PickerSignals, Plan, Snapshot
from sageserve.core.types import ActionKind, EndpointKey
from sageserve.pace import make_strategy
from sageserve.pace.pressure import endpoint_pressure, picker_pressure
from sageserve.pace.step import StepState, decide

KEY = EndpointKey("m", "r")


def snap(
    picker: PickerSignals | None, waiting: int = 0, emu: float = 0.2, serving: int = 3
) -> EndpointSnapshot:
    views = tuple(InstanceView(f"i{i}", "v", emu * 1000, 1000) for i in range(serving))
    return EndpointSnapshot(
        KEY,
        1,
        10,
        {"v": serving},
        serving,
        views,
        waiting=waiting,
        variants=("v",),
        picker=picker,
    )


@pytest.mark.parametrize(
    ("signals", "serving", "want"),
    [
        (None, 3, 0.0),  # no picker read
        (PickerSignals(15), 3, 1.0),  # 5 waiting per instance: the level
        (PickerSignals(30), 3, 2.0),
        (PickerSignals(0, saturation=1.4), 3, 1.4),  # saturation as it is
        (PickerSignals(30, saturation=0.6), 3, 2.0),  # the larger of the two
        (PickerSignals(4, saturation=1.0), 0, 0.0),  # nothing serving: the floor rule's
        (PickerSignals(3, saturation=float("nan")), 3, 0.2),  # a NaN saturation is no reading
    ],
)
def test_each_picker_signal_on_the_pressure_scale(
    signals: PickerSignals | None, serving: int, want: float
) -> None:
    got, _ = picker_pressure(signals, serving)
    assert got == pytest.approx(want)


def test_the_step_reads_the_larger_of_engine_and_picker_pressure_not_their_sum() -> None:
    """Engines: 12 waiting on 3 instances (0.8 of the level); the picker counts the same 12
    (its queue mirrors theirs) and a saturation of 0.8: 0.8, not 1.6."""
    p = endpoint_pressure(snap(PickerSignals(12, saturation=0.8), waiting=12))
    assert (p.queue, p.picker, p.ratio) == pytest.approx((0.8, 0.8, 0.8))
    p = endpoint_pressure(snap(PickerSignals(45, saturation=0.8), waiting=12))
    assert p.ratio == pytest.approx(3.0) and p.picker > p.queue
    assert p.describe() == "endpoint picker: 45 waiting, 15.0 per instance"
    p = endpoint_pressure(snap(PickerSignals(3, saturation=1.25), waiting=3))
    assert p.describe() == "endpoint picker saturation 1.25"
    p = endpoint_pressure(snap(PickerSignals(3), waiting=30))  # the engines' backlog leads
    assert p.describe() == "30 waiting, 10.0 per instance"


@pytest.mark.parametrize("policy", ["reactive", "lt-utilization-arima"])
def test_a_queue_growing_at_the_picker_while_kv_stays_low_scales_out(policy: str) -> None:
    """KV at 20 % and 1 request in each engine's queue throughout; the picker's queue grows
    (flow control holds what the saturated pool cannot take). The engines alone show no
    reason to grow; with the picker's queue the endpoint scales out once it passes 5 per
    instance."""
    plan = Plan(0.0, {(KEY, "v"): 3}, {KEY: 100.0}, {KEY: 1000.0})
    strategy = make_strategy(policy)
    grown = []
    for held in (0, 6, 12):  # 3, 9, 15 waiting: 0.2, 0.6, 1.0 of the level
        view = snap(PickerSignals(3 + held), waiting=3)
        out = decide(10.0, Snapshot(10.0, {KEY: view}), plan, StepState(), strategy)
        grown.append([d.kind for d in out.decisions if d.kind is ActionKind.SCALE_OUT])
    assert grown == [[], [], []]  # at the level: not past the scale-out threshold yet
    busy = snap(PickerSignals(3 + 27), waiting=3)  # 10 per instance
    out = decide(10.0, Snapshot(10.0, {KEY: busy}), plan, StepState(), strategy)
    [d] = out.decisions
    assert d.kind is ActionKind.SCALE_OUT and d.replicas == {"v": 4}
    assert "endpoint picker: 30 waiting, 10.0 per instance" in d.reason
    unread = decide(10.0, Snapshot(10.0, {KEY: snap(None, 3)}), plan, StepState(), strategy)
    assert all(d.kind is not ActionKind.SCALE_OUT for d in unread.decisions)


def test_the_pickers_queue_brings_an_endpoint_back_from_zero() -> None:
    """Nothing serving, nothing coming, no router holding: the picker's queue is the demand
    (the activator pattern, through the gateway)."""
    empty = EndpointSnapshot(
        KEY, 0, 4, {"v": 0}, 0, (), variants=("v",), picker=PickerSignals(2, 1.0)
    )
    out = decide(0.0, Snapshot(0.0, {KEY: empty}), None, StepState(), make_strategy("reactive"))
    [d] = out.decisions
    assert (d.kind, d.replicas, d.reason) == (
        ActionKind.SCALE_OUT,
        {"v": 1},
        "from zero: 2 request(s) waiting",
    )
