"""Cluster model: GPU nodes, pod sets (deployments), endpoints, instance life cycle, GPU-hours.

Nodes come from a plain v1.Node inventory (region, GPU type, pool labels, allocatable GPUs).
An instance takes `gpus` GPUs on one node. Life cycle (SageServe §2.3, §6.4):

    pending --(GPUs)--> provisioning --(delay)--> serving --(scale in)--> draining --(idle)--> gone

Capacity follows the operator's one rule (`pace.spot.capacity_order`): a scale-out takes
free GPUs on a serving-pool node at once (the scheduler); else it stays *pending*, counted
in its pod set's replicas as a Pending pod is in `spec.replicas`, and is placed the moment
capacity frees: GPUs freed on a serving node (a drain ending), or a spot node reclaimed for
it at the next pace tick (`pace.spot.plan_moves`, the operator's spot pass): a node that
last served the same model first, else another model's. Every placement starts a fresh
instance, which loads its weights from where they are: the node's cache when the node last
served the model (lognormal around the same-model reclaim median, capped), else the
region's copy (redeploy) or another region's. A node outside both pools is never used, as
the operator never uses one. A scale-in removes a pending instance first (a ReplicaSet
deletes unscheduled pods first).

Donation is per whole node, at the pace tick: a serving-pool node that no instance holds
(not even a draining one), in a (region, GPU type) pair with nothing pending or coming up,
is relabelled spot (`pace.spot.donation_candidates`), remembering the model it last served.

GPU-hours are accounted per state: serving, provisioning (scaling waste), draining, and
donated (a donated node's GPUs, under the model it last served). Instance-hours exclude
donated time, as in the paper.
"""

from __future__ import annotations

import math
import random
from bisect import bisect_left
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from sageserve.core.labels import DEFAULT_NODE_LABELS, SERVING_POOL, SPOT_POOL
from sageserve.core.nodes import parse_nodes
from sageserve.core.snapshot import EndpointSnapshot, InstanceView, PickerSignals, drain_order
from sageserve.core.types import EndpointKey, InstanceState
from sageserve.dispatch.instance_order import InstanceScheduling
from sageserve.dispatch.layout_dispatch import EndpointLayout
from sageserve.dispatch.queue_manager import estimated_emu
from sageserve.metrics.picker import KV_THRESHOLD as PICKER_KV_THRESHOLD
from sageserve.metrics.picker import QUEUE_THRESHOLD as PICKER_QUEUE_THRESHOLD
from sageserve.metrics.vllm import TTFT_BUCKETS
from sageserve.pace.spot import Pending, PoolNode, plan_moves, reclaim_order, serving_room
from sageserve.perf.model import VariantPerf
from sageserve.sim.instance import Instance, InstanceHooks, Job


@dataclass
class Node:
    """One GPU node of the inventory, with the GPUs a run has not placed yet."""

    name: str
    region: str
    gpu_type: str
    pool: str
    gpus: int
    free_gpus: int = -1
    last_model: str | None = None
    #: when the node was donated to the spot pool (its annotation, or the run's donation)
    donated_at: float | None = None

    def __post_init__(self) -> None:
        if self.free_gpus < 0:
            self.free_gpus = self.gpus


def nodes_from_manifests(docs: Iterable[Mapping[str, Any]]) -> list[Node]:
    """Nodes from v1.Node objects (the e2e inventory format), read by `core.nodes`.

    The model a node last served is annotated `namespace/ModelDeployment` (the operator's
    identity of a model, any variant); the simulator's models are ModelDeployment names,
    so the name is kept."""
    return [
        Node(
            n.name,
            n.region,
            n.gpu_type,
            n.pool,
            n.gpus,
            last_model=n.last_model.rsplit("/", 1)[-1] if n.last_model else None,
            donated_at=n.donated_at,
        )
        for n in parse_nodes(docs)
    ]


