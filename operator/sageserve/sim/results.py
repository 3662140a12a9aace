"""Run results: the JSON summary (stable schema), the per-minute CSV and the comparison table.

Schema `sageserve.sim.summary/v1` (documented in docs/simulator.md; fields are only ever
added, never renamed or removed, within v1):

    {
      "schema": "sageserve.sim.summary/v1",
      "scenario": {"name", "window": {"start_s", "end_s"}, "seed"},
      "policies": {
        "<policy>": {
          "requests": {"arrived", "finished", "unfinished", "refused", "refused_no_instance"},
          "tiers": {"<tier>": {"<model>": {
              "finished", "unfinished", "refused", "refused_no_instance", "slo_attainment",
              "deadline_misses",
              "ttft_s": {"p50", "p95", "p99"}, "tbt_s": {...}, "e2e_s": {...},
              "normalized_latency_s": {"p50", "p95", "p99", "peak_5min_mean"},
              "slo_attainment_by_day": [{"day", "start_s", "requests", "slo_attainment"}],
              # batch tiers with a deadline only (sim.deadlines):
              "served_by_deadline", "served_late", "missed", "queued_beyond_horizon",
              "earliest_pending_deadline_s", "feasible_at_max", "deadline_attainment",
              "horizon_s", "capacity_at_max_tps"}}},
          "normalized_latency_s": {"p50", "p95", "p99", "peak_5min_mean"},  # all tiers
          "slo_attainment_by_day": {"<tier>": [{"day", "start_s", "requests", "slo_attainment"}]},
          "fleet": {
            "instance_hours": float,            # serving + provisioning + draining
            "gpu_hours": {"serving", "provisioning", "draining", "donated", "internal"},
            "after_window_gpu_hours": float,    # the drain, until the run stopped
            "by_model": {"<model>": {"instance_hours", "gpu_hours": {...}}},
            "by_model_region": {"<model>/<region>": {"instance_hours", "gpu_hours": {...}}}},
          "scaling_events": {"<kind>": count},
          "batch_queue": {"<model>": {"released_in_troughs", "promoted", "promoted_share"}},
          "sim": {"events", "preemptions", "wall_s", "requests_per_wall_s"},
          # a run that learned θ (`spec.capacity.learn`, `plan.learned_capacity`) only:
          "capacity": [{"model", "variant", "region", "declared_tps", "learned_tps",
                        "in_force_tps", "windows", "qualifying", "trusted"}],
          # a scenario with a ScalingPolicy: the most tokens/s per instance in a minute
          # that kept the SLO (`sim.capacity_windows`), for the capacity-at-SLO bound
          "capacity_at_slo_tps": {"<model>": {"<variant>": float}},
          # a run that plans: how its plans were solved (`plans_summary`)
          "plans": {"cycles", "max_solve_s", "mean_solve_s", "max_gap", "statuses",
                    "cycles_holding_regions", "held_regions"}}}}

`internal` GPU-hours exclude donated (spot) time, as the paper's instance-hours do;
`provisioning` is the scaling waste (GPUs paid for while an instance comes up). They cover
the window; `after_window_gpu_hours` (donated time apart) is what the fleet held after it,
in the drain, until the run stopped: work a policy left for after the window is served
there, so a comparison reads both. SLO
attainment: interactive tiers - TTFT within the tier's `ttftP95Seconds`; batch tiers - end to
end within the deadline. Unfinished requests count against attainment. Refused requests
(prompt + output beyond the model's context length, vLLM's HTTP 400 at arrival) are neither
served nor lost: they are counted apart and left out of attainment, as a client error is
left out of an availability SLO; arrived = finished + unfinished + refused.
`refused_no_instance` counts, among the unfinished, the requests for a model with nothing
serving in any region that no instance took within the hold (120 s), or that found 1,000
requests already held: the router answers them 503 or 429 (`dispatch.hold`), so they count
against attainment like requests dropped.
`slo_attainment_by_day` splits the same attainment by the day of arrival (whole days from
the window's start, `start_s` the day's first second), so one day of a multi-day run reads
like a one-day run of the same traffic; the policy-level entry sums a tier's models.

Batch deadline accounting (`sim.deadlines`, SageServe §6.3's 24-hour deadline): each batch
request that was not refused is served by its deadline, served late, missed (unfinished
with its deadline inside the horizon, or dropped) or queued beyond the horizon (unfinished,
deadline later: not a miss, and left out of `deadline_attainment`, which is
served_by_deadline / (served_by_deadline + served_late + missed)). So
served_by_deadline + served_late + missed + queued_beyond_horizon = finished + unfinished.
The horizon is the end of the window plus the drain. `feasible_at_max` says whether the
work queued beyond the horizon could still meet its deadlines, earliest deadline first, at
`capacity_at_max_tps` (θ × maxInstances summed over the model's regions); null when θ is
unknown. `slo_attainment` and `deadline_misses` keep their meaning.
"""

