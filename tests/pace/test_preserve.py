"""PreServe's scaler (PreServe §4.1, §4.3.2): window sizing, in-window overload and
scale-down arithmetic, and the strategy through the decision step the operator calls."""

from __future__ import annotations

import pytest

from sageserve.api.scaling_policy import ScalingPolicySpec
from sageserve.core.snapshot import EndpointSnapshot, InstanceView, Plan, Snapshot
from sageserve.core.types import ActionKind, EndpointKey
from sageserve.dispatch.anticipator import LoadAnticipator
from sageserve.pace import make_strategy
from sageserve.pace.base import PlanCadence, PlanSource
from sageserve.pace.from_policy import strategy_for
from sageserve.pace.preserve import (
    Preserve,
    PreserveParams,
    overloaded,
    overloaded_count,
    shrink_to,
)
from sageserve.pace.step import StepState, decide
from sageserve.plan.preserve import ServiceRates, window_instances, window_means

KEY = EndpointKey("llama", "us-east")
PRESERVE = make_strategy("preserve")


# ---- N = max(P̂/μ_p, D̂/μ_d, (P̂+D̂)/μ_t) -------------------------------------------------


@pytest.mark.parametrize(
    ("p", "d", "rates", "n"),
    [
        # prompt-bound: 9000/1000 = 9 > 1000/500 = 2, 10000/2000 = 5
        (9000.0, 1000.0, ServiceRates(2000.0, 1000.0, 500.0), 9),
        # decode-bound: 3000/500 = 6 > 1000/1000, 4000/2000
        (1000.0, 3000.0, ServiceRates(2000.0, 1000.0, 500.0), 6),
        # hybrid-bound: (900 + 900)/1000 = 1.8 > 900/1000, 900/1000 -> 2
        (900.0, 900.0, ServiceRates(1000.0, 1000.0, 1000.0), 2),
        # exact multiples are not rounded up
        (2000.0, 0.0, ServiceRates(1000.0, 500.0, 500.0), 4),
        # μ_p, μ_d unknown: μ_t alone
        (9000.0, 1000.0, ServiceRates(2000.0), 5),
        # nothing coming: 0 (the caller clamps to minInstances)
        (0.0, 0.0, ServiceRates(2000.0, 1000.0, 500.0), 0),
        # a negative forecast is no demand
        (-50.0, 100.0, ServiceRates(100.0), 1),
    ],
)
def test_window_instances(p: float, d: float, rates: ServiceRates, n: int) -> None:
    assert window_instances(p, d, rates) == n


def test_window_instances_needs_a_rate() -> None:
    with pytest.raises(ValueError, match="μ_t"):
        window_instances(1.0, 1.0, ServiceRates(0.0))


@pytest.mark.parametrize(
    ("minutes", "window_s", "means"),
    [
        ([1.0] * 20, 600.0, [1.0, 1.0]),
        # a partial window at the start is dropped; the last window ends now
        ([9.0, 9.0] + [1.0] * 10 + [3.0] * 10, 600.0, [1.0, 3.0]),
        ([1.0, 2.0, 3.0], 600.0, []),
        ([2.0, 4.0], 60.0, [2.0, 4.0]),
    ],
)
def test_window_means(minutes: list[float], window_s: float, means: list[float]) -> None:
    assert window_means(minutes, window_s) == pytest.approx(means)


# ---- overload and scale-down ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("above", "expected"),
    [(0, False), (10, False), (11, True), (100, True)],  # "more than 10 %" of 100 iterations
)
def test_overloaded_is_more_than_the_share_above_the_level(above: int, expected: bool) -> None:
    projection = [0.99] * above + [0.5] * (100 - above)
    assert overloaded(projection, 0.95, 0.10) is expected


def test_overloaded_agrees_with_the_anticipator() -> None:
    """The test on a projection that travelled through a snapshot is the anticipator's own."""
    ant = LoadAnticipator(1000)
    ant.enqueue(1, 900, 200)  # 900 + i tokens: above 950 from the 51st iteration
    projection = ant.projection(0)
    for level, share in [(0.95, 0.10), (0.95, 0.6), (0.5, 0.5), (0.99, 0.0)]:
        assert overloaded(projection, level, share) is ant.overloaded(0, level, share)


def test_overloaded_count_counts_instances() -> None:
    hot, cool = [1.0] * 100, [0.4] * 100
    assert overloaded_count([hot, cool, hot]) == 2
    assert overloaded_count([]) == 0
    assert overloaded_count([()]) == 0  # an instance with no projection is not overloaded


