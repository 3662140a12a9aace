"""InferencePools and InferenceObjectives rendered from a ModelDeployment (pure), the
operator's settings, and one reconcile pass against an in-memory API (the real API server
is exercised by tests/e2e/test_e2e_operator_inference_pool.py)."""

from __future__ import annotations

import copy
import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes.client.exceptions import ApiException

from sageserve.api.model_deployment import (
    EndpointPicker,
    FailureMode,
    ModelDeployment,
    PoolScope,
    inference_pool_name,
)
from sageserve.api.workload_tier import TierType
from sageserve.controller import inference_pool as ip
from sageserve.controller.podset import render_pod_sets

ROOT = Path(__file__).resolve().parents[2]
EPP = EndpointPicker(name="vllm-epp", port=9002)
NOW = datetime(2026, 11, 27, tzinfo=UTC)


def _llama(**spec: Any) -> ModelDeployment:
    """policies/base/models.yaml's Llama-2-70B: three regions, variants h100 and a100."""
    docs = yaml.safe_load_all((ROOT / "policies" / "base" / "models.yaml").read_text())
    raw = next(iter(docs))
    raw["spec"].update(spec)
    return ModelDeployment.model_validate(raw)


def _tiers() -> list[dict[str, Any]]:
    return list(yaml.safe_load_all((ROOT / "policies" / "base" / "tiers.yaml").read_text()))


# --- settings ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "name", "port", "mode"),
    [
        ("vllm-epp:9002", "vllm-epp", 9002, FailureMode.FAIL_CLOSE),
        ("epp:1:FailOpen", "epp", 1, FailureMode.FAIL_OPEN),
        (" epp:65535:FailClose ", "epp", 65535, FailureMode.FAIL_CLOSE),
    ],
)
def test_endpoint_picker_parses(text: str, name: str, port: int, mode: FailureMode) -> None:
    picker = ip.parse_endpoint_picker(text)
    assert (picker.name, picker.port, picker.failure_mode) == (name, port, mode)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("epp", "expected SERVICE:PORT"),
        ("epp:", "expected SERVICE:PORT"),
        (":9002", "expected SERVICE:PORT"),
        ("epp:90x2", "port '90x2' is not a number"),
        ("epp:9002:Sometimes", "failure mode 'Sometimes' is not one of ['FailOpen', 'FailClose']"),
        ("epp:0", "port: Input should be greater than or equal to 1"),
        ("epp:70000", "port: Input should be less than or equal to 65535"),
        ("Bad_Name:9002", "name: String should match pattern"),
        ("a:1:FailOpen:x", "expected SERVICE:PORT"),
    ],
)
def test_bad_endpoint_picker_is_refused_naming_the_fix(text: str, says: str) -> None:
    with pytest.raises(ip.GatewayConfigError, match="endpoint picker") as err:
        ip.parse_endpoint_picker(text)
    assert says in str(err.value)


def test_operator_settings_from_the_environment() -> None:
    assert ip.gateway_config({}) == ip.GatewayConfig(True, None)
    assert ip.gateway_config({ip.ENV_POOLS: "off"}).enabled is False
    on = ip.gateway_config({ip.ENV_POOLS: "AUTO", ip.ENV_ENDPOINT_PICKER: "epp:9002:FailOpen"})
    assert on == ip.GatewayConfig(
        True, EndpointPicker(name="epp", port=9002, failure_mode="FailOpen")
    )
    with pytest.raises(ip.GatewayConfigError) as err:
        ip.gateway_config({ip.ENV_POOLS: "yes"})
    assert "SAGESERVE_INFERENCE_POOLS='yes' is not auto or off" in str(err.value)
    assert "gateway.inferencePool.enabled" in str(err.value)
    with pytest.raises(ip.GatewayConfigError) as err:
        ip.gateway_config({ip.ENV_ENDPOINT_PICKER: "epp"})
    assert str(err.value).startswith("SAGESERVE_ENDPOINT_PICKER: endpoint picker 'epp'")
    assert "--endpoint-picker" in str(err.value) and "gateway.endpointPicker" in str(err.value)


