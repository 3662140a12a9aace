"""Queue pressure (pace.pressure): the backlog and TTFT signals next to EMU, as tables.

Why: every strategy read EMU alone, so a queue that grew while the KV cache stayed low
(long prompts: prefill-bound instances) never scaled anything. The rule is a few pure
functions; these tables pin each one, then every strategy's reaction to it.
"""

from __future__ import annotations

import pytest

from sageserve.core.snapshot import EndpointSnapshot, InstanceView, Snapshot
from sageserve.core.types import ActionKind, EndpointKey, EndpointObservation
from sageserve.pace import make_strategy
from sageserve.pace.pressure import (
    QUEUE_SATURATION,
    Pressure,
    endpoint_pressure,
    load,
    queue_pressure,
    ttft_pressure,
)
from sageserve.pace.step import StepState, decide

KEY = EndpointKey("bloom-176b", "us-east")


@pytest.mark.parametrize(
    ("waiting", "serving", "want"),
    [
        (0, 2, 0.0),  # nothing waits
        (5, 1, 1.0),  # 5 per instance: saturated (the threshold)
        (10, 2, 1.0),
        (4, 2, 0.4),  # under the level
        (60, 2, 6.0),  # a growing backlog keeps growing the signal
        (7, 0, 0.0),  # nothing serves: the floor rule's business, not a ratio
    ],
)
def test_queue_pressure_is_waiting_per_instance_over_the_saturation_level(
    waiting: int, serving: int, want: float
) -> None:
    assert QUEUE_SATURATION == 5.0
    assert queue_pressure(waiting, serving) == pytest.approx(want)


@pytest.mark.parametrize(
    ("p95", "samples", "slo", "want"),
    [
        ({"iw-f": 0.8}, {"iw-f": 100}, {"iw-f": 1.0}, (0.0, "")),  # within the SLO
        ({"iw-f": 1.0}, {"iw-f": 100}, {"iw-f": 1.0}, (0.0, "")),  # exactly at it: met
        ({"iw-f": 2.5}, {"iw-f": 100}, {"iw-f": 1.0}, (2.5, "iw-f")),  # above: pressure
        ({"iw-f": 2.5}, {"iw-f": 19}, {"iw-f": 1.0}, (0.0, "")),  # too few first tokens
        ({"iw-f": 0.5, "iw-n": 120.0}, {"iw-f": 50, "iw-n": 50}, {"iw-f": 1.0, "iw-n": 60.0},
         (2.0, "iw-n")),  # the worst tier, each against its own SLO
        ({"niw": 900.0}, {"niw": 50}, {}, (0.0, "")),  # no TTFT SLO (batch): never
    ],
)  # fmt: skip
def test_ttft_pressure_counts_only_a_p95_above_the_tiers_slo(
    p95: dict[str, float],
    samples: dict[str, int],
    slo: dict[str, float],
    want: tuple[float, str],
) -> None:
    got = ttft_pressure(p95, samples, slo)
    assert got[0] == pytest.approx(want[0]) and got[1] == want[1]


def obs(emu: float, pressure: float = 0.0, serving: int = 2, prov: int = 0) -> EndpointObservation:
    return EndpointObservation(0.0, KEY, emu, serving, prov, 0, 2, 10, pressure=pressure)


@pytest.mark.parametrize(
    ("emu", "pressure", "want"),
    [
        (0.40, 0.0, 0.40),  # no queue: EMU alone, as before
        (0.40, 0.5, 0.40),  # a small queue below EMU's reading changes nothing
        (0.20, 0.5, 0.35),  # ... but holds a scale-in (0.35 > 0.30)
        (0.20, 1.0, 0.70),  # saturated: exactly the scale-out threshold
        (0.20, 2.0, 1.40),  # a growing backlog: well above it
        (0.95, 2.0, 1.40),
    ],
)
def test_load_is_the_largest_of_emu_and_the_pressure_on_emus_scale(
    emu: float, pressure: float, want: float
) -> None:
    assert load(obs(emu, pressure), 0.70) == pytest.approx(want)


