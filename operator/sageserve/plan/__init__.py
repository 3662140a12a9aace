"""Hourly provisioning plan: SageServe's ILP (HiGHS by default, CBC fallback), its JSON
contract (``docs/plan-json.md``), a plan checker, and the cross-region spill-over flow."""

from sageserve.plan.ilp import PlanOptions, solve_plan
from sageserve.plan.problem import InstanceBounds, PlanProblem
from sageserve.plan.result import PlanResult

__all__ = ["InstanceBounds", "PlanOptions", "PlanProblem", "PlanResult", "solve_plan"]
