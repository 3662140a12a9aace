"""What the router knows of the fleet: models, tiers, ready pods, load; and its choices.

The discovery thread (Kubernetes watches) and the load refresher (Prometheus) write here;
request handlers read it. Every choice is a call into `dispatch/`, the functions the
simulator calls: the tier (`dispatch.tiers`), the region (`dispatch.region_router`, SageServe
§6.1's global router on EMU, under the threshold of the model's ScalingPolicy,
`ModelRoute.route_threshold`) and the instance (`dispatch.instance_picker`: by default the
fewest remaining tokens, prompt + `max_tokens`; with a picker named, e.g. `preserve` or
`least-request`, that picker over each pod's load anticipator, `router.anticipate`).
The router corrects Prometheus' EMU, which is seconds old, with the tokens it sent since
the last reading, so a burst does not pile onto one region between scrapes. When the plan
publishes spill-over weights (ScalingPolicy `status.plan.spillover`), they bound how much
of a region's traffic goes elsewhere (`dispatch.region_router.route_region`). When the plan
lays an endpoint out in several variants (parallelism layouts, ScalingPolicy
`status.layouts`, OServe §4.2), the in-region choice goes by request type first
(`dispatch.layout_dispatch`, the rule the simulator's OServe harness runs): see
`Fleet.choose_backend`.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field

from sageserve.api.scaling_policy import LayoutWeights
from sageserve.core.snapshot import emu
from sageserve.dispatch.identity import (
    AuthMode,
    KeyRing,
    Principal,
    Refusal,
    allowed_tiers,
    authenticate,
    key_ring,
    may_see,
)
from sageserve.dispatch.instance_order import FCFS, InstanceScheduling
from sageserve.dispatch.instance_picker import (
    Arrival,
    InstancePicker,
    make_picker,
    pick_deployment,
    pick_instance,
)
from sageserve.dispatch.layout_dispatch import (
    OVERFLOW_RATIO,
    OVERFLOW_TOKENS,
    EndpointLayout,
    dispatch_by_type,
    endpoint_layout,
)
from sageserve.dispatch.queue_manager import DEFAULT_RELEASE_RULES, ReleaseRules, estimated_emu
from sageserve.dispatch.region_router import (
    DEFAULT_ROUTE_THRESHOLD,
    SpillBounds,
    SpillLedger,
    preference,
    route_region,
)
from sageserve.dispatch.tiers import TierMatch
from sageserve.router.anticipate import PodAnticipators, Ticket

#: The in-region rule when no picker is named: fewest tokens still to process, prompt +
#: `max_tokens` of the requests in flight (the router's rule before pickers had names).
REMAINING_TOKENS = "remaining-tokens"


def fleet_picker(name: str) -> InstancePicker | None:
    """The picker named `name` (`dispatch.instance_picker`), None for `remaining-tokens`."""
    return None if name == REMAINING_TOKENS else make_picker(name)


#: (namespace, model deployment, region): the unit the operator sizes.
EndpointId = tuple[str, str, str]


@dataclass(frozen=True)
class Backend:
    """One ready pod of a pod set and the base URL the router forwards to."""

    namespace: str
    pod: str
    model_deployment: str
    region: str
    variant: str
    url: str

    @property
    def endpoint(self) -> EndpointId:
        return (self.namespace, self.model_deployment, self.region)


@dataclass(frozen=True)
class ModelRoute:
    """One ModelDeployment as the router serves it.

    `route_threshold` and `release_rules` are its ScalingPolicy's `spec.routing`
    (`regionEmuThreshold`, SageServe §6.1's region choice; `batchRelease`, §6.2's Queue
    Manager), mapped by `dispatch.from_policy` as the simulator maps them, so that a policy
    routes and releases alike in both worlds. Discovery sets them from the policy
    `policy` names (`router.discovery.follow_policy`); a policy missing or not validating
    counts as the default policy, the paper's 70 % and 1 under 60 % / 2 under 50 %."""

    namespace: str
    name: str
    served_name: str
    regions: tuple[str, ...]
    tiers: tuple[str, ...]
    route_threshold: float = DEFAULT_ROUTE_THRESHOLD
    #: (EMU strictly below, batch requests released), most generous first
    #: (`dispatch.queue_manager.release_count`)
    release_rules: ReleaseRules = DEFAULT_RELEASE_RULES
    #: its variants (pod sets), in `spec.variants` order: the order the variant step's
    #: ties go by (`dispatch.instance_picker.pick_deployment`); (): the pods' own order
    variants: tuple[str, ...] = ()
    #: the ScalingPolicy (same namespace) of its `spec.policyRef`; "": none known
    policy: str = ""
    #: tokens/s one request decodes at on a full instance, the slowest variant's, from the
    #: perf profile the simulator reads (`perf.model.request_decode_tps`); 0: no profile.
    #: The Queue Manager's expected service time of a batch request (tokens ÷ this).
    request_tps: float = 0.0
    #: tokens/s at maxInstances: θ (the fastest variant's capacityTokensPerSecond) × Σ
    #: regions' maxInstances (`dispatch.deadlines.capacity_at_max`); 0: unknown. What a
    #: predicted deadline miss is read against.
    capacity_at_max_tps: float = 0.0
    #: its ScalingPolicy's `spec.instanceScheduling`: the `priority` each forwarded request
    #: carries to vLLM (`dispatch.instance_order.engine_priority`); FCFS: none
    instance_scheduling: InstanceScheduling = FCFS


