"""Cluster model: GPU nodes, pod sets (deployments), endpoints, instance life cycle, GPU-hours.

Nodes come from a plain v1.Node inventory (region, GPU type, pool labels, allocatable GPUs).
An instance takes `gpus` GPUs on one node. Life cycle (SageServe §2.3, §6.4):

    provisioning --(delay)--> serving --(scale in)--> draining --(idle)--> spot (donated)
    spot --(same-model reclaim, median 1 min, max 5 min)--> provisioning --> serving
    spot of another model / empty spot GPUs --(redeploy, 10 min)--> provisioning --> serving

Scale-out takes, in SageServe's order: a donated instance of the same model in the region;
else a donated instance of another model (destroyed, its GPUs redeployed); else free GPUs on
spot-pool nodes (redeploy); else free GPUs on serving-pool nodes (redeploy). If none of these
exists the action fails and is counted. The inventory is the whole cluster: no node is
bought mid-run.

GPU-hours are accounted per state: serving, provisioning (scaling waste), draining, and
donated (spot). Instance-hours exclude donated time, as in the paper.
"""

from __future__ import annotations

import math
import random
from bisect import bisect_left
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from sageserve.core.labels import SERVING_POOL, SPOT_POOL
from sageserve.core.nodes import OUTSIDE_POOLS, parse_nodes
from sageserve.core.snapshot import EndpointSnapshot, InstanceView, drain_order
from sageserve.core.types import EndpointKey, InstanceState
from sageserve.dispatch.layout_dispatch import EndpointLayout
from sageserve.dispatch.queue_manager import estimated_emu
from sageserve.metrics.vllm import TTFT_BUCKETS
from sageserve.pace.spot import PoolNode, Source, reclaim_order
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

    def __post_init__(self) -> None:
        if self.free_gpus < 0:
            self.free_gpus = self.gpus


