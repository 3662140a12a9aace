"""The order an instance admits waiting interactive requests in (dispatch.instance_order),
as tables.

Why: with IW-F (1 s TTFT) and IW-N (60 s) on one instance, FCFS treats them alike and IW-F
misses its SLO under load (SageServe v3 §7.2.6, Fig. 15); EDF, PF and DPA are the paper's
orders (§6.5), and these pin each of them, DPA's six buckets exactly as the paper orders
them, and the priority vLLM is sent for each.
"""

from __future__ import annotations

import pytest

from sageserve.core.types import IW_F, IW_N, NIW
from sageserve.dispatch.instance_order import (
    EDF_BATCH_PRIORITY,
    LAST_RANK,
    InstanceScheduling,
    OrderPolicy,
    Waiting,
    engine_priority,
    order,
    waiting_of,
)

FCFS = InstanceScheduling(OrderPolicy.FCFS)
EDF = InstanceScheduling(OrderPolicy.EDF)
PF = InstanceScheduling(OrderPolicy.PF)
DPA = InstanceScheduling(OrderPolicy.DPA, expired_after_s=10.0, urgent_within_s=2.0)


def f(arrival: float) -> Waiting:
    """An IW-F request (1 s TTFT SLO, rank 0)."""
    return Waiting(arrival, arrival + 1.0, 0)


def n(arrival: float) -> Waiting:
    """An IW-N request (60 s TTFT SLO, rank 1)."""
    return Waiting(arrival, arrival + 60.0, 1)


def batch(arrival: float) -> Waiting:
    """A promoted batch request (no TTFT deadline)."""
    return Waiting(arrival, float("inf"), LAST_RANK)


@pytest.mark.parametrize(
    ("name", "rule", "now", "queue", "want"),
    [
        ("fcfs keeps arrival order", FCFS, 100.0, [n(90), f(95), n(96), f(99)], [0, 1, 2, 3]),
        (
            "fcfs: a preempted request first",
            FCFS,
            100.0,
            [f(90), n(80)._replace(started=True)],
            [1, 0],
        ),
        # EDF: deadlines 150, 96, 156, 100 → IW-F 95 (expired) first, then 99, then IW-N
        ("edf by deadline, expired first", EDF, 100.0, [n(90), f(95), n(96), f(99)], [1, 3, 0, 2]),
        ("edf: IW-F ahead of an IW-N arriving at once", EDF, 0.0, [n(0), f(0)], [1, 0]),
        # an IW-N request 61 s old (expired) goes ahead of a fresh IW-F request
        ("edf: expired IW-N before a live IW-F", EDF, 61.5, [f(61), n(0)], [1, 0]),
        ("edf: batch after every interactive", EDF, 0.0, [batch(-500), n(0)], [1, 0]),
        (
            "edf: equal deadlines by arrival",
            EDF,
            0.0,
            [Waiting(2, 10, 1), Waiting(1, 10, 0)],
            [1, 0],
        ),
        ("pf: every IW-F first, FCFS inside", PF, 100.0, [n(0), f(99), n(1), f(98)], [3, 1, 0, 2]),
        ("pf: batch after IW-N", PF, 100.0, [batch(0), n(99)], [1, 0]),
        ("pf: a preempted IW-N first", PF, 100.0, [f(99), n(0)._replace(started=True)], [1, 0]),
    ],
)
def test_order(
    name: str, rule: InstanceScheduling, now: float, queue: list[Waiting], want: list[int]
) -> None:
    assert order(rule, now, queue) == want, name


# DPA at now = 100, τ_n = 10, τ_p = 2: one request per bucket, queued in reverse order.
DPA_BUCKETS = [
    ("recently expired IW-F (d = -5)", f(94)),  # deadline 95
    ("non-urgent IW-N (d = 30)", n(70)),  # deadline 130
    ("non-urgent IW-F (d = 2.5; only with a longer SLO)", Waiting(99.5, 102.5, 0)),
    ("urgent IW-N (d = 1)", n(41)),  # deadline 101
    ("urgent IW-F (d = 0.5)", f(99.5)),  # deadline 100.5
    ("severely expired IW-N (d = -20)", n(20)),  # deadline 80
]


