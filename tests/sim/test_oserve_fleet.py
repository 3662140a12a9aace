"""Several layouts of one model side by side (sim/oserve_fleet.py): dispatch by request type
follows the assignment LP's weights, and a switch plan runs to its target.

Why: the heterogeneous plan's gain can only come from sending each type where the LP put
it; a dispatcher that drifted from the weights would make the benchmark measure something
else. The cases are solved by hand.
"""

from __future__ import annotations

import math

import pytest

from sageserve.core.types import Request, Tier, TierKind
from sageserve.dispatch.length_predictor import make_predictor
from sageserve.forecast.request_types import RequestTypes
from sageserve.perf.model import VariantPerf, load_catalog
from sageserve.plan.layout_search import LayoutSpace, Strategy
from sageserve.plan.layout_switch import plan_switch
from sageserve.plan.oserve_assign import assign, layout_weights
from sageserve.sim.oserve_fleet import Fleet, nearest_type

TP4, TP8 = Strategy(4, 1), Strategy(8, 1)
TIER = Tier("iw-f", TierKind.INTERACTIVE, 1.0)
# two types: short prompt + short output (0), long prompt + long output (1)
TYPES = RequestTypes(
    log_centroids=((math.log1p(100), math.log1p(10)), (math.log1p(2000), math.log1p(300))),
    counts=(1, 1),
)
CAT = load_catalog()
#: every replica serves either type at 10 req/s
EQUAL = {TP4: (10.0, 10.0), TP8: (10.0, 10.0)}


def perf_of(s: Strategy) -> VariantPerf:
    return CAT.layout(
        "llama-2-70b", "NVIDIA-H100-80GB-HBM3", s.tensor_parallel, s.pipeline_parallel
    )


def fleet(layout: list[Strategy], startup_s: float = 600.0) -> Fleet:
    return Fleet(perf_of, layout, TYPES, make_predictor("oracle"), startup_s)


def requests(kinds: list[int], gap_s: float = 0.5) -> list[Request]:
    sizes = {0: (100, 10), 1: (2000, 300)}
    return [
        Request(i, i * gap_s, "llama-2-70b", TIER, "r", *sizes[k], client=k)
        for i, k in enumerate(kinds)
    ]


def test_nearest_type_matches_classify() -> None:
    for p, o in [(100, 10), (2000, 300), (90, 400), (3000, 5)]:
        assert nearest_type(TYPES, p, o) == int(TYPES.classify([p], [o])[0])


def test_each_type_goes_only_where_the_lp_sends_it() -> None:
    # TP4 serves type 0 at 10/s and type 1 at 1/s; TP8 the other way round; λ = (5, 5).
    # By hand: Φ = 10 only with all of type 0 on TP4 and all of type 1 on TP8 (any other
    # split costs capacity: utilisation 0.5 each).
    a = assign([5.0, 5.0], [[10.0, 1.0], [1.0, 10.0]])
    assert a.weights[0][0] == pytest.approx(1.0) and a.weights[1][1] == pytest.approx(1.0)
    f = fleet([TP4, TP8])
    f.set_weights(
        dict(
            enumerate(layout_weights({TP4: (10.0, 1.0), TP8: (1.0, 10.0)}, [TP4, TP8], [5.0, 5.0]))
        )
    )
    outs = f.run(requests([0, 1] * 40), 0.0, 1e9, 3600.0)
    assert {o.strategy for o in outs if o.type == 0} == {"TP4"}
    assert {o.strategy for o in outs if o.type == 1} == {"TP8"}
    assert all(not math.isnan(o.e2e) for o in outs)


def test_fractional_weights_are_followed_exactly_per_strategy() -> None:
    # Three replicas of equal capacity 10/s for type 0, λ0 = 15: the LP's least peak
    # utilisation gives each replica 5/s, weight 1/3; per strategy TP4 (two replicas) 2/3,
    # TP8 1/3. Smooth weighted round robin: 300 requests split 200 / 100 exactly.
    layout = [TP4, TP4, TP8]
    a = assign([15.0, 0.0], [[10.0, 10.0]] * 3)
    assert [w[0] for w in a.weights] == pytest.approx([1 / 3] * 3)
    w = dict(enumerate(layout_weights(EQUAL, layout, [15.0, 0.0])))
    assert w[0] == pytest.approx({TP4: 2 / 3, TP8: 1 / 3})
    f = fleet(layout)
    f.set_weights(w)
    outs = f.run(requests([0] * 300, gap_s=0.2), 0.0, 1e9, 3600.0)
    by = {s: sum(o.strategy == s for o in outs) for s in ("TP4", "TP8")}
    assert by == {"TP4": 200, "TP8": 100}


