"""What the decision step sees (a snapshot), follows (a plan) and returns (decisions).

The operator builds a `Snapshot` from the API server and Prometheus, the simulator from its
simulated instances; `pace.step.decide` turns it into `Decision`s that each world applies.
Everything is a frozen value, so a recorded sequence of snapshots can be replayed through
both worlds' adapters and compared (the parity test).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from sageserve.core.types import ActionKind, EndpointKey, EndpointObservation


def emu(kv_used_tokens: float, kv_capacity_tokens: float) -> float:
    """Effective memory utilisation: Σ KV used ÷ Σ KV capacity (SageServe §4).

    Sums over the serving instances of an endpoint, so instances of a variant with a larger
    KV cache weigh more (an unweighted mean of per-pod usage would let a small variant's
    full cache hide a large one's free room). 0 when nothing serves: an endpoint with no
    capacity has no utilisation; whether it needs capacity is the step's rule (demand
    waiting), not a fake reading of 100 %.
    """
    if kv_capacity_tokens <= 0:
        return 0.0
    return max(0.0, kv_used_tokens / kv_capacity_tokens)


@dataclass(frozen=True, slots=True)
class InstanceView:
    """One serving instance (a Ready pod, a serving simulated instance) and its load."""

    name: str
    variant: str
    kv_used_tokens: float
    kv_capacity_tokens: float
    waiting: int = 0
    #: projected KV usage over the look-ahead (fractions of capacity, PreServe §4.3.1),
    #: from the instance's load anticipator; empty where no anticipator sees the instance
    projection: tuple[float, ...] = ()
    #: requests of interactive tiers sent to the instance and not finished (queued there or
    #: running: the router's in-flight count per pod), for Chiron's interactive
    #: backpressure (`pace.chiron`); None where the world did not observe it (only
    #: strategies that declare `uses_interactive_busy` ask for it)
    interactive_running: int | None = None


@dataclass(frozen=True, slots=True)
class PickerSignals:
    """What the endpoint picker in front of one endpoint reports (`metrics.picker`): the
    requests waiting (its own flow-control queue and the engines' queues as it reads
    them), its saturation (1.0 at its gating set point; None where it exports none) and
    the requests running in the engines (None where it exports none). The simulator's
    picker reports the same from its instances (`sim.cluster.Endpoint.picker_signals`)."""

    waiting: int
    saturation: float | None = None
    running: int | None = None


def drain_order(instances: tuple[InstanceView, ...]) -> list[InstanceView]:
    """Instances in the order to drain them: least loaded first (least KV in use, then
    fewest waiting requests), ties by name, so that a scale-in leaves the least work to
    finish and the drained instance is donated soonest."""
    return sorted(instances, key=lambda i: (i.kv_used_tokens, i.waiting, i.name))


@dataclass(frozen=True, slots=True)
class EndpointSnapshot:
    """One (model, region, pool) endpoint at one moment.

    `replicas` is the size each variant's pod set is asked to have (serving + coming up);
    `instances` are the serving ones that reported their load; `serving` counts every
    serving instance, reporting or not. `reporting < serving` is partial data: the missing
    instances may be full, so it must never read as a load drop (DESIGN: failure
    behaviour). `waiting` counts requests queued at the endpoint or held for it while
    nothing serves (the demand that brings a model back from zero, and the backlog that
    counts as pressure: `pace.pressure`). `ttft_p95_s` / `ttft_samples` are each
    interactive tier's time to first token over the last minute (P95, first tokens
    counted) and `ttft_slo_s` its SLO; empty where the world does not measure it.
    `batch_need_tps` is this endpoint's share of the tokens/s its model's batch queue needs
    to meet every deadline (`dispatch.deadlines`), `batch_capacity_tps` the batch tokens/s its
    serving instances give below the Queue Manager's release threshold; both 0 where the
    world does not keep a batch queue with deadlines (`pace.pressure.deadline_pressure`).
    `stuck_terminating` counts the endpoint's instances past their deletion deadline (a
    finalizer that never clears, a kubelet gone): a scale-in there would strand more GPUs
    the same way; 0 where the world has none (the simulator). `picker` is what the endpoint
    picker in front of it reports (None: no picker read, `spec.signals.endpointPicker`
    none, or none reported for its pool); the step reads the larger of its pressure and
    the engines' (`pace.pressure.endpoint_pressure`).
    """

    key: EndpointKey
    min_instances: int
    max_instances: int
    replicas: Mapping[str, int]
    serving: int
    instances: tuple[InstanceView, ...] = ()
    draining: int = 0
    waiting: int = 0
    tokens_per_s: float = 0.0
    #: Variants in spec order (scale-out goes to the first one the plan does not rank).
    variants: tuple[str, ...] = ()
    ttft_p95_s: Mapping[str, float] = field(default_factory=dict)
    ttft_samples: Mapping[str, int] = field(default_factory=dict)
    ttft_slo_s: Mapping[str, float] = field(default_factory=dict)
    batch_need_tps: float = 0.0
    batch_capacity_tps: float = 0.0
    stuck_terminating: int = 0
    picker: PickerSignals | None = None

    def __post_init__(self) -> None:
        # one canonical order, whatever order a world lists its instances in
        ordered = tuple(sorted(self.instances, key=lambda i: i.name))
        object.__setattr__(self, "instances", ordered)

    @property
    def reporting(self) -> int:
        return len(self.instances)

    @property
    def demand_waiting(self) -> int:
        """Requests waiting for this endpoint, the larger of the engines' count (with the
        router's held requests) and the picker's: the demand that brings an endpoint back
        from zero, wherever it queues."""
        return max(self.waiting, self.picker.waiting if self.picker else 0)

    @property
    def provisioning(self) -> int:
        return max(0, sum(self.replicas.values()) - self.serving)

    @property
    def emu(self) -> float:
        used = sum(i.kv_used_tokens for i in self.instances)
        cap = sum(i.kv_capacity_tokens for i in self.instances)
        return emu(used, cap)

    @property
    def missing_data(self) -> bool:
        """Instances serve but none reported: nothing is known of the load."""
        return self.serving > 0 and self.reporting == 0

    @property
    def partial_data(self) -> bool:
        return 0 < self.reporting < self.serving

    @property
    def leaving(self) -> int:
        """Ready instances beyond the replicas asked for: a scale-in written but not yet
        carried out (the ReplicaSet has not deleted the pod yet). A strategy counts them as
        draining, never as serving, or a second scale-in would take the same pod again and
        go below minInstances (a world whose scale-in is immediate has none)."""
        if not self.replicas:
            return 0
        return max(0, self.serving - sum(self.replicas.values()))

    def observation(self, now: float) -> EndpointObservation:
        """The signals a pacing strategy reads."""
        return EndpointObservation(
            time=now,
            key=self.key,
            emu=self.emu,
            serving=self.serving - self.leaving,
            provisioning=self.provisioning,
            draining=self.draining + self.leaving,
            min_instances=self.min_instances,
            max_instances=self.max_instances,
            tokens_per_s=self.tokens_per_s,
            waiting=self.waiting,
            projections=tuple(i.projection for i in self.instances if i.projection),
            interactive_busy=sum(1 for i in self.instances if i.interactive_running),
            interactive_reporting=sum(
                1 for i in self.instances if i.interactive_running is not None
            ),
            batch_need_tps=self.batch_need_tps,
            batch_capacity_tps=self.batch_capacity_tps,
        )


@dataclass(frozen=True, slots=True)
class Snapshot:
    """The endpoints observed now (all of them, or the one a request just reached)."""

    time: float
    endpoints: Mapping[EndpointKey, EndpointSnapshot]


@dataclass(frozen=True, slots=True)
class EndpointPlan:
    """The plan's word on one endpoint: what a pacing strategy needs of it."""

    computed_at: float
    target: int
    forecast_tps: float = 0.0
    instance_tps: float | None = None


