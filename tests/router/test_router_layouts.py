"""The router's dispatch by request type between the variants of an OServe layout (OServe
§4.2, `dispatch.layout_dispatch`, `Fleet._by_type`): which pod a long-prompt and a
short-prompt request go to under given weights, the shares, the overflow, the type-free
fallbacks, and the plan's `status.layouts` read through discovery into the fleet."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import aiohttp
from aiohttp import web

from sageserve.api.scaling_policy import ScalingPolicy
from sageserve.dispatch.instance_picker import Arrival, make_picker
from sageserve.dispatch.tiers import TierMatch
from sageserve.router.app import Router, RouterConfig, run_loop
from sageserve.router.discovery import Discovery, policy_routing
from sageserve.router.fleet import Backend, Fleet, ModelRoute
from sageserve.router.metrics import RouterMetrics
from tests.router.test_router_http import Pod, sample, start

MODEL = ModelRoute("llm", "llama", "meta-llama/Llama-2-70b", ("us-east",), ("iw-f",))
EAST = ("llm", "llama", "us-east")

#: type 0: short prompts (100 tokens), type 1: long prompts (2,000); both 256 output tokens,
#: the length predictor's cold start, so the prompt decides the type
SHORT, LONG = Arrival(80, 256), Arrival(2500, 256)


def types(
    short: dict[str, float], long: dict[str, float]
) -> list[tuple[float, float, dict[str, float]]]:
    return [(100.0, 256.0, short), (2000.0, 256.0, long)]


def fleet_of(*pods: tuple[str, str]) -> Fleet:
    """A fleet with the pods (name, variant) in us-east."""
    fleet = Fleet()
    fleet.set_models([MODEL])
    fleet.set_backends(
        Backend("llm", name, "llama", "us-east", variant, f"http://{name}")
        for name, variant in pods
    )
    return fleet


def choose(fleet: Fleet, arrival: Arrival | None, exclude: frozenset[str] = frozenset()) -> str:
    b = fleet.choose_backend(MODEL, "us-east", exclude, arrival)
    assert b is not None
    return b.pod


PODS = (("tp4-a", "tp4"), ("tp4-b", "tp4"), ("tp8-a", "tp8"))


def test_a_long_prompt_goes_to_the_variant_its_type_weighs_and_a_short_one_to_the_other() -> None:
    fleet = fleet_of(*PODS)
    fleet.set_layouts("llm", {("llama", "us-east"): types({"tp4": 1.0}, {"tp8": 1.0})})
    assert choose(fleet, SHORT) == "tp4-a"
    assert choose(fleet, LONG) == "tp8-a"
    # within the variant, the type-free picker (fewest tokens in flight)
    fleet.remaining["tp4-a"] = 500.0
    assert choose(fleet, SHORT) == "tp4-b"
    assert fleet.layout_dispatches == {
        (EAST, 0, "tp4", False): 2,
        (EAST, 1, "tp8", False): 1,
    }


def test_a_type_split_between_variants_follows_its_weights_exactly() -> None:
    fleet = fleet_of(*PODS)
    fleet.set_layouts("llm", {("llama", "us-east"): types({"tp4": 0.75, "tp8": 0.25}, {})})
    got = [choose(fleet, SHORT) for _ in range(100)]
    assert sum(p.startswith("tp4") for p in got) == 75
    assert sum(p == "tp8-a" for p in got) == 25
    # the long type weighs nothing: the type-free picker, not counted
    assert choose(fleet, LONG) == "tp4-a"
    assert sum(fleet.layout_dispatches.values()) == 100


def test_without_layouts_or_an_arrival_the_choice_is_unchanged() -> None:
    plain, laid = fleet_of(*PODS), fleet_of(*PODS)
    # every pod's variant named (tp4 with weight 0): the weights would apply
    laid.set_layouts("llm", {("llama", "us-east"): types({"tp8": 1.0, "tp4": 0.0}, {"tp8": 1.0})})
    for f in (plain, laid):
        f.remaining.update({"tp4-a": 30.0, "tp4-b": 10.0, "tp8-a": 20.0})
    assert choose(plain, SHORT) == choose(plain, LONG) == "tp4-b"
    assert choose(laid, None) == "tp4-b"  # no arrival: the type is unknown
    assert not laid.layout_dispatches
    # another namespace's layouts do not apply, and replacing this one's drops them
    laid.set_layouts("other", {("llama", "us-east"): types({"tp4": 1.0}, {})})
    assert choose(laid, SHORT) == "tp8-a"
    laid.set_layouts("llm", {})
    assert choose(laid, SHORT) == "tp4-b"


def test_a_pod_of_a_variant_the_layout_does_not_name_keeps_the_type_free_rule() -> None:
    # a third variant (another GPU type, or one the plan has not weighed yet) would get
    # nothing under weights that do not name it: the endpoint is dispatched without them
    fleet = fleet_of(*PODS, ("a100-a", "a100-tp8"))
    fleet.set_layouts("llm", {("llama", "us-east"): types({"tp8": 1.0, "tp4": 0.0}, {"tp8": 1.0})})
    fleet.remaining.update({"tp4-a": 30.0, "tp4-b": 10.0, "tp8-a": 20.0, "a100-a": 5.0})
    assert choose(fleet, SHORT) == "a100-a"
    assert not fleet.layout_dispatches
    # with it out of the candidates (ejected, or tried), the weights apply again
    assert choose(fleet, SHORT, frozenset({"a100-a"})) == "tp8-a"


def test_a_type_whose_variant_has_no_candidate_pod_goes_by_the_type_free_rule() -> None:
    fleet = fleet_of(*PODS)
    fleet.set_layouts("llm", {("llama", "us-east"): types({"tp4": 1.0}, {"tp8": 1.0})})
    fleet.remaining.update({"tp4-a": 30.0, "tp4-b": 10.0})
    assert choose(fleet, LONG, frozenset({"tp8-a"})) == "tp4-b"  # its only pod ejected
    assert not fleet.layout_dispatches


def test_a_swamped_pod_overflows_to_the_least_loaded_pod_of_another_variant() -> None:
    fleet = fleet_of(*PODS)
    fleet.set_layouts("llm", {("llama", "us-east"): types({"tp4": 1.0}, {"tp8": 1.0})})
    fleet.remaining.update({"tp8-a": 2524.0, "tp4-a": 1000.0, "tp4-b": 1200.0})
    assert choose(fleet, LONG) == "tp8-a"  # 2,524 = 1.5 × 1,000 + 1,024: not swamped
    fleet.remaining["tp8-a"] = 2525.0
    assert choose(fleet, LONG) == "tp4-a"  # swamped: the least-loaded tp4 pod
    assert fleet.layout_dispatches == {
        (EAST, 1, "tp8", False): 1,
        (EAST, 1, "tp4", True): 1,
    }


def test_the_overflow_goes_only_to_variants_the_type_weighs_when_it_weighs_several() -> None:
    fleet = fleet_of(("a-0", "a"), ("b-0", "b"), ("c-0", "c"))
    # c is named (weight 0 for this type): it stays out of the overflow's candidates
    fleet.set_layouts(
        "llm", {("llama", "us-east"): types({"a": 0.5, "b": 0.5, "c": 0.0}, {"c": 1.0})}
    )
    fleet.remaining.update({"a-0": 9000.0, "b-0": 9000.0})
    got = {choose(fleet, SHORT) for _ in range(4)}
    assert got == {"a-0", "b-0"}
    fleet.remaining["a-0"] = 90_000.0
    assert {choose(fleet, SHORT) for _ in range(4)} == {"b-0"}  # a's turns overflow to b


def test_a_named_picker_compares_anticipated_tokens_left() -> None:
    fleet = fleet_of(*PODS)
    fleet.picker = make_picker("token-jsq")
    fleet.set_layouts("llm", {("llama", "us-east"): types({"tp4": 1.0}, {"tp8": 1.0})})
    for _ in range(3):  # 3 × (2,500 + 256) tokens anticipated on the tp8 pod
        fleet.track(fleet.backends[EAST][2], MODEL, 0, LONG)
    assert fleet.tokens_left(fleet.backends[EAST][2]) == 3 * (2500 + 256)
    assert choose(fleet, LONG) == "tp4-a"


def test_an_unchanged_layout_keeps_its_turns_and_a_new_one_starts_them_again() -> None:
    fleet = fleet_of(*PODS)
    layout = {("llama", "us-east"): types({"tp4": 0.5, "tp8": 0.5}, {})}
    fleet.set_layouts("llm", layout)
    first = choose(fleet, SHORT)
    fleet.set_layouts("llm", layout)  # the policy's status rewritten, same weights
    assert choose(fleet, SHORT)[:3] != first[:3]  # the turn moved on
    fleet.set_layouts("llm", {("llama", "us-east"): types({"tp4": 0.5, "tp8": 0.5}, {"tp8": 1})})
    assert choose(fleet, SHORT)[:3] == first[:3]  # new types: the turns start again


def policy(layouts: list[dict[str, Any]]) -> dict[str, Any]:
    """A ScalingPolicy as the API server lists it, validated against the CRD's model."""
    obj = {
        "apiVersion": "sageserve.io/v1alpha1",
        "kind": "ScalingPolicy",
        "metadata": {"name": "p", "namespace": "llm"},
        "spec": {},
        "status": {
            "layouts": layouts,
            "plan": {
                "computedAt": "2026-01-01T00:00:00Z",
                "strategy": "lt-utilization",
                "solverStatus": "optimal",
                "solverSeconds": 0.1,
                "spillover": [{"model": "llama", "from": "us-east", "to": "us-west", "share": 0.2}],
            },
        },
    }
    return ScalingPolicy.model_validate(obj).model_dump(by_alias=True, mode="json")


