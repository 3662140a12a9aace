"""``--provider kind``: the same setup on kind, for machines with a Docker engine.

Not run in CI (our machines have no Docker engine). kind gives a real node for the
control plane; the GPU nodes are still KWOK fake nodes from the same inventory, so
the kwok controller is installed in-cluster from the release manifests. It manages
only nodes annotated ``kwok.x-k8s.io/node=fake``, which every inventory node is.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from e2e import versions

CLUSTER_NAME = "sageserve-e2e"
KWOK_RELEASE = f"https://github.com/kubernetes-sigs/kwok/releases/download/v{versions.KWOK_VERSION}"


class KindError(RuntimeError):
    """kind is missing or failed."""


def _run(argv: list[str], timeout: float = 600.0) -> None:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    if proc.returncode != 0:
        raise KindError(f"{' '.join(argv)} failed:\n{proc.stdout}\n{proc.stderr}")


def kubectl_binary() -> str:
    """Our built kubectl if present, else whatever kubectl is on PATH."""
    ours = versions.bin_dir() / "kubectl"
    if ours.exists():
        return str(ours)
    found = shutil.which("kubectl")
    if not found:
        raise KindError("kubectl not found: run `python -m e2e.cluster build` first")
    return found


def create(kubeconfig: Path, node_image: str | None = None) -> None:
    """kind cluster with its own kubeconfig, plus the in-cluster kwok controller."""
    if shutil.which("kind") is None:
        raise KindError("kind is not on PATH (go install sigs.k8s.io/kind@latest); needs Docker")
    argv = [
        "kind",
        "create",
        "cluster",
        "--name",
        CLUSTER_NAME,
        "--kubeconfig",
        str(kubeconfig),
        "--wait",
        "120s",
    ]
    if node_image:
        argv += ["--image", node_image]
    _run(argv)
    kc = kubectl_binary()
    _run([kc, f"--kubeconfig={kubeconfig}", "apply", "-f", f"{KWOK_RELEASE}/kwok.yaml"])
    _run([kc, f"--kubeconfig={kubeconfig}", "apply", "-f", f"{KWOK_RELEASE}/stage-fast.yaml"])
    _run(
        [
            kc,
            f"--kubeconfig={kubeconfig}",
            "-n",
            "kube-system",
            "rollout",
            "status",
            "deployment/kwok-controller",
            "--timeout=180s",
        ]
    )


def delete(kubeconfig: Path) -> None:
    """Delete the kind cluster (its containers and its kubeconfig entry)."""
    if shutil.which("kind") is None:
        return
    _run(["kind", "delete", "cluster", "--name", CLUSTER_NAME, "--kubeconfig", str(kubeconfig)])