@dataclass(frozen=True)
class Delays:
    """Provisioning delays (seconds). Defaults are the paper's (ScalingPolicy.spec.spot)."""

    reclaim_same_model_median_s: float = 60.0
    reclaim_same_model_max_s: float = 300.0
    #: load a model whose weights are in the region (SageServe: 10 min)
    redeploy_s: float = 600.0
    #: load a model whose weights must come from another region (SageServe: ~2 h)
    remote_redeploy_s: float = 7200.0
    initial_ready_s: float = 0.0


def histogram_quantile(q: float, bounds: Sequence[float], counts: Sequence[int]) -> float:
    """The q-quantile of a histogram as Prometheus' `histogram_quantile` estimates it.

    `counts[i]` observations fell in (bounds[i-1], bounds[i]] (the first from 0), the last
    count beyond every bound (+Inf). Linear within the bucket holding rank q × total; in
    the +Inf bucket, the largest finite bound. So the simulator's TTFT P95 is the value
    the operator reads from the router's histogram of the same buckets.
    """
    total = sum(counts)
    if total <= 0:
        return math.nan
    rank = q * total
    seen = 0
    for i, c in enumerate(counts):
        if seen + c >= rank and c > 0:
            if i >= len(bounds):
                return float(bounds[-1])
            lo = bounds[i - 1] if i > 0 else 0.0
            return lo + (bounds[i] - lo) * (rank - seen) / c
        seen += c
    return float(bounds[-1])


class TtftWindow:
    """Time to first token per interactive tier of one endpoint, per minute, in the
    buckets of vLLM's (and the router's) TTFT histogram."""

    __slots__ = ("counts", "p95", "samples")

    def __init__(self) -> None:
        self.counts: dict[str, list[int]] = {}
        self.p95: dict[str, float] = {}
        self.samples: dict[str, int] = {}

    def observe(self, tier: str, seconds: float) -> None:
        c = self.counts.get(tier)
        if c is None:
            c = self.counts[tier] = [0] * (len(TTFT_BUCKETS) + 1)
        c[bisect_left(TTFT_BUCKETS, seconds)] += 1

    def roll(self) -> None:
        """Close the minute: its P95 and count per tier become what the step reads."""
        self.p95 = {t: histogram_quantile(0.95, TTFT_BUCKETS, c) for t, c in self.counts.items()}
        self.samples = {t: sum(c) for t, c in self.counts.items()}
        self.counts = {}


class PooledHooks(Protocol):
    """What a ModelPool's endpoint tells the simulator when a pod comes up or one of its
    requests ends (`sim.pooled_pods`)."""

    def ready(self, inst: Instance, now: float) -> None: ...

    def finished(self, job: Job, now: float) -> None: ...


class Deployment:
    """One pod set: instances of one model on one variant in one region and pool."""

    __slots__ = ("endpoint", "instances", "name", "pending", "perf", "variant")

    def __init__(self, name: str, perf: VariantPerf, endpoint: Endpoint) -> None:
        self.name = name
        self.variant = name  # the ModelDeployment variant name (set by the simulator)
        self.perf = perf
        self.endpoint = endpoint
        self.instances: list[Instance] = []  # SERVING instances only (routable)
        #: instances asked for that no GPUs could take yet (Pending pods)
        self.pending = 0

    def emu(self, t: float) -> float:
        used = 0.0
        cap = 0
        for inst in self.instances:
            used += inst.kv_at(t)
            cap += inst.kv_cap
        return used / cap if cap else 1.0


