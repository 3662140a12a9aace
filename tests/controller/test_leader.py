"""Who may hold the operator's Lease."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sageserve.controller.leader import may_take

NOW = datetime(2026, 11, 21, 12, 0, tzinfo=UTC)


def lease(holder: str | None, renewed: datetime | None, duration: int = 15) -> dict:
    spec: dict = {"leaseDurationSeconds": duration}
    if holder:
        spec["holderIdentity"] = holder
    if renewed:
        spec["renewTime"] = renewed.isoformat().replace("+00:00", "Z")
    return {"spec": spec}


def test_a_free_or_own_lease_may_be_taken() -> None:
    assert may_take(lease(None, None), "a", NOW)
    assert may_take(lease("a", NOW), "a", NOW)


def test_another_replicas_fresh_lease_may_not_be_taken() -> None:
    assert not may_take(lease("b", NOW - timedelta(seconds=10)), "a", NOW)


def test_an_expired_lease_is_taken_over() -> None:
    assert may_take(lease("b", NOW - timedelta(seconds=16)), "a", NOW)
    assert not may_take(lease("b", NOW - timedelta(seconds=16), duration=60), "a", NOW)
