"""The fleet of clusters as one client: listings from every cluster that answers, each
write to the cluster holding the object, a silent member's pod sets neither listed nor
written, and the pod sets of a deleted ModelDeployment collected in members.

Pure routing, against in-memory clusters that record what reaches them; the same paths
against real API servers are in tests/e2e/test_e2e_member_clusters.py."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from sageserve.controller.fleet_kube import ClusterSilent, FleetKube, FleetWriteError
from sageserve.controller.kube import KedaUnavailable
from sageserve.controller.member_clusters import MemberRead
from sageserve.core.labels import (
    LABEL_DEPLOYMENT,
    LABEL_REGION,
    MANAGED_BY,
    MANAGED_BY_LABEL,
    NodeLabels,
)
from sageserve.plan.member_clusters import ClusterReading

NS = "llm"


def _node(name: str, region: str) -> dict[str, Any]:
    gpus = {"nvidia.com/gpu": "8"}
    return {
        "metadata": {
            "name": name,
            "labels": {
                "topology.kubernetes.io/region": region,
                "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB",
            },
        },
        "status": {"allocatable": gpus, "capacity": gpus},
    }


def _pod_set(model: str, region: str, replicas: int = 1) -> dict[str, Any]:
    return {
        "metadata": {
            "name": f"{model}-{region}-a100",
            "namespace": NS,
            "labels": {
                LABEL_DEPLOYMENT: model,
                LABEL_REGION: region,
                MANAGED_BY_LABEL: MANAGED_BY,
            },
            "ownerReferences": [{"kind": "ModelDeployment", "name": model, "uid": "u1"}],
        },
        "spec": {"replicas": replicas},
    }


class _Cluster:
    """One API server: its nodes, pods and pod sets; every write recorded."""

    def __init__(self, region: str, *pod_sets: dict[str, Any]) -> None:
        self.node_list = [_node(f"node-{region}", region)]
        self.sets = {d["metadata"]["name"]: d for d in pod_sets}
        self.pod_list = [
            {"metadata": {"name": f"{name}-pod", "namespace": NS}} for name in self.sets
        ]
        self.writes: list[tuple[str, str]] = []
        self.answers = True
        self.refuse = 0

    def _up(self) -> None:
        if not self.answers:
            raise ConnectionError("connection refused")

    def nodes(self, timeout_s: float | None = None) -> list[dict[str, Any]]:
        self._up()
        return self.node_list

    def pods(self) -> list[dict[str, Any]]:
        self._up()
        return self.pod_list

    def pods_of(self, namespace: str) -> list[dict[str, Any]]:
        return self.pods()

    def deployments_by_owner(self, namespace: str) -> dict[str, dict[str, dict[str, Any]]]:
        self._up()
        out: dict[str, dict[str, dict[str, Any]]] = {}
        for name, d in self.sets.items():
            out.setdefault(d["metadata"]["labels"][LABEL_DEPLOYMENT], {})[name] = d
        return out

    def deployments_of(self, namespace: str, owner: str) -> dict[str, dict[str, Any]]:
        return self.deployments_by_owner(namespace).get(owner, {})

    def apply(self, body: dict[str, Any]) -> dict[str, Any]:
        self._up()
        if self.refuse:
            raise ApiException(status=self.refuse, reason="Not Found")
        self.writes.append(("apply", body["metadata"]["name"]))
        self.sets[body["metadata"]["name"]] = body
        return body

    def set_replicas(
        self, namespace: str, observed: dict[str, Any], replicas: int, *_: Any
    ) -> None:
        self._up()
        self.writes.append(("replicas", f"{observed['metadata']['name']}={replicas}"))

    def delete_deployment(self, namespace: str, name: str) -> None:
        self.writes.append(("delete", name))
        self.sets.pop(name, None)

    def annotate_pod(self, namespace: str, name: str, annotations: dict[str, str]) -> None:
        self.writes.append(("annotate", name))

    def mark_node(self, name: str, labels: dict[str, str], annotations: dict[str, str]) -> None:
        self.writes.append(("mark", name))


class _Members:
    namespace = "sageserve-system"

    def __init__(self, **members: _Cluster) -> None:
        self.members = members

    def read(self, labels: NodeLabels) -> MemberRead:
        out = MemberRead()
        for name, cluster in sorted(self.members.items()):
            try:
                nodes = cluster.nodes()
            except ConnectionError as exc:
                out.readings.append(ClusterReading(name, reachable=False, error=str(exc)))
                continue
            out.readings.append(ClusterReading(name, frozenset({"eu-west"})))
            out.nodes[name], out.clients[name] = nodes, cluster  # type: ignore[assignment]
        return out


@pytest.fixture
def fleet() -> tuple[FleetKube, _Cluster, _Cluster]:
    hub = _Cluster("us-east", _pod_set("m", "us-east"))
    west = _Cluster("eu-west", _pod_set("m", "eu-west"))
    kube = FleetKube(hub, _Members(west=west), "hub", NodeLabels())  # type: ignore[arg-type]
    return kube, hub, west


def test_pod_sets_are_listed_from_every_cluster_and_sized_where_they_live(
    fleet: tuple[FleetKube, _Cluster, _Cluster],
) -> None:
    kube, hub, west = fleet
    sets = kube.deployments_by_owner(NS)["m"]
    assert sorted(sets) == ["m-eu-west-a100", "m-us-east-a100"]
    kube.set_replicas(NS, sets["m-eu-west-a100"], 3)
    kube.set_replicas(NS, sets["m-us-east-a100"], 2)
    assert west.writes == [("replicas", "m-eu-west-a100=3")]
    assert hub.writes == [("replicas", "m-us-east-a100=2")]
    assert sorted(n["metadata"]["name"] for n in kube.nodes()) == ["node-eu-west", "node-us-east"]
    kube.pods_of(NS)
    kube.annotate_pod(NS, "m-eu-west-a100-pod", {})
    kube.mark_node("node-eu-west", {}, {})
    assert west.writes[1:] == [("annotate", "m-eu-west-a100-pod"), ("mark", "node-eu-west")]


def test_a_new_pod_set_goes_to_its_regions_cluster_without_an_owner_it_has_not(
    fleet: tuple[FleetKube, _Cluster, _Cluster],
) -> None:
    kube, hub, west = fleet
    kube.apply(_pod_set("n", "eu-west"))
    kube.apply(_pod_set("n", "us-east"))
    assert west.writes == [("apply", "n-eu-west-a100")]
    assert "ownerReferences" not in west.sets["n-eu-west-a100"]["metadata"]
    assert hub.writes == [("apply", "n-us-east-a100")]
    assert hub.sets["n-us-east-a100"]["metadata"]["ownerReferences"]  # the hub's GC keeps it


def test_a_silent_member_is_neither_listed_nor_written_and_its_regions_are_held(
    fleet: tuple[FleetKube, _Cluster, _Cluster],
) -> None:
    kube, _, west = fleet
    assert kube.held_regions() == frozenset()
    west.answers = False
    kube.refresh(force=True)
    assert kube.held_regions() == {"eu-west"}  # it served eu-west when last read
    assert sorted(kube.deployments_by_owner(NS)["m"]) == ["m-us-east-a100"]
    with pytest.raises(ClusterSilent, match="eu-west"):
        kube.apply(_pod_set("n", "eu-west"))
    assert west.writes == []
    west.answers = True
    kube.refresh(force=True)
    assert kube.held_regions() == frozenset()


def test_a_member_failing_in_the_middle_of_a_pass_is_silent_for_the_rest_of_it(
    fleet: tuple[FleetKube, _Cluster, _Cluster],
) -> None:
    kube, _, west = fleet
    kube.refresh()
    west.answers = False  # answered the read, fails the listing
    assert sorted(kube.deployments_by_owner(NS)["m"]) == ["m-us-east-a100"]
    assert kube.held_regions() == {"eu-west"}
    assert not next(r for r in kube.readings if r.name == "west").reachable


def test_a_restarted_hub_holds_the_regions_status_says_a_silent_member_served() -> None:
    west = _Cluster("eu-west")
    west.answers = False
    kube = FleetKube(_Cluster("us-east"), _Members(west=west), "hub", NodeLabels())  # type: ignore[arg-type]
    assert kube.held_regions() == frozenset()  # nothing known of west yet
    kube.refresh(force=True, last_home={"eu-west": "west"})
    assert kube.held_regions() == {"eu-west"}


def test_member_pod_sets_of_a_deleted_model_deployment_are_collected(
    fleet: tuple[FleetKube, _Cluster, _Cluster],
) -> None:
    kube, hub, west = fleet
    kube.deployments_by_owner(NS)
    foreign = _pod_set("x", "eu-west")
    foreign["metadata"]["labels"][MANAGED_BY_LABEL] = "someone-else"
    west.sets["x-eu-west-a100"] = foreign
    assert kube.collect_orphans({NS: {"m"}}) == []  # m exists; x is not sageserve's
    assert kube.collect_orphans({}) == [f"west:{NS}/m-eu-west-a100"]
    assert sorted(west.sets) == ["x-eu-west-a100"]
    assert hub.writes == []  # the hub's own go with their owner (garbage collector)


def test_an_object_of_the_same_name_in_two_clusters_is_not_written() -> None:
    hub = _Cluster("us-east")
    west = _Cluster("eu-west")
    west.node_list = [_node("node-us-east", "eu-west")]  # the same Node name in both
    kube = FleetKube(hub, _Members(west=west), "hub", NodeLabels())  # type: ignore[arg-type]
    kube.refresh()
    with pytest.raises(ClusterSilent, match="in clusters hub, west"):
        kube.mark_node("node-us-east", {}, {})
    assert hub.writes == west.writes == []


def test_a_member_refusing_a_pod_set_is_named_with_the_fix(
    fleet: tuple[FleetKube, _Cluster, _Cluster],
) -> None:
    kube, _, west = fleet
    west.refuse = 404  # the namespace does not exist there
    with pytest.raises(FleetWriteError, match="member cluster west refused pod set llm/n-eu-west"):
        kube.apply(_pod_set("n", "eu-west"))
    with pytest.raises(FleetWriteError, match="create namespace llm there"):
        kube.apply(_pod_set("n", "eu-west"))


def test_a_member_without_keda_is_named_not_taken_for_silent(
    fleet: tuple[FleetKube, _Cluster, _Cluster],
) -> None:
    kube, hub, west = fleet

    def absent(namespace: str) -> dict[str, Any]:
        raise KedaUnavailable("KedaNotInstalled", "the CustomResourceDefinition is not installed")

    hub.scaled_objects = lambda namespace: {}  # type: ignore[attr-defined]
    west.scaled_objects = absent  # type: ignore[attr-defined]
    with pytest.raises(KedaUnavailable, match="member cluster west: the Custom") as raised:
        kube.scaled_objects(NS)
    assert raised.value.reason == "KedaNotInstalled"
    assert kube.held_regions() == frozenset()  # still read, still paced otherwise


def test_a_refused_member_pod_set_is_its_own_condition_not_the_models_readiness() -> None:
    from datetime import UTC, datetime

    from sageserve.controller.handlers import member_clusters_condition

    events: list[tuple[str, str]] = []

    class _Hub:
        def event(self, body: dict[str, Any], type_: str, reason: str, message: str) -> None:
            events.append((type_, reason))

    ready = [{"type": "Ready", "status": "True", "reason": "PodSetsApplied", "message": "m"}]
    now = datetime(2026, 12, 6, tzinfo=UTC)
    refused = ["member cluster west refused pod set llm/m-eu-west-a100 (404 Not Found): ..."]
    conditions = member_clusters_condition(_Hub(), {}, {}, ready, refused, now, 1)  # type: ignore[arg-type]
    by_type = {c["type"]: c for c in conditions}
    assert by_type["Ready"]["status"] == "True"  # the other regions are paced on
    assert (by_type["MemberClusters"]["status"], by_type["MemberClusters"]["reason"]) == (
        "False",
        "MemberClusterRefused",
    )
    assert "member cluster west refused" in by_type["MemberClusters"]["message"]
    assert events == [("Warning", "MemberClusterRefused")]
    # reported once per transition, then cleared when every member takes its own
    again = member_clusters_condition(
        _Hub(), {}, {"conditions": conditions}, conditions, refused, now, 1
    )  # type: ignore[arg-type]
    assert len(events) == 1
    cleared = member_clusters_condition(_Hub(), {}, {}, again, [], now, 1)  # type: ignore[arg-type]
    assert {c["type"]: c["status"] for c in cleared}["MemberClusters"] == "True"