class Endpoint:
    """A (model, region, pool) endpoint with its deployments and cached load signal."""

    __slots__ = (
        "_emu",
        "_emu_t",
        "_scraped",
        "_waiting_read",
        "arrivals_minute",
        "backlog",
        "checked_version",
        "deployments",
        "dispatch",
        "draining",
        "finished_minute",
        "key",
        "kv_read",
        "max_instances",
        "min_instances",
        "pooled",
        "provisioning",
        "refresh_s",
        "sent",
        "tokens_minute",
        "tokens_per_s",
        "ttft",
        "ttft_slo",
        "version",
    )

    def __init__(self, key: EndpointKey, min_i: int, max_i: int, refresh_s: float) -> None:
        self.key = key
        self.min_instances = min_i
        self.max_instances = max_i
        self.deployments: list[Deployment] = []
        self.refresh_s = refresh_s
        self._emu = 0.0
        self._emu_t = -math.inf
        #: KV capacity (tokens) behind the last reading, and the tokens (prompt + predicted
        #: output) dispatched here since it: `estimated_emu`'s correction
        self.kv_read = 0
        self.sent = 0
        #: (instance, variant, KV used, KV capacity) of each reporting instance, as last
        #: scraped (`snapshot` makes them `InstanceView`s, with the queues as they are then)
        self._scraped: list[tuple[str, str, float, int]] = []
        self._waiting_read = 0
        self.version = 0
        self.checked_version = -1
        self.provisioning: list[Instance] = []
        self.draining: list[Instance] = []
        self.backlog: list[Job] = []
        self.arrivals_minute = 0
        self.finished_minute = 0
        self.tokens_minute = 0
        self.tokens_per_s = 0.0
        #: TTFT per interactive tier over the last minute, and each tier's SLO (seconds)
        self.ttft = TtftWindow()
        self.ttft_slo: dict[str, float] = {}
        #: a ModelPool's endpoint: its pooled pods' hooks (`sim.pooled_pods`); None for a
        #: ModelDeployment's
        self.pooled: PooledHooks | None = None
        #: the OServe layout requests are dispatched by between its variants (by request
        #: type, `sim.layout_loop`); None: one layout, the type-free rule
        self.dispatch: EndpointLayout | None = None

    @property
    def serving(self) -> int:
        return sum(len(d.instances) for d in self.deployments)

    def emu(self, t: float) -> float:
        """EMU over serving instances, refreshed at most every `refresh_s` (metric scrape).

        For routing: an endpoint with nothing serving reads as full, so requests go to a
        region that can serve them. The decision step reads the scraped instances instead
        (`snapshot`), where nothing serving is "no utilisation", not 100 %."""
        if t - self._emu_t >= self.refresh_s:
            used = 0.0
            cap = 0
            views = []
            for d in self.deployments:
                for inst in d.instances:
                    kv = inst.kv_at(t)
                    used += kv
                    cap += inst.kv_cap
                    if inst.reporting:
                        views.append((inst.id, d.variant, kv, inst.kv_cap))
            self._emu = max(0.0, used / cap) if cap else 1.0
            self._waiting_read = sum(inst.waiting for d in self.deployments for inst in d.instances)
            self._scraped = views
            self._emu_t = t
            self.kv_read = cap
            self.sent = 0
            self.version += 1
        return self._emu

    def estimated_emu(self, t: float) -> float:
        """The EMU the Queue Manager is signalled with, as the router estimates it
        (`dispatch.queue_manager.estimated_emu`): the last reading (at most `refresh_s`
        old) plus the tokens dispatched here since it (prompt + predicted output, what the
        router counts as prompt + output budget) over the reading's KV capacity."""
        return estimated_emu(self.emu(t), self.sent, self.kv_read)

    def waiting_requests(self) -> int:
        """Requests waiting for admission at the serving instances at the last reading
        (vLLM's `num_requests_waiting`, summed, as the router reads it from Prometheus):
        the Queue Manager releases nothing here while any wait
        (`dispatch.queue_manager.release_count`)."""
        return self._waiting_read

    def invalidate(self) -> None:
        self._emu_t = -math.inf

    def stale(self, t: float) -> bool:
        """Whether no request has refreshed the load signal for a scrape interval."""
        return t - self._emu_t >= self.refresh_s

    def replicas(self) -> dict[str, int]:
        """Instances per variant, serving, coming up or pending: a pod set's `spec.replicas`."""
        out = {d.variant: len(d.instances) + d.pending for d in self.deployments}
        for inst in self.provisioning:
            dep = inst.endpoint
            if isinstance(dep, Deployment):
                out[dep.variant] = out.get(dep.variant, 0) + 1
        return out

    def picker_signals(self) -> PickerSignals:
        """What an endpoint picker in front of this endpoint would report
        (`metrics.picker`), read from the instances as the operator reads a real picker's
        series, over the instances scraped last (the picker's pods with fresh metrics):
        waiting is every request not yet in a batch (their queues and the requests held
        while nothing serves, the picker's own queue), saturation the picker's default
        utilization detector (mean of max(waiting ÷ 5, KV use ÷ 0.8); an empty pool reads
        1.0, as the picker's does), running the requests in their batches."""
        instances = {i.id: i for d in self.deployments for i in d.instances}
        fresh = [(instances[n], kv, cap) for n, _v, kv, cap in self._scraped if n in instances]
        scores = [
            max(i.waiting / PICKER_QUEUE_THRESHOLD, kv / cap / PICKER_KV_THRESHOLD)
            for i, kv, cap in fresh
            if cap > 0
        ]
        saturation = sum(scores) / len(scores) if scores else 1.0
        waiting = sum(i.waiting for i, _kv, _cap in fresh) + len(self.backlog)
        running = sum(getattr(i, "running", 0) for i, _kv, _cap in fresh)
        return PickerSignals(waiting, saturation, running)

    def snapshot(self, t: float, picker: bool = False) -> EndpointSnapshot:
        """What the decision step sees of this endpoint: the same value the operator
        builds from its pods and Prometheus (`controller.observe`): KV use as last scraped,
        queues as they are. With an endpoint `picker` in front (`spec.signals.
        endpointPicker`) the requests held while nothing serves are the picker's queue,
        not a router's: they count in its signals (`picker_signals`), the engines' waiting
        is their queues alone."""
        self.emu(t)  # the last scrape, refreshed if older than `refresh_s`
        queue = {i.id: i.waiting for d in self.deployments for i in d.instances}
        views = [
            InstanceView(name, variant, kv, cap, queue.get(name, 0))
            for name, variant, kv, cap in self._scraped
        ]
        return EndpointSnapshot(
            key=self.key,
            min_instances=self.min_instances,
            max_instances=self.max_instances,
            replicas=self.replicas(),
            serving=self.serving,
            instances=tuple(views),
            draining=len(self.draining),
            waiting=sum(queue.values()) + (0 if picker else len(self.backlog)),
            tokens_per_s=self.tokens_per_s,
            variants=tuple(d.variant for d in self.deployments),
            ttft_p95_s=self.ttft.p95,
            ttft_samples=self.ttft.samples,
            ttft_slo_s=self.ttft_slo,
            picker=self.picker_signals() if picker else None,
        )


