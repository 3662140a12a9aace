"""The gateway examples of docs/gateway.md parse, and say what the operator does: the
InferencePool and InferenceObjective shown are the ones it renders for the example
ModelDeployment, and every HTTPRoute sends to one of those pools. (Their schemas are
checked by the API server in tests/e2e/test_e2e_operator_inference_pool.py.)"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from sageserve.api.model_deployment import ModelDeployment
from sageserve.api.validate import validate_paths
from sageserve.controller import inference_pool as ip

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "docs" / "examples" / "gateway"
TIERS = ROOT / "policies" / "base" / "tiers.yaml"
KINDS = {
    ("sageserve.io/v1alpha1", "ModelDeployment"),
    ("inference.networking.k8s.io/v1", "InferencePool"),
    ("llm-d.ai/v1alpha2", "InferenceObjective"),
    ("gateway.networking.k8s.io/v1", "Gateway"),
    ("gateway.networking.k8s.io/v1", "HTTPRoute"),
}


def _docs(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((EXAMPLES / name).read_text()) if d]


def _example_model() -> ModelDeployment:
    return ModelDeployment.model_validate(_docs("modeldeployment.yaml")[0])


def _rendered() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    md = _example_model()
    assert md.spec.gateway is not None and md.spec.gateway.endpoint_picker is not None
    tiers = ip.tier_priorities(list(yaml.safe_load_all(TIERS.read_text())))
    scope = ip.pool_scope(md, layouts_declared=False)
    picker = md.spec.gateway.endpoint_picker
    return ip.render_gateway(md, scope, picker, tiers, ip.OBJECTIVE_APIS[0], "llm", None)


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.yaml")), ids=lambda p: p.name)
def test_every_example_parses_with_known_kinds_and_no_namespace(path: Path) -> None:
    docs = _docs(path.name)
    assert docs
    for doc in docs:
        assert (doc["apiVersion"], doc["kind"]) in KINDS
        # applied with `kubectl apply -n <namespace of the ModelDeployment>`
        assert "namespace" not in doc["metadata"]


def test_the_example_model_deployment_validates() -> None:
    report = validate_paths([EXAMPLES / "modeldeployment.yaml", TIERS])
    assert report.ok, report.problems


def _without_owner(obj: dict[str, Any]) -> dict[str, Any]:
    meta = {k: v for k, v in obj["metadata"].items() if k not in ("namespace", "ownerReferences")}
    return {**obj, "metadata": meta}


def test_the_pool_shown_is_the_one_the_operator_renders() -> None:
    pools, _ = _rendered()
    assert [_without_owner(p) for p in pools] == _docs("inferencepool.yaml")


def test_the_objective_shown_is_the_one_the_operator_renders() -> None:
    _, objectives = _rendered()
    shown = _docs("inferenceobjective.yaml")[0]
    by_name = {o["metadata"]["name"]: _without_owner(o) for o in objectives}
    assert by_name[shown["metadata"]["name"]] == shown
    assert sorted(o["spec"]["priority"] for o in objectives) == [-3, 999, 1000]


@pytest.mark.parametrize(
    ("name", "gateway_class"), [("istio.yaml", "istio"), ("agentgateway.yaml", "agentgateway")]
)
def test_routes_send_to_a_pool_the_operator_owns(name: str, gateway_class: str) -> None:
    docs = _docs(name)
    gateways = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Gateway"}
    assert [g["spec"]["gatewayClassName"] for g in gateways.values()] == [gateway_class]
    rendered_pools, objectives = _rendered()
    pools = {p["metadata"]["name"] for p in rendered_pools}
    objective_names = {o["metadata"]["name"] for o in objectives}
    set_objectives: set[str] = set()
    routes = [d for d in docs if d["kind"] == "HTTPRoute"]
    assert routes
    for route in routes:
        for parent in route["spec"]["parentRefs"]:
            assert parent["kind"] == "Gateway" and parent["name"] in gateways
        for rule in route["spec"]["rules"]:
            for f in rule.get("filters", []):
                modifier = f["requestHeaderModifier"]
                for header in modifier.get("set", []):
                    assert header["name"] == ip.OBJECTIVE_HEADER
                    set_objectives.add(header["value"])
                if not modifier.get("set"):  # the rule without a tier drops a client's own
                    assert ip.OBJECTIVE_HEADER in modifier["remove"]
            for ref in rule["backendRefs"]:
                assert (ref["group"], ref["kind"]) == (
                    "inference.networking.k8s.io",
                    "InferencePool",
                )
                assert ref["name"] in pools
    # every tier of the model has its rule, naming an objective the operator owns
    assert set_objectives == objective_names
