"""WorkloadTier: a class of requests with its SLOs (SageServe's IW-F, IW-N and NIW).

Interactive tiers are judged by latency percentiles (TTFT < 1 s at P95 for IW-F, < 1 min
for IW-N); batch tiers by a completion deadline (24 h), and are promoted to interactive
priority once they are older than the promotion age (10 h). SageServe §2.2, §6.1, §6.2.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Literal

from pydantic import ConfigDict, Field

from sageserve.api.common import ApiModel, Condition, ObjectMeta, cel, conditions_field, sub_object


class TierType(StrEnum):
    """Interactive requests stream tokens to a user; batch requests only need a deadline."""

    INTERACTIVE = "interactive"
    BATCH = "batch"


class Slo(ApiModel):
    """Latency objectives, each a P95 bound in seconds."""

    ttft_p95_seconds: float | None = Field(
        default=None,
        gt=0,
        le=86400,
        description="P95 time to first token. Required for interactive tiers "
        "(SageServe: IW-F 1 s, IW-N 60 s).",
    )
    tbt_p95_seconds: float | None = Field(
        default=None,
        gt=0,
        le=3600,
        description="P95 time between tokens (TPOT) while streaming.",
    )
    e2e_p95_seconds: float | None = Field(
        default=None,
        alias="e2eP95Seconds",
        gt=0,
        le=604800,
        description="P95 end-to-end latency of a request.",
    )


class BatchSettings(ApiModel):
    """How the batch Queue Manager treats the tier's requests (SageServe §6.2)."""

    deadline_seconds: int = Field(
        default=86400,
        ge=60,
        le=2592000,
        description="A request not finished this long after arrival misses its deadline "
        "(SageServe: 24 h).",
    )
    promotion_age_seconds: int = Field(
        default=36000,
        ge=0,
        le=2592000,
        description="Queued requests without a deadline older than this get interactive "
        "priority (SageServe: 10 h; the simulator's rule). A request with a deadline, as "
        "every Batch API request has, is promoted when its slack runs out instead: its "
        "deadline less its expected service time less 30 min.",
    )


TIER_RULES = cel(
    (
        "self.type != 'interactive' || has(self.slo.ttftP95Seconds)",
        "spec.slo.ttftP95Seconds is required when spec.type is interactive: "
        "set it, e.g. 1 for IW-F or 60 for IW-N",
    ),
    (
        "self.type == 'batch' ? has(self.batch) : !has(self.batch)",
        "spec.batch is required when spec.type is batch and not allowed when it is "
        "interactive: add 'batch: {}' to a batch tier for the defaults, or remove it",
    ),
    (
        "!has(self.batch) || self.batch.promotionAgeSeconds < self.batch.deadlineSeconds",
        "spec.batch.promotionAgeSeconds must be below spec.batch.deadlineSeconds: promote "
        "before the deadline (SageServe: 10 h and 24 h)",
    ),
    (
        "!has(self.slo.e2eP95Seconds) || !has(self.slo.ttftP95Seconds) "
        "|| self.slo.ttftP95Seconds <= self.slo.e2eP95Seconds",
        "spec.slo.ttftP95Seconds must not exceed spec.slo.e2eP95Seconds: the first token "
        "cannot come after the last",
    ),
)


class SecretRef(ApiModel):
    """A Secret in the tier's namespace."""

    name: str = Field(min_length=1, max_length=253, pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")


class TierMatch(ApiModel):
    """How the router recognises the tier's requests, besides the tier's own name in the
    `x-sageserve-tier` header."""

    header_values: list[Annotated[str, Field(min_length=1, max_length=63)]] = Field(
        default_factory=list,
        max_length=32,
        description="Other values of the x-sageserve-tier header that mean this tier.",
    )
    api_keys_secret_ref: SecretRef | None = Field(
        default=None,
        description="A Secret whose data values are API keys: requests bearing one of them "
        "(Authorization: Bearer KEY) belong to this tier when they name no tier.",
    )


class LimitScope(StrEnum):
    """Who shares a tier's rate limits: each API key its own budget, or the whole tier one."""

    KEY = "key"
    TIER = "tier"


#: The most a tier may declare per minute: far above any fleet's throughput, low enough
#: that the router's arithmetic stays exact in floating point.
MAX_REQUESTS_PER_MINUTE = 10_000_000
MAX_TOKENS_PER_MINUTE = 10_000_000_000

LIMITS_RULES = cel(
    (
        "has(self.requestsPerMinute) || has(self.tokensPerMinute)",
        "spec.limits needs requestsPerMinute or tokensPerMinute (or both): set one, or "
        "remove spec.limits for an unlimited tier",
    ),
)


class RateLimits(ApiModel):
    """How much one tenant's client may send through the router, so that one client cannot
    take the router and every pod behind it. Each limit is a token bucket holding one
    minute's budget, refilled continuously (docs/router.md)."""

    model_config = ConfigDict(json_schema_extra=LIMITS_RULES)

    requests_per_minute: int | None = Field(
        default=None,
        ge=1,
        le=MAX_REQUESTS_PER_MINUTE,
        description="Requests admitted per minute (OpenAI's RPM); a burst of up to this "
        "many is admitted at once.",
    )
    tokens_per_minute: int | None = Field(
        default=None,
        ge=1,
        le=MAX_TOKENS_PER_MINUTE,
        description="Estimated tokens admitted per minute (OpenAI's TPM): each request "
        "costs its prompt characters ÷ 4 plus its max_tokens (256 when unset); a request "
        "costing more than this is refused outright.",
    )
    per: LimitScope = Field(
        default=LimitScope.KEY,
        description="key: each API key of the tier gets the whole budget; tier: the "
        "tier's keys share one budget.",
    )


class WorkloadTierSpec(ApiModel):
    """A class of requests sharing one SLO and one priority."""

    model_config = ConfigDict(json_schema_extra=TIER_RULES)

    type: TierType = Field(description="interactive (streamed) or batch (deadline only).")
    priority: int = Field(
        ge=0,
        le=1000,
        description="Lower is served first by the instance scheduler and kept first when "
        "capacity falls short (SageServe: 0 for interactive, 1 for batch). Interactive work "
        "always goes before batch work; among interactive tiers the lower value is the "
        "faster tier (IW-F 0, IW-N 1), which the ScalingPolicy's instanceScheduling pf and "
        "dpa orders serve first.",
    )
    slo: Slo = sub_object(Slo)
    batch: BatchSettings | None = Field(
        default=None, description="Queue Manager settings; only for batch tiers."
    )
    match: TierMatch = sub_object(TierMatch)
    limits: RateLimits | None = Field(
        default=None,
        description="Per-tenant rate limits the router enforces (429 with Retry-After past "
        "them); none when absent.",
    )


class TierAttainment(ApiModel):
    """Observed SLO attainment of the tier over the last window."""

    window_seconds: int = Field(ge=0)
    attainment: float = Field(ge=0, le=1, description="Share of requests within the SLO.")


class WorkloadTierStatus(ApiModel):
    """What the operator observed about the tier."""

    observed_generation: int | None = Field(default=None, ge=0)
    conditions: list[Condition] = conditions_field()
    attainment: TierAttainment | None = None


class WorkloadTier(ApiModel):
    """WorkloadTier: a class of requests (interactive or batch) with its SLOs."""

    api_version: Literal["sageserve.io/v1alpha1"]
    kind: Literal["WorkloadTier"]
    metadata: ObjectMeta
    spec: WorkloadTierSpec
    status: WorkloadTierStatus | None = None
