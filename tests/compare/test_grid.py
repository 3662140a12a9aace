"""The sweeps: each policy's default knobs, `--grid`, and the scale-in that follows a swept
scale-out."""

from __future__ import annotations

from pathlib import Path

import pytest

from sageserve.compare.grid import (
    QUANTILE,
    SCALE_IN,
    SCALE_OUT,
    VALVE,
    Axis,
    expand,
    matching_scale_in,
    parse_grid,
)
from sageserve.sim.scenario import load_scenario, with_policy_settings

TINY = Path(__file__).parents[1] / "sim" / "fixtures" / "tiny"


def test_defaults_sweep_what_the_equal_slo_comparison_swept() -> None:
    jobs = expand(["reactive", "lt-u", "lt-ua"], {})
    knobs = {j.policy: {p for p, _ in j.knobs} for j in jobs}
    assert knobs == {"reactive": {SCALE_OUT}, "lt-u": {QUANTILE}, "lt-ua": {QUANTILE, VALVE}}
    ua = [j for j in jobs if j.policy == "lt-ua"]
    assert len(ua) == 9  # 3 quantiles × 3 valves
    assert ua[0].label == "quantile=0.5 overloadEmu=0.8"
    assert ua[0].settings == (f"{QUANTILE}=0.5", f"{VALVE}=0.8")
    # the long names are the same strategies
    assert [j.knobs for j in expand(["lt-utilization-arima"], {})] == [j.knobs for j in ua]


@pytest.mark.parametrize(
    ("out", "policy_in", "set_in"),
    [
        (0.7, 0.3, None),  # kept: the earlier sweep held 0.3 under every threshold
        (0.4, 0.3, None),
        (0.3, 0.3, 0.1286),  # the CRD refuses in ≥ out: the paper's 30/70 ratio instead
        (0.2, 0.3, 0.0857),
    ],
)
def test_matching_scale_in(out: float, policy_in: float, set_in: float | None) -> None:
    assert matching_scale_in(out, policy_in) == set_in


def test_every_default_reactive_point_is_a_valid_policy() -> None:
    sc = load_scenario(TINY)
    jobs = expand(["reactive"], {"reactive": [Axis(SCALE_OUT, (0.2, 0.5, 0.9))]})
    assert jobs[0].settings == (f"{SCALE_OUT}=0.2", f"{SCALE_IN}=0.0857")
    assert jobs[1].settings == (f"{SCALE_OUT}=0.5",)
    for job in jobs:
        with_policy_settings(sc, job.settings)  # raises on a CEL rule


def test_a_swept_or_fixed_scale_in_is_left_alone() -> None:
    grid = parse_grid([f"reactive:{SCALE_OUT}=0.2", f"reactive:{SCALE_IN}=0.1"])
    (job,) = expand(["reactive"], grid)
    assert job.settings == (f"{SCALE_OUT}=0.2", f"{SCALE_IN}=0.1")
    (job,) = expand(["reactive"], parse_grid([f"reactive:{SCALE_OUT}=0.2"]), [f"{SCALE_IN}=0.05"])
    assert job.settings == (f"{SCALE_IN}=0.05", f"{SCALE_OUT}=0.2")


def test_grid_replaces_the_default_and_multiplies() -> None:
    grid = parse_grid(["lt-ua:forecast.quantile=0.6,0.8", "lt-ua:forecastGap.overloadEmu=1"])
    jobs = expand(["reactive", "lt-ua"], grid)
    ua = [j.label for j in jobs if j.policy == "lt-ua"]
    assert ua == ["quantile=0.6 overloadEmu=1", "quantile=0.8 overloadEmu=1"]
    assert sum(j.policy == "reactive" for j in jobs) == 6  # reactive keeps its default


def test_grid_values_are_deduplicated() -> None:
    assert parse_grid(["reactive:thresholds.scaleOutEmu=0.5,0.5,0.6"]) == {
        "reactive": [Axis(SCALE_OUT, (0.5, 0.6))]
    }


@pytest.mark.parametrize(
    ("item", "message"),
    [
        ("reactive", "expected POLICY:PATH=V1,V2"),
        ("reactive:thresholds.scaleOutEmu", "expected POLICY:PATH=V1,V2"),
        ("reactive:thresholds.scaleOutEmu=high", "values must be numbers"),
        ("reactive:thresholds.scaleOutEmu=", "no values"),
    ],
)
def test_bad_grid(item: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_grid([item])


def test_grid_for_a_policy_not_compared_is_an_error() -> None:
    with pytest.raises(ValueError, match="add it to --policy"):
        expand(["reactive"], parse_grid(["lt-ua:forecast.quantile=0.9"]))