def test_dpa_orders_the_six_buckets_as_the_paper() -> None:
    got = order(DPA, 100.0, [w for _, w in DPA_BUCKETS])
    assert [DPA_BUCKETS[i][0] for i in got] == [
        "severely expired IW-N (d = -20)",
        "urgent IW-F (d = 0.5)",
        "urgent IW-N (d = 1)",
        "non-urgent IW-F (d = 2.5; only with a longer SLO)",
        "non-urgent IW-N (d = 30)",
        "recently expired IW-F (d = -5)",
    ]


@pytest.mark.parametrize(
    ("name", "now", "queue", "want"),
    [
        # bucket edges: d = -τ_n is recently expired, d just under it severely
        ("edge -τ_n", 100.0, [f(89), Waiting(88.9, 89.9, 0)], [1, 0]),
        # d = 0 is urgent (not expired), d = τ_p urgent, just above non-urgent
        ("edge 0 and τ_p", 100.0, [Waiting(40.1, 102.1, 1), n(42), n(40)], [2, 1, 0]),
        # two severely expired: the more expired first, whatever the tier
        ("severely expired by lateness", 100.0, [f(85), n(10)], [1, 0]),
        # urgent: IW-F first even if it arrived later
        ("urgent by tier", 100.0, [n(41), f(99.8)], [1, 0]),
        # non-urgent IW-N stays behind non-urgent IW-F arriving later
        ("non-urgent by tier", 100.0, [n(90), Waiting(99.9, 105, 0)], [1, 0]),
        # promoted batch (no deadline) is non-urgent and ranks last there, before the
        # recently expired
        ("batch among non-urgent", 100.0, [f(95), batch(0), n(90)], [2, 1, 0]),
        ("a preempted request first", 100.0, [n(20), n(95)._replace(started=True)], [1, 0]),
    ],
)
def test_dpa_edges(name: str, now: float, queue: list[Waiting], want: list[int]) -> None:
    assert order(DPA, now, queue) == want, name


@pytest.mark.parametrize(
    ("tier", "arrival", "want"),
    [
        (IW_F, 10.0, Waiting(10.0, 11.0, 0)),
        (IW_N, 10.0, Waiting(10.0, 70.0, 1)),
        (NIW, 10.0, Waiting(10.0, float("inf"), LAST_RANK)),
    ],
)
def test_waiting_of_reads_the_tiers_slo_and_priority(tier, arrival, want) -> None:  # type: ignore[no-untyped-def]
    assert waiting_of(tier, arrival) == want


@pytest.mark.parametrize(
    ("rule", "w", "want"),
    [
        (FCFS, f(0), None),  # the engine runs fcfs: no priority sent
        (PF, f(0), 0),
        (PF, n(0), 1),
        (PF, batch(0), LAST_RANK),
        (DPA, n(0), 1),  # DPA is sent as PF: a number cannot follow d_r over time
        (EDF, f(1_700_000_000.0), 1_700_000_001_000),
        (EDF, n(1_700_000_000.0), 1_700_000_060_000),
        (EDF, batch(0), EDF_BATCH_PRIORITY),
    ],
)
def test_engine_priority(rule: InstanceScheduling, w: Waiting, want: int | None) -> None:
    assert engine_priority(rule, w) == want


def test_edf_engine_priorities_order_as_edf() -> None:
    """vLLM serves the lowest priority first, ties by arrival: EDF's order exactly."""
    queue = [n(90), f(95), n(96), f(99), batch(0)]
    by_engine = sorted(
        range(len(queue)), key=lambda i: (engine_priority(EDF, queue[i]), queue[i].arrival)
    )
    assert by_engine == order(EDF, 100.0, queue)
