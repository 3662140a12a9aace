"""`sageserve bench tiers`: the instance scheduler's order with two interactive tiers
(SageServe v3 §6.5, evaluated in §7.2.6, Fig. 15).

A fixed fleet (no scaling: the order alone changes) serves a window of a request trace, each
request IW-F (TTFT SLO 1 s, declared priority 0) with probability `fast_share`, else IW-N
(TTFT SLO `normal_slo_s`, priority 1), once per policy (FCFS, EDF, PF, DPA) and seed. Each
seed picks its own window of the trace and its own tier draw; every policy of one seed
replays exactly the same requests. Reported per tier: Q3 (75th percentile) and P95 TTFT of
the requests served, and the SLO violation share (TTFT above the tier's SLO, a request not
served by the end counted as a violation), as the mean and the range over the seeds.

The simulated fleet is the simulator's own (`sim.engine`: continuous batching, KV cache,
preemption, the in-region picker), pinned at `instances` instances; the order is applied by
each instance exactly as under `sageserve simulate --set instanceScheduling.policy=...`
(`sim.instance`, `dispatch.instance_order`). Figures are printed, never asserted.
"""

from __future__ import annotations

import json
import random
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from sageserve.commands.bench_route import pinned_fleet
from sageserve.core.percentile import percentile
from sageserve.core.types import IW_F, Request, Tier, TierKind
from sageserve.dispatch.instance_order import InstanceScheduling, OrderPolicy
from sageserve.pace import make_strategy
from sageserve.perf.model import VariantPerf, load_catalog
from sageserve.sim import traces
from sageserve.sim.engine import Simulation

DEFAULT_POLICIES = ("fcfs", "edf", "pf", "dpa")


@dataclass(frozen=True)
class TierFigures:
    """One tier in one run."""

    requests: int
    ttft_q3_s: float
    ttft_p95_s: float
    violation: float


def normal_tier(slo_s: float) -> Tier:
    """IW-N with a TTFT SLO of `slo_s` (SageServe: 60 s), declared priority 1."""
    return Tier("IW-N", TierKind.INTERACTIVE, ttft_slo_s=slo_s, priority=1)


def workload(
    rows: Sequence[tuple[float, int, int]],
    minutes: float,
    rate: float | None,
    fast_share: float,
    normal: Tier,
    model: str,
    seed: int,
) -> list[Request]:
    """A window of the trace starting where `seed` says, holding about `minutes` of requests
    at `rate` requests/s and compressed to exactly that mean rate (None: `minutes` as
    recorded), each request's tier drawn by `seed`."""
    rng = random.Random(seed)
    span = rows[-1][0]
    length = minutes * 60.0
    if rate is not None:  # the window holds the trace time that becomes `minutes` at `rate`
        natural = len(rows) / max(1e-9, span)
        length = minutes * 60.0 * rate / natural
    if length >= span:
        raise ValueError(
            f"--minutes {minutes:g} at this rate needs {length / 60:.1f} min of the trace, "
            f"which holds {span / 60:.1f} min: ask for fewer minutes or a lower --rate"
        )
    start = rng.uniform(0.0, span - length)
    window = [r for r in rows if start <= r[0] < start + length]
    if not window:
        raise ValueError(f"the trace holds no request in the window seed {seed} picked")
    # new time = (old - start) × factor: the window's own mean rate becomes `rate` exactly
    # (windows differ in load; at a fixed fleet's knee that difference would swamp the
    # policies'), and as recorded the window lasts `minutes`
    span_new = minutes * 60.0 if rate is None else len(window) / rate
    factor = span_new / length
    return [
        Request(
            i,
            (t - start) * factor,
            model,
            IW_F if rng.random() < fast_share else normal,
            "r1",
            p,
            o,
        )
        for i, (t, p, o) in enumerate(window)
    ]


def run_once(
    perf: VariantPerf,
    instances: int,
    reqs: Sequence[Request],
    order: InstanceScheduling,
    tiers: Sequence[Tier],
) -> dict[str, TierFigures]:
    """One policy over `reqs` on `instances` pinned instances; figures per tier name."""
    cfg = replace(
        pinned_fleet(perf, instances, reqs[-1].arrival + 1.0, 3600.0), instance_scheduling=order
    )
    r = Simulation(cfg, make_strategy("reactive"), list(reqs)).run()
    out: dict[str, TierFigures] = {}
    for tier in tiers:
        key = (tier.name, perf.model)
        st = r.stats.get(key)
        ttft = np.frombuffer(st.ttft, dtype=np.float64) if st else np.empty(0)
        unfinished = r.unfinished_by_key.get(key, 0)
        slo = tier.ttft_slo_s if tier.ttft_slo_s is not None else float("inf")
        late = int((ttft > slo).sum()) + unfinished
        n = ttft.size + unfinished
        out[tier.name] = TierFigures(
            requests=n,
            ttft_q3_s=percentile(ttft, 75) if ttft.size else float("nan"),
            ttft_p95_s=percentile(ttft, 95) if ttft.size else float("nan"),
            violation=late / n if n else float("nan"),
        )
    return out


