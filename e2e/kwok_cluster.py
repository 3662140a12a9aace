"""The default provider: ``kwokctl --runtime binary`` on our locally built binaries.

Why kwokctl: it wires etcd, kube-apiserver (with its own PKI), controller-manager,
scheduler and the kwok controller together exactly as upstream tests it, and with
the binary runtime it needs no container engine. Every path is pinned through
``KWOK_*`` variables so nothing is downloaded and ``~/.kube/config`` is never read
or written.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import yaml

from e2e import kubectl, pki, procs, versions

CLUSTER_NAME = "sageserve-e2e"
# How often the controller-manager's HPA controller reconciles (upstream default 15 s):
# tests of KEDA-driven scaling wait on HPA decisions, and nothing else here uses HPAs
# for timing.
HPA_SYNC_PERIOD = "2s"


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


def loopback_pod_cidr() -> str:
    """A /16 of 127.0.0.0/8 for the pods' IPs, drawn per cluster.

    Why loopback: every address of 127.0.0.0/8 is local on Linux, so a process on this
    host can listen on a KWOK pod's IP and port (`sageserve twin --pod-listeners`), and a
    client that finds pods by IP (an endpoint picker) reaches them over real HTTP. Why
    drawn: clusters of parallel test sessions then rarely share addresses (kwok hands out
    a range's addresses in order). 127.0.0.0/16 holds the usual 127.0.0.1 and stays out.
    """
    return f"127.{random.randint(16, 254)}.0.0/16"


def kwok_config(pod_cidr: str) -> str:
    """The KwokConfiguration document (kwokctl passes it to the kwok controller).

    Every option is spelled out with kwok v0.8.0's default: kwokctl saves the document
    without applying the defaults, so an option left out reaches the controller as zero
    (it then refuses to start: "node leases parallelism must be greater than 0")."""
    return (
        "apiVersion: config.kwok.x-k8s.io/v1alpha1\n"
        "kind: KwokConfiguration\n"
        "options:\n"
        f"  cidr: {pod_cidr}\n"
        "  manageAllNodes: false\n"  # kwokctl passes --manage-all-nodes=true itself
        "  enableDebuggingHandlers: true\n"
        "  enableContentionProfiling: false\n"
        "  enableProfilingHandler: true\n"
        "  podPlayStageParallelism: 4\n"
        "  nodePlayStageParallelism: 4\n"
        "  nodeLeaseParallelism: 4\n"
        "  podsOnNodeSyncParallelism: 1\n"
        "  enablePodsOnNodeSyncListPager: true\n"
        "  enablePodsOnNodeSyncStreamWatch: false\n"
    )


def aggregation_args(proxy: pki.FrontProxy) -> list[dict[str, str]]:
    """kube-apiserver flags that turn on the aggregation layer properly: kwokctl gives it
    only a proxy client certificate (its admin one) and no request-header CA, so an
    aggregated API server (KEDA's metrics adapter) could not tell who the API server acts
    for. Endpoint routing makes it dial the Service's endpoint addresses (processes on
    this machine) instead of a ClusterIP that nothing routes."""
    return [
        {"key": "requestheader-client-ca-file", "value": str(proxy.ca.cert)},
        {"key": "requestheader-allowed-names", "value": proxy.client_name},
        {"key": "requestheader-username-headers", "value": "X-Remote-User"},
        {"key": "requestheader-group-headers", "value": "X-Remote-Group"},
        {"key": "requestheader-extra-headers-prefix", "value": "X-Remote-Extra-"},
        # given after kwokctl's own --proxy-client-* flags, so these win
        {"key": "proxy-client-cert-file", "value": str(proxy.client.cert)},
        {"key": "proxy-client-key-file", "value": str(proxy.client.key)},
        {"key": "enable-aggregator-routing", "value": "true"},
    ]


def write_config(workdir: Path, pod_cidr: str = "") -> Path:
    """The configuration for ``kwokctl create --config``: the KwokctlConfiguration
    (components' extra flags) and, with `pod_cidr`, the KwokConfiguration giving pods their
    IPs from it."""
    proxy = pki.front_proxy(workdir / "pki")
    config = {
        "apiVersion": "config.kwok.x-k8s.io/v1alpha1",
        "kind": "KwokctlConfiguration",
        "componentsPatches": [
            {"name": "kube-apiserver", "extraArgs": aggregation_args(proxy)},
            {
                "name": "kube-controller-manager",
                "extraArgs": [
                    {"key": "horizontal-pod-autoscaler-sync-period", "value": HPA_SYNC_PERIOD}
                ],
            },
        ],
    }
    path = workdir / "kwokctl-config.yaml"
    text = yaml.safe_dump(config, sort_keys=False)
    path.write_text(text + (f"---\n{kwok_config(pod_cidr)}" if pod_cidr else ""))
    return path


def create(
    workdir: Path, kubeconfig: Path, bin_dir: Path, timeout_s: int = 120, pod_cidr: str = ""
) -> None:
    """Create the cluster and wait until kwokctl reports it ready; with `pod_cidr`, KWOK
    gives pods their IPs from it (else from its default 10.0.0.0/24)."""
    workdir.mkdir(parents=True, exist_ok=True)
    config = write_config(workdir, pod_cidr)
    kwokctl(
        [
            "create",
            "cluster",
            "--config",
            str(config),
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


def _running_components(workdir: Path) -> dict[str, tuple[list[str], str, dict[str, str]]]:
    """`{component: (argv, cwd, environment)}` of every live component, from /proc."""
    out = {}
    for pid_file in sorted(cluster_dir(workdir).glob("pids/*.pid")):
        pid = procs.read_pid(pid_file)
        if pid is None or not procs.is_alive(pid):
            continue
        proc = Path(f"/proc/{pid}")
        argv = [a.decode() for a in (proc / "cmdline").read_bytes().split(b"\0") if a]
        env = dict(
            e.decode().split("=", 1)
            for e in (proc / "environ").read_bytes().split(b"\0")
            if b"=" in e
        )
        out[pid_file.stem] = (argv, os.readlink(proc / "cwd"), env)
    return out


def _start_component(workdir: Path, name: str, how: tuple[list[str], str, dict[str, str]]) -> None:
    """Start a component again with its recorded command line; its pid file follows."""
    argv, cwd, env = how
    log = cluster_dir(workdir) / "logs" / f"{name}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as out:
        proc = subprocess.Popen(
            argv,
            cwd=cwd,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    (cluster_dir(workdir) / "pids" / f"{name}.pid").write_text(f"{proc.pid}\n")


@contextlib.contextmanager
def _held_port(port: int | None) -> Iterator[None]:
    """Keep a stopped component's port while it is down: another cluster starting on this
    machine meanwhile would otherwise take it (kwokctl picks free ports) and the component
    could not come back. Connections are accepted and closed at once, so clients see the
    server gone, as with nothing listening."""
    if port is None:
        yield
        return
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # past the TIME_WAITs
    sock.bind(("0.0.0.0", port))
    sock.listen(64)
    sock.settimeout(0.2)
    done = threading.Event()

    def refuse() -> None:
        while not done.is_set():
            try:
                conn, _ = sock.accept()
                conn.close()
            except OSError:
                continue

    thread = threading.Thread(target=refuse, name=f"hold-{port}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join(timeout=2)
        sock.close()


def restart_component(
    workdir: Path,
    name: str,
    down_s: float,
    ready: Callable[[], bool],
    watch_s: float = 20.0,
    resume: threading.Event | None = None,
) -> float:
    """Stop one component (e.g. `kube-apiserver`), leave it down `down_s` (or, with
    `resume`, until that event is set, `down_s` at most), start it again with the same
    command line, as a kubelet restarts a static pod; the seconds it was unavailable
    (until `ready()`). A test that must observe something during the outage passes
    `resume` and sets it once it has, so the outage never ends early on a slow machine.

    For `watch_s` afterwards (on a thread of its own: the caller goes on at once), any
    other component that exits is started again too: the controller-manager and the
    scheduler exit when they cannot renew their leader Lease, and in a real control plane
    their kubelet brings them back."""
    components = _running_components(workdir)
    if name not in components:
        raise ClusterError(f"{name} is not running in {cluster_dir(workdir)}")
    pid = procs.read_pid(cluster_dir(workdir) / "pids" / f"{name}.pid")
    assert pid is not None
    port = next(
        (int(a.split("=", 1)[1]) for a in components[name][0] if a.startswith("--secure-port=")),
        None,
    )
    stopped = time.monotonic()
    procs.stop_pid(pid)
    with _held_port(port):
        if resume is None:
            time.sleep(down_s)
        else:
            resume.wait(down_s)
    _start_component(workdir, name, components[name])
    procs.wait_until(ready, 60, f"{name} ready again")
    unavailable = time.monotonic() - stopped

    def restart_the_fallen() -> None:
        deadline = time.monotonic() + watch_s
        # a cluster deleted meanwhile (its test is over) is not brought back
        while time.monotonic() < deadline and (cluster_dir(workdir) / "pids").is_dir():
            try:
                alive = _running_components(workdir)
                for other, how in components.items():
                    if other not in alive:
                        _start_component(workdir, other, how)
            except OSError:  # deleted between the check and the start
                return
            time.sleep(1.0)

    threading.Thread(target=restart_the_fallen, name="restart-watch", daemon=True).start()
    return unavailable


@contextlib.contextmanager
def kwok_managing(workdir: Path, annotation_selector: str) -> Iterator[None]:
    """The kwok controller restarted to manage only the nodes whose annotations match
    `annotation_selector` (kwokctl starts it with `--manage-all-nodes=true`), and restarted
    as it was on exit. A node whose annotation is changed meanwhile is left alone by KWOK:
    no heartbeat, no stage rewriting its Ready condition, like a machine whose kubelet died.
    Every inventory node carries `kwok.x-k8s.io/node: fake`."""
    name = "kwok-controller"
    components = _running_components(workdir)
    if name not in components:
        raise ClusterError(f"{name} is not running in {cluster_dir(workdir)}")
    argv, cwd, env = components[name]
    selective = [a for a in argv if not a.startswith("--manage-all-nodes")]
    selective.insert(1, f"--manage-nodes-with-annotation-selector={annotation_selector}")

    def restart(how: tuple[list[str], str, dict[str, str]]) -> None:
        pid = procs.read_pid(cluster_dir(workdir) / "pids" / f"{name}.pid")
        if pid is not None:
            procs.stop_pid(pid)
        # A kwok controller manages a node only while it holds the node's Lease, which the
        # stopped one held for --node-lease-duration-seconds (200 s): the new one creates
        # them afresh.
        kubectl.kubectl(
            cluster_dir(workdir) / "kubeconfig.yaml",
            ["delete", "lease", "-n", "kube-node-lease", "--all", "--wait=false"],
        )
        _start_component(workdir, name, how)

    restart((selective, cwd, env))
    try:
        yield
    finally:
        restart((argv, cwd, env))
