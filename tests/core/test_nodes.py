"""One Node reader for every world: the operator, the simulator's inventory, the checks."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from sageserve.controller.plan_loop import gpu_capacity
from sageserve.controller.semantics import node_shapes
from sageserve.controller.spot import pool_nodes
from sageserve.core.labels import NodeLabels
from sageserve.core.nodes import OUTSIDE_POOLS, NodeInfo, parse_node, parse_nodes, plannable_gpus
from sageserve.sim.cluster import nodes_from_manifests

ROOT = Path(__file__).resolve().parents[2]


def node(
    labels: dict[str, str],
    gpus: str | None = "8",
    annotations: dict[str, str] | None = None,
    ready: str = "True",
    where: str = "allocatable",
) -> dict[str, Any]:
    status: dict[str, Any] = {"conditions": [{"type": "Ready", "status": ready}]}
    if gpus is not None:
        status[where] = {"nvidia.com/gpu": gpus}
    return {
        "kind": "Node",
        "metadata": {"name": "n1", "labels": labels, "annotations": annotations or {}},
        "status": status,
    }


GPU = {"topology.kubernetes.io/region": "us-east", "nvidia.com/gpu.product": "H100"}


@pytest.mark.parametrize(
    ("obj", "expected"),
    [
        (
            node({**GPU, "sageserve.io/pool": "serving"}),
            NodeInfo("n1", "us-east", "H100", "serving", 8),
        ),
        # a hand-written inventory may give capacity only
        (
            node({**GPU, "sageserve.io/pool": "spot"}, where="capacity"),
            NodeInfo("n1", "us-east", "H100", "spot", 8),
        ),
        # a GPU node without a pool label is capacity outside both pools
        (node(GPU), NodeInfo("n1", "us-east", "H100", OUTSIDE_POOLS, 8)),
        (
            node(GPU, ready="False"),
            NodeInfo("n1", "us-east", "H100", OUTSIDE_POOLS, 8, ready=False),
        ),
        (
            node(
                GPU,
                annotations={
                    "sageserve.io/last-model": "llm/bloom",
                    "sageserve.io/donated-at": "2026-11-21T10:00:00Z",
                },
            ),
            NodeInfo("n1", "us-east", "H100", "", 8, True, "llm/bloom", 1795255200.0),
        ),
        (node(GPU, gpus=None), None),  # no GPUs: not a node sageserve places on
        (node(GPU, gpus="lots"), None),
        (node({"nvidia.com/gpu.product": "H100"}), None),  # no region
    ],
)
def test_parse_node(obj: dict[str, Any], expected: NodeInfo | None) -> None:
    assert parse_node(obj) == expected


def test_label_keys_come_from_the_chart_settings() -> None:
    labels = NodeLabels.from_env({"SAGESERVE_REGION_LABEL": "zone", "SAGESERVE_POOL_LABEL": "p"})
    obj = node({"zone": "eu", "nvidia.com/gpu.product": "H100", "p": "spot"})
    assert parse_node(obj, labels) == NodeInfo("n1", "eu", "H100", "spot", 8)


def test_an_inventory_holds_only_nodes() -> None:
    with pytest.raises(ValueError, match="only v1 Node objects"):
        parse_nodes([{"kind": "Pod"}])


def test_every_world_reads_the_same_inventory_alike() -> None:
    docs = [d for d in yaml.safe_load_all((ROOT / "scenarios/default/nodes.yaml").read_text()) if d]
    parsed = parse_nodes(docs)
    assert len(parsed) == len(docs) > 0
    sim = nodes_from_manifests(docs)
    assert [(n.name, n.region, n.gpu_type, n.pool, n.gpus) for n in sim] == [
        (n.name, n.region, n.gpu_type, n.pool, n.gpus) for n in parsed
    ]
    assert [(n.region, n.gpu_type, n.gpus) for n in node_shapes(docs, NodeLabels())] == [
        (n.region, n.gpu_type, n.gpus) for n in parsed
    ]
    spot = pool_nodes(docs, [], NodeLabels())
    assert [(n.name, n.pool, n.gpus) for n in spot] == [(n.name, n.pool, n.gpus) for n in parsed]


def test_both_worlds_plan_on_the_serving_and_spot_pools_only() -> None:
    docs = [
        node({**GPU, "sageserve.io/pool": "serving"}),
        node({**GPU, "sageserve.io/pool": "spot"}, gpus="4"),
        node(GPU, gpus="8"),  # no pool label: not sageserve's to plan on
        node({**GPU, "sageserve.io/pool": "training"}),
    ]
    operator = gpu_capacity(docs, NodeLabels())
    simulator = plannable_gpus(nodes_from_manifests(docs))
    assert operator == simulator == {("us-east", "H100"): 12}
