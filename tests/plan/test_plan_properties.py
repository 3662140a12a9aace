"""Property tests: every plan the solver returns satisfies every constraint, and on tiny
instances its cost equals the brute-force optimum."""

from __future__ import annotations

import itertools
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sageserve.plan import PlanOptions, PlanProblem, solve_plan
from sageserve.plan.check import violations


@st.composite
def problems(
    draw: st.DrawFn, max_models: int = 2, max_regions: int = 2, max_gpus: int = 2
) -> dict[str, Any]:
    models = [f"m{i}" for i in range(draw(st.integers(1, max_models)))]
    regions = [f"r{j}" for j in range(draw(st.integers(1, max_regions)))]
    gpus = [f"g{k}" for k in range(draw(st.integers(1, max_gpus)))]
    capacity: dict[str, dict[str, float]] = {}
    gpi: dict[str, dict[str, int]] = {}
    startup: dict[str, dict[str, float]] = {}
    for m in models:
        usable = draw(st.lists(st.sampled_from(gpus), min_size=1, unique=True))
        capacity[m] = {g: float(draw(st.integers(50, 400))) for g in usable}
        gpi[m] = {g: draw(st.integers(1, 4)) for g in usable}
        startup[m] = {g: float(draw(st.integers(0, 1800))) for g in usable}
    current = {
        m: {r: {g: draw(st.integers(0, 2)) for g in capacity[m]} for r in regions} for m in models
    }
    demand = {
        m: {r: [float(draw(st.integers(0, 900))) for _ in range(2)] for r in regions}
        for m in models
    }
    data: dict[str, Any] = {
        "models": models,
        "regions": regions,
        "gpu_types": gpus,
        "current": current,
        "demand_tps": demand,
        "capacity_tps": capacity,
        "gpus_per_instance": gpi,
        "gpu_hour_cost": {g: float(draw(st.integers(1, 8))) for g in gpus},
        "startup_seconds": startup,
        "epsilon": draw(st.sampled_from([0.5, 1.0])),
        # Every (model, region) has at most 3 instances: brute force can enumerate 0..3.
        "bounds": {
            m: {r: {"min": draw(st.integers(0, 1)), "max": 3} for r in regions} for m in models
        },
    }
    if draw(st.booleans()):
        data["gpu_capacity"] = {r: {g: draw(st.integers(0, 12)) for g in gpus} for r in regions}
    return data


def brute_force(p: PlanProblem) -> float | None:
    """Minimum γ+μ over all integer targets with at most 3 instances per (model, region)."""
    cells = [
        (m, r, g)
        for m in p.models
        for r in p.regions
        for g in p.gpu_types
        if p.theta(m, g) is not None
    ]
    best: float | None = None
    for xs in itertools.product(range(4), repeat=len(cells)):
        x = dict(zip(cells, xs, strict=True))
        ok = True
        for m in p.models:
            total = 0.0
            summed = [0.0] * p.windows()
            for r in p.regions:
                cap = sum(
                    p.theta(m, g) * x[(m, r, g)]
                    for g in p.gpu_types  # type: ignore[operator]
                    if (m, r, g) in x
                )
                series = p.demand(m, r)
                if cap < p.epsilon * max(series):
                    ok = False
                count = sum(x[(m, r, g)] for g in p.gpu_types if (m, r, g) in x)
                b = p.bound(m, r)
                if count < b.min or (b.max is not None and count > b.max):
                    ok = False
                total += cap
                summed = [a + b_ for a, b_ in zip(summed, series, strict=True)]
            if total < max(summed):
                ok = False
        for r in p.regions:
            for g in p.gpu_types:
                limit = p.gpu_cap(r, g)
                used = sum(
                    p.gpus_per_instance[m][g] * x[(m, r, g)] for m in p.models if (m, r, g) in x
                )
                if limit is not None and used > limit:
                    ok = False
        if not ok:
            continue
        cost = 0.0
        for (m, r, g), v in x.items():
            d = v - p.current_instances(m, r, g)
            cost += p.instance_cost(m, g) * d + p.startup_cost(m, g) * max(0, d)
        best = cost if best is None or cost < best else best
    return best


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problems())
def test_every_returned_plan_satisfies_every_constraint(data: dict[str, Any]) -> None:
    problem = PlanProblem.model_validate(data)
    plan = solve_plan(problem)
    assert plan.status in ("optimal", "shortfall", "infeasible")
    assert violations(problem, plan) == []


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    problems(max_models=2, max_regions=2, max_gpus=2).filter(
        lambda d: sum(len(c) for c in d["capacity_tps"].values()) * len(d["regions"]) <= 6
    )
)
def test_small_instances_match_brute_force(data: dict[str, Any]) -> None:
    problem = PlanProblem.model_validate(data)
    plan = solve_plan(problem, PlanOptions(mip_gap=1e-9))  # exact, to compare with brute force
    best = brute_force(problem)
    if best is None:
        # No plan meets all demand: the planner must say so, not claim optimality.
        assert plan.status in ("shortfall", "infeasible")
    else:
        assert plan.status == "optimal"
        assert plan.objective is not None
        assert abs(plan.objective - best) <= 1e-6 * max(1.0, abs(best))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(problems(max_models=3, max_regions=3, max_gpus=3))
def test_greedy_fallback_plan_satisfies_every_constraint(data: dict[str, Any]) -> None:
    from sageserve.plan.ilp import _Data

    problem = PlanProblem.model_validate(data)
    d = _Data(problem)
    _, layout = d.build(shortfall=False)
    values = d.greedy(layout)
    if values is None:
        return
    plan = d.result_from("time_limit", values, {}, "greedy", None, 0.0, "greedy")
    assert violations(problem, plan) == []
