"""What the router's Queue Manager knows of a model is what the simulator's is given: the
per-request decode rate its promotion by slack divides tokens by, and the capacity at
maxInstances a predicted deadline miss is read against (SageServe §6.2, §6.3)."""

from __future__ import annotations

from typing import Any

from sageserve.api.model_deployment import ModelDeployment
from sageserve.dispatch.deadlines import capacity_at_max
from sageserve.router.discovery import model_route
from sageserve.sim.engine import request_decode_tps
from sageserve.sim.scenario import default_scenario_dir, load_scenario


def manifest(md: ModelDeployment, namespace: str = "llm") -> dict[str, Any]:
    obj: dict[str, Any] = md.model_dump(by_alias=True, mode="json", exclude_none=True)
    obj["metadata"]["namespace"] = namespace
    return obj


def test_discovery_gives_each_model_the_simulators_request_rate_and_capacity_at_max() -> None:
    scenario = load_scenario(default_scenario_dir())
    setups = {m.name: m for m in scenario.sim_config().models}
    assert len(setups) == 4
    for md in scenario.models:
        route = model_route(manifest(md))
        setup = setups[md.metadata.name]
        assert route is not None
        assert route.request_tps == request_decode_tps(setup) > 0
        expected = capacity_at_max(setup.capacity_tps, (r.max_instances for r in setup.regions))
        assert route.capacity_at_max_tps == expected > 0


def test_a_model_without_a_perf_profile_has_no_rate_but_a_capacity() -> None:
    md = load_scenario(default_scenario_dir()).models[0]
    obj = manifest(md)
    obj["metadata"]["name"] = "in-house-model"
    obj["spec"]["model"]["name"] = "acme/in-house-model"
    obj["spec"]["variants"] = [
        {"name": "big", "gpuType": "NVIDIA-H100-80GB-HBM3", "capacityTokensPerSecond": 300},
        {
            "name": "small",
            "gpuType": "NVIDIA-H100-80GB-HBM3",
            "gpusPerInstance": 4,
            "capacityTokensPerSecond": 120,
        },
    ]
    obj["spec"]["regions"] = [
        {"name": "us-east", "minInstances": 0, "maxInstances": 3},
        {"name": "us-west", "minInstances": 0, "maxInstances": 5},
    ]
    route = model_route(obj)
    assert route is not None
    assert route.request_tps == 0.0  # promoted 30 min before its deadline, as in the simulator
    assert route.capacity_at_max_tps == 300.0 * 8  # the largest θ × Σ maxInstances


def test_admission_judges_deadlines_with_the_theta_the_plan_sizes_with() -> None:
    md = load_scenario(default_scenario_dir()).models[0]
    obj = manifest(md)
    declared = model_route(obj)
    assert declared is not None
    fastest = max(md.spec.variants, key=lambda v: v.capacity_tokens_per_second)
    theta = float(fastest.capacity_tokens_per_second)
    at_max = sum(r.max_instances for r in md.spec.regions)
    assert declared.capacity_at_max_tps == theta * at_max
    row = {
        "variant": fastest.name,
        "region": md.spec.regions[0].name,
        "declaredTokensPerSecond": theta,
        "learnedTokensPerSecond": 1.5 * theta,
        "inForceTokensPerSecond": 1.5 * theta,
        "windows": 60,
        "qualifyingWindows": 50,
        "trusted": True,
    }
    # the plan loop recorded a trusted θ half again the declared one
    learned = model_route({**obj, "status": {"capacity": [row]}})
    assert learned is not None and learned.capacity_at_max_tps == 1.5 * theta * at_max
    # not yet trusted, or a status the router cannot read: the declared θ
    for status in ({"capacity": [{**row, "trusted": False}]}, {"capacity": 7}, "garbage"):
        route = model_route({**obj, "status": status})
        assert route is not None and route.capacity_at_max_tps == theta * at_max
