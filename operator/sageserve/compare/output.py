"""What a comparison leaves behind: `summary.json` (every point, each front, the reading at
the target), `frontier.png` and `report.html`.

Schema `sageserve.compare/v1` (fields are only added within v1):

    {"schema": "sageserve.compare/v1",
     "scenario": {"name", "path", "window": {"start_s", "end_s"}, "seed"},
     "tier": "iw-f", "target": 0.95, "settings": [common --set], "baseline": "<policy>",
     "bounds": {"floor_gpu_hours", "lower_bound_gpu_hours", "oracle_gpu_hours",
                "capacity_bound_gpu_hours" (when runs measured it)} | null,
     "reference": {"policy", "setting", "gpu_hours", "slo": {"<tier>": attainment},
                   "niw_deadline_attainment", "niw_missed", "scale_events"} | null
        (the achievable reference, `sim.reference`; with --reference),
     "runs": {"backend", "count", "failed", "wall_s"},
     "policies": {"<policy>": {
        "strategy", "knobs": [PATH, ...],
        "points": [{"label", "knobs": {PATH: value}, "settings": [PATH=VALUE, ...],
                    "attainment", "gpu_hours", "provisioning_gpu_hours", "instance_hours",
                    "slo": {"<tier>": attainment}, "iw_ttft_p95_s", "unfinished", "refused",
                    "refused_no_instance",
                    "scale_events", "wall_s", "on_frontier", "error",
                    "niw_deadline_attainment", "niw_missed", "niw_queued_beyond_horizon",
                    "niw_feasible_at_max",
                    "summary": {the policy's sageserve.sim.summary/v1 entry}}],
        "niw_excluded": count of points kept off the frontier for missing NIW deadlines,
        "frontier": [{"label", "gpu_hours", "attainment"}],   # cheapest first
        "at_target": {"status", "gpu_hours", "note",
                      "vs_baseline": {"ratio", "relation": "=" | "≤" | "≥"} | null,
                      "below", "above", "best"}}}},
     "recommendation": "the one sentence the comparison ends with (compare.recommend)"}

A point with `niw_missed` > 0 (batch deadlines inside its horizon served late or not
served, `sim.deadlines`) is never `on_frontier`: `compare.frontier` keeps it off. Summaries
written before these fields read as points without misses.
"""

from __future__ import annotations

import copy
import html
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sageserve.compare.frontier import (
    AtTarget,
    Point,
    at_target,
    meets_batch_deadlines,
    pareto_front,
    saving,
)
from sageserve.compare.grid import canonical
from sageserve.compare.recommend import recommendation
from sageserve.compare.runner import Outcome
from sageserve.sim.bounds import describe_bounds
from sageserve.sim.reference import describe_reference

SCHEMA = "sageserve.compare/v1"


@dataclass
class PolicyResult:
    """One policy's points, front and reading at the target."""

    name: str
    outcomes: list[Outcome]
    tier: str
    target: float
    points: list[Point] = field(init=False)
    front: list[Point] = field(init=False)
    at: AtTarget = field(init=False)

    def __post_init__(self) -> None:
        self.points = [
            Point(
                o.task.job.label,
                o.result["gpu_hours"],
                o.result["slo"].get(self.tier, math.nan),
                int(o.result.get("niw_missed") or 0),
            )
            for o in self.outcomes
            if o.result is not None
        ]
        self.front = pareto_front(self.points)
        self.at = at_target(self.front, self.target)


def group(outcomes: Sequence[Outcome], tier: str, target: float) -> dict[str, PolicyResult]:
    """Outcomes per policy, in the order the policies were given."""
    names: list[str] = []
    for o in outcomes:
        if o.task.job.policy not in names:
            names.append(o.task.job.policy)
    return {
        n: PolicyResult(n, [o for o in outcomes if o.task.job.policy == n], tier, target)
        for n in names
    }


def _pt(p: Point | None) -> dict[str, Any] | None:
    if p is None:
        return None
    return {"label": p.label, "gpu_hours": p.gpu_hours, "attainment": p.attainment}


