"""Who a caller is and what it may do (`dispatch.identity`), as tables of cases."""

from __future__ import annotations

import pytest

from sageserve.dispatch.identity import (
    ANONYMOUS,
    AuthMode,
    Principal,
    Refusal,
    authenticate,
    bearer_key,
    choose_tier,
    key_digest,
    key_ring,
    may_see,
)
from sageserve.dispatch.tiers import TierMatch

TIERS = {
    "iw-f": TierMatch("iw-f", ("fast",), ("key-f",)),
    "iw-n": TierMatch("iw-n", (), ("key-f", "key-n")),
    "niw": TierMatch("niw", ("batch",), ("key-b",)),
}
SERVED = ["iw-f", "iw-n", "niw"]
RING = key_ring(
    {
        "a": TIERS,
        "b": {"iw-f": TierMatch("iw-f", api_keys=("key-other",))},
        "open": {"iw-f": TierMatch("iw-f")},
    }
)


def who(key: str | None, mode: AuthMode = "required") -> Principal | Refusal:
    return authenticate(key, RING, mode)


@pytest.mark.parametrize(
    ("key", "mode", "tenant", "status"),
    [
        ("key-f", "required", "a", None),
        ("key-other", "required", "b", None),
        (None, "required", None, 401),  # no key where keys are required
        (None, "per-namespace", None, None),  # anonymous, for open namespaces only
        ("key-unknown", "required", None, 401),
        ("key-unknown", "per-namespace", None, 401),  # a wrong key is never anonymous
    ],
)
def test_authenticate(key: str | None, mode: AuthMode, tenant: str | None, status: int) -> None:
    found = who(key, mode)
    if status is None:
        assert isinstance(found, Principal)
        assert found.tenant == tenant
    else:
        assert isinstance(found, Refusal)
        assert found.status == status


def test_a_key_names_its_tenant_and_every_tier_that_lists_it() -> None:
    found = who("key-f")
    assert isinstance(found, Principal)
    assert found.tiers == {"iw-f", "iw-n"}
    assert found.key_id == key_digest("key-f")[:16]
    assert "key-f" not in repr(RING)  # the ring keeps digests, never a key in clear


@pytest.mark.parametrize(
    ("caller", "namespace", "mode", "sees"),
    [
        ("key-f", "a", "required", True),
        ("key-f", "b", "required", False),  # another tenant's models do not exist for it
        ("key-f", "open", "required", False),
        (None, "open", "per-namespace", True),
        (None, "a", "per-namespace", False),  # a namespace that lists keys is closed
        (None, "open", "required", False),
    ],
)
def test_may_see(caller: str | None, namespace: str, mode: AuthMode, sees: bool) -> None:
    principal = ANONYMOUS if caller is None else who(caller)
    assert isinstance(principal, Principal)
    assert may_see(principal, namespace, RING, mode) is sees


@pytest.mark.parametrize(
    ("key", "header", "expected"),
    [
        ("key-f", None, "iw-f"),  # the first of the key's tiers, in the model's order
        ("key-f", "iw-n", "iw-n"),  # the header narrows among them
        ("key-f", "fast", "iw-f"),  # a value the tier lists
        ("key-n", None, "iw-n"),
        ("key-b", None, "niw"),
        ("key-b", "batch", "niw"),
        (None, "fast", "iw-f"),  # anonymous (an open namespace): any served tier
        (None, None, "iw-f"),
    ],
)
def test_choose_tier(key: str | None, header: str | None, expected: str) -> None:
    principal = ANONYMOUS if key is None else who(key)
    assert isinstance(principal, Principal)
    assert choose_tier(principal, header, SERVED, TIERS) == expected


@pytest.mark.parametrize(
    ("key", "header", "served", "status", "names"),
    [
        # a batch key may not take interactive priority by naming it
        ("key-b", "iw-f", SERVED, 403, "use one of niw"),
        ("key-n", "fast", SERVED, 403, "use one of iw-n"),
        # a tier the model does not serve: a 400 naming what the key may use
        ("key-f", "niw", ["iw-f", "iw-n"], 400, "use one of iw-f, iw-n"),
        ("key-f", "gold", SERVED, 400, "use one of iw-f, iw-n"),
        # a key none of whose tiers the model serves
        ("key-b", None, ["iw-f", "iw-n"], 403, "ask for a key"),
        ("key-f", None, [], 400, "spec.tiers"),
    ],
)
def test_choose_tier_refusals(
    key: str, header: str | None, served: list[str], status: int, names: str
) -> None:
    principal = who(key)
    assert isinstance(principal, Principal)
    refused = choose_tier(principal, header, served, TIERS)
    assert isinstance(refused, Refusal)
    assert refused.status == status
    assert names in refused.message


def test_an_unreadable_key_secret_fails_closed() -> None:
    ring = key_ring(
        {
            "a": {"iw-f": TierMatch("iw-f", keys_unreadable=True)},
            "b": {"iw-f": TierMatch("iw-f", api_keys=("key-b",))},
        }
    )
    unknown = authenticate("key-a", ring, "per-namespace")
    assert isinstance(unknown, Refusal) and unknown.status == 503  # may be in the unread one
    assert isinstance(authenticate("key-b", ring, "required"), Principal)  # others still work
    assert not may_see(ANONYMOUS, "a", ring, "per-namespace")  # not opened by the failure


def test_a_key_two_namespaces_list_is_refused() -> None:
    ring = key_ring(
        {
            "a": {"iw-f": TierMatch("iw-f", api_keys=("shared",))},
            "b": {"iw-f": TierMatch("iw-f", api_keys=("shared",))},
        }
    )
    refused = authenticate("shared", ring, "required")
    assert isinstance(refused, Refusal) and refused.status == 401
    assert "more than one namespace" in refused.message


@pytest.mark.parametrize(
    ("header", "key"),
    [
        ("Bearer sk-1", "sk-1"),
        ("bearer  sk-1 ", "sk-1"),
        ("Bearer ", None),
        ("Basic c2stMQ==", None),
        ("", None),
        (None, None),
    ],
)
def test_bearer_key(header: str | None, key: str | None) -> None:
    assert bearer_key(header) == key


def test_a_key_whose_bytes_are_not_utf8_is_an_unknown_key() -> None:
    # aiohttp hands such header bytes over as lone surrogates (`surrogateescape`)
    key = b"\xff\xfe".decode("utf-8", "surrogateescape")
    assert key_digest(key) == key_digest(key)
    found = who(key, "per-namespace")
    assert isinstance(found, Refusal) and found.status == 401
