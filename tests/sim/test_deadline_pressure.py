"""A batch larger than the troughs absorb before its deadline, with and without deadline
pressure (pace.pressure.deadline_pressure, dispatch.deadlines).

6,000 batch requests (580 prompt + 20 output tokens) arrive in the first minute with a
40-minute deadline, on an endpoint of 2 instances (at most 6). An instance holds 10,000
KV tokens and decodes a step in 0.5 s, so the trough release (nothing under 60 % EMU)
keeps about 10 requests on it, some 600 tokens/s: 2 instances serve about 2.9 M of the
3.6 M tokens by the deadline. The strategies read EMU, which the release holds under 60 %,
so without the deadline signal the endpoint stays at 2 until the requests whose slack runs
out are promoted, too late for some of them. With it, the queue's need (3.6 M tokens in
40 minutes, 1,500 tokens/s) is over the 1,200 tokens/s that 2 instances give batch work,
the endpoint scales out in its first minutes, and every deadline is met.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import pytest

from sageserve.core.snapshot import Decision
from sageserve.core.types import IW_F, ActionKind, Request, Tier, TierKind
from sageserve.pace import make_strategy
from sageserve.perf.model import PiecewiseLinear, VariantPerf
from sageserve.sim.engine import ModelSetup, RegionPlacement, SimConfig, Simulation
from tests.sim.helpers import H100, nodes

DEADLINE_S = 2400.0
BATCH = Tier("batch", TierKind.BATCH, deadline_s=DEADLINE_S, priority=1)
N_BATCH = 6000


def perf() -> VariantPerf:
    return VariantPerf(
        model="m",
        gpu_type=H100,
        gpus=8,
        tensor_parallel=8,
        kv_capacity_tokens=10_000,
        max_num_seqs=64,
        prefill_curve=PiecewiseLinear((1.0,), (0.1,)),
        decode_curve=PiecewiseLinear((1.0,), (0.5,)),
    )


def requests(end_s: float) -> list[Request]:
    out = [Request(i, 60.0 * i / N_BATCH, "m", BATCH, "r1", 580, 20) for i in range(N_BATCH)]
    rng, t = random.Random(3), 0.0
    while (t := t + rng.expovariate(0.2)) < end_s:  # a light interactive load
        out.append(Request(len(out), t, "m", IW_F, "r1", 500, 20))
    return sorted(out, key=lambda r: r.arrival)


def run(deadline_pressure: bool) -> tuple[Simulation, list[Decision]]:
    end_s = DEADLINE_S + 1200.0
    cfg = SimConfig(
        models=(ModelSetup("m", (("v", perf()),), (RegionPlacement("r1", 2, 6, 2),), 0, 1000.0),),
        nodes=nodes(("r1",)),
        start_s=0.0,
        end_s=end_s,
        drain_s=300.0,
        region_order=("r1",),
        promotion_margin_s=300.0,
        deadline_pressure=deadline_pressure,
    )
    sim = Simulation(cfg, make_strategy("reactive"), requests(end_s))
    decisions: list[Decision] = []
    apply = sim._apply

    def record(ds: Sequence[Decision], now: float) -> None:
        decisions.extend(ds)
        apply(ds, now)

    sim._apply = record  # type: ignore[method-assign]
    sim.run()
    return sim, decisions


@pytest.fixture(scope="module")
def runs() -> dict[bool, tuple[Simulation, list[Decision]]]:
    return {flag: run(flag) for flag in (False, True)}


def test_without_deadline_pressure_batch_never_scales_out_and_deadlines_are_missed(
    runs: dict[bool, tuple[Simulation, list[Decision]]],
) -> None:
    sim, decisions = runs[False]
    st = sim.stats[("batch", "m")]
    assert st.finished == N_BATCH  # all served in the end (promotion) ...
    assert st.deadline_miss > 500  # ... but hundreds after their deadline
    assert not any("batch deadline" in d.reason for d in decisions)
    # the endpoint stayed at 2 until the promotion wave, in the last minutes of the slack
    first_out = min(d for d in (m.minute for m in sim.minutes if m.serving > 2))
    assert first_out * 60.0 > DEADLINE_S - 600.0


def test_deadline_pressure_scales_out_and_every_deadline_is_met(
    runs: dict[bool, tuple[Simulation, list[Decision]]],
) -> None:
    sim, decisions = runs[True]
    st = sim.stats[("batch", "m")]
    assert st.finished == N_BATCH and st.deadline_miss == 0
    [first, *_] = [d for d in decisions if d.kind is ActionKind.SCALE_OUT]
    assert "batch deadline pressure" in first.reason and "tok/s needed" in first.reason
    assert first.replicas == {"v": 3}
    # it grew in the first minutes, while the batch still had most of its slack
    asked = min(m.minute for m in sim.minutes if m.serving + m.provisioning > 2)
    assert asked <= 2
