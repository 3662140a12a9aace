"""The load anticipator's arithmetic (PreServe §4.3.1): admission, early finish, overrun,
the virtual add, the overload test; and that it never leaves [0, capacity]."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sageserve.dispatch.anticipator import LoadAnticipator

M = 1000  # KV capacity in tokens, as in the paper's U_i' = (U_i·M + (P + i)) / M


def _ant(horizon: int = 8) -> LoadAnticipator:
    return LoadAnticipator(M, horizon=horizon)


@pytest.mark.parametrize(
    ("case", "events", "now", "want"),
    [
        # admission: a request of P = 100, D = 3 holds P + i at its i-th iteration, i < D
        ("admitted", [("start", 1, 0, 100, 3)], 0, [0.100, 0.101, 0.102, 0, 0, 0, 0, 0]),
        # two requests add up
        (
            "two admitted",
            [("start", 1, 0, 100, 3), ("start", 2, 0, 50, 5)],
            0,
            [0.150, 0.152, 0.154, 0.053, 0.054, 0, 0, 0],
        ),
        # early finish (D̂ = 1 < D = 3): its projection [D̂, D) is subtracted at once
        ("early finish", [("start", 1, 0, 100, 3), ("finish", 1)], 1, [0.0] * 8),
        # three iterations later the same request holds P + 3, then P + 4, then is done
        ("later", [("start", 1, 0, 100, 5)], 3, [0.103, 0.104, 0, 0, 0, 0, 0, 0]),
        # overrun: P = 100, D = 10, still running at iteration 10: extended by 0.2 × 10 = 2
        ("overrun", [("start", 1, 0, 100, 10)], 10, [0.110, 0.111, 0, 0, 0, 0, 0, 0]),
        # and again at 12, by 0.2 × 12 → 3 (ceil of 2.4)
        ("overrun twice", [("start", 1, 0, 100, 10)], 12, [0.112, 0.113, 0.114, 0, 0, 0, 0, 0]),
        # a waiting request is projected as starting at the next iteration
        ("waiting", [("enqueue", 1, 300, 2)], 5, [0.300, 0.301, 0, 0, 0, 0, 0, 0]),
        # more than the capacity is "full", never above
        ("full", [("start", 1, 0, 998, 5)], 0, [0.998, 0.999, 1.0, 1.0, 1.0, 0, 0, 0]),
    ],
)
def test_projection_follows_the_papers_map_updates(
    case: str, events: list[tuple[str | int, ...]], now: int, want: list[float]
) -> None:
    ant = _ant()
    for kind, *args in events:
        a = [int(x) for x in args]
        if kind == "start":
            ant.start(a[0], a[1], a[2], a[3])
        elif kind == "enqueue":
            ant.enqueue(a[0], a[1], a[2])
        else:
            ant.finish(a[0])
    assert ant.projection(now) == pytest.approx(want), case


def test_the_virtual_add_changes_nothing_and_gives_the_routers_peak() -> None:
    ant = _ant(horizon=100)
    ant.start(1, 0, 700, 50)  # 0.700 ... 0.749
    before = ant.projection(0)
    # a request of 60 + up to 29 tokens: peak at iteration 29: 0.729 + 0.089
    assert ant.peak(0, 60, 30) == pytest.approx((700 + 29 + 60 + 29) / M)
    assert ant.projection(0) == before
    # PreServe §4.3.3: memory penalty = max(0, U_k - 0.8) × M = 18 tokens
    assert max(0.0, ant.peak(0, 60, 30) - 0.8) * M == pytest.approx(18)


def test_router_loads_count_queued_prompts_and_predicted_decode_left() -> None:
    ant = _ant()
    ant.start(1, 0, 100, 40)
    ant.enqueue(2, 500, 30)
    assert ant.requests == 2
    assert ant.queued_prefill_tokens == 500
    assert ant.predicted_decode_tokens(10) == (40 - 10) + 30
    # past its prediction the running request counts its extension, never less than 0
    assert ant.predicted_decode_tokens(41) == math.ceil(0.2 * 40) - 1 + 30


@pytest.mark.parametrize(
    ("requests", "overloaded"),
    [
        # PreServe §4.3.2: above 95 % in more than 10 of the next 100 iterations
        ([(940, 30)], True),  # above 950 from iteration 11 to 29: 19 iterations
        ([(940, 21)], False),  # iterations 11..20: exactly 10, not more than 10
        ([(500, 100)], False),
    ],
)
def test_overload_is_more_than_ten_percent_of_the_lookahead_above_95(
    requests: list[tuple[int, int]], overloaded: bool
) -> None:
    ant = LoadAnticipator(M)
    for i, (ctx, d) in enumerate(requests):
        ant.start(i, 0, ctx, d)
    assert ant.overloaded(0) is overloaded


def test_bad_settings_are_refused_by_name() -> None:
    with pytest.raises(ValueError, match="capacity_tokens"):
        LoadAnticipator(0)
    with pytest.raises(ValueError, match="horizon"):
        LoadAnticipator(10, horizon=0)


# ---- property: the incremental map equals a from-scratch one, within [0, capacity] --------


class _Reference:
    """The paper's map rebuilt from every request at each query (slow, obvious)."""

    def __init__(self, cap: int, horizon: int) -> None:
        self.cap, self.h = cap, horizon
        self.wait: dict[int, tuple[int, int]] = {}
        self.run: dict[int, list[int]] = {}  # start, context, end
        self.now = 0

    def advance(self, now: int) -> None:
        self.now = max(self.now, now)
        for r in self.run.values():
            while r[2] <= self.now:
                r[2] += max(1, math.ceil(0.2 * (r[2] - r[0])))

    def projection(self, now: int) -> list[float]:
        self.advance(now)
        out = []
        for k in range(self.h):
            t = self.now + k
            u = sum(c + (t - s) for s, c, e in self.run.values() if t < e)
            u += sum(p + k for p, d in self.wait.values() if k < d)
            out.append(min(1.0, u / self.cap))
        return out


