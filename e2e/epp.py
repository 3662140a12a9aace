"""The endpoint picker (EPP) of the Gateway API Inference Extension, as its own process.

Why a real one: a platform team puts an InferencePool and an EPP in front of its model
servers; the EPP discovers the pool's pods through the API server and scrapes
`http://<podIP>:<targetPort>/metrics` of each. Here it runs from the pinned GAIE release
(`versions.GAIE_VERSION`, built by `gobuild.EPP`) against the test cluster's kubeconfig,
and its own metrics endpoint is registered with the kit's Prometheus as a file_sd target
(job `sageserve-e2e`, labels `namespace` (the pool's), `component="epp"`, `epp_pool`,
`epp_pool_namespace`). KWOK
pods have loopback IPs (`kwok_cluster.loopback_pod_cidr`), so `sageserve twin
--pod-listeners` answers each scrape at the pod's own address.

Pid and log files live in the kit's state dir (`<state>/epp/`), so `down` stops every
picker a session left behind, as it stops the cluster.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from e2e import gobuild, kubectl, procs, versions

#: How often the picker scrapes each pod (upstream: 50 ms) and refreshes its own pool
#: gauges (upstream: 5 s); a pod whose last scrape is older than 2 s is not counted ready.
REFRESH_METRICS_INTERVAL = "200ms"
REFRESH_PROMETHEUS_METRICS_INTERVAL = "1s"


class EppError(RuntimeError):
    """The picker could not be built, configured or started; the message says why."""


def binary() -> Path:
    return versions.bin_dir() / "epp"


def crd_file(name: str = versions.GAIE_INFERENCEPOOL_CRD) -> Path:
    return gobuild.gaie_crd_dir() / name


def ensure_built() -> Path:
    """The `epp` binary of the pinned release, built now if missing (minutes, cold)."""
    crds_missing = not crd_file().is_file()
    if not gobuild.EPP.is_current(versions.bin_dir()) or crds_missing:
        gobuild.build_all(force=crds_missing, only=(gobuild.EPP.name,))
    return binary()


def install_crds(kubeconfig: Path | str, timeout_s: float = 60) -> None:
    """Apply the InferencePool CRD of the pinned release and wait until it is served."""
    path = crd_file()
    if not path.is_file():
        raise EppError(f"{path} is missing: run `python -m e2e.cluster build --only epp --force`")
    kubectl.kubectl(kubeconfig, ["apply", "--server-side", "-f", str(path)])
    kubectl.kubectl(
        kubeconfig,
        [
            "wait",
            "--for=condition=Established",
            f"--timeout={int(timeout_s)}s",
            "crd/inferencepools.inference.networking.k8s.io",
        ],
        timeout=timeout_s + 10,
    )


def inference_pool(
    name: str,
    match_labels: dict[str, str],
    target_port: int,
    epp_service: str = "",
    epp_port: int = 9002,
) -> dict[str, Any]:
    """An `inference.networking.k8s.io/v1` InferencePool: the pods matching `match_labels`,
    served on `target_port`, picked by the EPP behind Service `epp_service` (a gateway's
    concern; the picker itself only reads the selector and the ports)."""
    return {
        "apiVersion": "inference.networking.k8s.io/v1",
        "kind": "InferencePool",
        "metadata": {"name": name},
        "spec": {
            "selector": {"matchLabels": match_labels},
            "targetPorts": [{"number": target_port}],
            "endpointPickerRef": {
                "name": epp_service or f"{name}-epp",
                "port": {"number": epp_port},
            },
        },
    }


def state_dir() -> Path:
    return versions.state_dir() / "epp"


@dataclass
class EppProcess:
    """A started picker: where it answers and what it was started with."""

    pool_name: str
    pool_namespace: str
    pid: int
    metrics_port: int
    grpc_port: int
    grpc_health_port: int
    argv: list[str]
    log: Path
    pid_file: Path
    targets_file: Path | None
    labels: dict[str, str] = field(default_factory=dict)

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}/metrics"

    @property
    def instance(self) -> str:
        """The `instance` label Prometheus gives its samples."""
        return f"127.0.0.1:{self.metrics_port}"

    def metrics(self) -> str:
        """Its /metrics text, read directly."""
        import urllib.request

        with urllib.request.urlopen(self.metrics_url, timeout=5) as resp:
            return str(resp.read().decode())

    def output(self, lines: int = 60) -> str:
        """The tail of its log, for failure messages."""
        try:
            text = self.log.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def alive(self) -> bool:
        return procs.is_alive(self.pid)

    def stop(self) -> None:
        """Stop it, withdraw its Prometheus target, drop its pid file."""
        if self.targets_file is not None:
            self.targets_file.unlink(missing_ok=True)
        procs.stop_pid(self.pid)
        self.pid_file.unlink(missing_ok=True)


def flags(pool_name: str, pool_namespace: str, metrics: int, grpc: int, health: int) -> list[str]:
    """The picker's command line: the pool it serves, its own ports, and no TLS, token
    auth, tracing exporter or pprof (a local test process scraped by a local Prometheus)."""
    return [
        f"--pool-name={pool_name}",
        f"--pool-namespace={pool_namespace}",
        f"--grpc-port={grpc}",
        f"--grpc-health-port={health}",
        f"--metrics-port={metrics}",
        "--secure-serving=false",
        "--metrics-endpoint-auth=false",
        "--tracing=false",
        "--enable-pprof=false",
        f"--refresh-metrics-interval={REFRESH_METRICS_INTERVAL}",
        f"--refresh-prometheus-metrics-interval={REFRESH_PROMETHEUS_METRICS_INTERVAL}",
        "--v=2",
    ]


def start(
    kubeconfig: Path | str,
    pool_name: str,
    pool_namespace: str,
    targets_dir: Path | None = None,
    extra_args: list[str] | None = None,
    timeout_s: float = 60,
) -> EppProcess:
    """Start a picker for InferencePool `pool_namespace/pool_name`; return once its metrics
    endpoint answers. With `targets_dir`, register that endpoint with Prometheus."""
    exe = ensure_built()
    sdir = state_dir()
    sdir.mkdir(parents=True, exist_ok=True)
    base = f"{pool_namespace}-{pool_name}"
    metrics, grpc, health = procs.free_port(), procs.free_port(), procs.free_port()
    if len({metrics, grpc, health}) != 3:
        metrics, grpc, health = procs.free_port(), procs.free_port(), procs.free_port()
    argv = [str(exe), *flags(pool_name, pool_namespace, metrics, grpc, health), *(extra_args or [])]
    env = dict(os.environ)
    env["KUBECONFIG"] = str(kubeconfig)  # controller-runtime's GetConfig reads it
    log, pid_file = sdir / f"{base}.log", sdir / f"{base}.pid"
    pid = procs.start_daemon(argv, log, pid_file, env)
    epp = EppProcess(
        pool_name, pool_namespace, pid, metrics, grpc, health, argv, log, pid_file, None
    )
    deadline = time.monotonic() + timeout_s
    while not procs.http_ok(epp.metrics_url):
        if not epp.alive() or time.monotonic() > deadline:
            why = "exited" if not epp.alive() else f"did not answer in {timeout_s:.0f}s"
            epp.stop()
            raise EppError(f"the endpoint picker {why}: {' '.join(argv)}\n{epp.output()}")
        time.sleep(0.2)
    if targets_dir is not None:
        # `namespace`: the pool's, as a cluster's Prometheus labels a picker scraped
        # through its Service or pod (the pace loop reads picker series per namespace)
        epp.labels = {
            "namespace": pool_namespace,
            "component": "epp",
            "epp_pool": pool_name,
            "epp_pool_namespace": pool_namespace,
        }
        epp.targets_file = targets_dir / f"epp-{base}.json"
        entry = [{"targets": [epp.instance], "labels": epp.labels}]
        tmp = epp.targets_file.with_name(f".{epp.targets_file.name}.tmp")
        tmp.write_text(json.dumps(entry, indent=1) + "\n")
        os.replace(tmp, epp.targets_file)
    return epp


def stop_all(root: Path | None = None) -> None:
    """Stop every picker started under the state dir (by its pid file)."""
    for pid_file in sorted((root or state_dir()).glob("*.pid")):
        pid = procs.read_pid(pid_file)
        if pid is not None:
            procs.stop_pid(pid)
        pid_file.unlink(missing_ok=True)
