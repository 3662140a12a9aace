"""Which tier a request belongs to (SageServe §2.2: IW-F, IW-N, NIW).

A request names its tier in a header (`x-sageserve-tier`), or its API key is one a
WorkloadTier lists (`spec.match.apiKeys`), or it gets the first tier its ModelDeployment
serves. A tier the model does not serve is refused with the allowed ones named, so a
client's mistake is a clear 400, never a silent downgrade. Pure: the router passes what
it read from the request and the tiers it knows.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

#: The request header that names a tier.
TIER_HEADER = "x-sageserve-tier"


class TierError(ValueError):
    """The request's tier is not one the model serves; the message names the allowed ones."""


@dataclass(frozen=True)
class TierMatch:
    """How a WorkloadTier recognises its requests: header values and API keys."""

    name: str
    header_values: tuple[str, ...] = ()
    api_keys: tuple[str, ...] = ()
    #: a batch (NIW) tier: its requests yield to interactive ones (SageServe §6.2)
    batch: bool = False
    #: a batch tier's deadline and promotion age (WorkloadTier `spec.batch`), seconds
    deadline_s: float | None = None
    promotion_age_s: float | None = None

    def matches_header(self, value: str) -> bool:
        return value == self.name or value in self.header_values


def resolve_tier(
    header: str | None,
    api_key: str | None,
    served: Sequence[str],
    tiers: Mapping[str, TierMatch],
) -> str:
    """The tier of a request to a model serving `served` tiers (in its spec order)."""
    if not served:
        raise TierError("the model serves no tier: add one to its spec.tiers")
    if header:
        for name in served:
            tier = tiers.get(name, TierMatch(name))
            if tier.matches_header(header):
                return name
        raise TierError(
            f"{TIER_HEADER}: {header!r} is not a tier this model serves; use one of "
            + ", ".join(served)
        )
    if api_key:
        for name in served:
            if api_key in tiers.get(name, TierMatch(name)).api_keys:
                return name
    return served[0]
