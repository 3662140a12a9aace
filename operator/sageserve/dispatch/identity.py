"""Who sends a request, and what that identity may do: tenant, tiers, models.

A namespace is a tenant. Its WorkloadTiers list API keys (`spec.match.apiKeysSecretRef`);
a key is the identity: it names one tenant and the tiers whose WorkloadTiers list it. The
tier header (`x-sageserve-tier`) only *narrows* among those tiers; it never grants one
(SageServe §2.2 puts IW-F ahead of everything else, so a tier a client could choose for
itself would be a priority anyone could take).

Two modes, chosen on the router (`--auth`):

- ``required`` (the default): every request carries a key some namespace lists; a
  namespace that lists none is reachable by nobody.
- ``per-namespace``: a namespace that lists no key at all is open (anonymous requests,
  any tier it serves, as before there were tenants); one that lists keys is closed.

Fail closed: a key Secret that cannot be read marks its namespace *unreadable*; a request
whose key is not found while any namespace is unreadable is answered 503 (the key may be
in the Secret we could not read), and an anonymous request to such a namespace 401.

Keys are looked up by their SHA-256, so how long a lookup takes says nothing of how much
of a key matched, and the ring indexes digests only. A key listed by two namespaces is
refused (it would make one tenant's files another's).

Pure: the router passes what it read from the request and the tiers discovery listed.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from sageserve.dispatch.tiers import TIER_HEADER, TierMatch

AuthMode = Literal["required", "per-namespace"]
AUTH_MODES: tuple[AuthMode, ...] = ("required", "per-namespace")


def key_digest(key: str) -> str:
    """The SHA-256 of a key, hex: what the ring indexes and what objects record as owner.

    Of the key's bytes as sent: a header's bytes that are not UTF-8 reach the router as
    lone surrogates (aiohttp decodes with `surrogateescape`), which a plain `encode()`
    refuses; such a key is simply one no namespace lists."""
    return hashlib.sha256(key.encode("utf-8", "surrogateescape")).hexdigest()


@dataclass(frozen=True)
class Principal:
    """An authenticated caller.

    `tenant` is the namespace whose WorkloadTiers list the key (None: anonymous, allowed
    only in `per-namespace` mode for namespaces that list no key); `tiers` are the tiers
    the key may use (for an anonymous caller: none named, so every tier of an open
    namespace); `key_id` a short digest of the key, safe to log and to store as owner.
    """

    tenant: str | None
    key_id: str = ""
    tiers: frozenset[str] = frozenset()

    @property
    def anonymous(self) -> bool:
        return self.tenant is None

    @property
    def owner(self) -> str:
        """Who owns the Batch API objects this caller creates: its tenant ("" anonymous)."""
        return self.tenant or ""


ANONYMOUS = Principal(None)


@dataclass(frozen=True)
class Refusal:
    """Why a request is refused: the HTTP status, OpenAI's error type, the message, and the
    request field or header to blame."""

    status: int
    kind: str
    message: str
    param: str | None = None


@dataclass(frozen=True)
class KeyRing:
    """Every key the router knows, by digest: (tenant, tiers)."""

    keys: Mapping[str, tuple[str, frozenset[str]]] = field(default_factory=dict)
    #: digests listed by more than one namespace (refused)
    ambiguous: frozenset[str] = frozenset()
    #: namespaces that list at least one key (closed to anonymous callers)
    closed: frozenset[str] = frozenset()
    #: namespaces whose key Secret could not be read (fail closed)
    unreadable: frozenset[str] = frozenset()


def key_ring(tiers_by_namespace: Mapping[str, Mapping[str, TierMatch]]) -> KeyRing:
    """The ring of every namespace's tiers (built once per discovery change, not per request)."""
    owners: dict[str, set[str]] = {}
    tiers_of: dict[str, set[str]] = {}
    closed: set[str] = set()
    unreadable: set[str] = set()
    for ns, tiers in tiers_by_namespace.items():
        for tier in tiers.values():
            if tier.keys_unreadable:
                unreadable.add(ns)
                closed.add(ns)
            for key in tier.api_keys:
                digest = key_digest(key)
                owners.setdefault(digest, set()).add(ns)
                tiers_of.setdefault(digest, set()).add(tier.name)
                closed.add(ns)
    ambiguous = frozenset(d for d, ns in owners.items() if len(ns) > 1)
    keys = {d: (min(ns), frozenset(tiers_of[d])) for d, ns in owners.items() if d not in ambiguous}
    return KeyRing(keys, ambiguous, frozenset(closed), frozenset(unreadable))


