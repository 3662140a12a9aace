"""Reclaim order and donation candidates of the spot pool."""

from __future__ import annotations

from sageserve.pace.spot import PoolNode, Source, donation_candidates, reclaim_order

H100, A100 = "NVIDIA-H100-80GB-HBM3", "NVIDIA-A100-SXM4-80GB"


def node(
    name: str, pool: str = "spot", model: str | None = None, at: float | None = None, **kw: object
) -> PoolNode:
    fields: dict = {"region": "us-east", "gpu_type": H100, "gpus": 8, **kw}
    return PoolNode(name, pool=pool, last_model=model, donated_at=at, **fields)


def test_same_model_spot_comes_first_most_recently_donated_first() -> None:
    nodes = [
        node("a", model="bloom-176b", at=100.0),
        node("b", model="llama-2-70b", at=50.0),
        node("c", model="llama-2-70b", at=300.0),
        node("d", model="bloom-176b", at=10.0),
        node("e", pool="serving", model="llama-2-70b"),
    ]
    order = reclaim_order(nodes, "llama-2-70b", "us-east", H100, 8)
    assert [(n.name, s) for n, s in order] == [
        ("c", Source.SAME_MODEL_SPOT),
        ("b", Source.SAME_MODEL_SPOT),
        ("d", Source.OTHER_MODEL_SPOT),  # longest donated first among other models
        ("a", Source.OTHER_MODEL_SPOT),
    ]


def test_only_nodes_of_the_region_gpu_type_and_size_qualify() -> None:
    nodes = [
        node("west", region="us-west", model="m"),
        node("a100", gpu_type=A100, model="m"),
        node("small", gpus=4, model="m"),
        node("ok", model="m"),
    ]
    assert [n.name for n, _ in reclaim_order(nodes, "m", "us-east", H100, 8)] == ["ok"]
    assert reclaim_order([], "m", "us-east", H100, 8) == []


def test_only_idle_serving_nodes_are_donated_and_in_a_stable_order() -> None:
    nodes = [
        node("z", pool="serving"),
        node("busy", pool="serving", serving_gpus=8),
        node("a", pool="serving"),
        node("already", pool="spot"),
        node("other-region", pool="serving", region="us-west"),
    ]
    assert [n.name for n in donation_candidates(nodes, "us-east", H100)] == ["a", "z"]