# --- rendering ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("gateway", "layouts", "scope"),
    [
        (None, False, PoolScope.REGION),
        (None, True, PoolScope.VARIANT),
        ({"poolScope": "Region"}, True, PoolScope.REGION),
        ({"poolScope": "Variant"}, False, PoolScope.VARIANT),
    ],
)
def test_pool_scope(gateway: dict[str, Any] | None, layouts: bool, scope: PoolScope) -> None:
    assert ip.pool_scope(_llama(gateway=gateway), layouts) is scope


def test_layouts_need_several_variants_for_pools_per_variant() -> None:
    md = _llama()
    md.spec.variants = md.spec.variants[:1]
    assert ip.pool_scope(md, True) is PoolScope.REGION


def test_policy_declares_layouts() -> None:
    policies = [
        {"metadata": {"name": "a"}, "spec": {"layouts": {"budgetGpus": 16}}},
        {"metadata": {"name": "b"}, "spec": {"strategy": "lt-ua"}},
    ]
    assert ip.policy_declares_layouts(policies, "a") is True
    assert ip.policy_declares_layouts(policies, "b") is False
    assert ip.policy_declares_layouts(policies, "missing") is False


@pytest.mark.parametrize(
    ("scope", "names"),
    [
        (
            PoolScope.REGION,
            ["llama-2-70b-us-east", "llama-2-70b-us-central", "llama-2-70b-us-west"],
        ),
        (
            PoolScope.VARIANT,
            [
                f"llama-2-70b-{r}-{v}"
                for r in ("us-east", "us-central", "us-west")
                for v in ("h100", "a100")
            ],
        ),
    ],
)
def test_pool_names(scope: PoolScope, names: list[str]) -> None:
    assert [t.name for t in ip.pool_targets(_llama(), scope)] == names


def test_a_region_naming_its_pool_gets_that_pool_the_name_its_picker_signals_are_read_under() -> (
    None
):
    md = _llama()
    regions = [r.model_dump(by_alias=True, exclude_none=True) for r in md.spec.regions]
    regions[0]["inferencePool"] = "east-gateway-pool"
    md = _llama(regions=regions)
    targets = ip.pool_targets(md, PoolScope.REGION)
    assert [t.name for t in targets] == [
        "east-gateway-pool",
        "llama-2-70b-us-central",
        "llama-2-70b-us-west",
    ]
    assert [t.name for t in targets] == [inference_pool_name(md, r) for r in md.spec.regions]


def _selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


@pytest.mark.parametrize("scope", list(PoolScope))
def test_each_pool_selects_exactly_its_pod_sets_pods(scope: PoolScope) -> None:
    """Against the pod template labels the operator renders: a region pool selects every
    variant's pods of its region, a variant pool one pod set's, and none selects a
    ModelPool's pods of the same name."""
    md = _llama()
    pod_sets = render_pod_sets(md, {}, "llm")
    for target in ip.pool_targets(md, scope):
        selector = ip.pool_selector(md.metadata.name, target)
        chosen = [
            d["metadata"]["name"]
            for d in pod_sets
            if _selects(selector, d["spec"]["template"]["metadata"]["labels"])
        ]
        variants = [target.variant] if target.variant else ["h100", "a100"]
        assert chosen == [f"llama-2-70b-{target.region}-{v}" for v in variants]
        pooled = {
            **pod_sets[0]["spec"]["template"]["metadata"]["labels"],
            "app.kubernetes.io/component": "pooled-inference",
        }
        assert not _selects(selector, pooled)


