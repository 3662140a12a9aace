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
import subprocess
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

from e2e import inventory, kwok_cluster, versions
from sageserve.controller.kube import Kube
from sageserve.controller.member_clusters import LABEL_MEMBER, Members
from sageserve.core.labels import NodeLabels
from sageserve.core.nodes import parse_nodes

REPO = Path(__file__).resolve().parents[2]


def _helm_template(release: str, namespace: str) -> str:
    out = subprocess.run(
        [
            str(versions.bin_dir() / "helm"),
            "template",
            release,
            str(REPO / "charts" / "sageserve"),
            "-n",
            namespace,
            "--kube-version",
            "1.36.0",
            "--set",
            "fleet.member.enabled=true",
            "--set",
            f"fleet.member.namespaces={{{namespace}}}",
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return out.stdout


def _member_kubeconfig(admin: Path, token: str, server: str | None = None) -> dict[str, Any]:
    """The admin kubeconfig's cluster entry (server, CA) with the member's token as user."""
    doc = yaml.safe_load(admin.read_text())
    cluster = dict(doc["clusters"][0]["cluster"])
    for key in ("certificate-authority",):  # a file on this machine: inline it
        if key in cluster:
            cluster["certificate-authority-data"] = base64.b64encode(
                Path(cluster.pop(key)).read_bytes()
            ).decode()
    if server is not None:
        cluster = {"server": server, "insecure-skip-tls-verify": True}
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "member", "cluster": cluster}],
        "users": [{"name": "member", "user": {"token": token}}],
        "contexts": [{"name": "member", "context": {"cluster": "member", "user": "member"}}],
        "current-context": "member",
    }


def _member_secret(name: str, cluster: str, kubeconfig: dict[str, Any]) -> dict[str, Any]:
    data = base64.b64encode(yaml.safe_dump(kubeconfig).encode()).decode()
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name, "labels": {LABEL_MEMBER: cluster}},
        "data": {"kubeconfig": data},
    }


def _can(kubeconfig: Path, account: str, *args: str) -> bool:
    out = kubectl(kubeconfig, ["auth", "can-i", f"--as={account}", *args], check=False)
    return out.stdout.strip() == "yes"


def test_a_member_is_read_with_the_chart_member_roles_token_alone(
    kubeconfig: Path, namespace: str
) -> None:
    release = f"m{uuid.uuid4().hex[:6]}"
    rendered = _helm_template(release, namespace)
    kubectl(kubeconfig, ["apply", "-n", namespace, "-f", "-"], stdin=rendered)
    try:
        secret = f"{release}-sageserve-member-token"

        def token() -> str | None:
            out = kubectl(
                kubeconfig,
                ["get", "secret", secret, "-n", namespace, "-o", "jsonpath={.data.token}"],
                check=False,
            )
            return base64.b64decode(out.stdout).decode() if out.stdout.strip() else None

        member_token = eventually(token, 60, "the member ServiceAccount's token")
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
            _member_secret(
                "east-kubeconfig", "member-east", _member_kubeconfig(kubeconfig, member_token)
            ),
            _member_secret(
                "gone-kubeconfig",
                "member-gone",
                _member_kubeconfig(kubeconfig, member_token, server="https://127.0.0.1:1"),
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
    """A second control plane (its own etcd, API server, controller-manager, scheduler,
    KWOK) with two 8-GPU A100 nodes in region eu-west: (workdir, admin kubeconfig)."""
    from conftest import one_start_at_a_time

    workdir, kubeconfig = tmp_path / "member-kwok", tmp_path / "member-kubeconfig.yaml"
    nodes = tmp_path / "member-nodes.yaml"
    docs = []
    for i in range(2):
        name = f"gpu-{MEMBER_REGION}-a100-serving-{i}"
        gpus = {"cpu": "96", "memory": "1000Gi", "pods": "110", "nvidia.com/gpu": "8"}
        docs.append(
            {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {
                    "name": name,
                    "annotations": {"kwok.x-k8s.io/node": "fake"},
                    "labels": {
                        "kubernetes.io/hostname": name,
                        "type": "kwok",
                        "topology.kubernetes.io/region": MEMBER_REGION,
                        "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB",
                        "sageserve.io/pool": "serving",
                    },
                },
                "status": {"allocatable": gpus, "capacity": gpus},
            }
        )
    nodes.write_text(yaml.safe_dump_all(docs))
    bin_dir = versions.bin_dir()
    try:
        with one_start_at_a_time(tmp_path_factory):
            kwok_cluster.create(workdir, kubeconfig, bin_dir)
        inventory.wait_ready(kubeconfig, inventory.create_nodes(kubeconfig, nodes))
        yield workdir, kubeconfig
    finally:
        kwok_cluster.delete(workdir, bin_dir)


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

        # the member's API server goes away for longer than one plan interval (60 s)
        stopped = threading.Thread(
            target=kwok_cluster.restart_component,
            args=(member_workdir, "kube-apiserver", 100.0, member_ready),
            kwargs={"watch_s": 5.0},  # the member's other components are not needed here
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
        assert stopped.is_alive(), "the member came back before the next plan; lengthen it"
        status = policy_status(kubeconfig, namespace)
        assert _plan_targets(kubeconfig, namespace, MEMBER_REGION) == planned_there
        forecasts = {f["region"] for f in status["plan"]["forecasts"]}
        assert MEMBER_REGION not in forecasts and HUB_REGION in forecasts

        stopped.join(timeout=180)
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
