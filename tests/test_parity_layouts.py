"""One recorded sequence of request mixes, three worlds, the same layout switches.

The operator's layout loop (`controller.layout_loop.LayoutPass`, against fakes of the API
server and Prometheus), the OServe benchmark's controller (`commands.bench_oserve`, on a
stand-in for its simulated fleet) and the fleet simulator's layout loop
(`sim.layout_loop.SimLayoutLoop`, on a simulated cluster whose router counted the same
request shapes) all observe their world and call `plan.layout_step.replan_layout`. Given the
same world (the layout in force, the budget, no GPU free beyond it, the same per-type rates
and capacities), each step must start the same switch, or none, and keep the same gate. The
switch's execution is one rule too: `plan.layout_step.step_switch` in the operator and the
fleet simulator (`plan.layout_group.advance`) and `sim.oserve_fleet.Fleet` in the benchmark
all step it by `plan.layout_switch.switch_targets`.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from sageserve.commands import bench_oserve
from sageserve.controller import layout_loop
from sageserve.controller.layout_loop import LayoutState
from sageserve.forecast.request_types import shape_bucket
from sageserve.plan import layout_step
from sageserve.plan.layout_search import Layout, canonical
from sageserve.plan.layout_switch import SwitchPlan
from sageserve.sim import layout_loop as sim_layout_loop
from sageserve.sim.engine import Simulation
from sageserve.sim.scenario import load_scenario
from tests.controller.test_layout_loop import (
    TABLE,
    FakeKube,
    FakeReader,
    pod,
    run,
)
from tests.sim.test_sim_layouts import scenario

#: (now, short-type requests over the hour, long-prompt requests over the hour)
RECORDING = [
    (1000.0, 7200.0, 0.0),  # short prompts only: TP4 ×2 serves them best, kept
    (2000.0, 1800.0, 2880.0),  # long prompts dominate: the pipeline wins, switch
]


class Spy:
    """Records what each world passes to `replan_layout` and what it returns."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, module: Any) -> None:
        self.calls: list[tuple[layout_step.ReplanObservation, layout_step.ReplanOutcome]] = []
        real = layout_step.replan_layout

        def spy(obs: Any, memory: Any, settings: Any) -> layout_step.ReplanOutcome:
            out = real(obs, memory, settings)
            self.calls.append((obs, out))
            return out

        monkeypatch.setattr(module, "replan_layout", spy)


class FleetStandIn:
    """What the benchmark's controller reads of `sim.oserve_fleet.Fleet` and calls on it."""

    def __init__(self, layout: Layout) -> None:
        self.layout = layout
        self.type_counts = [0, 0]
        self.switching = False
        self.executed: list[SwitchPlan] = []

    def held(self) -> Layout:
        return self.layout

    def serving(self) -> list[Any]:
        return []

    def execute(self, plan: SwitchPlan, now: float) -> None:
        self.executed.append(plan)
        self.layout = canonical(plan.target)


def operator_world(monkeypatch: pytest.MonkeyPatch) -> Spy:
    spy = Spy(monkeypatch, layout_loop)
    kube, state = FakeKube(), LayoutState()
    # the second node is taken by another model: no GPU free beyond the budget
    other = pod("other", 0, 8, True, "n2")
    other["metadata"]["labels"] = {}
    kube.pods = lambda: [*kube.my_pods, other]  # type: ignore[method-assign]
    for now, short, long_ in RECORDING:
        reader = FakeReader((100, 100, short), (2000, 20, long_))
        run(kube, state, reader, now, forecast="persist")
    return spy


def bench_world(space: Any, monkeypatch: pytest.MonkeyPatch) -> tuple[list[Any], Spy]:
    spy = Spy(monkeypatch, bench_oserve)
    centroids = [(t["promptTokens"], t["outputTokens"]) for t in TABLE["types"]]
    setup = SimpleNamespace(
        cfg=SimpleNamespace(gpus=8, startup_s=5.0, confirmations=1, seed=0, replan_s=3600.0),
        types=SimpleNamespace(k=2, centroid_tokens=lambda j: centroids[j]),
        space=space,
        tuning_rates=(1.0, 1.0),
    )
    controller = bench_oserve._Hetero(setup)  # type: ignore[arg-type]
    tp4 = next(s for s in space.capacity if s.pipeline_parallel == 1)
    fleet = FleetStandIn(canonical([tp4, tp4]))
    starts: list[Any] = []
    last = 0.0
    for now, short, long_ in RECORDING:
        # the interval's arrivals at the same per-second rates as the operator's hour
        fleet.type_counts = [
            fleet.type_counts[0] + round(short / 3600.0 * (now - last)),
            fleet.type_counts[1] + round(long_ / 3600.0 * (now - last)),
        ]
        before = len(fleet.executed)
        controller.tick(fleet, now)  # type: ignore[arg-type]
        starts.append(fleet.executed[-1] if len(fleet.executed) > before else None)
        last = now
    return starts, spy


def sim_world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Spy:
    """The fleet simulator's layout loop on 2 × TP4 of Llama-2-70B (the operator world's
    variants, start-up and measured table), the second node's GPUs taken by another model;
    its router's shape counter holding, at each recorded time, that hour's requests."""
    spy = Spy(monkeypatch, sim_layout_loop)
    layouts = {"replanSeconds": 10, "confirmations": 1, "forecast": "persist"}
    root = scenario(tmp_path / "s", layouts=layouts, startup_s=5)
    sc = load_scenario(root)
    sim = Simulation(sc.sim_config(), sc.strategy("reactive"), iter(()))
    tp4 = next(iter(sim.cluster.endpoints.values())).deployments[0]
    tp4.instances.pop()  # from the scenario's 3 × TP4 to the operator world's 2, on n0
    for n in sim.cluster.nodes:
        if n.free_gpus > 0 and n.name != "n0":
            n.free_gpus = 0  # taken by another model
    loop = sim.layouts
    assert loop is not None
    short, long_ = (shape_bucket(100), shape_bucket(100)), (shape_bucket(2000), shape_bucket(20))
    for now, s, lg in RECORDING:
        loop.shapes.minutes.clear()
        loop.shapes.minutes.append({("llama-2-70b", "us-east"): Counter({short: s, long_: lg})})
        loop.run(now, None)
    return spy


def test_every_world_starts_the_same_switches_from_the_same_mixes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    op = operator_world(monkeypatch)
    operator_starts = [out.switch for _, out in op.calls]
    space = op.calls[0][0].space
    assert space is not None
    bench_starts, bench = bench_world(space, monkeypatch)
    sim = sim_world(tmp_path, monkeypatch)

    assert [s is not None for s in operator_starts] == [False, True]
    assert operator_starts == bench_starts  # the same SwitchPlan, action for action
    assert operator_starts == [out.switch for _, out in sim.calls]
    for (o_obs, o_out), (b_obs, b_out), (s_obs, s_out) in zip(
        op.calls, bench.calls, sim.calls, strict=True
    ):
        # the same world seen: layout in force, budget, room, rates, capacities, horizon
        assert (o_obs.current, o_obs.budget, o_obs.spare) == (b_obs.current, b_obs.budget, 0)
        assert (s_obs.current, s_obs.budget, s_obs.spare) == (o_obs.current, o_obs.budget, 0)
        assert o_obs.mix is not None and b_obs.mix is not None and s_obs.mix is not None
        assert o_obs.mix.rates == pytest.approx(b_obs.mix.rates)
        assert s_obs.mix == o_obs.mix
        assert o_obs.space == b_obs.space == s_obs.space
        assert s_obs.windows == o_obs.windows
        assert o_out.memory == b_out.memory == s_out.memory
