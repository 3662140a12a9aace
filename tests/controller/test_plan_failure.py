"""A plan pass that fails in a way the plan loop does not handle (a solver crash, an API
error mid-pass) keeps the plan in force, says so in `PlanReady`, and never stops the pace
pass that follows: reactive scaling and the floors go on without the planner."""

from __future__ import annotations

import logging

import pytest

from sageserve.controller.pace_loop import Loops, PaceState
from sageserve.controller.plan_loop import PlanPass
from sageserve.core.snapshot import Plan
from tests.controller.plan_fakes import FakeKube, policy_body


def test_a_crashing_plan_keeps_the_plan_in_force_and_is_named_once_per_cadence(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[int] = []

    def crash(self: PlanPass, *args: object) -> None:
        calls.append(1)
        raise RuntimeError("HiGHS returned an unexpected model status")

    monkeypatch.setattr(PlanPass, "run", crash)
    kube = FakeKube()
    loops = Loops(["fleet"], lambda _: None, 3600.0, logging.getLogger("t"))
    state = PaceState()
    in_force = Plan(computed_at=1.0, variant_targets={})
    state.plan = in_force

    assert loops.plan_or_keep(kube, policy_body(), state) is False  # type: ignore[arg-type]
    assert state.plan is in_force  # the pace pass still follows it
    ready = next(c for c in state.conditions if c["type"] == "PlanReady")
    assert (ready["status"], ready["reason"]) == ("False", "PlanFailed")
    assert "RuntimeError: HiGHS returned an unexpected model status" in ready["message"]
    assert kube.event_types["PlanFailed"] == "Warning"
    assert any("conditions" in p for p in kube.patches)
    # the cadence moved on: not tried again at every pace pass
    assert loops.plan_or_keep(kube, policy_body(), state) is False  # type: ignore[arg-type]
    assert len(calls) == 1