@pytest.mark.parametrize(
    ("peaks", "goal"),
    [
        ([0.1, 0.1, 0.1], 1),  # Σ 0.3 / 0.3 = 1
        ([0.2, 0.2, 0.2], 2),  # Σ 0.6 / 0.3 = 2
        ([0.25, 0.25, 0.2, 0.0], 3),  # 0.7 / 0.3 = 2.33 -> 3
        ([0.0, 0.0], 1),  # never below one instance
        ([0.1, 0.3], None),  # one instance reaches T_f: no scale-down
        ([], None),
    ],
)
def test_shrink_to(peaks: list[float], goal: int | None) -> None:
    projections = [[p / 2, p] for p in peaks]  # the peak is what counts
    assert shrink_to(projections, 0.30) == goal


# ---- the strategy through the decision step (what the operator calls) ----------------------


def view(name: str, projection: tuple[float, ...], used: float = 50.0) -> InstanceView:
    return InstanceView(name, "h100", used, 100.0, 0, projection)


def endpoint(
    *instances: InstanceView, replicas: int | None = None, hi: int = 10
) -> EndpointSnapshot:
    n = len(instances)
    return EndpointSnapshot(
        key=KEY,
        min_instances=1,
        max_instances=hi,
        replicas={"h100": n if replicas is None else replicas},
        serving=n,
        instances=instances,
        variants=("h100",),
    )


def plan(at: float, target: int) -> Plan:
    return Plan(at, {(KEY, "h100"): target})


def run(ep: EndpointSnapshot, t: float, state: StepState, new_plan: Plan | None = None):
    return decide(t, Snapshot(t, {KEY: ep}), new_plan, state, PRESERVE)


HOT = (1.0,) * 100
WARM = (0.6,) * 100
COOL = (0.1,) * 100


def test_window_boundary_moves_to_the_forecast_size_at_once() -> None:
    out = run(endpoint(view("a", WARM), view("b", WARM)), 0.0, StepState(), plan(0.0, 5))
    assert [(d.kind, d.count, dict(d.replicas)) for d in out.decisions] == [
        (ActionKind.SCALE_OUT, 3, {"h100": 5})
    ]
    assert "window target 5" in out.decisions[0].reason


def test_window_boundary_shrinks_by_draining_the_least_loaded() -> None:
    ep = endpoint(view("a", WARM, 60.0), view("b", WARM, 10.0), view("c", WARM, 30.0))
    out = run(ep, 0.0, StepState(), plan(0.0, 1))
    d = out.decisions[0]
    assert (d.kind, d.count, d.drain) == (ActionKind.SCALE_IN, 2, ("b", "c"))


def test_in_window_one_instance_per_projected_overloaded_instance() -> None:
    three = endpoint(view("a", WARM), view("b", WARM), view("c", WARM))
    state = run(three, 0.0, StepState(), plan(0.0, 3)).state  # at target: nothing to do
    ep = endpoint(view("a", HOT), view("b", HOT), view("c", WARM))
    out = run(ep, 60.0, state)
    assert [(d.kind, d.count) for d in out.decisions] == [(ActionKind.SCALE_OUT, 2)]
    assert "projected above 95%" in out.decisions[0].reason
    # and not undone by the window plan on the next step: the window's move is done
    ep2 = endpoint(
        view("a", WARM), view("b", WARM), view("c", WARM), view("d", WARM), view("e", WARM)
    )
    assert run(ep2, 120.0, out.state).decisions == []


def test_in_window_scale_up_stops_at_max_instances() -> None:
    three = endpoint(view("a", WARM), view("b", WARM), view("c", WARM), hi=4)
    state = run(three, 0.0, StepState(), plan(0.0, 3)).state
    out = run(endpoint(view("a", HOT), view("b", HOT), view("c", HOT), hi=4), 60.0, state)
    assert [(d.kind, d.count) for d in out.decisions] == [(ActionKind.SCALE_OUT, 1)]


def test_in_window_scale_down_once_per_window() -> None:
    ep = endpoint(view("a", COOL), view("b", COOL), view("c", COOL), view("d", COOL))
    # at its target, all projected idle: Σ peaks 0.4 / 0.3 -> 2 instances carry it, 2 drained
    first = run(ep, 0.0, StepState(), plan(0.0, 4))
    assert [(d.kind, d.count) for d in first.decisions] == [(ActionKind.SCALE_IN, 2)]
    again = run(endpoint(view("a", COOL), view("b", COOL)), 600.0 - 1, first.state)
    assert again.decisions == []  # still projected idle, but once per window
    # the next window (its plan at the size it has): a scale-down is allowed again
    nxt = run(endpoint(view("a", COOL), view("b", COOL)), 600.0, first.state, plan(600.0, 2))
    assert [(d.kind, d.count) for d in nxt.decisions] == [(ActionKind.SCALE_IN, 1)]