def test_without_weights_every_replica_is_a_candidate() -> None:
    f = fleet([TP4, TP8])
    outs = f.run(requests([0, 1] * 50, gap_s=0.05), 0.0, 1e9, 3600.0)
    assert {o.strategy for o in outs} == {"TP4", "TP8"}


def test_a_switch_plan_runs_to_its_target_and_pays_its_start_ups() -> None:
    # 4 × TP4 -> 2 × TP8 on 16 GPUs, nothing kept: stop two TP4, start a TP8, wait for it,
    # stop two more, start the second. Start-ups: 2 × 8 GPUs × 100 s.
    space = LayoutSpace({TP4: (10.0, 2.0), TP8: (12.0, 3.0)}, node_gpus=8, attention_heads=64)
    plan = plan_switch(space, [TP4] * 4, [TP8] * 2, 16, [5.0, 1.0], 100.0, 8)
    f = fleet([TP4] * 4, startup_s=100.0)

    class Once:
        def tick(self, fl: Fleet, now: float) -> None:
            if now == 10.0:
                fl.execute(plan, now)

    f.controller, f.tick_s = Once(), 10.0
    outs = f.run(requests([0, 1] * 300, gap_s=0.5), 0.0, 300.0, 3600.0)
    assert [str(s) for s in f.held()] == ["TP8", "TP8"]
    assert f.stats.switches == 1
    assert f.stats.started_gpu_seconds == pytest.approx(2 * 8 * 100.0)
    assert not f.switching
    # every request finished although the fleet was replaced under it
    assert all(not math.isnan(o.e2e) for o in outs)
    assert {o.strategy for o in outs if o.arrival > 250.0} == {"TP8"}


# ---- dispatch with overflow (weighted-overflow) ---------------------------------------------


def test_overflow_follows_the_weights_exactly_when_nothing_queues() -> None:
    # the fractional case above at a load that never queues: the same 200 / 100 split, no
    # request overflowed
    layout = [TP4, TP4, TP8]
    f = Fleet(perf_of, layout, TYPES, make_predictor("oracle"), 600.0, dispatch="weighted-overflow")
    f.set_weights(dict(enumerate(layout_weights(EQUAL, layout, [15.0, 0.0]))))
    outs = f.run(requests([0] * 300, gap_s=0.2), 0.0, 1e9, 3600.0)
    by = {s: sum(o.strategy == s for o in outs) for s in ("TP4", "TP8")}
    assert by == {"TP4": 200, "TP8": 100}
    assert f.overflows == 0


def _swamp(dispatch: str, can_serve: dict[int, set[Strategy]] | None = None) -> Fleet:
    # every request (long prompt, long output) weighted to the one TP8 replica, 600 of
    # them in 6 s: far more than its batch admits, so its queue grows
    f = Fleet(perf_of, [TP4, TP8], TYPES, make_predictor("oracle"), 600.0, dispatch=dispatch)
    f.set_weights({0: {TP8: 1.0}, 1: {TP8: 1.0}}, can_serve)
    f.run(requests([1] * 600, gap_s=0.01), 0.0, 1e9, 7200.0)
    return f


@pytest.mark.parametrize(
    ("dispatch", "can_serve", "overflowed"),
    [
        ("weighted", None, False),  # strict weights: the swamped replica takes everything
        ("weighted-overflow", None, True),  # its queue overflows to the idle TP4
        ("weighted-overflow", {1: {TP8}}, False),  # unless TP4 cannot serve the type (n = 0)
    ],
)
def test_a_swamped_replica_overflows_only_with_overflow_dispatch(
    dispatch: str, can_serve: dict[int, set[Strategy]] | None, overflowed: bool
) -> None:
    f = _swamp(dispatch, can_serve)
    on_tp4 = sum(o.strategy == "TP4" for o in f.outcomes)
    assert (on_tp4 > 0) == overflowed
    assert f.overflows == on_tp4
    assert all(o.type == 1 for o in f.outcomes)


def test_an_unknown_dispatch_strategy_is_refused() -> None:
    with pytest.raises(ValueError, match="weighted-overflow"):
        Fleet(perf_of, [TP4], TYPES, make_predictor("oracle"), 600.0, dispatch="round-robin")