def nodes_from_manifests(docs: Iterable[Mapping[str, Any]]) -> list[Node]:
    """Nodes from v1.Node objects (the e2e inventory format), read by `core.nodes`."""
    return [
        Node(n.name, n.region, n.gpu_type, n.pool, n.gpus, last_model=n.last_model)
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
    #: obtain a node outside the serving and spot pools (sageserve assumes 1 h)
    new_node_s: float = 3600.0
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

    __slots__ = ("endpoint", "instances", "name", "perf", "variant")

    def __init__(self, name: str, perf: VariantPerf, endpoint: Endpoint) -> None:
        self.name = name
        self.variant = name  # the ModelDeployment variant name (set by the simulator)
        self.perf = perf
        self.endpoint = endpoint
        self.instances: list[Instance] = []  # SERVING instances only (routable)

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

    def invalidate(self) -> None:
        self._emu_t = -math.inf

    def stale(self, t: float) -> bool:
        """Whether no request has refreshed the load signal for a scrape interval."""
        return t - self._emu_t >= self.refresh_s

    def replicas(self) -> dict[str, int]:
        """Instances per variant, serving or coming up: a pod set's `spec.replicas`."""
        out = {d.variant: len(d.instances) for d in self.deployments}
        for inst in self.provisioning:
            dep = inst.endpoint
            if isinstance(dep, Deployment):
                out[dep.variant] = out.get(dep.variant, 0) + 1
        return out

    def snapshot(self, t: float) -> EndpointSnapshot:
        """What the decision step sees of this endpoint: the same value the operator
        builds from its pods and Prometheus (`controller.observe`): KV use as last scraped,
        queues as they are."""
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
            waiting=sum(queue.values()) + len(self.backlog),
            tokens_per_s=self.tokens_per_s,
            variants=tuple(d.variant for d in self.deployments),
            ttft_p95_s=self.ttft.p95,
            ttft_samples=self.ttft.samples,
            ttft_slo_s=self.ttft_slo,
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
    ) -> None:
        # copies: a run mutates free GPUs, and several runs share one SimConfig
        self.nodes = [replace(n, free_gpus=n.gpus) for n in nodes]
        self.hooks = hooks
        self.delays = delays
        self.rng = random.Random(seed)
        self.max_batched_tokens = max_batched_tokens
        self.endpoints: dict[EndpointKey, Endpoint] = {}
        self.spot: dict[str, list[Instance]] = defaultdict(list)  # region -> donated
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
        """Place `count` serving instances at start (serving-pool nodes first). Returns placed."""
        placed = 0
        for _ in range(count):
            node = self._free_node(dep, pools=("serving", "spot"))
            if node is None:
                break
            inst = self._new_instance(dep, node, now, InstanceState.SERVING)
            dep.instances.append(inst)
            placed += 1
        return placed

    def _free_node(self, dep: Deployment, pools: Sequence[str]) -> Node | None:
        region = dep.endpoint.key.region
        gpu, need = dep.perf.gpu_type, dep.perf.gpus
        for pool in pools:
            for node in self.nodes:
                if (
                    node.pool == pool
                    and node.region == region
                    and node.gpu_type == gpu
                    and node.free_gpus >= need
                ):
                    return node
        return None

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
        """Bring every placed instance's GPU-time up to `now`."""
        for inst in self.all_instances:
            if inst.node is not None:
                self._account(inst, now)

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

    def _spot_nodes(self, region: str) -> tuple[list[PoolNode], dict[str, Instance]]:
        """The region's donated instances as the spot logic sees nodes: each frees its GPUs
        (plus the node's free ones) and last served `model/variant` (the weights it holds)."""
        nodes, by_name = [], {}
        for inst in self.spot[region]:
            node, dep = inst.node, inst.endpoint
            assert isinstance(node, Node)
            variant = dep.variant if isinstance(dep, Deployment) else ""
            nodes.append(
                PoolNode(
                    name=inst.id,
                    region=region,
                    gpu_type=node.gpu_type,
                    pool=SPOT_POOL,
                    gpus=node.free_gpus + inst.gpus,
                    last_model=f"{inst.model}/{variant}",
                    donated_at=inst.state_since,
                )
            )
            by_name[inst.id] = inst
        return nodes, by_name

    def scale_out(
        self, key: EndpointKey, now: float, variant: str | None = None
    ) -> tuple[Instance, str] | None:
        """Start one instance of `variant` (default: the first) for `key`.

        GPUs come in SageServe's order (`pace.spot.reclaim_order`, the rule the operator's
        spot pass uses): a donated instance of the same model and variant (weights cached,
        lognormal delay around the median); a donated instance of another model, the
        longest-donated first (redeploy); free GPUs on spot- then serving-pool nodes
        (redeploy); a node outside both pools (`new_node_s`, then redeploy). None, counted,
        if there is no capacity: the inventory is the whole cluster.
        """
        ep = self.endpoints[key]
        dep = next((d for d in ep.deployments if variant in (None, d.variant)), None)
        if dep is None:
            self.acct.events["scale_out_no_capacity"] += 1
            return None
        return self.place(dep, now)

    def place(self, dep: Deployment, now: float) -> tuple[Instance, str] | None:
        """Start one instance of `dep`, its GPUs in `reclaim_order`'s order (`scale_out`);
        a ModelPool's pods are placed here too, from the same inventory."""
        ep = dep.endpoint
        key = ep.key
        perf = dep.perf
        nodes, by_name = self._spot_nodes(key.region)
        ident = f"{key.model}/{dep.variant}"
        for pool_node, source in reclaim_order(nodes, ident, key.region, perf.gpu_type, perf.gpus):
            inst = by_name[pool_node.name]
            self.spot[key.region].remove(inst)
            if source is Source.SAME_MODEL_SPOT:
                self.set_state(inst, InstanceState.PROVISIONING, now)
                inst.endpoint = dep
                inst.ready_at = now + self._reclaim_delay()
                ep.provisioning.append(inst)
                self.acct.events["reclaim_same_model"] += 1
                return inst, "reclaim_same_model"
            node = inst.node
            assert isinstance(node, Node)
            self._destroy(inst, now)
            delay = self._redeploy_delay(key.region, key.model)
            new = self._new_instance(dep, node, now, InstanceState.PROVISIONING)
            new.ready_at = now + delay
            ep.provisioning.append(new)
            self.acct.events["redeploy_other_model"] += 1
            return new, "redeploy_other_model"
        for pools, extra, event in (
            ((SPOT_POOL, SERVING_POOL), 0.0, "deploy_free_gpus"),
            ((OUTSIDE_POOLS,), self.delays.new_node_s, "deploy_new_node"),
        ):
            free = self._free_node(dep, pools=pools)
            if free is not None:
                delay = extra + self._redeploy_delay(key.region, key.model)
                free.pool = SERVING_POOL if free.pool == OUTSIDE_POOLS else free.pool
                new = self._new_instance(dep, free, now, InstanceState.PROVISIONING)
                new.ready_at = now + delay
                ep.provisioning.append(new)
                self.acct.events[event] += 1
                return new, event
        self.acct.events["scale_out_no_capacity"] += 1
        return None

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
        It takes nothing new and is donated when idle."""
        ep = self.endpoints[key]
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
        """Take `inst` out of serving: it takes nothing new and is donated when idle."""
        ep = dep.endpoint
        dep.instances.remove(inst)
        ep.invalidate()
        self.set_state(inst, InstanceState.DRAINING, now)
        ep.draining.append(inst)
        self.acct.events["scale_in"] += 1
        if inst.idle:
            self.donate(inst, now)

    def donate(self, inst: Instance, now: float) -> None:
        """A drained instance goes to the region's spot pool, weights still loaded."""
        if inst.state is not InstanceState.DRAINING:
            return
        dep = inst.endpoint
        if isinstance(dep, Deployment) and inst in dep.endpoint.draining:
            dep.endpoint.draining.remove(inst)
        self.set_state(inst, InstanceState.SPOT, now)
        inst.last_model = inst.model
        self.spot[inst.region].append(inst)
        self.acct.events["donate_to_spot"] += 1

    def spot_counts(self, region: str) -> dict[str, int]:
        out: dict[str, int] = defaultdict(int)
        for inst in self.spot[region]:
            out[inst.last_model or ""] += 1
        return dict(out)
