"""Whose API key a request carries: a key of another tenant never reaches this tenant's pods.

A namespace is a tenant: its WorkloadTiers list its API keys (`spec.match.apiKeysSecretRef`).
Keys pick a request's tier (`route.tiers`); they are not a login. What the router must
still refuse is a key that belongs to someone else: a key another namespace lists, sent for
a model of this namespace, is a 403 (and one this namespace does not know, when it lists
keys of its own, a 401), so that tenant B's key can neither use tenant A's GPUs nor be
billed to A's tier. A namespace that lists no key at all checks none (anonymous use is the
gateway's business in front of the router, docs/reliability.md).

Keys are compared with `hmac.compare_digest`, so how long a refusal takes says nothing of
how much of a key matched.
"""

from __future__ import annotations

import hmac
from collections.abc import Mapping
from dataclasses import dataclass

from sageserve.route.tiers import TierMatch


@dataclass(frozen=True)
class Refusal:
    """Why a request's key is refused: the HTTP status and the OpenAI-shaped error type."""

    status: int
    kind: str
    message: str


def _lists(tiers: Mapping[str, TierMatch], key: str) -> bool:
    found = False
    for tier in tiers.values():
        for known in tier.api_keys:
            # every key is compared (no early exit): the time taken does not tell which
            found |= hmac.compare_digest(known.encode(), key.encode())
    return found


def key_refusal(
    key: str | None,
    namespace: str,
    served_name: str,
    tiers_by_namespace: Mapping[str, Mapping[str, TierMatch]],
) -> Refusal | None:
    """None when the key may be used for a model of `namespace`; else why not."""
    if not key:
        return None
    own = tiers_by_namespace.get(namespace, {})
    if _lists(own, key):
        return None
    others = [t for ns, t in tiers_by_namespace.items() if ns != namespace]
    if any(_lists(t, key) for t in others):
        # not which tenant it belongs to: that would tell a caller whose key it holds
        return Refusal(
            403, "permission_error", f"this API key may not be used for model {served_name!r}"
        )
    if any(t.api_keys for t in own.values()):
        return Refusal(401, "invalid_request_error", "invalid API key")
    return None
