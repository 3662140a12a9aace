"""The generated CRDs: reproducible, structural, and carrying the paper's defaults."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import celpy
import pytest
import yaml
from celpy.adapter import json_to_cel
from celpy.evaluation import CELEvalError

from sageserve.api.crd import KINDS, render_all
from sageserve.api.model_deployment import RegionPlacement, Variant
from sageserve.api.scaling_policy import ScalingPolicySpec
from sageserve.api.validate import cel_program, walk_schema
from sageserve.api.workload_tier import BatchSettings

ROOT = Path(__file__).resolve().parents[2]
CRD_DIR = ROOT / "crds"


def _nodes(schema: dict[str, Any], path: str = "") -> list[tuple[str, dict[str, Any]]]:
    out = [(path, schema)]
    for name, sub in schema.get("properties", {}).items():
        out += _nodes(sub, f"{path}.{name}")
    if isinstance(schema.get("items"), dict):
        out += _nodes(schema["items"], f"{path}[]")
    if isinstance(schema.get("additionalProperties"), dict):
        out += _nodes(schema["additionalProperties"], f"{path}{{}}")
    return out


def _schemas() -> list[tuple[str, dict[str, Any]]]:
    return [
        (name, yaml.safe_load(text)["spec"]["versions"][0]["schema"]["openAPIV3Schema"])
        for name, text in render_all().items()
    ]


def test_committed_crds_are_exactly_what_the_models_generate() -> None:
    rendered = render_all()
    on_disk = {p.name: p.read_text(encoding="utf-8") for p in CRD_DIR.glob("*.yaml")}
    assert on_disk == rendered, "crds/ is stale: run `sageserve crds -o crds`"


def test_generation_is_deterministic() -> None:
    assert render_all() == render_all()


@pytest.mark.parametrize(
    ("name", "schema"), _schemas(), ids=lambda v: v if isinstance(v, str) else ""
)
def test_schemas_are_structural(name: str, schema: dict[str, Any]) -> None:
    for path, node in _nodes(schema):
        assert "type" in node, f"{name}{path}: structural schemas need a type"
        for banned in ("$ref", "anyOf", "oneOf", "allOf", "$defs", "title"):
            assert banned not in node, f"{name}{path}: {banned} is not structural"
        assert node.get("additionalProperties") is not False, f"{name}{path}"
        if node.get("x-kubernetes-list-type") == "map":
            item = node["items"]
            for key in node["x-kubernetes-list-map-keys"]:
                assert key in item.get("required", []) or "default" in item["properties"][key]


@pytest.mark.parametrize(
    ("name", "schema"), _schemas(), ids=lambda v: v if isinstance(v, str) else ""
)
def test_every_cel_rule_compiles_and_names_a_field(name: str, schema: dict[str, Any]) -> None:
    env = celpy.Environment()
    rules = [r for _, node in _nodes(schema) for r in node.get("x-kubernetes-validations", [])]
    assert rules
    for rule in rules:
        env.compile(rule["rule"])
        assert "spec." in rule["message"] or "metadata.name" in rule["message"], rule


def test_crd_metadata_users_rely_on() -> None:
    for kind in KINDS:
        doc = yaml.safe_load(render_all()[kind.file_name])
        spec = doc["spec"]
        assert spec["group"] == "sageserve.io"
        assert spec["names"]["categories"] == ["sageserve"]
        assert spec["names"]["shortNames"]
        version = spec["versions"][0]
        assert version["name"] == "v1alpha1"
        assert version["subresources"] == {"status": {}}
        assert any(c["name"] == "Age" for c in version["additionalPrinterColumns"])


def test_sub_objects_default_to_their_complete_defaults() -> None:
    """The server fills a missing section with every default of the paper at once."""
    schema = dict(_schemas())["sageserve.io_scalingpolicies.yaml"]
    spec = schema["properties"]["spec"]
    for section in ("intervals", "thresholds", "routing", "forecast", "optimizer", "spot"):
        assert spec["properties"][section]["default"], section
    assert spec["properties"]["thresholds"]["default"] == {"scaleOutEmu": 0.7, "scaleInEmu": 0.3}
    assert spec["default"]["forecastGap"]["scaleUpRatio"] == 5.0


@pytest.mark.parametrize(
    ("name", "schema"), _schemas(), ids=lambda v: v if isinstance(v, str) else ""
)
def test_every_default_passes_the_cel_rules_as_the_api_server_checks_it(
    name: str, schema: dict[str, Any]
) -> None:
    """The API server refuses a CRD whose defaults break its own rules (nested defaults
    are not applied when it checks a default), so each default must pass as written."""
    checked = 0
    for path, node in _nodes(schema):
        if "default" not in node or not isinstance(node["default"], dict):
            continue
        for where, sub, value in walk_schema(node, node["default"], path):
            for rule in sub.get("x-kubernetes-validations", []):
                result = cel_program(rule["rule"]).evaluate({"self": json_to_cel(value)})
                assert not isinstance(result, CELEvalError), f"{name}{where}: {result}"
                assert bool(result), f"{name}{where}: {rule['rule']}"
                checked += 1
    if name == "sageserve.io_scalingpolicies.yaml":
        assert checked >= 10


def test_defaults_are_the_papers_values() -> None:
    spec = ScalingPolicySpec()
    assert spec.strategy == "lt-utilization-arima"
    assert (spec.intervals.plan_seconds, spec.intervals.cooldown_seconds) == (3600, 15)
    assert (spec.thresholds.scale_out_emu, spec.thresholds.scale_in_emu) == (0.7, 0.3)
    assert spec.routing.region_emu_threshold == 0.7
    assert (spec.routing.batch_release.one_below_emu, spec.routing.batch_release.two_below_emu) == (
        0.6,
        0.5,
    )
    gap = spec.forecast_gap
    assert (gap.window_seconds, gap.scale_up_ratio, gap.scale_down_ratio) == (1200, 5.0, 0.5)
    fc = spec.forecast
    assert (fc.method, fc.granularity_seconds, fc.training_window_seconds) == ("arima", 60, 3600)
    assert (fc.horizon_seconds, fc.batch_buffer_fraction) == (3600, 0.1)
    assert fc.order is None  # AIC-selected, as in the paper
    assert spec.optimizer.default_gpu_hour_cost == pytest.approx(98.32 / 8, abs=0.01)
    assert (spec.spot.reclaim_same_model_seconds, spec.spot.reclaim_same_model_max_seconds) == (
        60,
        300,
    )
    assert (spec.spot.redeploy_seconds, spec.spot.remote_redeploy_seconds) == (600, 7200)
    assert spec.siloed.batch_instance_fraction == pytest.approx(4 / 20)
    batch = BatchSettings()
    assert (batch.deadline_seconds, batch.promotion_age_seconds) == (86400, 36000)
    variant = Variant(name="h100", gpu_type="NVIDIA-H100-80GB-HBM3", capacity_tokens_per_second=300)
    assert (variant.gpus_per_instance, variant.startup_seconds) == (8, 600)
    assert RegionPlacement(name="us-east", max_instances=40).min_instances == 2
