"""The discrete-event loop: arrivals, instance events, ticks, routing, batch queue, scaling.

One run = one policy over one workload. Events are kept in a single heap (a unified event
queue, as SageServe's extension of splitwise-sim; `sim.events.EventQueue`, the one every
simulated world orders its events with): instance events (prefill end, a request
finishing, KV full), instance-ready events and callbacks. Arrivals are pulled lazily from the
time-ordered request stream, so a multi-day trace is never held in memory.

Routing, queueing and scaling call the pure code in `dispatch/` and `pace/`, exactly as the
operator does; this module only measures the simulated fleet and executes actions.
"""

from __future__ import annotations

import heapq
import math
from array import array
from collections import Counter, defaultdict, deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Protocol

from sageserve.api.model_deployment import DEFAULT_DRAIN_SECONDS
from sageserve.core.snapshot import Decision, EndpointSnapshot, Plan, PlanSolve, Snapshot
from sageserve.core.types import ActionKind, EndpointKey, InstanceState, Request
from sageserve.dispatch.anticipator import LoadAnticipator
from sageserve.dispatch.deadlines import capacity_at_max
from sageserve.dispatch.hold import HOLD_S, MAX_HELD
from sageserve.dispatch.instance_order import FCFS, InstanceScheduling
from sageserve.dispatch.instance_picker import (
    DEFAULT_PICKER,
    Arrival,
    make_picker,
    pick_deployment,
)
from sageserve.dispatch.length_predictor import (
    DEFAULT_PREDICTOR,
    LengthPredictor,
    LengthQuery,
    make_predictor,
)
from sageserve.dispatch.priorities import scheduler_priority
from sageserve.dispatch.queue_manager import (
    DEFAULT_PROMOTION_MARGIN_S,
    DEFAULT_RELEASE_RULES,
    PROMOTED_PER_SIGNAL,
    SIGNAL_S,
    BatchQueueManager,
)
from sageserve.dispatch.region_router import SpillLedger, pick_region, preference, route_region
from sageserve.pace.base import PacingStrategy, PlanSource
from sageserve.pace.cadence import PlanClock, PlanMove, plan_step
from sageserve.pace.pressure import SCALE_IN_STABILIZATION_S, with_deadline_need
from sageserve.pace.step import StepState, adopt, decide
from sageserve.perf.model import VariantPerf
from sageserve.perf.model import request_decode_tps as perf_request_decode_tps
from sageserve.plan.learned_capacity import model_theta_in_force
from sageserve.sim.cluster import Cluster, Delays, Deployment, Endpoint, Node
from sageserve.sim.deadlines import PendingWork
from sageserve.sim.events import INSTANCE, EventQueue
from sageserve.sim.events import fire as fire_instance_event
from sageserve.sim.held import HeldRequests
from sageserve.sim.instance import Instance, InstanceHooks, Job
from sageserve.sim.interactive import with_interactive_running
from sageserve.sim.member_clusters import SimFleet
from sageserve.sim.pooled_pods import PooledPods, PoolObservation, PoolSetup
from sageserve.sim.window_tokens import WindowTokens

if TYPE_CHECKING:  # imported when a run has layouts: they pull in the plan cycle
    from sageserve.plan.learned_capacity import LearnedCapacity, ThetaTable
    from sageserve.sim.capacity_windows import CapacitySetup, CapacityWindows
    from sageserve.sim.layout_loop import SimLayoutLoop, SimLayouts

_INF = math.inf
#: the engine's own event kinds next to `events.INSTANCE` (0)
_EV_READY, _EV_CALL = 1, 2


def _region_of(ep: Endpoint) -> str:
    return ep.key.region


@dataclass(frozen=True)
class RegionPlacement:
    region: str
    min_instances: int
    max_instances: int
    initial_instances: int


@dataclass(frozen=True)
class ModelSetup:
    """One ModelDeployment as the simulator needs it."""

    name: str
    variants: tuple[tuple[str, VariantPerf], ...]
    regions: tuple[RegionPlacement, ...]
    #: Longest prompt + output a request may ask for (vLLM's max_model_len); 0: no limit.
    context_length: int = 0
    #: θ: tokens/s one instance serves within the SLO (the manifests'
    #: capacityTokensPerSecond, the largest of the variants); 0: unknown. Only the batch
    #: deadline accounting reads it (`sim.deadlines`), to judge the queue left at the end.
    capacity_tps: float = 0.0
    #: per variant, seconds a drained instance may finish its requests before it is
    #: stopped (`Variant.drain_seconds`, the pod's terminationGracePeriodSeconds); a
    #: variant not named gets the ModelDeployment default
    drain_seconds: Mapping[str, float] = field(default_factory=dict)


def request_decode_tps(model: ModelSetup) -> float:
    """Tokens/s one request of `model` decodes at on a full instance, the slowest
    variant's (`perf.model.request_decode_tps`, the router's rule too): the Queue Manager's
    estimate of a batch request's service time (tokens ÷ this)."""
    return perf_request_decode_tps(perf for _name, perf in model.variants)


@dataclass(frozen=True)
class SimConfig:
    """Everything one run needs besides the request stream and the strategy."""

    models: tuple[ModelSetup, ...]
    nodes: tuple[Node, ...]
    start_s: float
    end_s: float
    drain_s: float = 3600.0
    seed: int = 0
    region_order: tuple[str, ...] = ()
    route_threshold: float = 0.70
    release_rules: tuple[tuple[float, int], ...] = DEFAULT_RELEASE_RULES
    promotion_age_s: float | None = 10 * 3600.0
    #: slack a batch request with a deadline keeps when promoted (`dispatch.queue_manager`)
    promotion_margin_s: float | None = DEFAULT_PROMOTION_MARGIN_S
    pace_s: float = 15.0
    #: seconds between two batch signal rounds, and the promoted requests one round
    #: releases at most (`dispatch.queue_manager`, the router's `BatchReleaser` defaults)
    signal_s: float = SIGNAL_S
    promoted_per_signal: int = PROMOTED_PER_SIGNAL
    #: a request for a model with nothing serving anywhere waits at most `hold_s`, and at
    #: most `max_held` wait at once; else it is refused (`dispatch.hold`, the router's)
    hold_s: float = HOLD_S
    max_held: int = MAX_HELD
    #: `spec.intervals.scaleInStabilizationSeconds` (`pace.step.decide`)
    scale_in_stabilization_s: float = SCALE_IN_STABILIZATION_S
    emu_refresh_s: float = 1.0
    inter_region_latency_s: float = 0.05
    delays: Delays = field(default_factory=Delays)
    max_batched_tokens: int = 16384
    #: `spec.instanceScheduling`: the order each instance admits waiting interactive
    #: requests in (`dispatch.instance_order`, SageServe v3 §6.5); FCFS by default
    instance_scheduling: InstanceScheduling = FCFS
    #: minutes of tokens/s history kept for the hourly plan: the policy's
    #: `trainingWindowSeconds`, which the operator's plan loop reads (`Scenario.sim_config`)
    history_minutes: int = 60
    #: in-region instance picker (`dispatch.instance_picker`), by name
    picker: str = DEFAULT_PICKER
    #: output-length predictor (`dispatch.length_predictor`), by name, one per model
    predictor: str = DEFAULT_PREDICTOR
    #: `spec.signals.endpointPicker`: an endpoint picker fronts every endpoint and the step
    #: reads its signals (`sim.cluster.Endpoint.picker_signals`); False: none
    endpoint_picker: bool = False
    #: scale out for batch work its deadlines need (`pace.pressure.deadline_pressure`);
    #: False: the paper's trough release alone (batch never causes a scale-out)
    deadline_pressure: bool = True
    #: `spec.spot.enabled`: idle nodes donated to the spot pool, spot nodes reclaimed
    spot_enabled: bool = True
    #: ModelPools: pooled models served by sleep-mode engines on shared pods
    #: (`sim.pooled_pods`)
    pools: tuple[PoolSetup, ...] = ()
    #: OServe layouts (`spec.layouts`, `sim.layout_loop`); None: off
    layouts: SimLayouts | None = None
    #: the run's minutes counted per pod set (`sim.capacity_windows`): its capacity at SLO,
    #: and with `spec.capacity.learn` θ learned from them; None: nothing counted
    capacity: CapacitySetup | None = None
    #: the fleet's member clusters and when each is silent (`sim.member_clusters`, on the
    #: run's clock): a silent cluster's endpoints are held, the pace step skips them
    fleet: SimFleet = field(default_factory=SimFleet)


