"""What passes the schema but cannot be acted on, and the status users read."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import yaml

from sageserve.api.model_deployment import ModelDeployment
from sageserve.controller.podset import render_pod_sets
from sageserve.controller.semantics import (
    NodeShape,
    SemanticProblem,
    model_deployment_problems,
    node_shapes,
    placeable,
    shape_counts,
)
from sageserve.controller.status import model_deployment_status, set_condition
from sageserve.core.labels import NodeLabels

ROOT = Path(__file__).resolve().parents[2]
H100, A100 = "NVIDIA-H100-80GB-HBM3", "NVIDIA-A100-SXM4-80GB"
NODES = [NodeShape(r, g, 8) for r in ("us-east", "us-central", "us-west") for g in (H100, A100)]
T0 = datetime(2026, 11, 21, 12, 0, tzinfo=UTC)


def _llama() -> ModelDeployment:
    docs = yaml.safe_load_all((ROOT / "policies" / "base" / "models.yaml").read_text())
    return ModelDeployment.model_validate(next(iter(docs)))


def test_a_complete_setup_has_no_problems() -> None:
    assert model_deployment_problems(_llama(), ["fleet"], ["iw-f", "iw-n", "niw"], NODES) == []


def test_missing_policy_and_tiers_are_named() -> None:
    problems = model_deployment_problems(_llama(), ["other"], ["iw-f"], NODES)
    assert [p.reason for p in problems] == ["PolicyNotFound", "TierNotFound"]
    assert "'fleet'" in problems[0].message
    assert "'iw-n', 'niw'" in problems[1].message


def test_a_region_without_a_node_big_enough_is_a_problem() -> None:
    small = [NodeShape("us-east", H100, 4), *[n for n in NODES if n.region != "us-east"]]
    [problem] = model_deployment_problems(_llama(), ["fleet"], ["iw-f", "iw-n", "niw"], small)
    assert problem.reason == "NoFittingNodes"
    assert "us-east" in problem.message and "8x NVIDIA-H100-80GB-HBM3" in problem.message


def test_node_shapes_read_labels_and_allocatable_gpus() -> None:
    docs = list(yaml.safe_load_all((ROOT / "e2e" / "inventory" / "small.yaml").read_text()))
    shapes = node_shapes(docs, NodeLabels())
    assert len(shapes) == len([d for d in docs if d])
    assert {s.gpus for s in shapes} == {8}
    assert {s.region for s in shapes} == {"us-east", "us-central", "us-west"}
    assert node_shapes([{"metadata": {"labels": {}}}], NodeLabels()) == []


def test_condition_transition_time_moves_only_when_status_changes() -> None:
    first = set_condition([], "Ready", True, "PodSetsApplied", "ok", T0)
    later = set_condition(
        first, "Ready", True, "PodSetsApplied", "still ok", T0 + timedelta(hours=1)
    )
    assert later[0]["lastTransitionTime"] == first[0]["lastTransitionTime"]
    assert later[0]["message"] == "still ok"
    flipped = set_condition(
        later, "Ready", False, "PolicyNotFound", "gone", T0 + timedelta(hours=2)
    )
    assert flipped[0]["lastTransitionTime"] == "2026-11-21T14:00:00Z"


def test_status_counts_instances_of_all_pod_sets() -> None:
    md = _llama()
    deployments = render_pod_sets(md, {("us-west", "a100"): 3}, "llm")
    deployments[0]["status"] = {"readyReplicas": 7}
    status = model_deployment_status({}, deployments, {"h100": H100, "a100": A100}, [], T0, 4)
    assert status["instances"] == 20 * 3 + 3
    assert len(status["podSets"]) == 6
    [ready] = status["conditions"]
    assert (ready["status"], ready["reason"], ready["observedGeneration"]) == (
        "True",
        "PodSetsApplied",
        4,
    )
    assert "7/63 instance(s) ready" in ready["message"]


def test_status_of_an_object_that_cannot_be_acted_on() -> None:
    problem = SemanticProblem(
        "PolicyNotFound", "spec.policyRef.name: ScalingPolicy 'x' does not exist"
    )
    status = model_deployment_status({}, [], {}, [problem], T0, 1)
    [ready] = status["conditions"]
    assert (ready["status"], ready["reason"]) == ("False", "PolicyNotFound")
    assert "podSets" not in status


def test_a_min_instances_no_inventory_can_hold_is_a_problem_naming_the_most_it_can() -> None:
    md = _llama()  # 8-GPU instances
    region = md.spec.regions[0].name
    nodes = shape_counts([NodeShape(region, H100, 8), NodeShape(region, H100, 8), *NODES])
    room = placeable(md, region, nodes)
    assert room >= 1
    md.spec.regions[0].min_instances = room + 1
    md.spec.regions[0].max_instances = max(md.spec.regions[0].max_instances, room + 1)
    [problem] = model_deployment_problems(md, ["fleet"], ["iw-f", "iw-n", "niw"], nodes)
    assert problem.reason == "MinInstancesUnreachable"
    assert f"at most {room}" in problem.message and f"minInstances to {room}" in problem.message
    md.spec.regions[0].min_instances = room
    assert model_deployment_problems(md, ["fleet"], ["iw-f", "iw-n", "niw"], nodes) == []


def test_shape_counts_sum_the_nodes_of_each_shape() -> None:
    counted = shape_counts(
        [NodeShape("a", H100, 8), NodeShape("a", H100, 8), NodeShape("a", A100, 4)]
    )
    assert counted == [NodeShape("a", A100, 4, 1), NodeShape("a", H100, 8, 2)]


def test_a_policy_pricing_a_gpu_type_no_node_has_names_the_known_ones() -> None:
    from sageserve.api.scaling_policy import ScalingPolicySpec
    from sageserve.controller.semantics import policy_problems

    spec = ScalingPolicySpec.model_validate(
        {
            "strategy": "lt-utilization",
            "optimizer": {"gpuHourCosts": [{"gpuType": "NVIDIA-H100", "costPerGpuHour": 12}]},
        }
    )
    [problem] = policy_problems(spec, [H100, A100])
    assert problem.reason == "UnknownGpuType"
    assert "'NVIDIA-H100'" in problem.message and H100 in problem.message
    assert policy_problems(spec, ["NVIDIA-H100"]) == []


def _layout(md: ModelDeployment, gpus: int, tp: int | None, pp: int = 1) -> ModelDeployment:
    v = md.spec.variants[0]  # h100
    v.gpus_per_instance, v.tensor_parallel, v.pipeline_parallel = gpus, tp, pp
    return md


ALL = (["fleet"], ["iw-f", "iw-n", "niw"])


def test_a_tensor_parallel_size_that_does_not_divide_the_heads_is_not_ready() -> None:
    """TP3 × PP2 on Llama-2-70B (64 heads): vLLM would refuse to start; Ready=False names
    the variant's field and the sizes to use instead."""
    md = _layout(_llama(), 6, 3, 2)
    [problem] = model_deployment_problems(md, *ALL, NODES)
    assert problem.reason == "InvalidParallelLayout"
    assert problem.message.startswith(
        "spec.variants[h100].tensorParallel=3 does not divide the 64 attention heads of llama-2-70b"
    )
    assert "use one of [1, 2, 4, 8] and put the other GPUs in pipelineParallel" in problem.message
    status = model_deployment_status({}, [], {}, [problem], T0, 2)
    [ready] = status["conditions"]
    assert (ready["status"], ready["reason"]) == ("False", "InvalidParallelLayout")
    assert ready["message"] == problem.message


