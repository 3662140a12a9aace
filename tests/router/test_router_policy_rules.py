"""The router routes and releases by each model's ScalingPolicy (`spec.routing`): the region
threshold (SageServe §6.1) and the Queue Manager's release thresholds (§6.2) reach the
model's `ModelRoute` through discovery, and the Queue Manager, a batch-tier request sent
synchronously and the region choice follow them. A policy missing or not validating counts
as the default policy."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from sageserve.api.model_deployment import ModelDeployment
from sageserve.router.discovery import Discovery, follow_policy, model_route, policy_specs
from sageserve.router.fleet import Backend, Fleet, ModelRoute
from sageserve.router.pool_switcher import pool_routes
from sageserve.sim.scenario import default_scenario_dir, load_scenario
from tests.router import test_batch_release as batch
from tests.router import test_router_http as http
from tests.router.test_router_pool import pool_object

STRICT = {"batchRelease": {"oneBelowEmu": 0.3, "twoBelowEmu": 0.2}}


def policy(name: str, routing: dict[str, Any], namespace: str = "llm") -> dict[str, Any]:
    return {
        "apiVersion": "sageserve.io/v1alpha1",
        "kind": "ScalingPolicy",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"routing": routing},
    }


def under(route: ModelRoute, name: str, routing: dict[str, Any] | None) -> ModelRoute:
    """`dispatch` as discovery serves it under policy `name` (None: no such policy)."""
    objs = [] if routing is None else [policy(name, routing)]
    return follow_policy(replace(route, policy=name), policy_specs(objs))


class Loop:  # the discovery thread hands over to the event loop: here, at once
    def call_soon_threadsafe(self, fn: Callable[..., None], *args: Any) -> None:
        fn(*args)


@functools.cache
def scenario_model() -> ModelDeployment:
    return load_scenario(default_scenario_dir()).models[0]


def deployment(name: str, policy_name: str) -> dict[str, Any]:
    """A ModelDeployment of the default scenario renamed, under policy `policy_name`."""
    md = scenario_model()
    obj: dict[str, Any] = md.model_dump(by_alias=True, mode="json", exclude_none=True)
    obj["metadata"].update(name=name, namespace="llm")
    obj["spec"]["model"]["servedName"] = name
    obj["spec"]["policyRef"]["name"] = policy_name
    return obj


def test_discovery_gives_each_model_its_own_policys_routing_rules() -> None:
    fleet = Fleet()
    discovery = Discovery(fleet, Loop(), ["llm"])  # type: ignore[arg-type]
    discovery._models_for("llm")([deployment("a", "strict"), deployment("b", "fleet")])
    # the policies not listed yet: the default policy's rules
    assert fleet.models["a"].policy == "strict"
    assert fleet.models["a"].release_rules == ((0.5, 2), (0.6, 1))
    assert fleet.models["a"].route_threshold == 0.7

    strict = policy("strict", {**STRICT, "regionEmuThreshold": 0.5})
    discovery._policies_for("llm")([strict, policy("fleet", {})])
    assert fleet.models["a"].release_rules == ((0.2, 2), (0.3, 1))
    assert fleet.models["a"].route_threshold == 0.5
    assert fleet.models["b"].release_rules == ((0.5, 2), (0.6, 1))
    assert fleet.models["b"].route_threshold == 0.7

    # a ModelDeployment listed again keeps its policy's rules
    discovery._models_for("llm")([deployment("a", "strict")])
    assert set(fleet.models) == {"a"}
    assert fleet.models["a"].release_rules == ((0.2, 2), (0.3, 1))

    # a policy that does not validate, or is deleted, counts as the default policy
    discovery._policies_for("llm")([policy("strict", {"regionEmuThreshold": 2.0})])
    assert fleet.models["a"].route_threshold == 0.7
    assert fleet.models["a"].release_rules == ((0.5, 2), (0.6, 1))
    discovery._policies_for("llm")([strict])
    assert fleet.models["a"].route_threshold == 0.5
    discovery._policies_for("llm")([])
    assert fleet.models["a"].release_rules == ((0.5, 2), (0.6, 1))

    # a policy of the same name in another namespace is not this model's
    discovery._policies_for("other")([policy("strict", STRICT, "other")])
    assert fleet.models["a"].release_rules == ((0.5, 2), (0.6, 1))


def test_a_model_deployment_and_a_model_pool_name_their_policy() -> None:
    route = model_route(deployment("a", "strict"))
    assert route is not None and route.policy == "strict"
    found = pool_routes(pool_object())
    assert found is not None and found[1]
    assert all(r.policy == "fleet" for r in found[1])


@pytest.mark.parametrize(
    ("routing", "emu", "released"),
    [
        (None, 0.4, 2),  # the default policy: 2 under 50 %
        (STRICT, 0.4, 0),  # oneBelowEmu 0.3: nothing at 40 %
        (None, 0.55, 1),  # the default policy: 1 under 60 %
        (STRICT, 0.55, 0),
        (STRICT, 0.25, 1),  # under 30 %: 1
        (STRICT, 0.15, 2),  # under 20 %: 2
    ],
)
def test_the_queue_manager_releases_by_the_models_policy(
    tmp_path: Path, routing: dict[str, Any] | None, emu: float, released: int
) -> None:
    """Three queued requests, the region at `emu`: the first signal releases what the
    policy's rule gives; each release raises the router's EMU estimate by ~26 % (a ~260
    token request on 1,000 tokens of cache), past either policy's thresholds, so no more
    follow."""

    async def scenario(client, url, fleet, pod, metrics, store) -> None:  # type: ignore[no-untyped-def]
        fleet.set_load({batch.EAST: (emu, 1000.0)})
        lines = [batch.request_line(c) for c in ("a", "b", "c")]
        await batch.submit(client, url, lines)
        for _ in range(100):
            if len(pod.got) >= released:
                break
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.5)  # ten more signals
        assert len(pod.got) == released

    batch.run(tmp_path, scenario, under(batch.MODEL, "p", routing))


def test_a_batch_request_sent_synchronously_waits_for_its_policys_trough() -> None:
    async def scenario(client, url, fleet, pods, metrics) -> None:  # type: ignore[no-untyped-def]
        east = ("llm", "llama", "us-east")
        niw = {"x-sageserve-tier": "niw", "x-sageserve-region": "us-east"}
        fleet.set_load({east: (0.4, 1000.0)})  # a trough for the default policy
        async with client.post(f"{url}/v1/completions", json=http.body(), headers=niw) as r:
            assert r.status == 200
        assert len(pods["east-0"].got) == 1

        fleet.set_models([under(http.MODEL, "p", STRICT)])
        fleet.set_load({east: (0.4, 1000.0)})  # not one for a policy releasing under 30 %
        held = asyncio.create_task(
            client.post(f"{url}/v1/completions", json=http.body(), headers=niw)
        )
        await asyncio.sleep(0.3)
        labels = dict(namespace="llm", model_deployment="llama", region="us-east", tier="niw")
        assert http.sample(metrics, "sageserve_router_deferred_requests", **labels) == 1
        assert len(pods["east-0"].got) == 1
        fleet.set_load({east: (0.25, 1000.0)})
        async with await held as r:
            assert r.status == 200
        assert len(pods["east-0"].got) == 2

    http.run(scenario, {"east-0": ("us-east", False)})


def test_the_region_choice_follows_the_models_policy_threshold() -> None:
    regions = ("r1", "r2")
    fleet = Fleet()
    fleet.set_backends(Backend("ns", f"p-{r}", "m", r, "v", "http://x") for r in regions)
    fleet.set_load({("ns", "m", "r1"): (0.6, 0.0), ("ns", "m", "r2"): (0.1, 0.0)})
    model = ModelRoute("ns", "m", "m", regions, ("iw-f",))
    assert fleet.choose_region(under(model, "p", None), "r1") == "r1"  # 60 % < 70 %
    lower = under(model, "p", {"regionEmuThreshold": 0.5})
    assert fleet.choose_region(lower, "r1") == "r2"  # 60 % is not under 50 %
