"""Several parallelism layouts of one model side by side on a fixed GPU budget (OServe).

The harness of `sageserve bench oserve`. Why not the plan-cycle
simulator (`sim/engine.py`): its endpoints hold one variant per (model, region, GPU type)
and scale instance counts; several (TP, PP) layouts of one model on one GPU type, with
requests dispatched by type between them, would need endpoints keyed by layout and a picker
by type through the whole cluster model, a large refactor. The benchmark fixes the GPUs
anyway, so this harness runs a fixed budget of instances and reuses the simulator's instance
model (`sim/instance.py`: continuous batching, chunked prefill, KV preemption) with the
profiles of `PerfCatalog.layout` (measured TP tables, derived pipelines); it writes no second
instance model.

What it does:
- **dispatch by type**: each arrival gets a predicted output length (a `dispatch/length_predictor`
  predictor, learning from finished requests, keyed by the request's client, here the
  service), and a type from `forecast/request_types.RequestTypes` (nearest centroid in log
  space on (prompt, predicted output)). With dispatch weights set (per type, per strategy:
  Σ over the strategy's replicas of the assignment LP's x_{k,j}/λ_j, `plan/oserve_assign.py`),
  the strategy is chosen by smooth weighted round robin over the strategies with weight
  (deterministic: after n requests of a type every strategy has had its share within one
  request), then the replica of that strategy with the fewest tokens left
  (`remaining_tokens_at`, the pool's and the twin's picker). A type with no weight on any
  serving strategy, or no weights at all (a homogeneous layout), goes to the least-loaded
  serving replica. The dispatch strategy is named (`DISPATCH_STRATEGIES`): `weighted`
  follows the weights strictly; `weighted-overflow` (`_overflow`) treats them as a
  preference and sends a request elsewhere when its preferred replica is swamped. The
  type, the round robin and the overflow test are `dispatch/layout_dispatch.py`'s, the rule
  `sageserve router` follows between a region's variants (OServe §4.2);
- **switching**: `execute(plan)` runs a `plan/layout_switch.SwitchPlan`'s actions in order:
  consecutive starts begin together and serve after the start-up time; a stop waits until
  the starts before it serve, then takes the replica of that strategy with the least work
  off dispatch. A stopped replica drains (it finishes what it holds) and its GPUs are
  counted free at once: a slight optimism, drains take seconds against a 600 s start-up.
  Arrivals that find no serving replica wait in a queue until one serves;
- **a controller** (`Controller`) is called every `tick_s` with the fleet (re-planning,
  weights, scheduled switches).

Latency per request: TTFT (first token − arrival) and end-to-end (finish − arrival). A
request that never fits the KV cache, or is still unfinished when the run stops, has no
latency (counted as missing its SLO).
"""

from __future__ import annotations

import math
from collections import Counter, deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from sageserve.core.types import InstanceState, Request
from sageserve.dispatch.layout_dispatch import (
    OVERFLOW_RATIO,
    OVERFLOW_TOKENS,
    TypeWeights,
    overflow,
)
from sageserve.dispatch.layout_dispatch import nearest_type as _nearest_type
from sageserve.dispatch.length_predictor import LengthPredictor, LengthQuery
from sageserve.forecast.request_types import RequestTypes
from sageserve.perf.model import PerfCatalog, VariantPerf
from sageserve.plan.layout_search import Layout, Strategy, canonical
from sageserve.plan.layout_switch import SwitchPlan, switch_targets
from sageserve.sim.events import INSTANCE, Event, EventQueue, fire
from sageserve.sim.instance import Instance, InstanceHooks, Job

_EV_READY, _EV_TICK = 1, 2  # next to events.INSTANCE (0)

#: Dispatch strategies by name (`Fleet(dispatch=...)`, `bench oserve --dispatch`):
#: - `weighted`: the type's strategy by smooth weighted round robin over the LP's weights,
#:   then that strategy's least-loaded replica; the weights are followed exactly;
#: - `weighted-overflow`: the same preference, but a request whose preferred replica has
#:   more than `overflow_ratio` × the tokens left of the least-loaded replica of another
#:   strategy that can serve its type, plus `overflow_tokens`, goes there instead
#:   (`_overflow`, the rule `dispatch.layout_dispatch.overflow`, which the router follows too).
DISPATCH_STRATEGIES = ("weighted", "weighted-overflow")


