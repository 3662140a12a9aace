"""A backlog stall at low KV usage, reproduced on a synthetic trace, and its fix (pace.pressure).

Long prompts make an instance prefill-bound: 20,000-token prompts are prefilled in chunks of
16,384 tokens at 4,096 tokens/s, about 5 s each, so two instances serve 0.4 request/s and
at 0.6 request/s a backlog grows by 0.2 request/s. Each request holds its KV only for its
prefill and a few decode steps, so EMU stays far under 50 %. A strategy that reads EMU alone
keeps the endpoint at its floor of 2 for the whole run (what a ServeGen day showed on a
Bloom endpoint: 65,000 requests waiting, KV under 50 %, serving at the floor). With the
backlog counted as pressure, the same run scales out and the backlog drains.
"""

from __future__ import annotations

import pytest

from sageserve.core.snapshot import Plan
from sageserve.core.types import IW_F, EndpointKey
from sageserve.pace import make_strategy
from sageserve.pace import step as step_module
from sageserve.pace.pressure import Pressure
from sageserve.perf.model import PiecewiseLinear, VariantPerf
from sageserve.sim.cluster import Delays
from sageserve.sim.engine import RunResult, Simulation
from tests.sim.helpers import H100, config, poisson

END_S = 1800.0


def prefill_bound() -> VariantPerf:
    """4,096 prompt tokens/s of prefill (4 s per 16,384-token chunk), fast decode, a large
    KV cache (Llama-3.1-8B on 4×A100 holds 2 M tokens): a long-prompt workload."""
    return VariantPerf(
        model="m",
        gpu_type=H100,
        gpus=8,
        tensor_parallel=8,
        kv_capacity_tokens=1_000_000,
        max_num_seqs=256,
        prefill_curve=PiecewiseLinear((1024.0, 16384.0), (0.25, 4.0)),
        decode_curve=PiecewiseLinear((1.0,), (0.02,)),
    )


def run(policy: str) -> RunResult:
    cfg = config(
        prefill_bound(),
        initial=2,
        lo=2,
        hi=6,
        end_s=END_S,
        drain_s=60.0,
        delays=Delays(redeploy_s=120.0),
    )
    reqs = poisson(0.6, END_S, [IW_F], seed=7, prompt=20_000, output=5)

    def planner(now, history, batch, current, received, need):  # type: ignore[no-untyped-def]
        # the forecast saw little: the plan keeps the floor, as LT-UA's did on that day
        return Plan(now, {(EndpointKey("m", "r1"), "v"): 2}, {EndpointKey("m", "r1"): 50.0})

    history = ({("m", "r1"): [50.0] * 60}, {})  # so the first plan is made at the start
    return Simulation(cfg, make_strategy(policy), reqs, None, planner, history).run()


@pytest.fixture
def emu_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """The decision step as before the fix: no queue-side signal reaches the strategy."""
    monkeypatch.setattr(step_module, "endpoint_pressure", lambda ep: Pressure())


@pytest.mark.parametrize("policy", ["reactive", "lt-ua"])
def test_before_the_fix_a_growing_backlog_under_low_kv_stays_at_the_floor(
    policy: str, emu_only: None
) -> None:
    r = run(policy)
    window = [m for m in r.minutes if m.minute < END_S / 60]
    assert max(m.emu for m in window) < 0.5
    assert {m.serving for m in window} == {2}  # never scaled out
    assert sum(r.unfinished_by_key.values()) > 200  # the backlog grew all along


@pytest.mark.parametrize("policy", ["reactive", "lt-ua"])
def test_with_the_backlog_as_pressure_the_same_run_scales_out(policy: str) -> None:
    stalled = _stalled(policy)
    r = run(policy)
    window = [m for m in r.minutes if m.minute < END_S / 60]
    assert max(m.emu for m in window) < 0.5  # KV still says nothing
    assert max(m.serving for m in window) >= 3
    assert sum(r.unfinished_by_key.values()) < stalled / 5
    ttft = sorted(r.stats[("IW-F", "m")].ttft)
    assert ttft[len(ttft) // 2] < 60.0  # half the requests start within a minute


def _stalled(policy: str) -> int:
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(step_module, "endpoint_pressure", lambda ep: Pressure())
        return sum(run(policy).unfinished_by_key.values())
