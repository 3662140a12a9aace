"""Which tier a request belongs to (SageServe §2.2: IW-F, IW-N, NIW).

A WorkloadTier recognises its requests by the API keys it lists (its identity) and by
header values (`x-sageserve-tier`) a client may send to narrow among the tiers its key
may use; `dispatch.identity` decides, from both, which tier a request gets.
"""

from __future__ import annotations

from dataclasses import dataclass

from sageserve.dispatch.rate_limit import Limits

#: The request header that names a tier.
TIER_HEADER = "x-sageserve-tier"


@dataclass(frozen=True)
class TierMatch:
    """How a WorkloadTier recognises its requests: header values and API keys."""

    name: str
    header_values: tuple[str, ...] = ()
    api_keys: tuple[str, ...] = ()
    #: the tier names a key Secret that could not be read: its namespace is closed to
    #: every key not found elsewhere (fail closed, `dispatch.identity`)
    keys_unreadable: bool = False
    #: a batch (NIW) tier: its requests yield to interactive ones (SageServe §6.2)
    batch: bool = False
    #: a batch tier's deadline (WorkloadTier `spec.batch.deadlineSeconds`), seconds
    deadline_s: float | None = None
    #: requests and tokens per minute the router admits (WorkloadTier `spec.limits`,
    #: `dispatch.rate_limit`); None: unlimited
    limits: Limits | None = None
    #: the tier's declared priority (WorkloadTier `spec.priority`, lower first) and TTFT SLO
    #: (`spec.slo.ttftP95Seconds`): what the instance order reads
    #: (`dispatch.instance_order.waiting_for`) and the router sends as vLLM's `priority`
    priority: int = 0
    ttft_slo_s: float | None = None

    def matches_header(self, value: str) -> bool:
        return value == self.name or value in self.header_values