#: (model, region) -> one value per minute.
PerKeySeries = Mapping[tuple[str, str], Sequence[float]]


#: (now, interactive tokens/s per minute per (model, region), batch tokens/s served per
#: minute over the last hour, current instances per (model, region, variant), batch tokens/s
#: received per minute over the last hour, batch deadline need per model) -> the plan the
#: decision step follows. Built from plan.cycle by `sim.scenario`, as the operator's plan
#: loop. Batch received is what arrived at the Queue Manager, counted at the request's home
#: region (the region the operator's router counts `sageserve_batch_accepted_tokens_total`
#: in); served is what the troughs let through, per serving region. The need is the tokens/s
#: each model's queue needs to meet every deadline now (`dispatch.deadlines.required_tps`, as
#: the routers export it to the operator); empty without deadline pressure.
#: With `pools` (only when the run's ModelPools are sized by its plan), the planner also
#: sizes them from their observation and sets what the plan grants in `pools.granted`.
#: With `tokens` (only for a strategy planning PreServe windows, `PlanSource.WINDOW`), the
#: prompt, generated and batch tokens/s per minute counted per served (model, region) since
#: the start (`sim.window_tokens`), what the operator's window loop reads. With `capacity`
#: (only when the run learns θ, `sim.capacity_windows`), the trusted learned θ per (model,
#: variant) replaces the declared one.
class Planner(Protocol):
    def __call__(
        self,
        now: float,
        history: Mapping[tuple[str, str], Sequence[float]],
        batch: Mapping[tuple[str, str], Sequence[float]],
        current: Mapping[tuple[str, str, str], int],
        received: Mapping[tuple[str, str], Sequence[float]],
        need: Mapping[str, float],
        /,
        *,
        pools: PoolObservation | None = None,
        tokens: WindowTokens | None = None,
        capacity: ThetaTable | None = None,
    ) -> Plan: ...


#: PreServe §5's aggregation interval for the mean normalized latency.
NORM_BUCKET_S = 300.0
#: the unit of `TierModelStats.by_day`
DAY_S = 86_400.0


