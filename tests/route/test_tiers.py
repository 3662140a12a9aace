"""A request's tier: its header, else its API key, else the model's first tier."""

from __future__ import annotations

import pytest

from sageserve.route.tiers import TierError, TierMatch, resolve_tier

TIERS = {
    "iw-f": TierMatch("iw-f", ("fast",), ("key-f",)),
    "iw-n": TierMatch("iw-n"),
    "niw": TierMatch("niw", ("batch",), ("key-b",)),
}
SERVED = ["iw-f", "iw-n", "niw"]


@pytest.mark.parametrize(
    ("header", "key", "expected"),
    [
        ("iw-n", None, "iw-n"),  # the tier's own name
        ("fast", None, "iw-f"),  # a value the tier lists
        ("batch", "key-f", "niw"),  # the header wins over the key
        (None, "key-b", "niw"),
        (None, "unknown-key", "iw-f"),  # the model's first tier
        (None, None, "iw-f"),
    ],
)
def test_resolve_tier(header: str | None, key: str | None, expected: str) -> None:
    assert resolve_tier(header, key, SERVED, TIERS) == expected


def test_a_tier_the_model_does_not_serve_is_refused_naming_the_allowed_ones() -> None:
    with pytest.raises(TierError, match="use one of iw-f, iw-n") as err:
        resolve_tier("niw", None, ["iw-f", "iw-n"], TIERS)
    assert "x-sageserve-tier" in str(err.value)