def _spread(values: Sequence[float], fmt: str) -> str:
    """Mean [min–max] over the seeds."""
    mean = statistics.fmean(values)
    if len(values) == 1:
        return format(mean, fmt)
    return f"{format(mean, fmt)} [{format(min(values), fmt)}–{format(max(values), fmt)}]"


def bench_tiers_command(
    trace: Path,
    instances: int,
    rate: float | None,
    minutes: float,
    fast_share: float,
    normal_slo_s: float,
    policies: Sequence[str],
    seeds: Sequence[int],
    expired_after_s: float,
    urgent_within_s: float,
    model: str,
    gpu_type: str,
    gpus: int,
    console: Console,
    out: Path | None = None,
) -> dict[str, dict[str, list[TierFigures]]]:
    """Every policy on every seed; per policy and tier the figures of each seed."""
    if not 0.0 <= fast_share <= 1.0:
        raise ValueError(f"--fast-share must be between 0 and 1, got {fast_share}")
    if not seeds:
        raise ValueError("--seeds names no seed: give at least one, e.g. 1,2,3")
    orders = []
    for name in policies:
        try:
            orders.append(InstanceScheduling(OrderPolicy(name), expired_after_s, urgent_within_s))
        except ValueError:
            known = ", ".join(p.value for p in OrderPolicy)
            raise ValueError(f"--policies: unknown policy {name!r}; use {known}") from None
    perf = load_catalog().get(model, gpu_type, gpus)
    rows = traces.request_trace(trace)
    normal = normal_tier(normal_slo_s)
    tiers = (IW_F, normal)
    results: dict[str, dict[str, list[TierFigures]]] = {
        o.policy.value: {t.name: [] for t in tiers} for o in orders
    }
    for seed in seeds:
        reqs = workload(rows, minutes, rate, fast_share, normal, perf.model, seed)
        fast = sum(1 for q in reqs if q.tier is IW_F)
        took = reqs[-1].arrival - reqs[0].arrival
        console.print(
            f"seed {seed}: {len(reqs)} requests in {took / 60:.1f} min "
            f"({len(reqs) / max(took, 1e-9):.2f}/s), {fast} IW-F, {len(reqs) - fast} IW-N"
        )
        for order in orders:
            figs = run_once(perf, instances, reqs, order, tiers)
            for name, fig in figs.items():
                results[order.policy.value][name].append(fig)
    tab = Table(
        title=escape(
            f"{instances} × {model} on {gpus}× {gpu_type}, {trace.name}, {minutes:g} min per "
            f"seed, {len(seeds)} seeds (mean [min–max]); IW-F SLO 1 s, IW-N {normal_slo_s:g} s"
        )
    )
    for c in (
        "policy",
        "IW-F Q3 TTFT s",
        "IW-N Q3 TTFT s",
        "IW-F SLO violation",
        "IW-N SLO violation",
        "IW-F P95 TTFT s",
        "IW-N P95 TTFT s",
    ):
        tab.add_column(c, justify="right")
    for policy, per in results.items():
        f, n = per[IW_F.name], per[normal.name]
        tab.add_row(
            policy,
            _spread([x.ttft_q3_s for x in f], ".2f"),
            _spread([x.ttft_q3_s for x in n], ".2f"),
            _spread([x.violation for x in f], ".1%"),
            _spread([x.violation for x in n], ".1%"),
            _spread([x.ttft_p95_s for x in f], ".2f"),
            _spread([x.ttft_p95_s for x in n], ".2f"),
        )
    console.print(tab)
    if out is not None:
        doc = {
            "trace": trace.name,
            "instances": instances,
            "model": model,
            "gpu_type": gpu_type,
            "gpus": gpus,
            "rate": rate,
            "minutes": minutes,
            "fast_share": fast_share,
            "normal_slo_s": normal_slo_s,
            "expired_after_s": expired_after_s,
            "urgent_within_s": urgent_within_s,
            "seeds": list(seeds),
            "results": {
                p: {t: [f.__dict__ for f in fs] for t, fs in per.items()}
                for p, per in results.items()
            },
        }
        out.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    return results
