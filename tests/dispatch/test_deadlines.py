"""Earliest deadline first, promotion by slack and the deadline ledger (dispatch.deadlines,
dispatch.queue_manager), as tables and one property.

Why: the Queue Manager releases batch work only into troughs (SageServe §6.1–§6.2) and
promoted it at a fixed age, which neither orders work by deadline nor says what rate the
queue needs; these pin the order, the promotion rule and the rate the scaling signal reads.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sageserve.dispatch.deadlines import (
    DeadlineLedger,
    bucketed,
    capacity_at_max,
    deadline_risk,
    required_tps,
)
from sageserve.dispatch.queue_manager import BatchQueueManager, promotion_time

# ---- the required rate (hand-computed) --------------------------------------------------


@pytest.mark.parametrize(
    ("buckets", "now", "want"),
    [
        ([], 0.0, 0.0),  # nothing queued
        ([(600.0, 6000.0)], 0.0, 10.0),  # one bucket: 6000 tokens in 600 s
        ([(600.0, 6000.0)], 300.0, 20.0),  # the same, half the time left
        # several: the earliest bucket binds (2400 in 120 s), not the total (3000 in 600 s)
        ([(120.0, 2400.0), (600.0, 600.0)], 0.0, 20.0),
        # several: the total binds (600 in 60 s = 10, 6600 in 600 s = 11)
        ([(60.0, 600.0), (600.0, 6000.0)], 0.0, 11.0),
        ([(600.0, 6000.0), (60.0, 600.0)], 0.0, 11.0),  # any order in
        # one already late: due one bucket (60 s) from now, 300 / 60 = 5 < 6000 / 600
        ([(-60.0, 300.0), (600.0, 5700.0)], 0.0, 10.0),
        # late and dominant: 1200 tokens due 30 s ago count as due in 60 s
        ([(0.0, 1200.0)], 30.0, 20.0),
    ],
)
def test_required_rate_is_the_largest_cumulative_demand_over_time_left(
    buckets: list[tuple[float, float]], now: float, want: float
) -> None:
    assert required_tps(buckets, now) == pytest.approx(want)


@pytest.mark.parametrize(
    ("buckets", "now", "capacity", "until", "shortfall"),
    [
        ([], 0.0, 0.0, None, 0.0),  # nothing queued: nothing at risk
        ([(600.0, 6000.0)], 0.0, 10.0, None, 0.0),  # exactly enough
        ([(600.0, 6000.0)], 0.0, 9.0, 600.0, 600.0),  # 5400 served by 600 s, 600 short
        # the earliest bucket is short (2400 > 10 x 120); all work due by 600 s fits
        ([(120.0, 2400.0), (600.0, 600.0)], 0.0, 10.0, 120.0, 1200.0),
        # both prefixes short: everything due by the later deadline is at risk
        ([(60.0, 600.0), (600.0, 6000.0)], 0.0, 10.0, 600.0, 600.0),
        # already late: no capacity serves work due before now
        ([(-60.0, 300.0)], 0.0, 1e9, -60.0, 300.0),
        ([(600.0, 100.0)], 0.0, 0.0, 600.0, 100.0),  # no capacity at all
    ],
)
def test_deadline_risk_names_the_latest_deadline_that_cannot_be_met_and_the_shortfall(
    buckets: list[tuple[float, float]],
    now: float,
    capacity: float,
    until: float | None,
    shortfall: float,
) -> None:
    risk = deadline_risk(buckets, now, capacity, min_window_s=0.0)
    if until is None:
        assert risk is None
        assert required_tps(buckets, now, min_window_s=1e-9) <= capacity + 1e-9
        return
    assert risk is not None
    assert risk.until_s == until
    assert risk.shortfall_tokens == pytest.approx(shortfall)
    assert risk.shortfall_tps > 0 or math.isinf(risk.need_tps) or capacity == 0


@given(
    st.lists(st.tuples(st.floats(1.0, 86_400.0), st.floats(1.0, 1e6)), min_size=1, max_size=30),
    st.floats(0.1, 1e4),
)
@settings(max_examples=200, deadline=None)
def test_risk_is_none_exactly_when_the_required_rate_fits(
    buckets: list[tuple[float, float]], capacity: float
) -> None:
    need = required_tps(buckets, 0.0, min_window_s=0.0)
    risk = deadline_risk(buckets, 0.0, capacity, min_window_s=0.0)
    if need <= capacity * (1 - 1e-6):
        assert risk is None
    if need >= capacity * (1 + 1e-6):
        assert risk is not None and risk.need_tps == pytest.approx(need)


def test_ledger_buckets_by_deadline_and_reads_each_as_due_at_its_lower_edge() -> None:
    ledger = DeadlineLedger(60.0)
    ledger.add(119.0, 600)  # bucket [60, 120): due at 60, conservative
    ledger.add(61.0, 600)
    ledger.add(600.0, 4800)
    assert ledger.buckets() == [(60.0, 1200.0), (600.0, 4800.0)]
    assert ledger.required_tps(0.0) == pytest.approx(20.0)  # 1200 / 60
    ledger.remove(119.0, 600)
    ledger.remove(61.0, 600)
    assert ledger.buckets() == [(600.0, 4800.0)]
    assert ledger.tokens == 4800
    ledger.add(math.inf, 100)  # no deadline: not in the ledger
    assert ledger.tokens == 4800


def test_queue_keeps_the_ledger_up_to_date_on_submit_release_and_promotion() -> None:
    qm: BatchQueueManager[str] = BatchQueueManager(service_tps={"m": 10.0})
    qm.submit("m", "a", 0.0, deadline=3600.0, tokens=3600)
    qm.submit("m", "b", 0.0, deadline=7200.0, tokens=3600)
    assert qm.required_tps("m", 0.0) == pytest.approx(1.0)  # 3600 / 3600 = 7200 / 7200
    assert qm.on_signal("m", 0.55) == ["a"]
    assert qm.required_tps("m", 0.0) == pytest.approx(0.5)
    assert qm.required_tps("other", 0.0) == 0.0
    # b's slack: 7200 − 360 s of service − 1800 s of margin
    assert qm.pop_aged(5040.0 - 1) == []
    assert qm.pop_aged(5040.0 + 1) == [("m", "b")]
    assert qm.required_tps("m", 0.0) == 0.0 and qm.pending() == 0


# ---- earliest deadline first -------------------------------------------------------------


def test_release_takes_the_earliest_deadline_first_ties_by_arrival() -> None:
    qm: BatchQueueManager[str] = BatchQueueManager()
    qm.submit("m", "late", 0.0, deadline=900.0)
    qm.submit("m", "soon-second", 2.0, deadline=300.0)
    qm.submit("m", "soon-first", 1.0, deadline=300.0)
    qm.submit("m", "none", 0.5)  # no deadline: after every request that has one
    qm.submit("m", "middle", 3.0, deadline=600.0)
    assert qm.on_signal("m", 0.3) == ["soon-first", "soon-second"]
    assert qm.on_signal("m", 0.3) == ["middle", "late"]
    assert qm.on_signal("m", 0.55) == ["none"]
    assert qm.on_signal("m", 0.3) == []


def test_one_deadline_for_the_whole_tier_keeps_the_papers_arrival_order() -> None:
    qm: BatchQueueManager[int] = BatchQueueManager()
    for i in range(5):
        qm.submit("m", i, float(i), deadline=float(i) + 86400.0)
    assert [x for _ in range(3) for x in qm.on_signal("m", 0.3)] == [0, 1, 2, 3, 4]


# ---- promotion ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("deadline", "tokens", "service_tps", "margin", "promoted_after"),
    [
        (1000.0, 100, 10.0, 60.0, 930.0),  # 1000 − 10 s of service − 60 s of margin
        (1000.0, 100, 0.0, 60.0, 940.0),  # no service estimate: margin only
        (86400.0, 2000, 20.0, 1800.0, 84500.0),  # a 24 h deadline: far past 10 h
        (1000.0, 100, 10.0, None, math.inf),  # no margin: never promoted
    ],
)
def test_a_request_with_a_deadline_is_promoted_when_its_slack_runs_out(
    deadline: float,
    tokens: int,
    service_tps: float,
    margin: float | None,
    promoted_after: float,
) -> None:
    qm: BatchQueueManager[str] = BatchQueueManager(
        promotion_age_s=10.0,  # the age rule does not apply to it
        service_tps={"m": service_tps},
        promotion_margin_s=margin,
    )
    qm.submit("m", "x", 0.0, deadline=deadline, tokens=tokens)
    if math.isinf(promoted_after):
        assert qm.pop_aged(deadline * 2) == []
        return
    assert qm.pop_aged(promoted_after - 0.5) == []
    assert qm.pop_aged(promoted_after + 0.5) == [("m", "x")]
    assert qm.pending() == 0


def test_without_a_deadline_the_age_rule_holds_and_order_is_promotion_time() -> None:
    qm: BatchQueueManager[str] = BatchQueueManager(promotion_age_s=3600.0, promotion_margin_s=100.0)
    qm.submit("m", "aged", 0.0)  # promoted at 3600
    qm.submit("m", "due", 0.0, deadline=3000.0)  # promoted at 2900
    qm.submit("m", "far", 0.0, deadline=90000.0)
    assert qm.pop_aged(4000.0) == [("m", "due"), ("m", "aged")]
    assert qm.pending("m") == 1


@pytest.mark.parametrize(
    ("deadline", "tokens", "service_tps", "margin", "want"),
    [
        (10_000.0, 2000.0, 20.0, 1800.0, 10_000.0 - 100.0 - 1800.0),
        (10_000.0, 2000.0, 0.0, 1800.0, 10_000.0 - 1800.0),  # no rate: served at once
        (10_000.0, 0.0, 20.0, 0.0, 10_000.0),
        (100.0, 40_000.0, 20.0, 1800.0, 100.0 - 2000.0 - 1800.0),  # due already
    ],
)
def test_promotion_time_is_the_deadline_less_service_time_and_margin(
    deadline: float, tokens: float, service_tps: float, margin: float, want: float
) -> None:
    assert promotion_time(deadline, tokens, service_tps, margin) == want
    qm: BatchQueueManager[str] = BatchQueueManager(
        service_tps={"m": service_tps}, promotion_margin_s=margin
    )
    assert qm.promotion_at("m", 0.0, deadline, int(tokens)) == want


def test_work_bucketed_from_pairs_is_the_ledgers_buckets() -> None:
    work = [(125.0, 10.0), (61.0, 5.0), (179.9, 1.0), (60.0, 2.0), (math.inf, 7.0), (90.0, 0.0)]
    ledger = DeadlineLedger(60.0)
    for deadline, tokens in work:
        ledger.add(deadline, int(tokens))
    assert bucketed(work, 60.0) == ledger.buckets() == [(60.0, 7.0), (120.0, 11.0)]


def test_released_requests_are_not_promoted_and_drain_returns_the_rest() -> None:
    qm: BatchQueueManager[int] = BatchQueueManager(promotion_margin_s=0.0)
    for i in range(3000):  # enough to make the heaps compact
        qm.submit("m", i, 0.0, deadline=100.0 + i, tokens=10)
    released = [x for _ in range(1000) for x in qm.on_signal("m", 0.3)]
    assert released == list(range(2000))
    assert qm.pop_aged(2500.0) == [("m", i) for i in range(2000, 2400)]
    assert qm.drain() == list(range(2400, 3000))
    assert qm.pending() == 0 and qm.pop_aged(1e9) == []


# ---- property: EDF meets every deadline a constant capacity can meet ---------------------

_job = st.tuples(
    st.integers(0, 1000),  # arrival, s
    st.integers(1, 500),  # tokens
    st.integers(1, 2000),  # deadline after arrival, s
)


def _least_capacity(jobs: list[tuple[int, int, int]]) -> float:
    """The least constant rate at which some schedule meets every deadline (the processor
    demand criterion: the work released in [a, d] and due by d fits in d − a, for all
    a, d)."""
    need = 0.0
    for a, _w, _r in jobs:
        for a2, _w2, r2 in jobs:
            d = a2 + r2
            if d <= a:
                continue
            work = sum(w for x, w, r in jobs if x >= a and x + r <= d)
            need = max(need, work / (d - a))
    return need


@settings(max_examples=150, deadline=None)
@given(st.lists(_job, min_size=1, max_size=14), st.floats(1.0, 2.0))
def test_edf_from_the_queue_meets_every_deadline_at_a_feasible_capacity(
    jobs: list[tuple[int, int, int]], headroom: float
) -> None:
    """Requests arrive, wait in the Queue Manager and one server takes the earliest
    deadline at every arrival and completion (the one it served goes back with what is
    left). At any capacity where the deadlines are feasible at all, every request finishes
    by its deadline: the queue's order is what makes it so."""
    capacity = _least_capacity(jobs) * headroom
    qm: BatchQueueManager[list[float]] = BatchQueueManager(
        rules=((1.0, 1),), promotion_age_s=None, promotion_margin_s=None
    )
    order = sorted(range(len(jobs)), key=lambda i: jobs[i][0])
    finished: dict[int, float] = {}
    t, k = 0.0, 0
    current: list[float] | None = None  # [job, tokens left]
    while len(finished) < len(jobs):
        while k < len(order) and jobs[order[k]][0] <= t:
            i = order[k]
            qm.submit("m", [float(i), float(jobs[i][1])], jobs[i][0], jobs[i][0] + jobs[i][2])
            k += 1
        if current is not None:  # back to the queue: an earlier deadline may have come
            i = int(current[0])
            qm.submit("m", current, jobs[i][0], jobs[i][0] + jobs[i][2])
        [current] = qm.on_signal("m", 0.0) or [None]
        next_arrival = jobs[order[k]][0] if k < len(order) else math.inf
        if current is None:
            t = next_arrival
            continue
        done = t + current[1] / capacity
        if done <= next_arrival:
            t = done
            finished[int(current[0])] = t
            current = None
        else:
            current[1] -= (next_arrival - t) * capacity
            t = next_arrival
    for i, (a, _w, r) in enumerate(jobs):
        assert finished[i] <= a + r + 1e-6 * (a + r)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.integers(60, 20000), st.integers(1, 5000)), min_size=1, max_size=30))
def test_serving_at_the_ledgers_rate_in_release_order_meets_every_deadline(
    queued: list[tuple[int, int]],
) -> None:
    """A queue at one instant, served one request after another in release order at the
    rate the ledger says it needs: every request finishes by its deadline (the ledger reads
    each bucket as due at its lower edge, so its rate is never too low)."""
    qm: BatchQueueManager[tuple[int, int]] = BatchQueueManager(
        rules=((1.0, 1),), promotion_age_s=None, promotion_margin_s=None
    )
    for deadline, tokens in queued:
        qm.submit("m", (deadline, tokens), 0.0, float(deadline), tokens)
    rate = qm.required_tps("m", 0.0)
    t = 0.0
    while qm.pending():
        [(deadline, tokens)] = qm.on_signal("m", 0.0)
        t += tokens / rate
        assert t <= deadline * (1 + 1e-9)


def test_capacity_at_max_sums_max_instances_over_regions() -> None:
    assert capacity_at_max(250.0, [4, 6, 0]) == 2500.0
    assert capacity_at_max(250.0, [-1, 2]) == 500.0  # a negative count adds nothing
    assert capacity_at_max(0.0, [4]) == 0.0
