"""The sentence a comparison ends with: which policy to pick on the compared traffic, and
why, computed from the runs' figures.

Why: the tables say what each policy costs at the target; whoever chooses a policy wants
the answer in one line with its reason. It is read off the summary document, so a summary
read again at another target (`--from`) gets the sentence for that target, and it says no
more than the runs measured:

- a run *qualifies* when it holds the target attainment on the compared tier and misses no
  NIW deadline inside its horizon (a run that misses one never reaches the frontier either,
  `compare.frontier`);
- the pick is the policy with the cheapest qualifying run (fewest GPU-hours; equal
  GPU-hours: the higher attainment, then the order the policies were given), named with
  that run's knobs: a setting that was run, not one read between two frontier points;
- the reason: that run's attainment, GPU-hours and scalings; the saving against the next
  policy's cheapest qualifying run; the cheaper runs that fall short; the policies with no
  qualifying run, each with its best.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Run:
    """The figures of one finished run that the sentence reads."""

    policy: str
    label: str
    gpu_hours: float
    attainment: float
    niw_missed: int = 0
    scalings: int = 0

    @property
    def name(self) -> str:
        """The policy and its knobs, e.g. `reactive (scaleOutEmu=0.5)`."""
        return f"{self.policy} ({self.label})"


def runs(doc: Mapping[str, Any]) -> list[Run]:
    """Every finished run of a `sageserve.compare/v1` summary, in the policies' order."""
    out: list[Run] = []
    for name, p in doc["policies"].items():
        for q in p["points"]:
            if q.get("error") is not None or q.get("attainment") is None:
                continue
            out.append(
                Run(
                    name,
                    q["label"],
                    float(q["gpu_hours"]),
                    float(q["attainment"]),
                    int(q.get("niw_missed") or 0),
                    int(q.get("scale_events") or 0),
                )
            )
    return out


def qualifies(run: Run, target: float) -> bool:
    """Holds the target and misses no NIW deadline inside its horizon."""
    return run.attainment >= target and run.niw_missed == 0


def _pct(x: float) -> str:
    return f"{x:.2%}"


def _shortfall(run: Run, target: float) -> str:
    """Why a run does not qualify, in a few words."""
    if run.attainment < target:
        return _pct(run.attainment)
    return f"{_pct(run.attainment)} but {run.niw_missed:,} NIW deadlines missed"


def _never(policy: str, mine: Sequence[Run], target: float) -> str:
    """The clause for a policy none of whose runs qualifies."""
    best = max(mine, key=lambda r: (r.attainment, -r.niw_missed))
    if best.attainment < target:
        return f"{policy} never reaches the target (best {_pct(best.attainment)})"
    return f"{policy} misses NIW deadlines wherever it reaches the target"


def _cheapest(candidates: Sequence[Run], order: Sequence[str]) -> Run:
    return min(candidates, key=lambda r: (r.gpu_hours, -r.attainment, order.index(r.policy)))


def best_run(every: Sequence[Run], target: float, order: Sequence[str]) -> Run | None:
    """The run to pick: the cheapest that qualifies (equal GPU-hours: the higher attainment,
    then the policy given first); None when no run qualifies."""
    good = [r for r in every if qualifies(r, target)]
    return _cheapest(good, order) if good else None


def recommendation(doc: Mapping[str, Any]) -> str:
    """One sentence: the policy to pick on this comparison's traffic and why (module doc)."""
    tier, target = str(doc["tier"]), float(doc["target"])
    order = list(doc["policies"])
    every = runs(doc)
    if not every:
        return "No run finished, so there is nothing to pick."
    pick = best_run(every, target, order)
    if pick is None:
        clean = [r for r in every if r.niw_missed == 0] or every
        best = max(clean, key=lambda r: (r.attainment, -r.gpu_hours))
        return (
            f"No policy holds {tier} at {_pct(target)} with every NIW deadline met on this "
            f"traffic; the closest is {best.name} at {_shortfall(best, target)} for "
            f"{best.gpu_hours:,.1f} GPU-h: read the runs at a lower target (--from) or "
            "sweep further (--grid)."
        )
    text = (
        f"Pick {pick.name} on this traffic: it holds {tier} at {_pct(pick.attainment)} "
        f"(target {_pct(target)}) and every NIW deadline for {pick.gpu_hours:,.1f} GPU-h and "
        f"{pick.scalings:,} scalings"
    )
    others = [r for r in every if r.policy != pick.policy and qualifies(r, target)]
    if others:
        nxt = _cheapest(others, order)
        saving = 1.0 - pick.gpu_hours / nxt.gpu_hours if nxt.gpu_hours > 0 else 0.0
        text += (
            f", {saving:.1%} fewer GPU-hours than {nxt.policy} ({nxt.label}: "
            f"{nxt.gpu_hours:,.1f} GPU-h, {nxt.scalings:,} scalings), the next cheapest that "
            "holds both"
        )
    clauses = _short_of_it(pick, every, target, order)
    if clauses:
        text += "; " + ", ".join(clauses[:-1]) + (" and " if len(clauses) > 1 else "")
        text += clauses[-1]
    return text + "."


def _short_of_it(pick: Run, every: Sequence[Run], target: float, order: Sequence[str]) -> list[str]:
    """The clauses on what did not qualify: the cheaper runs (the closest named), then each
    policy none of whose runs qualifies."""
    clauses: list[str] = []
    cheaper = [r for r in every if r.gpu_hours < pick.gpu_hours and not qualifies(r, target)]
    if cheaper:
        near = max(cheaper, key=lambda r: (r.attainment, -r.niw_missed))
        many = len(cheaper) > 1
        clauses.append(
            f"{len(cheaper)} cheaper run{'s' if many else ''} fall{'' if many else 's'} short "
            f"({'the closest: ' if many else ''}{near.policy} {near.label} at "
            f"{_shortfall(near, target)})"
        )
    for name in order:
        mine = [r for r in every if r.policy == name]
        if mine and not any(qualifies(r, target) for r in mine):
            clauses.append(_never(name, mine, target))
    return clauses
