"""The batch release cadence, the EMU it is signalled with, and the hold of requests for a
model with nothing serving: one rule each, for the router and the simulator."""

from __future__ import annotations

import pytest

from sageserve.dispatch.hold import HOLD_S, MAX_HELD, Hold, admit, hold_until, keep
from sageserve.dispatch.queue_manager import (
    DEFAULT_RELEASE_RULES,
    PROMOTED_PER_SIGNAL,
    SIGNAL_S,
    BatchQueueManager,
    estimated_emu,
    release_count,
)


@pytest.mark.parametrize(
    ("read", "sent", "capacity", "want"),
    [
        (0.40, 0.0, 100_000.0, 0.40),  # nothing sent since the reading
        (0.40, 10_000.0, 100_000.0, 0.50),  # a release raises the estimate at once
        (0.40, 30_000.0, 100_000.0, 0.70),
        (0.95, 20_000.0, 100_000.0, 1.15),  # not capped: more sent than fits
        (0.40, 10_000.0, 0.0, 0.40),  # capacity unknown: the reading alone
    ],
)
def test_the_estimated_emu_adds_what_was_sent_since_the_reading(
    read: float, sent: float, capacity: float, want: float
) -> None:
    assert estimated_emu(read, sent, capacity) == pytest.approx(want)


def test_a_release_limits_itself_through_the_estimate() -> None:
    # an idle endpoint (EMU 0.45) with 100k KV tokens, requests of 4k tokens each: the
    # paper's rule releases 2 while the estimate is under 50 %, then 1 under 60 %, then 0
    read, cap, sent, released = 0.45, 100_000.0, 0.0, []
    for _ in range(10):
        n = release_count(estimated_emu(read, sent, cap))
        released.append(n)
        sent += n * 4_000
    assert released == [2, 1, 1, 0, 0, 0, 0, 0, 0, 0]


@pytest.mark.parametrize(
    ("held", "max_held", "want"),
    [(0, 1000, Hold.HOLD), (999, 1000, Hold.HOLD), (1000, 1000, Hold.BUSY), (0, 0, Hold.BUSY)],
)
def test_a_request_is_held_until_the_bound_then_refused_busy(
    held: int, max_held: int, want: Hold
) -> None:
    assert admit(held, max_held) is want


@pytest.mark.parametrize(
    ("waited", "want"), [(0.0, Hold.HOLD), (119.9, Hold.HOLD), (120.0, Hold.GIVE_UP)]
)
def test_a_held_request_gives_up_after_the_hold(waited: float, want: Hold) -> None:
    assert keep(waited) is want
    assert keep(waited, hold_s=120.0) is want


def test_the_bounds_are_the_routers_documented_defaults() -> None:
    assert (HOLD_S, MAX_HELD, SIGNAL_S, PROMOTED_PER_SIGNAL) == (120.0, 1000, 1.0, 16)
    assert hold_until(50.0) == 170.0
    assert admit(MAX_HELD - 1) is Hold.HOLD and admit(MAX_HELD) is Hold.BUSY


def test_promotions_are_bounded_per_round_in_promotion_order() -> None:
    qm: BatchQueueManager[int] = BatchQueueManager(promotion_margin_s=0.0)
    for i in range(40):
        qm.submit("m", i, arrival=0.0, deadline=100.0 + i)  # promoted at its deadline
    assert qm.pop_aged(1_000.0, PROMOTED_PER_SIGNAL) == [("m", i) for i in range(16)]
    assert qm.pop_aged(1_000.0, PROMOTED_PER_SIGNAL) == [("m", i) for i in range(16, 32)]
    assert qm.pop_aged(1_000.0) == [("m", i) for i in range(32, 40)]  # None: all due
    assert qm.pending() == 0


@pytest.mark.parametrize(
    ("emu", "waiting", "released"),
    [
        (0.10, 0, 2),  # a trough: the paper's 2 under 50 %
        (0.10, 1, 0),  # requests wait for admission: out of time, whatever the EMU
        (0.55, 0, 1),
        (0.55, 7, 0),
        (0.80, 0, 0),  # busy by memory
    ],
)
def test_an_endpoint_with_requests_waiting_takes_no_batch_work(
    emu: float, waiting: int, released: int
) -> None:
    assert release_count(emu, DEFAULT_RELEASE_RULES, waiting) == released
