"""The record of a running test cluster, shared by ``up``, ``down``, ``env``, ``status``
and the pytest fixtures.

Why a file: the commands run in different processes (a developer's shell, pytest,
CI steps), so what ``up`` started must be discoverable afterwards.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from e2e import versions


@dataclass
class ClusterState:
    """What ``up`` started and where it lives."""

    provider: str
    name: str
    kubeconfig: str
    prometheus_url: str
    prometheus_dir: str
    workdir: str
    bin_dir: str
    #: where KWOK takes pod IPs from (a loopback range, `kwok_cluster.loopback_pod_cidr`);
    #: empty for the kind provider, whose in-cluster kwok keeps its default
    pod_cidr: str = ""

    def env(self) -> dict[str, str]:
        """Environment variables that point clients at this cluster."""
        return {
            "KUBECONFIG": self.kubeconfig,
            "SAGESERVE_PROMETHEUS_URL": self.prometheus_url,
            "SAGESERVE_PROMETHEUS_TARGETS_DIR": str(Path(self.prometheus_dir) / "targets"),
            # where `sageserve twin --prometheus-data` moves backfilled blocks
            "SAGESERVE_PROMETHEUS_DATA_DIR": str(Path(self.prometheus_dir) / "data"),
            "SAGESERVE_E2E_BIN": self.bin_dir,
        }


def state_file() -> Path:
    return versions.state_dir() / "state.json"


def save(state: ClusterState) -> None:
    path = state_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(asdict(state), indent=2) + "\n")


def load() -> ClusterState | None:
    """The state of a cluster started by ``up``, or None when nothing is up."""
    path = state_file()
    if not path.is_file():
        return None
    return ClusterState(**json.loads(path.read_text()))