def layout_entry(long: list[dict[str, Any]]) -> dict[str, Any]:
    """One `status.layouts` entry: short prompts all to tp4, long ones per `long`."""
    return {
        "model": "llama",
        "region": "us-east",
        "gpuType": "NVIDIA-H100-80GB-HBM3",
        "computedAt": "2026-01-01T00:00:00Z",
        "replicas": [{"variant": "tp4", "replicas": 2}, {"variant": "tp8", "replicas": 1}],
        "types": [
            {
                "promptTokens": 100,
                "outputTokens": 256,
                "rate": 3.0,
                "weights": [{"variant": "tp4", "weight": 1.0}],
            },
            {"promptTokens": 2000, "outputTokens": 256, "rate": 1.0, "weights": long},
        ],
    }


LAYOUT = layout_entry([{"variant": "tp8", "weight": 1.0}])


def test_a_policys_status_layouts_reach_the_fleet_through_discovery() -> None:
    spill, layouts = policy_routing([policy([LAYOUT])])
    assert spill == {"llama": {"us-east": {"us-west": 0.2}}}
    assert layouts == {
        ("llama", "us-east"): [(100.0, 256.0, {"tp4": 1.0}), (2000.0, 256.0, {"tp8": 1.0})]
    }

    class Loop:  # the discovery thread hands over to the event loop: here, at once
        def call_soon_threadsafe(self, fn: Callable[..., None], *args: Any) -> None:
            fn(*args)

    fleet = fleet_of(*PODS)
    discovery = Discovery(fleet, Loop(), ["llm"])  # type: ignore[arg-type]
    discovery._policies_for("llm")([policy([LAYOUT]), policy([])])
    assert set(fleet.layouts) == {EAST}
    assert fleet.layouts[EAST].log_centroids[1] == (math.log1p(2000), math.log1p(256))
    assert fleet.spill[("llm", "llama")] == {"us-east": {"us-west": 0.2}}
    assert choose(fleet, LONG) == "tp8-a" and choose(fleet, SHORT) == "tp4-a"
    discovery._policies_for("llm")([policy([])])  # the plan dropped the layout
    assert not fleet.layouts


