"""The pace loop's arithmetic: what it observes, what it holds, where replicas go."""

from __future__ import annotations

from pathlib import Path

import yaml

from sageserve.api.model_deployment import ModelDeployment
from sageserve.controller.pacing import (
    PodSetState,
    endpoint_observations,
    pod_set_states,
    replicas_after,
)
from sageserve.controller.podset import render_pod_sets
from sageserve.core.types import ActionKind, EndpointKey, ScalingAction

ROOT = Path(__file__).resolve().parents[2]
NS = "llm"


def _llama() -> ModelDeployment:
    docs = yaml.safe_load_all((ROOT / "policies" / "base" / "models.yaml").read_text())
    return ModelDeployment.model_validate(next(iter(docs)))


def test_pod_set_states_read_replicas_and_readiness() -> None:
    md = _llama()
    deployments = {d["metadata"]["name"]: d for d in render_pod_sets(md, {}, NS)}
    deployments["llama-2-70b-us-east-h100"]["status"] = {"readyReplicas": 18}
    states = pod_set_states(md, deployments)
    assert states[0] == PodSetState("us-east", "h100", 20, 18)
    assert len(states) == 6


def test_observations_count_unready_replicas_as_provisioning() -> None:
    md = _llama()
    states = [PodSetState("us-east", "h100", 10, 7), PodSetState("us-east", "a100", 2, 2)]
    emu = {(NS, "llama-2-70b", "us-east"): 0.8}
    tps = {(NS, "llama-2-70b", "us-east"): 900.0}
    obs, held = endpoint_observations(md, NS, states, emu, tps, now=50.0)
    east = obs[EndpointKey("llama-2-70b", "us-east")]
    assert (east.serving, east.provisioning, east.emu, east.tokens_per_s) == (9, 3, 0.8, 900.0)
    assert (east.min_instances, east.max_instances, east.time) == (2, 40, 50.0)
    assert held == []  # regions without ready pods have nothing to hide


def test_a_region_with_ready_pods_but_no_utilisation_is_held() -> None:
    md = _llama()
    states = [PodSetState("us-east", "h100", 10, 10), PodSetState("us-west", "h100", 4, 4)]
    obs, held = endpoint_observations(
        md, NS, states, {(NS, "llama-2-70b", "us-east"): 0.5}, {}, 0.0
    )
    assert held == ["us-west"]
    assert EndpointKey("llama-2-70b", "us-west") not in obs


def _action(kind: ActionKind, count: int = 1) -> ScalingAction:
    return ScalingAction(kind, EndpointKey("llama-2-70b", "us-east"), count)


def test_scale_out_fills_the_variant_furthest_below_its_plan() -> None:
    states = [PodSetState("us-east", "h100", 4, 4), PodSetState("us-east", "a100", 1, 1)]
    plan = {("us-east", "h100"): 5, ("us-east", "a100"): 4}
    out = replicas_after(_action(ActionKind.SCALE_OUT, 3), states, ["h100", "a100"], plan)
    assert out == {("us-east", "h100"): 5, ("us-east", "a100"): 3}


def test_without_a_plan_scale_out_uses_the_first_variant_and_in_the_largest() -> None:
    states = [PodSetState("us-east", "h100", 4, 4), PodSetState("us-east", "a100", 6, 6)]
    assert replicas_after(_action(ActionKind.SCALE_OUT), states, ["h100", "a100"]) == {
        ("us-east", "h100"): 5
    }
    assert replicas_after(_action(ActionKind.SCALE_IN, 2), states, ["h100", "a100"]) == {
        ("us-east", "a100"): 4
    }


def test_scale_in_never_goes_below_zero() -> None:
    states = [PodSetState("us-east", "h100", 1, 1)]
    assert replicas_after(_action(ActionKind.SCALE_IN, 5), states, ["h100"]) == {
        ("us-east", "h100"): 0
    }


def test_a_missing_pod_set_is_created_by_scale_out() -> None:
    assert replicas_after(_action(ActionKind.SCALE_OUT), [], ["h100", "a100"]) == {
        ("us-east", "h100"): 1
    }
