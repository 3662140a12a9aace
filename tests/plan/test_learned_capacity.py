"""θ learned from the fleet's windows: what qualifies, when it is trusted, its bounds."""

from __future__ import annotations

import pytest

from sageserve.api.scaling_policy import ScalingPolicySpec
from sageserve.plan.learned_capacity import (
    CapacityWindow,
    LearnSettings,
    learn,
    learn_one,
    model_theta_in_force,
    planned_theta,
    recorded_theta,
    settings_for,
    tier_slo_met,
    weighted_quantile,
)

DECLARED = 1000.0
S = LearnSettings(
    learn=True, min_windows=3, quantile=0.5, min_emu=0.3, at_emu=0.7, scale_to_emu=True
)


def win(at: float, tps: float, n: float = 2, emu: float = 0.7, ok: bool | None = True):
    return CapacityWindow(at, "m", "a100", "east", tps, n, emu, ok)


@pytest.mark.parametrize(
    ("windows", "trusted", "in_force", "qualifying"),
    [
        # no windows: the declared θ
        ([], False, DECLARED, 0),
        # two at the threshold: learned 1,300 per instance but not yet trusted
        ([win(0, 2600), win(60, 2600)], False, DECLARED, 2),
        # three at the threshold: trusted, per instance
        ([win(0, 2600), win(60, 2600), win(120, 2600)], True, 1300.0, 3),
        # scaled to the threshold: a window at half its EMU counts double its tokens/s
        ([win(0, 1000, emu=0.35)] * 3, True, 1000.0, 3),
        # SLO missed or unjudged, or too idle: not evidence
        (
            [win(0, 2600, ok=False), win(0, 2600, ok=None), win(0, 2600, emu=0.1)] * 2,
            False,
            DECLARED,
            0,
        ),
        # far above the declared θ: bounded by declared × maxFactor
        ([win(0, 10000)] * 3, True, 2000.0, 3),
        # far below: bounded by declared × minFactor
        ([win(0, 200)] * 3, True, 500.0, 3),
        # no serving instance: no per-instance figure
        ([win(0, 2600, n=0)] * 3, False, DECLARED, 0),
    ],
)
def test_learned_theta_table(
    windows: list[CapacityWindow], trusted: bool, in_force: float, qualifying: int
) -> None:
    got = learn_one(windows, DECLARED, 120.0, S)
    assert got.trusted is trusted
    assert got.in_force_tps == pytest.approx(in_force)
    assert got.qualifying == qualifying
    assert got.declared_tps == DECLARED


def test_old_windows_are_forgotten_and_recent_ones_weigh_more() -> None:
    s = LearnSettings(min_windows=1, history_s=3600, half_life_s=600, quantile=0.5)
    assert s.scale_to_emu is False  # the default: tokens/s per instance as served
    old = [win(0, 1400)] * 5  # older than the history at now = 4000: forgotten
    assert learn_one(old, DECLARED, 4000.0, s).qualifying == 0
    # five windows an hour old (weight 1/64 each) against one recent window: the recent wins
    mixed = [win(400, 1400)] * 5 + [win(3990, 2400)]
    got = learn_one(mixed, DECLARED, 4000.0, s)
    assert got.windows == 6 and got.trusted
    assert got.learned_tps == pytest.approx(1200.0)


def test_by_default_a_window_counts_what_each_instance_served() -> None:
    raw = LearnSettings(min_windows=3, quantile=0.9)
    windows = [win(0, 2000, emu=0.35), win(60, 2400, emu=0.5), win(120, 2600, emu=0.6)]
    got = learn_one(windows, DECLARED, 120.0, raw)
    assert got.trusted and got.in_force_tps == pytest.approx(1300.0)  # the 0.9 quantile
    scaled = learn_one(windows, DECLARED, 120.0, S)  # × 0.7 / EMU: 2000, 1680, 1517
    assert scaled.in_force_tps == pytest.approx(1680.0)


def test_quantile_one_is_preserves_max() -> None:
    assert weighted_quantile([(3.0, 1.0), (9.0, 1.0), (5.0, 1.0)], 1.0) == 9.0
    assert weighted_quantile([(3.0, 1.0), (9.0, 1.0), (5.0, 1.0)], 0.5) == 5.0


def test_per_key_and_per_region_for_the_plan() -> None:
    east = [win(0, 2600)] * 3
    west = [CapacityWindow(0, "m", "a100", "west", 1800, 2, 0.7, True)] * 6
    declared = {("m", "a100", "east"): DECLARED, ("m", "a100", "west"): DECLARED}
    declared[("m", "h100", "east")] = 2000.0
    got = learn(east + west, declared, 60.0, S)
    assert got[("m", "h100", "east")].trusted is False
    assert got[("m", "a100", "west")].in_force_tps == pytest.approx(900.0)
    # each region plans with its own trusted θ; the untrusted h100 keeps its declared θ
    assert planned_theta(got) == {
        ("m", "a100", "east"): pytest.approx(1300.0),
        ("m", "a100", "west"): pytest.approx(900.0),
    }


