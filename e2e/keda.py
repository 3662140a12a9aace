"""A real KEDA (operator + metrics adapter, built by ``e2e/gobuild.py``) as processes on
this machine, serving ``external.metrics.k8s.io`` through the test cluster's API server.

Why processes and not pods: KWOK nodes run no containers. The two binaries are the ones
KEDA ships; only their wiring differs from a Helm install:

- the operator reads the cluster through the admin kubeconfig, watches every namespace
  (``WATCH_NAMESPACE=""``), and serves its gRPC metrics service on loopback with mutual
  TLS (``ca.crt``/``tls.crt``/``tls.key`` in one cert dir, rotation off);
- the adapter is an aggregated API server on this machine's non-loopback address; the
  APIService ``v1beta1.external.metrics.k8s.io`` points at a selector-less Service whose
  EndpointSlice names that address (the API server runs with
  ``--enable-aggregator-routing``, and endpoint validation rejects loopback addresses);
- the HPA controller in kube-controller-manager reaches the adapter through the API
  server's aggregation layer, exactly as in a real cluster.

Pid files, logs and certificates live under ``<state dir>/keda``; ``stop`` (and the
cluster's ``down``) ends exactly those processes.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import ipaddress
import json
import os
import socket
import struct
from dataclasses import asdict, dataclass
from pathlib import Path

import yaml

from e2e import kubectl, pki, procs, versions

NAMESPACE = "keda"
ADAPTER_SERVICE = "keda-metrics-apiserver"
OPERATOR_SERVICE = "keda-operator"
APISERVICE = "v1beta1.external.metrics.k8s.io"
ENDPOINT_SLICE = f"{ADAPTER_SERVICE}-host"
# Where a scaler running on this machine (an external gRPC scaler, a metrics-api HTTP
# endpoint) listens: the operator is a process on this machine, so loopback reaches it.
SCALER_HOST = "127.0.0.1"
HOST_IP_ENV = "SAGESERVE_E2E_HOST_IP"


class KedaError(RuntimeError):
    """KEDA could not be started; the message says what failed and where its log is."""


@dataclass
class KedaState:
    """What ``start`` started: enough for a test to write ScaledObjects and to debug."""

    namespace: str  # KEDA's own namespace (Service, EndpointSlice, leader/secret scope)
    host_ip: str  # this machine's non-loopback address the API server dials for the adapter
    scaler_host: str  # address a local scaler listens on to be reachable by the operator
    adapter_port: int  # the adapter's secure port on host_ip
    operator_grpc: str  # the operator's metrics service (mutual TLS), host:port
    operator_health: str  # base URL of the operator's /healthz and /readyz
    operator_pid: int
    adapter_pid: int
    operator_log: str
    adapter_log: str
    crd_dir: str

    @property
    def alive(self) -> bool:
        return procs.is_alive(self.operator_pid) and procs.is_alive(self.adapter_pid)


def root() -> Path:
    return versions.state_dir() / "keda"


def _state_file() -> Path:
    return root() / "state.json"


def load() -> KedaState | None:
    """The KEDA recorded under the current state dir, or None."""
    path = _state_file()
    if not path.is_file():
        return None
    return KedaState(**json.loads(path.read_text()))


def crd_dir(bin_dir: Path | None = None) -> Path:
    return (bin_dir or versions.bin_dir()) / versions.KEDA_CRD_DIR


def _usable(address: str) -> bool:
    ip = ipaddress.ip_address(address)
    return not (ip.is_loopback or ip.is_link_local or ip.is_unspecified or ip.is_multicast)


def _interface_addresses() -> list[str]:
    """IPv4 addresses of this machine's interfaces (Linux ioctl SIOCGIFADDR)."""
    found = []
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        for _, name in socket.if_nameindex():
            request = struct.pack("256s", name.encode()[:15])
            try:
                answer = fcntl.ioctl(sock.fileno(), 0x8915, request)  # SIOCGIFADDR
            except OSError:
                continue
            found.append(socket.inet_ntoa(answer[20:24]))
    return found


