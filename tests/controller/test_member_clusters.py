"""The fleet's member clusters on the operator's side: kubeconfig Secrets, a member that
does not answer, and the plan pass holding a silent member's regions at the plan in force.

The plan pass runs in process against the in-memory API of `plan_fakes`; a member that
answers is only exercised against a real API server in e2e, a member that does not answer
is a real connection to a closed port here."""

from __future__ import annotations

import base64
import logging
import math
from typing import Any

import pytest
import yaml

from sageserve.controller import plan_loop
from sageserve.controller.fleet_kube import FleetKube
from sageserve.controller.member_clusters import (
    LABEL_MEMBER,
    MemberConfigError,
    MemberRead,
    Members,
    clusters_status,
    kubeconfig_of,
    last_home,
    members_of,
)
from sageserve.core.labels import NodeLabels
from sageserve.plan.member_clusters import ClusterReading, fleet_view
from tests.controller.plan_fakes import (
    STEP_S,
    TRAINING_S,
    FakeKube,
    FakeReader,
    node_docs,
    policy_body,
)

LOG = logging.getLogger("test")
MODEL = "llama-2-70b"
REGIONS = ("us-east", "us-central", "us-west")


def _kubeconfig(server: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "m", "cluster": {"server": server}}],
        "users": [{"name": "m", "user": {"token": "t"}}],
        "contexts": [{"name": "m", "context": {"cluster": "m", "user": "m"}}],
        "current-context": "m",
    }


def _secret(cluster: str, data: dict[str, Any], version: str = "1") -> dict[str, Any]:
    return {
        "metadata": {
            "name": f"{cluster}-kubeconfig",
            "namespace": "sageserve-system",
            "labels": {LABEL_MEMBER: cluster},
            "resourceVersion": version,
        },
        "data": data,
    }


def _b64(doc: object) -> str:
    return base64.b64encode(yaml.safe_dump(doc).encode()).decode()


@pytest.mark.parametrize(
    ("data", "says"),
    [
        ({}, "no kubeconfig (put it under data.kubeconfig)"),
        ({"kubeconfig": "%%%"}, "data.kubeconfig is not base64 YAML"),
        ({"kubeconfig": _b64({"apiVersion": "v1"})}, "holds no clusters entry"),
    ],
)
def test_a_bad_member_secret_names_the_secret_and_the_fix(data: dict[str, Any], says: str) -> None:
    with pytest.raises(MemberConfigError, match="Secret sageserve-system/west-kubeconfig: "):
        kubeconfig_of(_secret("west", data))
    with pytest.raises(MemberConfigError, match=says.replace("(", r"\(").replace(")", r"\)")):
        kubeconfig_of(_secret("west", data))


def test_cluster_apis_secret_key_value_is_read_too() -> None:
    doc = _kubeconfig("https://west.example:6443")
    assert kubeconfig_of(_secret("west", {"value": _b64(doc)})) == doc


class _Hub:
    def __init__(self, secrets: list[dict[str, Any]]) -> None:
        self.secrets = secrets

    def labelled_secrets(self, namespace: str, label: str) -> list[dict[str, Any]]:
        assert (namespace, label) == ("sageserve-system", LABEL_MEMBER)
        return self.secrets


def test_a_member_that_does_not_answer_or_cannot_be_dialled_is_silent_not_a_crash() -> None:
    hub = _Hub(
        [
            _secret("west", {"kubeconfig": _b64(_kubeconfig("http://127.0.0.1:1"))}),
            _secret("broken", {}),
        ]
    )
    members = Members(hub, "sageserve-system", timeout_s=2.0)  # type: ignore[arg-type]
    read = members.read(NodeLabels())
    assert read.nodes == {} and read.clients == {}
    by_name = {r.name: r for r in read.readings}
    assert not by_name["west"].reachable and by_name["west"].error
    assert not by_name["broken"].reachable
    assert "no kubeconfig" in by_name["broken"].error
    # the client is built once per Secret version
    first = members.refresh()[1].kube
    assert members.refresh()[1].kube is first


def test_members_are_read_only_when_the_fleet_is_turned_on() -> None:
    hub = _Hub([])
    assert members_of(hub, {}) is None  # type: ignore[arg-type]
    on = {"SAGESERVE_MEMBER_CLUSTERS": "on", "SAGESERVE_LEASE_NAMESPACE": "sageserve-system"}
    assert members_of(hub, on) is members_of(hub, on)  # type: ignore[arg-type]


def test_status_clusters_round_trips_the_regions_a_silent_member_held() -> None:
    readings = [
        ClusterReading("hub", frozenset({"us-east"})),
        ClusterReading("west", frozenset({"us-west"})),
    ]
    status = clusters_status(fleet_view(readings), readings)
    assert last_home(status) == {"us-east": "hub", "us-west": "west"}
    silent = [readings[0], ClusterReading("west", reachable=False, error="i/o timeout")]
    after = clusters_status(fleet_view(silent, last_home(status)), silent)
    assert after[1] == {
        "name": "west",
        "regions": ["us-west"],
        "reachable": False,
        "message": "i/o timeout",
    }
    assert last_home(after) == last_home(status)
    assert last_home("junk") == {} and last_home([{"name": "x"}]) == {}