@pytest.mark.parametrize(
    ("p95", "samples", "slo", "met"),
    [
        ({"iw-f": 0.5}, {"iw-f": 10}, {"iw-f": 1.0}, True),
        ({"iw-f": 1.5}, {"iw-f": 10}, {"iw-f": 1.0}, False),
        ({"iw-f": 0.5, "iw-n": 9.0}, {"iw-f": 10, "iw-n": 3}, {"iw-f": 1.0, "iw-n": 5.0}, False),
        ({"iw-f": 0.5, "iw-n": 9.0}, {"iw-f": 10, "iw-n": 0}, {"iw-f": 1.0, "iw-n": 5.0}, True),
        ({}, {}, {"iw-f": 1.0}, None),
    ],
)
def test_a_window_meets_the_slo_when_every_tier_with_traffic_did(
    p95: dict[str, float], samples: dict[str, int], slo: dict[str, float], met: bool | None
) -> None:
    assert tier_slo_met(p95, samples, slo) is met


def test_settings_from_the_policy_and_their_errors() -> None:
    spec = ScalingPolicySpec.model_validate(
        {"capacity": {"learn": True, "minWindows": 5}, "thresholds": {"scaleOutEmu": 0.8}}
    )
    s = settings_for(spec)
    assert (s.learn, s.min_windows, s.at_emu) == (True, 5, 0.8)
    assert ScalingPolicySpec().capacity.learn is False
    with pytest.raises(ValueError, match=r"spec\.capacity\.maxFactor"):
        LearnSettings(max_factor=0.9)


DECLARED_TABLE = {
    ("m", "a100", "east"): 1000.0,
    ("m", "a100", "west"): 1000.0,
    ("m", "h100", "east"): 2500.0,
    ("other", "a100", "east"): 9000.0,
}


@pytest.mark.parametrize(
    ("model", "in_force", "theta"),
    [
        # nothing learned: the fastest declared variant (the declared-only rule)
        ("m", None, 2500.0),
        ("m", {}, 2500.0),
        # a region's trusted θ above every declared one: deadlines are judged with it
        ("m", {("m", "a100", "west"): 3100.0}, 3100.0),
        # the fastest variant learned slower than declared: the largest θ in force now
        ("m", {("m", "h100", "east"): 900.0}, 1000.0),
        ("m", {("m", "h100", "east"): 900.0, ("m", "a100", "east"): 1200.0}, 1200.0),
        # another model's θ is not this one's
        ("m", {("other", "a100", "east"): 50000.0}, 2500.0),
        # a model with nothing declared: no capacity to judge with
        ("absent", {("absent", "a100", "east"): 100.0}, 0.0),
    ],
)
def test_model_theta_in_force_for_deadlines(
    model: str, in_force: dict[tuple[str, str, str], float] | None, theta: float
) -> None:
    assert model_theta_in_force(model, DECLARED_TABLE, in_force) == theta


def entry(variant: str = "a100", region: str = "east", **kw: object) -> dict[str, object]:
    base: dict[str, object] = {
        "variant": variant,
        "region": region,
        "declaredTokensPerSecond": 1000.0,
        "inForceTokensPerSecond": 1400.0,
        "windows": 40,
        "qualifyingWindows": 35,
        "trusted": True,
    }
    return {**base, **kw}


@pytest.mark.parametrize(
    ("status", "recorded"),
    [
        (None, {}),
        ({}, {}),
        ({"capacity": "not a list"}, {}),
        ({"capacity": [entry()]}, {("m", "a100", "east"): 1400.0}),
        # not trusted: the plan sizes with the declared θ there
        ({"capacity": [entry(trusted=False)]}, {}),
        # entries that do not validate, or hold no usable θ, are left out, the rest kept
        (
            {
                "capacity": [
                    entry(inForceTokensPerSecond=-5),
                    entry(region="west", inForceTokensPerSecond="fast"),
                    entry(region="north", inForceTokensPerSecond=0),
                    {"variant": "h100"},
                    entry("h100"),
                ]
            },
            {("m", "h100", "east"): 1400.0},
        ),
    ],
)
def test_the_theta_in_force_recorded_in_status(
    status: dict[str, object] | None, recorded: dict[tuple[str, str, str], float]
) -> None:
    obj = {} if status is None else {"status": status}
    assert recorded_theta("m", obj) == recorded
