"""``sageserve bench oserve``: OServe's end-to-end comparison on the mixed workload.

On a fixed budget of GPUs of one type (default 16 H100, nodes of 8) and the
`scenarios/oserve-mixed` day (Azure 2023 code + conversation, a mix that moves over the
hours), three deployments of one model are replayed through the simulator's instance model
(`sim/oserve_fleet.py`, which says why it is not the plan-cycle simulator):

(a) **static**: the best homogeneous layout (identical replicas, every (TP, PP) the catalogue
    offers, as many as pack), chosen by simulating the tuning hours, then run on the held-out
    hours unchanged (OServe's "vLLM (static)");
(b) **per-hour reload**: for every held-out hour, the best homogeneous layout *of that hour*,
    chosen by simulating each candidate on that hour alone (hindsight: more than a real
    baseline knows), switched to at the hour's start by the switch plan of
    `plan/layout_switch.plan_switch` (replicas of the same strategy kept, others replaced;
    every started replica serves after the start-up time, so the switch costs GPUs replaced ×
    start-up in capacity) (OServe's "vLLM (reload)", with our start-up instead of its 10 s
    shard transfer);
(c) **heterogeneous** (sageserve): request types fitted by k-means on the tuning hours
    (`forecast/request_types.py`), per-type capacity n from the source `--capacity` names
    (`sim/type_capacity.CAPACITY_SOURCES`: `analytical`, `perf/capacity.py`; `measured`, the
    simulator at the SLO, `calibrate --by-type`; by default `auto`: each source's plan is run
    on the tuning hours and the better kept); the start layout (`--start`): by default
    `simulated`, the search's distinct layouts (Algorithm 1, `plan/layout_search.py`, on
    the tuning hours' mix, every capacity source the run considers, `start_seeds` seeds)
    and the best homogeneous layout, each run as the heterogeneous plan on the tuning hours,
    the best kept (the way the static baseline is chosen); `search`, the earlier rule, the
    search's layout (seed `--seed`) taken unchecked; every `--replan` seconds
    the last interval's per-type arrival rates (classified on predicted output lengths, what
    the router sees) are the forecast for the next hour, `plan/layout_switch.replan` proposes
    a layout and switches only when its gain exceeds its cost twice in a row, and the
    assignment LP (`plan/oserve_assign.py`) of the serving replicas at that mix sets the
    per-(type, layout) dispatch weights, followed by the `--dispatch` strategy
    (`sim/oserve_fleet.DISPATCH_STRATEGIES`: `weighted-overflow` by default, the weights as a
    preference with overflow from a swamped replica; `weighted`, the weights strictly).

Every run starts with its layout deployed and empty at the held-out part's start, and drains
for `--drain` seconds after the last arrival. Metrics over the held-out arrivals: P99 TTFT,
P99 end-to-end latency (arrival to last token) and P99 normalized latency (end-to-end per
output token), throughput (finished requests/s) and throughput at SLO (goodput: requests/s
that finish with TTFT ≤ `--ttft-slo` and a time per output token after the first ≤
`--tpot-slo`); an unfinished request counts as infinitely late. "Best" is the highest goodput,
then the lowest P99 end-to-end latency.

With several seeds (`--seed 0,1,2`) the whole comparison runs once per seed and the spread
of every figure follows (mean [lowest, highest]). A seed is both the workload's draw
(`Scenario.with_seed`: for a trace replayed at a `rateScale` below 1 the seed picks which
requests are kept; arrival times and sizes are the trace's, fixed) and the seed of k-means,
the search and the capacity probes. Without `--seed`: the scenario's workload seed and 0.

Benchmarks print figures; nothing here is asserted. The pipeline layouts' profiles are
derived (`perf/pipeline.py`), the per-type capacity analytical or measured, and the output-length
predictor the default `client-quantile` (per service median) unless `--predictor oracle`.
"""

from __future__ import annotations

