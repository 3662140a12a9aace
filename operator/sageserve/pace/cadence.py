"""When a plan is made: one pure step for the operator's plan loop and the simulator.

Why a step of its own: how often a strategy plans (SageServe §5's hourly cycle, PreServe
§4.1's window, the static fleet's minute) used to be decided by each world, and the two
disagreed where neither was looked at. Here the strategy declares its `PlanCadence`, the world
keeps a `PlanClock`, and `plan_step` says, at each moment the world looks, whether to plan
now, to adopt a plan recorded before a restart, or to wait; the parity test drives both
worlds' clocks through it.

Rules, in order:
1. a strategy that follows no plan never plans;
2. on the first look (nothing planned by this process), a recorded plan younger than the
   interval is adopted and the next plan is due when it ages out (the operator after a
   restart: status holds the plan in force);
3. on the first look without such a plan: plan now, unless the cadence needs history and
   there is none yet, then the first plan comes one interval in;
4. later: plan once the clock's due time is reached, and the next is due one interval on.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from sageserve.pace.base import PlanCadence

#: A look this close before the due time counts as on time (float clocks of summed minutes).
_TOLERANCE_S = 1e-6


class PlanMove(StrEnum):
    WAIT = "wait"
    PLAN = "plan"
    #: take the plan recorded before (status), without planning
    ADOPT = "adopt"


@dataclass(frozen=True)
class PlanClock:
    """When the next plan is due; None until the first look."""

    due_at: float | None = None


def plan_step(
    now: float,
    clock: PlanClock,
    cadence: PlanCadence,
    *,
    has_history: bool = True,
    recorded_at: float | None = None,
) -> tuple[PlanMove, PlanClock]:
    """The move at `now` and the clock after it (see the module doc for the rules).

    `has_history`: whether any load history is there to forecast from (the operator always
    says yes: its plan pass reads what Prometheus holds); `recorded_at`: when the plan
    recorded in status was computed, if there is one."""
    if not cadence.plans:
        return PlanMove.WAIT, clock
    interval = cadence.interval_s
    if clock.due_at is None:
        if recorded_at is not None and now - recorded_at < interval:
            return PlanMove.ADOPT, PlanClock(recorded_at + interval)
        if cadence.needs_history and not has_history:
            return PlanMove.WAIT, PlanClock(now + interval)
        return PlanMove.PLAN, PlanClock(now + interval)
    if now + _TOLERANCE_S >= clock.due_at:
        return PlanMove.PLAN, PlanClock(now + interval)
    return PlanMove.WAIT, clock
