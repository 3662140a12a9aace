"""The simulator and the router pick the same region for the same requests and loads.

Both call `dispatch.region_router` (preference order, then the 70 % rule); this feeds one
sequence of (client region, EMU per region) to the simulator's router
(`Simulation._route_region`) and to `sageserve router`'s (`Fleet.choose_region`), without
and with the plan's spill-over bounds, under the default policy's threshold and a lower
one. One ScalingPolicy gives both worlds the same region threshold and batch release rules
(`dispatch.from_policy`).
"""

from __future__ import annotations

from typing import Any

import pytest

from sageserve.api.scaling_policy import ScalingPolicySpec
from sageserve.core.snapshot import Plan
from sageserve.core.types import IW_F, Request
from sageserve.dispatch.from_policy import route_threshold_of
from sageserve.pace import make_strategy
from sageserve.pace.step import StepState
from sageserve.router.discovery import follow_policy, model_route, policy_specs
from sageserve.router.fleet import Backend, Fleet, ModelRoute
from sageserve.sim.engine import Simulation
from sageserve.sim.scenario import default_scenario_dir, load_scenario, with_policy_settings
from tests.sim.helpers import config, flat_perf

REGIONS = ("r1", "r2", "r3")
SEQUENCE = [
    ("r1", (0.2, 0.1, 0.1)),  # home under 70 %: home
    ("r1", (0.8, 0.5, 0.1)),  # home above: the next region under 70 %
    ("r2", (0.1, 0.9, 0.9)),  # a client of r2 over a full r2 and r3: r1
    ("r3", (0.9, 0.95, 0.99)),  # every region above: the least loaded
    ("r3", (0.9, 0.9, 0.9)),  # ties: preference order, home first
    ("r2", (0.69, 0.71, 0.2)),  # the threshold is strict
]


@pytest.mark.parametrize("routing", [{}, {"regionEmuThreshold": 0.5}])
@pytest.mark.parametrize(("home", "emus"), SEQUENCE)
def test_simulator_and_router_choose_the_same_region(
    home: str, emus: tuple[float, ...], routing: dict[str, Any]
) -> None:
    spec = ScalingPolicySpec.model_validate({"routing": routing})
    cfg = config(flat_perf(), regions=REGIONS, initial=1, route_threshold=route_threshold_of(spec))
    sim = Simulation(cfg, make_strategy("reactive"), iter(()))
    for region, value in zip(REGIONS, emus, strict=True):
        ep = next(e for k, e in sim.cluster.endpoints.items() if k.region == region)
        ep._emu, ep._emu_t = value, 0.0  # what the last scrape read
    req = Request(1, 0.0, "m", IW_F, home, 100, 10)
    in_sim = sim._route_region(req, "unified", 0.0)
    assert in_sim is not None

    fleet = Fleet()
    model = follow_policy(ModelRoute("ns", "m", "m", REGIONS, ("iw-f",), policy="p"), {"p": spec})
    fleet.set_models([model])
    fleet.set_backends(Backend("ns", f"p-{r}", "m", r, "v", "http://x") for r in REGIONS)
    fleet.set_load({("ns", "m", r): (v, 0.0) for r, v in zip(REGIONS, emus, strict=True)})
    assert fleet.choose_region(model, home) == in_sim.key.region


@pytest.mark.parametrize(
    ("settings", "threshold", "rules"),
    [
        ([], 0.7, ((0.5, 2), (0.6, 1))),
        (
            [
                "routing.regionEmuThreshold=0.5",
                "routing.batchRelease.oneBelowEmu=0.3",
                "routing.batchRelease.twoBelowEmu=0.2",
            ],
            0.5,
            ((0.2, 2), (0.3, 1)),
        ),
    ],
)
def test_one_policy_gives_the_simulator_and_the_router_the_same_routing_rules(
    settings: list[str], threshold: float, rules: tuple[tuple[float, int], ...]
) -> None:
    """The scenario's policy, changed as `sageserve simulate --set` changes it: the
    simulator's config and the router's route of every model (its ModelDeployment and
    policy as discovery reads them from the cluster) hold the same threshold and rules."""
    sc = with_policy_settings(load_scenario(default_scenario_dir()), settings)
    assert sc.policy is not None
    cfg = sc.sim_config()
    assert (cfg.route_threshold, cfg.release_rules) == (threshold, rules)
    policy = sc.policy.model_dump(by_alias=True, mode="json", exclude_none=True)
    policy["metadata"]["namespace"] = "llm"
    specs = policy_specs([policy])
    for md in sc.models:
        obj = md.model_dump(by_alias=True, mode="json", exclude_none=True)
        obj["metadata"]["namespace"] = "llm"
        route = model_route(obj)
        assert route is not None and route.policy == sc.policy.metadata.name
        served = follow_policy(route, specs)
        assert (served.route_threshold, served.release_rules) == (threshold, rules)