import bisect
import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from sageserve.commands.seeds import Spread, spread
from sageserve.core.percentile import percentile
from sageserve.core.types import Request
from sageserve.dispatch.length_predictor import make_predictor
from sageserve.forecast.request_types import RequestTypes, fit_request_types
from sageserve.perf.model import VariantPerf, load_catalog
from sageserve.plan.layout_search import (
    Layout,
    LayoutSpace,
    Strategy,
    canonical,
    describe,
    packs,
    search_layout,
)
from sageserve.plan.layout_step import (
    LayoutMemory,
    LayoutSettings,
    ReplanObservation,
    replan_layout,
)
from sageserve.plan.layout_switch import Window, plan_switch
from sageserve.plan.oserve_assign import layout_weights
from sageserve.plan.oserve_layouts import Mix
from sageserve.sim.oserve_fleet import (
    DISPATCH_STRATEGIES,
    Fleet,
    LayoutBudget,
    Outcome,
)
from sageserve.sim.scenario import load_scenario
from sageserve.sim.type_capacity import (
    CAPACITY_SOURCES,
    CapacityContext,
    ProbeSettings,
    SloSpec,
    capacity_table,
)

HOUR_S = 3600.0
#: `--capacity auto`: run the heterogeneous plan on the tuning hours with every capacity
#: source and keep the one that scores best there (chosen on tuning, reported on held-out)
AUTO = "auto"
#: `--start`: how the heterogeneous plan's start layout is chosen (module doc)
START_CHOICES = ("simulated", "search")


@dataclass(frozen=True)
class OServeBench(LayoutBudget):
    """What one benchmark run compares (the CLI's options)."""

    tuning_hours: tuple[int, ...] = (0, 1, 2, 3)
    held_out_hours: tuple[int, ...] = (4, 5, 6, 7)
    #: seconds replayed of each hour (3,600: all of it; less for a quick slice)
    span_s: float = HOUR_S
    replan_s: float = 600.0
    startup_s: float = 600.0
    confirmations: int = 2
    ttft_slo_s: float = 5.0
    tpot_slo_s: float = 0.2
    predictor: str = "client-quantile"
    drain_s: float = 1800.0
    #: seed of k-means, of the search and of the capacity probes
    seed: int = 0
    #: seed of the scenario's workload draw (`Scenario.with_seed`); None: the scenario's
    workload_seed: int | None = None
    #: where n_{k,j} comes from (`sim/type_capacity.CAPACITY_SOURCES`): "measured" (the
    #: simulator at the SLO, or `capacity_file` written by `calibrate --by-type`) or
    #: "analytical" (`perf/capacity.py`, maximum throughput, no SLO), or "auto" (each
    #: source's heterogeneous plan run on the tuning hours, the best kept)
    capacity: str = "auto"
    capacity_file: Path | None = None
    #: the share of requests that must meet the SLO for a measured n
    slo_attainment: float = 0.9
    #: the heterogeneous plan's dispatch (`sim/oserve_fleet.DISPATCH_STRATEGIES`)
    dispatch: str = "weighted-overflow"
    #: the start layout: "simulated" (candidates run on the tuning hours) or "search"
    start: str = "simulated"
    #: with start "simulated": the search's seeds per capacity source (seed, seed + 1, ...)
    start_seeds: int = 3

    def __post_init__(self) -> None:
        if self.dispatch not in DISPATCH_STRATEGIES:
            raise ValueError(
                f"--dispatch: one of {', '.join(DISPATCH_STRATEGIES)}, got {self.dispatch!r}"
            )
        if self.start not in START_CHOICES:
            raise ValueError(f"--start: one of {', '.join(START_CHOICES)}, got {self.start!r}")
        if self.start_seeds < 1:
            raise ValueError(f"start_seeds: must be >= 1, got {self.start_seeds}")


# ---- the workload ----------------------------------------------------------------------------


def part(requests: Sequence[Request], hours: Sequence[int], span_s: float) -> list[Request]:
    """The requests of `hours` (the first `span_s` seconds of each), back to back from t = 0:
    hour i of the list occupies [i·span_s, (i+1)·span_s)."""
    times = [r.arrival for r in requests]
    out: list[Request] = []
    for i, h in enumerate(hours):
        lo = bisect.bisect_left(times, h * HOUR_S)
        hi = bisect.bisect_left(times, h * HOUR_S + span_s)
        shift = i * span_s - h * HOUR_S
        out += [replace(r, arrival=r.arrival + shift) for r in requests[lo:hi]]
    return out


# ---- metrics ---------------------------------------------------------------------------------


