"""Report: PNG plots side by side per policy, and an HTML page that shows them with the table.

Plots (from the per-minute rows and the summary): instances over time per model and region,
EMU per model, GPU-hours stacked by state, latency percentiles per tier.
"""

from __future__ import annotations

import html
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from sageserve.sim.deadlines import describe
from sageserve.sim.engine import RunResult
from sageserve.sim.results import REFUSED_NO_INSTANCE, layout_rows


def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_instances(path: Path, runs: Mapping[str, tuple[RunResult, float]]) -> None:
    plt = _plt()
    models = sorted({m.model for r, _ in runs.values() for m in r.minutes})
    fig, axes = plt.subplots(
        len(models), 1, figsize=(11, 2.4 * len(models)), sharex=True, squeeze=False
    )
    styles = ("-", "--", ":", "-.")
    regions = sorted({m.region for r, _ in runs.values() for m in r.minutes})
    colors = {reg: f"C{i}" for i, reg in enumerate(regions)}
    for ax, model in zip(axes[:, 0], models, strict=True):
        for pi, (name, (r, _)) in enumerate(runs.items()):
            per_region: dict[str, dict[int, int]] = defaultdict(lambda: defaultdict(int))
            for m in r.minutes:
                if m.model == model:
                    per_region[m.region][m.minute] += m.serving + m.provisioning + m.draining
            for region, series in sorted(per_region.items()):
                xs = sorted(series)
                ax.step(
                    [x / 60 for x in xs],
                    [series[x] for x in xs],
                    where="post",
                    label=f"{name} {region}",
                    linewidth=1,
                    color=colors[region],
                    linestyle=styles[pi % len(styles)],
                )
        r0 = next(iter(runs.values()))[0]
        ax.axvline((r0.end_s - r0.start_s) / 3600, color="grey", linestyle=":", linewidth=0.8)
        ax.set_ylabel("instances")
        ax.set_title(
            f"{model} (dotted line: end of the window; after it, draining only)", fontsize=9
        )
        ax.legend(fontsize=6, ncol=3, loc="upper left")
    axes[-1, 0].set_xlabel("hours since window start")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def plot_emu(path: Path, runs: Mapping[str, tuple[RunResult, float]]) -> None:
    plt = _plt()
    models = sorted({m.model for r, _ in runs.values() for m in r.minutes})
    fig, axes = plt.subplots(
        len(models), 1, figsize=(11, 2.2 * len(models)), sharex=True, squeeze=False
    )
    for ax, model in zip(axes[:, 0], models, strict=True):
        for name, (r, _) in runs.items():
            acc: dict[int, list[float]] = defaultdict(list)
            for m in r.minutes:
                if m.model == model and m.serving:
                    acc[m.minute].append(m.emu)
            xs = sorted(acc)
            ax.plot(
                [x / 60 for x in xs],
                [max(acc[x]) for x in xs],
                label=f"{name} (max)",
                linewidth=0.8,
            )
        ax.axhline(0.7, color="grey", linestyle=":", linewidth=0.8)
        ax.axhline(0.3, color="grey", linestyle=":", linewidth=0.8)
        ax.set_ylim(0, 1.05)
        ax.set_ylabel("EMU")
        ax.set_title(model, fontsize=9)
        ax.legend(fontsize=7)
    axes[-1, 0].set_xlabel("hours since window start")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def plot_gpu_hours(path: Path, doc: Mapping[str, Any]) -> None:
    plt = _plt()
    names = list(doc["policies"])
    states = ("serving", "provisioning", "draining", "donated")
    fig, ax = plt.subplots(figsize=(6, 4))
    bottom = [0.0] * len(names)
    for st in states:
        vals = [doc["policies"][n]["fleet"]["gpu_hours"][st] for n in names]
        ax.bar(names, vals, bottom=bottom, label=st)
        bottom = [b + v for b, v in zip(bottom, vals, strict=True)]
    ax.set_ylabel("GPU-hours")
    ax.set_title("GPU-hours by instance state (donated = spot, not internal)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def plot_latency(path: Path, doc: Mapping[str, Any]) -> None:
    plt = _plt()
    names = list(doc["policies"])
    tiers = sorted({t for n in names for t in doc["policies"][n]["tiers"]})
    fig, axes = plt.subplots(1, len(tiers), figsize=(4 * len(tiers), 3.6), squeeze=False)
    for ax, tier in zip(axes[0], tiers, strict=True):
        metric = "ttft_s"
        labels, vals = [], []
        for n in names:
            for model, s in sorted(doc["policies"][n]["tiers"].get(tier, {}).items()):
                labels.append(f"{n}\n{model}")
                vals.append([s[metric][q] or 0.0 for q in ("p50", "p95", "p99")])
        x = range(len(labels))
        for i, q in enumerate(("p50", "p95", "p99")):
            ax.bar([xi + (i - 1) * 0.27 for xi in x], [v[i] for v in vals], width=0.27, label=q)
        ax.set_xticks(list(x))
        ax.set_xticklabels(labels, fontsize=5, rotation=90)
        ax.set_yscale("symlog", linthresh=0.1)
        ax.set_title(f"{tier}: TTFT (s)", fontsize=9)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def refused_table(doc: Mapping[str, Any]) -> str:
    """HTML: requests refused at arrival per policy, tier and model (prompt + output beyond
    the model's context length, vLLM's HTTP 400); empty when nothing was refused."""
    cells = []
    for name, p in doc["policies"].items():
        for tier, models in sorted(p["tiers"].items()):
            for model, s in sorted(models.items()):
                n = s.get("refused", 0)
                if n:
                    arrived = s["finished"] + s["unfinished"] + n
                    cells.append((name, tier, model, n, n / arrived if arrived else 0.0))
    if not cells:
        return ""
    rows = "".join(
        f"<tr><td>{html.escape(a)}</td><td>{html.escape(b)}</td><td>{html.escape(c)}</td>"
        f"<td>{n}</td><td>{share:.2%}</td></tr>"
        for a, b, c, n, share in cells
    )
    return (
        "<h2>Refused at arrival (prompt + output beyond the model's context)</h2>"
        "<p>Neither served nor lost, and left out of SLO attainment (vLLM answers HTTP 400 "
        "<code>context_length_exceeded</code>).</p>"
        "<table><tr><th>policy</th><th>tier</th><th>model</th><th>refused</th>"
        f"<th>share of the tier's requests</th></tr>{rows}</table>"
    )


def pools_table(doc: Mapping[str, Any]) -> str:
    """Per policy, ModelPool and region: whether the plan sized the pool, its pods, GPU-hours,
    wakes and sleeps, requests served and held time, and its models' attainment per tier
    (empty when the scenario has no pool)."""
    rows = []
    for policy, pdoc in doc["policies"].items():
        for name, pool in (pdoc.get("pools") or {}).items():
            sized = "yes" if pool["sized"]["status"] else f"no ({pool['sized']['reason']})"
            tiers = ", ".join(
                f"{t} {v['slo_attainment']:.1%}"
                for t, v in pool["tiers"].items()
                if v["slo_attainment"] is not None
            )
            for region, r in pool["regions"].items():
                pods = r["pods"]
                cells = (
                    policy,
                    name,
                    region,
                    sized,
                    f"{pods['initial']} → {pods['end']} (min {pods['min']}, max {pods['max']})",
                    r["gpu_hours"]["internal"],
                    f"{r['wakes']} / {r['sleeps']}",
                    f"{r['served']} / {r['requests']}",
                    _fmt(r["held_s"]["mean"]),
                    tiers or "-",
                )
                rows.append(
                    "<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in cells) + "</tr>"
                )
    if not rows:
        return ""
    head = (
        "policy",
        "pool",
        "region",
        "sized by the plan",
        "pods",
        "GPU-h",
        "wakes / sleeps",
        "served / requests",
        "mean held s",
        "attainment (pool)",
    )
    return (
        "<h2>ModelPools</h2><table><tr>"
        + "".join(f"<th>{h}</th>" for h in head)
        + "</tr>"
        + "".join(rows)
        + "</table><p>Pooled models are served by the router's request-level rule (a request "
        "is held while its model wakes); only the hourly plan (lt-*) sizes a pool, as the "
        "operator's <code>Sized</code> condition says.</p>"
    )


def layouts_html(doc: Mapping[str, Any]) -> str:
    """The OServe layouts section (empty when no run had layouts)."""
    rows = layout_rows(doc)
    if not rows:
        return ""
    cols = ("policy", "group", "replans", "switches", "finished", "abandoned", "layout")
    body = "".join(
        "<tr>"
        + "".join(f"<td>{html.escape(str(r[c]))}</td>" for c in (*cols, "replicas"))
        + "</tr>"
        for r in rows
    )
    return (
        "<h2>OServe layouts</h2><p>Per model, region and GPU type: re-plans, layout switches "
        "(started, finished, abandoned) and the layout in force at the end. Requests "
        "dispatched per type and variant: <code>layouts</code> in summary.json.</p>"
        "<table><tr><th>policy</th><th>model/region/GPU type</th><th>re-plans</th>"
        "<th>switches</th><th>finished</th><th>abandoned</th><th>layout at the end</th>"
        f"<th>replicas</th></tr>{body}</table>"
    )


def _fmt(v: float | None) -> str:
    return f"{v:.3f}" if v is not None else "-"


def write_report(
    out: Path,
    doc: Mapping[str, Any],
    runs: Mapping[str, tuple[RunResult, float]],
    table: Sequence[Mapping[str, Any]],
) -> Path:
    """Write the PNGs and `report.html` into `out`; return the HTML path."""
    plot_instances(out / "instances.png", runs)
    plot_emu(out / "emu.png", runs)
    plot_gpu_hours(out / "gpu_hours.png", doc)
    plot_latency(out / "latency.png", doc)
    head = (
        "policy",
        "instance-h",
        "vs first",
        "GPU-h",
        "provisioning GPU-h",
        "donated GPU-h",
        "IW TTFT p95 s",
        "norm. latency p99 s",
        "peak 5-min norm. s",
        "NIW by deadline",
        "NIW in time",
        "NIW missed",
        "NIW beyond horizon",
        "unfinished",
        "refused",
        REFUSED_NO_INSTANCE,
    )
    end_s = float(doc["scenario"]["window"]["end_s"])
    niw = [describe(r.get("niw", {}), end_s) for r in table]
    rows = "".join(
        "<tr>"
        + "".join(
            f"<td>{html.escape(str(c))}</td>"
            for c in (
                r["policy"],
                r["instance_hours"],
                f"{r['vs_first']:+.1%}",
                r["gpu_hours"],
                r["provisioning_gpu_hours"],
                r["donated_gpu_hours"],
                f"{r['iw_ttft_p95_s']:.3f}" if r["iw_ttft_p95_s"] is not None else "-",
                _fmt(r.get("norm_latency_p99_s")),
                _fmt(r.get("norm_latency_peak_5min_s")),
                n["attainment"],
                n["served"],
                n["missed"],
                n["waiting"],
                r["unfinished"],
                r.get("refused", 0),
                r.get("refused_no_instance", 0),
            )
        )
        + "</tr>"
        for r, n in zip(table, niw, strict=True)
    )
    refused = refused_table(doc) + pools_table(doc) + layouts_html(doc)
    sc = doc["scenario"]
    page = f"""<!doctype html><html><head><meta charset="utf-8">
<title>sageserve simulate: {html.escape(str(sc.get("name")))}</title>
<style>body{{font-family:sans-serif;max-width:1100px;margin:auto}}
table{{border-collapse:collapse}}td,th{{border:1px solid #ccc;padding:4px 8px}}</style>
</head><body><h1>Scenario {html.escape(str(sc.get("name")))}</h1>
<p>Window {sc["window"]["start_s"]:.0f}–{sc["window"]["end_s"]:.0f} s, seed {sc.get("seed")}.
Summary: <a href="summary.json">summary.json</a>, per minute:
<a href="minutes.csv">minutes.csv</a>.</p>
<table><tr>{"".join(f"<th>{h}</th>" for h in head)}</tr>{rows}</table>
<p>NIW: batch work judged on its deadline (SageServe §6.3). "missed" counts deadlines inside
the horizon (window + drain) served late or not at all; work still queued whose deadline
lies after the horizon is not a miss, and "feasible at max" says whether it could still be
served in time, earliest deadline first, at every endpoint's maxInstances.</p>
{refused}
<h2>Instances per model and region</h2><img src="instances.png">
<h2>Effective memory utilisation</h2><img src="emu.png">
<h2>GPU-hours by state</h2><img src="gpu_hours.png">
<h2>Latency</h2><img src="latency.png">
</body></html>"""
    path = out / "report.html"
    path.write_text(page)
    return path
