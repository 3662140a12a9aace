"""Batch deadlines a model cannot meet even at maxInstances: a miss predicted (pure).

Why: SageServe's batch tier carries a 24-hour deadline (§6.3) and the Queue Manager
releases it into troughs of interactive load (§6.1–§6.2). The deadline signal
(`pace.pressure.deadline_pressure`) scales an endpoint out when the troughs do not give the
queue what its deadlines need, but scaling stops at `maxInstances`: when the model's need
is above what every region at its maxInstances serves, some request *will* miss its
deadline whatever the operator does, and only a person can change that (a larger
`maxInstances`, a longer completion window, more capacity). Batch jobs expire quietly
(`docs/batch.md`: reported when they expire, not predicted); this says so hours before.

The rule: the model's need is the tokens/s its batch queue needs to meet every deadline,
earliest deadline first (`dispatch.deadlines.required_tps`, the routers' gauge
`sageserve_batch_deadline_need_tokens_per_second`); its capacity at max is θ × Σ over
regions of maxInstances (`dispatch.deadlines.capacity_at_max`, the simulator's end-of-run
feasibility uses the same), θ the model's (`api.model_deployment.model_theta_tps`). The
need is above that capacity exactly when `dispatch.deadlines.deadline_risk` at that capacity
finds work at risk. The capacity is the fleet serving nothing but batch, so a miss said
here is conclusive; a queue within it may still miss where interactive load keeps the
troughs small (the deadline signal's business).

`BatchDeadlinesAtRisk` on the ModelDeployment tells it: True with the need, the capacity
at max and the shortfall; False once the need is back within it (a ModelDeployment that
was never at risk gets no condition). One Event per transition; the message is rewritten
when its figures move by more than `MESSAGE_TOLERANCE`, not every pass.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sageserve.api.model_deployment import ModelDeployment, model_theta_tps
from sageserve.dispatch.deadlines import capacity_at_max

CONDITION = "BatchDeadlinesAtRisk"
#: Condition reasons: the need above the capacity at maxInstances, or within it.
AT_RISK = "NeedAboveCapacityAtMax"
WITHIN = "NeedWithinCapacityAtMax"
#: Relative change of the shortfall (or of the capacity) below which the message of an
#: unchanged condition is not rewritten: the need moves every pass, a status write per
#: pass per model would be noise.
MESSAGE_TOLERANCE = 0.10


@dataclass(frozen=True)
class DeadlineOutlook:
    """One model's batch deadline need against its capacity at maxInstances."""

    model: str
    need_tps: float
    theta_tps: float
    max_instances: int

    @property
    def capacity_tps(self) -> float:
        """Tokens/s every region of the model serves at its maxInstances."""
        return capacity_at_max(self.theta_tps, [self.max_instances])

    @property
    def shortfall_tps(self) -> float:
        """Tokens/s the deadlines need beyond the capacity at maxInstances (0: none)."""
        return max(0.0, self.need_tps - self.capacity_tps)

    @property
    def at_risk(self) -> bool:
        """Whether some deadline will be missed whatever the operator scales."""
        return self.shortfall_tps > 1e-9

    def condition(self) -> tuple[bool, str, str]:
        """`BatchDeadlinesAtRisk` as (status, reason, message)."""
        at_max = (
            f"{self.capacity_tps:.0f} tok/s at maxInstances "
            f"({self.max_instances} instance(s) × θ {self.theta_tps:.0f} tok/s)"
        )
        if self.at_risk:
            return (
                True,
                AT_RISK,
                f"batch queue of {self.model} needs {self.need_tps:.0f} tok/s to meet every "
                f"deadline, above the {at_max}: {self.shortfall_tps:.0f} tok/s short, so "
                "some batch requests will miss their deadline however far it scales; raise "
                "maxInstances, extend the completion window or add capacity",
            )
        return False, WITHIN, f"batch queue of {self.model} needs no more than the {at_max}"


def outlook(
    md: ModelDeployment, need_tps: float, theta_tps: float | None = None
) -> DeadlineOutlook:
    """The outlook of `md` for a batch deadline need of `need_tps` tokens/s, at θ
    `theta_tps` (default: the declared one, `model_theta_tps`)."""
    return DeadlineOutlook(
        md.metadata.name,
        max(0.0, need_tps),
        model_theta_tps(md) if theta_tps is None else theta_tps,
        sum(max(0, r.max_instances) for r in md.spec.regions),
    )


@dataclass(frozen=True)
class Report:
    """What one pass does about one model's condition."""

    #: write the condition into the ModelDeployment's status
    write: bool
    #: post an Event (the condition's status or reason changed)
    event: bool


def _moved(old: float, new: float) -> bool:
    return abs(new - old) > MESSAGE_TOLERANCE * max(abs(old), 1e-9)


def report(
    status_condition: Mapping[str, Any] | None,
    posted: DeadlineOutlook | None,
    now: DeadlineOutlook,
) -> Report:
    """Whether to write the condition and post an Event, from the condition as the
    ModelDeployment's status has it (None: absent), what this operator last wrote
    (`posted`, None since it started) and the outlook now.

    Level-triggered on the status: a condition lost to a concurrent status write comes
    back on the next pass. Events follow transitions of what was posted (else of the
    status, after a restart), so a lost and rewritten condition posts no second Event.
    Never at risk and no condition: nothing is written."""
    status, reason, _ = now.condition()
    want = ("True" if status else "False", reason)
    if status_condition is None and not status and posted is None:
        return Report(False, False)
    written = (
        (str(status_condition.get("status")), str(status_condition.get("reason")))
        if status_condition is not None
        else None
    )
    before = ("True" if posted.at_risk else "False", posted.condition()[1]) if posted else written
    event = before != want
    if written != want or posted is None:
        return Report(True, event)
    moved = _moved(posted.capacity_tps, now.capacity_tps) or (
        status and _moved(posted.shortfall_tps, now.shortfall_tps)
    )
    return Report(moved, event)
