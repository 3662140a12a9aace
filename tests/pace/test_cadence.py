"""`pace.cadence.plan_step`: when each strategy plans, as a table, and the interface check
that makes every capability a world asks of a strategy a declared member."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from sageserve.pace import make_strategy
from sageserve.pace.base import (
    NO_PLAN,
    PlanCadence,
    PlanSource,
    PoolLayout,
    missing_members,
    register_strategy,
)
from sageserve.pace.cadence import PlanClock, PlanMove, plan_step

HOURLY = PlanCadence(PlanSource.CYCLE, 3600.0)
WINDOW = PlanCadence(PlanSource.WINDOW, 600.0)
PEAK = PlanCadence(PlanSource.PEAK, 60.0, needs_history=False)

WAIT, PLAN, ADOPT = PlanMove.WAIT, PlanMove.PLAN, PlanMove.ADOPT


@pytest.mark.parametrize(
    ("now", "due_at", "cadence", "history", "recorded", "move", "next_due"),
    [
        # no plan followed: never, and the clock does not move
        (0.0, None, NO_PLAN, True, None, WAIT, None),
        (9e9, 100.0, NO_PLAN, True, 50.0, WAIT, 100.0),
        # first look with history: plan now, the next one interval on
        (1000.0, None, HOURLY, True, None, PLAN, 4600.0),
        (1000.0, None, WINDOW, True, None, PLAN, 1600.0),
        # first look without history: a forecast waits one interval; the peak does not
        (1000.0, None, HOURLY, False, None, WAIT, 4600.0),
        (1000.0, None, PEAK, False, None, PLAN, 1060.0),
        # first look after a restart: a recorded plan younger than the interval is adopted
        # and the next is due when it ages out; an older one is replaced at once
        (1000.0, None, HOURLY, True, 0.0, ADOPT, 3600.0),
        (1000.0, None, HOURLY, False, 0.0, ADOPT, 3600.0),
        (4000.0, None, HOURLY, True, 0.0, PLAN, 7600.0),
        (1000.0, None, WINDOW, True, 0.0, PLAN, 1600.0),
        # later looks: wait until due (a recorded plan no longer matters), then plan
        (3599.0, 3600.0, HOURLY, True, 3000.0, WAIT, 3600.0),
        (3600.0, 3600.0, HOURLY, True, None, PLAN, 7200.0),
        (3600.0 - 1e-9, 3600.0, HOURLY, True, None, PLAN, 7200.0 - 1e-9),  # float minutes
        (3700.0, 3600.0, HOURLY, False, None, PLAN, 7300.0),  # late: one interval from now
    ],
)
def test_plan_step(
    now: float,
    due_at: float | None,
    cadence: PlanCadence,
    history: bool,
    recorded: float | None,
    move: PlanMove,
    next_due: float | None,
) -> None:
    got, clock = plan_step(
        now, PlanClock(due_at), cadence, has_history=history, recorded_at=recorded
    )
    assert (got, clock.due_at) == (move, next_due)


@pytest.mark.parametrize(
    ("name", "cadence"),
    [
        ("reactive", NO_PLAN),
        ("siloed", NO_PLAN),
        ("reactive-paper", NO_PLAN),
        ("lt-ua", HOURLY),
        ("lt-i", HOURLY),
        ("preserve", WINDOW),
        ("static", PEAK),
    ],
)
def test_each_strategy_declares_its_cadence(name: str, cadence: PlanCadence) -> None:
    assert make_strategy(name).plan_cadence == cadence


def test_the_cadence_follows_the_policys_intervals() -> None:
    assert make_strategy("lt-u", {"plan_interval_s": 1800.0}).plan_cadence.interval_s == 1800
    assert make_strategy("preserve", {"window_s": 300.0}).plan_cadence.interval_s == 300


def test_only_preserve_reads_projections() -> None:
    from sageserve.pace.base import available_strategies

    reading = {n for n in available_strategies() if make_strategy(n).uses_projection}
    assert reading == {"preserve"}


@dataclass(frozen=True)
class _NoCadence:
    """A strategy written before cadence and projections were declared."""

    name: str = "old"
    layout: PoolLayout = field(default_factory=PoolLayout)
    batch_via_queue_manager: bool = True
    periodic: bool = False
    cooldown_s: float = 15.0

    def step(self, obs: Any, plan: Any) -> None:
        return None


def test_a_strategy_missing_a_capability_is_refused_where_it_registers() -> None:
    lacks = ["plan_cadence", "queue_signals", "uses_interactive_busy", "uses_projection"]
    assert missing_members(_NoCadence()) == lacks
    with pytest.raises(TypeError, match=f"'old' lacks {', '.join(lacks)}"):
        register_strategy("old")(lambda _params: _NoCadence())
    with pytest.raises(KeyError, match="unknown scaling strategy 'old'"):
        make_strategy("old")
