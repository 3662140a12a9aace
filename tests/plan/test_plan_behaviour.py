"""Behaviour a user of the planner would notice."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from sageserve.cli import app
from sageserve.plan import PlanOptions, PlanProblem, solve_plan
from sageserve.plan.check import violations
from sageserve.plan.flow import spillover


def base(**over: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "models": ["llama"],
        "regions": ["east", "west"],
        "gpu_types": ["h100", "a100"],
        "current": {"llama": {"east": {"h100": 2}, "west": {"a100": 1}}},
        "demand_tps": {"llama": {"east": [1500, 2500], "west": [900, 300]}},
        "capacity_tps": {"llama": {"h100": 1000, "a100": 500}},
        "gpus_per_instance": {"llama": {"h100": 4, "a100": 4}},
        "gpu_hour_cost": {"h100": 3.0, "a100": 1.5},
        "startup_seconds": {"llama": {"h100": 600, "a100": 900}},
        "epsilon": 1.0,
    }
    data.update(over)
    return data


def test_scales_out_to_cover_each_regions_peak_when_epsilon_is_one() -> None:
    plan = solve_plan(PlanProblem.model_validate(base()))
    assert plan.status == "optimal"
    east = plan.target["llama"]["east"]
    west = plan.target["llama"]["west"]
    assert 1000 * east["h100"] + 500 * east["a100"] >= 2500
    assert 1000 * west["h100"] + 500 * west["a100"] >= 900
    assert plan.delta["llama"]["east"]["h100"] == plan.target["llama"]["east"]["h100"] - 2


def test_global_constraint_uses_peak_of_summed_demand_not_sum_of_peaks() -> None:
    # Peaks at different windows: east 2000 at w0, west 2000 at w1; summed peak = 2000+100.
    data = base(
        demand_tps={"llama": {"east": [2000, 100], "west": [100, 2000]}},
        current={},
        capacity_tps={"llama": {"h100": 100}},
        gpus_per_instance={"llama": {"h100": 1}},
        gpu_types=["h100"],
        gpu_hour_cost={"h100": 1.0},
        startup_seconds={},
        epsilon=0.5,
    )
    plan = solve_plan(PlanProblem.model_validate(data))
    total = sum(x for per_r in plan.target["llama"].values() for x in per_r.values())
    assert plan.status == "optimal"
    assert total == 21  # 2100 tokens/s, not 4000: regions share capacity across windows


def test_unused_capacity_is_released_and_lowers_the_objective() -> None:
    data = base(
        current={"llama": {"east": {"h100": 10}}}, demand_tps={"llama": {"east": [500, 500]}}
    )
    plan = solve_plan(PlanProblem.model_validate(data))
    assert plan.status == "optimal"
    assert plan.target["llama"]["east"]["h100"] + plan.target["llama"]["east"]["a100"] <= 1
    assert plan.objective is not None and plan.objective < 0


def test_gpu_shortage_reports_shortfall_and_sheds_the_lowest_tier_first() -> None:
    data = base(
        current={},
        gpu_types=["h100"],
        capacity_tps={"llama": {"h100": 1000}},
        gpus_per_instance={"llama": {"h100": 4}},
        gpu_hour_cost={"h100": 3.0},
        startup_seconds={},
        demand_tps={},
        tiers=["interactive", "batch"],
        demand_tps_by_tier={
            "llama": {"east": {"interactive": [1500, 1800], "batch": [1000, 1000]}}
        },
        gpu_capacity={"east": {"h100": 8}},  # two instances = 2000 tokens/s
    )
    problem = PlanProblem.model_validate(data)
    plan = solve_plan(problem)
    assert plan.status == "shortfall"
    assert plan.shortfall_tps["llama"]["east"] == pytest.approx(800.0)
    by_tier = plan.shortfall_tps_by_tier["llama"]["east"]
    assert "interactive" not in by_tier
    assert by_tier["batch"] == pytest.approx(800.0)
    assert violations(problem, plan) == []


def test_min_bounds_that_do_not_fit_the_gpus_are_infeasible_with_a_reason() -> None:
    data = base(
        bounds={"llama": {"east": {"min": 5}}},
        gpu_capacity={"east": {"h100": 4, "a100": 4}},
    )
    plan = solve_plan(PlanProblem.model_validate(data))
    assert plan.status == "infeasible"
    assert plan.reason is not None and "east" in plan.reason
    assert plan.target == {}


def test_cbc_and_highs_find_the_same_cost() -> None:
    problem = PlanProblem.model_validate(base(epsilon=0.7))
    highs = solve_plan(problem, PlanOptions(solver="highs"))
    cbc = solve_plan(problem, PlanOptions(solver="cbc"))
    assert highs.solver == "highs" and cbc.solver == "cbc"
    assert highs.objective == pytest.approx(cbc.objective)


@pytest.mark.parametrize(
    ("patch", "field"),
    [
        ({"capacity_tps": {"llama": {"tpu": 5.0}}}, "capacity_tps.llama.tpu"),
        ({"epsilon": 0}, "epsilon"),
        ({"demand_tps": {"llama": {"mars": [1.0, 2.0]}}}, "demand_tps.llama.mars"),
        ({"gpus_per_instance": {"llama": {"h100": 4}}}, "gpus_per_instance.llama.a100"),
        ({"bounds": {"llama": {"east": {"min": 3, "max": 1}}}}, "bounds.llama.east"),
    ],
)
def test_bad_input_is_refused_naming_the_field(
    patch: dict[str, Any], field: str, tmp_path: Path
) -> None:
    path = tmp_path / "problem.json"
    path.write_text(json.dumps(base(**patch)))
    result = CliRunner().invoke(app, ["plan", "--input", str(path)])
    assert result.exit_code == 2
    assert field in result.output


def test_cli_writes_the_plan_json_contract(tmp_path: Path) -> None:
    src, out = tmp_path / "problem.json", tmp_path / "plan.json"
    src.write_text(json.dumps(base()))
    result = CliRunner().invoke(app, ["plan", "--input", str(src), "--output", str(out)])
    assert result.exit_code == 0, result.output
    plan = json.loads(out.read_text())
    assert plan["status"] == "optimal"
    assert set(plan) >= {"status", "target", "delta", "objective", "solve_seconds"}
    assert plan["target"]["llama"]["east"]["h100"] >= 0


def test_spillover_serves_locally_first_then_the_cheapest_neighbour() -> None:
    spill = spillover(
        {"east": 300.0, "west": 50.0, "far": 0.0},
        {"east": 200.0, "west": 100.0, "far": 500.0},
        cost={"east": {"west": 1.0, "far": 10.0}},
    )
    assert spill.local == {"east": 200.0, "west": 50.0}
    assert spill.routes == {"east": {"west": 50.0, "far": 50.0}}
    assert spill.unserved == {}


def test_spillover_reports_what_nobody_can_serve() -> None:
    spill = spillover({"east": 300.0, "west": 100.0}, {"east": 100.0, "west": 150.0})
    assert spill.unserved == {"east": 150.0}
    served = spill.local.get("east", 0) + sum(spill.routes.get("east", {}).values())
    assert served == 150.0


def test_the_documented_example_solves_as_documented() -> None:
    doc = (Path(__file__).resolve().parents[2] / "docs" / "plan-json.md").read_text()
    example = json.loads(doc[doc.index("```json") + 7 : doc.rindex("```")])
    problem = PlanProblem.model_validate(example)
    plan = solve_plan(problem)
    assert plan.status == "optimal"
    assert violations(problem, plan) == []
    # westus needs 0.8 × 900 tokens/s locally: one H100 instance beats two A100 ones.
    assert plan.target["llama-70b"]["westus"] == {"h100": 1, "a100": 0}


def test_no_demand_releases_everything_down_to_the_min_bound() -> None:
    data = base(demand_tps={}, bounds={"llama": {"east": {"min": 1}}})
    plan = solve_plan(PlanProblem.model_validate(data))
    assert plan.status == "optimal"
    assert sum(plan.target["llama"]["east"].values()) == 1
    assert sum(plan.target["llama"]["west"].values()) == 0


def test_demand_for_a_model_that_runs_nowhere_is_reported_as_shortfall() -> None:
    data = base(
        models=["llama", "ghost"],
        demand_tps={"llama": {"east": [100.0, 100.0]}, "ghost": {"west": [5.0, 7.0]}},
    )
    plan = solve_plan(PlanProblem.model_validate(data))
    assert plan.status == "shortfall"
    assert plan.shortfall_tps == {"ghost": {"west": 7.0}}
