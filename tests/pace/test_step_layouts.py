"""The decision step with an OServe layout in force: each layout variant's pod set moves to
its own target (starts before stops), whatever the strategy's thresholds say, and the
strategy sizes only the variants no layout manages (OServe §5.2 on Kubernetes)."""

from __future__ import annotations

import pytest

from sageserve.core.snapshot import EndpointSnapshot, InstanceView, Plan, Snapshot
from sageserve.core.types import ActionKind, EndpointKey
from sageserve.pace import make_strategy
from sageserve.pace.base import PacingStrategy
from sageserve.pace.step import StepState, decide
from sageserve.plan.oserve_layouts import LayoutTargets, with_layouts

KEY = EndpointKey("llama", "us-east")
LT_I = make_strategy("lt-immediate")
LT_U = make_strategy("lt-utilization")
REACTIVE = make_strategy("reactive")


def ep(
    replicas: dict[str, int],
    used: float = 50.0,
    silent: int = 0,
    variants: tuple[str, ...] = ("tp4", "tp4pp2"),
) -> EndpointSnapshot:
    """Every replica serving, `silent` of them (the last) not reporting yet."""
    names = [(f"{v}-{i}", v) for v, n in replicas.items() for i in range(n)]
    views = tuple(InstanceView(name, v, used + i, 100.0) for i, (name, v) in enumerate(names))[
        : len(names) - silent
    ]
    return EndpointSnapshot(
        key=KEY,
        min_instances=0,
        max_instances=10,
        replicas=replicas,
        serving=len(names),
        instances=views,
        variants=variants,
    )


def layout_plan(targets: dict[str, int], base: Plan | None = None) -> Plan:
    plan = with_layouts(
        base, LayoutTargets({(KEY, v): n for v, n in targets.items()}, changed_at=50.0)
    )
    assert plan is not None
    return plan


def one(
    snap: EndpointSnapshot, plan: Plan, strategy: PacingStrategy = LT_I
) -> tuple[ActionKind, dict[str, int], tuple[str, ...]] | None:
    out = decide(100.0, Snapshot(100.0, {KEY: snap}), plan, StepState(), strategy)
    if not out.decisions:
        return None
    (d,) = out.decisions
    return d.kind, dict(d.replicas), d.drain


@pytest.mark.parametrize(
    ("replicas", "targets", "silent", "strategy", "expected"),
    [
        # a switch's start: the new variant's pod set grows, the old one stays
        (
            {"tp4": 2, "tp4pp2": 0},
            {"tp4": 2, "tp4pp2": 1},
            0,
            LT_I,
            (ActionKind.SCALE_OUT, {"tp4pp2": 1}, ()),
        ),
        # ... also under LT-U at 50 % EMU, which alone would not move
        (
            {"tp4": 2, "tp4pp2": 0},
            {"tp4": 2, "tp4pp2": 1},
            0,
            LT_U,
            (ActionKind.SCALE_OUT, {"tp4pp2": 1}, ()),
        ),
        # the stops, once the targets drop: the old variant's least-loaded pods drained
        (
            {"tp4": 2, "tp4pp2": 1},
            {"tp4": 0, "tp4pp2": 1},
            0,
            LT_I,
            (ActionKind.SCALE_IN, {"tp4": 0}, ("tp4-0", "tp4-1")),
        ),
        # one move per pass: starts first even when targets also go down
        (
            {"tp4": 2, "tp4pp2": 0},
            {"tp4": 0, "tp4pp2": 2},
            0,
            REACTIVE,
            (ActionKind.SCALE_OUT, {"tp4pp2": 2}, ()),
        ),
        # a new replica serving but not reporting yet: no stop until it reports
        ({"tp4": 2, "tp4pp2": 1}, {"tp4": 0, "tp4pp2": 1}, 1, LT_I, None),
        # at its targets the layout holds, even when the strategy would scale (EMU 95 %)
        ({"tp4": 1, "tp4pp2": 1}, {"tp4": 1, "tp4pp2": 1}, 0, REACTIVE, None),
    ],
)
def test_each_layout_variant_moves_to_its_own_target(
    replicas: dict[str, int],
    targets: dict[str, int],
    silent: int,
    strategy: PacingStrategy,
    expected: tuple[ActionKind, dict[str, int], tuple[str, ...]] | None,
) -> None:
    used = 95.0 if strategy is REACTIVE else 50.0
    assert one(ep(replicas, used=used, silent=silent), layout_plan(targets), strategy) == expected


def test_the_strategy_sizes_only_the_variants_no_layout_manages() -> None:
    snap = ep({"tp4": 1, "tp4pp2": 1, "a100": 1}, used=95.0, variants=("tp4", "tp4pp2", "a100"))
    got = one(snap, layout_plan({"tp4": 1, "tp4pp2": 1}), REACTIVE)
    assert got is not None and got[0] is ActionKind.SCALE_OUT and set(got[1]) == {"a100"}


def test_the_plans_other_targets_survive_and_its_time_is_kept() -> None:
    base = Plan(10.0, {(KEY, "tp4"): 4, (KEY, "a100"): 2})
    plan = layout_plan({"tp4": 1, "tp4pp2": 1}, base)
    assert plan.computed_at == 10.0
    assert plan.variant_target(KEY, "a100") == 2 and plan.variant_target(KEY, "tp4") == 1


def test_a_changed_layout_over_the_same_plan_is_adopted() -> None:
    base = Plan(10.0, {(KEY, "tp4"): 2})
    first = layout_plan({"tp4": 2, "tp4pp2": 0}, base)
    second = layout_plan({"tp4": 2, "tp4pp2": 1}, base)
    state = decide(11.0, Snapshot(11.0, {}), first, StepState(), LT_I).state
    assert decide(12.0, Snapshot(12.0, {}), second, state, LT_I).state.plan == second
    # an older plan is still refused
    older = Plan(5.0, {(KEY, "tp4"): 9})
    assert decide(13.0, Snapshot(13.0, {}), older, state, LT_I).state.plan == first