from __future__ import annotations

import csv
import json
import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from sageserve.core.percentile import percentile, percentiles
from sageserve.core.snapshot import PlanSolve
from sageserve.core.types import InstanceState
from sageserve.dispatch.hold import HOLD_S
from sageserve.sim.deadlines import BatchAccount, account, totals
from sageserve.sim.engine import DAY_S, RunResult, TierModelStats

if TYPE_CHECKING:
    from sageserve.plan.learned_capacity import LearnedCapacity

SCHEMA = "sageserve.sim.summary/v1"
#: The column of the requests held for a model with nothing serving and then refused.
REFUSED_NO_INSTANCE = f"refused (no instance within {HOLD_S:g} s)"
_STATE_KEYS = {
    InstanceState.SERVING: "serving",
    InstanceState.PROVISIONING: "provisioning",
    InstanceState.DRAINING: "draining",
    InstanceState.SPOT: "donated",
}


def _pct(a: Any) -> dict[str, float | None]:
    arr = np.asarray(a, dtype=np.float64)
    if arr.size == 0:
        return {"p50": None, "p95": None, "p99": None}
    q = percentiles(arr, [50, 95, 99])
    return {k: round(float(v), 4) for k, v in zip(("p50", "p95", "p99"), q, strict=True)}


def normalized_latency(stats: Iterable[TierModelStats]) -> dict[str, float | None]:
    """PreServe §5's normalized latency (end to end ÷ output tokens) of finished requests:
    percentiles, and the highest mean over the 5-minute buckets of arrival (the paper's
    "peak normalized latency", Fig. 8)."""
    sts = list(stats)
    arrs = [np.frombuffer(st.norm, dtype=np.float64) for st in sts if len(st.norm)]
    out = _pct(np.concatenate(arrs) if arrs else np.empty(0))
    buckets: dict[int, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for st in sts:
        for b, (total, n) in st.norm_buckets.items():
            buckets[b][0] += total
            buckets[b][1] += n
    peak = max((total / n for total, n in buckets.values() if n), default=None)
    out["peak_5min_mean"] = round(peak, 4) if peak is not None else None
    return out


def _gpu_hours(items: Iterable[tuple[InstanceState, float]]) -> dict[str, float]:
    out = dict.fromkeys(("serving", "provisioning", "draining", "donated"), 0.0)
    for state, sec in items:
        out[_STATE_KEYS[state]] += sec / 3600.0
    out["internal"] = out["serving"] + out["provisioning"] + out["draining"]
    return {k: round(v, 3) for k, v in out.items()}


def _inst_hours(items: Iterable[tuple[InstanceState, float]]) -> float:
    return round(sum(s for st, s in items if st is not InstanceState.SPOT) / 3600.0, 3)


def batch_account(r: RunResult, key: tuple[str, str]) -> BatchAccount | None:
    """The deadline accounting of a (tier, model) of a run (`sim.deadlines`); None for a
    tier without a batch deadline."""
    tier, model = key
    if tier not in r.batch_deadlines:
        return None
    st = r.stats.get(key)
    late = st.deadline_miss if st else 0
    return account(
        (st.finished if st else 0) - late,
        late,
        r.pending.get(key, []),
        st.dropped + st.refused_no_instance if st else 0,
        r.horizon_s if r.horizon_s is not None else r.end_s,
        r.capacity_at_max_tps.get(model, 0.0),
    )


def attainment_by_day(stats: Iterable[TierModelStats], start_s: float) -> list[dict[str, Any]]:
    """SLO attainment of the requests that arrived on each day of the window, over one or
    more (tier, model) stats: met / (finished + unfinished), as `slo_attainment`."""
    days: dict[int, list[int]] = defaultdict(lambda: [0, 0, 0])
    for st in stats:
        for d, counts in st.by_day.items():
            acc = days[d]
            for i, c in enumerate(counts):
                acc[i] += c
    out = []
    for d, (fin, met, unf) in sorted(days.items()):
        out.append(
            {
                "day": d,
                "start_s": start_s + d * DAY_S,
                "requests": fin + unf,
                "slo_attainment": round(met / (fin + unf), 5) if fin + unf else None,
            }
        )
    return out


def policy_summary(r: RunResult, wall_s: float) -> dict[str, Any]:
    """One run's summary. With OServe layouts, `layouts`: per (model, region, GPU type) the
    re-plans, switches and the layout in force at the end, and the requests dispatched per
    type and variant (`SimLayoutLoop.summary`)."""
    tiers: dict[str, dict[str, Any]] = defaultdict(dict)
    keys = sorted(set(r.stats) | set(r.unfinished_by_key))
    unfinished_total = 0
    for key in keys:
        tier, model = key
        st = r.stats.get(key)
        unf = r.unfinished_by_key.get(key, 0)
        unfinished_total += unf
        fin = st.finished if st else 0
        met = st.slo_met if st else 0
        tiers[tier][model] = {
            "finished": fin,
            "unfinished": unf,
            "refused": st.refused if st else 0,
            "refused_no_instance": st.refused_no_instance if st else 0,
            "slo_attainment": round(met / (fin + unf), 5) if fin + unf else None,
            "deadline_misses": st.deadline_miss if st else 0,
            "ttft_s": _pct(st.ttft if st else np.empty(0)),
            "tbt_s": _pct(st.tbt if st else np.empty(0)),
            "e2e_s": _pct(st.e2e if st else np.empty(0)),
            "normalized_latency_s": normalized_latency([st] if st else []),
            "slo_attainment_by_day": attainment_by_day([st] if st else [], r.start_s),
        }
        acct = batch_account(r, key)
        if acct is not None:
            tiers[tier][model].update(acct.as_dict())
    by_m: dict[str, list[tuple[InstanceState, float]]] = defaultdict(list)
    by_m_i: dict[str, list[tuple[InstanceState, float]]] = defaultdict(list)
    by_mr: dict[str, list[tuple[InstanceState, float]]] = defaultdict(list)
    by_mr_i: dict[str, list[tuple[InstanceState, float]]] = defaultdict(list)
    for (m, reg, state), sec in sorted(r.gpu_seconds.items()):
        by_m[m].append((state, sec))
        by_mr[f"{m}/{reg}"].append((state, sec))
    for (m, reg, state), sec in sorted(r.instance_seconds.items()):
        by_m_i[m].append((state, sec))
        by_mr_i[f"{m}/{reg}"].append((state, sec))
    all_gpu = [(s, v) for (_, _, s), v in r.gpu_seconds.items()]
    all_inst = [(s, v) for (_, _, s), v in r.instance_seconds.items()]
    out: dict[str, Any] = {
        "requests": {
            "arrived": r.arrived,
            "finished": r.finished,
            "unfinished": unfinished_total,
            "refused": r.refused,
            "refused_no_instance": r.refused_no_instance,
        },
        "tiers": dict(tiers),
        "normalized_latency_s": normalized_latency(r.stats.values()),
        "slo_attainment_by_day": {
            tier: attainment_by_day(
                (st for (t, _), st in sorted(r.stats.items()) if t == tier), r.start_s
            )
            for tier in sorted({t for t, _ in r.stats})
        },
        "fleet": {
            "instance_hours": _inst_hours(all_inst),
            "gpu_hours": _gpu_hours(all_gpu),
            "after_window_gpu_hours": round(sum(r.after_window_gpu_seconds.values()) / 3600.0, 3),
            "by_model": {
                m: {"instance_hours": _inst_hours(by_m_i[m]), "gpu_hours": _gpu_hours(by_m[m])}
                for m in sorted(by_m)
            },
            "by_model_region": {
                k: {"instance_hours": _inst_hours(by_mr_i[k]), "gpu_hours": _gpu_hours(by_mr[k])}
                for k in sorted(by_mr)
            },
        },
        **({"pools": pool_summary(r)} if r.pools else {}),
        "scaling_events": dict(sorted(r.events.items())),
        "batch_queue": batch_queue(r.batch_released),
        "sim": {
            "events": r.sim_events,
            "preemptions": r.preemptions,
            "wall_s": round(wall_s, 3),
            "requests_per_wall_s": round(r.arrived / wall_s, 1) if wall_s > 0 else None,
        },
    }
    if r.layouts is not None:
        out["layouts"] = r.layouts
    if r.capacity is not None:
        out["capacity"] = capacity_summary(r.capacity)
    if r.plan_solves:
        out["plans"] = plans_summary(r.plan_solves)
    if r.peak_at_slo:
        peaks: dict[str, dict[str, float]] = {}
        for (model, variant), tps in sorted(r.peak_at_slo.items()):
            peaks.setdefault(model, {})[variant] = round(tps, 1)
        out["capacity_at_slo_tps"] = peaks
    return out


def plans_summary(solves: Sequence[PlanSolve]) -> dict[str, Any]:
    """How the run's plans were solved: the figures a fleet's owner holds against the plan
    cycle's budget (the slowest solve, the widest gap) and the regions a silent cluster kept
    out of a plan."""
    gaps = [s.gap for s in solves if s.gap is not None]
    held = sorted({r for s in solves for r in s.held_regions})
    return {
        "cycles": len(solves),
        "max_solve_s": round(max(s.seconds for s in solves), 4),
        "mean_solve_s": round(sum(s.seconds for s in solves) / len(solves), 4),
        "max_gap": round(max(gaps), 6) if gaps else None,
        "statuses": dict(sorted(Counter(s.status for s in solves).items())),
        "cycles_holding_regions": sum(1 for s in solves if s.held_regions),
        **({"held_regions": held} if held else {}),
    }


def capacity_summary(
    learned: Mapping[tuple[str, str, str], LearnedCapacity],
) -> list[dict[str, Any]]:
    """θ per (model, variant, region) at the end of a run that learned it: declared,
    learned (the quantile of the qualifying windows), in force, and the evidence."""
    return [
        {
            "model": m,
            "variant": v,
            "region": r,
            "declared_tps": round(lc.declared_tps, 1),
            "learned_tps": round(lc.learned_tps, 1) if lc.learned_tps is not None else None,
            "in_force_tps": round(lc.in_force_tps, 1),
            "windows": lc.windows,
            "qualifying": lc.qualifying,
            "trusted": lc.trusted,
        }
        for (m, v, r), lc in sorted(learned.items())
    ]


def layout_rows(doc: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One row per (policy, model, region, GPU type) with OServe layouts: re-plans, switches
    started / finished / abandoned, the layout in force at the end and its replicas per
    variant (what `simulate` prints and the report shows)."""
    rows = []
    for policy, p in doc.get("policies", {}).items():
        for group, g in (p.get("layouts") or {}).get("groups", {}).items():
            rows.append(
                {
                    "policy": policy,
                    "group": group,
                    "replans": g["replans"],
                    "switches": g["switches"],
                    "finished": g["switches_finished"],
                    "abandoned": g["switches_abandoned"],
                    "layout": g["layout"] + (" (switching)" if g["switching"] else ""),
                    "replicas": ", ".join(f"{v}={n}" for v, n in g["replicas"].items()),
                }
            )
    return rows


def pool_summary(r: RunResult) -> dict[str, Any]:
    """Per ModelPool: whether the plan sized it (the operator's `Sized` condition), its
    pods over time, GPU-hours, wakes and sleeps, requests and held time per region, and
    per tier the attainment and latencies of its models' requests (counted as any
    request's, hold time included in the TTFT)."""
    out: dict[str, Any] = {}
    for name, pool in sorted(r.pools.items()):
        doc = dict(pool)
        regions = {}
        for region, got in pool["regions"].items():
            items = [
                (state, sec)
                for (m, reg, state), sec in r.gpu_seconds.items()
                if (m, reg) == (name, region)
            ]
            regions[region] = {**got, "gpu_hours": _gpu_hours(items)}
        doc["regions"] = regions
        models = set(pool["models"])
        tiers: dict[str, Any] = {}
        for tier in sorted({t for t, m in r.stats if m in models}):
            mine = [st for (t, m), st in r.stats.items() if t == tier and m in models]
            fin = sum(st.finished for st in mine)
            met = sum(st.slo_met for st in mine)
            unf = sum(r.unfinished_by_key.get((tier, m), 0) for m in models)
            ttft = np.concatenate([np.frombuffer(st.ttft, dtype=np.float64) for st in mine])
            tbt = np.concatenate([np.frombuffer(st.tbt, dtype=np.float64) for st in mine])
            tiers[tier] = {
                "finished": fin,
                "unfinished": unf,
                "slo_attainment": round(met / (fin + unf), 5) if fin + unf else None,
                "ttft_s": _pct(ttft),
                "tbt_s": _pct(tbt),
            }
        doc["tiers"] = tiers
        out[name] = doc
    return out


def interactive_ttft_p95(r: RunResult, interactive_tiers: Sequence[str]) -> float | None:
    arrs = [
        np.frombuffer(st.ttft, dtype=np.float64)
        for (t, _), st in r.stats.items()
        if t in interactive_tiers and len(st.ttft)
    ]
    if not arrs:
        return None
    return percentile(np.concatenate(arrs), 95)


def batch_queue(released: Mapping[str, Mapping[str, int]]) -> dict[str, dict[str, Any]]:
    """Per model, how the Queue Manager's requests left the queue: in a trough (an
    endpoint below the release EMU, SageServe §6.2) or promoted (slack run out, or aged),
    and the promoted share. A high share says the troughs did not carry the batch work:
    it ran at interactive priority, as it would have in its own pool."""
    out: dict[str, dict[str, Any]] = {}
    for model, counts in sorted(released.items()):
        trough, promoted = counts.get("trough", 0), counts.get("promoted", 0)
        total = trough + promoted
        out[model] = {
            "released_in_troughs": trough,
            "promoted": promoted,
            "promoted_share": promoted / total if total else None,
        }
    return out


def summary(
    scenario: Mapping[str, Any], runs: Mapping[str, tuple[RunResult, float]]
) -> dict[str, Any]:
    return {
        "schema": SCHEMA,
        "scenario": dict(scenario),
        "policies": {name: policy_summary(r, wall) for name, (r, wall) in runs.items()},
    }


def write_summary(path: Path, doc: Mapping[str, Any]) -> None:
    path.write_text(json.dumps(doc, indent=2, sort_keys=False) + "\n")


MINUTE_COLUMNS = (
    "policy",
    "minute",
    "model",
    "region",
    "pool",
    "serving",
    "provisioning",
    "draining",
    "donated",
    "emu",
    "arrivals",
    "finished",
    "batch_queued",
)


def write_minutes(path: Path, runs: Mapping[str, tuple[RunResult, float]]) -> None:
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(MINUTE_COLUMNS)
        for name, (r, _) in runs.items():
            for m in r.minutes:
                w.writerow(
                    (
                        name,
                        m.minute,
                        m.model,
                        m.region,
                        m.pool,
                        m.serving,
                        m.provisioning,
                        m.draining,
                        m.donated,
                        m.emu,
                        m.arrivals,
                        m.finished,
                        m.batch_queued,
                    )
                )


def batch_totals(policy: Mapping[str, Any]) -> dict[str, Any]:
    """A policy summary's batch deadline accounting over every batch tier × model
    (`sim.deadlines.totals`): what `simulate` prints next to IW-F attainment and what
    `compare` keeps a point off the frontier by."""
    return totals(m for models in policy["tiers"].values() for m in models.values())


def comparison_rows(
    doc: Mapping[str, Any],
    runs: Mapping[str, tuple[RunResult, float]],
    interactive_tiers: Sequence[str],
) -> list[dict[str, Any]]:
    """One row per policy: the numbers `sageserve simulate` prints."""
    rows = []
    base: float | None = None
    for name, (r, _) in runs.items():
        p = doc["policies"][name]
        ih = p["fleet"]["instance_hours"]
        if base is None:
            base = ih
        att = []
        for tier, models in p["tiers"].items():
            fin = sum(v["finished"] + v["unfinished"] for v in models.values())
            met = sum(
                (v["slo_attainment"] or 0) * (v["finished"] + v["unfinished"])
                for v in models.values()
            )
            att.append((tier, met / fin if fin else math.nan))
        rows.append(
            {
                "policy": name,
                "instance_hours": ih,
                "vs_first": (ih / base - 1.0) if base else 0.0,
                "gpu_hours": p["fleet"]["gpu_hours"]["internal"],
                "provisioning_gpu_hours": p["fleet"]["gpu_hours"]["provisioning"],
                "donated_gpu_hours": p["fleet"]["gpu_hours"]["donated"],
                "after_window_gpu_hours": p["fleet"].get("after_window_gpu_hours", 0.0),
                "iw_ttft_p95_s": interactive_ttft_p95(r, interactive_tiers),
                "norm_latency_p99_s": p["normalized_latency_s"]["p99"],
                "norm_latency_peak_5min_s": p["normalized_latency_s"]["peak_5min_mean"],
                "slo": dict(att),
                "slo_by_day": {
                    tier: [d["slo_attainment"] for d in days]
                    for tier, days in p.get("slo_attainment_by_day", {}).items()
                },
                "niw": batch_totals(p),
                "unfinished": p["requests"]["unfinished"],
                "refused": p["requests"].get("refused", 0),
                "refused_no_instance": p["requests"].get("refused_no_instance", 0),
                "scale_events": sum(p["scaling_events"].values()),
            }
        )
    return rows
