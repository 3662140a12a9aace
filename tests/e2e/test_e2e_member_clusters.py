"""Member clusters as a hub's operator reads them.

1. The chart's member role installed into a real API server, its ServiceAccount token in a
   kubeconfig Secret labelled `sageserve.io/member-cluster` in the hub's namespace, and
   `controller.member_clusters` listing the member's GPU nodes over real HTTPS with that
   token alone (the session's cluster plays member and hub: one API server, two
   identities); a member whose API server does not answer is read as silent and named.
2. A second real control plane as a member serving region eu-west: the operator's plan
   covers it; its API server stopped, the `Clusters` condition names the member at the next
   pace pass, the next plan holds eu-west at the plan in force while the hub's region is
   still planned; back, the member is read again."""

from __future__ import annotations

import base64
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from e2e_helpers import eventually, kubectl
from fault_kit import figure
from fleet_kit import chart, control_plane, member_secret, token_kubeconfig, token_of
from kopf.testing import KopfRunner
from kubernetes import client, config
from operator_kit import (
    apply,
    model_deployment,
    operator_args,
    operator_env,
    policy_status,
    scaling_policy,
)

from e2e import kwok_cluster
from sageserve.controller.kube import Kube
from sageserve.controller.member_clusters import LABEL_MEMBER, Members
from sageserve.core.labels import NodeLabels
from sageserve.core.nodes import parse_nodes

REPO = Path(__file__).resolve().parents[2]


def _can(kubeconfig: Path, account: str, *args: str) -> bool:
    out = kubectl(kubeconfig, ["auth", "can-i", f"--as={account}", *args], check=False)
    return out.stdout.strip() == "yes"


def test_a_member_is_read_with_the_chart_member_roles_token_alone(
    kubeconfig: Path, namespace: str
) -> None:
    release = f"m{uuid.uuid4().hex[:6]}"
    rendered = chart(
        release,
        namespace,
        "fleet.member.enabled=true",
        f"fleet.member.namespaces={{{namespace}}}",
    )
    kubectl(kubeconfig, ["apply", "-n", namespace, "-f", "-"], stdin=rendered)
    try:
        member_token = token_of(kubeconfig, namespace, f"{release}-sageserve-member-token")
        # what the member role allows: the inventory and spot donation cluster-wide, pod
        # sets only in the namespaces it names, and nothing else a hub could misuse
        account = f"system:serviceaccount:{namespace}:{release}-sageserve-member"
        for verb, what in [("list", "nodes"), ("patch", "nodes"), ("list", "pods")]:
            assert _can(kubeconfig, account, verb, what, "-A"), (verb, what)
        for verb, what in [("create", "deployments"), ("patch", "deployments"), ("patch", "pods")]:
            assert _can(kubeconfig, account, verb, what, "-n", namespace), (verb, what)
            assert not _can(kubeconfig, account, verb, what, "-n", "default"), (verb, what)
        for verb, what in [
            ("list", "secrets"),
            ("get", "secrets"),
            ("create", "pods"),
            ("delete", "nodes"),
            ("create", "deployments"),
        ]:
            assert not _can(kubeconfig, account, verb, what, "-A"), (verb, what)

        # the hub: a kubeconfig Secret per member in its namespace, one silent
        docs = [
            member_secret(
                "east-kubeconfig", "member-east", token_kubeconfig(kubeconfig, member_token)
            ),
            member_secret(
                "gone-kubeconfig",
                "member-gone",
                token_kubeconfig(kubeconfig, member_token, server="https://127.0.0.1:1"),
            ),
        ]
        for doc in docs:
            kubectl(kubeconfig, ["apply", "-n", namespace, "-f", "-"], stdin=yaml.safe_dump(doc))
        configuration = client.Configuration()
        config.load_kube_config(config_file=str(kubeconfig), client_configuration=configuration)
        hub = Kube(client.ApiClient(configuration))
        read = Members(hub, namespace, timeout_s=5.0).read(NodeLabels())
        nodes = read.nodes.get("member-east", [])
        by_name = {r.name: r for r in read.readings}
        assert set(by_name) == {"member-east", "member-gone"}
        east = by_name["member-east"]
        assert east.reachable, east.error
        listed = kubectl(kubeconfig, ["get", "nodes", "-o", "json"]).stdout
        gpu_nodes = parse_nodes(yaml.safe_load(listed)["items"], NodeLabels())
        assert east.regions == {n.region for n in gpu_nodes}
        assert len(parse_nodes(nodes, NodeLabels())) == len(gpu_nodes)
        gone = by_name["member-gone"]
        assert not gone.reachable and gone.error, gone
    finally:
        kubectl(kubeconfig, ["delete", "-n", namespace, "-f", "-"], stdin=rendered, check=False)


MEMBER_REGION = "eu-west"
HUB_REGION = "us-central"


@pytest.fixture
def member(tmp_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path]]:
    """A second control plane with two 8-GPU A100 nodes in region eu-west: (workdir, admin
    kubeconfig)."""
    with control_plane(tmp_path, tmp_path_factory, MEMBER_REGION) as made:
        yield made


def _clusters_condition(kubeconfig: Path, namespace: str, status: str) -> dict[str, Any] | None:
    """The policy's `Clusters` condition when its status is `status`."""
    conditions = policy_status(kubeconfig, namespace).get("conditions") or []
    found = next((c for c in conditions if c["type"] == "Clusters"), None)
    return found if found is not None and found["status"] == status else None