def test_rendered_pool() -> None:
    md = _llama(engine={"port": 8080})
    target = ip.pool_targets(md, PoolScope.REGION)[0]
    pool = ip.render_pool(md, target, EPP, "llm", "uid-1")
    assert pool["apiVersion"] == "inference.networking.k8s.io/v1"
    assert pool["kind"] == "InferencePool"
    assert pool["metadata"]["name"] == "llama-2-70b-us-east"
    assert pool["metadata"]["namespace"] == "llm"
    assert pool["metadata"]["ownerReferences"] == [
        {
            "apiVersion": "sageserve.io/v1alpha1",
            "kind": "ModelDeployment",
            "name": "llama-2-70b",
            "uid": "uid-1",
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]
    assert pool["spec"] == {
        "selector": {
            "matchLabels": {
                "app.kubernetes.io/managed-by": "sageserve",
                "app.kubernetes.io/component": "inference",
                "sageserve.io/model-deployment": "llama-2-70b",
                "sageserve.io/region": "us-east",
            }
        },
        "targetPorts": [{"number": 8080}],
        "endpointPickerRef": {
            "group": "",
            "kind": "Service",
            "name": "vllm-epp",
            "port": {"number": 9002},
            "failureMode": "FailClose",
        },
    }


def test_the_model_deployments_picker_wins_over_the_operators() -> None:
    config = ip.GatewayConfig(True, EPP)
    own = {"endpointPicker": {"name": "mine", "port": 9100, "failureMode": "FailOpen"}}
    assert ip.endpoint_picker_of(_llama(gateway=own), config) == EndpointPicker(
        name="mine", port=9100, failure_mode=FailureMode.FAIL_OPEN
    )
    assert ip.endpoint_picker_of(_llama(), config) == EPP
    assert ip.endpoint_picker_of(_llama(), ip.GatewayConfig(True, None)) is None


@pytest.mark.parametrize(
    ("type_", "priority", "expected"),
    [
        (TierType.INTERACTIVE, 0, 1000),  # IW-F
        (TierType.INTERACTIVE, 1, 999),  # IW-N
        (TierType.INTERACTIVE, 1000, 0),
        (TierType.BATCH, 0, -1),
        (TierType.BATCH, 1, -2),  # NIW
        (TierType.BATCH, 1000, -1001),
    ],
)
def test_objective_priority(type_: TierType, priority: int, expected: int) -> None:
    assert ip.objective_priority(type_, priority) == expected


def test_every_interactive_tier_goes_before_every_batch_tier_and_lower_first() -> None:
    ranks = [
        ip.objective_priority(t, p)
        for t in (TierType.INTERACTIVE, TierType.BATCH)
        for p in range(1001)
    ]
    assert ranks == sorted(ranks, reverse=True) and len(set(ranks)) == len(ranks)


def test_objective_names_fit_253_characters() -> None:
    assert ip.objective_name("llama-us-east", "iw-f") == "llama-us-east-iw-f"
    long = ip.objective_name("p" * 63, "t" * 253)
    assert len(long) == 253
    assert long != ip.objective_name("p" * 63, "t" * 252 + "u")


def test_rendered_objectives_one_per_pool_and_tier() -> None:
    md = _llama()
    tiers = ip.tier_priorities(_tiers())
    api = ("llm-d.ai", "v1alpha2")
    pools, objectives = ip.render_gateway(md, PoolScope.REGION, EPP, tiers, api, "llm", "u")
    assert len(pools) == 3
    got = {
        o["metadata"]["name"]: (o["spec"]["poolRef"]["name"], o["spec"]["priority"])
        for o in objectives
    }
    assert got == {
        f"llama-2-70b-{r}-{t}": (f"llama-2-70b-{r}", p)
        for r in ("us-east", "us-central", "us-west")
        for t, p in (("iw-f", 1000), ("iw-n", 999), ("niw", -3))
    }
    first = objectives[0]
    assert first["apiVersion"] == "llm-d.ai/v1alpha2"
    assert first["kind"] == "InferenceObjective"
    assert first["spec"]["poolRef"] == {
        "group": "inference.networking.k8s.io",
        "kind": "InferencePool",
        "name": "llama-2-70b-us-east",
    }
    assert first["metadata"]["labels"]["sageserve.io/tier"] == "iw-f"
    assert first["metadata"]["ownerReferences"][0]["uid"] == "u"
    assert ip.render_gateway(md, PoolScope.REGION, EPP, tiers, None, "llm", "u")[1] == []


def test_tiers_that_do_not_parse_are_left_out() -> None:
    raw = [*_tiers(), {"metadata": {"name": "broken"}, "spec": {"type": "weird", "priority": 1}}]
    assert sorted(ip.tier_priorities(raw)) == ["iw-f", "iw-n", "niw"]


def test_status_names_pools_and_sets_the_condition() -> None:
    outcome = ip.GatewayOutcome(
        True, "PoolsApplied", "2 pools", ["b", "a"], ["y", "x"], "llm-d.ai/v1alpha2"
    )
    ready = [
        {"type": "Ready", "status": "True", "reason": "R", "message": "", "lastTransitionTime": "t"}
    ]
    status = ip.gateway_status(ready, outcome, NOW, 3)
    assert status["gateway"] == {
        "inferencePools": ["a", "b"],
        "inferenceObjectives": ["x", "y"],
        "routes": [],
        "objectiveApi": "llm-d.ai/v1alpha2",
    }
    assert [c["type"] for c in status["conditions"]] == ["InferencePools", "Ready"]
    cond = status["conditions"][0]
    assert (cond["status"], cond["reason"], cond["observedGeneration"]) == (
        "True",
        "PoolsApplied",
        3,
    )
    off = ip.gateway_status([], ip.GatewayOutcome(False, "InferencePoolApiAbsent", "m"), NOW, 1)
    assert off["gateway"] == {"inferencePools": [], "inferenceObjectives": [], "routes": []}
    assert off["conditions"][0]["status"] == "False"


# --- one pass against an in-memory API -------------------------------------------------------


class _Resources:
    def __init__(self, names: list[str]) -> None:
        self.resources = [type("R", (), {"name": n})() for n in names]


class _Custom:
    """The CustomObjectsApi calls reconcile_gateway makes, over a dict of objects."""

    def __init__(self, served: dict[tuple[str, str], list[str]]) -> None:
        self.served = served
        self.store: dict[tuple[str, str, str, str, str], dict[str, Any]] = {}
        self.refuse: int | None = None

    def get_api_resources(self, group: str, version: str) -> _Resources:
        if (group, version) not in self.served:
            raise ApiException(status=404, reason="Not Found")
        return _Resources(self.served[(group, version)])

    def list_namespaced_custom_object(
        self, group: str, version: str, namespace: str, plural: str, label_selector: str = ""
    ) -> dict[str, Any]:
        if plural == "workloadtiers":
            return {"items": _tiers()}
        wanted = dict(kv.split("=") for kv in label_selector.split(","))
        items = [
            o
            for (g, v, ns, p, _), o in self.store.items()
            if (g, v, ns, p) == (group, version, namespace, plural)
            and all(o["metadata"]["labels"].get(k) == val for k, val in wanted.items())
        ]
        return {"items": copy.deepcopy(items)}

    def patch_namespaced_custom_object(
        self, group: str, version: str, namespace: str, plural: str, name: str, body: Any, **kw: Any
    ) -> None:
        if self.refuse:
            raise ApiException(status=self.refuse, reason="Forbidden")
        assert kw["_content_type"] == "application/apply-patch+yaml" and kw["force"] is True
        self.store[(group, version, namespace, plural, name)] = copy.deepcopy(body)

    def delete_namespaced_custom_object(
        self, group: str, version: str, namespace: str, plural: str, name: str
    ) -> None:
        del self.store[(group, version, namespace, plural, name)]


class _Kube:
    spans_clusters = False

    def __init__(self, custom: _Custom) -> None:
        self.custom = custom

    def objects(self, namespace: str, plural: str) -> list[dict[str, Any]]:
        return list(self.custom.list_namespaced_custom_object("", "", namespace, plural)["items"])

    def by_cluster(self, regions: Any) -> list[tuple[Any, frozenset[str], bool]]:
        return [(self, frozenset(regions), False)]


class _Fleet(_Kube):
    """A hub with us-east and us-central, a member serving us-west."""

    spans_clusters = True

    def __init__(self, custom: _Custom, member: _Custom) -> None:
        super().__init__(custom)
        self.member = _Kube(member)

    def by_cluster(self, regions: Any) -> list[tuple[Any, frozenset[str], bool]]:
        regions = set(regions)
        return [
            (self, frozenset(regions - {"us-west"}), False),
            (self.member, frozenset(regions & {"us-west"}), True),
        ]


FULL = {
    ("inference.networking.k8s.io", "v1"): ["inferencepools", "inferencepools/status"],
    ("inference.networking.x-k8s.io", "v1alpha2"): ["inferenceobjectives"],
}
ENV = {ip.ENV_ENDPOINT_PICKER: "vllm-epp:9002"}


def _pass(custom: _Custom, md: ModelDeployment, env: dict[str, str] = ENV) -> ip.GatewayOutcome:
    ip.forget_discovery()
    return ip.reconcile_gateway(_Kube(custom), md, "llm", "uid-1", [], env)  # type: ignore[arg-type]


def test_a_pass_applies_pools_and_objectives_and_removes_a_region_that_left() -> None:
    custom = _Custom(FULL)
    md = _llama()
    first = _pass(custom, md)
    assert (first.ok, first.reason) == (True, "PoolsApplied")
    assert first.pools == ["llama-2-70b-us-central", "llama-2-70b-us-east", "llama-2-70b-us-west"]
    assert len(first.objectives) == 9
    assert first.objective_api == "inference.networking.x-k8s.io/v1alpha2"
    assert "3 InferencePool(s) per region, endpoint picker vllm-epp:9002" in first.message

    md.spec.regions = md.spec.regions[:1]
    md.spec.engine.port = 8081
    second = _pass(custom, md)
    assert second.pools == ["llama-2-70b-us-east"]
    pools = [k for k in custom.store if k[3] == "inferencepools"]
    assert [k[4] for k in pools] == ["llama-2-70b-us-east"]
    assert custom.store[pools[0]]["spec"]["targetPorts"] == [{"number": 8081}]
    assert sorted(k[4] for k in custom.store if k[3] == "inferenceobjectives") == [
        "llama-2-70b-us-east-iw-f",
        "llama-2-70b-us-east-iw-n",
        "llama-2-70b-us-east-niw",
    ]


def test_llm_d_objectives_are_preferred_when_both_are_served() -> None:
    custom = _Custom({**FULL, ("llm-d.ai", "v1alpha2"): ["inferenceobjectives"]})
    assert _pass(custom, _llama()).objective_api == "llm-d.ai/v1alpha2"


@pytest.mark.parametrize(
    ("served", "env", "reason", "says"),
    [
        ({}, ENV, "InferencePoolApiAbsent", "does not serve inference.networking.k8s.io/v1"),
        (FULL, {**ENV, ip.ENV_POOLS: "off"}, "Disabled", "--no-inference-pools"),
        (FULL, {}, "NoEndpointPicker", "set spec.gateway.endpointPicker"),
        (FULL, {ip.ENV_ENDPOINT_PICKER: "x"}, "InvalidGatewayConfig", "SERVICE:PORT"),
    ],
)
def test_no_pools_and_the_condition_says_why(
    served: dict[tuple[str, str], list[str]], env: dict[str, str], reason: str, says: str
) -> None:
    custom = _Custom(served)
    outcome = _pass(custom, _llama(), env)
    assert (outcome.ok, outcome.reason) == (False, reason)
    assert says in outcome.message
    assert custom.store == {}


def test_pools_without_an_objective_api_say_the_tiers_are_not_seen() -> None:
    custom = _Custom({("inference.networking.k8s.io", "v1"): ["inferencepools"]})
    outcome = _pass(custom, _llama())
    assert outcome.ok and outcome.objectives == [] and outcome.objective_api is None
    assert "no InferenceObjective API served" in outcome.message


def test_a_refused_write_is_a_condition_not_a_crash() -> None:
    custom = _Custom(FULL)
    custom.refuse = 403
    outcome = _pass(custom, _llama())
    assert (outcome.ok, outcome.reason) == (False, "ApplyFailed")
    assert "403 Forbidden" in outcome.message


def test_the_operator_refuses_a_bad_endpoint_picker_before_it_starts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A refused start writes nothing into the environment: an operator started later in
    the same process (or a child it spawns) does not inherit the bad picker."""
    from typer.testing import CliRunner

    from sageserve.cli import app

    monkeypatch.delenv(ip.ENV_ENDPOINT_PICKER, raising=False)
    monkeypatch.delenv("SAGESERVE_SCALER_LISTEN", raising=False)
    result = CliRunner().invoke(app, ["operator", "--endpoint-picker", "epp:x"])
    assert result.exit_code == 2
    assert "port 'x' is not a number" in " ".join(result.output.split())
    assert ip.ENV_ENDPOINT_PICKER not in os.environ
    assert "SAGESERVE_SCALER_LISTEN" not in os.environ


def test_each_pool_names_its_own_endpoint_picker_through_the_pool_placeholder() -> None:
    """An endpoint picker serves one InferencePool: `{pool}` gives each pool its own."""
    md = _llama()
    picker = ip.parse_endpoint_picker("{pool}-epp:9002")
    pools, _ = ip.render_gateway(md, PoolScope.REGION, picker, {}, None, "llm", None)
    assert [p["spec"]["endpointPickerRef"]["name"] for p in pools] == [
        "llama-2-70b-us-east-epp",
        "llama-2-70b-us-central-epp",
        "llama-2-70b-us-west-epp",
    ]
    assert ip.picker_problem(picker, ip.pool_targets(md, PoolScope.VARIANT)) is None


def test_a_picker_name_too_long_for_some_pool_is_a_condition_naming_the_fix() -> None:
    md = _llama()
    md.metadata.name = "m" * 40
    custom = _Custom(FULL)
    env = {ip.ENV_ENDPOINT_PICKER: "{pool}-endpoint-picker:9002"}
    outcome = _pass(custom, md, env)
    assert (outcome.ok, outcome.reason) == (False, "InvalidEndpointPicker")
    assert "not an RFC 1123 label of at most 63 characters" in outcome.message
    assert "spec.gateway.endpointPicker.name" in outcome.message
    assert custom.store == {}


def test_the_placeholder_is_the_only_brace_allowed_in_a_picker_name() -> None:
    with pytest.raises(ip.GatewayConfigError, match="name: String should match pattern"):
        ip.parse_endpoint_picker("{region}-epp:9002")


def test_in_a_fleet_each_regions_pools_live_with_its_pods_exported_to_the_cluster_set() -> None:
    hub, member = _Custom(FULL), _Custom(FULL)
    ip.forget_discovery()
    md = _llama()
    outcome = ip.reconcile_gateway(_Fleet(hub, member), md, "llm", "uid-1", [], ENV)  # type: ignore[arg-type]
    assert (outcome.ok, outcome.reason) == (True, "PoolsApplied")
    assert len(outcome.pools) == 3 and len(outcome.objectives) == 9
    in_hub = {k[4]: o for k, o in hub.store.items() if k[3] == "inferencepools"}
    in_member = {k[4]: o for k, o in member.store.items() if k[3] == "inferencepools"}
    assert sorted(in_hub) == ["llama-2-70b-us-central", "llama-2-70b-us-east"]
    assert sorted(in_member) == ["llama-2-70b-us-west"]
    west = in_member["llama-2-70b-us-west"]["metadata"]
    assert "ownerReferences" not in west  # a member's GC would delete it otherwise
    assert in_hub["llama-2-70b-us-east"]["metadata"]["ownerReferences"][0]["uid"] == "uid-1"
    for pool in [*in_hub.values(), *in_member.values()]:
        assert pool["metadata"]["annotations"] == {ip.EXPORT_ANNOTATION: "ClusterSet"}
    assert sorted(k[4] for k in member.store if k[3] == "inferenceobjectives") == [
        "llama-2-70b-us-west-iw-f",
        "llama-2-70b-us-west-iw-n",
        "llama-2-70b-us-west-niw",
    ]


def test_a_member_without_the_inference_pool_api_is_named_and_the_others_applied() -> None:
    hub, member = _Custom(FULL), _Custom({})
    ip.forget_discovery()
    outcome = ip.reconcile_gateway(_Fleet(hub, member), _llama(), "llm", "uid-1", [], ENV)  # type: ignore[arg-type]
    assert (outcome.ok, outcome.reason) == (False, "InferencePoolApiAbsent")
    assert "region(s) us-west do not serve" in outcome.message
    assert outcome.pools == ["llama-2-70b-us-central", "llama-2-70b-us-east"]


# --- the plan's spill-over shares as HTTPRoute weights ---------------------------------------


@pytest.mark.parametrize(
    ("shares", "home", "away"),
    [
        ({}, 1000, {}),
        ({"b": 0.19}, 810, {"b": 190}),
        ({"b": 0.2, "c": 0.05}, 750, {"b": 200, "c": 50}),
        # more than all of it planned away (rounding in the plan): scaled to all of it
        ({"b": 0.6, "c": 0.6}, 0, {"b": 500, "c": 500}),
        # a share too small for a weight, or none, names no backend
        ({"b": 0.0004, "c": 0.0, "d": -0.1}, 1000, {}),
    ],
)
def test_route_weights_follow_the_planned_shares(
    shares: dict[str, float], home: int, away: dict[str, int]
) -> None:
    assert ip.route_weights(shares) == (home, away)


ROUTED = {
    **FULL,
    ("gateway.networking.k8s.io", "v1"): ["httproutes"],
    ("inference.networking.x-k8s.io", "v1alpha1"): ["inferencepoolimports"],
}


def _policy_with_spill(home: str, to: str, share: float) -> dict[str, Any]:
    return {
        "metadata": {"name": _llama().spec.policy_ref.name},
        "status": {
            "plan": {
                "spillover": [{"model": "llama-2-70b", "from": home, "to": to, "share": share}]
            }
        },
    }


def test_a_region_alone_in_its_cluster_gets_a_route_weighted_by_the_plan() -> None:
    hub, member = _Custom(ROUTED), _Custom(ROUTED)
    ip.forget_discovery()
    md = _llama(gateway={"route": {"parentRefs": [{"name": "inference-gw"}]}})
    policies = [_policy_with_spill("us-west", "us-east", 0.25)]
    outcome = ip.reconcile_gateway(_Fleet(hub, member), md, "llm", "uid-1", policies, ENV)  # type: ignore[arg-type]
    assert outcome.routes == ["llama-2-70b-us-west"]
    [route] = [o for k, o in member.store.items() if k[3] == "httproutes"]
    assert route["spec"]["parentRefs"] == [
        {"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": "inference-gw"}
    ]
    [rule] = route["spec"]["rules"]
    assert rule["matches"][0]["headers"][0]["name"] == "X-Gateway-Model-Name"
    assert rule["backendRefs"] == [
        {
            "group": "inference.networking.k8s.io",
            "kind": "InferencePool",
            "name": "llama-2-70b-us-west",
            "weight": 750,
        },
        {
            "group": "inference.networking.x-k8s.io",
            "kind": "InferencePoolImport",
            "name": "llama-2-70b-us-east",
            "weight": 250,
        },
    ]
    assert "ownerReferences" not in route["metadata"]
    # the hub holds two of the model's regions: its gateway cannot tell whose share a
    # request is, so no route there, and the condition says so
    assert not [k for k in hub.store if k[3] == "httproutes"]
    assert (outcome.ok, outcome.reason) == (False, "RouteNotWritten")
    assert "us-east: it shares its cluster with another of the model's regions" in outcome.message

    # the plan moves: the weights follow; the route asked for no more: it goes
    policies = [_policy_with_spill("us-west", "us-east", 0.1)]
    ip.reconcile_gateway(_Fleet(hub, member), md, "llm", "uid-1", policies, ENV)  # type: ignore[arg-type]
    [route] = [o for k, o in member.store.items() if k[3] == "httproutes"]
    assert [b["weight"] for b in route["spec"]["rules"][0]["backendRefs"]] == [900, 100]
    ip.reconcile_gateway(_Fleet(hub, member), _llama(), "llm", "uid-1", policies, ENV)  # type: ignore[arg-type]
    assert not [k for k in member.store if k[3] == "httproutes"]


def test_without_inference_pool_imports_a_route_keeps_its_regions_requests_home() -> None:
    hub, member = (
        _Custom(ROUTED),
        _Custom({**FULL, ("gateway.networking.k8s.io", "v1"): ["httproutes"]}),
    )
    ip.forget_discovery()
    md = _llama(gateway={"route": {"parentRefs": [{"name": "inference-gw"}]}})
    policies = [_policy_with_spill("us-west", "us-east", 0.25)]
    ip.reconcile_gateway(_Fleet(hub, member), md, "llm", "uid-1", policies, ENV)  # type: ignore[arg-type]
    [route] = [o for k, o in member.store.items() if k[3] == "httproutes"]
    assert [b["name"] for b in route["spec"]["rules"][0]["backendRefs"]] == ["llama-2-70b-us-west"]


def test_a_route_in_one_cluster_is_refused_naming_why() -> None:
    custom = _Custom(ROUTED)
    md = _llama(gateway={"route": {"parentRefs": [{"name": "inference-gw"}]}})
    outcome = _pass(custom, md)
    assert (outcome.ok, outcome.reason) == (False, "RouteNotWritten")
    assert "routes carry shares between clusters; this fleet is one cluster" in outcome.message
    assert outcome.pools and not [k for k in custom.store if k[3] == "httproutes"]
