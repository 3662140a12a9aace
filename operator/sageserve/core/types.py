"""Plain domain types: requests, tiers, instance and fleet snapshots, observations, actions.

Why one module of dataclasses: the simulator, the operator and every policy (dispatch/, pace/,
plan/) exchange exactly these values. Keeping them free of I/O and of any clock makes the
policy code a pure function of its inputs, so a decision made in `sageserve simulate` is the
decision the operator would make on the same observation.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import NamedTuple

#: A region name as written in the `topology.kubernetes.io/region` node label (e.g. "us-east").
Region = str
#: A GPU product as written in the `nvidia.com/gpu.product` node label.
GpuType = str
#: A model name as used by ModelDeployment manifests and perf profiles (e.g. "llama-2-70b").
ModelName = str

#: Pool names. "unified" serves every tier; siloed layouts split into interactive and batch.
POOL_UNIFIED = "unified"
POOL_INTERACTIVE = "interactive"
POOL_BATCH = "batch"


class TierKind(StrEnum):
    """Whether a tier's requests are routed at once (interactive) or queued (batch)."""

    INTERACTIVE = "interactive"
    BATCH = "batch"


@dataclass(frozen=True, slots=True)
class Tier:
    """A class of requests with its SLOs (SageServe §2.2: IW-F, IW-N, NIW).

    `priority` is the declared priority (WorkloadTier `spec.priority`, lower first). The
    instance scheduler serves every interactive tier at priority 0 and batch at 1; batch
    requests older than `promotion_age_s` are promoted to priority 0 (SageServe: 10 h);
    `deadline_s` is the end-to-end deadline for batch work (SageServe: 24 h). Among
    interactive tiers the declared priority says which is faster (IW-F 0, IW-N 1) for the
    instance orders that tell them apart (`dispatch.instance_order`, SageServe v3 §6.5).
    """

    name: str
    kind: TierKind
    ttft_slo_s: float | None = None
    tbt_slo_s: float | None = None
    deadline_s: float | None = None
    priority: int = 0
    promotion_age_s: float | None = None

    @property
    def interactive(self) -> bool:
        return self.kind is TierKind.INTERACTIVE


#: The three tiers of the SageServe paper with its SLOs.
IW_F = Tier("IW-F", TierKind.INTERACTIVE, ttft_slo_s=1.0, priority=0)
IW_N = Tier("IW-N", TierKind.INTERACTIVE, ttft_slo_s=60.0, priority=1)
NIW = Tier("NIW", TierKind.BATCH, deadline_s=24 * 3600.0, priority=1, promotion_age_s=10 * 3600.0)
DEFAULT_TIERS: Mapping[str, Tier] = {t.name: t for t in (IW_F, IW_N, NIW)}


@dataclass(slots=True)
class Request:
    """One inference request as it enters the system.

    Traces carry no region or tier; the workload mapping assigns them (see
    docs/simulator.md). `region` is the client's home region: the router prefers it.
    """

    id: int
    arrival: float
    model: ModelName
    tier: Tier
    region: Region
    prompt_tokens: int
    output_tokens: int
    #: the client (tenant, API key) that sent it, as the trace names it; 0 when unknown.
    #: Per-client output-length prediction reads it (PreServe §4.2).
    client: int = 0


class InstanceState(StrEnum):
    """Life cycle of one model instance (SageServe §2.3, §6.4).

    PROVISIONING: GPUs paid for, not serving (spot reclaim or redeploy in progress).
    SERVING: takes new requests. DRAINING: finishes its work, takes nothing new.
    SPOT: donated to the spot pool; not counted in internal instance-hours.
    """

    PROVISIONING = "provisioning"
    SERVING = "serving"
    DRAINING = "draining"
    SPOT = "spot"


class EndpointKey(NamedTuple):
    """A (model, region, pool) endpoint: the unit the autoscaler sizes."""

    model: ModelName
    region: Region
    pool: str = POOL_UNIFIED


@dataclass(frozen=True, slots=True)
class EndpointObservation:
    """The signals one endpoint offers to a pacing strategy at time `time` (seconds).

    `emu` is Σ KV used / Σ KV capacity over serving instances; `tokens_per_s` is the
    observed input token rate over the last minute (LT-UA compares it with the forecast).
    `pressure` is the queue-side signal the decision step adds (`pace.pressure`: backlog
    per instance, TTFT over the SLO), 1.0 at saturation; strategies read the largest of it
    and EMU (`pace.pressure.load`).
    """

    time: float
    key: EndpointKey
    emu: float
    serving: int
    provisioning: int
    draining: int
    min_instances: int
    max_instances: int
    tokens_per_s: float = 0.0
    waiting: int = 0
    pressure: float = 0.0
    pressure_reason: str = ""
    #: each reporting instance's projected KV usage over its look-ahead (fractions of its
    #: capacity, PreServe §4.3.1), where the world anticipates load; empty where it does not
    projections: tuple[tuple[float, ...], ...] = ()
    #: when the decision step last scaled this endpoint, and last scaled it in (None: never
    #: since the caller's state began); strategies with per-window rules read them
    last_event_at: float | None = None
    last_scale_in_at: float | None = None
    #: reporting instances running at least one interactive request, and how many
    #: instances reported that count (Chiron's interactive backpressure, `pace.chiron`)
    interactive_busy: int = 0
    interactive_reporting: int = 0
    #: the endpoint's share of its model's batch deadline need and its batch capacity
    #: under the release threshold (`pace.pressure.with_deadline_need`; 0 where none)
    batch_need_tps: float = 0.0
    batch_capacity_tps: float = 0.0

    @property
    def active(self) -> int:
        """Instances that count toward the endpoint's size (serving + coming up)."""
        return self.serving + self.provisioning


class ActionKind(StrEnum):
    """What a scaling action asks the fleet to do."""

    SCALE_OUT = "scale_out"
    SCALE_IN = "scale_in"


@dataclass(frozen=True, slots=True)
class ScalingAction:
    """A request to add or remove `count` instances of an endpoint.

    `pace.step.decide` turns it into a `core.snapshot.Decision` (which variant, which
    instance drains); where a new instance's GPUs come from is `pace.spot.reclaim_order`.
    """

    kind: ActionKind
    key: EndpointKey
    count: int = 1
    reason: str = ""