def host_ip() -> str:
    """This machine's IPv4 address that the API server can dial and an EndpointSlice may
    name (not loopback, not link-local). ``SAGESERVE_E2E_HOST_IP`` overrides."""
    override = os.environ.get(HOST_IP_ENV)
    if override:
        if not _usable(override):
            raise KedaError(
                f"{HOST_IP_ENV}={override} is loopback/link-local/unspecified, which an "
                "EndpointSlice rejects; set it to an address of one of this machine's interfaces"
            )
        return override
    candidates: list[str] = []
    with contextlib.suppress(OSError), socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.connect(("10.255.255.255", 1))  # no packet is sent: it only picks a route
        candidates.append(str(sock.getsockname()[0]))
    candidates += _interface_addresses()
    for address in candidates:
        if _usable(address):
            return address
    raise KedaError(
        f"no non-loopback IPv4 address on this machine (saw {candidates}); the API server "
        "reaches KEDA's metrics adapter through an EndpointSlice, which rejects loopback "
        f"addresses: give the machine one, or set {HOST_IP_ENV}"
    )


def _free_port(address: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((address, 0))
        port: int = sock.getsockname()[1]
        return port


def write_certs(certs: Path, address: str) -> pki.KeyPair:
    """KEDA's CA and the one certificate both processes use (as upstream's cert rotation
    makes it): server and client, naming the Services and the addresses dialled here."""
    ca = pki.make_ca(pki.KeyPair(certs / "ca.crt", certs / "ca.key"), "keda-ca")
    names = []
    for service in (OPERATOR_SERVICE, ADAPTER_SERVICE):
        names += [service, f"{service}.{NAMESPACE}", f"{service}.{NAMESPACE}.svc"]
        names.append(f"{service}.{NAMESPACE}.svc.cluster.local")
    pki.issue(
        ca,
        pki.KeyPair(certs / "tls.crt", certs / "tls.key"),
        OPERATOR_SERVICE,
        dns_names=("localhost", *names),
        ips=(SCALER_HOST, address),
        server=True,
        client=True,
    )
    return ca


def apply_crds(kubeconfig: Path, bin_dir: Path | None = None) -> list[str]:
    """Apply KEDA's CRDs (server-side: ScaledObject's schema is too large for the
    last-applied annotation) and wait until they are Established."""
    directory = crd_dir(bin_dir)
    files = sorted(directory.glob("*.yaml"))
    if not files:
        raise KedaError(f"no KEDA CRDs in {directory}; run `python -m e2e.cluster build`")
    kubectl.kubectl(
        kubeconfig,
        ["apply", "--server-side", "--force-conflicts", "--field-manager=sageserve-e2e"]
        + [arg for f in files for arg in ("-f", str(f))],
    )
    names = [yaml.safe_load(f.read_text())["metadata"]["name"] for f in files]
    kubectl.kubectl(
        kubeconfig,
        ["wait", "--for=condition=Established", "--timeout=60s"] + [f"crd/{n}" for n in names],
        timeout=90,
    )
    return names


def registration(address: str, port: int, ca_pem: bytes) -> list[dict[str, object]]:
    """Namespace, Service, EndpointSlice and APIService that route
    ``external.metrics.k8s.io`` to the adapter at ``address:port``."""
    return [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}},
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": ADAPTER_SERVICE, "namespace": NAMESPACE},
            "spec": {"ports": [{"name": "https", "port": 443, "targetPort": port}]},
        },
        {
            "apiVersion": "discovery.k8s.io/v1",
            "kind": "EndpointSlice",
            "metadata": {
                "name": ENDPOINT_SLICE,
                "namespace": NAMESPACE,
                "labels": {
                    "kubernetes.io/service-name": ADAPTER_SERVICE,
                    "endpointslice.kubernetes.io/managed-by": "sageserve-e2e",
                },
            },
            "addressType": "IPv4",
            "ports": [{"name": "https", "port": port, "protocol": "TCP"}],
            "endpoints": [{"addresses": [address], "conditions": {"ready": True}}],
        },
        {
            "apiVersion": "apiregistration.k8s.io/v1",
            "kind": "APIService",
            "metadata": {"name": APISERVICE},
            "spec": {
                "group": "external.metrics.k8s.io",
                "version": "v1beta1",
                "service": {"name": ADAPTER_SERVICE, "namespace": NAMESPACE, "port": 443},
                "caBundle": base64.b64encode(ca_pem).decode(),
                "groupPriorityMinimum": 100,
                "versionPriority": 100,
            },
        },
    ]


