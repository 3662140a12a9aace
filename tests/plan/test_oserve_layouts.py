"""OServe layouts on Kubernetes, the pure parts: switch stepping (OServe §5.2 executed
make-before-break), the layout's targets over the plan's, the budget, types and rates from
the router's shape buckets (§5.1), measured capacity files and per-variant weights (§4.2)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from sageserve.api.model_deployment import ModelDeployment
from sageserve.api.scaling_policy import ScalingPolicySpec
from sageserve.core.snapshot import Plan
from sageserve.core.types import EndpointKey
from sageserve.forecast.request_types import shape_bucket
from sageserve.perf.model import load_catalog
from sageserve.plan.layout_search import LayoutSpace, Strategy
from sageserve.plan.layout_switch import plan_switch, switch_targets
from sageserve.plan.oserve_layouts import (
    LayoutTargets,
    analytical_capacity,
    budget_gpus,
    forecast_windows,
    horizon_bounds,
    layout_forecast_spec,
    layout_groups,
    layout_history_seconds,
    mix_from_buckets,
    parse_measured,
    type_series,
    variant_weights,
    with_layouts,
)

TP4, PP2 = Strategy(4), Strategy(4, 2)
#: a crossing: TP4 best for short requests per GPU, TP4xPP2 for long prompts
SPACE = LayoutSpace({TP4: (2.0, 0.2), PP2: (2.2, 1.0)})
KEY = EndpointKey("m", "r1")


def md_raw(variants: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "sageserve.io/v1alpha1",
        "kind": "ModelDeployment",
        "metadata": {"name": "m", "namespace": "ns"},
        "spec": {
            "model": {"name": "meta-llama/Llama-2-70b-hf"},
            "engine": {"image": "vllm/vllm-openai:v0.11.0"},
            "variants": variants
            or [
                {
                    "name": "tp4",
                    "gpuType": "NVIDIA-H100-80GB-HBM3",
                    "gpusPerInstance": 4,
                    "capacityTokensPerSecond": 1000,
                },
                {
                    "name": "tp4pp2",
                    "gpuType": "NVIDIA-H100-80GB-HBM3",
                    "gpusPerInstance": 8,
                    "tensorParallel": 4,
                    "pipelineParallel": 2,
                    "capacityTokensPerSecond": 1000,
                },
                {
                    "name": "a100",
                    "gpuType": "NVIDIA-A100-SXM4-80GB",
                    "gpusPerInstance": 8,
                    "capacityTokensPerSecond": 1000,
                },
            ],
            "regions": [{"name": "r1", "minInstances": 0, "maxInstances": 8}],
            "tiers": ["iw-f"],
            "policyRef": {"name": "p"},
        },
    }


MD = ModelDeployment.model_validate(md_raw())
(GROUP,) = layout_groups(MD)


# ---- switch stepping -------------------------------------------------------------------------


def _plan(current: list[Strategy], target: list[Strategy], budget: int) -> Any:
    return plan_switch(SPACE, current, target, budget, (1.0, 1.0), 60.0)


@pytest.mark.parametrize(
    ("current", "target", "budget", "ready", "done", "expected", "expected_done", "finished"),
    [
        # make-before-break (16 GPUs, 8 held): the start is taken at once ...
        ([TP4, TP4], [PP2], 16, {}, 0, {TP4: 2, PP2: 1}, 1, False),
        # ... the stops wait while the new replica is not Ready ...
        ([TP4, TP4], [PP2], 16, {TP4: 2, PP2: 0}, 1, {TP4: 2, PP2: 1}, 1, False),
        # ... and go together once it is
        ([TP4, TP4], [PP2], 16, {TP4: 2, PP2: 1}, 1, {TP4: 0, PP2: 1}, 3, True),
        # taken stops are never undone when the new replica fails later
        ([TP4, TP4], [PP2], 16, {PP2: 0}, 3, {TP4: 0, PP2: 1}, 3, True),
        # no spare GPUs (8 of 8 held): break-before-make, both stops first, then the start
        ([TP4, TP4], [PP2], 8, {}, 0, {TP4: 0, PP2: 1}, 3, True),
        # the stop waits for the started replica, not for the kept ones (the harness's rule)
        ([TP4, TP4], [TP4, PP2], 16, {TP4: 2, PP2: 0}, 0, {TP4: 2, PP2: 1}, 1, False),
        ([TP4, TP4], [TP4, PP2], 16, {TP4: 1, PP2: 1}, 0, {TP4: 1, PP2: 1}, 2, True),
        # starts only: finished at once (targets up, nothing waits)
        ([TP4], [TP4, TP4], 16, {}, 0, {TP4: 2}, 1, True),
    ],
)
def test_a_switch_plan_steps_as_the_started_replicas_become_ready(
    current: list[Strategy],
    target: list[Strategy],
    budget: int,
    ready: dict[Strategy, int],
    done: int,
    expected: dict[Strategy, int],
    expected_done: int,
    finished: bool,
) -> None:
    progress = switch_targets(_plan(current, target, budget), ready, done)
    assert (progress.targets, progress.done, progress.finished) == (
        expected,
        expected_done,
        finished,
    )


def test_stepping_never_drops_below_the_smaller_layout_with_spare_gpus() -> None:
    """Walk the plan as replicas come up one per step: the Ready capacity never falls
    below min(old, new) (the make-before-break promise)."""
    plan = _plan([TP4, TP4, TP4, TP4], [PP2, PP2], 32)
    done, ready = 0, {TP4: 4, PP2: 0}
    floor = min(plan.capacity_before, plan.capacity_after)
    from sageserve.plan.layout_switch import capacity_at_mix

    for _ in range(6):
        progress = switch_targets(plan, ready, done)
        done = progress.done
        # Ready replicas: the kept old ones up to the target, the new ones one more per step
        ready = {
            TP4: min(ready[TP4], progress.targets[TP4]),
            PP2: min(progress.targets[PP2], ready[PP2] + 1),
        }
        layout = [TP4] * ready[TP4] + [PP2] * ready[PP2]
        assert capacity_at_mix(SPACE, layout, (1.0, 1.0)) >= floor - 1e-9
    assert progress.finished and progress.targets == {TP4: 0, PP2: 2}


def test_done_out_of_range_is_refused() -> None:
    with pytest.raises(ValueError, match="done: 9"):
        switch_targets(_plan([TP4], [PP2], 16), {}, 9)


# ---- the layout over the plan ----------------------------------------------------------------


def test_the_layout_overrides_the_plans_targets_of_its_variants_only() -> None:
    other = EndpointKey("m", "r2")
    plan = Plan(100.0, {(KEY, "tp4"): 4, (KEY, "a100"): 1, (other, "tp4"): 2}, {KEY: 9.0})
    layouts = LayoutTargets({(KEY, "tp4"): 2, (KEY, "tp4pp2"): 1}, changed_at=200.0)
    got = with_layouts(plan, layouts)
    assert got is not None
    assert dict(got.variant_targets) == {
        (KEY, "tp4"): 2,
        (KEY, "tp4pp2"): 1,
        (KEY, "a100"): 1,
        (other, "tp4"): 2,
    }
    assert got.computed_at == 100.0 and got.forecasts == {KEY: 9.0}  # LT-UA's timing kept
    assert got.targets[KEY] == 4
    assert got.layout_targets(KEY) == {"tp4": 2, "tp4pp2": 1}
    assert got.layout_targets(other) == {}


@pytest.mark.parametrize(
    ("plan", "expected"),
    [
        (None, None),
        (Plan(5.0, {(KEY, "tp4"): 1}), Plan(5.0, {(KEY, "tp4"): 1})),
    ],
)
def test_no_layout_leaves_the_plan_alone(plan: Plan | None, expected: Plan | None) -> None:
    assert with_layouts(plan, LayoutTargets()) == expected


def test_with_no_plan_the_layout_is_the_plan() -> None:
    got = with_layouts(None, LayoutTargets({(KEY, "tp4pp2"): 1}, 7.0))
    assert got is not None and got.computed_at == 7.0
    assert got.layout_targets(KEY) == {"tp4pp2": 1}


# ---- budget -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("plan", "replicas", "expected"),
    [
        # the plan's instances of the GPU type (the ILP plans the first variant) × GPUs
        (Plan(0.0, {(KEY, "tp4"): 3, (KEY, "a100"): 2}), {"tp4": 1}, (12, "plan")),
        (Plan(0.0, {(KEY, "tp4"): 1, (KEY, "tp4pp2"): 1}), {}, (12, "plan")),
        # a plan that covers another endpoint only: what the pod sets hold
        (Plan(0.0, {(EndpointKey("m", "r9"), "tp4"): 3}), {"tp4": 2, "tp4pp2": 1}, (16, "held")),
        (None, {"tp4": 2, "a100": 5}, (8, "held")),
        (None, {}, (0, "held")),
    ],
)
def test_the_budget_is_the_plans_gpus_else_the_gpus_held(
    plan: Plan | None, replicas: dict[str, int], expected: tuple[int, str]
) -> None:
    assert budget_gpus(GROUP, "r1", plan, replicas) == expected


# ---- groups -----------------------------------------------------------------------------------


def test_only_gpu_types_with_two_variants_are_layouts() -> None:
    assert [g.gpu_type for g in layout_groups(MD)] == ["NVIDIA-H100-80GB-HBM3"]
    assert GROUP.names == ("tp4", "tp4pp2")
    assert GROUP.layout({"tp4": 2, "tp4pp2": 1}) == (TP4, TP4, PP2)
    assert GROUP.replicas([PP2, TP4]) == {"tp4": 1, "tp4pp2": 1}


def test_two_variants_of_one_parallelism_are_refused_naming_the_variant() -> None:
    raw = md_raw(
        [
            {"name": "a", "gpuType": "G", "gpusPerInstance": 4, "capacityTokensPerSecond": 1000},
            {
                "name": "b",
                "gpuType": "G",
                "gpusPerInstance": 4,
                "tensorParallel": 4,
                "capacityTokensPerSecond": 1,
            },
        ]
    )
    with pytest.raises(ValueError, match=r"spec.variants\[b\]: same .* as variant a"):
        layout_groups(ModelDeployment.model_validate(raw))


# ---- types and rates from the router's buckets ------------------------------------------------


def _buckets(*requests: tuple[int, int, float]) -> dict[tuple[str, str], float]:
    out: dict[tuple[str, str], float] = {}
    for p, o, c in requests:
        key = (shape_bucket(p), shape_bucket(o))
        out[key] = out.get(key, 0.0) + c
    return out


@pytest.mark.parametrize(
    ("counts", "seconds", "centroids", "expected"),
    [
        # two measured types: short (100/100) and long prompt (2000/20)
        (_buckets((100, 100, 60), (2000, 20, 30)), 60.0, [(100, 100), (2000, 20)], (1.0, 0.5)),
        # a bucket goes to the nearest centroid in log space
        (_buckets((300, 100, 60)), 60.0, [(100, 100), (2000, 20)], (1.0, 0.0)),
        # no counts in the window: no mix
        ({}, 60.0, [(100, 100)], None),
        ({("128", "64"): 0.0}, 60.0, None, None),
    ],
)
def test_rates_per_type_from_the_buckets(
    counts: dict[tuple[str, str], float],
    seconds: float,
    centroids: list[tuple[float, float]] | None,
    expected: tuple[float, ...] | None,
) -> None:
    mix = mix_from_buckets(counts, seconds, centroids=centroids)
    if expected is None:
        assert mix is None
    else:
        assert mix is not None and mix.rates == pytest.approx(expected)


def test_without_a_table_the_buckets_are_clustered_weighted() -> None:
    counts = _buckets((100, 100, 600), (2000, 20, 300), (110, 90, 1))
    mix = mix_from_buckets(counts, 300.0, k=2)
    assert mix is not None and len(mix.centroids) == 2
    assert sum(mix.rates) == pytest.approx(901 / 300)
    short, long_ = mix.centroids
    assert short[0] < 200 < long_[0]  # numbered by prompt length
    assert mix.rates == pytest.approx((601 / 300, 300 / 300))


def test_a_bucket_label_that_is_no_bound_is_refused() -> None:
    with pytest.raises(ValueError, match="not a shape bucket bound"):
        mix_from_buckets({("100", "64"): 3.0}, 60.0)


# ---- capacity ---------------------------------------------------------------------------------


def test_analytical_n_comes_from_the_profile_of_each_variants_parallelism() -> None:
    rows = analytical_capacity(load_catalog(), MD, GROUP, [(129, 13), (2009, 15)])
    assert set(rows) == {TP4, PP2}
    assert rows[TP4][0] == pytest.approx(63.6, rel=0.02)  # docs/results/oserve.md's table
    assert rows[PP2][1] == pytest.approx(7.86, rel=0.02)


def test_a_model_with_no_profile_is_refused_naming_the_annotations() -> None:
    raw = md_raw()
    raw["spec"]["model"]["name"] = "org/unknown-model"
    raw["metadata"]["name"] = "unknown"
    md = ModelDeployment.model_validate(raw)
    with pytest.raises(ValueError, match=r"sageserve.io/perf-profile.*sageserve.io/type-capacity"):
        analytical_capacity(load_catalog(), md, layout_groups(md)[0], [(100, 100)])


MEASURED = {
    "kind": "sageserve.io/type-capacity",
    "model": "llama-2-70b",
    "gpuType": "NVIDIA-H100-80GB-HBM3",
    "types": [
        {"promptTokens": 100, "outputTokens": 100},
        {"promptTokens": 2000, "outputTokens": 20},
    ],
    "capacity": {"TP4": [2.0, 0.2], "TP4xPP2": [2.2, 1.0]},
}


def test_a_measured_table_gives_the_declared_variants_rows() -> None:
    table = parse_measured(MEASURED)
    assert table.centroids == ((100.0, 100.0), (2000.0, 20.0))
    assert table.rows(GROUP) == {TP4: (2.0, 0.2), PP2: (2.2, 1.0)}


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"kind": "ConfigMap"}, "kind is 'ConfigMap'"),
        ({"types": []}, "types must list"),
        ({"types": [{"promptTokens": "x", "outputTokens": 1}]}, r"types\[0\] needs numeric"),
        ({"capacity": {"TP4": [1.0]}}, "capacity.TP4 has 1 values for 2 types"),
        ({"capacity": {"TP4": [1.0, -1.0]}}, "capacity.TP4: n must be finite"),
        ({"capacity": "TP4"}, "capacity must map"),
        ({"gpuType": None}, "gpuType missing"),
    ],
)
def test_a_broken_table_is_refused_naming_the_field(change: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_measured({**MEASURED, **change})


def test_a_table_without_a_declared_layout_names_the_calibrate_command() -> None:
    table = parse_measured({**MEASURED, "capacity": {"TP4": [2.0, 0.2]}})
    with pytest.raises(ValueError, match=r"no row 'TP4xPP2' for variant tp4pp2.*--strategies"):
        table.rows(GROUP)


# ---- weights ----------------------------------------------------------------------------------


def test_weights_per_variant_sum_the_assignment_over_its_replicas() -> None:
    capacity = {TP4: (2.0, 0.2), PP2: (2.2, 1.0)}
    # short requests to the two TP4 replicas, long prompts to the pipeline
    weights = variant_weights(GROUP, capacity, [TP4, TP4, PP2], (3.0, 0.8))
    assert weights[1]["tp4pp2"] > 0.9
    assert weights[0]["tp4"] > 0.5
    assert all(sum(w.values()) == pytest.approx(1.0, abs=1e-3) for w in weights)


def test_a_type_without_demand_is_shared_by_n() -> None:
    capacity = {TP4: (2.0, 0.2), PP2: (2.2, 1.0)}
    weights = variant_weights(GROUP, capacity, [TP4, PP2], (1.0, 0.0))
    assert weights[1]["tp4"] == pytest.approx(0.2 / 1.2, abs=1e-3)
    assert weights[1]["tp4pp2"] == pytest.approx(1 / 1.2, abs=1e-3)


# ---- the same rule as the benchmark harness ---------------------------------------------------


def _harness_walk(plan: Any, rng: Any) -> list[tuple[dict[Strategy, int], dict[Strategy, int]]]:
    """An independent re-statement of `sim.oserve_fleet.Fleet._advance`: starts at once,
    a stop waits until no started replica is still starting; replicas become Ready one at a
    time in random order. Returns (Ready replicas, replicas held) after each event."""
    from collections import deque

    held = [(s, True) for s in plan.current]  # (strategy, ready)
    actions = deque(plan.actions)
    out = []

    def advance() -> None:
        while actions:
            a = actions[0]
            if a.kind == "start":
                actions.popleft()
                held.append((a.strategy, False))
                continue
            if any(not r for _, r in held):
                return
            actions.popleft()
            held.remove((a.strategy, True))

    def counts(ready_only: bool) -> dict[Strategy, int]:
        c: dict[Strategy, int] = {}
        for s, r in held:
            if r or not ready_only:
                c[s] = c.get(s, 0) + 1
        return c

    advance()
    out.append((counts(True), counts(False)))
    while any(not r for _, r in held):
        starting = [i for i, (_, r) in enumerate(held) if not r]
        i = rng.choice(starting)
        held[i] = (held[i][0], True)
        advance()
        out.append((counts(True), counts(False)))
    return out


@pytest.mark.parametrize("seed", range(12))
def test_switch_targets_steps_exactly_as_the_harness_executes(seed: int) -> None:
    import random

    rng = random.Random(seed)
    tp8 = Strategy(8)
    space = LayoutSpace({TP4: (2.0, 0.2), PP2: (2.2, 1.0), tp8: (2.1, 0.4)})
    pool = [TP4, PP2, tp8]
    budget = rng.choice([16, 24, 32])
    current = [rng.choice(pool) for _ in range(rng.randint(1, 2))]
    target = [rng.choice(pool) for _ in range(rng.randint(1, 2))]
    plan = plan_switch(space, current, target, budget, (1.0, 0.5), 60.0, node_gpus=8)
    done = 0
    for ready, held in _harness_walk(plan, rng):
        progress = switch_targets(plan, ready, done)
        done = progress.done
        assert {s: n for s, n in progress.targets.items() if n} == held
    assert progress.finished


# ---- per-type forecasts (the request types and their share forecast per window) ----

NAN = float("nan")
SHORT, LONG = (shape_bucket(100), shape_bucket(100)), (shape_bucket(2000), shape_bucket(20))
HOUR_SPEC = layout_forecast_spec(ScalingPolicySpec(), 3600)


def _mean(windows: Any, j: int) -> float:
    total = sum(w.duration_s for w in windows)
    return float(sum(w.duration_s * w.rates[j] for w in windows) / total)


def _noisy(level: float, n: int = 60, seed: int = 1) -> list[float]:
    rng = np.random.default_rng(seed)
    return [float(level * (1 + 0.03 * e)) for e in rng.standard_normal(n)]


@pytest.mark.parametrize(
    ("name", "series", "check"),
    [
        # a ramp is forecast above its history mean (and above its last value on average)
        ("ramp", [0.01 * (i + 1) for i in range(60)], lambda f, m: f > 1.5 * m),
        # a constant (noisy) rate is forecast at its mean
        ("constant", _noisy(0.5), lambda f, m: f == pytest.approx(m, rel=0.05)),
        # a few missing minutes are gaps, not zero demand: still at its mean
        (
            "gaps",
            [NAN if i in (10, 30, 50) else v for i, v in enumerate(_noisy(0.5))],
            lambda f, m: f == pytest.approx(m, rel=0.05),
        ),
    ],
)
def test_a_type_is_forecast_with_the_policy_method(name: str, series: Any, check: Any) -> None:
    observed = [v for v in series if v == v]
    mean = sum(observed) / len(observed)
    fc = forecast_windows([series], [mean], HOUR_SPEC, "arima", 600)
    assert fc.methods == ("arima",), fc.notes
    assert [w.duration_s for w in fc.windows] == [600.0] * 6
    assert check(_mean(fc.windows, 0), mean), (name, _mean(fc.windows, 0), mean)


def test_a_ramps_windows_rise_and_the_summary_names_the_method() -> None:
    ramp = [0.01 * (i + 1) for i in range(60)]
    fc = forecast_windows([ramp], [0.305], HOUR_SPEC, "arima", 600)
    rates = [w.rates[0] for w in fc.windows]
    assert rates == sorted(rates) and rates[0] > 0.6
    head = "per-type forecast over 3600 s in 6 windows: type 0 0.305"
    assert fc.summary([0.305]).startswith(head)


@pytest.mark.parametrize(
    ("series", "why"),
    [
        ([0.2] * 20, "too little history: 20 points, arima needs 60"),
        ([NAN] * 30 + _noisy(0.2, 30), "too many gaps: 50% of the last 60 points are missing"),
        ([NAN] * 60, "no observations in the history"),
    ],
)
def test_a_type_the_forecaster_cannot_fit_keeps_its_measured_rate(series: Any, why: str) -> None:
    fc = forecast_windows([_noisy(0.5), series], [0.5, 0.2], HOUR_SPEC, "arima", 600)
    assert fc.methods == ("arima", "persisted")
    assert all(w.rates[1] == 0.2 for w in fc.windows)
    assert fc.notes == (f"type 1: {why}; its measured rate persists",)


def test_windows_are_replan_long_at_most_twelve_and_the_last_one_shorter() -> None:
    assert horizon_bounds(1500, 600) == [(0, 600), (600, 1200), (1200, 1500)]
    fc = forecast_windows([_noisy(0.5)], [0.5], HOUR_SPEC, "arima", 10)
    assert [w.duration_s for w in fc.windows] == [300.0] * 12
    with pytest.raises(ValueError):
        horizon_bounds(0, 600)


def test_the_horizon_is_the_history_within_the_policys_reach() -> None:
    policy = ScalingPolicySpec()
    assert (HOUR_SPEC.lead_seconds, HOUR_SPEC.horizon_seconds, HOUR_SPEC.step_seconds) == (
        0.0,
        3600.0,
        60.0,
    )
    assert layout_forecast_spec(policy, 600).horizon_seconds == 600.0
    assert layout_forecast_spec(policy, 7200).horizon_seconds == 3600.0
    # the history read covers what the forecaster fits on (arima: the training hour)
    assert layout_history_seconds(policy, 600) == 3600.0
    assert layout_history_seconds(policy, 7200) == 7200.0
    ensemble = ScalingPolicySpec.model_validate({"forecast": {"method": "ensemble"}})
    assert layout_history_seconds(ensemble, 3600) == 8 * 3600.0  # peak-regression: 8 horizons


def test_type_series_sums_buckets_by_type_gaps_stay_gaps() -> None:
    series = {
        SHORT: [0.5, NAN, 0.5, 0.5],
        (shape_bucket(150), shape_bucket(90)): [0.1, NAN, NAN, 0.1],  # no request yet at 2
        LONG: [NAN, NAN, 0.2, 0.3],  # its counter appears at step 2
    }
    cents = ((100.0, 100.0), (2000.0, 20.0))
    short, long = type_series(series, cents)
    assert short[0] == 0.6 and short[2] == 0.5 and short[3] == pytest.approx(0.6)
    assert long[0] == 0.0 and long[2] == 0.2 and long[3] == 0.3
    assert short[1] != short[1] and long[1] != long[1]  # no bucket answered: a gap
    # series are aligned on now: a shorter one is missing at the start
    (only,) = type_series({SHORT: [0.1, 0.2, 0.3], LONG: [0.4]}, [(100.0, 100.0)])
    assert only == [0.1, 0.2, pytest.approx(0.7)]
    with pytest.raises(ValueError):
        type_series({("7", "8"): [1.0]}, cents)


@pytest.mark.parametrize("measured", [True, False])
def test_type_series_uses_the_mixs_types_measured_or_fitted(measured: bool) -> None:
    """The series are classified as `mix_from_buckets` classified the history's counts,
    into a measured table's centroids or the weighted k-means': per type, the series'
    mean is the mix's rate."""
    counts = {SHORT: 1800.0, LONG: 720.0, (shape_bucket(3000), shape_bucket(30)): 360.0}
    cents = ((100.0, 100.0), (2500.0, 25.0)) if measured else None
    mix = mix_from_buckets(counts, 3600.0, k=2, centroids=cents)
    assert mix is not None
    series = {k: [c / 3600.0] * 60 for k, c in counts.items()}
    per_type = type_series(series, mix.centroids)
    assert [sum(s) / len(s) for s in per_type] == pytest.approx(list(mix.rates))
    assert sorted(mix.rates) == pytest.approx([0.3, 0.5])
