"""ModelPool: many sporadic models served by one pool of GPUs whose engines sleep and wake.

Aegaeon (Xiang et al., SOSP '25) pools a long tail of rarely used models on a few GPUs. On
Kubernetes with stock vLLM the unit of switching is the request: every pod of the pool runs
one vLLM engine per model with sleep mode (`--enable-sleep-mode`; `POST /sleep?level=1`
offloads the weights to host memory and drops the KV cache, `POST /wake_up` brings them
back), at most `awakePerInstance` of them awake at once; the router wakes the model a
request needs and puts idle ones to sleep. The operator owns one Deployment ("pooled pod
set") per (region, variant), named `<metadata.name>-<region>-<variant>` like a
ModelDeployment's, and sizes it from the plan (expected active models, Aegaeon §3).

Why a resource of its own rather than a section of ModelDeployment: a pool is one set of
GPUs shared by many models, so its GPU shape, regions, quota and sizing are the pool's,
declared once; a platform team adds a fine-tune by adding one line to `spec.models` rather
than a whole ModelDeployment whose variants and instance bounds would mean nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import ConfigDict, Field

from sageserve.api.common import (
    DNS_LABEL,
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
from sageserve.api.model_deployment import (
    DEFAULT_DRAIN_SECONDS,
    DRAIN_DESCRIPTION,
    POD_SET_NAME_MAX,
    REGION_RULES,
    Engine,
    PodSetStatus,
    PolicyRef,
)

#: Engines of one pooled pod listen on consecutive ports from `spec.engine.port`.
MAX_POOLED_MODELS = 64


class PooledModel(ApiModel):
    """One model of the pool: its own vLLM engine in every pooled pod, asleep until needed."""

    name: str = Field(
        min_length=1,
        max_length=40,
        pattern=DNS_LABEL,
        description="Short name of the model in the pool (metric label, engine name), "
        "e.g. support-bot-v3.",
    )
    model: str = Field(
        min_length=1,
        max_length=256,
        description="Model to load, e.g. acme/llama-2-70b-support (passed to --model).",
    )
    served_name: str | None = Field(
        default=None,
        min_length=1,
        max_length=256,
        description="Name clients ask for (--served-model-name); defaults to model.",
    )
    context_length: int | None = Field(
        default=None,
        ge=16,
        le=16_777_216,
        description="Longest prompt + output one request may ask for (--max-model-len).",
    )


POOL_VARIANT_RULES = cel(
    (
        "!has(self.tensorParallel) || self.tensorParallel <= self.gpusPerInstance",
        "spec.variant.tensorParallel must not exceed gpusPerInstance: lower tensorParallel "
        "or raise gpusPerInstance",
    ),
)


class PoolVariant(ApiModel):
    """The GPUs one pooled pod holds: every engine of the pod shares them."""

    model_config = ConfigDict(json_schema_extra=POOL_VARIANT_RULES)

    name: str = Field(
        min_length=1,
        max_length=20,
        pattern=DNS_LABEL,
        description="Short name, part of the pod set name, e.g. h100-tp4.",
    )
    gpu_type: str = Field(
        min_length=1,
        max_length=63,
        pattern=LABEL_VALUE,
        description="Node label value of the GPU type, e.g. NVIDIA-H100-80GB-HBM3.",
    )
    gpus_per_instance: int = Field(
        default=4, ge=1, le=64, description="GPUs one pooled pod requests (nvidia.com/gpu)."
    )
    tensor_parallel: int | None = Field(
        default=None,
        ge=1,
        le=64,
        description="Tensor-parallel size of every engine; defaults to gpusPerInstance.",
    )
    startup_seconds: int = Field(
        default=600,
        ge=0,
        le=86400,
        description="Seconds from scheduling to serving (every engine loads, then sleeps).",
    )
    drain_seconds: int = Field(
        default=DEFAULT_DRAIN_SECONDS, ge=0, le=86400, description=DRAIN_DESCRIPTION
    )


class PoolRegion(ApiModel):
    """A region the pool runs in, with bounds on its pooled pods."""

    model_config = ConfigDict(json_schema_extra=REGION_RULES)

    name: str = Field(
        min_length=1,
        max_length=20,
        pattern=DNS_LABEL,
        description="Region, matched against the node region label, e.g. us-east.",
    )
    min_instances: int = Field(
        default=1, ge=0, le=10000, description="Never fewer pooled pods here."
    )
    max_instances: int = Field(ge=0, le=10000, description="Never more pooled pods here.")
    initial_instances: int | None = Field(
        default=None,
        ge=0,
        le=10000,
        description="Pooled pods before the first plan; defaults to minInstances.",
    )


class PoolSizing(ApiModel):
    """How the plan sizes the pool from each model's forecast request rate (Aegaeon §3)."""

    mean_output_tokens: int = Field(
        default=256,
        ge=1,
        le=1_000_000,
        description="Mean output tokens of a request: with tbtSeconds it gives how long a "
        "request keeps its model active (Tᵢ of E[m] = Σ(1 − e^(−λᵢTᵢ))).",
    )
    tbt_seconds: float = Field(
        default=0.1,
        gt=0,
        le=60,
        description="Time between tokens a request decodes at (Aegaeon's per-token SLO: 100 ms).",
    )
    active_quantile: float | None = Field(
        default=0.99,
        gt=0,
        le=1,
        description="Size for this quantile of the number of active models (Poisson-binomial) "
        "instead of its mean E[m]; leave out to size on the mean.",
    )