def summarize(
    outcomes: Sequence[Outcome], duration_s: float, ttft_slo_s: float, tpot_slo_s: float
) -> dict[str, float]:
    """Latency percentiles and throughput of one run (see the module doc)."""
    ttft, e2e, norm = [], [], []
    finished = good = 0
    for o in outcomes:
        if math.isnan(o.e2e):
            ttft.append(math.inf)
            e2e.append(math.inf)
            norm.append(math.inf)
            continue
        finished += 1
        ttft.append(o.ttft)
        e2e.append(o.e2e)
        norm.append(o.e2e / max(1, o.output))
        tpot = (o.e2e - o.ttft) / (o.output - 1) if o.output > 1 else 0.0
        if o.ttft <= ttft_slo_s and tpot <= tpot_slo_s:
            good += 1
    n = len(outcomes)
    return {
        "requests": n,
        "finished": finished,
        "p99_ttft_s": percentile(ttft, 99),
        "p99_e2e_s": percentile(e2e, 99),
        "p99_normalized_s_per_token": percentile(norm, 99),
        "throughput": finished / duration_s,
        "goodput": good / duration_s,
        "slo_attainment": good / n if n else math.nan,
    }


def _score(m: dict[str, float]) -> tuple[float, float]:
    """Higher is better: goodput, then the lower P99 end-to-end latency."""
    return (round(m["goodput"], 6), -m["p99_e2e_s"])


# ---- the setup ---------------------------------------------------------------------------------


@dataclass
class _Setup:
    cfg: OServeBench
    perf: dict[Strategy, VariantPerf]
    types: RequestTypes
    space: LayoutSpace
    homogeneous: list[Layout]
    tuning: list[Request]
    held_out: list[Request]
    tuning_rates: tuple[float, ...]
    #: the layout space of every capacity source the run considers (one, or all with `auto`)
    spaces: dict[str, LayoutSpace] = field(default_factory=dict)

    def perf_of(self, s: Strategy) -> VariantPerf:
        return self.perf[s]

    def fleet(
        self, layout: Sequence[Strategy], controller: Any = None, tick_s: float | None = None
    ) -> Fleet:
        return Fleet(
            self.perf_of,
            layout,
            self.types,
            make_predictor(self.cfg.predictor),
            self.cfg.startup_s,
            controller,
            tick_s or self.cfg.replan_s,
            dispatch=self.cfg.dispatch,
        )

    def simulate(
        self, fleet: Fleet, requests: Sequence[Request], hours: int
    ) -> tuple[list[Outcome], dict[str, float]]:
        end = hours * self.cfg.span_s
        outs = fleet.run(requests, 0.0, end, self.cfg.drain_s)
        return outs, summarize(outs, end, self.cfg.ttft_slo_s, self.cfg.tpot_slo_s)


def _setup(cfg: OServeBench) -> _Setup:
    sc = load_scenario(cfg.scenario).with_seed(cfg.workload_seed)
    requests = sorted(sc.requests(), key=lambda r: r.arrival)
    tuning = part(requests, cfg.tuning_hours, cfg.span_s)
    held_out = part(requests, cfg.held_out_hours, cfg.span_s)
    if not tuning or not held_out:
        raise ValueError("the tuning or the held-out part holds no request")
    types = fit_request_types(
        [r.prompt_tokens for r in tuning], [r.output_tokens for r in tuning], cfg.types, cfg.seed
    )
    tuning_rates = types.rates(
        [r.prompt_tokens for r in tuning],
        [r.output_tokens for r in tuning],
        len(cfg.tuning_hours) * cfg.span_s,
    )
    cat = load_catalog()
    arch = cat.architecture(cfg.model)
    perf = cfg.layouts(cat)
    ctx = CapacityContext(
        perf,
        types,
        [(r.prompt_tokens, r.output_tokens) for r in tuning],
        SloSpec(cfg.ttft_slo_s, cfg.tpot_slo_s, cfg.slo_attainment),
        ProbeSettings(seed=cfg.seed),
        cfg.capacity_file,
    )
    names = sorted(CAPACITY_SOURCES) if cfg.capacity == AUTO else [cfg.capacity]
    spaces = {
        name: LayoutSpace(
            capacity_table(name, ctx), node_gpus=cfg.node_gpus, attention_heads=arch.attention_heads
        )
        for name in names
    }
    space = spaces[names[0]]
    homogeneous: list[Layout] = []
    for d in space.sizes():
        for s in space.strategies(d):
            count = cfg.gpus // d
            while count > 0 and not packs([s] * count, cfg.gpus, cfg.node_gpus):
                count -= 1
            if count:
                homogeneous.append(canonical([s] * count))
    return _Setup(cfg, perf, types, space, homogeneous, tuning, held_out, tuning_rates, spaces)


