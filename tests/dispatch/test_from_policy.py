"""A ScalingPolicy's `spec.routing` as the region router and the Queue Manager apply it
(`dispatch.from_policy`, the one mapping the simulator and the router share)."""

from __future__ import annotations

from typing import Any

import pytest

from sageserve.api.scaling_policy import ScalingPolicySpec
from sageserve.dispatch.from_policy import release_rules_of, route_threshold_of
from sageserve.dispatch.queue_manager import DEFAULT_RELEASE_RULES, release_count
from sageserve.dispatch.region_router import DEFAULT_ROUTE_THRESHOLD


def spec(routing: dict[str, Any]) -> ScalingPolicySpec:
    return ScalingPolicySpec.model_validate({"routing": routing})


@pytest.mark.parametrize(
    ("routing", "threshold", "rules"),
    [
        ({}, 0.7, ((0.5, 2), (0.6, 1))),  # the paper's
        ({"regionEmuThreshold": 0.5}, 0.5, ((0.5, 2), (0.6, 1))),
        ({"batchRelease": {"oneBelowEmu": 0.3, "twoBelowEmu": 0.2}}, 0.7, ((0.2, 2), (0.3, 1))),
        ({"batchRelease": {"oneBelowEmu": 0.9}}, 0.7, ((0.5, 2), (0.9, 1))),
        (
            {"regionEmuThreshold": 1.0, "batchRelease": {"oneBelowEmu": 1.0, "twoBelowEmu": 0.8}},
            1.0,
            ((0.8, 2), (1.0, 1)),
        ),
    ],
)
def test_a_policys_routing_maps_to_the_threshold_and_the_release_rules(
    routing: dict[str, Any], threshold: float, rules: tuple[tuple[float, int], ...]
) -> None:
    assert route_threshold_of(spec(routing)) == threshold
    assert release_rules_of(spec(routing)) == rules


def test_the_default_policy_is_the_default_rule() -> None:
    assert route_threshold_of(ScalingPolicySpec()) == DEFAULT_ROUTE_THRESHOLD
    assert release_rules_of(ScalingPolicySpec()) == DEFAULT_RELEASE_RULES


@pytest.mark.parametrize(
    ("emu", "default", "strict"),
    [
        (0.1, 2, 2),
        (0.2, 2, 1),  # strictly below: 0.2 is not under twoBelowEmu 0.2
        (0.25, 2, 1),
        (0.3, 2, 0),
        (0.4, 2, 0),
        (0.55, 1, 0),
        (0.6, 0, 0),
        (0.9, 0, 0),
    ],
)
def test_the_mapped_rules_release_by_the_policys_thresholds(
    emu: float, default: int, strict: int
) -> None:
    rules = release_rules_of(spec({"batchRelease": {"oneBelowEmu": 0.3, "twoBelowEmu": 0.2}}))
    assert release_count(emu, release_rules_of(ScalingPolicySpec())) == default
    assert release_count(emu, rules) == strict