@dataclass(frozen=True)
class PlanSolve:
    """How a plan was solved: what a fleet's owner checks against the plan cycle's budget."""

    status: str
    seconds: float
    #: relative MIP gap of the incumbent (0: proven optimal; None: not a MIP answer)
    gap: float | None = None
    #: regions left out of the solve and held at the plan in force (a silent cluster's)
    held_regions: frozenset[str] = frozenset()


@dataclass(frozen=True)
class Plan:
    """The plan in force (SageServe §5): targets per (endpoint, variant), the forecast
    tokens/s they were sized for, and θ, the tokens/s one planned instance serves."""

    computed_at: float
    variant_targets: Mapping[tuple[EndpointKey, str], int]
    forecasts: Mapping[EndpointKey, float] = field(default_factory=dict)
    instance_tps: Mapping[EndpointKey, float] = field(default_factory=dict)
    #: Spill-over weights per model: share of a home region's demand planned to be served
    #: in each other region (`plan.flow`); empty for a model whose regions serve themselves.
    spill: Mapping[str, Mapping[str, Mapping[str, float]]] = field(default_factory=dict)
    #: The (endpoint, variant) targets an OServe layout sets (`plan.oserve_layouts.
    #: with_layouts`): the decision step moves each such variant to its own target.
    layout_variants: frozenset[tuple[EndpointKey, str]] = field(default_factory=frozenset)
    #: how the solver got there (a plan read back from status, or not from a solve: None)
    solve: PlanSolve | None = field(default=None, compare=False)
    #: Planned instances per endpoint over all its variants (derived).
    targets: Mapping[EndpointKey, int] = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        targets: dict[EndpointKey, int] = {}
        for (key, _variant), n in self.variant_targets.items():
            targets[key] = targets.get(key, 0) + n
        object.__setattr__(self, "targets", targets)

    def for_endpoint(self, key: EndpointKey) -> EndpointPlan | None:
        """The endpoint's share of the plan; None when the plan does not cover it."""
        target = self.targets.get(key)
        if target is None:
            return None
        return EndpointPlan(
            self.computed_at, target, self.forecasts.get(key, 0.0), self.instance_tps.get(key)
        )

    def variant_target(self, key: EndpointKey, variant: str) -> int:
        return self.variant_targets.get((key, variant), 0)

    def layout_targets(self, key: EndpointKey) -> dict[str, int]:
        """The endpoint's variants an OServe layout sizes, with their targets (empty: none)."""
        return {v: self.variant_targets.get((k, v), 0) for k, v in self.layout_variants if k == key}


@dataclass(frozen=True, slots=True)
class Decision:
    """One endpoint's change: new replicas per variant, and which instances to drain first.

    `replicas` holds only the variants that change. `drain` names the serving instances
    chosen for removal (least loaded: SageServe §6.4 donates idle capacity, not busy instances); the
    operator marks them with a low pod-deletion cost, the simulator drains them.
    """

    key: EndpointKey
    kind: ActionKind
    count: int
    replicas: Mapping[str, int]
    reason: str
    drain: tuple[str, ...] = ()