def test_over_http_requests_split_by_type_per_the_weights() -> None:
    """Two stand-in pods of two variants behind the real router: short prompts go to the
    tp4 pod, long prompts 2 : 1 to tp8 and tp4, as the plan's weights say; the counter
    shows it."""

    async def main() -> None:
        runners, stand_ins, backends = [], {}, []
        for name, variant in (("tp4-0", "tp4"), ("tp8-0", "tp8")):
            pod = Pod(name)
            app = web.Application()
            app.router.add_post("/v1/completions", pod.completions)
            runner, port = await start(app)
            runners.append(runner)
            stand_ins[name] = pod
            backends.append(
                Backend("llm", name, "llama", "us-east", variant, f"http://127.0.0.1:{port}")
            )
        fleet = Fleet()
        fleet.set_models([MODEL])
        fleet.set_tiers("llm", {"iw-f": TierMatch("iw-f", ("fast",))})
        fleet.set_backends(backends)
        long = [{"variant": "tp8", "weight": 2 / 3}, {"variant": "tp4", "weight": 1 / 3}]
        _, layouts = policy_routing([policy([layout_entry(long)])])
        fleet.set_layouts("llm", layouts)
        metrics = RouterMetrics()
        metrics.watch(fleet)
        router = Router(fleet, RouterConfig(hold_seconds=5.0), metrics)
        runner, port = await start(router.app())
        runners.append(runner)
        url = f"http://127.0.0.1:{port}/v1/completions"
        try:
            async with aiohttp.ClientSession() as client:
                got: dict[str, list[str]] = {"short": [], "long": []}
                for kind, prompt in [("short", "x" * 300), ("long", "x" * 9000)] * 6:
                    body = {"model": MODEL.served_name, "prompt": prompt, "max_tokens": 8}
                    async with client.post(url, json=body) as r:
                        assert r.status == 200
                        got[kind].append((await r.json())["pod"])
        finally:
            for each in runners:
                await each.cleanup()
        assert got["short"] == ["tp4-0"] * 6
        assert sorted(got["long"]) == ["tp4-0"] * 2 + ["tp8-0"] * 4
        labels = dict(namespace="llm", model_deployment="llama", region="us-east")
        name = "sageserve_router_layout_dispatch_total"
        assert sample(metrics, name, **labels, type="0", variant="tp4", overflow="false") == 6
        assert sample(metrics, name, **labels, type="1", variant="tp8", overflow="false") == 4
        assert sample(metrics, name, **labels, type="1", variant="tp4", overflow="false") == 2
        assert len(stand_ins["tp8-0"].got) == 4

    run_loop(main())
