"""The simulator with an endpoint picker in front of its endpoints
(`spec.signals.endpointPicker`): the picker reads the instances as the operator reads a
real one's series, and its pressure is never below the engines' (its saturation's queue
term is their queue per instance over the same level of 5), so a queue that builds at low
KV use is answered no later than without it."""

from __future__ import annotations

from collections.abc import Sequence

from sageserve.core.snapshot import Decision
from sageserve.core.types import IW_F, ActionKind
from sageserve.pace import make_strategy
from sageserve.sim.engine import Simulation
from tests.sim.helpers import config, flat_perf, poisson


def first_scale_out(picker: bool) -> tuple[float, Decision]:
    # long prompts on a slow prefill: requests queue while the KV cache is far from full
    perf = flat_perf(prefill_s=2.0, kv=200_000)
    cfg = config(perf, initial=2, lo=2, hi=8, end_s=900.0, endpoint_picker=picker)
    load = list(poisson(10.0, 900.0, [IW_F], prompt=2000))
    sim = Simulation(cfg, make_strategy("reactive"), load)
    outs: list[tuple[float, Decision]] = []
    apply = sim._apply

    def record(ds: Sequence[Decision], now: float) -> None:
        outs.extend((now, d) for d in ds if d.kind is ActionKind.SCALE_OUT)
        apply(ds, now)

    sim._apply = record  # type: ignore[method-assign]
    sim.run()
    assert outs, f"picker={picker}: the backlog never scaled out"
    return outs[0]


def test_the_pickers_pressure_scales_out_no_later_than_the_engines_alone() -> None:
    without_at, _ = first_scale_out(False)
    with_at, decision = first_scale_out(True)
    assert with_at <= without_at
    assert "waiting" in decision.reason or "saturation" in decision.reason