def policy_doc(res: PolicyResult, baseline: PolicyResult | None) -> dict[str, Any]:
    on_front = {p.label for p in res.front}
    points = []
    for o in res.outcomes:
        job = o.task.job
        entry: dict[str, Any] = {
            "label": job.label,
            "knobs": {p: v for p, v in job.knobs},
            "settings": list(job.settings),
            "attainment": None,
            "on_frontier": False,
            "error": o.error,
        }
        if o.result is not None:
            att = o.result["slo"].get(res.tier)
            entry["attainment"] = att
            entry["on_frontier"] = job.label in on_front
            entry.update(o.result)
        points.append(entry)
    excluded = excluded_for_niw(res.points)
    at = at_target_doc(
        res.at, baseline.at if baseline is not None and baseline is not res else None
    )
    return {
        "strategy": canonical(res.name),
        "knobs": [p for p, _ in res.outcomes[0].task.job.knobs] if res.outcomes else [],
        "points": points,
        "frontier": [_pt(p) for p in res.front],
        "niw_excluded": excluded,
        "at_target": with_niw_note(at, excluded, bool(res.front)),
    }


def excluded_for_niw(points: Sequence[Point]) -> int:
    """How many points the frontier leaves out for missing batch deadlines."""
    return len(points) - len(meets_batch_deadlines(points))


def with_niw_note(at: dict[str, Any], excluded: int, front: bool) -> dict[str, Any]:
    """The `at_target` entry, its note saying when points were kept off the frontier for
    missing NIW deadlines (and when that left no frontier at all)."""
    if excluded and not front:
        at["note"] = f"every point misses NIW deadlines inside the horizon ({excluded})"
    elif excluded:
        at["note"] += f"; {excluded} point{'s' if excluded > 1 else ''} off: NIW misses"
    return at


def at_target_doc(at: AtTarget, baseline: AtTarget | None) -> dict[str, Any]:
    """The `at_target` entry of a policy; `baseline` None for the baseline itself."""
    vs = saving(at, baseline) if baseline is not None else None
    return {
        "status": str(at.status),
        "gpu_hours": at.gpu_hours,
        "note": at.describe(),
        "vs_baseline": {"ratio": vs.ratio, "relation": vs.relation} if vs is not None else None,
        "below": _pt(at.below),
        "above": _pt(at.above),
        "best": _pt(at.best),
    }


def retarget(doc: Mapping[str, Any], target: float) -> dict[str, Any]:
    """The same points read at another target (`sageserve compare --from`): the fronts do
    not depend on the target, so no run is repeated."""
    out: dict[str, Any] = copy.deepcopy(dict(doc))
    out["target"] = target
    ats: dict[str, AtTarget] = {}
    excluded: dict[str, tuple[int, bool]] = {}
    for name, p in out["policies"].items():
        points = [
            Point(q["label"], q["gpu_hours"], q["attainment"], int(q.get("niw_missed") or 0))
            for q in p["points"]
            if q.get("error") is None and q.get("attainment") is not None
        ]
        front = pareto_front(points)
        ats[name] = at_target(front, target)
        excluded[name] = (excluded_for_niw(points), bool(front))
    base = ats.get(out.get("baseline") or "")
    for name, p in out["policies"].items():
        doc_at = at_target_doc(ats[name], base if name != out.get("baseline") else None)
        p["at_target"] = with_niw_note(doc_at, *excluded[name])
    out["recommendation"] = recommendation(out)
    return out


def summary_doc(
    results: Mapping[str, PolicyResult],
    scenario: Mapping[str, Any],
    tier: str,
    target: float,
    settings: Sequence[str],
    bounds: Mapping[str, float] | None,
    runs: Mapping[str, Any],
) -> dict[str, Any]:
    baseline = next(iter(results.values()), None)
    doc = {
        "schema": SCHEMA,
        "scenario": dict(scenario),
        "tier": tier,
        "target": target,
        "settings": list(settings),
        "baseline": baseline.name if baseline else None,
        "bounds": dict(bounds) if bounds else None,
        "runs": dict(runs),
        "policies": {n: policy_doc(r, baseline) for n, r in results.items()},
    }
    doc["recommendation"] = recommendation(doc)
    return doc


def write_summary(path: Path, doc: Mapping[str, Any]) -> None:
    path.write_text(json.dumps(doc, indent=2) + "\n")


