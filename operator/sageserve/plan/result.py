"""The planner's output (the ``plan.json`` side of the contract, see ``docs/plan-json.md``)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

PlanStatus = Literal["optimal", "shortfall", "time_limit", "infeasible"]


class PlanResult(BaseModel):
    """Instance targets per (model, region, GPU type) and how they were obtained.

    ``status``:
    - ``optimal``: all demand served, cost proven minimal (within ``mip_gap``);
    - ``shortfall``: not all demand can be served with the GPUs/bounds given; the plan serves
      higher tiers first and ``shortfall_tps`` says what is left unserved;
    - ``time_limit``: the solver's budget ran out with a feasible plan that is not proven
      optimal (``mip_gap`` tells how far it may be). The budget is the deterministic node
      limit; ``reason`` says when the wall-clock safety stop cut the solve instead (then, and
      only then, the plan depends on the machine). ScalingPolicy's status uses this name;
    - ``infeasible``: no plan exists even with shortfall (e.g. min bounds need more GPUs than
      there are), or no plan was found within the budget; ``reason`` says which.
    """

    model_config = ConfigDict(extra="forbid")

    status: PlanStatus
    reason: str | None = None
    target: dict[str, dict[str, dict[str, int]]] = Field(default_factory=dict)
    delta: dict[str, dict[str, dict[str, int]]] = Field(default_factory=dict)
    objective: float | None = None
    gamma: float | None = None
    mu: float | None = None
    shortfall_tps: dict[str, dict[str, float]] = Field(default_factory=dict)
    shortfall_tps_by_tier: dict[str, dict[str, dict[str, float]]] = Field(default_factory=dict)
    solve_seconds: float = 0.0
    solver: str = ""
    mip_gap: float | None = None
