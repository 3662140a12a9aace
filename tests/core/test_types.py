"""Domain types behave as the policy code assumes."""

from __future__ import annotations

from sageserve.core.types import (
    DEFAULT_TIERS,
    IW_F,
    NIW,
    EndpointKey,
    EndpointObservation,
)


def test_paper_tiers_have_the_paper_slos() -> None:
    assert IW_F.interactive and IW_F.ttft_slo_s == 1.0
    assert DEFAULT_TIERS["IW-N"].ttft_slo_s == 60.0
    assert not NIW.interactive
    assert NIW.deadline_s == 24 * 3600 and NIW.promotion_age_s == 10 * 3600


def test_observation_active_counts_serving_and_provisioning() -> None:
    o = EndpointObservation(0.0, EndpointKey("m", "r"), 0.5, 3, 2, 1, 1, 10)
    assert o.active == 5
    assert o.key.pool == "unified"