def apiservice_available(kubeconfig: Path) -> bool:
    """True when the API server reports the APIService Available (it reached the adapter)."""
    try:
        out = kubectl.kubectl(kubeconfig, ["get", "apiservice", APISERVICE, "-o", "json"])
    except (kubectl.KubectlError, OSError):
        return False
    conditions = (json.loads(out).get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Available" and c.get("status") == "True" for c in conditions)


def _env(kubeconfig: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        KUBECONFIG=str(kubeconfig),
        WATCH_NAMESPACE="",  # all namespaces
        POD_NAMESPACE=NAMESPACE,
        KEDA_CLUSTER_OBJECT_NAMESPACE=NAMESPACE,
    )
    return env


def _log_tail(path: str | Path, chars: int = 3000) -> str:
    p = Path(path)
    return p.read_text(errors="replace")[-chars:] if p.exists() else "(no log)"


def is_healthy(state: KedaState, kubeconfig: Path) -> bool:
    return (
        state.alive
        and procs.http_ok(f"{state.operator_health}/readyz")
        and apiservice_available(kubeconfig)
    )


def start(kubeconfig: Path, bin_dir: Path | None = None, timeout: float = 90.0) -> KedaState:
    """Start KEDA against the cluster of ``kubeconfig`` (reusing a healthy one already
    started under this state dir); return once the operator is ready and the API server
    reports ``external.metrics.k8s.io`` Available."""
    bdir = bin_dir or versions.bin_dir()
    missing = [b for b in versions.KEDA_BINARIES if not os.access(bdir / b, os.X_OK)]
    if missing:
        raise KedaError(
            f"{', '.join(missing)} missing in {bdir}; run `python -m e2e.cluster build --only keda`"
        )
    current = load()
    if current is not None:
        if is_healthy(current, kubeconfig):
            return current
        stop(kubeconfig)
    home = root()
    home.mkdir(parents=True, exist_ok=True)
    certs = home / "certs"
    address = host_ip()
    ca = write_certs(certs, address)
    (home / "scaler-ca").mkdir(exist_ok=True)
    apply_crds(kubeconfig, bdir)
    adapter_port = _free_port(address)
    grpc_port = procs.free_port()
    state = KedaState(
        namespace=NAMESPACE,
        host_ip=address,
        scaler_host=SCALER_HOST,
        adapter_port=adapter_port,
        operator_grpc=f"127.0.0.1:{grpc_port}",
        operator_health=f"http://127.0.0.1:{procs.free_port()}",
        operator_pid=0,
        adapter_pid=0,
        operator_log=str(home / "keda-operator.log"),
        adapter_log=str(home / "keda-adapter.log"),
        crd_dir=str(crd_dir(bdir)),
    )
    kubectl.kubectl(
        kubeconfig,
        ["apply", "-f", "-"],
        stdin=yaml.safe_dump_all(registration(address, adapter_port, ca.cert.read_bytes())),
    )
    env = _env(kubeconfig)
    logging = ["--zap-log-level=info", "--zap-encoder=console", "--zap-time-encoding=rfc3339"]
    state.operator_pid = procs.start_daemon(
        [
            str(bdir / "keda-operator"),
            "--leader-elect=false",
            f"--metrics-bind-address=127.0.0.1:{procs.free_port()}",
            f"--health-probe-bind-address={state.operator_health.removeprefix('http://')}",
            f"--metrics-service-bind-address={state.operator_grpc}",
            f"--cert-dir={certs}",
            "--enable-cert-rotation=false",
            f"--ca-dir={home / 'scaler-ca'}",
            *logging,
        ],
        log=Path(state.operator_log),
        pid_file=home / "keda-operator.pid",
        env=env,
    )
    _save(state)  # now, so that `stop` finds the pid if what follows fails
    state.adapter_pid = procs.start_daemon(
        [
            str(bdir / "keda-adapter"),
            f"--bind-address={address}",
            f"--secure-port={adapter_port}",
            f"--tls-cert-file={certs / 'tls.crt'}",
            f"--tls-private-key-file={certs / 'tls.key'}",
            f"--cert-dir={certs}",
            f"--lister-kubeconfig={kubeconfig}",
            f"--authentication-kubeconfig={kubeconfig}",
            f"--authorization-kubeconfig={kubeconfig}",
            f"--metrics-service-address={state.operator_grpc}",
            f"--port={procs.free_port()}",
            *logging,
        ],
        log=Path(state.adapter_log),
        pid_file=home / "keda-adapter.pid",
        env=env,
    )
    _save(state)
    try:
        procs.wait_until(
            lambda: _alive_or_raise(state) and procs.http_ok(f"{state.operator_health}/readyz"),
            timeout,
            "the KEDA operator's /readyz",
        )
        procs.wait_until(
            lambda: _alive_or_raise(state) and apiservice_available(kubeconfig),
            timeout,
            f"APIService {APISERVICE} Available (the API server reaching the adapter)",
            interval=0.5,
        )
    except (TimeoutError, KedaError) as err:
        report = (
            f"{err}\n--- {state.operator_log} ---\n{_log_tail(state.operator_log)}"
            f"\n--- {state.adapter_log} ---\n{_log_tail(state.adapter_log)}"
        )
        stop(kubeconfig)
        raise KedaError(report) from err
    return state


def _alive_or_raise(state: KedaState) -> bool:
    for name, pid in (("keda-operator", state.operator_pid), ("keda-adapter", state.adapter_pid)):
        if not procs.is_alive(pid):
            raise KedaError(f"{name} (pid {pid}) exited")
    return True


def _save(state: KedaState) -> None:
    path = _state_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(asdict(state), indent=2) + "\n")