class _WestKube(FakeKube):
    """The member: us-west's nodes and pod sets."""

    def nodes(self, timeout_s: float | None = None) -> list[dict[str, Any]]:
        return [n for n in node_docs() if _region(n) == "us-west"]


class _FakeMembers:
    """Members whose answers the test sets: `west` serves us-west's nodes or is silent."""

    namespace = "sageserve-system"

    def __init__(self, west: FakeKube) -> None:
        self.west = west
        self.west_answers = True

    def read(self, labels: NodeLabels) -> MemberRead:
        if not self.west_answers:
            silent = ClusterReading("west", reachable=False, error="dial tcp: i/o timeout")
            return MemberRead([silent])
        west = self.west.nodes()
        return MemberRead(
            [ClusterReading("west", frozenset({"us-west"}))], {"west": west}, {"west": self.west}
        )


def _region(node: dict[str, Any]) -> str:
    return str(node["metadata"]["labels"].get("topology.kubernetes.io/region"))


class _HubKube(FakeKube):
    """The hub: us-east and us-central nodes only; us-west's live in the member."""

    def nodes(self, timeout_s: float | None = None) -> list[dict[str, Any]]:
        return [n for n in node_docs() if _region(n) != "us-west"]


def _history(west_tps: float) -> dict[tuple[str, str], list[float]]:
    n = TRAINING_S // STEP_S
    out = {(MODEL, r): [3000.0] * n for r in REGIONS}
    out[(MODEL, "us-west")] = [west_tps] * n
    return out


def test_a_silent_member_is_held_at_the_plan_in_force_and_named() -> None:
    west = _WestKube(current={(MODEL, "us-west", "h100"): 2})
    members = _FakeMembers(west)
    hub = _HubKube(current={(MODEL, r, "h100"): 2 for r in REGIONS if r != "us-west"})
    kube = FleetKube(hub, members, "hub", NodeLabels())  # type: ignore[arg-type]
    body = policy_body()
    first = plan_loop.PlanPass(kube, body, [], LOG).run(  # type: ignore[arg-type]
        FakeReader(_history(3000.0)), NodeLabels()
    )
    assert first is not None
    west_target = {k: n for k, n in first.targets.items() if k[1] == "us-west"}
    assert sum(west_target.values()) > 0  # planned on the member's GPUs
    written = next(p for p in reversed(hub.patches) if "clusters" in p)
    assert written["clusters"] == [
        {"name": "hub", "regions": ["us-central", "us-east"], "reachable": True},
        {"name": "west", "regions": ["us-west"], "reachable": True},
    ]
    assert any(c["type"] == "Clusters" and c["status"] == "True" for c in written["conditions"])
    assert hub.event_types["ClustersReachable"] == "Normal"

    # west goes silent; its load would now ask for far more, but nobody can see or act there
    body["status"] = {"plan": written["plan"], "clusters": written["clusters"]}
    members.west_answers = False
    kube.refresh(force=True)
    hub.events.clear()
    second = plan_loop.PlanPass(kube, body, [], LOG).run(  # type: ignore[arg-type]
        FakeReader(_history(30000.0)), NodeLabels()
    )
    assert second is not None
    assert {k: n for k, n in second.targets.items() if k[1] == "us-west"} == west_target
    assert (MODEL, "us-west") not in second.forecasts
    written = next(p for p in reversed(hub.patches) if "clusters" in p)
    assert written["clusters"][1] == {
        "name": "west",
        "regions": ["us-west"],
        "reachable": False,
        "message": "dial tcp: i/o timeout",
    }
    condition = next(c for c in written["conditions"] if c["type"] == "Clusters")
    assert (condition["status"], condition["reason"]) == ("False", "ClusterUnreachable")
    assert "west (regions us-west: dial tcp: i/o timeout)" in condition["message"]
    assert any(reason == "ClusterUnreachable" for reason, _ in hub.events)
    assert hub.event_types["ClusterUnreachable"] == "Warning"
    # the other regions are planned as before
    assert all(
        not math.isnan(f.peak_tps) for (m, r), f in second.forecasts.items() if r != "us-west"
    )


def test_a_silent_member_is_dialled_again_only_after_a_while(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A member whose API server hangs costs a read its timeout; dialled at every pass, it
    would slow every pass of every loop. It stays silent, with its last error, until
    SILENT_RETRY_S have passed."""
    from sageserve.controller import member_clusters

    clock = [1000.0]
    hub = _Hub([_secret("west", {"kubeconfig": _b64(_kubeconfig("http://127.0.0.1:1"))})])
    members = Members(hub, "sageserve-system", 2.0, lambda: clock[0])  # type: ignore[arg-type]
    first = members.read(NodeLabels()).readings[0]
    assert not first.reachable and first.error
    dialled: list[float] = []
    west = members.refresh()[0].kube
    assert west is not None
    monkeypatch.setattr(west, "nodes", lambda timeout_s=None: dialled.append(clock[0]) or [])
    clock[0] += member_clusters.SILENT_RETRY_S - 1
    again = members.read(NodeLabels()).readings[0]
    assert dialled == [] and (again.reachable, again.error) == (False, first.error)
    clock[0] += 1
    back = members.read(NodeLabels()).readings[0]
    assert dialled == [clock[0]] and back.reachable
