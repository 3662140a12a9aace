"""Switching between OServe layouts (plan/layout_switch.py, OServe §5.2 plus the gain/cost
rule and its hysteresis): hand-solved plans and decisions, and properties of
the plan (the target is reached, the budget is held, make-before-break never drops below
min(old, new) when the spare GPUs suffice)."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sageserve.plan.layout_search import LayoutSpace, Strategy, canonical
from sageserve.plan.layout_switch import (
    SwitchGate,
    Window,
    abandon_switch,
    capacity_at_mix,
    decide,
    evaluate_switch,
    horizon_rates,
    match_layouts,
    plan_switch,
    replan,
    stuck_after_s,
)

TP2, TP4, TP8, TP4PP2 = Strategy(2), Strategy(4), Strategy(8), Strategy(4, 2)

# The hand-made two-type case of tests/plan/test_layout_search.py: type A (short outputs)
# 10/s on a TP4, type B (long outputs) 2/s on a TP4, 8/s on TP4×PP2, 7/s on TP8.
HAND = LayoutSpace({TP4: (10.0, 2.0), TP4PP2: (12.0, 8.0), TP8: (11.0, 7.0)}, node_gpus=8)
RATES = (20.0, 8.0)
OLD = (TP4,) * 4  # Φ = 24 of 28 (B gets 4 of 8)
NEW = (TP4PP2, TP4, TP4)  # Φ = 28: B on the pipeline, A on the two TP4s
HAND_WITH_TP2 = LayoutSpace(
    {TP2: (4.0, 0.5), TP4: (10.0, 2.0), TP4PP2: (12.0, 8.0), TP8: (11.0, 7.0)}, node_gpus=8
)


def test_match_keeps_the_common_replicas() -> None:
    keep, start, stop = match_layouts([TP4, TP4, TP8], [TP8, TP4, TP8])
    assert keep == canonical([TP4, TP8])
    assert start == (TP8,)
    assert stop == (TP4,)
    assert match_layouts(OLD, NEW) == ((TP4, TP4), (TP4PP2,), (TP4, TP4))


def test_capacity_at_mix_by_hand() -> None:
    # k TP4s at the mix (20, 8): θ·(20/10 + 8/2) = θ·6 ≤ k, capacity θ·28 = 28k/6
    for k in (1, 2, 3, 4):
        assert capacity_at_mix(HAND, (TP4,) * k, RATES) == pytest.approx(28 * k / 6)
    # B fills the pipeline replica (8/8), A the two TP4s (20/10): θ = 1 exactly
    assert capacity_at_mix(HAND, NEW, RATES) == pytest.approx(28.0)
    assert capacity_at_mix(HAND, (), RATES) == 0.0
    # a replica that serves none of the mix (requests too long for it) adds nothing
    short = LayoutSpace({TP4: (10.0, 0.0), TP8: (11.0, 7.0)})
    assert capacity_at_mix(short, (TP4,), (0.0, 5.0)) == 0.0
    assert capacity_at_mix(short, (TP4, TP8), (0.0, 5.0)) == pytest.approx(7.0)


def test_make_before_break_with_spares() -> None:
    plan = plan_switch(HAND, OLD, NEW, budget_gpus=24, rates=RATES, startup_s=600)
    assert [(a.kind, a.strategy) for a in plan.actions] == [
        ("start", TP4PP2),
        ("stop", TP4),
        ("stop", TP4),
    ]
    assert plan.make_before_break
    assert plan.actions[0].gpus_after == 24
    assert plan.min_capacity == pytest.approx(28 * 4 / 6)  # the old layout itself
    assert plan.final_layout == canonical(NEW)
    assert plan.start_waves == 1 and plan.duration_s == 600
    assert plan.gpu_seconds == 8 * 600


def test_no_spares_break_before_make() -> None:
    # 16 of 16 GPUs used: the 8-GPU pipeline replica fits only once two TP4s are gone
    plan = plan_switch(HAND, OLD, NEW, budget_gpus=16, rates=RATES, startup_s=600)
    assert [(a.kind, a.strategy) for a in plan.actions] == [
        ("stop", TP4),
        ("stop", TP4),
        ("start", TP4PP2),
    ]
    assert not plan.make_before_break
    assert plan.min_capacity == pytest.approx(28 * 2 / 6)
    assert plan.capacity_after == pytest.approx(28.0)
    assert plan.final_layout == canonical(NEW)


def test_some_spares_stop_one_start_then_stop_the_other() -> None:
    # 4 spare GPUs: one TP4 stopped makes room for the pipeline replica, which serves
    # before the second TP4 stops; the capacity never falls below three TP4s
    plan = plan_switch(HAND, OLD, NEW, budget_gpus=20, rates=RATES, startup_s=600)
    assert [a.kind for a in plan.actions] == ["stop", "start", "stop"]
    assert plan.min_capacity == pytest.approx(28 * 3 / 6)
    assert max(a.gpus_after for a in plan.actions) == 20


def test_two_start_waves_take_two_startups() -> None:
    space = LayoutSpace({TP4: (10.0, 2.0), TP8: (11.0, 7.0)})
    plan = plan_switch(space, (TP8, TP8), (TP4,) * 4, 16, RATES, startup_s={TP4: 300.0, TP8: 900.0})
    assert [a.kind for a in plan.actions] == ["stop", "start", "start", "stop", "start", "start"]
    assert plan.start_waves == 2 and plan.duration_s == 600.0
    assert plan.gpu_seconds == 16 * 300.0


def test_packing_defers_a_start_that_does_not_fit_a_node() -> None:
    # Nodes of 8 GPUs, budget 16: TP4 + TP6 hold 10, so a second TP6 fits by count (16)
    # but not onto the nodes (6 | 6, and the TP4 has no node left): stop the TP4 first.
    tp6 = Strategy(6)
    space = LayoutSpace({TP4: (10.0, 2.0), tp6: (12.0, 5.0)}, node_gpus=8)
    free = plan_switch(space, (TP4, tp6), (tp6, tp6), 16, RATES, 600)
    assert [a.kind for a in free.actions] == ["start", "stop"]
    packed = plan_switch(space, (TP4, tp6), (tp6, tp6), 16, RATES, 600, node_gpus=8)
    assert [a.kind for a in packed.actions] == ["stop", "start"]
    assert packed.final_layout == canonical((tp6, tp6))


def test_refuses_layouts_over_budget() -> None:
    with pytest.raises(ValueError, match="over the budget"):
        plan_switch(HAND, OLD, (TP8, TP8, TP4), 16, RATES, 600)
    with pytest.raises(ValueError, match="over the budget"):
        plan_switch(HAND, OLD, NEW, 12, RATES, 600)


def test_gain_against_cost_by_hand() -> None:
    plan = plan_switch(HAND, OLD, NEW, 24, RATES, 600)
    # one hour: the new layout serves 4 req/s more for 3,000 s after its 600 s start-up =
    # 12,000 requests; the cost is 8 GPUs × 600 s at 24/16 = 1.5 requests per GPU-second
    ev = evaluate_switch(HAND, OLD, NEW, [Window(3600, RATES)], plan)
    assert ev.gain_requests == pytest.approx(12_000)
    assert ev.cost_gpu_seconds == 4800
    assert ev.requests_per_gpu_second == pytest.approx(1.5)
    assert ev.cost_requests == pytest.approx(7200)
    assert ev.relative_gain == pytest.approx(12_000 / (3600 * 24))
    assert ev.worthwhile
    # half an hour: 1,200 s × 4 = 4,800 < 7,200
    short = evaluate_switch(HAND, OLD, NEW, [Window(1800, RATES)], plan)
    assert short.gain_requests == pytest.approx(4800)
    assert not short.worthwhile and "does not cover" in short.reason
    # a high bar on the relative gain refuses a net-positive switch
    bar = evaluate_switch(HAND, OLD, NEW, [Window(3600, RATES)], plan, min_relative_gain=0.2)
    assert not bar.worthwhile and "under the minimum" in bar.reason


def test_gain_counts_windows_after_the_switch_only() -> None:
    plan = plan_switch(HAND, OLD, NEW, 24, RATES, 600)
    # the first 10 minutes pass while the new replica starts; only B-heavy windows later
    # gain: mix (20, 8) gains 4/s, a mix of A only (20, 0) gains nothing (both serve it all)
    windows = [Window(600, RATES), Window(600, (20.0, 0.0)), Window(1200, RATES)]
    ev = evaluate_switch(HAND, OLD, NEW, windows, plan)
    assert ev.gain_requests == pytest.approx(1200 * 4)


def test_decide_needs_two_consecutive_worthwhile_plans() -> None:
    hour = [Window(600, RATES)] * 6
    first = decide(HAND, OLD, NEW, hour, 24, 600)
    assert not first.switch and first.gate.streak == 1 and first.evaluation is not None
    assert first.evaluation.worthwhile
    second = decide(HAND, OLD, NEW, hour, 24, 600, gate=first.gate)
    assert second.switch and second.plan is not None
    assert second.plan.final_layout == canonical(NEW)
    assert second.gate == SwitchGate()
    # a re-plan that is not worth it resets the streak
    blip = decide(HAND, OLD, NEW, [Window(600, RATES)], 24, 600, gate=first.gate)
    assert not blip.switch and blip.gate.streak == 0
    again = decide(HAND, OLD, NEW, hour, 24, 600, gate=blip.gate)
    assert not again.switch and again.gate.streak == 1
    # confirmations=1 is the paper's rule: switch on the first worthwhile plan
    assert decide(HAND, OLD, NEW, hour, 24, 600, confirmations=1).switch


def test_decide_same_layout_never_switches() -> None:
    d = decide(HAND, OLD, tuple(reversed(OLD)), [Window(3600, RATES)], 16, 600)
    assert not d.switch and d.plan is None


LAYOUT_STRATEGIES = st.lists(st.sampled_from([TP2, TP4, TP8, TP4PP2]), max_size=5).filter(
    lambda xs: sum(s.gpus for s in xs) <= 24
)


@settings(max_examples=25, deadline=None)
@given(
    current=LAYOUT_STRATEGIES,
    target=LAYOUT_STRATEGIES,
    extra=st.integers(0, 16),
    a=st.floats(0.0, 40.0),
    b=st.floats(0.0, 12.0),
)
def test_plan_properties(
    current: list[Strategy], target: list[Strategy], extra: int, a: float, b: float
) -> None:
    budget = max(sum(s.gpus for s in current), sum(s.gpus for s in target)) + extra
    rates = (a, b)
    plan = plan_switch(HAND_WITH_TP2, current, target, budget, rates, 300)
    assert plan.final_layout == canonical(target)
    assert all(a.gpus_after <= budget for a in plan.actions)
    keep, start, stop = match_layouts(current, target)
    for step in plan.actions:  # the kept replicas serve throughout
        assert not Counter(keep) - Counter(step.layout_after)
    assert sorted(a.strategy for a in plan.actions if a.kind == "start") == sorted(start)
    assert sorted(a.strategy for a in plan.actions if a.kind == "stop") == sorted(stop)
    spare = budget - sum(s.gpus for s in current)
    if spare >= sum(s.gpus for s in start):
        assert plan.make_before_break
        old = capacity_at_mix(HAND_WITH_TP2, current, rates)
        new = capacity_at_mix(HAND_WITH_TP2, target, rates)
        floor = min(old, new)
        for step in plan.actions:
            again = capacity_at_mix(HAND_WITH_TP2, step.layout_after, rates)
            assert again >= floor * (1 - 1e-6) - 1e-6
        assert plan.min_capacity >= floor * (1 - 1e-6) - 1e-6


def test_replan_switches_on_the_second_consecutive_plan() -> None:
    hour = [Window(600, RATES)] * 6
    assert horizon_rates([Window(600, (10.0, 0.0)), Window(1800, (30.0, 4.0))]) == (25.0, 3.0)
    first = replan(HAND, OLD, hour, 16, 600)
    assert not first.switch and first.gate.streak == 1
    assert first.gate.target == canonical(NEW)
    second = replan(HAND, OLD, hour, 16, 600, first.gate)
    assert second.switch and second.plan is not None
    assert second.plan.target == canonical(NEW) and not second.plan.make_before_break
    # once there, the same forecast proposes nothing new
    settled = replan(HAND, NEW, hour, 16, 600)
    assert not settled.switch and settled.plan is None


def test_replan_with_spare_gpus_prefers_the_cheaper_candidate() -> None:
    """On 24 GPUs the search fills the spares (TP4xPP2 x2 + TP4 x2, more headroom, same Φ
    = 28): 16 GPUs started in two waves gain (3,600 − 1,200) × 4 = 9,600 requests for a
    cost of 16 × 600 × 1.5 = 14,400. The search on the 16 GPUs held finds the same Φ with
    8 GPUs started, make-before-break: 12,000 against 7,200."""
    big = canonical((TP4PP2, TP4PP2, TP4, TP4))
    hour = [Window(600, RATES)] * 6
    costly = evaluate_switch(HAND, OLD, big, hour, plan_switch(HAND, OLD, big, 24, RATES, 600))
    assert costly.gain_requests == pytest.approx(9600)
    assert costly.cost_requests == pytest.approx(14_400) and not costly.worthwhile
    d = replan(HAND, OLD, hour, 24, 600, confirmations=1)
    assert d.switch and d.plan is not None and d.plan.target == canonical(NEW)
    assert d.plan.make_before_break and d.evaluation is not None
    assert d.evaluation.net_requests == pytest.approx(12_000 - 7200)


def test_an_abandoned_switch_keeps_what_serves_and_withdraws_the_starts_that_did_not() -> None:
    # make-before-break on 24 GPUs: start TP4xPP2, then stop two TP4
    plan = plan_switch(HAND, OLD, NEW, 24, RATES, 600.0, 8)
    assert [a.kind for a in plan.actions] == ["start", "stop", "stop"]
    # nothing taken: the old layout
    assert abandon_switch(plan, {TP4: 4}, 0) == {TP4: 4, TP4PP2: 0}
    # the start taken, its pod never Ready: withdrawn, the old layout kept whole
    assert abandon_switch(plan, {TP4: 4}, 1) == {TP4: 4, TP4PP2: 0}
    # break-before-make on 16: a stop taken first stays taken; a started replica that
    # serves stays
    tight = plan_switch(HAND, OLD, NEW, 16, RATES, 600.0, 8)
    taken = [a.kind for a in tight.actions].index("start") + 1
    assert abandon_switch(tight, {TP4: 2}, taken) == {TP4: 2, TP4PP2: 0}
    assert abandon_switch(tight, {TP4: 2, TP4PP2: 1}, taken) == {TP4: 2, TP4PP2: 1}
    with pytest.raises(ValueError, match="done"):
        abandon_switch(plan, {}, 4)


def test_a_switch_is_stuck_after_two_of_its_slowest_start_ups_and_a_grace() -> None:
    plan = plan_switch(HAND, OLD, NEW, 24, RATES, 600.0, 8)
    assert stuck_after_s(plan, {TP4: 900.0, TP4PP2: 600.0}) == 2 * 600.0 + 120.0
    only_stops = plan_switch(HAND, OLD, (TP4,) * 2, 16, RATES, 600.0, 8)
    assert stuck_after_s(only_stops, {TP4: 900.0}) == 120.0