class TierModelStats:
    """Latencies of finished requests of one (tier, model), in compact arrays."""

    __slots__ = (
        "by_day",
        "deadline_miss",
        "dropped",
        "e2e",
        "finished",
        "norm",
        "norm_buckets",
        "refused",
        "refused_no_instance",
        "slo_met",
        "tbt",
        "ttft",
    )

    def __init__(self) -> None:
        self.ttft = array("d")
        self.tbt = array("d")
        self.e2e = array("d")
        #: normalized latency, end to end ÷ output tokens (PreServe §5's metric)
        self.norm = array("d")
        #: 5-minute bucket of arrival -> [Σ normalized latency, requests]
        self.norm_buckets: dict[int, list[float]] = {}
        self.finished = 0
        self.slo_met = 0
        self.dropped = 0
        self.deadline_miss = 0
        #: refused at arrival: prompt + output beyond the model's context (vLLM's HTTP 400)
        self.refused = 0
        #: held for a model with nothing serving anywhere and refused: no instance came
        #: within the hold, or too many were held (the router's 503 and 429, `dispatch.hold`);
        #: counted as unfinished, like dropped requests
        self.refused_no_instance = 0
        #: day of arrival (whole days since the window's start) -> [finished, SLO met,
        #: unfinished]: a long window's attainment day by day, so one day of a multi-day
        #: run compares with a one-day run of the same traffic
        self.by_day: dict[int, list[int]] = {}

    def day(self, since_start_s: float) -> list[int]:
        """The [finished, SLO met, unfinished] counters of the day a request arrived in,
        `since_start_s` seconds after the window's start."""
        day = int(since_start_s // DAY_S)
        c = self.by_day.get(day)
        if c is None:
            c = self.by_day[day] = [0, 0, 0]
        return c


@dataclass
class MinuteRow:
    minute: int
    model: str
    region: str
    pool: str
    serving: int
    provisioning: int
    draining: int
    donated: int
    emu: float
    arrivals: int
    finished: int
    batch_queued: int


@dataclass
class RunResult:
    """Raw outcome of one run; `sim.results` turns it into the JSON summary."""

    policy: str
    start_s: float
    end_s: float
    arrived: int
    finished: int
    unfinished_by_key: dict[tuple[str, str], int]
    stats: dict[tuple[str, str], TierModelStats]
    gpu_seconds: dict[tuple[str, str, InstanceState], float]
    instance_seconds: dict[tuple[str, str, InstanceState], float]
    events: dict[str, int]
    minutes: list[MinuteRow]
    sim_events: int
    preemptions: int
    #: requests refused at arrival (prompt + output beyond the model's context)
    refused: int = 0
    #: requests held for a model with nothing serving anywhere and then refused (no
    #: instance within the hold, or too many held: `dispatch.hold`); among the unfinished
    refused_no_instance: int = 0
    #: batch tiers with a deadline seen in the run: name -> deadline (s after arrival)
    batch_deadlines: dict[str, float] = field(default_factory=dict)
    #: (batch tier, model) -> every request still unfinished when the run stopped (dropped
    #: ones apart: they are in the stats), with its deadline and the tokens it still needs
    pending: dict[tuple[str, str], list[PendingWork]] = field(default_factory=dict)
    #: model -> tokens/s at its endpoints' maxInstances (θ × Σ regions); absent: unknown
    capacity_at_max_tps: dict[str, float] = field(default_factory=dict)
    #: the last instant the run observed (end of the window + drain); None: `end_s`
    horizon_s: float | None = None
    #: model -> batch requests the Queue Manager let go, by how: "trough" (an endpoint
    #: below the release EMU took it, SageServe §6.2) or "promoted" (its slack ran out, or
    #: its age without a deadline); what is left queued at the end is in `pending`
    batch_released: dict[str, dict[str, int]] = field(default_factory=dict)
    #: (model, region, state) -> GPU-seconds after the window until the run stopped (its
    #: last request finished, or the drain ended), donated time apart
    after_window_gpu_seconds: dict[tuple[str, str, InstanceState], float] = field(
        default_factory=dict
    )
    #: pool -> what its pods did (`sim.pooled_pods.PooledPods.summary`); empty: no pool
    pools: dict[str, Any] = field(default_factory=dict)
    #: OServe layouts: switches and the layout in force at the end per (model, region, GPU
    #: type), requests dispatched per type and variant (`SimLayoutLoop.summary`); None: off
    layouts: dict[str, object] | None = None
    #: θ learned per (model, variant, region) at the end, when the run learned it
    capacity: dict[tuple[str, str, str], LearnedCapacity] | None = None
    #: per (model, variant): the most tokens/s one instance served in a minute that kept the
    #: SLO (`sim.capacity_windows`); empty for a scenario without a ScalingPolicy
    peak_at_slo: dict[tuple[str, str], float] = field(default_factory=dict)
    #: how each plan of the run was solved, in order (`core.snapshot.PlanSolve`)
    plan_solves: list[PlanSolve] = field(default_factory=list)


class _Clock:
    """The time a routing decision is made at, shared by every instance's view."""

    __slots__ = ("t",)

    def __init__(self) -> None:
        self.t = 0.0


class _LiveLoad:
    """An instance as the in-region picker sees it (`dispatch.instance_picker.LoadView`):
    one long-lived view per instance, each figure computed only when a picker reads it.
    Building a snapshot of every candidate for every request doubled the simulator's run
    time on fleets of tens of instances per endpoint."""

    __slots__ = ("_clock", "_inst", "anticipator")

    def __init__(self, inst: Instance, anticipator: LoadAnticipator, clock: _Clock) -> None:
        self._inst = inst
        self.anticipator = anticipator
        self._clock = clock

    @property
    def iteration(self) -> int:
        # `int(self._inst.v_at(self._clock.t))` inline: read for every candidate of every
        # request, where two calls cost more than the arithmetic
        inst = self._inst
        if inst.prefilling or not inst._n:
            return int(inst.v)
        t = self._clock.t
        start = inst.t0 if inst.t0 > inst.busy_until else inst.busy_until
        if t <= start:
            return int(inst.v)
        return int(inst.v + (t - start) / inst.iter_time)

    @property
    def kv_usage(self) -> float:
        inst = self._inst
        return inst.kv_at(self._clock.t) / inst.kv_cap


class Simulation(InstanceHooks):
    """Runs one strategy over one request stream."""

    def __init__(
        self,
        config: SimConfig,
        strategy: PacingStrategy,
        requests: Iterable[Request],
        progress: Callable[[float], None] | None = None,
        planner: Planner | None = None,
        history: tuple[PerKeySeries, PerKeySeries] | None = None,
        predictors: Callable[[str], LengthPredictor] | None = None,
        pool_history: PerKeySeries | None = None,
    ) -> None:
        """`history` = (interactive, batch) tokens/s per minute per (model, region) before the
        window (`workload.tokens_per_minute`), which the planner's first cycles see as the
        operator sees Prometheus history; `pool_history` the same for pooled models, in
        requests/s per (pooled model, home region) (`workload.requests_per_minute`).
        `predictors` builds each model's output-length predictor (default:
        `config.predictor` by name), e.g. one fitted beforehand."""
        self.cfg = config
        self._start = config.start_s
        #: the fleet's clusters when any of them goes silent in the run (else None: the
        #: decision path pays nothing for it)
        self._fleet = config.fleet if any(c.silent for c in config.fleet.clusters) else None
        #: the in-region picker and, per model, the output-length predictor it relies on
        self.picker = make_picker(config.picker)
        self._make_predictor = predictors or (lambda _model: make_predictor(config.predictor))
        self._predictors: dict[str, LengthPredictor] = {}
        #: each instance's load anticipator (PreServe §4.3.1), fed by the instance's hooks,
        #: seen by the picker through a view read at the routing time `_clock`
        self._clock = _Clock()
        self._views: dict[Instance, _LiveLoad] = {}
        self.planner = planner if strategy.plan_cadence.plans else None
        self.plans = 0
        #: how each plan of the run was solved (status, seconds, gap, held regions)
        self.plan_solves: list[PlanSolve] = []
        #: when the next plan is due (`pace.cadence.plan_step`, as the operator's plan loop)
        self.plan_clock = PlanClock()
        #: the decision step's state (plan in force, cooldowns), as the operator keeps it
        self.step_state = StepState()
        #: what each home region sent where, checked against the plan's spill-over bounds
        self.spill_ledger = SpillLedger()
        # per (model, served region): tokens/s per minute, interactive and batch
        self._iw_hist: dict[tuple[str, str], deque[float]] = defaultdict(
            lambda: deque(maxlen=config.history_minutes)
        )
        self._niw_hist: dict[tuple[str, str], deque[float]] = defaultdict(lambda: deque(maxlen=60))
        #: batch tokens received per (model, home region): per minute, and this minute (the
        #: history before the window counts batch by arrival: it is batch received)
        self._rcv_hist: dict[tuple[str, str], deque[float]] = defaultdict(lambda: deque(maxlen=60))
        self._rcv_tok: dict[tuple[str, str], int] = defaultdict(int)
        if history is not None:
            for key, values in history[0].items():
                self._iw_hist[key].extend(values)
            for key, values in history[1].items():
                self._niw_hist[key].extend(values)
                self._rcv_hist[key].extend(values)
        #: what a PreServe window plan reads (`sim.window_tokens`), counted only for one
        self._window_tokens = (
            WindowTokens()
            if planner is not None and strategy.plan_cadence.source is PlanSource.WINDOW
            else None
        )
        self._iw_tok: dict[tuple[str, str], int] = defaultdict(int)
        self._niw_tok: dict[tuple[str, str], int] = defaultdict(int)
        #: the run's minutes: its capacity at SLO, and θ learned from them for a planned run
        #: that asks for it
        self._capacity: CapacityWindows | None = None
        if config.capacity is not None:
            from sageserve.sim.capacity_windows import CapacityWindows

            self._capacity = CapacityWindows(config.capacity)
        self.strategy = strategy
        self.requests = iter(requests)
        self.progress = progress
        self.events = EventQueue()
        self.cluster = Cluster(
            config.nodes,
            self,
            config.delays,
            config.seed,
            config.max_batched_tokens,
            config.spot_enabled,
            config.instance_scheduling,
        )
        self.cluster.placed = self.instance_ready_at
        self.qm: BatchQueueManager[Job] = BatchQueueManager(
            config.release_rules,
            config.promotion_age_s,
            service_tps={m.name: request_decode_tps(m) for m in config.models},
            promotion_margin_s=config.promotion_margin_s,
        )
        #: per model: θ (tokens/s of one instance), the EMU below which batch is released,
        #: and the tokens/s its batch queue needs to meet every deadline (each pace tick)
        self._theta = {m.name: m.capacity_tps for m in config.models if m.capacity_tps > 0}
        self._release_below = max((b for b, _n in config.release_rules), default=0.0)
        self._batch_need: dict[str, float] = {}
        self.stats: dict[tuple[str, str], TierModelStats] = defaultdict(TierModelStats)
        self.arrived = 0
        self.finished = 0
        self.refused = 0
        self.refused_no_instance = 0
        #: requests held for a model with nothing serving anywhere (built on the first)
        self._held: HeldRequests | None = None
        #: batch tier -> its deadline, for the deadline accounting (`sim.deadlines`)
        self._batch_deadlines: dict[str, float] = {}
        #: (model, "trough" | "promoted") -> batch requests that left the Queue Manager so
        self._batch_released: Counter[tuple[str, str]] = Counter()
        #: model -> its context length (requests beyond it are refused at arrival)
        self._context = {m.name: m.context_length for m in config.models if m.context_length}
        self._context.update(c for pool in config.pools for c in pool.contexts)
        self.sim_events = 0
        self.preemptions = 0
        #: (model, variant) -> seconds a drained instance may finish its requests
        self._grace = {(m.name, v): s for m in config.models for v, s in m.drain_seconds.items()}
        self.qm_active = strategy.batch_via_queue_manager
        self.minutes: list[MinuteRow] = []
        #: a released batch request completed: a signal round is due (SageServe §6.2)
        self._round_due = False
        #: a signal round is on the event heap (only while the Queue Manager holds work)
        self._signal_armed = False
        #: endpoint -> the reading (its `version`) at which it last signalled and took nothing
        self._dry: dict[Endpoint, int] = {}
        # (model, pool) -> endpoints in the fixed region order
        self._eps_by_model_pool: dict[tuple[str, str], list[Endpoint]] = {}
        self._route_cache: dict[tuple[str, str, str], list[Endpoint]] = {}
        #: model -> its endpoints, regions in the scenario's order
        self._eps_of_model: dict[str, list[Endpoint]] = {}
        self._build()
        #: the ModelPools' pods and the router's rule over them; None: no pool (the hot
        #: path checks only this)
        self._pools: PooledPods | None = None
        if config.pools:
            self._pools = PooledPods(
                self,
                config.pools,
                strategy.name,
                self.planner is not None,
                config.start_s,
                config.end_s,
                config.emu_refresh_s,
                config.history_minutes,
                config.region_order,
                pool_history or {},
            )
        #: the plan the planner made last (the layouts are laid over it, `with_layouts`)
        self._planned: Plan | None = None
        self.layouts: SimLayoutLoop | None = None
        if config.layouts is not None:
            if strategy.layout.siloed:
                raise ValueError(
                    f"strategy {strategy.name}: spec.layouts needs one unified pod set per "
                    "variant, as on Kubernetes (the operator refuses siloed); simulate the "
                    "layouts with another strategy, or the policy without them (--set layouts=)"
                )
            from sageserve.sim.layout_loop import SimLayoutLoop

            self.layouts = SimLayoutLoop(config.layouts, self.cluster)

    # ---- set-up --------------------------------------------------------------------------

    def _build(self) -> None:
        cfg, layout = self.cfg, self.strategy.layout
        order = {r: i for i, r in enumerate(cfg.region_order)}
        for m in cfg.models:
            for rp in sorted(m.regions, key=lambda r: (order.get(r.region, 99), r.region)):
                if rp.max_instances <= 0:
                    continue
                split = layout.split(rp.initial_instances)
                pools = layout.pools()
                for pool in pools:
                    share = split.get(pool, 0) / max(1, rp.initial_instances)
                    max_i = (
                        rp.max_instances
                        if len(pools) == 1
                        else max(rp.min_instances, math.ceil(rp.max_instances * share))
                    )
                    key = EndpointKey(m.name, rp.region, pool)
                    ep = self.cluster.add_endpoint(key, rp.min_instances, max_i, cfg.emu_refresh_s)
                    for vname, perf in m.variants:
                        name = f"{m.name}-{rp.region}-{vname}"
                        if len(pools) > 1:
                            name += f"-{pool}"
                        self.cluster.add_deployment(ep, name, perf).variant = vname
                    todo = max(split.get(pool, 0), rp.min_instances)
                    for dep in ep.deployments:
                        todo -= self.cluster.start_instances(dep, todo, cfg.start_s)
                        if todo <= 0:
                            break
                    self._eps_by_model_pool.setdefault((m.name, pool), []).append(ep)
                    self._eps_of_model.setdefault(m.name, []).append(ep)

    def call_at(self, when: float, fn: Callable[[float], None]) -> None:
        """Call `fn(when)` at `when`, in the event heap's order (the pooled pods' switches,
        sweeps and releases)."""
        self.events.push(when, _EV_CALL, fn)

    def instance_ready_at(self, inst: Instance) -> None:
        """A placed instance becomes serving at its `ready_at`."""
        self.events.push(inst.ready_at, _EV_READY, inst)

    # ---- InstanceHooks -------------------------------------------------------------------

    def schedule(self, inst: Instance, when: float) -> None:
        self.events.schedule(inst, when)

    def on_finish(self, job: Job, now: float) -> None:  # noqa: C901 — every request, one frame
        req = job.req
        load = job.load
        if load is not None:
            load.finish(id(job))
            job.load = None
        tier = req.tier
        arrival = req.arrival
        ep = job.ep
        if ep is not None:
            assert isinstance(ep, Endpoint)
            if ep.pooled is not None:  # a ModelPool's engine is free again
                ep.pooled.finished(job, now)
        st = self.stats[(tier.name, req.model)]
        if now < 0:  # dropped: could never fit in KV
            st.dropped += 1
            st.day(arrival - self._start)[2] += 1
            return
        out = req.output_tokens
        predictor = self._predictors.get(req.model)
        if predictor is not None:  # what a router learns when a response ends
            predictor.observe(req.client, req.prompt_tokens, out)
        self.finished += 1
        st.finished += 1
        net = job.net_delay
        first = job.first_token
        ttft = first - arrival + net
        e2e = now - arrival + net
        st.ttft.append(ttft)
        st.e2e.append(e2e)
        norm = e2e / (out if out > 1 else 1)
        st.norm.append(norm)
        bucket = int(arrival // NORM_BUCKET_S)
        b = st.norm_buckets.get(bucket)
        if b is None:
            st.norm_buckets[bucket] = [norm, 1.0]
        else:
            b[0] += norm
            b[1] += 1.0
        if out > 1:
            st.tbt.append((now - first) / (out - 1))
        ok = True
        slo = tier.ttft_slo_s
        if slo is not None and ttft > slo:
            ok = False
        deadline = tier.deadline_s
        if deadline is not None and e2e > deadline:
            ok = False
            st.deadline_miss += 1
        day = st.day(arrival - self._start)
        day[0] += 1
        if ok:
            st.slo_met += 1
            day[1] += 1
        if job.preemptions:
            self.preemptions += job.preemptions
        if ep is not None:
            ep.finished_minute += 1
            if self.qm_active and not tier.interactive and self.qm.pending():
                self._round_due = True  # a released batch request completed (§6.2)
            if self.layouts is not None:  # the router's shape counter
                self.layouts.shapes.count(req.model, ep.key.region, req.prompt_tokens, out)

    def on_idle(self, inst: Instance, now: float) -> None:
        if inst.state is InstanceState.DRAINING:
            self.cluster.release(inst, now)

    def on_decode(self, job: Job, now: float) -> None:
        """The request decodes from now on: into its instance's look-ahead map, with the
        output it is predicted to have left."""
        load = job.load
        if load is not None:
            done = job.req.output_tokens - job.out_left
            load.start(id(job), int(job.admit_v), job.context, max(1, job.pred_out - done))

    def on_preempt(self, job: Job, now: float) -> None:
        """A preempted request waits again, its generated tokens now part of its prompt."""
        load = job.load
        if load is not None:
            done = job.req.output_tokens - job.out_left
            load.finish(id(job))
            load.enqueue(id(job), job.prompt_left, max(1, job.pred_out - done))

    def on_first_token(self, job: Job, now: float) -> None:
        """An interactive request's TTFT into its endpoint's minute histogram (the queue
        pressure's TTFT signal, `pace.pressure`), as the router's histogram in a cluster."""
        slo = job.req.tier.ttft_slo_s
        ep = job.ep
        if slo is None or not isinstance(ep, Endpoint):
            return
        tier = job.req.tier.name
        ep.ttft.observe(tier, now - job.req.arrival + job.net_delay)
        if tier not in ep.ttft_slo:
            ep.ttft_slo[tier] = slo

    # ---- main loop -----------------------------------------------------------------------

    def run(self) -> RunResult:  # noqa: C901 — the hot event loop, in one frame for speed
        """Replay the request stream to the end of the window plus the drain."""
        cfg = self.cfg
        heap = self.events.heap
        heappop = heapq.heappop
        fire = fire_instance_event
        reqs = self.requests
        nxt = next(reqs, None)
        start, end = cfg.start_s, cfg.end_s
        hard_end = end + cfg.drain_s
        next_pace = start + cfg.pace_s
        next_minute = start + 60.0
        closed = False
        prog_next = start
        prog_step = max(60.0, (end - start) / 200.0)
        n_ev = 0
        self._plan_if_due(start)
        while True:
            t_arr = nxt.arrival if nxt is not None else _INF
            if t_arr >= end:
                t_arr = _INF
            t_tick = next_pace if next_pace < next_minute else next_minute
            t_next = t_arr if t_arr < t_tick else t_tick
            limit = t_next if t_next < hard_end else hard_end
            # instance events up to the next arrival or tick, in a tight loop
            while heap and heap[0][0] <= limit:
                when, _, kind, obj = heappop(heap)
                if not closed and when >= end:
                    self.cluster.close_accounting(end)
                    closed = True
                if kind == INSTANCE:
                    if not fire(obj, when):  # type: ignore[arg-type]
                        continue
                elif kind == _EV_READY:
                    self._ready(obj, when)  # type: ignore[arg-type]
                else:
                    obj(when)  # type: ignore[operator]
                n_ev += 1
                if self._round_due:
                    self._signal_round(when)
            if not closed and t_next >= end:
                self.cluster.close_accounting(end)
                closed = True
            if t_next > hard_end:
                break
            if t_next >= end and not heap and t_arr == _INF and not self.qm.pending():
                break
            n_ev += 1
            if t_arr < t_tick:
                assert nxt is not None
                self._arrive(nxt)
                nxt = next(reqs, None)
            elif t_tick == next_pace:
                self._pace_tick(t_tick)
                next_pace += cfg.pace_s
            else:
                self._minute_tick(t_tick)
                next_minute += 60.0
            if t_next >= prog_next and self.progress is not None:
                self.progress(t_next if t_next < end else end)
                prog_next = t_next + prog_step
        self.sim_events = n_ev
        if not closed:
            self.cluster.close_accounting(end)
        self.cluster.account_all(min(max(t_next, end), hard_end))  # the run's last instant
        return self._result()

    # ---- arrivals and routing ------------------------------------------------------------

    def _arrive(self, req: Request) -> None:
        self.arrived += 1
        tier = req.tier
        interactive = tier.interactive
        deadline_s = tier.deadline_s
        if deadline_s is not None and not interactive:
            self._batch_deadlines[tier.name] = deadline_s
        model = req.model
        tokens = req.prompt_tokens + req.output_tokens
        ctx = self._context.get(model)
        if ctx is not None and tokens > ctx:
            # vLLM's OpenAI server answers 400 before the request reaches the engine: it is
            # neither served nor lost, and no instance or queue ever sees it
            self.refused += 1
            self.stats[(tier.name, model)].refused += 1
            return
        job = Job(req, scheduler_priority(tier, 0.0))
        pred = job.pred_out = self._predict(req)
        if deadline_s is not None:
            job.deadline = req.arrival + deadline_s
        pools = self._pools
        if pools is not None and model in pools.by_model:
            pools.arrive(job, req.arrival, self.cfg.inter_region_latency_s)
            return
        if not interactive:
            if self.planner is not None:
                self._rcv_tok[(model, self._home(req))] += tokens
            if self.qm_active:
                deadline = job.deadline if deadline_s is not None else None
                # what the queue knows of the cost: the prompt and the predicted output
                self.qm.submit(model, job, req.arrival, deadline, req.prompt_tokens + pred)
                if not self._signal_armed:
                    self._arm_signal(req.arrival)
                return
        pool = self.strategy.layout.pool_for(tier)
        ep = self._route_region(req, pool, req.arrival)
        if ep is None:
            self._lost(job)
            return
        self._dispatch(job, ep, req.arrival, check_scaling=True)

    def _home(self, req: Request) -> str:
        """The region batch received is counted in: the request's own where its model is
        served, else the model's first region in the scenario's order (the router counts
        accepted batch tokens in its home region, else the model's first region)."""
        eps = self._eps_of_model.get(req.model)
        if not eps or any(ep.key.region == req.region for ep in eps):
            return req.region
        return eps[0].key.region

    def _route_region(self, req: Request, pool: str, t: float) -> Endpoint | None:
        ck = (req.model, pool, req.region)
        eps = self._route_cache.get(ck)
        if eps is None:
            every = self._eps_by_model_pool.get((req.model, pool), [])
            # preference: the client's home region, then the scenario's region order
            eps = preference(req.region, every, _region_of)
            self._route_cache[ck] = eps
        if not eps:
            return None
        if len(eps) == 1:
            return eps[0]
        # as the router: only regions with a serving instance are candidates, each read
        # with the router's estimate (last reading + what was sent since); with none, the
        # request is held at its first region's endpoint (`_dispatch`)
        candidates = [(ep, ep.estimated_emu(t)) for ep in eps if ep.serving]
        if not candidates:
            return eps[0]
        plan = self.step_state.plan
        if self.planner is None and plan is None:
            # no plan is or will be in force, so no spill bound: `route_region` would be the
            # paper's rule plus a ledger that nothing reads
            return pick_region(candidates, self.cfg.route_threshold)
        return route_region(
            req.model,
            req.region,
            candidates,
            _region_of,
            req.prompt_tokens + req.output_tokens,
            t,
            self.spill_ledger,
            plan.spill.get(req.model) if plan is not None else None,
            self.cfg.route_threshold,
        )

    def _dispatch(self, job: Job, ep: Endpoint, t: float, check_scaling: bool) -> None:
        req = job.req
        region = ep.key.region
        if region != req.region:
            job.net_delay = self.cfg.inter_region_latency_s
        tokens = req.prompt_tokens + req.output_tokens  # the forecast's unit
        ep.sent += req.prompt_tokens + job.pred_out  # what the router counts as sent
        ep.arrivals_minute += 1
        ep.tokens_minute += tokens
        if self.planner is not None:
            hk = (req.model, region)
            if req.tier.interactive:
                self._iw_tok[hk] += tokens
            else:
                self._niw_tok[hk] += tokens
            if self._window_tokens is not None:
                self._window_tokens.count(
                    hk, req.prompt_tokens, req.output_tokens, not req.tier.interactive
                )
        job.ep = ep
        inst = self._pick_instance(ep, t, job)
        if inst is None:
            if any(e.serving for e in self._eps_by_model_pool.get((req.model, ep.key.pool), ())):
                ep.backlog.append(job)  # served elsewhere: waits here for an instance
            else:
                self._hold(job, ep, t)
        else:
            self._enqueue(inst, job, t)
        if check_scaling:
            self._check_scaling(ep, t)

    def _check_scaling(self, ep: Endpoint, t: float) -> None:
        """The decision step on this endpoint, once per refresh of its load signal (the
        paper evaluates scaling when a request arrives)."""
        ep.emu(t)
        if ep.version != ep.checked_version:
            ep.checked_version = ep.version
            self._decide([ep], t)

    def _decide(self, eps: Iterable[Endpoint], t: float) -> None:
        """`pace.step.decide` on these endpoints' snapshots; its decisions applied. An
        endpoint in a silent cluster is neither observed nor moved (`sim.member_clusters`)."""
        if self._fleet is not None and (held := self._fleet.held_at(t)):
            eps = [ep for ep in eps if ep.key.region not in held]
        snaps = {ep.key: ep.snapshot(t, self.cfg.endpoint_picker) for ep in eps}
        if self.strategy.uses_projection:
            snaps = {ep.key: self._projected(ep, snaps[ep.key], t) for ep in eps}
        if self.strategy.uses_interactive_busy:
            snaps = {ep.key: with_interactive_running(ep, snaps[ep.key]) for ep in eps}
        if self._batch_need:
            snaps = {k: self._with_deadlines(s) for k, s in snaps.items()}
        outcome = decide(
            t,
            Snapshot(t, snaps),
            None,
            self.step_state,
            self.strategy,
            scale_in_stabilization_s=self.cfg.scale_in_stabilization_s,
        )
        self.step_state = outcome.state
        self._apply(outcome.decisions, t)

    def deadline_theta(self, model: str) -> float:
        """θ `model`'s batch deadlines are judged with now: the declared one, or with
        learning the largest in force at the last plan (`plan.learned_capacity.
        model_theta_in_force`, what the operator reads back from `status.capacity`)."""
        return self._theta.get(model, 0.0)

    def _with_deadlines(self, snap: EndpointSnapshot) -> EndpointSnapshot:
        """`snap` with its share of its model's batch deadline need and its batch capacity
        (`pace.pressure.with_deadline_need`, the operator's rule too): the model's serving
        instances are counted over all its endpoints, whichever this decision looks at."""
        model = snap.key.model
        return with_deadline_need(
            snap,
            self._batch_need.get(model, 0.0),
            sum(ep.serving for ep in self._eps_of_model.get(model, ())),
            self._theta.get(model, 0.0),
            self._release_below,
        )

    def _projected(self, ep: Endpoint, snap: EndpointSnapshot, t: float) -> EndpointSnapshot:
        """`snap` with each instance's projected KV usage from its load anticipator
        (PreServe §4.3.1), as the operator reads the routers' (for `preserve`)."""
        by_id = {i.id: i for d in ep.deployments for i in d.instances}
        views = tuple(
            replace(v, projection=tuple(self._anticipator(i).projection(int(i.v_at(t)))))
            if (i := by_id.get(v.name)) is not None
            else v
            for v in snap.instances
        )
        return replace(snap, instances=views)

    def _predict(self, req: Request) -> int:
        """The request's predicted output tokens (the truth only for the `oracle`)."""
        predictor = self._predictors.get(req.model)
        if predictor is None:
            predictor = self._predictors[req.model] = self._make_predictor(req.model)
        return predictor.predict(LengthQuery(req.client, req.prompt_tokens, req.output_tokens))

    def _view(self, inst: Instance) -> _LiveLoad:
        view = self._views.get(inst)
        if view is None:
            view = self._views[inst] = _LiveLoad(inst, LoadAnticipator(inst.kv_cap), self._clock)
        return view

    def _anticipator(self, inst: Instance) -> LoadAnticipator:
        return self._view(inst).anticipator

    def _enqueue(self, inst: Instance, job: Job, t: float) -> None:
        """Queue a job on an instance, and on the instance's look-ahead map."""
        ant = (self._views.get(inst) or self._view(inst)).anticipator
        job.load = ant
        done = job.req.output_tokens - job.out_left
        ant.enqueue(id(job), job.prompt_left, max(1, job.pred_out - done))
        inst.enqueue(job, t)
        if self._capacity is not None:
            self._capacity.count(inst.endpoint, job.req.prompt_tokens + job.req.output_tokens)

    def _pick_instance(self, ep: Endpoint, t: float, job: Job) -> Instance | None:
        if ep.dispatch is not None:
            inst = self._by_type(ep, t, job)
            if inst is not None:
                return inst
        deps = ep.deployments
        if len(deps) == 1:
            dep: Deployment | None = deps[0] if deps[0].instances else None
        else:
            live = [(d, d.emu(t)) for d in deps if d.instances]
            dep = pick_deployment(live) if live else None
        if dep is None:
            return None
        insts = dep.instances
        if len(insts) == 1:
            return insts[0]
        self._clock.t = t
        views, view = self._views, self._view
        return self.picker.pick(
            Arrival(job.req.prompt_tokens, job.pred_out),
            [(i, views.get(i) or view(i)) for i in insts],
        )

    def _by_type(self, ep: Endpoint, t: float, job: Job) -> Instance | None:
        """The OServe layout's dispatch by request type (`SimLayoutLoop.dispatch`, the
        router's rule): the in-region picker within the chosen variant, and tokens left
        (the anticipators', as the router's picker reads them) for the overflow."""
        assert self.layouts is not None and ep.dispatch is not None
        self._clock.t = t
        views, view = self._views, self._view
        arrival = Arrival(job.req.prompt_tokens, job.pred_out)

        def pick(insts: list[Instance]) -> Instance:
            if len(insts) == 1:
                return insts[0]
            return self.picker.pick(arrival, [(i, views.get(i) or view(i)) for i in insts])

        def load(inst: Instance) -> float:
            v = views.get(inst) or view(inst)
            return float(v.anticipator.tokens_left(v.iteration))

        got = self.layouts.dispatch(
            ep, ep.dispatch, job.req.prompt_tokens, job.pred_out, pick, load
        )
        return got if isinstance(got, Instance) else None

    def _hold(self, job: Job, ep: Endpoint, t: float) -> None:
        """A request for a model with nothing serving anywhere: held in `ep`'s backlog while
        the model comes from zero, as the router holds it (`sim.held`, `dispatch.hold`)."""
        held = self._held
        if held is None:
            cfg = self.cfg
            held = self._held = HeldRequests(
                cfg.hold_s, cfg.max_held, self.call_at, self._refuse_held
            )
        held.hold(job, ep, t)

    def _refuse_held(self, job: Job) -> None:
        st = self.stats[(job.req.tier.name, job.req.model)]
        st.refused_no_instance += 1
        st.day(job.req.arrival - self.cfg.start_s)[2] += 1
        self.refused_no_instance += 1

    def _lost(self, job: Job) -> None:
        st = self.stats[(job.req.tier.name, job.req.model)]
        st.dropped += 1
        st.day(job.req.arrival - self.cfg.start_s)[2] += 1

    # ---- batch queue ---------------------------------------------------------------------

    def _arm_signal(self, t: float) -> None:
        """Signal rounds every `signal_s` from the window's start, from the first one after
        `t` while the Queue Manager holds work (a run without batch work has none)."""
        self._signal_armed = True
        step = self.cfg.signal_s
        self.call_at(self._start + (math.floor((t - self._start) / step) + 1) * step, self._tick)

    def _tick(self, now: float) -> None:
        """The periodic signal round; the next one while work is queued."""
        if self.qm.pending():
            self._signal_round(now)
        if self.qm.pending():
            self.call_at(now + self.cfg.signal_s, self._tick)
        else:
            self._signal_armed = False

    def _signal_round(self, now: float) -> None:
        """One round of signals, the router's `BatchReleaser.signal_once`: requests whose
        slack ran out released first (at most `promoted_per_signal`), then each endpoint
        with serving instances of a model with queued work signals once with its estimated
        EMU (`Endpoint.estimated_emu`) and takes what `release_count` allows, earliest
        deadline first. Runs every `signal_s` and when a released batch request completes
        (SageServe §6.2), so an EMU reading is corrected by each release before the next."""
        self._round_due = False
        qm = self.qm
        dry = self._dry
        self._promote(now)
        for model in qm.models():
            for ep in self._eps_of_model.get(model, ()):
                if not ep.serving:
                    continue
                # an endpoint that took nothing at this reading takes nothing until the
                # next one: what is sent since only raises its estimate
                if dry.get(ep) == ep.version and not ep.stale(now):
                    continue
                jobs = qm.on_signal(model, ep.estimated_emu(now), ep.waiting_requests())
                if not jobs:
                    if qm.pending(model):
                        dry[ep] = ep.version
                    continue
                released = self._released(jobs, now)
                self._batch_released[model, "trough"] += len(released)
                for job in released:
                    self._dispatch(job, ep, now, check_scaling=True)

    def _promote(self, now: float) -> None:
        """Release the requests whose slack ran out, at most `promoted_per_signal`, each at
        interactive priority to the region the router would choose for a request with no
        home (its serving endpoints in the scenario's order, by estimated EMU). A model with
        nothing serving keeps its requests queued, as the router puts them back."""
        qm = self.qm
        cfg = self.cfg
        for model, job in qm.pop_aged(now, cfg.promoted_per_signal):
            req = job.req
            pool = self.strategy.layout.pool_for(req.tier)
            every = self._eps_by_model_pool.get((model, pool), [])
            if not every:  # no endpoint at all: it can never be served
                self._lost(job)
                continue
            ready = [(ep, ep.estimated_emu(now)) for ep in every if ep.serving]
            if not ready:
                deadline = job.deadline if req.tier.deadline_s is not None else None
                qm.submit(model, job, req.arrival, deadline, req.prompt_tokens + job.pred_out)
                continue
            plan = self.step_state.plan
            ep = route_region(
                model,
                None,
                ready,
                _region_of,
                req.prompt_tokens + req.output_tokens,
                now,
                self.spill_ledger,
                plan.spill.get(model) if plan is not None else None,
                cfg.route_threshold,
            )
            self._batch_released[model, "promoted"] += 1
            job.prio = 0
            self._dispatch(job, ep, now, check_scaling=False)

    def _released_by_model(self) -> dict[str, dict[str, int]]:
        """`RunResult.batch_released`: per model, its trough and promoted counts."""
        out: dict[str, dict[str, int]] = {}
        for (model, how), n in sorted(self._batch_released.items()):
            out.setdefault(model, {"trough": 0, "promoted": 0})[how] = n
        return out

    def _promote_at(self, job: Job) -> float:
        """When a released batch request waiting at an instance goes to interactive
        priority: as the Queue Manager promotes, when its slack is down to the margin
        (with a deadline), else at the promotion age."""
        margin = self.cfg.promotion_margin_s
        if job.req.tier.deadline_s is not None and margin is not None:
            return float(job.deadline) - margin
        promo = self.cfg.promotion_age_s
        return job.req.arrival + promo if promo is not None else math.inf

    def _released(self, jobs: list[Job], now: float) -> list[Job]:
        """Jobs a trough released, at the batch priority unless already due for promotion
        (a trough release is not a promotion: it must not reach interactive priority only
        because the request waited long for its deadline)."""
        for job in jobs:
            job.prio = 0 if self._promote_at(job) < now else job.req.tier.priority
        return jobs

    def _pace_tick(self, now: float) -> None:
        # before the decision, as the operator's pace pass; never in a silent cluster
        self.cluster.spot_pass(now, self._fleet.held_at(now) if self._fleet else frozenset())
        if self.layouts is not None:
            self._layout_pass(now)
        # the deadline need the operator reads (the routers export it each signal round)
        if self.qm_active and self.cfg.deadline_pressure:
            qm = self.qm
            self._batch_need = {
                m: need for m in qm.models() if (need := qm.required_tps(m, now)) > 0
            }
        if self._capacity is not None and self._capacity.learning:
            self._capacity.sample(now, self.cluster.endpoints.values())
        if self.strategy.periodic:
            self._decide(self.cluster.endpoints.values(), now)
        else:
            self._check_idle(now)

    def _layout_pass(self, now: float) -> None:
        """The layout loop before the pace pass (the operator's order): its targets laid over
        the plan in force (`with_layouts`), so the decision step moves each layout variant
        (`pace.step.layout_move`). An event-driven strategy decides on the endpoints whose
        layout variants are off their targets at once, as the operator's pace pass does
        every pace period."""

        from sageserve.plan.oserve_layouts import with_layouts

        assert self.layouts is not None
        if self.layouts.run(now, self._planned):
            merged = with_layouts(self._planned, self.layouts.targets())
            self.step_state = adopt(self.step_state, merged)
        if self.strategy.periodic:
            return
        plan = self.step_state.plan
        if plan is None or not plan.layout_variants:
            return
        moving = [
            ep
            for key, ep in self.cluster.endpoints.items()
            if (managed := plan.layout_targets(key))
            and any(ep.replicas().get(v, 0) != n for v, n in managed.items())
        ]
        if moving:
            self._decide(moving, now)

    def _check_idle(self, now: float) -> None:
        """Run the decision step on endpoints no request reached for a scrape interval.

        The paper evaluates scaling on request arrival; the operator's pace loop evaluates
        every endpoint each pace period. Without this, an endpoint whose traffic stopped
        (a region a model's clients never use) would keep its instances forever in the
        simulator while the operator scales it in.
        """
        for ep in self.cluster.endpoints.values():
            if ep.stale(now):
                self._check_scaling(ep, now)

    def _minute_tick(self, now: float) -> None:
        minute = round((now - self.cfg.start_s) / 60.0)
        if self._pools is not None:
            self._pools.minute()
        if self.layouts is not None:
            self.layouts.shapes.roll()
        if self.planner is not None:
            for hk in {(k.model, k.region) for k in self.cluster.endpoints}:
                self._iw_hist[hk].append(self._iw_tok.pop(hk, 0) / 60.0)
                self._niw_hist[hk].append(self._niw_tok.pop(hk, 0) / 60.0)
            # every served key gets a received series (0 where none arrived), so the plan
            # takes β from what was received, never from what another region served
            received = {(k.model, k.region) for k in self.cluster.endpoints}
            for hk in received | set(self._rcv_tok):
                self._rcv_hist[hk].append(self._rcv_tok.pop(hk, 0) / 60.0)
            if self._window_tokens is not None:
                self._window_tokens.roll(received)
            self._plan_if_due(now)
        spot = self.cluster.donated_nodes()
        for key, ep in self.cluster.endpoints.items():
            ep.tokens_per_s = ep.tokens_minute / 60.0
            donated = (
                spot.get((key.region, key.model), 0)
                if key.pool in ("unified", "interactive")
                else 0
            )
            self.minutes.append(
                MinuteRow(
                    minute,
                    key.model,
                    key.region,
                    key.pool,
                    ep.serving,
                    len(ep.provisioning),
                    len(ep.draining),
                    donated,
                    round(ep.emu(now), 4),
                    ep.arrivals_minute,
                    ep.finished_minute,
                    self.qm.pending(key.model),
                )
            )
            ep.arrivals_minute = ep.finished_minute = ep.tokens_minute = 0
            ep.ttft.roll()
            for dep in ep.deployments:
                for inst in dep.instances:
                    w1 = inst.waiting1
                    while w1 and self._promote_at(w1[0]) < now:
                        job = w1.popleft()
                        job.prio = 0
                        inst.waiting0.append(job)
        if self._capacity is not None:
            self._capacity.minute(now, self.cluster.endpoints.values())

    # ---- planning ------------------------------------------------------------------------

    def _plan_if_due(self, now: float) -> None:
        """Plan when the strategy's cadence says so (`pace.cadence.plan_step`); the history
        is the minutes counted so far, with the scenario's history before the window."""
        if self.planner is None:
            return
        move, self.plan_clock = plan_step(
            now, self.plan_clock, self.strategy.plan_cadence, has_history=bool(self._iw_hist)
        )
        if move is PlanMove.PLAN:
            self._plan(now)

    def _plan(self, now: float) -> None:
        """Forecast + plan through the scenario's planner, the targets to the strategy."""
        assert self.planner is not None
        current: dict[tuple[str, str, str], int] = defaultdict(int)
        for key, ep in self.cluster.endpoints.items():
            for dep in ep.deployments:
                current[(key.model, key.region, dep.variant)] += len(dep.instances) + dep.pending
            for inst in ep.provisioning:
                d = inst.endpoint
                if isinstance(d, Deployment):
                    current[(key.model, key.region, d.variant)] += 1
        args = (
            now,
            {k: list(v) for k, v in self._iw_hist.items()},
            {k: list(v) for k, v in self._niw_hist.items()},
            dict(current),
            {k: list(v) for k, v in self._rcv_hist.items()},
            self._deadline_need(now),
        )
        pools = self._pools
        theta = self._capacity.plan_theta(now) if self._capacity is not None else None
        if self._capacity is not None and self._capacity.learning:
            # deadlines are judged with the θ the plan sizes with, as on Kubernetes
            declared = self._capacity.setup.declared
            self._theta = {m: model_theta_in_force(m, declared, theta) for m in self._theta}
        if pools is not None and pools.planned:
            seen = pools.observe()
            plan = (
                self.planner(*args, pools=seen, capacity=theta)
                if theta
                else self.planner(*args, pools=seen)
            )
            pools.apply(seen.granted, now)
        elif self._window_tokens is not None:
            plan = (
                self.planner(*args, tokens=self._window_tokens, capacity=theta)
                if theta
                else self.planner(*args, tokens=self._window_tokens)
            )
        else:
            plan = self.planner(*args, capacity=theta) if theta else self.planner(*args)
        self.plans += 1
        if plan.solve is not None:
            self.plan_solves.append(plan.solve)
        self._planned = plan
        if self.layouts is not None:
            from sageserve.plan.oserve_layouts import with_layouts

            plan = with_layouts(plan, self.layouts.targets()) or plan
        self.step_state = decide(now, Snapshot(now, {}), plan, self.step_state, self.strategy).state

    def _deadline_need(self, now: float) -> dict[str, float]:
        """Per model with queued batch work, the tokens/s its queue needs now to meet every
        deadline, which the plan provisions when it exceeds β (`plan.batch_demand`); none
        when the run leaves deadlines to the paper's trough release alone."""
        if not (self.qm_active and self.cfg.deadline_pressure):
            return {}
        qm = self.qm
        return {m: need for m in qm.models() if (need := qm.required_tps(m, now)) > 0}

    # ---- scaling -------------------------------------------------------------------------

    def _apply(self, decisions: Sequence[Decision], now: float) -> None:
        """Carry out decisions: new instances per variant, the chosen instances drained."""
        for d in decisions:
            ep = self.cluster.endpoints[d.key]
            for variant, replicas in d.replicas.items():
                current = ep.replicas().get(variant, 0)
                if d.kind is ActionKind.SCALE_OUT:
                    for _ in range(replicas - current):
                        got = self.cluster.scale_out(d.key, now, variant)
                        if got is not None:
                            self.instance_ready_at(got[0])
                else:
                    for _ in range(current - replicas):
                        drained = self.cluster.scale_in(d.key, now, variant, d.drain)
                        if drained is not None:
                            self._stop_later(drained, d.key.model, variant, now)

    def _stop_later(self, inst: Instance, model: str, variant: str, now: float) -> None:
        """A drained instance is stopped `drain_seconds` after it left the router, as
        Kubernetes kills a terminating pod at its grace period (`Variant.drain_seconds`):
        what it still holds then is cut. A batch request cut goes back to be served
        again (the Batch API's lease lapses and another release claims it); an
        interactive one is lost (its client saw the stream break). An instance ends once,
        when idle (its node gone): one drained idle has ended already."""
        if inst.node is None:
            return
        grace = self._grace.get((model, variant), float(DEFAULT_DRAIN_SECONDS))

        def stop(when: float) -> None:
            if inst.node is None:
                return  # it finished its requests (and ended) before its grace period
            for job in inst.abandon_all():
                self._cut(job, when)
            self.on_idle(inst, when)

        self.call_at(now + grace, stop)

    def _cut(self, job: Job, now: float) -> None:
        req = job.req
        self.cluster.acct.events["drain_cut_requests"] += 1
        if req.tier.interactive:
            self._lost(job)
            return
        again = Job(req, scheduler_priority(req.tier, 0.0))
        again.pred_out, again.deadline = job.pred_out, job.deadline
        if self.qm_active:
            deadline = again.deadline if req.tier.deadline_s is not None else None
            self.qm.submit(req.model, again, now, deadline, req.prompt_tokens + again.pred_out)
            return
        ep = self._route_region(req, self.strategy.layout.pool_for(req.tier), now)
        if ep is None:
            self._lost(again)
        else:
            self._dispatch(again, ep, now, check_scaling=True)

    def _ready(self, inst: Instance, now: float) -> None:
        dep = self.cluster.ready(inst, now)
        if dep is None:
            return
        ep = dep.endpoint
        if ep.pooled is not None:
            ep.pooled.ready(inst, now)
            return
        if ep.backlog:
            backlog, ep.backlog = ep.backlog, []
            if self._held is not None:
                self._held.served(backlog)
            for job in backlog:
                self._enqueue(inst, job, now)

    # ---- result --------------------------------------------------------------------------

    def _result(self) -> RunResult:
        unfinished: dict[tuple[str, str], int] = defaultdict(int)
        pending: dict[tuple[str, str], list[PendingWork]] = defaultdict(list)
        left: list[Job] = list(self.qm.drain())
        for inst in self.cluster.all_instances:
            left.extend(inst.abandon_all())
        for ep in self.cluster.endpoints.values():
            left.extend(ep.backlog)
        if self._pools is not None:
            left.extend(self._pools.left())
        for job in left:
            key = (job.req.tier.name, job.req.model)
            unfinished[key] += 1
            self.stats[key].day(job.req.arrival - self.cfg.start_s)[2] += 1
            if key[0] in self._batch_deadlines:
                pending[key].append(PendingWork(job.deadline, job.prompt_left + job.out_left))
        for key, st in self.stats.items():
            if st.dropped or st.refused_no_instance:
                unfinished[key] += st.dropped + st.refused_no_instance
        return RunResult(
            policy=self.strategy.name,
            start_s=self.cfg.start_s,
            end_s=self.cfg.end_s,
            arrived=self.arrived,
            finished=self.finished,
            unfinished_by_key=dict(unfinished),
            stats=dict(self.stats),
            gpu_seconds=dict(self.cluster.acct.gpu_seconds),
            instance_seconds=dict(self.cluster.acct.instance_seconds),
            after_window_gpu_seconds=dict(self.cluster.acct.after_window_gpu_seconds),
            events=dict(self.cluster.acct.events),
            minutes=self.minutes,
            sim_events=self.sim_events,
            preemptions=self.preemptions,
            refused=self.refused,
            refused_no_instance=self.refused_no_instance,
            batch_deadlines=dict(self._batch_deadlines),
            pending=dict(pending),
            capacity_at_max_tps={
                m.name: capacity_at_max(m.capacity_tps, (r.max_instances for r in m.regions))
                for m in self.cfg.models
                if m.capacity_tps > 0
            },
            horizon_s=self.cfg.end_s + self.cfg.drain_s,
            batch_released=self._released_by_model(),
            pools=self._pools.summary() if self._pools is not None else {},
            layouts=self.layouts.summary() if self.layouts is not None else None,
            capacity=(
                self._capacity.learned(self.cfg.end_s)
                if self._capacity is not None and self._capacity.learning
                else None
            ),
            peak_at_slo=dict(self._capacity.peak_at_slo) if self._capacity is not None else {},
            plan_solves=list(self.plan_solves),
        )


__all__ = ["ModelSetup", "RegionPlacement", "RunResult", "SimConfig", "Simulation"]
