"""The pure parts of keda actuation: what the scaler is told for each pod set of a
ModelDeployment, and when batch work presses for capacity (controller.actuation)."""

from __future__ import annotations

import pytest

from sageserve.api.model_deployment import ModelDeployment
from sageserve.controller.actuation import deadline_pressure, desired_pod_sets, named
from sageserve.controller.status import covers
from sageserve.keda.scaler import Desired, is_active


def md() -> ModelDeployment:
    return ModelDeployment.model_validate(
        {
            "apiVersion": "sageserve.io/v1alpha1",
            "kind": "ModelDeployment",
            "metadata": {"name": "m", "namespace": "llm"},
            "spec": {
                "model": {"name": "x"},
                "variants": [
                    {"name": v, "gpuType": f"G-{v}", "capacityTokensPerSecond": 1000}
                    for v in ("h100", "a100")
                ],
                "regions": [
                    {"name": r, "minInstances": 0, "maxInstances": 4} for r in ("r1", "r2")
                ],
                "tiers": ["iw"],
                "policyRef": {"name": "p"},
            },
        }
    )


SIZED = {"m-r1-h100": 2, "m-r1-a100": 0, "m-r2-h100": 0, "m-r2-a100": 0}


@pytest.mark.parametrize(
    ("decided", "held", "pressure", "expected"),
    [
        # nothing decided: what each is sized at; r2 idle and nothing waits
        (
            {},
            {},
            False,
            {
                "m-r1-h100": (2, True),
                "m-r1-a100": (0, False),
                "m-r2-h100": (0, False),
                "m-r2-a100": (0, False),
            },
        ),
        # decided this pass: the decision, exactly
        (
            {"m-r1-h100": 3, "m-r2-a100": 1},
            {},
            False,
            {
                "m-r1-h100": (3, True),
                "m-r1-a100": (0, False),
                "m-r2-h100": (0, False),
                "m-r2-a100": (1, True),
            },
        ),
        # requests held for r2 (nothing there): its first variant wakes, not the second
        (
            {},
            {("llm", "m", "r2"): 5.0},
            False,
            {
                "m-r1-h100": (2, True),
                "m-r1-a100": (0, False),
                "m-r2-h100": (0, True),
                "m-r2-a100": (0, False),
            },
        ),
        # held for r1, which serves already: nothing more to wake
        (
            {},
            {("llm", "m", "r1"): 5.0},
            False,
            {
                "m-r1-h100": (2, True),
                "m-r1-a100": (0, False),
                "m-r2-h100": (0, False),
                "m-r2-a100": (0, False),
            },
        ),
        # batch deadlines press: every idle endpoint's first variant wakes
        (
            {},
            {},
            True,
            {
                "m-r1-h100": (2, True),
                "m-r1-a100": (0, False),
                "m-r2-h100": (0, True),
                "m-r2-a100": (0, False),
            },
        ),
        # the plan scales r1 to zero: inactive unless demand waits
        (
            {"m-r1-h100": 0},
            {},
            False,
            {
                "m-r1-h100": (0, False),
                "m-r1-a100": (0, False),
                "m-r2-h100": (0, False),
                "m-r2-a100": (0, False),
            },
        ),
    ],
)
def test_each_pod_set_gets_its_decision_and_activity(
    decided: dict[str, int],
    held: dict[tuple[str, str, str], float],
    pressure: bool,
    expected: dict[str, tuple[int, bool]],
) -> None:
    got = desired_pod_sets(md(), "llm", SIZED, decided, held, pressure)
    assert {k: (d.replicas, is_active(d)) for k, d in got.items()} == expected


def test_a_pod_set_not_paced_is_not_answered_for() -> None:
    got = desired_pod_sets(md(), "llm", {"m-r1-h100": 1}, {"m-r1-a100": 2}, {}, False)
    assert got == {"m-r1-h100": Desired(1, 0, False, False)}


@pytest.mark.parametrize(
    ("need", "serving", "pressed"),
    [
        (0.0, 0, False),  # no batch work
        (100.0, 0, True),  # work waits and nothing serves it
        (1799.0, 3, False),  # 3 × 1000 × 60 % = 1800 serve it
        (1801.0, 3, True),
    ],
)
def test_batch_presses_when_it_needs_more_than_what_serves_gives(
    need: float, serving: int, pressed: bool
) -> None:
    assert deadline_pressure(need, serving, 1000.0, 0.6) is pressed


def test_a_scaled_object_is_applied_again_only_when_a_field_we_set_moved() -> None:
    have = {"spec": {"fallback": {"replicas": 3, "failureThreshold": 3}, "extra": 1}}
    assert covers(have, {"spec": {"fallback": {"replicas": 3}}})
    assert not covers(have, {"spec": {"fallback": {"replicas": 4}}})
    assert not covers({"spec": {"triggers": [1]}}, {"spec": {"triggers": [1, 2]}})
    # an absent field meets a wanted false only where asked (KEDA's omitempty write-back)
    lean = {"spec": {"advanced": {}}}
    wanted = {"spec": {"advanced": {"restoreToOriginalReplicaCount": False}}}
    assert not covers(lean, wanted)
    assert covers(lean, wanted, absent_is_false=True)
    assert not covers(lean, {"spec": {"advanced": {"x": True}}}, absent_is_false=True)


def test_long_lists_of_names_are_cut_with_a_count() -> None:
    assert named(["b", "a"]) == "a, b"
    assert named([f"p{i:02d}" for i in range(25)]).endswith("p19 and 5 more")