POOL_SPEC_RULES = cel(
    (
        "self.awakePerInstance <= size(self.models)",
        "spec.awakePerInstance must not exceed the number of spec.models: lower it",
    ),
    (
        "self.engine.port + size(self.models) <= 65536",
        "spec.engine.port + one port per model must stay within 65535: lower spec.engine.port",
    ),
    (
        "self.models.all(a, self.models.exists_one(b, "
        "(has(b.servedName) ? b.servedName : b.model) == "
        "(has(a.servedName) ? a.servedName : a.model)))",
        "spec.models[].servedName (else model) must be unique in the pool: clients could not "
        "tell two models apart; give each a distinct servedName",
    ),
    (
        "self.regions.exists(r, r.maxInstances > 0)",
        "spec.regions[].maxInstances is 0 in every region: the pool could never serve; raise "
        "maxInstances in at least one region",
    ),
    (
        "!has(self.engine.kind) || self.engine.kind == 'vllm'",
        "spec.engine.kind must be vllm in a ModelPool: pooled models sleep and wake through "
        "vLLM's sleep mode, which the other engines lack; remove kind or use a "
        "ModelDeployment",
    ),
)


#: Models one pooled pod keeps awake unless `awakePerInstance` says otherwise.
DEFAULT_AWAKE_PER_INSTANCE = 2


class ModelPoolSpec(ApiModel):
    """Which models share the pool, on which GPUs, in which regions, under which policy."""

    model_config = ConfigDict(json_schema_extra=POOL_SPEC_RULES)

    models: list[PooledModel] = Field(
        min_length=1,
        max_length=MAX_POOLED_MODELS,
        json_schema_extra=list_map("name"),
        description="The pooled models; model i's engine listens on engine.port + i.",
    )
    engine: Engine = sub_object(Engine)
    variant: PoolVariant
    regions: list[PoolRegion] = Field(
        min_length=1, max_length=64, json_schema_extra=list_map("name")
    )
    awake_per_instance: int = Field(
        default=DEFAULT_AWAKE_PER_INSTANCE,
        ge=1,
        le=MAX_POOLED_MODELS,
        description="Models one pooled pod keeps awake at once (the GPU memory holds this "
        "many models' weights and KV cache); the router puts the least recently used idle "
        "one to sleep to wake another.",
    )
    idle_sleep_seconds: int = Field(
        default=60,
        ge=1,
        le=86400,
        description="An awake model with no request for this long is put to sleep.",
    )
    tiers: list[str] = Field(
        min_length=1,
        max_length=16,
        json_schema_extra=list_set(),
        description="Names of the WorkloadTiers the pooled models serve, e.g. [iw-f, iw-n].",
    )
    sizing: PoolSizing = sub_object(PoolSizing)
    policy_ref: PolicyRef


class ModelPoolStatus(ApiModel):
    """What the operator has done for this pool."""

    observed_generation: int | None = Field(default=None, ge=0)
    conditions: list[Condition] = conditions_field()
    instances: int = Field(default=0, ge=0, description="Pooled pods over all pod sets.")
    target_instances: int = Field(default=0, ge=0, description="Planned pooled pods.")
    expected_active_models: float | None = Field(
        default=None, ge=0, description="E[m] of the last plan, summed over regions."
    )
    pod_sets: list[PodSetStatus] = Field(
        default_factory=list, max_length=1024, json_schema_extra=list_map("name")
    )


MODEL_POOL_RULES = cel(
    (
        "self.spec.regions.all(r, "
        f"size(self.metadata.name) + size(r.name) + size(self.spec.variant.name) + 2 <= "
        f"{POD_SET_NAME_MAX})",
        "pod set names <metadata.name>-<region>-<variant> must fit in "
        f"{POD_SET_NAME_MAX} characters: shorten metadata.name, spec.regions[].name or "
        "spec.variant.name",
    ),
)


class ModelPool(ApiModel):
    """ModelPool: many sporadic models on one pool of GPUs, switched by vLLM sleep mode."""

    model_config = ConfigDict(json_schema_extra=MODEL_POOL_RULES)

    api_version: Literal["sageserve.io/v1alpha1"]
    kind: Literal["ModelPool"]
    metadata: ObjectMeta
    spec: ModelPoolSpec
    status: ModelPoolStatus | None = None


def served_name(model: PooledModel) -> str:
    return model.served_name or model.model


def model_port(spec: ModelPoolSpec, index: int) -> int:
    """The port of the engine of `spec.models[index]` in every pooled pod."""
    return spec.engine.port + index


def parse_pool(body: Mapping[str, Any]) -> ModelPool:
    """A ModelPool from its manifest or API object (status and server fields dropped): the
    one parser of the operator's loops and the simulator's scenario loader."""
    return ModelPool.model_validate(
        {k: body[k] for k in ("apiVersion", "kind", "metadata", "spec") if k in body}
    )


def initial_size(region: PoolRegion) -> int:
    """Pooled pods of a region before any plan: initialInstances, else minInstances."""
    return region.min_instances if region.initial_instances is None else region.initial_instances