def bearer_key(authorization: str | None) -> str | None:
    """The key of an `Authorization: Bearer <key>` header (None when absent or empty)."""
    if not authorization:
        return None
    scheme, _, key = authorization.strip().partition(" ")
    if scheme.lower() != "bearer":
        return None
    return key.strip() or None


def authenticate(key: str | None, ring: KeyRing, mode: AuthMode) -> Principal | Refusal:
    """Who the caller is, from its key alone (before the model is known)."""
    if key is None:
        if mode == "required":
            return Refusal(
                401,
                "invalid_request_error",
                "an API key is required: send Authorization: Bearer <key> with a key your "
                "namespace's WorkloadTiers list",
            )
        return ANONYMOUS
    digest = key_digest(key)
    if digest in ring.ambiguous:
        return Refusal(
            401,
            "invalid_request_error",
            "this API key is listed by more than one namespace; give each tenant keys of its own",
        )
    found = ring.keys.get(digest)
    if found is None:
        if ring.unreadable:
            return Refusal(
                503,
                "server_error",
                "API keys could not be read from their Secrets; retry later",
            )
        return Refusal(401, "invalid_request_error", "invalid API key")
    tenant, tiers = found
    return Principal(tenant, digest[:16], tiers)


def may_see(principal: Principal, namespace: str, ring: KeyRing, mode: AuthMode) -> bool:
    """Whether a model (or a Batch API object) of `namespace` exists for this caller: a
    keyed caller sees its own namespace's; an anonymous one only open namespaces'."""
    if principal.tenant is not None:
        return principal.tenant == namespace
    return mode == "per-namespace" and namespace not in ring.closed


def allowed_tiers(principal: Principal, served: Sequence[str]) -> list[str]:
    """The tiers of a model (`served`, in its spec order) this caller may use."""
    if principal.anonymous:
        return list(served)
    return [t for t in served if t in principal.tiers]


def choose_tier(
    principal: Principal,
    header: str | None,
    served: Sequence[str],
    tiers: Mapping[str, TierMatch],
) -> str | Refusal:
    """The tier of a request: the first allowed one, or the one the header narrows to.

    A header naming a tier the model does not serve is a 400 naming the served ones; one
    naming a served tier this key may not use is a 403 naming the tiers it may use."""
    if not served:
        return Refusal(
            400, "invalid_request_error", "the model serves no tier: add one to its spec.tiers"
        )
    allowed = allowed_tiers(principal, served)
    if not allowed:
        return Refusal(
            403,
            "permission_error",
            "this API key may use none of this model's tiers ("
            + ", ".join(served)
            + "); ask for a key a WorkloadTier of it lists",
        )
    if not header:
        return allowed[0]
    named = [t for t in served if tiers.get(t, TierMatch(t)).matches_header(header)]
    if not named:
        return Refusal(
            400,
            "invalid_request_error",
            f"{TIER_HEADER}: {header!r} is not a tier this model serves; use one of "
            + ", ".join(allowed),
            TIER_HEADER,
        )
    for name in named:
        if name in allowed:
            return name
    return Refusal(
        403,
        "permission_error",
        f"{TIER_HEADER}: {header!r} is not a tier this API key may use; use one of "
        + ", ".join(allowed),
        TIER_HEADER,
    )


__all__ = [
    "ANONYMOUS",
    "AUTH_MODES",
    "AuthMode",
    "KeyRing",
    "Principal",
    "Refusal",
    "allowed_tiers",
    "authenticate",
    "bearer_key",
    "choose_tier",
    "key_digest",
    "key_ring",
    "may_see",
]
