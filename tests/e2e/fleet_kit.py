"""What the fleet-of-clusters e2e tests share: member control planes with KWOK GPU nodes,
the chart rendered with a test's values, and kubeconfigs that carry one ServiceAccount's
token alone (so a test proves what a chart role allows, not what the admin may)."""

from __future__ import annotations

import base64
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml
from e2e_helpers import eventually, kubectl

from e2e import inventory, kwok_cluster, versions
from sageserve.controller.member_clusters import LABEL_MEMBER

REPO = Path(__file__).resolve().parents[2]


def gpu_nodes(region: str, count: int) -> list[dict[str, Any]]:
    """`count` KWOK nodes of 8 A100s each, serving pool, in `region`."""
    gpus = {"cpu": "96", "memory": "1000Gi", "pods": "110", "nvidia.com/gpu": "8"}
    return [
        {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": f"gpu-{region}-a100-serving-{i}",
                "annotations": {"kwok.x-k8s.io/node": "fake"},
                "labels": {
                    "kubernetes.io/hostname": f"gpu-{region}-a100-serving-{i}",
                    "type": "kwok",
                    "topology.kubernetes.io/region": region,
                    "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB",
                    "sageserve.io/pool": "serving",
                },
            },
            "status": {"allocatable": gpus, "capacity": gpus},
        }
        for i in range(count)
    ]


@contextmanager
def control_plane(
    tmp_path: Path, factory: pytest.TempPathFactory, region: str
) -> Iterator[tuple[Path, Path]]:
    """A member control plane (its own etcd, API server, controller-manager, scheduler,
    KWOK) with two 8-GPU A100 nodes in `region`: (workdir, admin kubeconfig)."""
    from conftest import one_start_at_a_time

    workdir, kubeconfig = tmp_path / f"{region}-kwok", tmp_path / f"{region}-kubeconfig.yaml"
    nodes = tmp_path / f"{region}-nodes.yaml"
    nodes.write_text(yaml.safe_dump_all(gpu_nodes(region, 2)))
    bin_dir = versions.bin_dir()
    try:
        with one_start_at_a_time(factory):
            kwok_cluster.create(workdir, kubeconfig, bin_dir)
        inventory.wait_ready(kubeconfig, inventory.create_nodes(kubeconfig, nodes))
        yield workdir, kubeconfig
    finally:
        kwok_cluster.delete(workdir, bin_dir)


def chart(release: str, namespace: str, *values: str) -> str:
    """The chart rendered (`helm template`) with `--set` `values`."""
    args = [a for v in values for a in ("--set", v)]
    return subprocess.run(
        [
            str(versions.bin_dir() / "helm"),
            "template",
            release,
            str(REPO / "charts" / "sageserve"),
            "-n",
            namespace,
            "--kube-version",
            "1.36.0",
            *args,
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout


def token_of(admin: Path, namespace: str, secret: str) -> str:
    """The token the control plane writes into a ServiceAccount token Secret."""

    def token() -> str | None:
        out = kubectl(
            admin,
            ["get", "secret", secret, "-n", namespace, "-o", "jsonpath={.data.token}"],
            check=False,
        )
        return base64.b64decode(out.stdout).decode() if out.stdout.strip() else None

    return eventually(token, 60, f"the token in {secret}")


def token_kubeconfig(admin: Path, token: str, server: str | None = None) -> dict[str, Any]:
    """The admin kubeconfig's server and CA with `token` as the only credential (`server`:
    another address, e.g. one nothing answers on)."""
    doc = yaml.safe_load(admin.read_text())
    cluster = dict(doc["clusters"][0]["cluster"])
    if "certificate-authority" in cluster:  # a file on this machine: inline it
        cluster["certificate-authority-data"] = base64.b64encode(
            Path(cluster.pop("certificate-authority")).read_bytes()
        ).decode()
    if server is not None:
        cluster = {"server": server, "insecure-skip-tls-verify": True}
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": cluster}],
        "users": [{"name": "u", "user": {"token": token}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "c",
    }


def member_secret(name: str, cluster: str, kubeconfig: dict[str, Any]) -> dict[str, Any]:
    """The hub's Secret naming a member cluster (`sageserve.io/member-cluster`)."""
    data = base64.b64encode(yaml.safe_dump(kubeconfig).encode()).decode()
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name, "labels": {LABEL_MEMBER: cluster}},
        "data": {"kubeconfig": data},
    }