@pytest.mark.parametrize(
    ("policy", "emu", "pressure", "want"),
    [
        ("reactive", 0.20, 0.0, ActionKind.SCALE_IN),  # quiet and no queue: shrink
        ("reactive", 0.20, 0.5, None),  # a queue forming: do not shrink onto it
        ("reactive", 0.20, 1.2, ActionKind.SCALE_OUT),  # backlog over saturation: grow
        ("reactive", 0.45, 0.0, None),
        ("reactive-paper", 0.20, 1.2, ActionKind.SCALE_IN),  # the paper's rule: EMU alone
        ("siloed", 0.20, 1.2, ActionKind.SCALE_OUT),
    ],
)
def test_reactive_strategies_scale_on_the_queue_as_on_emu(
    policy: str, emu: float, pressure: float, want: ActionKind | None
) -> None:
    action = make_strategy(policy).step(obs(emu, pressure, serving=3), None)
    assert (action.kind if action else None) is want
    if action is not None and pressure > 1:
        assert "waiting" in action.reason or "TTFT" in action.reason or "EMU" in action.reason


def test_capacity_on_its_way_takes_its_share_of_the_queue() -> None:
    """As for EMU (the HPA's convention): 2 serving + 2 coming, a backlog at 1.2x
    saturation of the serving ones projects to 0.6x: no third scale-out while they come."""
    reactive = make_strategy("reactive")
    assert reactive.step(obs(0.1, 1.2, serving=2, prov=2), None) is None
    action = reactive.step(obs(0.1, 2.5, serving=2, prov=2), None)
    assert action is not None and action.kind is ActionKind.SCALE_OUT


