"""Cluster model: GPU nodes, pod sets (deployments), endpoints, instance life cycle, GPU-hours.

Nodes come from a plain v1.Node inventory (region, GPU type, pool labels, allocatable GPUs).
An instance takes `gpus` GPUs on one node. Life cycle (SageServe §2.3, §10):

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
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from sageserve.core.types import (
    EndpointKey,
    EndpointObservation,
    InstanceState,
)
from sageserve.perf.model import VariantPerf
from sageserve.sim.instance import Instance, InstanceHooks, Job

REGION_LABEL = "topology.kubernetes.io/region"
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
POOL_LABEL = "sageserve.io/pool"
GPU_RESOURCE = "nvidia.com/gpu"
LAST_MODEL_ANNOTATION = "sageserve.io/last-model"


@dataclass
class Node:
    """One GPU node of the inventory."""

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
    """Nodes from v1.Node objects (the e2e inventory format); other kinds are refused."""
    out: list[Node] = []
    for doc in docs:
        if not doc:
            continue
        if doc.get("kind") != "Node":
            raise ValueError(f"an inventory holds only v1 Node objects, got {doc.get('kind')}")
        meta = doc.get("metadata", {})
        labels = meta.get("labels", {}) or {}
        ann = meta.get("annotations", {}) or {}
        status = doc.get("status", {}) or {}
        alloc = (status.get("allocatable") or status.get("capacity") or {}).get(GPU_RESOURCE, 0)
        gpus = int(alloc)
        if gpus <= 0 or REGION_LABEL not in labels or GPU_PRODUCT_LABEL not in labels:
            continue  # not a GPU node sageserve can use
        out.append(
            Node(
                name=str(meta.get("name")),
                region=str(labels[REGION_LABEL]),
                gpu_type=str(labels[GPU_PRODUCT_LABEL]),
                pool=str(labels.get(POOL_LABEL, "serving")),
                gpus=gpus,
                last_model=ann.get(LAST_MODEL_ANNOTATION),
            )
        )
    return out


@dataclass(frozen=True)
class Delays:
    """Provisioning delays (seconds). Defaults are the paper's (ScalingPolicy.spec.spot)."""

    reclaim_same_model_median_s: float = 60.0
    reclaim_same_model_max_s: float = 300.0
    redeploy_s: float = 600.0
    initial_ready_s: float = 0.0


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
        "arrivals_minute",
        "backlog",
        "checked_version",
        "deployments",
        "draining",
        "finished_minute",
        "key",
        "max_instances",
        "min_instances",
        "provisioning",
        "refresh_s",
        "tokens_minute",
        "tokens_per_s",
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
        self.version = 0
        self.checked_version = -1
        self.provisioning: list[Instance] = []
        self.draining: list[Instance] = []
        self.backlog: list[Job] = []
        self.arrivals_minute = 0
        self.finished_minute = 0
        self.tokens_minute = 0
        self.tokens_per_s = 0.0

    @property
    def serving(self) -> int:
        return sum(len(d.instances) for d in self.deployments)

    def emu(self, t: float) -> float:
        """EMU over serving instances, refreshed at most every `refresh_s` (metric scrape)."""
        if t - self._emu_t >= self.refresh_s:
            used = 0.0
            cap = 0
            for d in self.deployments:
                for inst in d.instances:
                    used += inst.kv_at(t)
                    cap += inst.kv_cap
            self._emu = max(0.0, used / cap) if cap else 1.0
            self._emu_t = t
            self.version += 1
        return self._emu

    def invalidate(self) -> None:
        self._emu_t = -math.inf

    def stale(self, t: float) -> bool:
        """Whether no request has refreshed the load signal for a scrape interval."""
        return t - self._emu_t >= self.refresh_s

    def observe(self, t: float) -> EndpointObservation:
        waiting = 0
        for d in self.deployments:
            for inst in d.instances:
                waiting += inst.waiting
        return EndpointObservation(
            time=t,
            key=self.key,
            emu=self.emu(t),
            serving=self.serving,
            provisioning=len(self.provisioning),
            draining=len(self.draining),
            min_instances=self.min_instances,
            max_instances=self.max_instances,
            tokens_per_s=self.tokens_per_s,
            waiting=waiting + len(self.backlog),
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
        inst.state = state
        inst.state_since = now
        inst.t0 = now
        self.all_instances.append(inst)
        return inst

    # ---- accounting ----------------------------------------------------------------------

    def _account(self, inst: Instance, until: float) -> None:
        if self.closed_at is not None:
            until = min(until, self.closed_at)
        dt = until - inst.state_since
        if dt > 0:
            model = inst.model if inst.state is not InstanceState.SPOT else (inst.last_model or "")
            k = (model, inst.region, inst.state)
            self.acct.gpu_seconds[k] += dt * inst.gpus
            self.acct.instance_seconds[k] += dt
        inst.state_since = max(inst.state_since, until)

    def set_state(self, inst: Instance, state: InstanceState, now: float) -> None:
        self._account(inst, now)
        inst.state = state
        inst.state_since = now

    def close_accounting(self, now: float) -> None:
        """Stop the GPU-hour clock at `now` (end of the measured window)."""
        for inst in self.all_instances:
            if inst.node is not None:
                self._account(inst, now)
        self.closed_at = now

    # ---- scaling executor ----------------------------------------------------------------

    def _reclaim_delay(self) -> float:
        """Same-model spot reclaim: lognormal with the configured median, capped at max."""
        med = self.delays.reclaim_same_model_median_s
        if med <= 0 or self.delays.reclaim_same_model_max_s <= med:
            return med if med > 0 else 0.0
        d = med * math.exp(self.rng.gauss(0.0, 0.5))
        return min(d, self.delays.reclaim_same_model_max_s)

    def scale_out(self, key: EndpointKey, now: float) -> tuple[Instance, str] | None:
        """Start one instance for `key`; returns (instance, source) or None if no capacity."""
        ep = self.endpoints[key]
        for dep in ep.deployments:
            perf = dep.perf
            spot = self.spot[key.region]
            # 1. same model, same variant, donated in this region: weights cached. The most
            #    recently donated first, the rule of pace.spot.reclaim_order (weights most
            #    likely still cached); `spot` is in donation order.
            for i in range(len(spot) - 1, -1, -1):
                inst = spot[i]
                if inst.last_model == key.model and inst.perf is perf:
                    del spot[i]
                    self.set_state(inst, InstanceState.PROVISIONING, now)
                    inst.endpoint = dep
                    inst.ready_at = now + self._reclaim_delay()
                    ep.provisioning.append(inst)
                    self.acct.events["reclaim_same_model"] += 1
                    return inst, "reclaim_same_model"
            # 2. a donated instance of another model on a node that can hold this variant,
            #    the longest-donated first (pace.spot.reclaim_order)
            for i, inst in enumerate(spot):
                node = inst.node
                assert isinstance(node, Node)
                if node.gpu_type == perf.gpu_type and node.free_gpus + inst.gpus >= perf.gpus:
                    del spot[i]
                    self._destroy(inst, now)
                    new = self._new_instance(dep, node, now, InstanceState.PROVISIONING)
                    new.ready_at = now + self.delays.redeploy_s
                    ep.provisioning.append(new)
                    self.acct.events["redeploy_other_model"] += 1
                    return new, "redeploy_other_model"
            # 3./4. free GPUs: spot-pool nodes, then idle serving-pool nodes
            node = self._free_node(dep, pools=("spot", "serving"))
            if node is not None:
                new = self._new_instance(dep, node, now, InstanceState.PROVISIONING)
                new.ready_at = now + self.delays.redeploy_s
                ep.provisioning.append(new)
                self.acct.events["deploy_free_gpus"] += 1
                return new, "deploy_free_gpus"
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

    def scale_in(self, key: EndpointKey, now: float) -> Instance | None:
        """Drain the least-loaded serving instance of `key`; it is donated when idle."""
        ep = self.endpoints[key]
        best: tuple[float, Deployment, Instance] | None = None
        for dep in ep.deployments:
            for inst in dep.instances:
                load = inst.kv_at(now) + inst.waiting_tokens
                if best is None or load < best[0]:
                    best = (load, dep, inst)
        if best is None:
            return None
        _, dep, inst = best
        dep.instances.remove(inst)
        ep.invalidate()
        self.set_state(inst, InstanceState.DRAINING, now)
        ep.draining.append(inst)
        self.acct.events["scale_in"] += 1
        if inst.idle:
            self.donate(inst, now)
        return inst

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
