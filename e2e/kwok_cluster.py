"""The default provider: ``kwokctl --runtime binary`` on our locally built binaries.

Why kwokctl: it wires etcd, kube-apiserver (with its own PKI), controller-manager,
scheduler and the kwok controller together exactly as upstream tests it, and with
the binary runtime it needs no container engine. Every path is pinned through
``KWOK_*`` variables so nothing is downloaded and ``~/.kube/config`` is never read
or written.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from e2e import procs, versions

CLUSTER_NAME = "sageserve-e2e"


class ClusterError(RuntimeError):
    """The cluster could not be created or deleted."""


def kwok_env(workdir: Path, bin_dir: Path) -> dict[str, str]:
    """Environment for kwokctl: local binaries first on PATH, own workdir, binary runtime."""
    env = dict(os.environ)
    env.pop("KUBECONFIG", None)
    env.update(
        PATH=f"{bin_dir}{os.pathsep}{env.get('PATH', '')}",
        KWOK_WORKDIR=str(workdir),
        KWOK_RUNTIME="binary",
        KWOK_KUBE_VERSION=f"v{versions.KUBERNETES_VERSION}",
        KWOK_KUBE_BINARY_PREFIX=str(bin_dir),
        KWOK_KUBE_APISERVER_BINARY=str(bin_dir / "kube-apiserver"),
        KWOK_KUBE_CONTROLLER_MANAGER_BINARY=str(bin_dir / "kube-controller-manager"),
        KWOK_KUBE_SCHEDULER_BINARY=str(bin_dir / "kube-scheduler"),
        KWOK_KUBECTL_BINARY=str(bin_dir / "kubectl"),
        KWOK_ETCD_BINARY=str(bin_dir / "etcd"),
        KWOK_ETCD_VERSION=versions.ETCD_VERSION,
        KWOK_CONTROLLER_BINARY=str(bin_dir / "kwok"),
        KUBECACHEDIR=str(workdir / "kube-cache"),
    )
    return env


def kwokctl(args: list[str], workdir: Path, bin_dir: Path, timeout: float = 300.0) -> str:
    """Run our kwokctl with the pinned environment; raise with its output on failure."""
    proc = subprocess.run(
        [str(bin_dir / "kwokctl"), "--name", CLUSTER_NAME, *args],
        env=kwok_env(workdir, bin_dir),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if proc.returncode != 0:
        raise ClusterError(f"kwokctl {' '.join(args)} failed:\n{proc.stdout}\n{proc.stderr}")
    return proc.stdout + proc.stderr


def cluster_dir(workdir: Path) -> Path:
    return workdir / "clusters" / CLUSTER_NAME


def create(workdir: Path, kubeconfig: Path, bin_dir: Path, timeout_s: int = 120) -> None:
    """Create the cluster and wait until kwokctl reports it ready."""
    workdir.mkdir(parents=True, exist_ok=True)
    kwokctl(
        [
            "create",
            "cluster",
            "--runtime",
            "binary",
            "--kubeconfig",
            str(kubeconfig),
            "--wait",
            f"{timeout_s}s",
            "--timeout",
            f"{timeout_s + 30}s",
            "--etcd-binary",
            str(bin_dir / "etcd"),
            "--kube-apiserver-binary",
            str(bin_dir / "kube-apiserver"),
            "--kube-controller-manager-binary",
            str(bin_dir / "kube-controller-manager"),
            "--kube-scheduler-binary",
            str(bin_dir / "kube-scheduler"),
            "--kwok-controller-binary",
            str(bin_dir / "kwok"),
        ],
        workdir,
        bin_dir,
        timeout=timeout_s + 60,
    )


def component_pids(workdir: Path) -> list[int]:
    """Pids of the components kwokctl started for our cluster (from its pid files)."""
    pids = []
    for pid_file in sorted(cluster_dir(workdir).glob("pids/*.pid")):
        pid = procs.read_pid(pid_file)
        if pid is not None:
            pids.append(pid)
    return pids


def delete(workdir: Path, bin_dir: Path) -> None:
    """Delete the cluster; then make sure none of its processes survived; remove the workdir."""
    leftover = component_pids(workdir)
    if cluster_dir(workdir).exists():
        try:
            kwokctl(["delete", "cluster"], workdir, bin_dir, timeout=120)
        except (ClusterError, OSError, subprocess.TimeoutExpired) as err:
            print(f"warning: {err}")
    for pid in leftover:
        procs.stop_pid(pid)
    shutil.rmtree(workdir, ignore_errors=True)
