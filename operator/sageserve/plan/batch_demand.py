"""The batch part of the planned demand ρ: the paper's buffer β, or the queue's deadline need.

SageServe §6.3 plans ρ(m, r) = provisioned interactive forecast + β, β being 10 % of the
batch (NIW) load received in the last hour: headroom for the batch work the coming hour
brings, which the Queue Manager releases into troughs of interactive load (§6.2). When the
troughs cannot absorb what arrives, the queue grows until its 24 h deadlines (§3) pass, and
β, a share of what *arrived*, does not see it. The queue's deadline need does: the tokens/s
a model's queued requests need, served earliest deadline first, for every one of them to
finish by its deadline (`dispatch.deadlines.required_tps`).

**The batch part of ρ is max(β, need), not β + need.** β is headroom for batch still to
arrive; the need already counts every request that is queued, including the last hour's
arrivals that β is a share of. Their sum would count that hour twice and over-provision by
β in every hour the queue is behind. The trade-off: while the need is the larger, the plan
keeps no separate headroom for batch arriving during the hour; such work has a full
deadline ahead of it, so it raises the need only a little, and the next hourly cycle sees it
in the need it reads then.

**The need is per model, the plan per (model, region).** The queue is global per model
(§6.2): any region's troughs can serve it. Its need is split over the model's regions in
proportion to their planned interactive demand, so the extra instances land where the
model already runs and every region's troughs grow by the same fraction (the simulator's
decision step shares the need among a model's serving instances alike); evenly when no
region has interactive demand, so that no region is favoured on no information.

Both worlds call this through `plan.cycle.run_plan_cycle`: the operator with the need the
routers export (`metrics.queries.batch_deadline_need`), the simulator with its Queue
Manager's.
"""

from __future__ import annotations

import math
from collections.abc import Mapping


def usable_tps(value: float) -> float:
    """`value` as a rate the plan may act on: a finite value ≥ 0, else 0.

    Why: a reading that is not a rate (NaN, ±inf, negative) must neither inflate the plan
    nor lower it; 0 is "no need", which leaves the paper's β in force."""
    return value if math.isfinite(value) and value > 0 else 0.0


def batch_demand_tps(beta: float, need: float) -> float:
    """The batch tokens/s one (model, region) is planned for: max(β, need) (module doc:
    why the larger of the two and not their sum). A need that is not a usable rate counts
    as none."""
    return max(beta, usable_tps(need))


def split_need(need: float, interactive: Mapping[str, float]) -> dict[str, float]:
    """A model's deadline need split over its regions in proportion to their planned
    interactive tokens/s `interactive[region]`; evenly when none is above 0. Every region
    of `interactive` gets an entry (0 where it takes no share); the shares sum to the need.
    A need or a demand that is not a usable rate counts as 0."""
    total = usable_tps(need)
    weights = {r: usable_tps(v) for r, v in interactive.items()}
    if total <= 0 or not weights:
        return dict.fromkeys(weights, 0.0)
    top = max(weights.values())
    if top <= 0:
        return dict.fromkeys(weights, total / len(weights))
    scaled = {r: w / top for r, w in weights.items()}  # a sum of huge rates stays finite
    mass = sum(scaled.values())
    return {r: total * w / mass for r, w in scaled.items()}
