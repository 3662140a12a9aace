"""OServe's layout search (plan/layout_search.py, Algorithm 1): determinism, never worse than
its start, the obviously better heterogeneous layout on a hand-made two-type case, and the
Kubernetes filters (TP divides heads, TP inside a node, packing onto nodes)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sageserve.perf.capacity import type_capacity
from sageserve.perf.model import load_catalog
from sageserve.plan.layout_search import (
    LayoutSpace,
    Strategy,
    best_homogeneous,
    canonical,
    describe,
    packs,
    search_layout,
    uniform_layout,
)

TP4, TP8, TP4PP2 = Strategy(4), Strategy(8), Strategy(4, 2)

# Type A (short outputs): a TP4 replica serves 10/s, an 8-GPU one barely more.
# Type B (long outputs, memory-bound): a TP4 replica serves 2/s, TP4×PP2 8/s, TP8 7/s.
HAND = LayoutSpace({TP4: (10.0, 2.0), TP4PP2: (12.0, 8.0), TP8: (11.0, 7.0)}, node_gpus=8)
HAND_RATES = (20.0, 8.0)


def test_hand_case_finds_the_heterogeneous_layout() -> None:
    # 4 × TP4 serves Φ = 24 (B gets 4 of 8); 2 × 8 GPUs at most 20; TP4×PP2 + 2 × TP4
    # serves all 28: B on the pipeline replica, A on the two TP4s.
    home, home_score = best_homogeneous(HAND, HAND_RATES, 16)
    assert home == (TP4,) * 4 and home_score.throughput == pytest.approx(24.0)
    for seed in range(3):
        r = search_layout(HAND, HAND_RATES, 16, seed=seed)
        assert r.layout == canonical([TP4PP2, TP4, TP4]), describe(r.layout)
        assert r.score.throughput == pytest.approx(28.0)
        assert r.idle_gpus == 0


def test_deterministic_for_a_seed() -> None:
    space = _three_type_space()
    rates = (30.0, 3.0, 1.5)
    a = search_layout(space, rates, 32, seed=7)
    b = search_layout(space, rates, 32, seed=7)
    assert (a.layout, a.score, a.iterations, a.accepted) == (
        b.layout,
        b.score,
        b.iterations,
        b.accepted,
    )


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("rates", [(30.0, 3.0, 1.5), (5.0, 1.0, 4.0), (200.0, 40.0, 20.0)])
def test_never_worse_than_the_uniform_start(seed: int, rates: tuple[float, ...]) -> None:
    space = _three_type_space()
    r = search_layout(space, rates, 24, seed=seed)
    assert r.initial == uniform_layout(space, 24) == (TP4,) * 6
    assert not r.initial_score.beats(r.score, sum(rates))
    assert r.score.throughput >= r.initial_score.throughput - 1e-6
    assert sum(s.gpus for s in r.layout) + r.idle_gpus == 24
    assert packs(r.layout, 24, 8)


def test_coordinate_ascent_above_the_enumeration_limit() -> None:
    r = search_layout(HAND, HAND_RATES, 16, seed=0, enumerate_limit=1)
    assert "coordinate ascent" in r.strategy_choice
    assert r.score.throughput >= r.initial_score.throughput
    assert r.layout == canonical([TP4PP2, TP4, TP4])


def test_a_lone_saturated_replica_is_split_rather_than_stuck() -> None:
    # Start from one 16-GPU replica: by the paper's rules it can neither merge (no partner)
    # nor swap (nothing under-utilised); the documented deviation splits it.
    space = LayoutSpace({**HAND.capacity, Strategy(4, 4): (20.0, 10.0)}, node_gpus=8)
    r = search_layout(space, HAND_RATES, 16, seed=0, initial=(Strategy(4, 4),))
    assert r.initial_score.throughput == pytest.approx(20.0)
    assert r.layout == canonical([TP4PP2, TP4, TP4])
    assert r.score.throughput == pytest.approx(28.0)


def test_a_type_only_some_layouts_can_serve_counts_in_throughput() -> None:
    # TP4 cannot run type B at all (too long for its KV); the 8-GPU layout can. 4 × TP4
    # serves only A (Φ = 20), 2 × TP4×PP2 all of A (20/12 of a replica) and 8/3 of B.
    space = LayoutSpace({TP4: (10.0, 0.0), TP4PP2: (12.0, 8.0)}, node_gpus=8)
    home, score = best_homogeneous(space, (20.0, 8.0), 16)
    assert home == (TP4PP2,) * 2 and score.throughput == pytest.approx(20.0 + 8.0 / 3.0)
    r = search_layout(space, (20.0, 8.0), 16, seed=0)
    assert r.layout == canonical([TP4PP2, TP4, TP4])
    assert r.score.throughput == pytest.approx(28.0)


def test_filters_drop_strategies_vllm_or_the_nodes_cannot_run() -> None:
    space = LayoutSpace(
        {Strategy(3, 2): (1.0,), Strategy(2): (1.0,), Strategy(16): (9.0,)},
        node_gpus=8,
        attention_heads=64,
    )
    assert space.sizes() == [2]  # TP3 does not divide 64 heads; TP16 exceeds a node
    opt66 = LayoutSpace({Strategy(3, 2): (1.0,)}, node_gpus=8, attention_heads=72)
    assert opt66.strategies(6) == [Strategy(3, 2)]


def test_packing_keeps_every_tp_group_on_one_node() -> None:
    assert packs([TP4PP2, TP8], 16, 8)
    assert packs([Strategy(3, 2), Strategy(2)], 8, 8)  # groups 3 + 3 + 2 on one node
    assert not packs([Strategy(3)] * 3, 8, 8)  # 9 GPUs
    assert packs([TP4] * 3, 12, 8)  # nodes of 8 and 4
    assert not packs([Strategy(6)] * 2, 12, 8)  # 6 fits the 8-GPU node, not the 4-GPU one


def test_search_on_derived_profiles_never_loses_to_its_start() -> None:
    cat = load_catalog()
    types = [(200, 50), (2000, 20), (1000, 1500)]
    cap = {
        Strategy(v.tensor_parallel, v.pipeline_parallel): tuple(
            type_capacity(v, i, o) for i, o in types
        )
        for v in cat.layouts("llama-2-70b", "NVIDIA-H100-80GB-HBM3", 16)
    }
    space = LayoutSpace(cap, node_gpus=8, attention_heads=64)
    rates = (10.0, 2.0, 0.5)
    r = search_layout(space, rates, 16, seed=0)
    assert r.initial == (TP4,) * 4
    assert r.score.throughput >= r.initial_score.throughput - 1e-6
    assert not r.initial_score.beats(r.score, sum(rates))


def _three_type_space() -> LayoutSpace:
    return LayoutSpace(
        {
            TP4: (10.0, 2.0, 0.5),
            TP4PP2: (19.0, 6.0, 2.5),
            TP8: (15.0, 5.0, 2.0),
            Strategy(4, 3): (27.0, 9.0, 4.5),
            Strategy(4, 4): (35.0, 13.0, 7.0),
            Strategy(8, 2): (30.0, 11.0, 6.0),
        },
        node_gpus=8,
        attention_heads=64,
    )


@st.composite
def spaces(draw: st.DrawFn) -> tuple[LayoutSpace, tuple[float, ...]]:
    j = draw(st.integers(1, 3))
    cap = st.floats(0.0, 30.0, allow_nan=False)
    table = {
        s: tuple(draw(cap) for _ in range(j))
        for s in (TP4, TP4PP2, TP8, Strategy(4, 4), Strategy(8, 2))
        if draw(st.booleans()) or s == TP4
    }
    rates = tuple(draw(st.floats(0.0, 60.0, allow_nan=False)) for _ in range(j))
    return LayoutSpace(table, node_gpus=8), rates


@settings(max_examples=15, deadline=None)
@given(spaces(), st.integers(0, 3))
def test_any_space_keeps_the_budget_packs_and_never_loses(
    case: tuple[LayoutSpace, tuple[float, ...]], seed: int
) -> None:
    space, rates = case
    r = search_layout(space, rates, 16, seed=seed, patience=5)
    assert sum(s.gpus for s in r.layout) + r.idle_gpus == 16
    assert packs(r.layout, 16, 8)
    assert all(s in space.capacity for s in r.layout)
    assert not r.initial_score.beats(r.score, sum(rates))
