"""Which nodes a pass reclaims and donates, from Nodes and Pods as the API returns them."""

from __future__ import annotations

from sageserve.controller.spot import (
    ANNOTATION_DONATED_AT,
    ANNOTATION_LAST_MODEL,
    plan_moves,
    pool_nodes,
    unschedulable,
)
from sageserve.core.labels import NodeLabels

A100 = "NVIDIA-A100-SXM4-80GB"
LABELS = NodeLabels()


def node(name: str, pool: str, **annotations: str) -> dict:
    return {
        "metadata": {
            "name": name,
            "labels": {LABELS.region: "us-west", LABELS.gpu_type: A100, LABELS.pool: pool},
            "annotations": annotations,
        },
        "status": {"allocatable": {"nvidia.com/gpu": "8"}},
    }


def serving_pod(name: str, node_name: str | None, phase: str = "Running") -> dict:
    return {
        "metadata": {
            "name": name,
            "namespace": "llm",
            "labels": {
                "app.kubernetes.io/managed-by": "sageserve",
                "sageserve.io/model-deployment": "llama",
                "sageserve.io/region": "us-west",
                "sageserve.io/variant": "a100",
            },
        },
        "spec": {
            "nodeName": node_name,
            "containers": [{"resources": {"limits": {"nvidia.com/gpu": "8"}}}],
        },
        "status": {"phase": phase},
    }


REGION_OF = {"llama-us-west-a100": ("us-west", A100)}


def test_an_unschedulable_serving_pod_reclaims_the_same_model_spot_node_first() -> None:
    nodes = [
        node("serving-0", "serving"),
        node(
            "spot-other",
            "spot",
            **{ANNOTATION_LAST_MODEL: "llm/bloom", ANNOTATION_DONATED_AT: "2026-11-21T10:00:00Z"},
        ),
        node(
            "spot-same",
            "spot",
            **{ANNOTATION_LAST_MODEL: "llm/llama", ANNOTATION_DONATED_AT: "2026-11-21T09:00:00Z"},
        ),
    ]
    pods = [serving_pod("a", "serving-0"), serving_pod("b", None, "Pending")]
    pending = unschedulable(pods, REGION_OF)
    assert [(p.model, p.region, p.gpus) for p in pending] == [("llm/llama", "us-west", 8)]
    reclaims, donations = plan_moves(
        pool_nodes(nodes, pods, LABELS), pending, {("us-west", A100)}, LABELS
    )
    assert [n.name for n, _ in reclaims] == ["spot-same"]
    assert donations == []  # something is waiting for GPUs here: nothing is given away


def test_idle_serving_nodes_are_donated_but_never_one_with_a_serving_pod() -> None:
    nodes = [node("serving-0", "serving"), node("serving-1", "serving")]
    pods = [serving_pod("a", "serving-0")]
    reclaims, donations = plan_moves(
        pool_nodes(nodes, pods, LABELS), [], {("us-west", A100)}, LABELS
    )
    assert reclaims == []
    assert [n.name for n in donations] == ["serving-1"]


def test_no_donation_while_a_pod_set_is_coming_up_or_outside_the_policys_scope() -> None:
    nodes = pool_nodes([node("serving-1", "serving")], [], LABELS)
    assert plan_moves(nodes, [], {("us-west", A100)}, LABELS, busy={("us-west", A100)})[1] == []
    assert plan_moves(nodes, [], {("us-east", A100)}, LABELS)[1] == []


def test_finished_pods_do_not_hold_a_node() -> None:
    nodes = [node("serving-0", "serving")]
    done = serving_pod("old", "serving-0", phase="Succeeded")
    [shape] = pool_nodes(nodes, [done], LABELS)
    assert shape.serving_gpus == 0
