"""OServe's search (Algorithm 1) on the derived CodeLlama-34B/H100 profiles: where the best
layout per GPU differs by request type, the chosen deployment mixes layouts and sends each
type to the layout it serves best (OServe §4.3)."""

from __future__ import annotations

from sageserve.perf.capacity import type_capacity
from sageserve.perf.model import load_catalog
from sageserve.plan.layout_search import LayoutSpace, Strategy, best_homogeneous, search_layout
from sageserve.plan.oserve_assign import assign

SHORT = (164, 13)  # short prompt, short answer
LONG_OUTPUT = (1245, 313)  # conversation turn with a long answer


def _space() -> tuple[LayoutSpace, dict[Strategy, tuple[float, ...]]]:
    cat = load_catalog()
    cap = {
        Strategy(tp, 1): tuple(
            type_capacity(cat.get("codellama-34b", "NVIDIA-H100-80GB-HBM3", tp), i, o)
            for i, o in (SHORT, LONG_OUTPUT)
        )
        for tp in (1, 2, 4, 8)
    }
    return LayoutSpace(cap, node_gpus=8, attention_heads=64), cap


def test_the_search_serves_short_requests_on_tp1_and_long_answers_on_tp2() -> None:
    space, cap = _space()
    rates = (150.0, 10.0)
    home, home_score = best_homogeneous(space, rates, 8)
    result = search_layout(space, rates, 8, seed=0)
    assert {s.tensor_parallel for s in home} == {2}
    assert {s.tensor_parallel for s in result.layout} == {1, 2}
    assert result.score.scale > home_score.scale  # more headroom at the same mix
    plan = assign(rates, [list(cap[s]) for s in result.layout])
    for s, weights in zip(result.layout, plan.weights, strict=True):
        if s.tensor_parallel == 1:
            assert weights[1] == 0.0  # no long answer lands on a TP1 replica