def plot_frontiers(path: Path, doc: Mapping[str, Any]) -> None:
    """GPU-hours against attainment: every point (hollow), each front (line, its points
    labelled), the target (dashed) and each policy's reading there (star; a triangle when
    it is only an upper bound); the oracle when known."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 5.5))
    target = float(doc["target"])
    for i, (name, p) in enumerate(doc["policies"].items()):
        color = f"C{i}"
        pts = [q for q in p["points"] if q["attainment"] is not None]
        ok = [q for q in pts if not q.get("niw_missed")]
        ax.scatter(
            [100 * q["attainment"] for q in ok],
            [q["gpu_hours"] for q in ok],
            facecolors="none",
            edgecolors=color,
            s=30,
        )
        bad = [q for q in pts if q.get("niw_missed")]
        if bad:  # kept off the frontier: NIW deadlines missed inside the horizon
            ax.scatter(
                [100 * q["attainment"] for q in bad],
                [q["gpu_hours"] for q in bad],
                marker="x",
                color=color,
                s=30,
                label=f"{name}: misses NIW deadlines (off the frontier)",
            )
        # label the front's points; runs that landed on the same figures share a label
        same: dict[tuple[float, float], list[str]] = {}
        for q in pts:
            same.setdefault((q["attainment"], q["gpu_hours"]), []).append(q["label"])
        front = p["frontier"]
        for f in front:
            names = same.get((f["attainment"], f["gpu_hours"]), [f["label"]])
            ax.annotate(
                names[0] + (f" (= {len(names) - 1} more)" if len(names) > 1 else ""),
                (100 * f["attainment"], f["gpu_hours"]),
                fontsize=6,
                color=color,
                xytext=(4, -8 if i % 2 else 4),
                textcoords="offset points",
            )
        ax.plot(
            [100 * q["attainment"] for q in front],
            [q["gpu_hours"] for q in front],
            marker="o",
            color=color,
            label=f"{name} frontier",
        )
        at = p["at_target"]
        if at["gpu_hours"] is not None:
            bound = at["status"] == "at-most"
            ax.scatter(
                [100 * target],
                [at["gpu_hours"]],
                marker="v" if bound else "*",
                s=110 if bound else 160,
                color=color,
                zorder=5,
                label=f"{name} at the target" + (" (at most: every point above)" if bound else ""),
            )
    ax.axvline(100 * target, color="grey", linestyle="--", linewidth=1, label="target")
    bounds = doc.get("bounds") or {}
    lines = (
        ("oracle_gpu_hours", ":", "θ-sized estimate (perfect foresight at θ)"),
        ("lower_bound_gpu_hours", "-", "lower bound (fluid LP)"),
        ("capacity_bound_gpu_hours", "-.", "capacity-at-SLO bound (fluid LP)"),
    )
    for key, style, label in lines:
        if key in bounds:
            ax.axhline(bounds[key], color="k", linestyle=style, linewidth=1, label=label)
    ax.set_xlabel(f"{doc['tier']} SLO attainment (%)")
    ax.set_ylabel("GPU-hours")
    ax.set_title(
        f"{doc['scenario'].get('name')}: GPU-hours against {doc['tier']} attainment "
        "(hollow: every run; line: the frontier)",
        fontsize=9,
    )
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _fmt_gpu(at: Mapping[str, Any]) -> str:
    if at["gpu_hours"] is None:
        return "—"
    prefix = "≤ " if at["status"] == "at-most" else ""
    return f"{prefix}{at['gpu_hours']:,.1f}"


def _fmt_vs(at: Mapping[str, Any]) -> str:
    vs = at.get("vs_baseline")
    if vs is None:
        return "—"
    value = f"{vs['ratio']:+.1%}"
    return value if vs["relation"] == "=" else f"{vs['relation']} {value}"


def target_rows(doc: Mapping[str, Any]) -> list[tuple[str, ...]]:
    """Rows (policy, points, frontier span, GPU-h at target, how, vs baseline) shared by the
    terminal table and the report."""
    rows: list[tuple[str, ...]] = []
    for name, p in doc["policies"].items():
        front = p["frontier"]
        span = f"{front[0]['attainment']:.2%} – {front[-1]['attainment']:.2%}" if front else "—"
        ok = sum(1 for q in p["points"] if q["error"] is None)
        at = p["at_target"]
        rows.append(
            (
                name,
                f"{ok}/{len(p['points'])}",
                f"{len(front)}",
                span,
                _fmt_gpu(at),
                at["status"],
                "—" if name == doc.get("baseline") else _fmt_vs(at),
                at["note"],
            )
        )
    return rows


TARGET_HEAD = (
    "policy",
    "runs",
    "on front",
    "front attainment",
    "GPU-h at target",
    "how",
    "vs baseline",
    "note",
)
POINT_HEAD = (
    "policy",
    "point",
    "GPU-h",
    "prov GPU-h",
    "attainment",
    "IW TTFT p95 s",
    "NIW by deadline",
    "niw_missed",
    "scalings",
    "front",
)

#: The marker of a point kept off the frontier for missing NIW deadlines.
NIW_MARK = "✗ NIW"


def point_rows(doc: Mapping[str, Any]) -> list[tuple[str, ...]]:
    rows: list[tuple[str, ...]] = []
    for name, p in doc["policies"].items():
        for q in sorted(p["points"], key=lambda q: q.get("gpu_hours") or 0.0):
            if q["error"] is not None:
                rows.append((name, q["label"], "error", "", "", "", "", "", "", q["error"][:60]))
                continue
            att = q["attainment"]
            p95 = q["iw_ttft_p95_s"]
            niw_att = q.get("niw_deadline_attainment")
            missed = int(q.get("niw_missed") or 0)
            rows.append(
                (
                    name,
                    q["label"],
                    f"{q['gpu_hours']:,.1f}",
                    f"{q['provisioning_gpu_hours']:,.1f}",
                    f"{att:.2%}" if att is not None else "—",
                    f"{p95:.3f}" if p95 is not None else "—",
                    f"{niw_att:.2%}" if niw_att is not None else "—",
                    f"{missed:,}",
                    str(q["scale_events"]),
                    "●" if q["on_frontier"] else NIW_MARK if missed else "",
                )
            )
    return rows


def _html_table(head: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    th = "".join(f"<th>{html.escape(h)}</th>" for h in head)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>" for r in rows
    )
    return f"<table><tr>{th}</tr>{body}</table>"


def write_report(out: Path, doc: Mapping[str, Any]) -> Path:
    """`frontier.png` and `report.html` in `out`; returns the HTML path."""
    plot_frontiers(out / "frontier.png", doc)
    sc = doc["scenario"]
    bounds = doc.get("bounds")
    bounds_p = f"<p>Bounds: {html.escape(describe_bounds(bounds))}.</p>" if bounds else ""
    if doc.get("reference"):
        bounds_p += f"<p>{html.escape(describe_reference(doc['reference'], doc.get('tier')))}.</p>"
    settings = " ".join(doc["settings"]) or "none"
    page = f"""<!doctype html><html><head><meta charset="utf-8">
