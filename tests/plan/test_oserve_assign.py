"""OServe's assignment LP (plan/oserve_assign.py): small cases solved by hand, and properties
(every type's rate is served or reported unserved; every capacity is respected)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from scipy.optimize import linprog  # type: ignore[import-untyped]

from sageserve.plan.layout_search import Strategy
from sageserve.plan.oserve_assign import assign, layout_weights, max_throughput, mix_scale

TOL = 1e-6


def close(got: object, want: object) -> bool:
    return bool(np.allclose(np.asarray(got), np.asarray(want), rtol=1e-7, atol=TOL))


def test_one_replica_one_type_under_capacity() -> None:
    a = assign([5.0], [[10.0]])
    assert close(a.served, ((5.0,),))
    assert close(a.weights, ((1.0,),))
    assert a.unserved == pytest.approx((0.0,), abs=TOL)
    assert a.utilisation == pytest.approx((0.5,))


def test_overload_reports_the_shortfall() -> None:
    a = assign([15.0], [[10.0]])
    assert a.throughput == pytest.approx(10.0)
    assert a.unserved == pytest.approx((5.0,))
    assert a.weights[0][0] == pytest.approx(10 / 15)


def test_homogeneous_tp4_cannot_serve_the_memory_bound_type() -> None:
    # Four replicas, each 10/s of type A or 2/s of type B (or a mix). λ = (20, 8).
    # Φ = 2 replicas × 10 (all of A) + 2 replicas × 2 (B) = 24; B gets 4 of 8.
    a = assign([20.0, 8.0], [[10.0, 2.0]] * 4)
    assert a.throughput == pytest.approx(24.0)
    assert a.unserved == pytest.approx((0.0, 4.0), abs=TOL)
    assert a.fair_share == pytest.approx(0.5)
    assert a.utilisation == pytest.approx((1.0,) * 4)


def test_heterogeneous_layout_serves_everything_by_type() -> None:
    # One 8-GPU replica (12/s A or 8/s B) takes all of B; two TP4 replicas share A.
    a = assign([20.0, 8.0], [[12.0, 8.0], [10.0, 2.0], [10.0, 2.0]])
    assert a.throughput == pytest.approx(28.0)
    assert a.unserved == pytest.approx((0.0, 0.0), abs=TOL)
    assert [w[1] for w in a.weights] == pytest.approx([1.0, 0.0, 0.0], abs=TOL)
    assert [w[0] for w in a.weights] == pytest.approx([0.0, 0.5, 0.5], abs=TOL)


def test_spare_capacity_is_spread_evenly() -> None:
    # Any split of 10/s over two 10/s replicas reaches Φ = 10; the tie-break halves it.
    a = assign([10.0], [[10.0], [10.0]])
    assert close(a.weights, ((0.5,), (0.5,)))
    assert a.utilisation == pytest.approx((0.5, 0.5))


def test_shortfall_is_shared_between_equally_costly_types() -> None:
    # One replica, 10/s of either type; λ = (10, 10): Φ = 10 whatever the split, the fair
    # tie-break serves half of each instead of all of one.
    a = assign([10.0, 10.0], [[10.0, 10.0]])
    assert a.throughput == pytest.approx(10.0)
    assert a.served[0] == pytest.approx((5.0, 5.0))
    assert a.fair_share == pytest.approx(0.5)


def test_edge_capacity_caps_one_pair() -> None:
    # x₀ ≤ e₀ = 3, so replica 1 takes 7; the peak utilisation is then 0.7.
    a = assign([10.0], [[10.0], [10.0]], edge_capacity=[[3.0], [10.0]])
    assert close(a.served, ((3.0,), (7.0,)))
    assert max(a.utilisation) == pytest.approx(0.7)


def test_a_replica_that_cannot_run_a_type_gets_none_of_it() -> None:
    a = assign([4.0, 4.0], [[0.0, 10.0], [10.0, 0.0]])
    assert close(a.served, ((0.0, 4.0), (4.0, 0.0)))


def test_no_demand_no_flow() -> None:
    a = assign([0.0, 0.0], [[1.0, 1.0]])
    assert a.throughput == 0.0 and a.unserved == (0.0, 0.0)
    assert a.weights == ((0.0, 0.0),)


def test_mix_scale_is_the_headroom_at_the_mix() -> None:
    # 2 replicas of 10/s A or 5/s B; λ = (5, 5): θλ needs θ·5/10 + θ·5/5 ≤ 2 → θ = 4/3.
    theta, util = mix_scale([5.0, 5.0], [[10.0, 5.0], [10.0, 5.0]])
    assert theta == pytest.approx(4 / 3)
    assert util == pytest.approx((1.0, 1.0))
    assert max_throughput([5.0, 5.0], [[10.0, 5.0], [10.0, 5.0]]) == pytest.approx(10.0)


def test_bad_input_names_the_argument() -> None:
    with pytest.raises(ValueError, match="rates"):
        assign([-1.0], [[1.0]])
    with pytest.raises(ValueError, match="capacity"):
        assign([1.0], [[-1.0]])


@st.composite
def cases(draw: st.DrawFn) -> tuple[list[float], list[list[float]], list[list[float]]]:
    k = draw(st.integers(1, 4))
    j = draw(st.integers(1, 3))
    rate = st.floats(0.0, 50.0, allow_nan=False)
    cap = st.one_of(st.just(0.0), st.floats(0.5, 40.0, allow_nan=False))
    lam = [draw(rate) for _ in range(j)]
    n = [[draw(cap) for _ in range(j)] for _ in range(k)]
    e = [[draw(st.floats(0.0, 60.0, allow_nan=False)) for _ in range(j)] for _ in range(k)]
    return lam, n, e


def _reference_phi(lam: list[float], n: list[list[float]], e: list[list[float]]) -> float:
    """Φ by scipy's linprog on the same LP written independently (dense, C1-C3)."""
    k, j = len(n), len(lam)
    a_ub: list[list[float]] = []
    b_ub: list[float] = []
    for jj in range(j):
        a_ub.append([1.0 if c % j == jj else 0.0 for c in range(k * j)])
        b_ub.append(lam[jj])
    for kk in range(k):
        a_ub.append(
            [1.0 / n[kk][c % j] if c // j == kk and n[kk][c % j] > 0 else 0.0 for c in range(k * j)]
        )
        b_ub.append(1.0)
    bounds = [(0.0, e[c // j][c % j] if n[c // j][c % j] > 0 else 0.0) for c in range(k * j)]
    res = linprog(-np.ones(k * j), A_ub=a_ub, b_ub=b_ub, bounds=bounds, method="highs")
    assert res.status == 0
    return float(-res.fun)


@settings(max_examples=60, deadline=None)
@given(cases())
# HiGHS once reported this near-degenerate LP optimal without a primal solution
@example(([6.940967765906448e-07, 16.0], [[13.0, 16.0]], [[1.0, 16.0]]))
def test_every_rate_is_served_or_reported_and_capacities_hold(
    case: tuple[list[float], list[list[float]], list[list[float]]],
) -> None:
    lam, n, e = case
    a = assign(lam, n, e)
    x = np.asarray(a.served)
    for j, rate in enumerate(lam):
        assert x[:, j].sum() + a.unserved[j] == pytest.approx(rate, abs=1e-5)
        assert a.unserved[j] >= 0.0
        assert x[:, j].sum() <= rate + 1e-5  # C1
        if rate > 0:
            assert sum(w[j] for w in a.weights) <= 1.0 + 1e-6
    assert np.all(x >= 0.0)
    for k in range(len(n)):
        used = 0.0
        for j in range(len(lam)):
            assert x[k, j] <= e[k][j] + 1e-6  # C2
            if n[k][j] == 0:
                assert x[k, j] == pytest.approx(0.0, abs=1e-9)
            else:
                used += x[k, j] / n[k][j]
        assert used <= 1.0 + 1e-6  # C3
        assert a.utilisation[k] == pytest.approx(used, abs=1e-6)
    # the tie-breaks never give up throughput
    assert a.throughput == pytest.approx(_reference_phi(lam, n, e), rel=1e-6, abs=1e-6)


def test_dispatch_weights_per_strategy_by_hand() -> None:
    # TP4 serves type 0 at 10/s and type 1 at 1/s, TP8 the other way round; λ = (5, 5):
    # type 0 all to TP4, type 1 all to TP8 (any other split costs capacity)
    tp4, tp8 = Strategy(4), Strategy(8)
    crossed = {tp4: (10.0, 1.0), tp8: (1.0, 10.0)}
    assert layout_weights(crossed, [tp4, tp8], [5.0, 5.0]) == [
        pytest.approx({tp4: 1.0, tp8: 0.0}),
        pytest.approx({tp4: 0.0, tp8: 1.0}),
    ]
    # replicas of one strategy add up; a type with no demand is shared by n
    equal = {tp4: (10.0, 10.0), tp8: (10.0, 10.0)}
    w = layout_weights(equal, [tp4, tp4, tp8], [15.0, 0.0])
    assert w[0] == pytest.approx({tp4: 2 / 3, tp8: 1 / 3})
    assert w[1] == pytest.approx({tp4: 2 / 3, tp8: 1 / 3})
    # a type no replica can serve gets no weights; no replica, none at all
    assert layout_weights({tp4: (10.0, 0.0)}, [tp4], [1.0, 1.0])[1] == {}
    assert layout_weights(equal, [], [1.0, 1.0]) == [{}, {}]
