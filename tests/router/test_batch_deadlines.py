"""What the router's Queue Manager knows of a model is what the simulator's is given: the
per-request decode rate its promotion by slack divides tokens by (SageServe §6.2, §6.3)."""

from __future__ import annotations

from typing import Any

from sageserve.api.model_deployment import ModelDeployment
from sageserve.router.discovery import model_route
from sageserve.sim.engine import request_decode_tps
from sageserve.sim.scenario import default_scenario_dir, load_scenario


def manifest(md: ModelDeployment, namespace: str = "llm") -> dict[str, Any]:
    obj: dict[str, Any] = md.model_dump(by_alias=True, mode="json", exclude_none=True)
    obj["metadata"]["namespace"] = namespace
    return obj


def test_discovery_gives_each_model_the_simulators_request_rate() -> None:
    scenario = load_scenario(default_scenario_dir())
    setups = {m.name: m for m in scenario.sim_config().models}
    assert len(setups) == 4
    for md in scenario.models:
        route = model_route(manifest(md))
        setup = setups[md.metadata.name]
        assert route is not None
        assert route.request_tps == request_decode_tps(setup) > 0


def test_a_model_without_a_perf_profile_has_no_rate() -> None:
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