<title>sageserve compare: {html.escape(str(sc.get("name")))}</title>
<style>body{{font-family:sans-serif;max-width:1100px;margin:auto}}
table{{border-collapse:collapse}}td,th{{border:1px solid #ccc;padding:4px 8px}}</style>
</head><body><h1>Equal-SLO comparison on {html.escape(str(sc.get("name")))}</h1>
<p>Each policy's knobs swept; GPU-hours against {html.escape(doc["tier"])} SLO attainment;
each policy's GPU-hours at {doc["target"]:.2%} read off its frontier (linear between the two
frontier points that bracket it; "≤" when every point is above the target). A point that
misses an NIW deadline inside its horizon ({NIW_MARK}) is kept off the frontier. Window
{sc["window"]["start_s"]:.0f}–{sc["window"]["end_s"]:.0f} s, seed {sc.get("seed")}, common
settings: {html.escape(settings)}. {html.escape(str(doc["runs"].get("count")))} runs on
{html.escape(str(doc["runs"].get("backend")))} in {doc["runs"].get("wall_s", 0):.0f} s.
All figures: <a href="summary.json">summary.json</a>.</p>
{bounds_p}
<p><strong>{html.escape(str(doc.get("recommendation", "")))}</strong></p>
<h2>At the target</h2>{_html_table(TARGET_HEAD, target_rows(doc))}
<h2>Frontiers</h2><img src="frontier.png">
<h2>Every point</h2>{_html_table(POINT_HEAD, point_rows(doc))}
</body></html>"""
    path = out / "report.html"
    path.write_text(page)
    return path