@dataclass
class Accounting:
    """GPU-seconds per (model, region, state) and scaling events per kind."""

    gpu_seconds: dict[tuple[str, str, InstanceState], float] = field(
        default_factory=lambda: defaultdict(float)
    )
    instance_seconds: dict[tuple[str, str, InstanceState], float] = field(
        default_factory=lambda: defaultdict(float)
    )
    events: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    #: GPU-seconds after the window (the drain), donated time apart: what finishing the
    #: window's work cost beyond it, kept out of `gpu_seconds`
    after_window_gpu_seconds: dict[tuple[str, str, InstanceState], float] = field(
        default_factory=lambda: defaultdict(float)
    )


class Cluster:
    """Nodes, endpoints and instances, with the scaling executor and GPU-hour accounting."""

    def __init__(
        self,
        nodes: Sequence[Node],
        hooks: InstanceHooks,
        delays: Delays,
        seed: int,
        max_batched_tokens: int = 16384,
        spot_enabled: bool = True,
        order: InstanceScheduling | None = None,
    ) -> None:
        # copies: a run mutates free GPUs and pools, and several runs share one SimConfig;
        # by name, the order `pace.spot` breaks ties in
        self.nodes = sorted((replace(n, free_gpus=n.gpus) for n in nodes), key=lambda n: n.name)
        self._node = {n.name: n for n in self.nodes}
        if len(self._node) != len(self.nodes):
            raise ValueError("the node inventory names a node twice: give each Node a unique name")
        self.hooks = hooks
        self.delays = delays
        #: `spec.spot.enabled`: donate idle nodes and reclaim spot nodes (the spot pass)
        self.spot_enabled = spot_enabled
        #: pending instances, one entry per Pending pod, in the order they were asked for
        self.pending: list[Deployment] = []
        #: told of an instance placed later than asked (a pending one): the engine schedules
        #: its readiness
        self.placed: Callable[[Instance], None] | None = None
        #: donated nodes: when their donated time was last accounted
        self._spot_since: dict[str, float] = {}
        self.rng = random.Random(seed)
        self.max_batched_tokens = max_batched_tokens
        #: the order each instance admits waiting interactive requests in (None: FCFS)
        self.order = order
        self.endpoints: dict[EndpointKey, Endpoint] = {}
        self.acct = Accounting()
        self._ids = 0
        self.closed_at: float | None = None
        self.all_instances: list[Instance] = []
        #: (region, model) pairs whose weights are in the region (loaded there once)
        self.weights: set[tuple[str, str]] = set()

    # ---- set-up --------------------------------------------------------------------------

    def add_endpoint(self, key: EndpointKey, min_i: int, max_i: int, refresh_s: float) -> Endpoint:
        ep = Endpoint(key, min_i, max_i, refresh_s)
        self.endpoints[key] = ep
        return ep

    def add_deployment(self, ep: Endpoint, name: str, perf: VariantPerf) -> Deployment:
        dep = Deployment(name, perf, ep)
        ep.deployments.append(dep)
        return dep

    def start_instances(self, dep: Deployment, count: int, now: float) -> int:
        """Place `count` serving instances at start: free serving GPUs first, then spot
        nodes taken for them in `reclaim_order` (`pace.spot.capacity_order`). Returns placed."""
        placed = 0
        for _ in range(count):
            node = self._room(dep)
            if node is None and self.spot_enabled:
                key = dep.endpoint.key
                spot = self._pool_nodes(key.region, dep.perf.gpu_type)
                order = reclaim_order(spot, dep.perf.model, key.region, *self._shape(dep))
                if order:
                    node = self._node[order[0][0].name]
                    self._reclaim(node, now)
            if node is None:
                break
            inst = self._new_instance(dep, node, now, InstanceState.SERVING)
            dep.instances.append(inst)
            placed += 1
        return placed

    @staticmethod
    def _shape(dep: Deployment) -> tuple[str, int]:
        return dep.perf.gpu_type, dep.perf.gpus

    def _pool_nodes(self, region: str | None = None, gpu_type: str | None = None) -> list[PoolNode]:
        """The inventory as `pace.spot` sees nodes (of `region` and `gpu_type` when given):
        GPUs held by instances (provisioning, serving or draining) as serving pods' GPUs."""
        return [
            PoolNode(
                name=n.name,
                region=n.region,
                gpu_type=n.gpu_type,
                pool=n.pool,
                gpus=n.gpus,
                serving_gpus=n.gpus - n.free_gpus,
                last_model=n.last_model,
                donated_at=n.donated_at,
            )
            for n in self.nodes
            if (region is None or n.region == region)
            and (gpu_type is None or n.gpu_type == gpu_type)
        ]

    def _room(self, dep: Deployment) -> Node | None:
        """The serving-pool node the scheduler places an instance of `dep` on at once
        (`pace.spot.serving_room`, first by name), None when none has room."""
        region = dep.endpoint.key.region
        gpu, need = self._shape(dep)
        fits = serving_room(self._pool_nodes(region, gpu), region, gpu, need, SERVING_POOL)
        return self._node[fits[0].name] if fits else None

    def _new_instance(
        self, dep: Deployment, node: Node, now: float, state: InstanceState
    ) -> Instance:
        self._ids += 1
        inst = Instance(
            f"{dep.name}-{self._ids}",
            dep.perf,
            dep.endpoint.key.region,
            self.hooks,
            self.max_batched_tokens,
            # a ModelPool's engines run vLLM's FCFS scheduler (the router sends them no
            # priority), so its pods keep arrival order
            self.order if dep.endpoint.pooled is None else None,
        )
        inst.endpoint = dep
        inst.node = node
        node.free_gpus -= inst.gpus
        node.last_model = inst.model
        self.weights.add((inst.region, inst.model))
        inst.state = state
        inst.state_since = now
        inst.t0 = now
        self.all_instances.append(inst)
        return inst

    # ---- accounting ----------------------------------------------------------------------

    def _account(self, inst: Instance, until: float) -> None:
        since, closed, window_until = inst.state_since, self.closed_at, until
        if closed is not None and until > closed:
            window_until = closed
            after = until - max(since, closed)
            if after > 0 and inst.state is not InstanceState.SPOT:
                key = (inst.model, inst.region, inst.state)
                self.acct.after_window_gpu_seconds[key] += after * inst.gpus
        dt = window_until - since
        if dt > 0:
            model = inst.model if inst.state is not InstanceState.SPOT else (inst.last_model or "")
            k = (model, inst.region, inst.state)
            self.acct.gpu_seconds[k] += dt * inst.gpus
            self.acct.instance_seconds[k] += dt
        inst.state_since = max(since, until)

    def set_state(self, inst: Instance, state: InstanceState, now: float) -> None:
        self._account(inst, now)
        inst.state = state
        inst.state_since = now

    def close_accounting(self, now: float) -> None:
        """Stop the GPU-hour clock at `now` (end of the measured window); what instances
        hold after it is counted apart, in `after_window_gpu_seconds`."""
        self.account_all(now)
        self.closed_at = now

    def account_all(self, now: float) -> None:
        """Bring every placed instance's GPU-time, and donated nodes', up to `now`."""
        for inst in self.all_instances:
            if inst.node is not None:
                self._account(inst, now)
        for name in self._spot_since:
            self._account_spot(self._node[name], now)

    # ---- scaling executor ----------------------------------------------------------------

    def _reclaim_delay(self) -> float:
        """Same-model spot reclaim: lognormal with the configured median, capped at max."""
        med = self.delays.reclaim_same_model_median_s
        if med <= 0 or self.delays.reclaim_same_model_max_s <= med:
            return med if med > 0 else 0.0
        d = med * math.exp(self.rng.gauss(0.0, 0.5))
        return min(d, self.delays.reclaim_same_model_max_s)

    def _redeploy_delay(self, region: str, model: str) -> float:
        """Loading a model: from the region's copy of its weights, else from another region."""
        if (region, model) in self.weights:
            return self.delays.redeploy_s
        return self.delays.remote_redeploy_s

    def scale_out(
        self, key: EndpointKey, now: float, variant: str | None = None
    ) -> tuple[Instance, str] | None:
        """Ask for one more instance of `variant` (default: the first) for `key` (`place`).
        None when it could not be placed at once: it is then pending, or, with no such
        variant, refused and counted (`scale_out_no_capacity`)."""
        ep = self.endpoints[key]
        dep = next((d for d in ep.deployments if variant in (None, d.variant)), None)
        if dep is None:
            self.acct.events["scale_out_no_capacity"] += 1
            return None
        return self.place(dep, now)

    def place(self, dep: Deployment, now: float) -> tuple[Instance, str] | None:
        """Start one instance of `dep` on free serving GPUs (the scheduler, at once); with
        none, it becomes pending (None), placed when capacity frees (`place_pending`) or a
        spot node is reclaimed for it (`spot_pass`). A ModelPool's pods are placed here
        too, from the same inventory."""
        node = self._room(dep)
        if node is None:
            dep.pending += 1
            self.pending.append(dep)
            self.acct.events["scale_out_pending"] += 1
            return None
        return self._start(dep, node, now, "deploy_free_gpus"), "deploy_free_gpus"

    def _start(self, dep: Deployment, node: Node, now: float, event: str) -> Instance:
        """A fresh instance of `dep` on `node`, loading its weights from where they are:
        the node's cache when the node last served the same model (a reclaimed spot node or
        a serving node alike: the reclaim delay, SageServe §2.3's ≈1 min), else the region's
        copy (redeploy, 10 min) or another region's (≈2 h)."""
        key = dep.endpoint.key
        if node.last_model == dep.perf.model:
            delay = self._reclaim_delay()
        else:
            delay = self._redeploy_delay(key.region, dep.perf.model)
        inst = self._new_instance(dep, node, now, InstanceState.PROVISIONING)
        inst.ready_at = now + delay
        dep.endpoint.provisioning.append(inst)
        self.acct.events[event] += 1
        return inst

    def place_pending(self, now: float) -> None:
        """Pending instances onto serving GPUs freed since, first asked first served, as
        the scheduler does the moment a pod's GPUs free."""
        if not self.pending:
            return
        left: list[Deployment] = []
        for dep in self.pending:
            node = self._room(dep)
            if node is None:
                left.append(dep)
                continue
            dep.pending -= 1
            inst = self._start(dep, node, now, "deploy_free_gpus")
            if self.placed is not None:
                self.placed(inst)
        self.pending = left

    def unpend(self, dep: Deployment) -> bool:
        """Drop one pending instance of `dep` (the newest): what a ReplicaSet deletes first
        when its replicas go down. False when none is pending."""
        if not dep.pending:
            return False
        dep.pending -= 1
        at = len(self.pending) - 1 - self.pending[::-1].index(dep)
        del self.pending[at]
        self.acct.events["pending_cancelled"] += 1
        return True

    def spot_pass(
        self, now: float, held: frozenset[str] = frozenset()
    ) -> tuple[list[str], list[str]]:
        """The operator's spot pass at a pace tick (`pace.spot.plan_moves`): one spot node
        reclaimed per pending instance (a fresh instance started on it), whole idle serving
        nodes of pairs with nothing pending or coming up donated. Returns the node names
        (reclaimed, donated). Nodes of `held` regions (a silent cluster's, which the
        operator can neither read nor relabel) are neither donated nor reclaimed."""
        if not self.spot_enabled:
            return [], []
        scope: set[tuple[str, str]] = set()
        busy: set[tuple[str, str]] = set()
        for ep in self.endpoints.values():
            region = ep.key.region
            if region in held:
                continue
            for d in ep.deployments:
                scope.add((region, d.perf.gpu_type))
            for inst in ep.provisioning:
                busy.add((region, inst.perf.gpu_type))
        pending = [(i, d) for i, d in enumerate(self.pending) if d.endpoint.key.region not in held]
        wanted = [
            Pending(d.perf.model, d.endpoint.key.region, d.perf.gpu_type, d.perf.gpus)
            for _, d in pending
        ]
        busy |= {(p.region, p.gpu_type) for p in wanted}
        if not wanted and not any(  # the usual tick: nothing to reclaim or donate
            n.pool == SERVING_POOL
            and n.free_gpus == n.gpus
            and (n.region, n.gpu_type) in scope
            and (n.region, n.gpu_type) not in busy
            for n in self.nodes
        ):
            return [], []
        reclaims, donations = plan_moves(
            self._pool_nodes(), wanted, scope, DEFAULT_NODE_LABELS, busy
        )
        served: set[int] = set()
        index = {id(p): i for p, (i, _) in zip(wanted, pending, strict=True)}
        for pool_node, p in reclaims:
            node = self._node[pool_node.name]
            same = node.last_model == p.model
            self._reclaim(node, now)
            dep = self.pending[index[id(p)]]
            served.add(index[id(p)])
            dep.pending -= 1
            inst = self._start(
                dep, node, now, "reclaim_same_model" if same else "redeploy_other_model"
            )
            if self.placed is not None:
                self.placed(inst)
        if served:
            self.pending = [d for i, d in enumerate(self.pending) if i not in served]
            self.place_pending(now)
        for pool_node in donations:
            node = self._node[pool_node.name]
            node.pool = SPOT_POOL
            node.donated_at = now
            self._spot_since[node.name] = now
            self.acct.events["donate_to_spot"] += 1
        return [n.name for n, _ in reclaims], [n.name for n in donations]

    def _reclaim(self, node: Node, now: float) -> None:
        """A spot node back to the serving pool; its donated time ends."""
        self._account_spot(node, now)
        self._spot_since.pop(node.name, None)
        node.pool = SERVING_POOL
        node.donated_at = None

    def _account_spot(self, node: Node, until: float) -> None:
        """A donated node's GPU-time up to `until`, under the model it last served; none
        after the window."""
        since = self._spot_since.get(node.name)
        if since is None:
            return
        end = until if self.closed_at is None else min(until, self.closed_at)
        if end > since:
            k = (node.last_model or "", node.region, InstanceState.SPOT)
            self.acct.gpu_seconds[k] += (end - since) * node.gpus
            self.acct.instance_seconds[k] += end - since
        self._spot_since[node.name] = max(since, until)

    def donated_nodes(self) -> dict[tuple[str, str], int]:
        """Nodes the run donated and has not reclaimed, per (region, model last served)."""
        out: dict[tuple[str, str], int] = defaultdict(int)
        for name in self._spot_since:
            node = self._node[name]
            out[(node.region, node.last_model or "")] += 1
        return out

    def _destroy(self, inst: Instance, now: float) -> None:
        self._account(inst, now)
        node = inst.node
        assert isinstance(node, Node)
        node.free_gpus += inst.gpus
        inst.node = None
        inst.endpoint = None

    def ready(self, inst: Instance, now: float) -> Deployment | None:
        """A provisioning instance becomes serving."""
        dep = inst.endpoint
        if not isinstance(dep, Deployment) or inst.state is not InstanceState.PROVISIONING:
            return None
        ep = dep.endpoint
        if inst in ep.provisioning:
            ep.provisioning.remove(inst)
        self.set_state(inst, InstanceState.SERVING, now)
        inst.last_model = inst.model
        inst.t0 = now
        inst.busy_until = now
        dep.instances.append(inst)
        ep.invalidate()
        return dep

    def scale_in(
        self,
        key: EndpointKey,
        now: float,
        variant: str | None = None,
        chosen_ones: Sequence[str] = (),
    ) -> Instance | None:
        """Drain one instance of `key`'s `variant`: the first of `chosen_ones` (the decision
        step's choice) still serving, else the least loaded (`core.snapshot.drain_order`).
        It takes nothing new and ends when idle. A pending instance of the variant goes
        first (None returned), as a ReplicaSet deletes its unscheduled pods first."""
        ep = self.endpoints[key]
        for d in ep.deployments:
            if variant in (None, d.variant) and self.unpend(d):
                return None
        mine = [(d, i) for d in ep.deployments if variant in (None, d.variant) for i in d.instances]
        if not mine:
            return None
        by_id = {i.id: (d, i) for d, i in mine}
        chosen = next((by_id[n] for n in chosen_ones if n in by_id), None)
        if chosen is None:
            views = tuple(
                InstanceView(i.id, d.variant, i.kv_at(now), i.kv_cap, i.waiting) for d, i in mine
            )
            first = drain_order(views)[0].name
            chosen = next((d, i) for d, i in mine if i.id == first)
        dep, inst = chosen
        self.drain(dep, inst, now)
        return inst

    def drain(self, dep: Deployment, inst: Instance, now: float) -> None:
        """Take `inst` out of serving: it takes nothing new and ends when idle (`release`)."""
        ep = dep.endpoint
        dep.instances.remove(inst)
        ep.invalidate()
        self.set_state(inst, InstanceState.DRAINING, now)
        ep.draining.append(inst)
        self.acct.events["scale_in"] += 1
        if inst.idle:
            self.release(inst, now)

    def release(self, inst: Instance, now: float) -> None:
        """A drained instance ends: its GPUs free (a pending instance may take them at
        once); its node is donated at a pace tick if nothing else holds it. Releasing an
        instance that already ended does nothing."""
        if inst.state is not InstanceState.DRAINING or inst.node is None:
            return
        dep = inst.endpoint
        if isinstance(dep, Deployment) and inst in dep.endpoint.draining:
            dep.endpoint.draining.remove(inst)
        self._destroy(inst, now)
        self.place_pending(now)