_ops = st.lists(
    st.one_of(
        st.tuples(st.just("enqueue"), st.integers(1, 3000), st.integers(1, 300)),
        st.tuples(st.just("start"), st.integers(1, 3000), st.integers(1, 300)),
        st.tuples(st.just("finish"), st.integers(0, 30), st.just(0)),
        st.tuples(st.just("advance"), st.integers(0, 120), st.just(0)),
    ),
    max_size=60,
)


@settings(max_examples=300, deadline=None)
@given(_ops, st.integers(500, 20_000))
def test_projection_matches_the_papers_map_and_stays_within_capacity(
    ops: list[tuple[str, int, int]], cap: int
) -> None:
    ant = LoadAnticipator(cap, horizon=50)
    ref = _Reference(cap, 50)
    rid = 0
    for op, a, b in ops:
        if op == "enqueue":
            rid += 1
            ant.enqueue(rid, a, b)
            ref.wait[rid] = (a, b)
        elif op == "start":  # the oldest waiting request starts, or a new one
            ref.advance(ref.now)
            if ref.wait:
                r = min(ref.wait)
                p, d = ref.wait.pop(r)
            else:
                rid += 1
                r, p, d = rid, a, b
            ant.start(r, ref.now, p, d)
            ref.run[r] = [ref.now, p, ref.now + d]
        elif op == "finish":
            live = sorted([*ref.run, *ref.wait])
            if live:
                r = live[a % len(live)]
                ant.finish(r)
                ref.run.pop(r, None)
                ref.wait.pop(r, None)
        else:
            ref.advance(ref.now + a)
        got = ant.projection(ref.now)
        assert got == pytest.approx(ref.projection(ref.now))
        assert all(0.0 <= u <= 1.0 for u in got)
        assert ant.predicted_decode_tokens(ref.now) >= 0


# ---- a projection as metrics: deciles out (router), projection back (operator) ------------


@pytest.mark.slow
@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(0.0, 1.0), min_size=100, max_size=100))
def test_a_projection_rebuilt_from_its_quantiles_never_understates_it(values: list[float]) -> None:
    from sageserve.dispatch.anticipator import projection_from_quantiles, projection_quantiles
    from sageserve.pace.preserve import overloaded

    rebuilt = projection_from_quantiles(dict(projection_quantiles(values)))
    assert len(rebuilt) == len(values)
    assert max(rebuilt) == max(values)  # the peak travels exactly (scale-down reads it)
    assert all(r >= v for r, v in zip(rebuilt, sorted(values), strict=True))
    for level in (0.5, 0.8, 0.95):
        if overloaded(values, level, 0.10):  # an overload is never lost on the way
            assert overloaded(rebuilt, level, 0.10)


def test_projection_quantiles_of_a_known_projection() -> None:
    from sageserve.dispatch.anticipator import projection_from_quantiles, projection_quantiles

    values = [i / 100 for i in range(100)]
    q = dict(projection_quantiles(values))
    assert (q[0.0], q[0.5], q[0.9], q[1.0]) == (0.0, 0.5, 0.89, 0.99)
    assert projection_quantiles([]) == []
    assert projection_from_quantiles({}) == ()
    assert projection_from_quantiles({1.0: 1.7}) == (1.0,) * 100  # summed exports are capped