def test_no_scale_down_while_one_instance_is_projected_busy() -> None:
    state = run(endpoint(view("a", WARM)), 0.0, StepState(), plan(0.0, 3)).state
    ep = endpoint(view("a", COOL), view("b", COOL), view("c", (0.1,) * 50 + (0.35,) * 50))
    assert run(ep, 60.0, state).decisions == []


def test_no_projection_no_in_window_move() -> None:
    """A world without anticipators (empty projections) gets the window plan only."""
    state = run(endpoint(InstanceView("a", "h100", 99, 100)), 0.0, StepState(), plan(0.0, 1)).state
    ep = endpoint(InstanceView("a", "h100", 99, 100))
    assert run(ep, 60.0, state).decisions == []


def test_before_the_first_window_plan_it_is_reactive_and_says_so() -> None:
    out = run(endpoint(InstanceView("a", "h100", 90, 100)), 0.0, StepState())
    assert [(d.kind, d.count) for d in out.decisions] == [(ActionKind.SCALE_OUT, 1)]
    assert "no window forecast yet" in out.decisions[0].reason


def test_the_policy_fields_reach_the_strategy() -> None:
    spec = ScalingPolicySpec.model_validate(
        {
            "strategy": "preserve",
            "preserve": {
                "windowSeconds": 300,
                "lookaheadIterations": 50,
                "overloadKvUsage": 0.9,
                "overloadIterationShare": 0.2,
                "scaleDownKvUsage": 0.25,
            },
        }
    )
    strategy = strategy_for(spec)
    assert isinstance(strategy, Preserve)
    assert strategy.params == PreserveParams(
        window_s=300.0, lookahead=50, overload_kv=0.9, overload_share=0.2, scale_down_kv=0.25
    )
    assert strategy.plan_cadence == PlanCadence(PlanSource.WINDOW, 300.0)
    default = ScalingPolicySpec().preserve
    assert (default.window_seconds, default.lookahead_iterations) == (600, 100)
    assert (default.overload_kv_usage, default.overload_iteration_share) == (0.95, 0.1)
    assert default.scale_down_kv_usage == 0.3


def test_static_applies_the_plan_once_then_holds() -> None:
    static = make_strategy("static")
    ep = endpoint(view("a", HOT), view("b", COOL))
    first = decide(0.0, Snapshot(0.0, {KEY: ep}), plan(0.0, 6), StepState(), static)
    assert [(d.kind, d.count) for d in first.decisions] == [(ActionKind.SCALE_OUT, 4)]
    six = endpoint(*(view(n, COOL, 1.0) for n in "abcdef"))
    assert decide(3600.0, Snapshot(3600.0, {KEY: six}), None, first.state, static).decisions == []


def test_queue_pressure_adds_an_instance_only_when_asked() -> None:
    """A queue at its saturation level with the KV cache projected low: the paper's rule
    does nothing; with `queue_pressure` one instance more."""
    queued = EndpointSnapshot(
        key=KEY,
        min_instances=1,
        max_instances=10,
        replicas={"h100": 2},
        serving=2,
        instances=(view("a", WARM), view("b", WARM)),
        waiting=20,  # 10 per instance: twice the saturation level
        variants=("h100",),
    )
    state = decide(0.0, Snapshot(0.0, {KEY: queued}), plan(0.0, 2), StepState(), PRESERVE).state
    assert decide(60.0, Snapshot(60.0, {KEY: queued}), None, state, PRESERVE).decisions == []
    eager = Preserve(PreserveParams(queue_pressure=True))
    out = decide(60.0, Snapshot(60.0, {KEY: queued}), None, state, eager)
    assert [(d.kind, d.count) for d in out.decisions] == [(ActionKind.SCALE_OUT, 1)]
    assert "queue pressure" in out.decisions[0].reason
    spec = ScalingPolicySpec.model_validate(
        {"strategy": "preserve", "preserve": {"queuePressure": True}}
    )
    assert strategy_for(spec) == Preserve(PreserveParams(queue_pressure=True))
