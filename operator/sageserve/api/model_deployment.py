"""ModelDeployment: one served model, its GPU variants and the regions it runs in.

The operator owns one Deployment ("pod set") per (region, variant), named
`<metadata.name>-<region>-<variant>`, running the vLLM OpenAI server. A variant is one
way to run the model (GPU type, GPUs per instance, parallelism) with its measured capacity
θ in tokens/s at the SLO, which is what the planner's ILP uses (SageServe §2.1, §5, §7.1).
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Literal

from pydantic import ConfigDict, Field

from sageserve.api.common import (
    DNS_LABEL,
    DNS_SUBDOMAIN,
    LABEL_VALUE,
    ApiModel,
    Condition,
    ObjectMeta,
    cel,
    conditions_field,
    list_map,
    list_set,
    sub_object,
)
from sageserve.metrics.engines import EngineKind

#: Pod set names `<name>-<region>-<variant>` are also Service and label values: 63 at most.
POD_SET_NAME_MAX = 63


ENGINE_RULES = cel(
    (
        "!has(self.args) || !self.args.exists(a, a == '--scheduling-policy' "
        "|| a.startsWith('--scheduling-policy='))",
        "spec.engine.args must not set --scheduling-policy: sageserve sets it from the "
        "ScalingPolicy's spec.instanceScheduling.policy (priority for edf, pf and dpa, to "
        "serve the priority the router sends); remove it and choose the order there",
    ),
)


class Engine(ApiModel):
    """The inference server each instance runs (vLLM's OpenAI-compatible server by default)."""

    model_config = ConfigDict(json_schema_extra=ENGINE_RULES)

    kind: EngineKind = Field(
        default=EngineKind.VLLM,
        description="Which server the image runs: vllm (its OpenAI server), sglang "
        "(sglang.launch_server, metrics on) or trtllm (trtllm-serve, Prometheus metrics at "
        "/prometheus/metrics). Chooses the server arguments sageserve sets and the metric "
        "names it reads (docs/metrics.md). Only vllm serves the priority order of "
        "spec.instanceScheduling; the others serve requests first come, first served.",
    )
    image: str = Field(
        default="vllm/vllm-openai:v0.11.0",
        min_length=1,
        max_length=512,
        description="Container image of the server.",
    )
    args: list[str] = Field(
        default_factory=list,
        max_length=64,
        description="Extra server arguments, appended after the ones sageserve sets "
        "(model, served name, port, tensor/pipeline parallel size, and the scheduling "
        "policy the ScalingPolicy's instance order needs, which these may not set).",
    )
    port: int = Field(default=8000, ge=1, le=65535, description="HTTP port of the server.")


class ModelRef(ApiModel):
    """Which model the instances load."""

    name: str = Field(
        min_length=1,
        max_length=256,
        description="Model to load, e.g. meta-llama/Llama-2-70b-hf (passed to --model).",
    )
    served_name: str | None = Field(
        default=None,
        min_length=1,
        max_length=256,
        description="Name clients ask for (--served-model-name); defaults to the model name.",
    )
    context_length: int | None = Field(
        default=None,
        ge=16,
        le=16_777_216,
        description="Longest prompt + output one request may ask for, in tokens "
        "(--max-model-len). Longer requests are refused at arrival with HTTP 400 "
        "context_length_exceeded, as vLLM does. Defaults to the model's own (its config.json, "
        "recorded in the perf profile: Bloom-176B 2048, Llama-2-70B 4096, Llama-3.1-8B 131072).",
    )


VARIANT_RULES = cel(
    (
        "self.gpusPerInstance % self.pipelineParallel == 0",
        "spec.variants[].gpusPerInstance must be a multiple of pipelineParallel: each "
        "pipeline stage needs the same number of GPUs",
    ),
    (
        "!has(self.tensorParallel) "
        "|| self.tensorParallel * self.pipelineParallel == self.gpusPerInstance",
        "spec.variants[].tensorParallel × pipelineParallel must equal gpusPerInstance: "
        "fix one of the three, or drop tensorParallel to derive it",
    ),
)


#: Seconds a pod taken out of service keeps serving its requests by default: a 70B model's
#: longest answers (thousands of tokens at 20-40 tokens/s) end within it.
DEFAULT_DRAIN_SECONDS = 600
DRAIN_DESCRIPTION = (
    "Seconds a pod taken out of service (scale-in, spot donation) may spend finishing the "
    "requests it holds before it is stopped: the router sends it nothing new at once, and "
    "Kubernetes kills it this long after (its terminationGracePeriodSeconds). Requests "
    "still running then are cut, so allow the longest generation you serve; an engine that "
    "drains on SIGTERM stops as soon as its last request ends."
)


class Variant(ApiModel):
    """One way to run the model: a GPU type, a GPU count and a measured capacity."""

    model_config = ConfigDict(json_schema_extra=VARIANT_RULES)

    name: str = Field(
        min_length=1,
        max_length=20,
        pattern=DNS_LABEL,
        description="Short name, part of the pod set name, e.g. h100-tp8.",
    )
    gpu_type: str = Field(
        min_length=1,
        max_length=63,
        pattern=LABEL_VALUE,
        description="Node label value of the GPU type, e.g. NVIDIA-H100-80GB-HBM3.",
    )
    gpus_per_instance: int = Field(
        default=8,
        ge=1,
        le=64,
        description="GPUs one instance requests (nvidia.com/gpu). SageServe: 8 per VM.",
    )
    tensor_parallel: int | None = Field(
        default=None,
        ge=1,
        le=64,
        description="Tensor-parallel size; defaults to gpusPerInstance / pipelineParallel.",
    )
    pipeline_parallel: int = Field(default=1, ge=1, le=64, description="Pipeline stages.")
    capacity_tokens_per_second: float = Field(
        gt=0,
        le=1e9,
        description="θ: tokens/s (input + output) one instance sustains within the SLO. "
        "SageServe measured 95–522 for Llama-2-70B on 8×H100.",
    )
    startup_seconds: int = Field(
        default=600,
        ge=0,
        le=86400,
        description="Seconds from scheduling to serving when weights are not cached "
        "(SageServe: 10 min redeploy). Enters the ILP's start-up cost σ.",
    )
    drain_seconds: int = Field(
        default=DEFAULT_DRAIN_SECONDS,
        ge=0,
        le=86400,
        description=DRAIN_DESCRIPTION,
    )
    prefill_tokens_per_second: float | None = Field(
        default=None,
        gt=0,
        le=1e9,
        description="μ_p: prompt tokens/s one instance prefills within the SLO on a "
        "prompt-heavy mix (PreServe §4.1, measured by `sageserve calibrate --preserve`). "
        "Unset: the preserve strategy sizes on capacityTokensPerSecond alone and says so.",
    )
    decode_tokens_per_second: float | None = Field(
        default=None,
        gt=0,
        le=1e9,
        description="μ_d: output tokens/s one instance generates within the SLO on a "
        "decode-heavy mix (PreServe §4.1, measured by `sageserve calibrate --preserve`). "
        "Unset: the preserve strategy sizes on capacityTokensPerSecond alone and says so.",
    )


REGION_RULES = cel(
    (
        "self.minInstances <= self.maxInstances",
        "spec.regions[].minInstances must not exceed maxInstances: lower minInstances or "
        "raise maxInstances",
    ),
    (
        "!has(self.initialInstances) || (self.minInstances <= self.initialInstances "
        "&& self.initialInstances <= self.maxInstances)",
        "spec.regions[].initialInstances must lie within [minInstances, maxInstances]: "
        "change it or the bounds",
    ),
)


class RegionPlacement(ApiModel):
    """A region the model is served in, with instance bounds summed over variants."""

    model_config = ConfigDict(json_schema_extra=REGION_RULES)

    name: str = Field(
        min_length=1,
        max_length=20,
        pattern=DNS_LABEL,
        description="Region, matched against the node region label, e.g. us-east.",
    )
    min_instances: int = Field(
        default=2,
        ge=0,
        le=10000,
        description="Never fewer instances here (SageServe: 2, for fault tolerance).",
    )
    max_instances: int = Field(ge=0, le=10000, description="Never more instances here.")
    initial_instances: int | None = Field(
        default=None,
        ge=0,
        le=10000,
        description="Instances before the first plan (SageServe starts at 20); "
        "defaults to minInstances.",
    )
    inference_pool: str | None = Field(
        default=None,
        min_length=1,
        max_length=253,
        pattern=DNS_LABEL,
        description="Name of the InferencePool whose endpoint picker fronts this region's "
        "pods, whose metrics the ScalingPolicy's spec.signals.endpointPicker reads; "
        "where the operator owns InferencePools it names this region's pool so; "
        "defaults to <metadata.name>-<region>.",
    )


class PolicyRef(ApiModel):
    """The ScalingPolicy, in the same namespace, that sizes this model."""

    name: str = Field(min_length=1, max_length=253, pattern=DNS_LABEL)


MODEL_DEPLOYMENT_SPEC_RULES = cel(
    (
        "self.regions.exists(r, r.maxInstances > 0)",
        "spec.regions[].maxInstances is 0 in every region: the model could never be "
        "served; raise maxInstances in at least one region",
    ),
)


class FailureMode(StrEnum):
    """What a gateway does when the endpoint picker does not answer (InferencePool
    `spec.endpointPickerRef.failureMode`)."""

    FAIL_OPEN = "FailOpen"
    FAIL_CLOSE = "FailClose"


class PoolScope(StrEnum):
    """Which serving pods one InferencePool selects."""

    REGION = "Region"
    VARIANT = "Variant"


#: A Service name (RFC 1123 label) in which `{pool}` stands for the InferencePool's name.
PICKER_NAME = r"^([a-z0-9]|\{pool\})([-a-z0-9]|\{pool\})*$"
#: What `{pool}` in an endpoint picker's name is replaced with.
POOL_PLACEHOLDER = "{pool}"


class EndpointPicker(ApiModel):
    """The endpoint picker (EPP) Service a gateway asks which pod serves each request."""

    name: str = Field(
        min_length=1,
        max_length=63,
        pattern=PICKER_NAME,
        description="Name of the endpoint picker's Service, in the ModelDeployment's "
        "namespace. An endpoint picker serves one InferencePool, so `{pool}` in the name "
        "stands for each pool's name, e.g. `{pool}-epp`; without it every pool of the "
        "model names the same Service (one pool: one region, one variant).",
    )
    port: int = Field(
        ge=1,
        le=65535,
        description="Service port of the endpoint picker's gRPC (ext_proc) endpoint, e.g. 9002.",
    )
    failure_mode: FailureMode = Field(
        default=FailureMode.FAIL_CLOSE,
        description="FailClose: the gateway refuses requests while the picker does not "
        "answer; FailOpen: it sends them to any pod of the pool.",
    )


class GatewayParent(ApiModel):
    """A Gateway an HTTPRoute attaches to (Gateway API's ParentReference to a Gateway)."""

    name: str = Field(min_length=1, max_length=253, pattern=DNS_SUBDOMAIN)
    namespace: str | None = Field(
        default=None,
        max_length=63,
        pattern=DNS_LABEL,
        description="The Gateway's namespace; defaults to the ModelDeployment's.",
    )
    section_name: str | None = Field(
        default=None,
        max_length=253,
        pattern=DNS_SUBDOMAIN,
        description="One listener of the Gateway; all of them when absent.",
    )


class SpillRoute(ApiModel):
    """An HTTPRoute per region, owned by the operator, whose backends carry the plan's
    spill-over shares as weights (SageServe §5's C2 across clusters, through a gateway)."""

    parent_refs: list[GatewayParent] = Field(
        min_length=1,
        max_length=32,
        description="The Gateways each region's route attaches to, in that region's "
        "cluster (one Gateway per cluster serving the region's clients).",
    )


class GatewaySettings(ApiModel):
    """How the model is offered to a Gateway API Inference Extension gateway: the
    InferencePools (inference.networking.k8s.io/v1) the operator owns for it, when the
    cluster serves that API and the operator runs with InferencePools on."""

    endpoint_picker: EndpointPicker | None = Field(
        default=None,
        description="Endpoint picker of this model's InferencePools; defaults to the "
        "operator's (Helm value gateway.endpointPicker). Pools are not made while neither "
        "names one.",
    )
    pool_scope: PoolScope | None = Field(
        default=None,
        description="Region: one InferencePool per region, selecting the pods of every "
        "variant there; Variant: one per (region, variant), so an HTTPRoute can send to one "
        "parallelism layout. Defaults to Variant when the ScalingPolicy declares "
        "spec.layouts (the router dispatches each layout apart), else Region.",
    )
    route: SpillRoute | None = Field(
        default=None,
        description="With regions in several clusters: one HTTPRoute per region, named as "
        "its InferencePool and written in its cluster, matching the model's name in the "
        "X-Gateway-Model-Name header, sending each request to the region's own pool or, by "
        "the plan's spill-over shares, to another cluster's pool imported as an "
        "InferencePoolImport. Absent: HTTPRoutes are yours.",
    )


class ModelDeploymentSpec(ApiModel):
    """What to serve, on which GPU variants, in which regions, under which policy."""

    model_config = ConfigDict(json_schema_extra=MODEL_DEPLOYMENT_SPEC_RULES)

    model: ModelRef
    engine: Engine = sub_object(Engine)
    variants: list[Variant] = Field(min_length=1, max_length=16, json_schema_extra=list_map("name"))
    regions: list[RegionPlacement] = Field(
        min_length=1, max_length=64, json_schema_extra=list_map("name")
    )
    tiers: list[str] = Field(
        min_length=1,
        max_length=16,
        json_schema_extra=list_set(),
        description="Names of the WorkloadTiers this model serves, e.g. [iw-f, iw-n, niw].",
    )
    policy_ref: PolicyRef
    gateway: GatewaySettings | None = Field(
        default=None,
        description="Gateway API Inference Extension settings (endpoint picker, pool scope); "
        "the operator's defaults apply when absent.",
    )


class PodSetStatus(ApiModel):
    """One owned Deployment: where it runs and how far it is from its target."""

    name: str = Field(max_length=253, description="Name of the Deployment.")
    region: str = Field(max_length=63)
    variant: str = Field(max_length=63)
    gpu_type: str = Field(max_length=63)
    replicas: int = Field(ge=0)
    ready_replicas: int = Field(default=0, ge=0)
    target: int = Field(ge=0, description="Instances the pacing strategy is moving toward.")
    last_scale_time: datetime | None = None
    last_scale_reason: str | None = Field(default=None, max_length=1024)


class CapacityStatus(ApiModel):
    """θ of one (variant, region): declared, learned from the fleet, the one in force, and
    the evidence (ScalingPolicy `spec.capacity`, `plan.learned_capacity`)."""

    variant: str = Field(max_length=63)
    region: str = Field(max_length=63)
    declared_tokens_per_second: float = Field(
        ge=0, description="The variant's capacityTokensPerSecond."
    )
    learned_tokens_per_second: float | None = Field(
        default=None,
        ge=0,
        description="The quantile of the qualifying windows' tokens/s per instance, scaled to "
        "the scale-out EMU (absent: no qualifying window yet).",
    )
    in_force_tokens_per_second: float = Field(
        ge=0,
        description="θ the plan used: the learned one once trusted (within the declared θ × "
        "[minFactor, maxFactor]), else the declared one.",
    )
    windows: int = Field(ge=0, description="One-minute windows read within historySeconds.")
    qualifying_windows: int = Field(
        ge=0, description="Windows that kept every interactive tier's TTFT SLO at EMU ≥ minEmu."
    )
    trusted: bool = Field(description="At least minWindows windows qualified.")
    learned_at: datetime | None = None


class GatewayStatus(ApiModel):
    """The Gateway API Inference Extension objects the operator owns for this model."""

    inference_pools: list[str] = Field(
        default_factory=list,
        max_length=1024,
        json_schema_extra=list_set(),
        description="Names of its InferencePools (inference.networking.k8s.io/v1), one per "
        "region or per (region, variant); an HTTPRoute's backendRef names one.",
    )
    inference_objectives: list[str] = Field(
        default_factory=list,
        max_length=4096,
        json_schema_extra=list_set(),
        description="Names of its InferenceObjectives, one per (pool, tier), carrying the "
        "tier's priority; a request names one in the x-gateway-inference-objective header.",
    )
    routes: list[str] = Field(
        default_factory=list,
        max_length=1024,
        json_schema_extra=list_set(),
        description="Names of the HTTPRoutes carrying the plan's spill-over shares "
        "(spec.gateway.route), one per region alone in its cluster.",
    )
    objective_api: str | None = Field(
        default=None,
        max_length=253,
        description="The apiVersion of the InferenceObjectives (llm-d.ai/v1alpha2 or "
        "inference.networking.x-k8s.io/v1alpha2, whichever the cluster serves); absent "
        "when it serves neither.",
    )


class ModelDeploymentStatus(ApiModel):
    """What the operator has done for this model."""

    observed_generation: int | None = Field(default=None, ge=0)
    conditions: list[Condition] = conditions_field()
    instances: int = Field(default=0, ge=0, description="Replicas over all pod sets.")
    target_instances: int = Field(default=0, ge=0, description="Targets over all pod sets.")
    pod_sets: list[PodSetStatus] = Field(
        default_factory=list, max_length=1024, json_schema_extra=list_map("name")
    )
    capacity: list[CapacityStatus] = Field(
        default_factory=list,
        max_length=1024,
        description="θ learned from the fleet per (variant, region), next to the declared "
        "one; written by the plan loop when the ScalingPolicy sets spec.capacity.learn "
        "(cleared when it does not). The largest trusted θ in force is what the model's "
        "batch deadlines are judged with.",
    )
    gateway: GatewayStatus | None = Field(
        default=None,
        description="Its InferencePools and InferenceObjectives; condition InferencePools "
        "says why there are none (API not served, turned off, no endpoint picker).",
    )


MODEL_DEPLOYMENT_RULES = cel(
    (
        "self.spec.regions.all(r, self.spec.variants.all(v, "
        f"size(self.metadata.name) + size(r.name) + size(v.name) + 2 <= {POD_SET_NAME_MAX}))",
        "pod set names <metadata.name>-<region>-<variant> must fit in "
        f"{POD_SET_NAME_MAX} characters: shorten metadata.name, spec.regions[].name or "
        "spec.variants[].name",
    ),
)


class ModelDeployment(ApiModel):
    """ModelDeployment: one served model, its GPU variants and the regions it runs in."""

    model_config = ConfigDict(json_schema_extra=MODEL_DEPLOYMENT_RULES)

    api_version: Literal["sageserve.io/v1alpha1"]
    kind: Literal["ModelDeployment"]
    metadata: ObjectMeta
    spec: ModelDeploymentSpec
    status: ModelDeploymentStatus | None = None


def inference_pool_name(md: ModelDeployment, region: RegionPlacement) -> str:
    """The InferencePool in front of `md`'s pods in `region`: the one its
    `spec.regions[].inferencePool` names, by default `<name>-<region>` (`metrics.picker`)."""
    return region.inference_pool or f"{md.metadata.name}-{region.name}"


def pod_set_name(deployment: str, region: str, variant: str) -> str:
    """The deterministic name of the Deployment serving `deployment` in (region, variant)."""
    return f"{deployment}-{region}-{variant}"


def model_theta_tps(md: ModelDeployment) -> float:
    """θ of the model for its batch deadlines: the capacityTokensPerSecond of its fastest
    variant (SageServe §5's per-instance capacity).

    Why the fastest: the deadline signal and the at-risk check ask whether the model's
    instances *can* serve its batch queue in time; the largest θ errs toward "they can", so
    a scale-out for deadlines or a predicted miss is never raised by a pessimistic guess.
    The simulator sizes its models with the same θ (`sim.scenario`)."""
    return max(float(v.capacity_tokens_per_second) for v in md.spec.variants)