#: A layout dispatch as counted: (endpoint, type, variant sent to, overflowed).
LayoutDispatch = tuple[EndpointId, int, str, bool]


def _variant(b: Backend) -> str:
    return b.variant


def _set_event() -> asyncio.Event:
    done = asyncio.Event()
    done.set()
    return done


@dataclass
class Fleet:
    """The router's view, mutated on the event loop only (threads hand over with
    `loop.call_soon_threadsafe`)."""

    models: dict[str, ModelRoute] = field(default_factory=dict)  # by served name
    tiers: dict[str, dict[str, TierMatch]] = field(default_factory=dict)  # by namespace
    backends: dict[EndpointId, list[Backend]] = field(default_factory=dict)
    #: EMU per endpoint as Prometheus last reported it, and the KV capacity behind it.
    emu: dict[EndpointId, float] = field(default_factory=dict)
    capacity: dict[EndpointId, float] = field(default_factory=dict)
    #: tokens sent to each endpoint since the last Prometheus reading
    sent: dict[EndpointId, float] = field(default_factory=dict)
    #: tokens still to process per backend pod (prompt + max output of requests in flight)
    remaining: dict[str, float] = field(default_factory=dict)
    #: the plan's spill-over weights per (namespace, model deployment), by home region
    spill: dict[tuple[str, str], Mapping[str, SpillBounds]] = field(default_factory=dict)
    ledger: SpillLedger = field(default_factory=SpillLedger)
    #: who must show a key (`dispatch.identity`; the command line's default is `required`,
    #: a fleet built by hand, as in tests and benchmarks, keeps keyless namespaces open)
    auth: AuthMode = "per-namespace"
    #: every key of every namespace's tiers, by digest (rebuilt by `set_tiers`)
    ring: KeyRing = field(default_factory=KeyRing)
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    #: set once discovery has listed every kind it watches (a fleet built by hand, as in
    #: tests and benchmarks, is complete from the start: discovery clears it)
    listed: asyncio.Event = field(default_factory=_set_event)
    #: the named in-region picker (None: fewest remaining tokens)
    picker: InstancePicker | None = None
    #: each pod's load anticipator and each model's output-length predictor
    anticipators: PodAnticipators = field(default_factory=PodAnticipators)
    #: each pod's KV usage as Prometheus last reported it (for `min-usage`), and its KV
    #: capacity in tokens (None: not exported)
    pod_kv: dict[str, float] = field(default_factory=dict)
    pod_capacity: dict[str, float | None] = field(default_factory=dict)
    #: tokens sent to each pod since the last Prometheus reading (the variant step's
    #: correction, as `sent` is the region choice's)
    pod_sent: dict[str, float] = field(default_factory=dict)
    #: requests waiting for admission at each pod as Prometheus last reported them
    #: (vLLM's `num_requests_waiting`)
    pod_waiting: dict[str, int] = field(default_factory=dict)
    #: the plan's OServe layouts per endpoint (ScalingPolicy `status.layouts`)
    layouts: dict[EndpointId, EndpointLayout] = field(default_factory=dict)
    #: requests dispatched by type so far (`sageserve_router_layout_dispatch_total`)
    layout_dispatches: Counter[LayoutDispatch] = field(default_factory=Counter)
    #: the overflow threshold between variants (`dispatch.layout_dispatch.overflow`)
    overflow_ratio: float = OVERFLOW_RATIO
    overflow_tokens: float = OVERFLOW_TOKENS

    # ---- written by discovery and the load refresher ----------------------------------

    def set_models(self, models: Iterable[ModelRoute]) -> None:
        self.models = {m.served_name: m for m in models}
        self._wake()

    def set_tiers(self, namespace: str, tiers: Mapping[str, TierMatch]) -> None:
        self.tiers[namespace] = dict(tiers)
        self.ring = key_ring(self.tiers)

    # ---- who may do what (dispatch.identity) ----------------------------------------------

    def authenticate(self, key: str | None) -> Principal | Refusal:
        return authenticate(key, self.ring, self.auth)

    def visible(self, principal: Principal, namespace: str) -> bool:
        """Whether `principal` may see a model (or Batch API object) of `namespace`."""
        return may_see(principal, namespace, self.ring, self.auth)

    def model_for(self, principal: Principal, served_name: str) -> ModelRoute | None:
        """The model `principal` asks for by name (None: not served, or another tenant's:
        a caller cannot tell the two apart)."""
        model = self.models.get(served_name)
        if model is None or not self.visible(principal, model.namespace):
            return None
        return model

    def models_for(self, principal: Principal) -> list[ModelRoute]:
        return sorted(
            (m for m in self.models.values() if self.visible(principal, m.namespace)),
            key=lambda m: m.served_name,
        )

    def set_spill(self, namespace: str, spill: Mapping[str, Mapping[str, SpillBounds]]) -> None:
        """This namespace's plans' spill-over weights, by model deployment."""
        self.spill = {k: v for k, v in self.spill.items() if k[0] != namespace}
        self.spill.update({(namespace, md): bounds for md, bounds in spill.items()})

    def set_layouts(self, namespace: str, layouts: LayoutWeights) -> None:
        """This namespace's plans' OServe layouts, by (model deployment, region). An
        endpoint whose published types did not change keeps its round robin's credits (a
        policy's status is rewritten every plan cycle; restarting the turns each time would
        favour the greatest variant)."""
        kept = {k: v for k, v in self.layouts.items() if k[0] != namespace}
        for (md, region), types in layouts.items():
            key = (namespace, md, region)
            new = endpoint_layout(types)
            if new is None:
                continue
            old = self.layouts.get(key)
            kept[key] = old if old is not None and old.types == new.types else new
        self.layouts = kept

    def set_backends(self, backends: Iterable[Backend]) -> None:
        by_endpoint: dict[EndpointId, list[Backend]] = {}
        for b in sorted(backends, key=lambda b: b.pod):
            by_endpoint.setdefault(b.endpoint, []).append(b)
        self.backends = by_endpoint
        self.anticipators.forget({b.pod for bs in by_endpoint.values() for b in bs})
        self._wake()

    def set_pod_loads(self, pods: Mapping[str, tuple[float, float | None]]) -> None:
        """Per-pod (KV usage, KV capacity in tokens) from a fresh Prometheus reading."""
        self.pod_kv = {pod: usage for pod, (usage, _) in pods.items()}
        self.pod_capacity = {pod: cap for pod, (_, cap) in pods.items()}
        self.pod_sent.clear()
        for pod, (_, cap) in pods.items():
            self.anticipators.set_capacity(pod, cap)

    def set_load(self, emu_by_endpoint: Mapping[EndpointId, tuple[float, float]]) -> None:
        """(EMU, KV capacity in tokens) per endpoint from a fresh Prometheus reading."""
        self.emu = {k: v[0] for k, v in emu_by_endpoint.items()}
        self.capacity = {k: v[1] for k, v in emu_by_endpoint.items()}
        self.sent.clear()
        self._wake()

    def is_batch(self, model: ModelRoute, tier: str) -> bool:
        match = self.tiers.get(model.namespace, {}).get(tier)
        return match is not None and match.batch

    def batch_tier(self, served_name: str, principal: Principal) -> str | None:
        """The tier a Batch API request of `principal` for `served_name` runs in: the
        model's first batch tier the caller may use (None: the model is not served to this
        caller, or serves it no batch tier)."""
        model = self.model_for(principal, served_name)
        if model is None:
            return None
        known = self.tiers.get(model.namespace, {})
        allowed = allowed_tiers(principal, model.tiers)
        return next((t for t in allowed if t in known and known[t].batch), None)

    def batch_tiers(self) -> dict[str, TierMatch]:
        """Every batch tier the router knows, by name (the first namespace's on a clash)."""
        out: dict[str, TierMatch] = {}
        for ns in sorted(self.tiers):
            for name, match in self.tiers[ns].items():
                if match.batch:
                    out.setdefault(name, match)
        return out

    def _wake(self) -> None:
        self.changed.set()
        self.changed = asyncio.Event()

    # ---- read by request handlers -----------------------------------------------------

    def set_pod_waiting(self, waiting: Mapping[str, int]) -> None:
        """Per-pod requests waiting for admission, from a fresh Prometheus reading."""
        self.pod_waiting = dict(waiting)

    def waiting(self, endpoint: EndpointId) -> int:
        """Requests waiting at the endpoint's ready pods at the last reading: the batch
        release takes nothing while any wait (`dispatch.queue_manager.release_count`)."""
        return sum(self.pod_waiting.get(b.pod, 0) for b in self.backends.get(endpoint, ()))

    def estimated_emu(self, endpoint: EndpointId) -> float:
        """Prometheus' EMU plus what this router sent since (SageServe's EMU, §4), by
        `dispatch.queue_manager.estimated_emu`, the simulator's estimate too."""
        return estimated_emu(
            self.emu.get(endpoint, 0.0),
            self.sent.get(endpoint, 0.0),
            self.capacity.get(endpoint, 0.0),
        )

    def choose_region(
        self,
        model: ModelRoute,
        home: str | None,
        tokens: float = 0.0,
        now: float | None = None,
        peers: Collection[str] = (),
    ) -> str | None:
        """The region to serve a request of `tokens` from (None: no region has a ready pod).
        A region of `peers` (served by another cluster's router, `router.peers`) is a
        candidate without pods here, at the EMU Prometheus last reported for it, within the
        plan's spill-over shares as any other."""
        order = preference(home, model.regions, str)
        ready = [
            r for r in order if self.backends.get((model.namespace, model.name, r)) or r in peers
        ]
        if not ready:
            return None
        candidates = [(r, self.estimated_emu((model.namespace, model.name, r))) for r in ready]
        return route_region(
            (model.namespace, model.name),
            home,
            candidates,
            str,
            tokens,
            time.monotonic() if now is None else now,
            self.ledger,
            self.spill.get((model.namespace, model.name)),
            model.route_threshold,
        )

    def choose_backend(
        self,
        model: ModelRoute,
        region: str,
        exclude: frozenset[str] = frozenset(),
        arrival: Arrival | None = None,
    ) -> Backend | None:
        """The ready pod of `region` for a request. When the plan lays the endpoint out in
        several variants, the variant is chosen by the request's type (`_by_type`);
        otherwise, with pods of several variants, the variant with the least EMU
        (`variant_pods`, SageServe §6.1's deployment step, the simulator's too). Then the
        named picker's choice over the pods' load anticipators when there is one (and the
        request's `arrival` is known), else the pod with the fewest tokens still to
        process."""
        endpoint = (model.namespace, model.name, region)
        pods = [b for b in self.backends.get(endpoint, []) if b.pod not in exclude]
        if not pods:
            return None
        layout = self.layouts.get(endpoint)
        if layout is not None and arrival is not None:
            chosen = self._by_type(endpoint, layout, pods, arrival)
            if chosen is not None:
                return chosen
        return self._pick(self.variant_pods(model, pods), arrival)

    def variant_pods(self, model: ModelRoute, pods: list[Backend]) -> list[Backend]:
        """The pods of the variant (pod set) with the least EMU among `pods`
        (`dispatch.instance_picker.pick_deployment`, ties to the first in `spec.variants`
        order): each variant's EMU from its pods' last Prometheus readings, weighted as the
        endpoint's (`endpoint_load`), plus what was sent to its pods since ÷ their KV
        capacity, as the region choice corrects it (`estimated_emu`). All of `pods` when
        they run one variant."""
        by_variant: dict[str, list[Backend]] = {}
        for b in pods:
            by_variant.setdefault(b.variant, []).append(b)
        if len(by_variant) < 2:
            return pods
        rank = {v: i for i, v in enumerate(model.variants)}
        order = sorted(by_variant, key=lambda v: rank.get(v, len(rank)))
        candidates = []
        for v in order:
            mine = by_variant[v]
            read, cap = _pooled_load(
                [(self.pod_kv.get(b.pod, 0.0), self.pod_capacity.get(b.pod)) for b in mine]
            )
            sent = sum(self.pod_sent.get(b.pod, 0.0) for b in mine)
            candidates.append((v, estimated_emu(read, sent, cap)))
        return by_variant[pick_deployment(candidates)]

    def _pick(self, pods: list[Backend], arrival: Arrival | None) -> Backend:
        """The in-region picker over `pods` (not empty)."""
        if self.picker is not None and arrival is not None:
            loads = [(b, self.anticipators.load(b.pod, self.pod_kv.get(b.pod, 0.0))) for b in pods]
            return self.picker.pick(arrival, loads)
        return pick_instance([(b, self.remaining.get(b.pod, 0.0)) for b in pods])

    def tokens_left(self, backend: Backend) -> float:
        """The load the overflow rule compares, the in-region picker's measure in tokens:
        with a named picker the pod's anticipated tokens left (queued prompts + predicted
        output left, `token-jsq`'s), else the tokens in flight (prompt + `max_tokens`)."""
        if self.picker is not None:
            pod = backend.pod
            return float(
                self.anticipators.anticipator(pod).tokens_left(self.anticipators.iteration(pod))
            )
        return self.remaining.get(backend.pod, 0.0)

    def _by_type(
        self, endpoint: EndpointId, layout: EndpointLayout, pods: list[Backend], arrival: Arrival
    ) -> Backend | None:
        """OServe §4.2 dispatch (`dispatch.layout_dispatch.dispatch_by_type`, the rule the
        fleet simulator and the OServe harness follow too), counted per type and variant:
        the request's type (nearest centroid of its prompt and *predicted* output), the
        variant by the type's weights (smooth weighted round robin among the variants with
        a candidate pod), the picker among that variant's pods; then the overflow: if that
        pod's `tokens_left` exceeds `overflow_ratio` × the least-loaded pod's of another
        variant the type weighs (any other variant when it weighs only one) +
        `overflow_tokens`, that pod instead.

        None (the caller's type-free picker decides) when a candidate pod runs a variant
        the layout does not name (another GPU type, or a variant the plan has not weighed
        yet: weights over some pods would starve the others), or when the type weighs no
        variant that has a candidate pod."""
        got = dispatch_by_type(
            layout,
            pods,
            _variant,
            lambda mine: self._pick(mine, arrival),
            self.tokens_left,
            arrival.prompt_tokens,
            arrival.predicted_output,
            self.overflow_ratio,
            self.overflow_tokens,
        )
        if got is None:
            return None
        chosen, j, overflowed = got
        self.layout_dispatches[(endpoint, j, chosen.variant, overflowed)] += 1
        return chosen

    def arrival(self, model: ModelRoute, client: int, prompt_tokens: float) -> Arrival:
        """The request as the pickers see it: prompt tokens, predicted output tokens."""
        return self.anticipators.arrival(model.served_name, client, prompt_tokens)

    def track(self, backend: Backend, model: ModelRoute, client: int, arrival: Arrival) -> Ticket:
        """A request sent to `backend`: on the pod's look-ahead map until released."""
        return self.anticipators.sent(backend.pod, model.served_name, client, arrival)

    def start(self, backend: Backend, tokens: float) -> None:
        self.remaining[backend.pod] = self.remaining.get(backend.pod, 0.0) + tokens
        self.pod_sent[backend.pod] = self.pod_sent.get(backend.pod, 0.0) + tokens
        self.sent[backend.endpoint] = self.sent.get(backend.endpoint, 0.0) + tokens

    def finish(self, backend: Backend, tokens: float) -> None:
        left = self.remaining.get(backend.pod, 0.0) - tokens
        if left > 1e-9:
            self.remaining[backend.pod] = left
        else:
            self.remaining.pop(backend.pod, None)


