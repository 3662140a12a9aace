"""Per-tenant rate limits (`dispatch.rate_limit`): one bucket's arithmetic, then whole arrival
sequences as tables (the way Kubernetes tests its HPA replica calculator), then
properties over any arrival sequence."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sageserve.dispatch.rate_limit import (
    WINDOW_SECONDS,
    Limits,
    RateLimiter,
    Verdict,
    duration_text,
    gcra,
    rate_limit_headers,
    retry_after_header,
)


@pytest.mark.parametrize(
    ("name", "tat", "now", "cost", "per_minute", "allowed", "retry", "remaining", "reset"),
    [
        ("full bucket", 0.0, 0.0, 1, 60, True, 0.0, 59, 1.0),
        ("a TAT long past is a full bucket", -500.0, 0.0, 1, 60, True, 0.0, 59, 1.0),
        ("empty bucket waits one interval", 60.0, 0.0, 1, 60, False, 1.0, 0, 60.0),
        ("half an interval short", 59.5, 0.0, 1, 60, False, 0.5, 0.5, 59.5),
        ("token-weighted cost", 0.0, 0.0, 600, 1000, True, 0.0, 400, 36.0),
        ("tokens short of the cost", 36.0, 0.0, 600, 1000, False, 12.0, 400, 36.0),
        ("cost of the whole budget", 0.0, 0.0, 1000, 1000, True, 0.0, 0, 60.0),
        ("cost over the whole budget never fits", 0.0, 0.0, 1001, 1000, False, math.inf, 1000, 0),
    ],
)
def test_one_bucket(
    name: str,
    tat: float,
    now: float,
    cost: float,
    per_minute: int,
    allowed: bool,
    retry: float,
    remaining: float,
    reset: float,
) -> None:
    step = gcra(tat, now, cost, per_minute)
    assert step.allowed is allowed, name
    assert step.retry_after == pytest.approx(retry), name
    assert step.remaining == pytest.approx(remaining), name
    assert step.reset == pytest.approx(reset), name
    if not allowed:
        assert step.tat == tat, "a refused request charges nothing"


@dataclass(frozen=True)
class Arrival:
    t: float
    key: str = "k1"
    tokens: float = 10.0
    namespace: str = "team-a"


@dataclass(frozen=True)
class Case:
    name: str
    limits: Limits
    arrivals: tuple[Arrival, ...]
    #: per arrival: None when admitted, else the limit that refused it and its retry-after
    expect: tuple[tuple[str, float] | None, ...]


RPM3 = Limits(requests_per_minute=3)
A0 = Arrival(0.0)
CASES = [
    Case("a burst of the limit, then refused", RPM3, (A0,) * 4, (None,) * 3 + (("requests", 20),)),
    Case(
        "one request refills every 60 s / limit",
        RPM3,
        (A0, A0, A0, Arrival(20.0), Arrival(20.0), Arrival(39.0), Arrival(40.0)),
        (None, None, None, None, ("requests", 20), ("requests", 1), None),
    ),
    Case(
        "a refused retry does not push the next one later",
        RPM3,
        (A0, A0, A0, Arrival(1.0), Arrival(5.0), Arrival(19.0), Arrival(20.0)),
        (None, None, None, ("requests", 19), ("requests", 15), ("requests", 1), None),
    ),
    Case(
        "a quiet minute refills the whole burst, not more",
        RPM3,
        (A0, A0, A0, *(Arrival(600.0),) * 4),
        (None, None, None, None, None, None, ("requests", 20)),
    ),
    Case(
        "tokens: a large max_tokens spends most of the budget",
        Limits(tokens_per_minute=1000),
        (Arrival(0.0, tokens=600), Arrival(0.0, tokens=600), Arrival(12.0, tokens=600)),
        (None, ("tokens", 12), None),
    ),
    Case(
        "tokens: a request over the whole budget is never admitted",
        Limits(tokens_per_minute=1000),
        (Arrival(0.0, tokens=5000), Arrival(3600.0, tokens=5000), Arrival(3600.0, tokens=100)),
        (("tokens", math.inf), ("tokens", math.inf), None),
    ),
    Case(
        "both limits: refused by tokens charges no request",
        Limits(requests_per_minute=2, tokens_per_minute=1000),
        (Arrival(0.0, tokens=900), Arrival(0.0, tokens=900), Arrival(0.0, tokens=100)),
        (None, ("tokens", 48), None),
    ),
    Case(
        "both limits: the longest wait is the one told",
        Limits(requests_per_minute=1, tokens_per_minute=1000),
        (Arrival(0.0, tokens=600), Arrival(0.0, tokens=600)),
        (None, ("requests", 60)),
    ),
    Case(
        "per key: a second key of the tier has its own budget",
        RPM3,
        (A0, A0, A0, Arrival(0.0, "k2"), Arrival(0.0, "k1")),
        (None, None, None, None, ("requests", 20)),
    ),
    Case(
        "per tier: the tier's keys share one budget",
        Limits(requests_per_minute=3, per_tier=True),
        (A0, A0, A0, Arrival(0.0, "k2")),
        (None, None, None, ("requests", 20)),
    ),
    Case(
        "per tier: another tenant's tier of the same name is its own",
        Limits(requests_per_minute=3, per_tier=True),
        (A0, A0, A0, Arrival(0.0, "k1", namespace="team-b")),
        (None, None, None, None),
    ),
    Case("no limits: everything passes", Limits(), (A0,) * 100, (None,) * 100),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_arrival_sequences(case: Case) -> None:
    limiter = RateLimiter()
    got: list[tuple[str, float] | None] = []
    for a in case.arrivals:
        verdict = limiter.admit(a.namespace, "iw-n", a.key, case.limits, a.tokens, a.t)
        by = verdict.refused_by
        got.append(None if by is None else (by.kind, verdict.retry_after))
    assert len(got) == len(case.expect)
    for i, (g, e) in enumerate(zip(got, case.expect, strict=True)):
        if e is None or g is None:
            assert g == e, (case.name, i, got)
        else:
            assert g[0] == e[0] and g[1] == pytest.approx(e[1]), (case.name, i, got)


def test_the_least_recently_used_bucket_is_evicted_past_the_cap() -> None:
    limiter = RateLimiter(max_buckets=2)
    one = Limits(requests_per_minute=1)

    def admit(key: str) -> bool:
        return limiter.admit("ns", "t", key, one, 0.0, 0.0).allowed

    assert admit("a") and not admit("a")
    assert admit("b")
    assert not admit("a")  # refused: charges nothing, and does not refresh a
    assert admit("c")  # a was least recently charged: evicted
    assert len(limiter) == 2
    assert admit("a"), "an evicted bucket starts full (eviction errs towards admitting)"
    assert not admit("c"), "c, charged more recently than b, was kept"
    with pytest.raises(ValueError, match="max_buckets"):
        RateLimiter(max_buckets=0)


arrivals = st.lists(
    st.tuples(
        st.floats(min_value=0.0, max_value=30.0, allow_nan=False),
        st.integers(min_value=0, max_value=400),
    ),
    max_size=200,
)


@settings(max_examples=200, deadline=None)
@given(arrivals, st.integers(min_value=1, max_value=1000))
def test_admitted_cost_in_any_minute_is_at_most_limit_plus_burst(
    sequence: list[tuple[float, int]], per_minute: int
) -> None:
    """Over any arrival sequence and any 60 s window (starting at an arrival, where the
    worst windows start), admitted cost <= limit + burst (burst = one minute's budget)."""
    limiter = RateLimiter()
    limits = Limits(tokens_per_minute=per_minute)
    now, admitted = 0.0, []
    for gap, cost in sequence:
        now += gap
        if limiter.admit("ns", "t", "k", limits, float(cost), now).allowed:
            admitted.append((now, cost))
    bound = per_minute + per_minute  # limit + burst
    for start, _ in admitted:
        spent = sum(c for t, c in admitted if start <= t <= start + WINDOW_SECONDS)
        assert spent <= bound * (1 + 1e-9)


@settings(max_examples=200, deadline=None)
@given(arrivals, st.integers(min_value=1, max_value=1000))
def test_retry_after_is_honest(sequence: list[tuple[float, int]], per_minute: int) -> None:
    """A refused request sent again after its Retry-After (nothing else in between) is
    admitted, unless it can never be; sent a little before, it is refused."""
    limiter = RateLimiter()
    limits = Limits(tokens_per_minute=per_minute)
    now = 0.0
    for gap, cost in sequence:
        now += gap
        verdict = limiter.admit("ns", "t", "k", limits, float(cost), now)
        if verdict.allowed:
            continue
        wait = verdict.retry_after
        if math.isinf(wait):
            assert cost > per_minute
            continue
        if wait > 1e-3:
            early = limiter.admit("ns", "t", "k", limits, float(cost), now + wait - 1e-3)
            assert not early.allowed
        assert limiter.admit("ns", "t", "k", limits, float(cost), now + wait).allowed
        now += wait


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0.0, "0ms"),
        (0.02, "20ms"),
        (1.0, "1s"),
        (1.5, "1.5s"),
        (59.9994, "59.999s"),
        (360.0, "6m0s"),
    ],
)
def test_duration_text_reads_as_openai_writes_it(seconds: float, text: str) -> None:
    assert duration_text(seconds) == text


@pytest.mark.parametrize(
    ("seconds", "header"), [(0.0, "1"), (0.2, "1"), (1.0, "1"), (19.01, "20"), (math.inf, "60")]
)
def test_retry_after_is_whole_seconds_at_least_one(seconds: float, header: str) -> None:
    assert retry_after_header(seconds) == header


def test_headers_name_each_limit_the_tier_sets() -> None:
    limiter = RateLimiter()
    both = Limits(requests_per_minute=60, tokens_per_minute=1000)
    verdict = limiter.admit("ns", "t", "k", both, 250.0, 0.0)
    assert rate_limit_headers(verdict) == {
        "x-ratelimit-limit-requests": "60",
        "x-ratelimit-remaining-requests": "59",
        "x-ratelimit-reset-requests": "1s",
        "x-ratelimit-limit-tokens": "1000",
        "x-ratelimit-remaining-tokens": "750",
        "x-ratelimit-reset-tokens": "15s",
    }
    assert rate_limit_headers(Verdict()) == {}