@dataclass(frozen=True)
class LayoutBudget:
    """The GPUs a layout question is asked on, shared by `sageserve bench oserve` and
    `sageserve calibrate --by-type`: one model on `gpus` GPUs of one type (nodes of
    `node_gpus`), its requests from `scenario` clustered into `types` request types."""

    scenario: Path
    model: str = "llama-2-70b"
    gpu_type: str = "NVIDIA-H100-80GB-HBM3"
    gpus: int = 16
    node_gpus: int = 8
    types: int = 4
    #: restrict the layouts (e.g. ("TP4", "TP8")); empty: every layout of the catalogue
    strategies: tuple[str, ...] = ()

    def layouts(self, catalog: PerfCatalog) -> dict[Strategy, VariantPerf]:
        """The model's layouts on the budget (`PerfCatalog.layouts`), `strategies` only
        when given; raises ValueError naming `--strategies` when none is left."""
        perf = {
            Strategy(v.tensor_parallel, v.pipeline_parallel): v
            for v in catalog.layouts(self.model, self.gpu_type, self.gpus, self.node_gpus)
        }
        if self.strategies:
            perf = {s: v for s, v in perf.items() if str(s) in self.strategies}
        if not perf:
            raise ValueError(
                f"--strategies: none of {list(self.strategies)} is a layout of {self.model} "
                f"on {self.gpus} {self.gpu_type}"
            )
        return perf


@dataclass
class Outcome:
    """One request's result."""

    arrival: float
    prompt: int
    output: int
    client: int
    type: int
    strategy: str = ""
    ttft: float = math.nan
    e2e: float = math.nan


class Controller(Protocol):
    def tick(self, fleet: Fleet, now: float) -> None:
        """Called every `tick_s` of simulated time (and once at the start)."""
        ...


class _Replica:
    __slots__ = ("inst", "ready", "stopped", "strategy")

    def __init__(self, inst: Instance, strategy: Strategy, ready: bool) -> None:
        self.inst = inst
        self.strategy = strategy
        self.ready = ready
        self.stopped = False


def nearest_type(types: RequestTypes, prompt: float, output: float) -> int:
    """`types.classify` for one request, without numpy: `dispatch.layout_dispatch.nearest_type`
    on the fitted centroids (the router classifies with the same function)."""
    return _nearest_type(types.log_centroids, prompt, output)


@dataclass
class FleetStats:
    switches: int = 0
    started_gpu_seconds: float = 0.0
    layouts: list[tuple[float, str]] = field(default_factory=list)


