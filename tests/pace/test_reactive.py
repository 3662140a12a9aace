"""The reactive and siloed baselines follow the 70/30 rule with a 15 s cooldown."""

from __future__ import annotations

import pytest

from sageserve.core.types import (
    IW_F,
    NIW,
    ActionKind,
    EndpointKey,
    EndpointObservation,
)
from sageserve.pace import (
    PacingStrategy,
    ReactiveParams,
    SiloedReactive,
    UnifiedReactive,
    available_strategies,
    make_strategy,
)

KEY = EndpointKey("llama-2-70b", "us-east")


def obs(t: float, emu: float, serving: int = 4, prov: int = 0, lo: int = 2, hi: int = 10):
    return EndpointObservation(t, KEY, emu, serving, prov, 0, lo, hi)


def test_scales_out_above_70_percent() -> None:
    acts = [a for a in [UnifiedReactive().step(obs(0.0, 0.71), None)] if a]
    assert [(a.kind, a.count) for a in acts] == [(ActionKind.SCALE_OUT, 1)]


def test_scales_in_below_30_percent() -> None:
    acts = [a for a in [UnifiedReactive().step(obs(0.0, 0.29), None)] if a]
    assert [a.kind for a in acts] == [ActionKind.SCALE_IN]


def test_holds_between_the_thresholds() -> None:
    assert UnifiedReactive().step(obs(0.0, 0.5), None) is None


def test_respects_min_and_max_instances() -> None:
    s = UnifiedReactive()
    assert s.step(obs(0.0, 0.1, serving=2, lo=2), None) is None
    assert s.step(obs(100.0, 0.95, serving=10, hi=10), None) is None


def test_capacity_on_its_way_counts_against_scaling_out_again() -> None:
    # 4 serving at 80% + 1 provisioning -> 64% of the capacity coming: no second scale-out
    assert UnifiedReactive().step(obs(0.0, 0.8, serving=4, prov=1), None) is None
    literal = UnifiedReactive(ReactiveParams(count_provisioning=False))
    assert literal.step(obs(0.0, 0.8, serving=4, prov=1), None) is not None
    # the paper's literal rule by name, for `sageserve simulate --policy reactive-paper`
    paper = make_strategy("reactive-paper", {"count_provisioning": True})
    assert paper.name == "reactive-paper"
    assert paper.step(obs(0.0, 0.8, serving=4, prov=1), None) is not None


def test_unified_sends_every_tier_to_one_pool_and_batch_through_the_queue() -> None:
    s = UnifiedReactive()
    assert s.layout.pool_for(IW_F) == s.layout.pool_for(NIW) == "unified"
    assert s.batch_via_queue_manager


def test_siloed_splits_pools_16_to_4_and_routes_batch_directly() -> None:
    s = SiloedReactive()
    assert s.layout.split(20) == {"interactive": 16, "batch": 4}
    assert s.layout.pool_for(IW_F) == "interactive"
    assert s.layout.pool_for(NIW) == "batch"
    assert not s.batch_via_queue_manager


def test_strategies_are_chosen_by_name_behind_one_interface() -> None:
    assert {"reactive", "siloed"} <= set(available_strategies())
    for name in ("reactive", "siloed"):
        s = make_strategy(name, {"scale_out_above": 0.8})
        assert isinstance(s, PacingStrategy)
        assert s.name == name
        assert not s.plan_cadence.plans and not s.periodic
    with pytest.raises(KeyError, match="unknown scaling strategy"):
        make_strategy("nope")


def test_an_endpoint_still_coming_up_does_not_scale_out_again() -> None:
    # no serving instance yet (signal reads 100%), one provisioning: wait for it
    assert UnifiedReactive().step(obs(0.0, 1.0, serving=0, prov=1, lo=0), None) is None