# ---- the three deployments ---------------------------------------------------------------------


class _Reload:
    """Switches to the hour's homogeneous layout at each hour's start (plan_switch's steps)."""

    def __init__(self, setup: _Setup, schedule: Sequence[Layout]) -> None:
        self.s = setup
        self.schedule = list(schedule)
        self.hour = 0
        self.last_count = [0] * setup.types.k
        self.last_t = 0.0

    def tick(self, fleet: Fleet, now: float) -> None:
        cfg = self.s.cfg
        hour = int(now // cfg.span_s + 1e-9)
        rates = _observed_rates(fleet, self, now) or self.s.tuning_rates
        if hour == self.hour or hour >= len(self.schedule):
            return
        self.hour = hour
        target = self.schedule[hour]
        if canonical(fleet.held()) == canonical(target) or fleet.switching:
            return
        plan = plan_switch(
            self.s.space, fleet.held(), target, cfg.gpus, rates, cfg.startup_s, cfg.node_gpus
        )
        fleet.execute(plan, now)


def _observed_rates(fleet: Fleet, ctl: Any, now: float) -> tuple[float, ...] | None:
    """Per-type arrivals/s since the controller's last call (types on predicted lengths)."""
    dt = now - ctl.last_t
    counts = list(fleet.type_counts)
    rates = None
    if dt > 0:
        rates = tuple((c - c0) / dt for c, c0 in zip(counts, ctl.last_count, strict=True))
        if sum(rates) <= 0:
            rates = None
    ctl.last_count, ctl.last_t = counts, now
    return rates


class _Hetero:
    """sageserve's re-plan: the layout loop's step (`plan.layout_step.replan_layout`, the rule
    the operator runs) on the fleet, then the assignment weights (module doc)."""

    def __init__(self, setup: _Setup) -> None:
        self.s = setup
        self.memory = LayoutMemory()
        self.settings = LayoutSettings(confirmations=setup.cfg.confirmations, seed=setup.cfg.seed)
        self.centroids = tuple(setup.types.centroid_tokens(j) for j in range(setup.types.k))
        self.last_count = [0] * setup.types.k
        self.last_t = 0.0
        self.replans = 0
        self.decisions: list[dict[str, Any]] = []

    def weights(self, fleet: Fleet, rates: Sequence[float]) -> None:
        serving = [r.strategy for r in fleet.serving()]
        if not serving:
            return
        cap = self.s.space.capacity
        can_serve = {j: {s for s in serving if cap[s][j] > 0} for j in range(len(rates))}
        fleet.set_weights(dict(enumerate(layout_weights(cap, serving, rates))), can_serve)

    def tick(self, fleet: Fleet, now: float) -> None:
        """Observe the fleet (the layout it holds, the last interval's per-type rates as the
        next hour's forecast, the fixed budget, no GPU beyond it), step, apply."""
        cfg, space = self.s.cfg, self.s.space
        observed = _observed_rates(fleet, self, now)
        rates = observed or self.s.tuning_rates
        if observed is not None and not fleet.switching:
            self.replans += 1
            obs = ReplanObservation(
                now,
                canonical(fleet.held()),
                cfg.gpus,
                "the benchmark's budget",
                0,
                cfg.startup_s,
                tuple(space.capacity),
                space=space,
                mix=Mix(self.centroids, tuple(rates)),
                windows=(Window(HOUR_S, tuple(rates)),),
                history_s=cfg.replan_s,
            )
            out = replan_layout(obs, self.memory, self.settings)
            self.memory = out.memory
            target = out.switch.target if out.switch is not None else fleet.held()
            self.decisions.append(
                {
                    "t": now,
                    "switch": out.switch is not None,
                    "target": describe(target),
                    "reason": out.message,
                }
            )
            if out.switch is not None:
                fleet.execute(out.switch, now)
        self.weights(fleet, rates)


def _per_hour(outs: Sequence[Outcome], cfg: OServeBench) -> list[dict[str, float]]:
    rows = []
    for i in range(len(cfg.held_out_hours)):
        lo, hi = i * cfg.span_s, (i + 1) * cfg.span_s
        sub = [o for o in outs if lo <= o.arrival < hi]
        rows.append(summarize(sub, cfg.span_s, cfg.ttft_slo_s, cfg.tpot_slo_s))
    return rows


def run_bench(cfg: OServeBench, progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """The three deployments on the held-out hours (module doc); figures as a dict."""
    say = progress or (lambda _m: None)
    t_start = time.perf_counter()
    s = _setup(cfg)
    n_tune, n_held = len(cfg.tuning_hours), len(cfg.held_out_hours)

    # (a) static: the best homogeneous layout on the tuning hours
    tuning_scores: dict[str, dict[str, float]] = {}
    for lay in s.homogeneous:
        _, m = s.simulate(s.fleet(lay), s.tuning, n_tune)
        tuning_scores[describe(lay)] = m
        say(f"tuning {describe(lay)}: goodput {m['goodput']:.3f}, P99 e2e {m['p99_e2e_s']:.1f} s")
    static = max(s.homogeneous, key=lambda lay: _score(tuning_scores[describe(lay)]))

    # (b) per-hour reload: the best homogeneous layout of each held-out hour (hindsight)
    schedule: list[Layout] = []
    hour_scores: list[dict[str, dict[str, float]]] = []
    for i in range(n_held):
        hour = [
            replace(r, arrival=r.arrival - i * cfg.span_s)
            for r in s.held_out
            if i * cfg.span_s <= r.arrival < (i + 1) * cfg.span_s
        ]
        scores = {}
        for lay in s.homogeneous:
            _, m = s.simulate(s.fleet(lay), hour, 1)
            scores[describe(lay)] = m
        hour_scores.append(scores)
        best = max(s.homogeneous, key=lambda lay: _score(scores[describe(lay)]))
        schedule.append(best)
        say(f"held-out hour {cfg.held_out_hours[i]}: best homogeneous {describe(best)}")

    results: dict[str, Any] = {}
    runs: list[tuple[str, Fleet, Any]] = []
    runs.append(("static", s.fleet(static), None))
    reload_ctl = _Reload(s, schedule)
    # ticks on the hour boundaries
    runs.append(("per-hour reload", s.fleet(schedule[0], reload_ctl, cfg.span_s), reload_ctl))
    capacity_tuning: dict[str, dict[str, float]] = {}
    start_candidates: list[dict[str, Any]] = []
    s, chosen, initial = _choose_start(s, static, capacity_tuning, start_candidates, say)
    hetero_ctl = _Hetero(s)
    runs.append(("heterogeneous", s.fleet(initial, hetero_ctl), hetero_ctl))
    hetero_outs: list[Outcome] = []
    for name, fleet, _ctl in runs:
        outs, m = s.simulate(fleet, s.held_out, n_held)
        if name == "heterogeneous":
            hetero_outs = outs
        results[name] = {
            **m,
            "layouts": [{"t": t, "layout": lay} for t, lay in fleet.stats.layouts],
            "switches": fleet.stats.switches,
            "started_gpu_seconds": fleet.stats.started_gpu_seconds,
            "per_hour": _per_hour(outs, cfg),
            "requests_per_strategy": _count_by(outs, lambda o: o.strategy),
        }
        say(f"{name}: goodput {m['goodput']:.3f}, P99 e2e {m['p99_e2e_s']:.1f} s")
    results["heterogeneous"]["replans"] = hetero_ctl.replans
    results["heterogeneous"]["overflows"] = next(
        f.overflows for name, f, _c in runs if name == "heterogeneous"
    )
    results["heterogeneous"]["decisions"] = hetero_ctl.decisions
    results["heterogeneous"]["type_by_strategy"] = {
        str(j): _count_by([o for o in hetero_outs if o.type == j], lambda o: o.strategy)
        for j in range(s.types.k)
    }
    return {
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in cfg.__dict__.items()},
        "types": [
            {
                "prompt_tokens": s.types.centroid_tokens(j)[0],
                "output_tokens": s.types.centroid_tokens(j)[1],
                "tuning_rate": s.tuning_rates[j],
                "capacity": {str(st): s.space.capacity[st][j] for st in s.space.capacity},
            }
            for j in range(s.types.k)
        ],
        "derived": {str(st): v.derived for st, v in s.perf.items()},
        "tuning": tuning_scores,
        "static_layout": describe(static),
        "reload_schedule": [describe(x) for x in schedule],
        "hour_scores": hour_scores,
        "hetero_initial": describe(initial),
        "capacity_source": chosen,
        "capacity_tuning": capacity_tuning,
        "start_candidates": start_candidates,
        "results": results,
        "wall_s": time.perf_counter() - t_start,
    }


def _choose_start(
    s: _Setup,
    static: Layout,
    capacity_tuning: dict[str, dict[str, float]],
    start_candidates: list[dict[str, Any]],
    say: Callable[[str], None],
) -> tuple[_Setup, str, Layout]:
    """The heterogeneous plan's capacity source and start layout (`--capacity`, `--start`;
    module doc); fills `capacity_tuning` (per source, the tuning-hour score of its plan, or
    with `simulated` of its best candidate) and `start_candidates` (`simulated`: every
    candidate's tuning-hour score)."""
    cfg = s.cfg
    n_tune = len(cfg.tuning_hours)
    if cfg.start == "simulated":
        # the search's distinct layouts per capacity source and seed, and the best
        # homogeneous one, each run as the heterogeneous plan on the tuning hours
        cands: list[tuple[str, Layout]] = []
        for name, space in s.spaces.items():
            for k in range(cfg.start_seeds):
                lay = search_layout(space, s.tuning_rates, cfg.gpus, seed=cfg.seed + k).layout
                if (name, canonical(lay)) not in cands:
                    cands.append((name, canonical(lay)))
        first = next(iter(s.spaces))
        if not any(lay == canonical(static) for _, lay in cands):
            cands.append((first, canonical(static)))
        best_of: dict[str, Layout] = {}  # per source, its best candidate (first of ties)
        for name, lay in cands:
            trial = replace(s, space=s.spaces[name])
            _, m = trial.simulate(trial.fleet(lay, _Hetero(trial)), s.tuning, n_tune)
            start_candidates.append({"capacity": name, "layout": describe(lay), **m})
            say(
                f"tuning heterogeneous start {describe(lay)} ({name} n): goodput "
                f"{m['goodput']:.3f}, P99 e2e {m['p99_e2e_s']:.1f} s"
            )
            if name not in best_of or _score(m) > _score(capacity_tuning[name]):
                best_of[name], capacity_tuning[name] = lay, m
        chosen = max(best_of, key=lambda n: _score(capacity_tuning[n]))
        initial = best_of[chosen]
        s = replace(s, space=s.spaces[chosen])
    elif len(s.spaces) > 1:  # --capacity auto: choose the source on the tuning hours
        for name, space in s.spaces.items():
            trial = replace(s, space=space)
            start = search_layout(space, s.tuning_rates, cfg.gpus, seed=cfg.seed).layout
            _, m = trial.simulate(trial.fleet(start, _Hetero(trial)), s.tuning, n_tune)
            capacity_tuning[name] = m
            say(
                f"tuning heterogeneous with {name} n ({describe(start)}): goodput "
                f"{m['goodput']:.3f}, P99 e2e {m['p99_e2e_s']:.1f} s"
            )
        chosen = max(s.spaces, key=lambda n: _score(capacity_tuning[n]))
        s = replace(s, space=s.spaces[chosen])
        initial = search_layout(s.space, s.tuning_rates, cfg.gpus, seed=cfg.seed).layout
    else:
        chosen = next(iter(s.spaces), cfg.capacity)
        initial = search_layout(s.space, s.tuning_rates, cfg.gpus, seed=cfg.seed).layout
    return s, chosen, initial


def _count_by(outs: Sequence[Outcome], key: Callable[[Outcome], str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for o in outs:
        k = key(o)
        out[k] = out.get(k, 0) + 1
    return dict(sorted(out.items()))


# ---- the command -------------------------------------------------------------------------------


def _gain(base: float, new: float) -> str:
    if not (base > 0 and new > 0) or math.isinf(base) or math.isinf(new):
        return "n/a"
    return f"{base / new:.3f}×"


def bench_oserve_command(
    cfg: OServeBench, json_out: Path | None, console: Console
) -> dict[str, Any]:
    out = run_bench(cfg, progress=lambda m: console.print(f"[dim]{m}[/dim]"))
    _print(out, console)
    if json_out is not None:
        json_out.write_text(json.dumps(out, indent=2) + "\n")
    return out


DEPLOYMENTS = ("static", "per-hour reload", "heterogeneous")


def _ratio(a: float, b: float) -> float:
    """a / b, NaN where either is not a finite positive figure (left out of a spread)."""
    if not (a > 0 and b > 0) or math.isinf(a) or math.isinf(b):
        return math.nan
    return a / b


def spread_of_runs(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Every deployment's figures over the runs (one per seed), and the heterogeneous plan's
    gains: goodput over the baseline's, and the baseline's P99 e2e over the plan's."""
    out: dict[str, Any] = {"seeds": [r["config"]["seed"] for r in runs], "deployments": {}}
    keys = ("goodput", "p99_e2e_s", "p99_ttft_s", "slo_attainment", "switches")
    for name in DEPLOYMENTS:
        rows = [r["results"][name] for r in runs]
        out["deployments"][name] = {k: asdict(spread([x[k] for x in rows])) for k in keys}
    gains: dict[str, Any] = {}
    for base in DEPLOYMENTS[:2]:
        het = [r["results"]["heterogeneous"] for r in runs]
        ref = [r["results"][base] for r in runs]
        gains[base] = {
            "goodput": asdict(
                spread([_ratio(h["goodput"], b["goodput"]) for h, b in zip(het, ref, strict=True)])
            ),
            "p99_e2e": asdict(
                spread(
                    [_ratio(b["p99_e2e_s"], h["p99_e2e_s"]) for h, b in zip(het, ref, strict=True)]
                )
            ),
        }
    out["hetero_gain_vs"] = gains
    return out


def bench_oserve_seeds(
    cfgs: Sequence[OServeBench], json_out: Path | None, console: Console
) -> dict[str, Any]:
    """One comparison per configuration (one per seed), each printed, then the spread."""
    if len(cfgs) == 1:
        return bench_oserve_command(cfgs[0], json_out, console)
    runs: list[dict[str, Any]] = []
    for cfg in cfgs:
        console.print(f"[bold]seed {cfg.seed}[/] (workload and k-means / search)")
        runs.append(bench_oserve_command(cfg, None, console))
    sp = spread_of_runs(runs)
    _print_spread(runs, sp, console)
    doc = {"runs": runs, "spread": sp}
    if json_out is not None:
        json_out.write_text(json.dumps(doc, indent=2) + "\n")
    return doc


def _print_spread(runs: Sequence[dict[str, Any]], sp: dict[str, Any], console: Console) -> None:
    per = Table(title="per seed: goodput req/s / P99 e2e s on the held-out hours")
    for c in ("seed", "static layout", "reload layouts", "hetero start", *DEPLOYMENTS):
        per.add_column(c, justify="right" if c == "seed" else "left")
    for r in runs:
        res = r["results"]
        per.add_row(
            str(r["config"]["seed"]),
            r["static_layout"],
            " → ".join(r["reload_schedule"]),
            r["hetero_initial"],
            *[f"{res[n]['goodput']:.3f} / {res[n]['p99_e2e_s']:.1f}" for n in DEPLOYMENTS],
        )
    console.print(per)
    seeds = ", ".join(str(x) for x in sp["seeds"])
    t = Table(title=f"over seeds {seeds}: mean \\[lowest, highest]")
    cols = (
        "deployment",
        "goodput req/s",
        "P99 e2e s",
        "P99 TTFT s",
        "SLO %",
        "switches",
        "hetero goodput gain",
        "hetero P99 e2e gain",
    )
    for c in cols:
        t.add_column(c, justify="left" if c == "deployment" else "right")
    for name in DEPLOYMENTS:
        d = sp["deployments"][name]
        slo = {k: (v * 100 if k != "n" else v) for k, v in d["slo_attainment"].items()}
        g = sp["hetero_gain_vs"].get(name)
        t.add_row(
            name,
            Spread(**d["goodput"]).format(".3f"),
            Spread(**d["p99_e2e_s"]).format(".1f"),
            Spread(**d["p99_ttft_s"]).format(".2f"),
            Spread(**slo).format(".2f"),
            Spread(**d["switches"]).format(".1f"),
            Spread(**g["goodput"]).format(".3f", "×") if g else "—",
            Spread(**g["p99_e2e"]).format(".3f", "×") if g else "—",
        )
    console.print(t)


def _print(out: dict[str, Any], console: Console) -> None:
    cfg = out["config"]
    console.print(
        f"OServe on the mixed workload: {cfg['model']} on {cfg['gpus']} × {cfg['gpu_type']} "
        f"(nodes of {cfg['node_gpus']}), {cfg['scenario']}; tuning hours "
        f"{list(cfg['tuning_hours'])}, held-out hours {list(cfg['held_out_hours'])} "
        f"({cfg['span_s']:g} s each); start-up {cfg['startup_s']:g} s, re-plan every "
        f"{cfg['replan_s']:g} s; SLO: TTFT ≤ {cfg['ttft_slo_s']:g} s and time per output token "
        f"≤ {cfg['tpot_slo_s']:g} s; predictor {cfg['predictor']}"
    )
    types = Table(
        title=f"request types (k-means on the tuning hours) and capacity n (req/s, "
        f"{out.get('capacity_source', cfg.get('capacity', 'analytical'))})"
    )
    types.add_column("type", justify="right")
    types.add_column("prompt", justify="right")
    types.add_column("output", justify="right")
    types.add_column("tuning req/s", justify="right")
    strategies = list(out["types"][0]["capacity"]) if out["types"] else []
    for st in strategies:
        types.add_column(st + (" (derived)" if out["derived"].get(st) else ""), justify="right")
    for j, t in enumerate(out["types"]):
        types.add_row(
            str(j),
            f"{t['prompt_tokens']:.0f}",
            f"{t['output_tokens']:.0f}",
            f"{t['tuning_rate']:.3f}",
            *[f"{t['capacity'][st]:.2f}" for st in strategies],
        )
    console.print(types)
    res = out["results"]
    het = res["heterogeneous"]
    table = Table(title="held-out hours: P99 latency and throughput at SLO")
    cols = (
        "deployment",
        "layouts",
        "switches",
        "P99 TTFT s",
        "P99 e2e s",
        "P99 s/token",
        "req/s",
        "goodput req/s",
        "SLO %",
        "hetero P99 e2e gain",
        "hetero goodput gain",
    )
    for c in cols:
        table.add_column(c, justify="left" if c in ("deployment", "layouts") else "right")
    for name in ("static", "per-hour reload", "heterogeneous"):
        r = res[name]
        layouts = " → ".join(dict.fromkeys(x["layout"] for x in r["layouts"]))
        table.add_row(
            name,
            layouts if len(layouts) < 80 else f"{len(r['layouts'])} layouts (--json)",
            str(r["switches"]),
            f"{r['p99_ttft_s']:.2f}",
            f"{r['p99_e2e_s']:.1f}",
            f"{r['p99_normalized_s_per_token']:.3f}",
            f"{r['throughput']:.3f}",
            f"{r['goodput']:.3f}",
            f"{100 * r['slo_attainment']:.2f}",
            "—" if name == "heterogeneous" else _gain(r["p99_e2e_s"], het["p99_e2e_s"]),
            "—" if name == "heterogeneous" else _gain(het["goodput"], r["goodput"]),
        )
    console.print(table)
    hours = Table(title="per held-out hour: P99 e2e s / goodput req/s")
    hours.add_column("hour", justify="right")
    hours.add_column("reload layout")
    for name in ("static", "per-hour reload", "heterogeneous"):
        hours.add_column(name, justify="right")
    for i, h in enumerate(cfg["held_out_hours"]):
        hours.add_row(
            str(h),
            out["reload_schedule"][i],
            *[
                f"{res[n]['per_hour'][i]['p99_e2e_s']:.1f} / {res[n]['per_hour'][i]['goodput']:.3f}"
                for n in ("static", "per-hour reload", "heterogeneous")
            ],
        )
    console.print(hours)
    console.print(
        f"static layout (tuning): {out['static_layout']}; heterogeneous start: "
        f"{out['hetero_initial']} ({cfg.get('start', 'search')}, "
        f"{out.get('capacity_source', '?')} n, {len(out.get('start_candidates', []))} "
        f"candidates), dispatch {cfg.get('dispatch', 'weighted')} "
        f"({het.get('overflows', 0)} overflows), {het['replans']} re-plans, "
        f"{het['switches']} switches; wall time {out['wall_s']:.1f} s"
    )