def stop(kubeconfig: Path | None = None) -> None:
    """Stop the KEDA processes of this state dir. With ``kubeconfig``, first unregister the
    APIService: an APIService whose server is gone makes discovery fail for every client
    (and blocks namespace deletion)."""
    if kubeconfig is not None:
        with contextlib.suppress(kubectl.KubectlError, OSError):
            kubectl.kubectl(
                kubeconfig,
                ["delete", "apiservice", APISERVICE, "--ignore-not-found", "--wait=false"],
                timeout=20,
            )
    home = root()
    for name in ("keda-adapter", "keda-operator"):
        pid = procs.read_pid(home / f"{name}.pid")
        if pid is not None:
            procs.stop_pid(pid)
        (home / f"{name}.pid").unlink(missing_ok=True)
    _state_file().unlink(missing_ok=True)


def status(kubeconfig: Path) -> dict[str, str]:
    """One line per part, for ``python -m e2e.cluster status``; empty when KEDA was not
    started."""
    state = load()
    if state is None:
        return {}
    ready = procs.http_ok(f"{state.operator_health}/readyz")
    return {
        "keda-operator": "ready" if state.alive and ready else "NOT ready",
        "keda-adapter": (
            f"serving {APISERVICE} at {state.host_ip}:{state.adapter_port}"
            if state.alive and apiservice_available(kubeconfig)
            else "NOT available"
        ),
    }