class Fleet(InstanceHooks):
    """A fixed budget of instances of one model in several layouts (see the module doc)."""

    def __init__(
        self,
        perf_of: Callable[[Strategy], VariantPerf],
        layout: Sequence[Strategy],
        types: RequestTypes,
        predictor: LengthPredictor,
        startup_s: float,
        controller: Controller | None = None,
        tick_s: float = 600.0,
        dispatch: str = "weighted",
        overflow_ratio: float = OVERFLOW_RATIO,
        overflow_tokens: float = OVERFLOW_TOKENS,
    ) -> None:
        if dispatch not in DISPATCH_STRATEGIES:
            raise ValueError(f"dispatch: one of {', '.join(DISPATCH_STRATEGIES)}, got {dispatch!r}")
        if overflow_ratio < 1.0 or overflow_tokens < 0.0:
            raise ValueError("overflow_ratio: must be >= 1, overflow_tokens: >= 0")
        self.dispatch = dispatch
        self.overflow_ratio = overflow_ratio
        self.overflow_tokens = overflow_tokens
        self.overflows = 0
        self.perf_of = perf_of
        self.types = types
        self.predictor = predictor
        self.startup_s = startup_s
        self.controller = controller
        self.tick_s = tick_s
        self.events = EventQueue()
        self.replicas: list[_Replica] = []
        #: per type, per strategy dispatch weights and their round-robin credits (None: none)
        self.weights: TypeWeights[Strategy] | None = None
        #: per type, the strategies that can serve it (n > 0); absent type or None: all
        self.can_serve: dict[int, frozenset[Strategy]] | None = None
        self.pending: deque[Job] = deque()
        self.outcomes: list[Outcome] = []
        self.type_counts: list[int] = [0] * types.k
        self.stats = FleetStats()
        #: the switch plan running and how many of its actions are taken
        self._plan: SwitchPlan | None = None
        self._done = 0
        self._starting = 0
        self._n = 0
        for s in layout:
            self._add(s, ready=True)
        self.stats.layouts.append((0.0, self.describe()))

    # ---- InstanceHooks ----------------------------------------------------------------------

    def schedule(self, inst: Instance, when: float) -> None:
        self.events.schedule(inst, when)

    def on_idle(self, inst: Instance, now: float) -> None:
        return None

    def on_finish(self, job: Job, now: float) -> None:
        out = job.ep
        assert isinstance(out, Outcome)
        if now < 0:  # never fits the KV cache: refused
            return
        out.ttft = job.first_token - out.arrival
        out.e2e = now - out.arrival
        self.predictor.observe(out.client, out.prompt, out.output)

    # ---- layout -----------------------------------------------------------------------------

    def _add(self, s: Strategy, ready: bool) -> _Replica:
        self._n += 1
        inst = Instance(f"{s}-{self._n}", self.perf_of(s), "oserve", self)
        if not ready:
            inst.state = InstanceState.PROVISIONING
        r = _Replica(inst, s, ready)
        self.replicas.append(r)
        return r

    def held(self) -> Layout:
        """Replicas serving or starting (what holds GPUs)."""
        return canonical(r.strategy for r in self.replicas if not r.stopped)

    def serving(self) -> list[_Replica]:
        return [r for r in self.replicas if r.ready and not r.stopped]

    def describe(self) -> str:
        counts: dict[str, int] = {}
        for s in self.held():
            counts[str(s)] = counts.get(str(s), 0) + 1
        return " + ".join(f"{k} ×{v}" if v > 1 else k for k, v in counts.items())

    @property
    def switching(self) -> bool:
        return self._plan is not None or self._starting > 0

    def execute(self, plan: SwitchPlan, now: float) -> None:
        """Run a switch plan's actions (see the module doc); one plan at a time."""
        if self.switching:
            raise RuntimeError("a switch is already running")
        if not plan.actions:
            return
        self.stats.switches += 1
        self._plan, self._done = plan, 0
        self._advance(now)

    def _advance(self, now: float) -> None:
        """Take the actions `plan.layout_switch.switch_targets` allows with the replicas
        serving now: the rule the operator's layout loop steps pod sets by."""
        if self._plan is not None:
            ready = Counter(r.strategy for r in self.serving())
            progress = switch_targets(self._plan, ready, self._done)
            for a in self._plan.actions[self._done : progress.done]:
                if a.kind == "start":
                    r = self._add(a.strategy, ready=False)
                    self._starting += 1
                    self.stats.started_gpu_seconds += a.strategy.gpus * self.startup_s
                    self.events.push(now + self.startup_s, _EV_READY, r)
                else:
                    self._stop(a.strategy, now)
            self._done = progress.done
            if progress.finished:
                self._plan = None
        if not self._starting:
            self.stats.layouts.append((now, self.describe()))

    def _stop(self, strategy: Strategy, now: float) -> None:
        """Stop the serving replica of `strategy` with the least work left; it drains."""
        victims = [r for r in self.replicas if r.strategy == strategy and not r.stopped]
        if not victims:
            raise RuntimeError(f"switch plan stops {strategy}, which no replica runs")
        v = min(victims, key=lambda r: (not r.ready, r.inst.remaining_tokens_at(now)))
        v.stopped = True
        v.inst.state = InstanceState.DRAINING

    def _ready(self, r: _Replica, now: float) -> None:
        r.ready = True
        r.inst.state = InstanceState.SERVING
        self._starting -= 1
        while self.pending:
            self._dispatch(self.pending.popleft(), now)
        self._advance(now)

    # ---- dispatch ---------------------------------------------------------------------------

    def set_weights(
        self,
        weights: Mapping[int, Mapping[Strategy, float]] | None,
        can_serve: Mapping[int, Iterable[Strategy]] | None = None,
    ) -> None:
        """Per type, per strategy dispatch weights (None: least-loaded over all replicas);
        `can_serve`: per type, the strategies with n > 0 (the overflow's candidates)."""
        self.can_serve = (
            None if can_serve is None else {j: frozenset(ss) for j, ss in can_serve.items()}
        )
        if weights is None:
            self.weights = None
            return
        self.weights = TypeWeights(weights)

    def _dispatch(self, job: Job, now: float) -> None:
        out = job.ep
        assert isinstance(out, Outcome)
        serving = self.serving()
        if not serving:
            self.pending.append(job)
            return
        pool = serving
        if self.weights is not None:
            pick = self.weights.choose(out.type, {r.strategy for r in serving})
            if pick is not None:
                pool = [r for r in serving if r.strategy == pick]
        best = min(pool, key=lambda r: r.inst.remaining_tokens_at(now))
        if self.dispatch == "weighted-overflow" and pool is not serving:
            best = self._overflow(best, serving, out.type, now)
        out.strategy = str(best.strategy)
        best.inst.enqueue(job, now)

    def _overflow(self, best: _Replica, serving: list[_Replica], j: int, now: float) -> _Replica:
        """`weighted-overflow`: keep the weights' choice unless it is swamped
        (`dispatch.layout_dispatch.overflow`, whose docstring says why; OServe §4.2). The load
        is `remaining_tokens_at` (queued and running: the least-loaded picker's measure);
        the candidates are the least-loaded replica of every other strategy that can serve
        the type (n > 0, `can_serve`). Within a strategy the least-loaded replica is already
        chosen, so a homogeneous layout dispatches as with `weighted`.
        """
        allowed = None if self.can_serve is None else self.can_serve.get(j)
        cands = [
            r
            for r in serving
            if r.strategy != best.strategy and (allowed is None or r.strategy in allowed)
        ]
        if not cands:
            return best
        alt = min(cands, key=lambda r: r.inst.remaining_tokens_at(now))
        alt_load = alt.inst.remaining_tokens_at(now)
        if overflow(
            best.inst.remaining_tokens_at(now), alt_load, self.overflow_ratio, self.overflow_tokens
        ):
            self.overflows += 1
            return alt
        return best

    def arrive(self, req: Request, now: float) -> Outcome:
        pred = self.predictor.predict(LengthQuery(req.client, req.prompt_tokens, req.output_tokens))
        j = nearest_type(self.types, req.prompt_tokens, pred)
        self.type_counts[j] += 1
        out = Outcome(req.arrival, req.prompt_tokens, req.output_tokens, req.client, j)
        job = Job(req, 0)
        job.pred_out = pred
        job.ep = out
        self.outcomes.append(out)
        self._dispatch(job, now)
        return out

    # ---- the loop ---------------------------------------------------------------------------

    def _pop(self, item: Event) -> None:
        when, _, kind, obj = item
        if kind == INSTANCE:
            assert isinstance(obj, Instance)
            fire(obj, when)
        elif kind == _EV_READY:
            assert isinstance(obj, _Replica)
            self._ready(obj, when)
        elif self.controller is not None:
            self.controller.tick(self, when)
            self.events.push(when + self.tick_s, _EV_TICK, None)

    def run(
        self, requests: Iterable[Request], start_s: float, end_s: float, drain_s: float
    ) -> list[Outcome]:
        """Replay the requests arriving in [start_s, end_s), then run `drain_s` more."""
        events = self.events
        if self.controller is not None:
            self.events.push(start_s, _EV_TICK, None)
        for req in requests:
            t = req.arrival
            if t < start_s:
                continue
            if t >= end_s:
                break
            for item in events.pop_due(t):
                self._pop(item)
            self.arrive(req, t)
        for item in events.pop_due(end_s + drain_s):
            if item[2] == _EV_TICK and item[0] >= end_s:
                continue  # no re-planning once arrivals stop
            self._pop(item)
        return self.outcomes
