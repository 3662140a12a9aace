"""Bring the whole test environment up and down: cluster, GPU nodes, Prometheus.

Why separate from the CLI: pytest fixtures call the same functions in-process, so
the tests exercise exactly what developers run by hand.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

from e2e import (
    gobuild,
    inventory,
    keda,
    kind_cluster,
    kubectl,
    kwok_cluster,
    procs,
    prometheus,
    versions,
)
from e2e.state import ClusterState, load, save, state_file

PROVIDERS = ("kwok", "kind")
REQUIRED_FOR_KWOK = ("kubernetes", "etcd", "kwok")


class EnvironmentNotReady(RuntimeError):
    """Something needed for ``up`` is missing; the message says what to run."""


def _step(label: str, start: float) -> None:
    print(f"  {label:<28} {time.monotonic() - start:6.1f}s", flush=True)


def is_healthy(state: ClusterState) -> bool:
    """API server answers /readyz and Prometheus answers /-/ready."""
    try:
        kubectl.kubectl(state.kubeconfig, ["get", "--raw", "/readyz"], timeout=10)
    except Exception:  # KubectlError, OSError, subprocess.TimeoutExpired
        return False
    return procs.http_ok(f"{state.prometheus_url}/-/ready")


def up(
    provider: str = "kwok",
    inventory_name: str | Path = inventory.DEFAULT_INVENTORY,
    node_image: str | None = None,
) -> ClusterState:
    """Start everything and return its state; reuse a healthy environment that is already up."""
    if provider not in PROVIDERS:
        raise ValueError(f"unknown provider {provider!r}; choose one of {PROVIDERS}")
    current = load()
    if current is not None:
        if current.provider == provider and is_healthy(current):
            print(f"already up ({state_file()})")
            return current
        down()
    bin_dir = versions.bin_dir()
    if provider == "kwok":
        missing = [c for c in gobuild.missing_components(bin_dir) if c in REQUIRED_FOR_KWOK]
        if missing:
            raise EnvironmentNotReady(
                f"binaries missing or of another version: {', '.join(missing)} in {bin_dir}; "
                "run `python -m e2e.cluster build`"
            )
    inv = inventory.resolve(inventory_name)
    root = versions.state_dir()
    root.mkdir(parents=True, exist_ok=True)
    workdir = root / "kwok"
    kubeconfig = root / "kubeconfig.yaml"
    prom_dir = root / "prometheus"
    state = ClusterState(
        provider=provider,
        name=kwok_cluster.CLUSTER_NAME,
        kubeconfig=str(kubeconfig),
        prometheus_url="",
        prometheus_dir=str(prom_dir),
        workdir=str(workdir),
        bin_dir=str(bin_dir),
    )
    save(state)  # first, so that `down` can clean up a half-started environment
    t0 = time.monotonic()
    try:
        start = time.monotonic()
        if provider == "kwok":
            kwok_cluster.create(workdir, kubeconfig, bin_dir)
        else:
            kind_cluster.create(kubeconfig, node_image)
        _step(f"cluster ({provider})", start)
        start = time.monotonic()
        names = inventory.create_nodes(kubeconfig, inv)
        inventory.wait_ready(kubeconfig, names)
        _step(f"{len(names)} GPU nodes Ready", start)
        start = time.monotonic()
        _, url = prometheus.start(prom_dir)
        state.prometheus_url = url
        save(state)
        _step("Prometheus ready", start)
    except BaseException:
        down()
        raise
    _step("up total", t0)
    return state


def down() -> None:
    """Stop every process ``up`` started and remove all runtime state."""
    state = load()
    root = versions.state_dir()
    t0 = time.monotonic()
    if state is not None:
        keda.stop()  # its processes only: the APIService goes with the cluster
        prometheus.stop(Path(state.prometheus_dir))
        if state.provider == "kind":
            kind_cluster.delete(Path(state.kubeconfig))
        else:
            kwok_cluster.delete(Path(state.workdir), Path(state.bin_dir))
    shutil.rmtree(root, ignore_errors=True)
    _step("down total", t0)


def status() -> tuple[ClusterState | None, dict[str, str]]:
    """The recorded state and a short health report per part."""
    state = load()
    if state is None:
        return None, {"cluster": "down"}
    report: dict[str, str] = {}
    try:
        kubectl.kubectl(state.kubeconfig, ["get", "--raw", "/readyz"], timeout=10)
        report["kube-apiserver"] = "ready"
        ready = inventory.ready_nodes(Path(state.kubeconfig))
        report["nodes Ready"] = str(len(ready))
    except Exception as err:
        report["kube-apiserver"] = f"NOT ready: {str(err).splitlines()[0][:120]}"
    if state.provider == "kwok":
        pids = kwok_cluster.component_pids(Path(state.workdir))
        alive = sum(procs.is_alive(p) for p in pids)
        report["kwok components alive"] = f"{alive}/{len(pids)}"
    if report.get("kube-apiserver") == "ready":
        report.update(keda.status(Path(state.kubeconfig)))
    url = state.prometheus_url
    prom_ok = bool(url) and procs.http_ok(f"{url}/-/ready")
    report["prometheus"] = f"ready at {url}" if prom_ok else "NOT ready"
    return state, report
