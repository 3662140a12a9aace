"""`plan.layout_step`: the layout loop's re-plan and switch step as pure functions, one row
per rule (the operator's loop and the OServe benchmark both call them)."""

from __future__ import annotations

import pytest

from sageserve.plan.layout_search import LayoutSpace, Strategy, canonical
from sageserve.plan.layout_step import (
    LayoutMemory,
    LayoutSettings,
    ReplanObservation,
    gated,
    memory_after_abandon,
    replan_layout,
    step_switch,
)
from sageserve.plan.layout_switch import SwitchGate, Window, plan_switch, stuck_after_s
from sageserve.plan.oserve_layouts import Mix

TP4, TP4PP2 = Strategy(4), Strategy(4, 2)
#: type A (short) 2/s on a TP4, 2.2/s on the pipeline; type B (long prompts) 0.2/s and 1/s
SPACE = LayoutSpace({TP4: (2.0, 0.2), TP4PP2: (2.2, 1.0)}, node_gpus=8)
MIX_LONG = Mix(((100.0, 100.0), (2000.0, 20.0)), (0.5, 0.8))
MIX_SHORT = Mix(((100.0, 100.0), (2000.0, 20.0)), (2.0, 0.0))
STARTUP = {TP4: 5.0, TP4PP2: 5.0}
ONCE = LayoutSettings(confirmations=1)


def observe(
    current: tuple[Strategy, ...],
    budget: int,
    mix: Mix | None,
    spare: int = 0,
    now: float = 1000.0,
) -> ReplanObservation:
    windows = (Window(3600.0, mix.rates),) if mix is not None else ()
    return ReplanObservation(
        now,
        canonical(current),
        budget,
        "held",
        spare,
        STARTUP,
        (TP4, TP4PP2),
        space=SPACE if mix is not None else None,
        mix=mix,
        windows=windows,
        history_s=3600.0,
    )


@pytest.mark.parametrize(
    ("current", "budget", "mix", "target", "says"),
    [
        # 1: no mix, budget unchanged: kept
        ((TP4, TP4), 8, None, None, "kept: no request counted in the last 3600 s"),
        # 1: no mix, the budget grew by a TP4 or more: the first variant fills it
        ((TP4, TP4), 16, None, (TP4,) * 4, "no request counted"),
        ((TP4, TP4), 4, None, (TP4,), "budget 4 GPUs (held) where TP4 ×2 holds 8"),
        # 2: a budget below the smallest instance: kept
        ((TP4,), 2, MIX_LONG, None, "kept: a budget of 2 GPUs (held)"),
        # 3: no layout yet, or the budget moved: the search's layout, no gate
        ((), 8, MIX_LONG, (TP4PP2,), "without the gate"),
        ((TP4, TP4), 16, MIX_LONG, (TP4PP2,), "where TP4 ×2 holds 8: TP4 ×2 → TP4xPP2 without"),
        # 4: the gate: the pipeline pays off on long prompts, not on short ones
        ((TP4, TP4), 8, MIX_LONG, (TP4PP2,), "switching TP4 ×2 → TP4xPP2 (gain"),
        ((TP4, TP4), 8, MIX_SHORT, None, "kept on 8 GPUs (held)"),
    ],
)
def test_replan_rules(
    current: tuple[Strategy, ...],
    budget: int,
    mix: Mix | None,
    target: tuple[Strategy, ...] | None,
    says: str,
) -> None:
    out = replan_layout(observe(current, budget, mix), LayoutMemory(), ONCE)
    assert says in out.message
    if target is None:
        assert out.switch is None
    else:
        assert out.switch is not None and canonical(out.switch.target) == canonical(target)


def test_the_gate_waits_for_its_confirmations() -> None:
    twice = LayoutSettings(confirmations=2)
    first = replan_layout(observe((TP4, TP4), 8, MIX_LONG), LayoutMemory(), twice)
    assert first.switch is None and first.memory.gate.streak == 1
    assert "worthwhile in 1 of 2 consecutive re-plans" in first.message
    second = replan_layout(observe((TP4, TP4), 8, MIX_LONG), first.memory, twice)
    assert second.switch is not None and second.memory.gate == SwitchGate()


def test_an_abandoned_target_is_held_off_then_proposed_again() -> None:
    obs = observe((TP4, TP4), 8, MIX_LONG)
    plan = replan_layout(obs, LayoutMemory(), ONCE).switch
    assert plan is not None
    memory = memory_after_abandon(plan, 1000.0, ONCE)
    held = replan_layout(observe((TP4, TP4), 8, MIX_LONG, now=2000.0), memory, ONCE)
    assert held.switch is None
    assert "TP4xPP2 was abandoned" in held.message and "again for 2600 s" in held.message
    later = replan_layout(observe((TP4, TP4), 8, MIX_LONG, now=4601.0), memory, ONCE)
    assert later.switch is not None


def test_free_gpus_make_the_switch_make_before_break() -> None:
    tight = replan_layout(observe((TP4, TP4), 8, MIX_LONG), LayoutMemory(), ONCE).switch
    roomy = replan_layout(observe((TP4, TP4), 8, MIX_LONG, spare=8), LayoutMemory(), ONCE)
    assert tight is not None and not tight.make_before_break
    assert roomy.switch is not None and roomy.switch.make_before_break
    assert "make-before-break" in roomy.message


@pytest.mark.parametrize(
    ("current", "budget", "expected"),
    [
        ((TP4, TP4), 8, True),  # in force, the budget it holds
        ((TP4, TP4), 11, True),  # grown by less than one TP4
        ((TP4, TP4), 12, False),  # grown by a TP4: the size moved
        ((TP4, TP4), 4, False),  # shrunk
        ((), 8, False),  # nothing in force
        ((TP4,), 2, False),  # not even one instance fits
    ],
)
def test_gated(current: tuple[Strategy, ...], budget: int, expected: bool) -> None:
    assert gated(canonical(current), budget, SPACE) is expected


def test_a_switch_steps_as_its_replicas_serve_and_is_abandoned_when_stuck() -> None:
    plan = plan_switch(SPACE, (TP4, TP4), (TP4PP2,), 16, MIX_LONG.rates, STARTUP, 8)
    assert plan.make_before_break
    start = step_switch(0.0, plan, 0, 0.0, {TP4: 2}, STARTUP)
    assert start.targets == {TP4: 2, TP4PP2: 1} and not start.finished
    waiting = step_switch(5.0, plan, start.done, 0.0, {TP4: 2}, STARTUP)
    assert waiting.targets == {TP4: 2, TP4PP2: 1}
    served = step_switch(6.0, plan, waiting.done, 0.0, {TP4: 2, TP4PP2: 1}, STARTUP)
    assert served.finished and served.targets == {TP4: 0, TP4PP2: 1}
    late = stuck_after_s(plan, STARTUP) + 1.0
    stuck = step_switch(late, plan, start.done, 0.0, {TP4: 2}, STARTUP)
    assert stuck.abandoned and stuck.missing == {TP4PP2: 1}
    assert stuck.targets.get(TP4PP2, 0) == 0 and stuck.targets[TP4] == 2