def test_a_tensor_parallel_group_larger_than_a_node_is_not_ready() -> None:
    md = _layout(_llama(), 16, 16)  # divides the 64 heads, but the nodes hold 8 GPUs
    problems = model_deployment_problems(md, *ALL, NODES)
    # first (Ready's reason): the minInstances then out of reach only follow from it
    assert [p.reason for p in problems][:1] == ["InvalidParallelLayout"]
    assert "spec.variants[h100].tensorParallel=16 exceeds the 8 GPUs of one node" in (
        problems[0].message
    )
    assert "use tensorParallel <= 8 and raise pipelineParallel" in problems[0].message
    # nodes of 16 GPUs hold the group
    big = [*NODES, NodeShape("us-east", H100, 16)]
    assert "InvalidParallelLayout" not in {
        p.reason for p in model_deployment_problems(md, *ALL, big)
    }


def test_valid_pipeline_layouts_and_unknown_models() -> None:
    assert model_deployment_problems(_layout(_llama(), 8, 4, 2), *ALL, NODES) == []
    assert model_deployment_problems(_layout(_llama(), 8, None, 2), *ALL, NODES) == []
    # a model with no perf profile: its heads are unknown, only the node rule applies
    md = _layout(_llama(), 6, 3, 2)
    md.metadata.name = "mystery"
    md.spec.model.name = "acme/mystery-13b"
    assert model_deployment_problems(md, *ALL, NODES) == []
    md = _layout(md, 16, 16)
    problem = model_deployment_problems(md, *ALL, NODES)[0]
    assert "tensorParallel=16 exceeds the 8 GPUs of one node for acme/mystery-13b" in (
        problem.message
    )


def test_the_model_is_found_by_annotation_name_or_model_name() -> None:
    from sageserve.perf.layout_check import profile_names

    md = _llama()
    md.metadata.name = "chat"
    assert profile_names(md) == ["chat", "llama-2-70b-hf", "llama-2-70b"]
    assert model_deployment_problems(_layout(md, 6, 3, 2), *ALL, NODES) != []
    md.metadata.annotations["sageserve.io/perf-profile"] = "bloom-176b"
    md.spec.model.name = "meta-llama/Llama-3.1-8B"
    assert profile_names(md) == ["bloom-176b", "chat", "llama-3-1-8b"]
    # Bloom-176B has 112 heads: TP 7 divides them (8 does too), TP 3 does not
    [problem] = model_deployment_problems(_layout(md, 6, 3, 2), *ALL, NODES)
    assert "the 112 attention heads of bloom-176b" in problem.message
