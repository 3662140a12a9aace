"""One test per SageServe routing / queueing / scheduling rule (digest §3)."""

from __future__ import annotations

from sageserve.core.types import IW_F, IW_N, NIW
from sageserve.dispatch import (
    BatchQueueManager,
    pick_deployment,
    pick_instance,
    pick_region,
    release_count,
    scheduler_priority,
)
from sageserve.dispatch.region_router import SpillLedger, route_region


def test_router_takes_the_first_preferred_region_under_70_percent() -> None:
    # home region is full, the next one in preference order is under the threshold
    assert pick_region([("east", 0.9), ("central", 0.65), ("west", 0.1)]) == "central"


def test_router_keeps_the_home_region_when_it_is_under_70_percent() -> None:
    assert pick_region([("east", 0.69), ("west", 0.0)]) == "east"


def test_router_falls_back_to_the_least_loaded_region_when_all_are_over() -> None:
    assert pick_region([("east", 0.95), ("central", 0.8), ("west", 0.85)]) == "central"


def test_in_region_the_least_loaded_deployment_wins() -> None:
    assert pick_deployment([("h100", 0.6), ("a100", 0.4)]) == "a100"


def test_in_deployment_the_instance_with_fewest_remaining_tokens_wins() -> None:
    assert pick_instance([("i1", 5000.0), ("i2", 120.0), ("i3", 121.0)]) == "i2"


def test_queue_manager_releases_one_request_under_60_percent() -> None:
    assert release_count(0.55) == 1


def test_queue_manager_releases_two_requests_under_50_percent() -> None:
    assert release_count(0.49) == 2


def test_queue_manager_releases_nothing_at_or_above_60_percent() -> None:
    assert release_count(0.60) == 0
    qm: BatchQueueManager[str] = BatchQueueManager()
    qm.submit("m", "a", 0.0)
    assert qm.on_signal("m", 0.75) == []
    assert qm.pending("m") == 1


def test_queue_manager_releases_fifo_per_model() -> None:
    qm: BatchQueueManager[str] = BatchQueueManager()
    for i, item in enumerate(["a", "b", "c"]):
        qm.submit("m", item, float(i))
    qm.submit("other", "x", 0.0)
    assert qm.on_signal("m", 0.3) == ["a", "b"]
    assert qm.on_signal("m", 0.55) == ["c"]
    assert qm.pending("other") == 1


def test_batch_older_than_10_hours_is_released_regardless_of_load() -> None:
    qm: BatchQueueManager[str] = BatchQueueManager()
    qm.submit("m", "old", 0.0)
    qm.submit("m", "young", 5 * 3600.0)
    assert qm.pop_aged(10 * 3600.0 + 1) == [("m", "old")]
    assert qm.pending("m") == 1


def test_interactive_requests_get_priority_0() -> None:
    assert scheduler_priority(IW_F, 0.0) == 0
    assert scheduler_priority(IW_N, 50 * 3600.0) == 0


def test_batch_requests_get_priority_1_until_10_hours_then_0() -> None:
    assert scheduler_priority(NIW, 0.0) == 1
    assert scheduler_priority(NIW, 10 * 3600.0 - 1) == 1
    assert scheduler_priority(NIW, 10 * 3600.0 + 1) == 0


# ---- spill-over bounds from the plan (route_region) -------------------------------------

REGIONS = ("east", "west")


def _route_many(bounds: dict[str, dict[str, float]] | None, n: int = 200) -> dict[str, int]:
    """`n` requests of 100 tokens from east, with east above 70 % and west idle."""
    ledger = SpillLedger()
    sent = {"east": 0, "west": 0}
    for i in range(n):
        chosen = route_region(
            "m", "east", [("east", 0.9), ("west", 0.1)], str, 100.0, float(i), ledger, bounds
        )
        sent[chosen] += 1
    return sent


def test_without_plan_weights_an_overloaded_region_sends_everything_away() -> None:
    assert _route_many(None) == {"east": 0, "west": 200}


def test_plan_weights_bound_the_share_a_region_sends_elsewhere() -> None:
    sent = _route_many({"east": {"west": 0.25}})
    assert 0.23 <= sent["west"] / 200 <= 0.26


def test_a_region_the_plan_expects_to_serve_itself_keeps_its_requests() -> None:
    # the plan bounds west's spill only; east has no planned excess
    assert _route_many({"west": {"east": 0.5}}) == {"east": 200, "west": 0}


def test_a_home_region_without_a_ready_instance_is_not_bounded() -> None:
    ledger = SpillLedger()
    chosen = route_region("m", "east", [("west", 0.1)], str, 1.0, 0.0, ledger, {"east": {}})
    assert chosen == "west"


def test_the_ledger_forgets_old_traffic() -> None:
    ledger = SpillLedger(memory_s=60.0)
    ledger.record("m", "east", "west", 100.0, 0.0)
    ledger.record("m", "east", "east", 100.0, 600.0)
    assert ledger.share("m", "east", "west", 600.0) < 0.01
