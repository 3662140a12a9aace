"""A member cluster read the way a hub's operator reads it: the chart's member role
installed into a real API server, its ServiceAccount token in a kubeconfig Secret labelled
`sageserve.io/member-cluster` in the hub's namespace, and `controller.member_clusters`
listing the member's GPU nodes over real HTTPS with that token alone. (The session's
cluster plays the member and the hub: one API server, two identities.) A member whose API
server does not answer is read as silent and named, beside one that answers."""

from __future__ import annotations

import base64
import subprocess
import uuid
from pathlib import Path
from typing import Any

import yaml
from e2e_helpers import eventually, kubectl
from kubernetes import client, config

from e2e import versions
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
        # what the member role allows: listing Nodes, and nothing else a hub could misuse
        account = f"system:serviceaccount:{namespace}:{release}-sageserve-member"
        assert _can(kubeconfig, account, "list", "nodes")
        for verb, what in [
            ("patch", "nodes"),
            ("list", "pods"),
            ("list", "secrets"),
            ("create", "deployments"),
            ("get", "nodes"),
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
        readings, nodes = Members(hub, namespace, timeout_s=5.0).read(NodeLabels())

        by_name = {r.name: r for r in readings}
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
