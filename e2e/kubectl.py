"""Thin wrapper around our own kubectl binary.

Why kubectl and not a Python client here: the tooling must run from ``scripts/setup``
and CI before any test dependency is installed, and kubectl is built anyway.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Sequence
from pathlib import Path

from e2e import versions


class KubectlError(RuntimeError):
    """kubectl exited non-zero; the message carries its stderr."""


def kubectl_env() -> dict[str, str]:
    """Keep kubectl's discovery/HTTP cache in our state dir instead of ~/.kube."""
    env = dict(os.environ)
    env.pop("KUBECONFIG", None)
    env["KUBECACHEDIR"] = str(versions.state_dir() / "kube-cache")
    return env


def kubectl(
    kubeconfig: Path | str,
    args: Sequence[str],
    stdin: str | None = None,
    binary: Path | None = None,
    timeout: float = 120.0,
) -> str:
    """Run kubectl against ``kubeconfig`` (never the user's ~/.kube/config)."""
    exe = binary or versions.bin_dir() / "kubectl"
    proc = subprocess.run(
        [str(exe), f"--kubeconfig={kubeconfig}", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env=kubectl_env(),
    )
    if proc.returncode != 0:
        raise KubectlError(f"kubectl {' '.join(args)}: {proc.stderr.strip()}")
    return proc.stdout