def snapshot(waiting: int, emu: float = 0.2, serving: int = 2, **kw: object) -> EndpointSnapshot:
    views = tuple(
        InstanceView(f"i{i}", "v", emu * 1000, 1000, waiting // serving) for i in range(serving)
    )
    return EndpointSnapshot(
        KEY, 2, 10, {"v": serving}, serving, views, waiting=waiting, variants=("v",), **kw
    )  # type: ignore[arg-type]


def test_endpoint_pressure_reads_the_snapshot_facts() -> None:
    assert endpoint_pressure(snapshot(0)) == Pressure(0.0, 0.0, 0, "")
    p = endpoint_pressure(snapshot(30))
    assert p.queue == pytest.approx(3.0) and p.ratio == pytest.approx(3.0)
    assert "30 waiting" in p.describe()
    slow = snapshot(
        0, ttft_p95_s={"iw-f": 3.0}, ttft_samples={"iw-f": 40}, ttft_slo_s={"iw-f": 1.0}
    )
    p = endpoint_pressure(slow)
    assert p.ttft == pytest.approx(3.0) and "iw-f TTFT" in p.describe()


@pytest.mark.parametrize("policy", ["reactive", "lt-utilization-arima"])
def test_decide_scales_out_a_backlog_that_emu_does_not_show(policy: str) -> None:
    """The stall in one step: KV at 20 %, 40 requests waiting on 2 instances, the plan's
    target at the floor. EMU alone holds (or shrinks); with the backlog the step grows."""
    from sageserve.core.snapshot import Plan

    plan = Plan(0.0, {(KEY, "v"): 2}, {KEY: 100.0}, {KEY: 1000.0})
    strategy = make_strategy(policy)
    quiet = decide(10.0, Snapshot(10.0, {KEY: snapshot(0)}), plan, StepState(), strategy)
    assert all(d.kind is not ActionKind.SCALE_OUT for d in quiet.decisions)
    busy = decide(10.0, Snapshot(10.0, {KEY: snapshot(40)}), plan, StepState(), strategy)
    [d] = busy.decisions
    assert d.kind is ActionKind.SCALE_OUT and d.replicas == {"v": 3}
    assert "40 waiting" in d.reason


@pytest.mark.parametrize(
    ("now", "saturated_at", "want"),
    [
        (1000.0, None, False),  # never saturated: EMU alone decides
        (1000.0, 999.0, True),  # a queue a second ago: no scale-in
        (1000.0, 701.0, True),  # still within the 300 s window
        (1000.0, 700.0, False),  # the window has passed
    ],
)
def test_scale_in_waits_for_the_stabilization_window_after_a_queue(
    now: float, saturated_at: float | None, want: bool
) -> None:
    from sageserve.pace.pressure import SCALE_IN_STABILIZATION_S, holds_scale_in

    assert SCALE_IN_STABILIZATION_S == 300.0
    assert holds_scale_in(now, saturated_at) is want


def test_decide_holds_the_scale_in_for_5_minutes_after_a_backlog() -> None:
    """The instance a queue brought stays while the queue may come back (no flapping): a
    backlog at t=0, gone at t=60 with EMU at 10 %; scale-in only from t=300 on."""
    reactive = make_strategy("reactive")
    key_state = decide(
        0.0, Snapshot(0.0, {KEY: snapshot(40, serving=3)}), None, StepState(), reactive
    )
    assert [d.kind for d in key_state.decisions] == [ActionKind.SCALE_OUT]
    state = key_state.state
    assert state.saturated_at == {KEY: 0.0}
    quiet = snapshot(0, emu=0.1, serving=4)
    for t in (60.0, 299.0):
        out = decide(t, Snapshot(t, {KEY: quiet}), None, state, reactive)
        assert out.decisions == [] and out.held == []
        state = out.state
    out = decide(300.0, Snapshot(300.0, {KEY: quiet}), None, state, reactive)
    assert [d.kind for d in out.decisions] == [ActionKind.SCALE_IN]


@pytest.mark.parametrize(("window", "first_scale_in"), [(60.0, 60.0), (0.0, 15.0), (600.0, 600.0)])
def test_the_policy_sets_how_long_a_scale_in_waits_after_a_backlog(
    window: float, first_scale_in: float
) -> None:
    """`spec.intervals.scaleInStabilizationSeconds`: the same backlog at t=0, quiet after;
    the first scale-in comes when the policy's window has passed, not at a fixed 300 s."""
    reactive = make_strategy("reactive")
    state = decide(
        0.0,
        Snapshot(0.0, {KEY: snapshot(40, serving=3)}),
        None,
        StepState(),
        reactive,
        scale_in_stabilization_s=window,
    ).state
    quiet = snapshot(0, emu=0.1, serving=4)
    first = None
    for t in range(15, 900, 15):
        out = decide(
            float(t),
            Snapshot(float(t), {KEY: quiet}),
            None,
            state,
            reactive,
            scale_in_stabilization_s=window,
        )
        state = out.state
        if out.decisions:
            assert [d.kind for d in out.decisions] == [ActionKind.SCALE_IN]
            first = float(t)
            break
    assert first == first_scale_in


# ---- batch deadline pressure --------------------------------------------------------------


@pytest.mark.parametrize(
    ("need", "serving", "theta", "want"),
    [
        (0.0, 2, 1000.0, 0.0),  # nothing due
        (1200.0, 2, 1000.0, 1.0),  # all of 2 × 1000 × 60 %: the scale-out threshold
        (1800.0, 2, 1000.0, 1.5),  # more than the trough release can give
        (600.0, 2, 1000.0, 0.5),
        (1800.0, 0, 1000.0, 0.0),  # nothing serves: the floor rule's business
        (1800.0, 2, 0.0, 0.0),  # θ unknown: no signal
    ],
)
def test_deadline_pressure_is_the_needed_rate_over_the_batch_capacity_below_60_percent(
    need: float, serving: int, theta: float, want: float
) -> None:
    from sageserve.pace.pressure import batch_capacity_tps, deadline_pressure

    capacity = batch_capacity_tps(serving, theta, 0.60)
    assert deadline_pressure(need, capacity) == pytest.approx(want)


def test_endpoint_pressure_names_the_batch_deadline_pressure() -> None:
    p = endpoint_pressure(snapshot(0, batch_need_tps=1800.0, batch_capacity_tps=1200.0))
    assert p.deadline == pytest.approx(1.5) and p.ratio == pytest.approx(1.5)
    assert p.describe() == "batch deadline pressure: 1800 tok/s needed, 1.5x batch capacity"
    # a larger backlog signal dominates the description
    p = endpoint_pressure(snapshot(30, batch_need_tps=600.0, batch_capacity_tps=1200.0))
    assert p.ratio == pytest.approx(3.0) and "30 waiting" in p.describe()


@pytest.mark.parametrize(
    ("need", "serving", "model_serving", "theta", "want"),
    [
        # the model's only endpoint: all of the need, against 2 × 1000 × 60 %
        (1800.0, 2, 2, 1000.0, (1800.0, 1200.0)),
        # 2 of the model's 6 serving instances: a third of the need, its own capacity
        (1800.0, 2, 6, 1000.0, (600.0, 1200.0)),
        # a count of the model's instances below this endpoint's (stale): all of it
        (1800.0, 4, 2, 1000.0, (1800.0, 2400.0)),
        (0.0, 2, 2, 1000.0, (0.0, 0.0)),  # nothing due: the snapshot is left as it was
        (1800.0, 0, 4, 1000.0, (0.0, 0.0)),  # nothing serves here: the floor rule's business
        (1800.0, 2, 2, 0.0, (0.0, 0.0)),  # θ unknown: no signal
    ],
)
def test_each_endpoint_takes_the_share_of_its_models_need_its_serving_instances_are(
    need: float, serving: int, model_serving: int, theta: float, want: tuple[float, float]
) -> None:
    from sageserve.pace.pressure import with_deadline_need

    snap = snapshot(0, serving=serving)
    got = with_deadline_need(snap, need, model_serving, theta, 0.60)
    assert (got.batch_need_tps, got.batch_capacity_tps) == pytest.approx(want)
    assert got.replicas == snap.replicas and got.serving == snap.serving


def test_every_endpoint_of_a_model_reads_the_same_deadline_ratio() -> None:
    """The queue is global per model: a share by serving instances puts every endpoint at
    the model's own need ÷ capacity, so a small region does not scale out alone."""
    from sageserve.pace.pressure import with_deadline_need

    east = with_deadline_need(snapshot(0, serving=1), 3000.0, 5, 1000.0, 0.6)
    west = with_deadline_need(snapshot(0, serving=4), 3000.0, 5, 1000.0, 0.6)
    assert endpoint_pressure(east).deadline == pytest.approx(1.0)
    assert endpoint_pressure(west).deadline == pytest.approx(1.0)


@pytest.mark.parametrize("policy", ["reactive", "lt-utilization-arima"])
def test_decide_scales_out_for_batch_its_deadlines_need(policy: str) -> None:
    """EMU at 20 % (the trough release keeps it under 60 %), no backlog at the instances,
    but the batch queue needs 1.5x what the trough release can give: the step grows, and
    says why."""
    from sageserve.core.snapshot import Plan

    plan = Plan(0.0, {(KEY, "v"): 2}, {KEY: 100.0}, {KEY: 1000.0})
    strategy = make_strategy(policy)
    fits = snapshot(0, batch_need_tps=600.0, batch_capacity_tps=1200.0)
    quiet = decide(10.0, Snapshot(10.0, {KEY: fits}), plan, StepState(), strategy)
    assert all(d.kind is not ActionKind.SCALE_OUT for d in quiet.decisions)
    due = snapshot(0, batch_need_tps=1800.0, batch_capacity_tps=1200.0)
    busy = decide(10.0, Snapshot(10.0, {KEY: due}), plan, StepState(), strategy)
    [d] = busy.decisions
    assert d.kind is ActionKind.SCALE_OUT and d.replicas == {"v": 3}
    assert "batch deadline pressure: 1800 tok/s needed" in d.reason
