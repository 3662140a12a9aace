"""Which nodes a pass reclaims and donates, from Nodes and Pods as the API returns them."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

import sageserve.controller.spot as spot_module
from sageserve.controller.kube import refusal
from sageserve.controller.spot import (
    ANNOTATION_BLOCKED_BY,
    ANNOTATION_DONATED_AT,
    ANNOTATION_LAST_MODEL,
    ANNOTATION_RECLAIMED_AT,
    SpotPass,
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


def spot_pod(name: str, node_name: str, terminating: bool = False) -> dict:
    meta: dict = {"name": name, "namespace": "batch", "labels": {"app": "spot-batch"}}
    if terminating:
        meta["deletionTimestamp"] = "2026-11-21T10:00:00Z"
    return {
        "metadata": meta,
        "spec": {
            "nodeName": node_name,
            "containers": [{"resources": {"limits": {"nvidia.com/gpu": "8"}}}],
        },
        "status": {"phase": "Running"},
    }


PDB = "PodDisruptionBudget batch/keep-one (The disruption budget keep-one needs 1 healthy pods)"


class FakeKube:
    """Nodes and pods in memory; evictions refused for the pods in `protected`."""

    def __init__(self, nodes: list[dict], pods: list[dict], protected: set[str]) -> None:
        self.node_list, self.pod_list, self.protected = nodes, pods, protected
        self.evictions: list[str] = []

    def nodes(self) -> list[dict]:
        return self.node_list

    def pods(self) -> list[dict]:
        return self.pod_list

    def evict(self, namespace: str, name: str) -> str | None:
        self.evictions.append(f"{namespace}/{name}")
        if name in self.protected:
            return PDB
        self.pod_list = [p for p in self.pod_list if p["metadata"]["name"] != name]
        return None

    def mark_node(self, name: str, labels: dict, annotations: dict) -> None:
        for n in self.node_list:
            if n["metadata"]["name"] == name:
                n["metadata"]["labels"].update(labels)
                n["metadata"]["annotations"].update(annotations)


def run_pass(kube: FakeKube, monkeypatch: pytest.MonkeyPatch, at: float) -> SpotPass:
    monkeypatch.setattr(spot_module.time, "time", lambda: at)
    stamp = datetime.fromtimestamp(at, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
    monkeypatch.setattr(spot_module, "now_iso", lambda: stamp)
    spot_pass = SpotPass(kube, LABELS)  # type: ignore[arg-type]
    spot_pass.run(REGION_OF, set(), dry_run=False)
    return spot_pass


def test_a_reclaim_a_budget_refuses_is_retried_given_up_after_the_bound_then_another_taken(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SAGESERVE_RECLAIM_TIMEOUT_SECONDS", "10")
    nodes = [node("serving-0", "serving"), node("spot-0", "spot"), node("spot-1", "spot")]
    pods = [
        serving_pod("a", "serving-0"),
        serving_pod("b", None, "Pending"),
        spot_pod("protected", "spot-0"),
    ]
    kube = FakeKube(nodes, pods, {"protected"})
    t0 = 1_800_000_000.0

    first = run_pass(kube, monkeypatch, t0)  # spot-0 first by name: taken, eviction refused
    assert kube.evictions == ["batch/protected"]
    assert nodes[1]["metadata"]["labels"][LABELS.pool] == "serving"
    assert first.spot_nodes == 1 and first.blocked == []

    for dt in (2.0, 4.0, 8.0):  # within the bound: evicted again, no second node taken
        retry = run_pass(kube, monkeypatch, t0 + dt)
        assert nodes[2]["metadata"]["labels"][LABELS.pool] == "spot"
        assert retry.given_up == []
    assert kube.evictions == ["batch/protected"] * 4

    gave_up = run_pass(kube, monkeypatch, t0 + 10.0)  # the bound: given back to spot
    [blocked] = gave_up.given_up
    assert blocked.node == "spot-0" and "batch/protected" in blocked.by and "keep-one" in blocked.by
    assert nodes[1]["metadata"]["labels"][LABELS.pool] == "spot"
    assert nodes[1]["metadata"]["annotations"][ANNOTATION_BLOCKED_BY] == blocked.by
    assert gave_up.spot_nodes == 2  # spot-0 back, spot-1 not taken yet
    message = blocked.describe(10.0)
    assert "spot-0" in message and "PodDisruptionBudget batch/keep-one" in message
    assert "not taken again before" in message

    nxt = run_pass(kube, monkeypatch, t0 + 12.0)  # the next pass takes the other node
    assert nodes[2]["metadata"]["labels"][LABELS.pool] == "serving"
    assert nodes[1]["metadata"]["labels"][LABELS.pool] == "spot"
    assert [b.node for b in nxt.blocked] == ["spot-0"] and nxt.given_up == []
    assert nxt.spot_nodes == 1


def test_a_reclaim_whose_pods_are_leaving_covers_its_pending_pod() -> None:
    nodes = [
        node("serving-0", "serving", **{ANNOTATION_RECLAIMED_AT: "2026-11-21T10:00:00Z"}),
        node("spot-1", "spot"),
    ]
    pods = [serving_pod("b", None, "Pending"), spot_pod("going", "serving-0", terminating=True)]
    shapes = pool_nodes(nodes, pods, LABELS)
    assert shapes[0].leaving == 1 and shapes[0].tenants == ()
    now = datetime(2026, 11, 21, 10, 0, 5, tzinfo=UTC).timestamp()
    pending = unschedulable(pods, REGION_OF)
    reclaims, _ = plan_moves(shapes, pending, {("us-west", A100)}, LABELS, now=now)
    assert reclaims == []  # spot-1 is not taken while serving-0 is being emptied
    reclaims, _ = plan_moves(shapes, pending, {("us-west", A100)}, LABELS)
    assert [n.name for n, _ in reclaims] == ["spot-1"]  # no clock: the old rule


def test_a_lost_node_is_not_counted_donated_or_reclaimed() -> None:
    lost = node("serving-1", "serving")
    lost["status"]["conditions"] = [{"type": "Ready", "status": "Unknown"}]
    lost_spot = node("spot-0", "spot")
    lost_spot["status"]["conditions"] = [{"type": "Ready", "status": "False"}]
    shapes = pool_nodes([lost, lost_spot], [serving_pod("b", None, "Pending")], LABELS)
    assert [n.ready for n in shapes] == [False, False]
    pending = unschedulable([serving_pod("b", None, "Pending")], REGION_OF)
    assert plan_moves(shapes, pending, {("us-west", A100)}, LABELS) == ([], [])
    kube = FakeKube([lost, lost_spot], [], set())
    spot_pass = SpotPass(kube, LABELS)  # type: ignore[arg-type]
    spot_pass.run(REGION_OF, set(), dry_run=False)
    assert spot_pass.spot_nodes == 0


@pytest.mark.parametrize(
    ("status", "body", "expected"),
    [
        (
            429,
            '{"kind":"Status","status":"Failure","message":"Cannot evict pod as it would violate'
            ' the pod\'s disruption budget.","reason":"TooManyRequests","details":'
            '{"causes":[{"reason":"DisruptionBudget","message":"The disruption budget keep-one'
            ' needs 1 healthy pods and has 1 currently"}]},"code":429}',
            "PodDisruptionBudget batch/keep-one (The disruption budget keep-one needs 1 healthy "
            "pods and has 1 currently)",
        ),
        (
            500,
            '{"kind":"Status","message":"This pod has more than one PodDisruptionBudget, which '
            'the eviction subresource does not support.","reason":"InternalError","code":500}',
            "500 InternalError: This pod has more than one PodDisruptionBudget, which the "
            "eviction subresource does not support.",
        ),
        (429, "Too Many Requests", "429 Too Many Requests"),
    ],
)
def test_a_refused_eviction_names_the_budget(status: int, body: str, expected: str) -> None:
    assert refusal("batch", status, body) == expected
