"""Cross-region spill-over per model: which region serves how much of another's excess.

The ILP only guarantees that each region keeps ε of its own peak and that the model's total
capacity covers the peak of the summed demand (C2); the router still needs to know where the
rest goes. Each region first serves its own demand up to its capacity (requests are never sent
away from a region that can serve them). The excess then goes through a min-cost flow
(networkx): excess node of region r → spare node of region s with cost = ``cost[r][s]``
(default 1, e.g. inter-region latency), spare node s → sink with capacity = spare capacity of
s. Maximum flow first (serve as much as possible), then minimum cost (nearest first).
Tokens/s are scaled to integers (``resolution`` tokens/s) because networkx's network simplex
is exact only on integers.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import networkx as nx

from sageserve.plan.problem import PlanProblem
from sageserve.plan.result import PlanResult


@dataclass(frozen=True)
class SpillPlan:
    """For one model and window: ``routes[r][s]`` = tokens/s of region r's demand served in s
    (r ≠ s; local service is ``local[r]``); ``unserved[r]`` what no region can take."""

    local: dict[str, float] = field(default_factory=dict)
    routes: dict[str, dict[str, float]] = field(default_factory=dict)
    unserved: dict[str, float] = field(default_factory=dict)


def spillover(  # noqa: C901 — builds and reads one min-cost flow network; split, its node naming would be shared across functions
    demand_tps: Mapping[str, float],
    capacity_tps: Mapping[str, float],
    cost: Mapping[str, Mapping[str, float]] | None = None,
    resolution: float = 1.0,
) -> SpillPlan:
    """Route each region's demand to regions with capacity (see module docstring)."""
    regions = sorted(set(demand_tps) | set(capacity_tps))
    graph = nx.DiGraph()
    src, sink = ("src",), ("sink",)
    local: dict[str, float] = {}
    for r in regions:
        d0 = max(demand_tps.get(r, 0.0), 0.0)
        c0 = max(capacity_tps.get(r, 0.0), 0.0)
        if min(d0, c0) > 0:
            local[r] = min(d0, c0)
        d = round((d0 - min(d0, c0)) / resolution)
        c = round((c0 - min(d0, c0)) / resolution)
        if d > 0:
            graph.add_edge(src, ("demand", r), capacity=d, weight=0)
        if c > 0:
            graph.add_edge(("serve", r), sink, capacity=c, weight=0)
    for r in regions:
        if not graph.has_node(("demand", r)):
            continue
        for s in regions:
            if s == r or not graph.has_node(("serve", s)):
                continue
            weight = float((cost or {}).get(r, {}).get(s, 1.0))
            # Integer weights keep network simplex exact; 1e3 keeps 3 decimals of the cost.
            graph.add_edge(("demand", r), ("serve", s), weight=round(weight * 1000))
    if not graph.has_node(src):
        return SpillPlan(local=local)
    if not graph.has_node(sink):
        excess = {
            r: graph[src][("demand", r)]["capacity"] * resolution
            for r in regions
            if graph.has_edge(src, ("demand", r))
        }
        return SpillPlan(local=local, unserved=excess)
    flow = nx.max_flow_min_cost(graph, src, sink)
    routes: dict[str, dict[str, float]] = {}
    unserved: dict[str, float] = {}
    for r in regions:
        node = ("demand", r)
        if node not in flow:
            continue
        sent = 0
        for (kind, s), amount in flow[node].items():
            if kind != "serve" or amount <= 0:
                continue
            sent += amount
            routes.setdefault(r, {})[s] = amount * resolution
        left = graph[src][node]["capacity"] - sent
        if left > 0:
            unserved[r] = left * resolution
    return SpillPlan(local, routes, unserved)


def spillover_for_plan(
    problem: PlanProblem,
    plan: PlanResult,
    model: str,
    cost: Mapping[str, Mapping[str, float]] | None = None,
) -> list[SpillPlan]:
    """One spill plan per forecast window for ``model``, using the plan's targets."""
    capacity = {
        r: sum((problem.theta(model, g, r) or 0.0) * x for g, x in per_g.items())
        for r, per_g in plan.target.get(model, {}).items()
    }
    series = {r: problem.demand(model, r) for r in problem.regions}
    return [
        spillover({r: s[w] for r, s in series.items()}, capacity, cost)
        for w in range(problem.windows())
    ]