def endpoint_load(
    pods: Mapping[str, tuple[float, float | None]], backends: Iterable[Backend]
) -> dict[EndpointId, tuple[float, float]]:
    """(EMU, KV capacity) per endpoint from per-pod (usage, capacity) readings, weighted
    as the operator weighs them (`core.snapshot.emu`; equal weights where a pod does not
    export its cache size)."""
    groups: dict[EndpointId, list[tuple[float, float | None]]] = {}
    for b in backends:
        if b.pod in pods:
            groups.setdefault(b.endpoint, []).append(pods[b.pod])
    out: dict[EndpointId, tuple[float, float]] = {}
    for key, readings in groups.items():
        out[key] = _pooled_load(readings)
    return out


def _pooled_load(readings: list[tuple[float, float | None]]) -> tuple[float, float]:
    """(EMU, KV capacity in tokens) over pods' (usage fraction, capacity) readings, each
    pod weighted by its capacity, or all alike when one does not export it (the operator's
    rule, `controller.observe`; the capacity is then unknown, 0)."""
    sized = all(cap for _, cap in readings)
    caps = [float(cap) if sized and cap else 1.0 for _, cap in readings]
    used = sum(u * c for (u, _), c in zip(readings, caps, strict=True))
    return emu(used, sum(caps)), sum(caps) if sized else 0.0
