"""Faults around the pod sets, read from the objects (controller.faults, controller.guard).

The objects are shaped as the API server returns them (managedFields, deletionTimestamp,
PodScheduled); the e2e tests (tests/e2e/test_e2e_operator_faults.py) make the real API
server and scheduler produce them.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest

from sageserve.api.model_deployment import ModelDeployment
from sageserve.controller.faults import (
    Sizing,
    lost_pods,
    overdue_pods,
    ownership,
    replicas_writers,
    shortfall_message,
    unplaced_pods,
)
from sageserve.controller.guard import FaultReport, Guard
from sageserve.controller.kube import ReplicasMoved
from sageserve.controller.observe import endpoint_snapshots
from sageserve.core.labels import ANNOTATION_REPLICAS, ANNOTATION_SCALING
from sageserve.core.nodes import not_ready_since
from sageserve.core.types import EndpointKey

NOW = 1_750_000_000.0  # 2025-06-15T15:06:40Z
LABELS = {
    "app.kubernetes.io/managed-by": "sageserve",
    "sageserve.io/model-deployment": "llama",
    "sageserve.io/region": "us-east",
    "sageserve.io/variant": "a100",
}


def manager(name: str, time: str, subresource: str = "", operation: str = "Update") -> dict:
    entry = {
        "manager": name,
        "operation": operation,
        "time": time,
        "fieldsV1": {"f:spec": {"f:replicas": {}}},
    }
    if subresource:
        entry["subresource"] = subresource
    return entry


def pod_set(
    replicas: int, stamp: int | None, managers: list[dict], scaling: str | None = None
) -> dict[str, Any]:
    annotations = {"deployment.kubernetes.io/revision": "1"}
    if stamp is not None:
        annotations[ANNOTATION_REPLICAS] = str(stamp)
    if scaling is not None:
        annotations[ANNOTATION_SCALING] = scaling
    return {
        "metadata": {
            "name": "llama-us-east-a100",
            "labels": LABELS,
            "annotations": annotations,
            "managedFields": [
                {"manager": "kube-controller-manager", "fieldsV1": {"f:status": {}}},
                *managers,
            ],
        },
        "spec": {"replicas": replicas},
    }


OURS = manager("sageserve-pace", "2025-06-15T15:00:00Z")
KUBECTL = manager("kubectl-scale", "2025-06-15T15:05:00Z", "scale")


def test_writers_of_replicas_are_read_from_managed_fields_latest_first() -> None:
    writers = replicas_writers(pod_set(3, 1, [OURS, KUBECTL]))
    assert [w.manager for w in writers] == ["kubectl-scale", "sageserve-pace"]
    assert str(writers[0]) == "kubectl-scale (Update of /scale at 2025-06-15T15:05:00Z)"


@pytest.mark.parametrize(
    ("replicas", "stamp", "managers", "scaling", "sizing"),
    [
        (2, 2, [OURS], None, Sizing.OURS),
        (2, None, [OURS], None, Sizing.ADOPT),  # new or from before the stamp
        (3, 2, [OURS], None, Sizing.ADOPT),  # only sageserve wrote it (its own race)
        (3, 2, [KUBECTL], None, Sizing.CONFLICT),
        (3, 2, [KUBECTL], "external", Sizing.HANDED_OVER),
        (3, 2, [KUBECTL], "resume", Sizing.RESUME),
        (3, 2, [KUBECTL], "extrenal", Sizing.UNKNOWN),
        (3, 3, [KUBECTL], None, Sizing.OURS),  # taken back: its stamp is the count
    ],
)
def test_who_sizes_a_pod_set(
    replicas: int, stamp: int | None, managers: list[dict], scaling: str | None, sizing: Sizing
) -> None:
    assert ownership(pod_set(replicas, stamp, managers, scaling)).sizing is sizing


def test_a_handed_over_pod_set_is_followed_so_that_handing_it_back_is_no_conflict() -> None:
    assert ownership(pod_set(3, 2, [KUBECTL], "external")).needs_stamp
    assert not ownership(pod_set(3, 3, [KUBECTL], "external")).needs_stamp
    assert not ownership(pod_set(3, 2, [KUBECTL])).needs_stamp  # a conflict is never stamped


def pod(name: str, **meta: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": LABELS, **meta},
        "spec": {"containers": [{"resources": {"limits": {"nvidia.com/gpu": "4"}}}]},
        "status": {"phase": "Pending"},
    }


def test_a_pod_past_its_deletion_deadline_is_overdue_with_its_finalizers() -> None:
    pods = [
        pod("gone-soon", deletionTimestamp="2025-06-15T15:07:00Z"),  # deadline ahead
        pod("stuck", deletionTimestamp="2025-06-15T15:05:40Z", finalizers=["example.com/hold"]),
        pod("alive"),
    ]
    [stuck] = overdue_pods(pods, NOW)
    assert (stuck.name, stuck.overdue_s, stuck.gpus) == ("stuck", 60.0, 4)
    assert "example.com/hold" in stuck.describe() and "4 GPU(s) stay taken" in stuck.describe()


def test_unschedulable_pods_are_grouped_per_model_and_region() -> None:
    unscheduled = pod("p-1", creationTimestamp="2025-06-15T15:05:00Z")
    unscheduled["status"]["conditions"] = [
        {
            "type": "PodScheduled",
            "status": "False",
            "reason": "Unschedulable",
            "message": "0/12 nodes are available: 12 Insufficient nvidia.com/gpu.",
            "lastTransitionTime": "2025-06-15T15:05:10Z",
        }
    ]
    not_yet = pod("p-2")  # no verdict from the scheduler yet
    [u] = unplaced_pods([unscheduled, not_yet], NOW)
    assert (u.name, u.waiting_s, u.since) == ("p-1", 90.0, "2025-06-15T15:05:10Z")
    message = shortfall_message([u])
    assert message.startswith("llama/us-east: 1 instance(s) of 4 GPU(s) Pending since")
    assert "Insufficient nvidia.com/gpu" in message


class FakeKube:
    def __init__(self, moved: bool = False) -> None:
        self.moved = moved
        self.stamps: list[tuple[str, int, bool]] = []

    def set_replicas(
        self, namespace: str, observed: dict[str, Any], replicas: int, drop_scaling: bool = False
    ) -> None:
        if self.moved:
            raise ReplicasMoved("changed")
        self.stamps.append((observed["metadata"]["name"], replicas, drop_scaling))


def guard_of(*pod_sets: dict[str, Any], pods: list[dict[str, Any]] | None = None) -> Guard:
    sets = {"llama": {d["metadata"]["name"]: d for d in pod_sets}}
    return Guard.observe("llm", sets, pods or [], NOW)


def test_settle_stamps_adopted_and_resumed_pod_sets_and_never_a_conflict() -> None:
    log = logging.getLogger("t")
    for d, expected in [
        (pod_set(2, None, [OURS]), [("llama-us-east-a100", 2, False)]),
        (pod_set(3, 2, [KUBECTL], "resume"), [("llama-us-east-a100", 3, True)]),
        (pod_set(3, 2, [KUBECTL]), []),
        (pod_set(2, 2, [OURS]), []),
    ]:
        kube = FakeKube()
        guard_of(d).settle(kube, {d["metadata"]["name"]: d}, log)  # type: ignore[arg-type]
        assert kube.stamps == expected
    d = pod_set(2, None, [OURS])  # written meanwhile: left for the next pass
    guard_of(d).settle(FakeKube(moved=True), {d["metadata"]["name"]: d}, log)  # type: ignore[arg-type]


def test_a_pod_stuck_terminating_is_found_at_its_endpoint_only() -> None:
    stuck = pod("stuck", deletionTimestamp="2025-06-15T15:05:40Z")
    guard = guard_of(pod_set(2, 2, [OURS]), pods=[stuck])
    assert [s.name for s in guard.stuck_at(EndpointKey("llama", "us-east"))] == ["stuck"]
    assert guard.stuck_at(EndpointKey("llama", "us-west")) == []


class Recorder:
    def __init__(self) -> None:
        self.conditions: dict[str, tuple[bool, str, str]] = {}
        self.events: list[tuple[str, str, str]] = []

    def condition(self, type_: str, status: bool, reason: str, message: str) -> None:
        self.conditions[type_] = (status, reason, message)

    def event(self, obj: dict[str, Any], type_: str, reason: str, message: str) -> None:
        self.events.append((obj["kind"], reason, message))


def test_a_conflict_is_a_condition_and_one_event_per_new_writer_naming_it() -> None:
    rec = Recorder()
    report = FaultReport(
        rec.condition, rec.event, autoscalers=lambda: {"llama-us-east-a100": ["Hpa/h"]}
    )
    owners = {"llama": {"kind": "ModelDeployment", "metadata": {"name": "llama"}}}
    guard = guard_of(pod_set(3, 2, [KUBECTL]))
    for _ in range(3):  # three passes: one Event each on the model and the pod set
        report.post(guard, owners, set(rec.conditions))
    status, reason, message = rec.conditions["Conflict"]
    assert status and reason == "ReplicasWrittenElsewhere"
    assert "replicas 3 written by kubectl-scale" in message and "it set 2" in message
    assert "sageserve.io/scaling=external" in message and "sageserve.io/scaling=resume" in message
    assert [(k, r) for k, r, _ in rec.events] == [
        ("ModelDeployment", "ReplicasConflict"),
        ("Deployment", "ReplicasConflict"),
    ]
    assert "Hpa/h" in rec.events[0][2]
    report.post(guard_of(pod_set(3, 2, [KUBECTL], "external")), owners, set(rec.conditions))
    assert rec.conditions["Conflict"][:2] == (False, "HandedOver")
    assert rec.events[-1][1] == "HandedOver"


def test_conditions_that_never_went_wrong_are_not_written() -> None:
    rec = Recorder()
    FaultReport(rec.condition, rec.event).post(guard_of(pod_set(2, 2, [OURS])), {}, set())
    assert rec.conditions == {} and rec.events == []


def test_a_stuck_pod_is_reported_once_after_the_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SAGESERVE_REPORT_AFTER_SECONDS", "90")
    rec = Recorder()
    report = FaultReport(rec.condition, rec.event)
    owners = {"llama": {"kind": "ModelDeployment", "metadata": {"name": "llama"}}}
    stuck = pod("stuck", deletionTimestamp="2025-06-15T15:05:40Z")  # 60 s overdue
    report.post(guard_of(pod_set(1, 1, [OURS]), pods=[stuck]), owners, set())
    assert "TerminationStuck" not in rec.conditions  # not yet: under the bound
    monkeypatch.setenv("SAGESERVE_REPORT_AFTER_SECONDS", "30")
    for _ in range(2):
        report.post(guard_of(pod_set(1, 1, [OURS]), pods=[stuck]), owners, set(rec.conditions))
    assert rec.conditions["TerminationStuck"][:2] == (True, "PodsNotGone")
    assert [r for _, r, _ in rec.events] == ["TerminationStuck"]
    report.post(guard_of(pod_set(1, 1, [OURS])), owners, set(rec.conditions))
    assert rec.conditions["TerminationStuck"][:2] == (False, "NoneStuck")


def test_pods_on_a_lost_node_are_listed_with_how_long_it_has_been_lost() -> None:
    on_lost = pod("on-lost")
    on_lost["spec"]["nodeName"] = "gpu-0"
    leaving = pod("leaving", deletionTimestamp="2025-06-15T15:05:40Z")
    leaving["spec"]["nodeName"] = "gpu-0"
    healthy = pod("healthy")
    healthy["spec"]["nodeName"] = "gpu-1"
    batch = {"metadata": {"name": "batch", "labels": {}}, "spec": {"nodeName": "gpu-0"}}
    [lost] = lost_pods([on_lost, leaving, healthy, batch], {"gpu-0": NOW - 30}, NOW)
    assert (lost.name, lost.node, lost.lost_s, lost.model) == ("on-lost", "gpu-0", 30.0, "llama")
    assert lost.since == "2025-06-15T15:06:10Z"
    assert "node gpu-0 not Ready since 2025-06-15T15:06:10Z" in lost.describe()


@pytest.mark.parametrize(
    ("conditions", "since"),
    [
        ([], None),  # a hand-written inventory: no condition, taken as Ready
        ([{"type": "Ready", "status": "True"}], None),
        (
            [{"type": "Ready", "status": "False", "lastTransitionTime": "2025-06-15T15:06:10Z"}],
            NOW - 30,
        ),
        ([{"type": "Ready", "status": "Unknown"}], 0.0),
    ],
)
def test_a_node_is_lost_from_when_its_ready_condition_left_true(
    conditions: list[dict[str, str]], since: float | None
) -> None:
    assert not_ready_since({"status": {"conditions": conditions}}) == since


def test_a_pod_on_a_lost_node_is_not_serving_even_if_it_still_says_ready() -> None:
    md = ModelDeployment.model_validate(
        {
            "apiVersion": "sageserve.io/v1alpha1",
            "kind": "ModelDeployment",
            "metadata": {"name": "llama", "namespace": "llm"},
            "spec": {
                "model": {"name": "m"},
                "variants": [
                    {
                        "name": "a100",
                        "gpuType": "NVIDIA-A100",
                        "gpusPerInstance": 4,
                        "capacityTokensPerSecond": 900,
                    }
                ],
                "regions": [{"name": "us-east", "minInstances": 1, "maxInstances": 4}],
                "tiers": ["iw-f"],
                "policyRef": {"name": "p"},
            },
        }
    )
    pods = []
    for name, node in (("a", "gpu-0"), ("b", "gpu-1")):
        p = pod(name)
        p["spec"]["nodeName"] = node
        p["status"] = {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}
        pods.append(p)
    sets = {"llama-us-east-a100": {"spec": {"replicas": 2}}}
    key = EndpointKey("llama", "us-east")
    assert endpoint_snapshots(md, "llm", sets, pods, {}, {})[key].serving == 2
    snap = endpoint_snapshots(md, "llm", sets, pods, {}, {}, lost_nodes={"gpu-1"})[key]
    assert (snap.serving, snap.replicas) == (1, {"a100": 2})  # the lost one counts as coming
