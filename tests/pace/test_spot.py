"""Reclaim order, donation candidates and reclaim follow-up of the spot pool."""

from __future__ import annotations

import pytest

from sageserve.core.labels import NodeLabels
from sageserve.pace.spot import (
    Pending,
    PoolNode,
    ReclaimStep,
    Source,
    capacity_order,
    donation_candidates,
    plan_moves,
    reclaim_order,
    reclaim_step,
    under_way,
)

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


@pytest.mark.parametrize(
    "nodes,expected",
    [
        # free serving GPUs before any spot node, even one of the same model
        (
            [node("s", pool="serving", serving_gpus=4), node("p", model="m", at=5.0)],
            [("s", Source.FREE_SERVING), ("p", Source.SAME_MODEL_SPOT)],
        ),
        # a serving node without room for the instance is not a choice
        (
            [node("s", pool="serving", serving_gpus=6), node("p", model="x", at=5.0)],
            [("p", Source.OTHER_MODEL_SPOT)],
        ),
        # serving nodes by name, then same model newest-donated, then others oldest-donated
        (
            [
                node("s2", pool="serving"),
                node("s1", pool="serving", serving_gpus=4),
                node("old", model="x", at=1.0),
                node("new", model="x", at=9.0),
                node("mine", model="m", at=2.0),
            ],
            [
                ("s1", Source.FREE_SERVING),
                ("s2", Source.FREE_SERVING),
                ("mine", Source.SAME_MODEL_SPOT),
                ("old", Source.OTHER_MODEL_SPOT),
                ("new", Source.OTHER_MODEL_SPOT),
            ],
        ),
        # nothing outside the two pools, nothing lost (not Ready)
        (
            [node("x", pool=""), node("lost", pool="serving", ready=False)],
            [],
        ),
    ],
)
def test_capacity_order_is_free_serving_gpus_then_spot_nodes_to_reclaim(
    nodes: list[PoolNode], expected: list[tuple[str, Source]]
) -> None:
    order = capacity_order(nodes, "m", "us-east", H100, 4)
    assert [(n.name, s) for n, s in order] == expected


@pytest.mark.parametrize(
    "pending,busy,reclaims,donations",
    [
        # nothing pending, nothing coming up: every whole idle serving node is donated
        ([], set(), [], ["idle-a", "idle-b"]),
        # a pair with a pod set coming up keeps its idle nodes
        ([], {("us-east", H100)}, [], []),
        # one spot node per pending pod, and no donation in its pair
        ([Pending("m", "us-east", H100, 8)], set(), [("p-m", "m")], []),
        (
            [Pending("m", "us-east", H100, 8), Pending("m", "us-east", H100, 8)],
            set(),
            [("p-m", "m"), ("p-x", "m")],
            [],
        ),
    ],
)
def test_a_pass_reclaims_one_spot_node_per_pending_pod_and_donates_whole_idle_nodes(
    pending: list[Pending],
    busy: set[tuple[str, str]],
    reclaims: list[tuple[str, str]],
    donations: list[str],
) -> None:
    nodes = [
        node("idle-b", pool="serving"),
        node("idle-a", pool="serving"),
        node("half", pool="serving", serving_gpus=4),
        node("p-x", model="x", at=1.0),
        node("p-m", model="m", at=2.0),
    ]
    got_reclaims, got_donations = plan_moves(
        nodes, pending, {("us-east", H100)}, NodeLabels(), busy
    )
    assert [(n.name, p.model) for n, p in got_reclaims] == reclaims
    assert [n.name for n in got_donations] == donations


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


def test_nodes_that_are_not_ready_are_neither_reclaimed_nor_donated() -> None:
    nodes = [
        node("spot-lost", model="m", ready=False),
        node("spot-ok", model="m"),
        node("serving-lost", pool="serving", ready=False),
    ]
    assert [n.name for n, _ in reclaim_order(nodes, "m", "us-east", H100, 8)] == ["spot-ok"]
    assert donation_candidates(nodes, "us-east", H100) == []


def test_a_node_given_up_is_skipped_for_the_retry_window_then_taken_again() -> None:
    nodes = [node("spot-0", blocked_at=100.0), node("spot-1")]

    def order(now: float | None) -> list[str]:
        found = reclaim_order(nodes, "m", "us-east", H100, 8, now=now, retry_after_s=50.0)
        return [n.name for n, _ in found]

    assert order(None) == ["spot-0", "spot-1"]  # no clock given: nothing skipped
    assert order(120.0) == ["spot-1"]
    assert order(150.0) == ["spot-0", "spot-1"]  # the window is over: tried again


@pytest.mark.parametrize(
    ("case", "fields", "now", "step"),
    [
        ("not reclaimed", {"pool": "serving", "tenants": ("ns/p",)}, 100.0, None),
        ("still spot", {"pool": "spot", "reclaimed_at": 90.0, "tenants": ("ns/p",)}, 100.0, None),
        ("emptied", {"pool": "serving", "reclaimed_at": 90.0}, 100.0, None),
        ("only leaving", {"pool": "serving", "reclaimed_at": 90.0, "leaving": 1}, 100.0, None),
        (
            "within bound",
            {"pool": "serving", "reclaimed_at": 90.0, "tenants": ("ns/p",)},
            100.0,
            ReclaimStep.EVICT,
        ),
        (
            "at the bound",
            {"pool": "serving", "reclaimed_at": 40.0, "tenants": ("ns/p",)},
            100.0,
            ReclaimStep.GIVE_UP,
        ),
        (
            "past twice the bound",
            {"pool": "serving", "reclaimed_at": 0.0, "tenants": ("ns/p",)},
            121.0,
            None,
        ),
        (
            "a serving pod landed",
            {"pool": "serving", "reclaimed_at": 40.0, "tenants": ("ns/p",), "serving_gpus": 4},
            100.0,
            None,
        ),
        (
            "lost",
            {"pool": "serving", "reclaimed_at": 40.0, "tenants": ("ns/p",), "ready": False},
            100.0,
            None,
        ),
    ],
)
def test_reclaim_step_retries_within_the_bound_and_gives_up_after_it(
    case: str, fields: dict, now: float, step: ReclaimStep | None
) -> None:
    pool = fields.pop("pool")
    assert reclaim_step(node("n", pool=pool, **fields), now, 60.0) == step, case


def test_reclaims_under_way_are_those_with_spot_pods_left_within_twice_the_bound() -> None:
    nodes = [
        node("evicting", pool="serving", reclaimed_at=90.0, tenants=("ns/p",)),
        node("leaving", pool="serving", reclaimed_at=90.0, leaving=1),
        node("done", pool="serving", reclaimed_at=90.0),
        node("stale", pool="serving", reclaimed_at=-100.0, tenants=("ns/p",)),
        node("lost", pool="serving", reclaimed_at=90.0, tenants=("ns/p",), ready=False),
        node("spot", reclaimed_at=90.0, tenants=("ns/p",)),
    ]
    assert [n.name for n in under_way(nodes, 100.0, 60.0)] == ["evicting", "leaving"]