def test_both_worlds_keep_the_plans_spill_over_bounds_alike() -> None:
    """r1 above 70 % for 100 requests, the plan lets it send 30 % of its demand to r2: the
    simulator and the router send the same requests away, and about 30 % of them."""
    spill = {"m": {"r1": {"r2": 0.3}}}
    sim = Simulation(
        config(flat_perf(), regions=REGIONS, initial=1), make_strategy("reactive"), iter(())
    )
    sim.step_state = StepState(Plan(0.0, {}, spill=spill))
    emus = {"r1": 0.9, "r2": 0.2, "r3": 0.1}
    for k, e in sim.cluster.endpoints.items():
        e._emu, e._emu_t = emus[k.region], 0.0

    fleet = Fleet()
    model = ModelRoute("ns", "m", "m", REGIONS, ("iw-f",))
    fleet.set_models([model])
    fleet.set_backends(Backend("ns", f"p-{r}", "m", r, "v", "http://x") for r in REGIONS)
    fleet.set_load({("ns", "m", r): (v, 0.0) for r, v in emus.items()})
    fleet.set_spill("ns", spill)

    in_sim, in_router = [], []
    for i in range(100):
        t = i * 0.01  # within one scrape: the EMU readings above hold
        req = Request(i, t, "m", IW_F, "r1", 100, 10)
        chosen = sim._route_region(req, "unified", t)
        assert chosen is not None
        in_sim.append(chosen.key.region)
        in_router.append(fleet.choose_region(model, "r1", 110.0, now=t))
    assert in_sim == in_router
    assert set(in_sim) == {"r1", "r2"}  # never r3: the plan gives r1 no share of it
    assert 0.27 <= in_sim.count("r2") / 100 <= 0.31


def test_both_worlds_read_tokens_sent_since_the_reading_and_skip_regions_with_nothing_ready() -> (
    None
):
    """r1 reads 60 % of 1,000 KV tokens: a request of 200 tokens goes there and lifts the
    estimate to 80 %, so the next goes on to r2 (50 %); r3 has nothing ready and is never a
    candidate, however idle it reads."""
    cfg = config(flat_perf(), regions=REGIONS, initial=1)
    sim = Simulation(cfg, make_strategy("reactive"), iter(()))
    eps = {k.region: e for k, e in sim.cluster.endpoints.items()}
    for region, value in (("r1", 0.6), ("r2", 0.5), ("r3", 0.0)):
        eps[region]._emu, eps[region]._emu_t, eps[region].kv_read = value, 0.0, 1000
    for dep in eps["r3"].deployments:
        dep.instances.clear()

    fleet = Fleet()
    model = ModelRoute("ns", "m", "m", REGIONS, ("iw-f",))
    fleet.set_models([model])
    backends = {r: Backend("ns", f"p-{r}", "m", r, "v", "http://x") for r in ("r1", "r2")}
    fleet.set_backends(backends.values())
    loads = {"r1": (0.6, 1000.0), "r2": (0.5, 1000.0), "r3": (0.0, 1000.0)}
    fleet.set_load({("ns", "m", r): load for r, load in loads.items()})

    chosen = []
    for i in range(3):
        req = Request(i, 0.0, "m", IW_F, "r1", 150, 50)
        in_sim = sim._route_region(req, "unified", 0.0)
        assert in_sim is not None
        in_router = fleet.choose_region(model, "r1", 200.0)
        assert in_router == in_sim.key.region
        chosen.append(in_router)
        in_sim.sent += 200  # what each world counts as sent: prompt + output budget
        fleet.start(backends[in_router], 200.0)
    assert chosen == ["r1", "r2", "r2"]
