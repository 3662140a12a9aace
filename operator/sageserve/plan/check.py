"""Independent check of a plan against its problem: every constraint, recomputed from the
JSON values alone (not from solver internals). Used by the property tests, and cheap enough to
run on every plan before acting on it."""

from __future__ import annotations

from sageserve.plan.problem import PlanProblem
from sageserve.plan.result import PlanResult

TOL = 1e-6


def violations(problem: PlanProblem, plan: PlanResult) -> list[str]:  # noqa: C901 — one check per constraint of SageServe §5, read top to bottom against the paper
    """Human-readable list of broken constraints; empty when the plan is valid."""
    p = problem
    out: list[str] = []
    if plan.status == "infeasible":
        return out if not plan.target else ["infeasible plan carries targets"]
    w = p.windows()
    for m in p.models:
        for r in p.regions:
            for g in p.gpu_types:
                n = p.current_instances(m, r, g)
                x = plan.target.get(m, {}).get(r, {}).get(g)
                d = plan.delta.get(m, {}).get(r, {}).get(g)
                if x is None:
                    if n > 0:
                        out.append(f"{m}/{r}/{g}: current {n} but no target")
                    continue
                if p.theta(m, g) is None and x > 0:
                    out.append(f"{m}/{r}/{g}: target {x} on a GPU the model cannot use")
                if x < 0:
                    out.append(f"{m}/{r}/{g}: C3 broken, target {x} < 0")
                if d != x - n:
                    out.append(f"{m}/{r}/{g}: delta {d} != target {x} - current {n}")

    def cap(m: str, r: str) -> float:
        return sum(
            (p.theta(m, g, r) or 0.0) * x for g, x in plan.target.get(m, {}).get(r, {}).items()
        )

    for m in p.models:
        total_cap, total_short = 0.0, 0.0
        summed = [0.0] * w
        for r in p.regions:
            series = p.demand(m, r)
            peak = max(series, default=0.0)
            short = plan.shortfall_tps.get(m, {}).get(r, 0.0)
            if short < -TOL or short > peak * (1 + TOL) + TOL:
                out.append(f"{m}/{r}: shortfall {short} outside [0, peak {peak}]")
            c = cap(m, r)
            if c + p.epsilon * short < p.epsilon * peak * (1 - TOL) - 1e-3:
                out.append(
                    f"{m}/{r}: C1 broken, capacity {c:.3f} < ε·peak "
                    f"{p.epsilon * peak:.3f} (shortfall {short})"
                )
            total_cap += c
            total_short += short
            for k, v in enumerate(series):
                summed[k] += v
            b = p.bound(m, r)
            count = sum(plan.target.get(m, {}).get(r, {}).values())
            if count < b.min or (b.max is not None and count > b.max):
                out.append(f"{m}/{r}: {count} instances outside bounds [{b.min}, {b.max}]")
        need = max(summed, default=0.0)
        if total_cap + total_short < need * (1 - TOL) - 1e-3:
            out.append(
                f"{m}: C2 broken, capacity {total_cap:.3f} < peak of summed demand "
                f"{need:.3f} (shortfall {total_short})"
            )
    for r in p.regions:
        for g in p.gpu_types:
            limit = p.gpu_cap(r, g)
            if limit is None:
                continue
            used = sum(
                p.gpus_per_instance.get(m, {}).get(g, 0)
                * plan.target.get(m, {}).get(r, {}).get(g, 0)
                for m in p.models
            )
            if used > limit:
                out.append(f"{r}/{g}: {used} GPUs used > {limit} available")
    if plan.status == "optimal" and plan.shortfall_tps:
        out.append("status optimal but shortfall reported")
    gamma = sum(
        p.instance_cost(m, g) * d
        for m, per_r in plan.delta.items()
        for per_g in per_r.values()
        for g, d in per_g.items()
    )
    mu = sum(
        p.startup_cost(m, g) * max(0, d)
        for m, per_r in plan.delta.items()
        for per_g in per_r.values()
        for g, d in per_g.items()
    )
    if plan.objective is not None and abs(plan.objective - (gamma + mu)) > 1e-6 * max(
        1.0, abs(gamma) + abs(mu)
    ):
        out.append(f"objective {plan.objective} != γ+μ {gamma + mu}")
    return out