def _plan_targets(kubeconfig: Path, namespace: str, region: str) -> list[int]:
    plan = policy_status(kubeconfig, namespace).get("plan") or {}
    return [t["target"] for t in plan.get("targets", []) if t["region"] == region]


def _computed_at(kubeconfig: Path, namespace: str) -> float:
    at = (policy_status(kubeconfig, namespace).get("plan") or {}).get("computedAt")
    return datetime.fromisoformat(at.replace("Z", "+00:00")).timestamp() if at else 0.0


@pytest.mark.usefixtures("restore_node_pools")
def test_a_silent_member_is_held_at_the_plan_in_force_and_named_then_read_again(
    kubeconfig: Path,
    namespace: str,
    prometheus_url: str,
    member: tuple[Path, Path],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    member_workdir, member_kubeconfig = member
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "eu-west-kubeconfig", "labels": {LABEL_MEMBER: "eu-west-1"}},
        "data": {"kubeconfig": base64.b64encode(member_kubeconfig.read_bytes()).decode()},
    }
    kubectl(kubeconfig, ["apply", "-n", namespace, "-f", "-"], stdin=yaml.safe_dump(secret))
    kubectl(member_kubeconfig, ["create", "namespace", namespace])  # where its pod sets go
    operator_env(monkeypatch, kubeconfig, namespace, prometheus_url, 0)
    monkeypatch.setenv("SAGESERVE_MEMBER_CLUSTERS", "on")
    monkeypatch.setenv("SAGESERVE_LEASE_NAMESPACE", namespace)
    monkeypatch.setenv("SAGESERVE_CLUSTER_NAME", "hub")
    forecast = {"method": "persistence", "granularitySeconds": 30, "trainingWindowSeconds": 300}
    here = model_deployment([HUB_REGION], lo=1, hi=2, name="here")
    there = model_deployment([MEMBER_REGION], lo=1, hi=2, name="there")

    def member_ready() -> bool:
        out = kubectl(member_kubeconfig, ["get", "--raw", "/readyz"], check=False)
        return out.returncode == 0

    with KopfRunner(operator_args(namespace), timeout=600) as runner:
        policy = scaling_policy(
            "lt-immediate",
            forecast=forecast,
            intervals={"planSeconds": 60, "paceSeconds": 2, "cooldownSeconds": 2},
            forecastGap={"windowSeconds": 20},
            spot={"enabled": False},
        )
        apply(kubeconfig, namespace, here, there)  # both models before the first plan
        apply(kubeconfig, namespace, policy)
        read = eventually(
            lambda: _clusters_condition(kubeconfig, namespace, "True"),
            90,
            "a first plan reading both clusters",
        )
        assert read["reason"] == "ClustersReachable"
        clusters = policy_status(kubeconfig, namespace)["clusters"]
        by_name = {c["name"]: c for c in clusters}
        assert by_name["eu-west-1"] == {
            "name": "eu-west-1",
            "regions": [MEMBER_REGION],
            "reachable": True,
        }
        assert HUB_REGION in by_name["hub"]["regions"] and by_name["hub"]["reachable"]
        planned_there = eventually(
            lambda: _plan_targets(kubeconfig, namespace, MEMBER_REGION), 90, "eu-west in the plan"
        )
        first_plan = _computed_at(kubeconfig, namespace)

        # the member's API server goes away until the next plan has been seen (300 s at most)
        resume = threading.Event()
        stopped = threading.Thread(
            target=kwok_cluster.restart_component,
            args=(member_workdir, "kube-apiserver", 300.0, member_ready),
            # the member's other components are not needed here
            kwargs={"watch_s": 5.0, "resume": resume},
            daemon=True,
        )
        went = time.monotonic()
        stopped.start()
        held = eventually(
            lambda: _clusters_condition(kubeconfig, namespace, "False"),
            60,
            "the pace pass naming the silent member",
        )
        named = time.monotonic() - went
        assert held["reason"] == "ClusterUnreachable"
        assert "eu-west-1 (regions eu-west:" in held["message"], held
        status = policy_status(kubeconfig, namespace)
        silent = next(c for c in status["clusters"] if c["name"] == "eu-west-1")
        assert silent["reachable"] is False and silent["regions"] == [MEMBER_REGION]
        # the next plan (every 60 s) plans the hub's region on and holds the member's
        eventually(lambda: _computed_at(kubeconfig, namespace) > first_plan, 90, "the next plan")
        replanned = time.monotonic() - went
        assert stopped.is_alive(), "the outage's 300 s bound passed before the next plan"
        status = policy_status(kubeconfig, namespace)
        assert _plan_targets(kubeconfig, namespace, MEMBER_REGION) == planned_there
        forecasts = {f["region"] for f in status["plan"]["forecasts"]}
        assert MEMBER_REGION not in forecasts and HUB_REGION in forecasts

        resume.set()
        stopped.join(timeout=120)
        back = time.monotonic()
        eventually(
            lambda: _clusters_condition(kubeconfig, namespace, "True"),
            60,
            "the member read again",
        )
        again = time.monotonic() - back
    assert runner.exception is None, runner.output
    figure(
        "member cluster silent",
        f"named {named:.0f} s after its API server stopped (pace every 2 s), held by the "
        f"next plan {replanned:.0f} s after (plan every 60 s); read again {again:.0f} s after "
        "it was back",
    )
