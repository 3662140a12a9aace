"""What the operator e2e tests share: manifests, a stand-in vLLM endpoint, the runner args.

The stand-in serves vLLM's metric names with prometheus-client and is scraped by the
session's Prometheus through a file_sd target carrying the labels the chart's scrape
configuration adds (namespace, model_deployment, region, pod).
"""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml
from e2e_helpers import kubectl
from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server

REPO = Path(__file__).resolve().parents[2]
A100 = "NVIDIA-A100-SXM4-80GB"
H100 = "NVIDIA-H100-80GB-HBM3"
MODEL = "llama8b"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class FakeVllm:
    """vLLM's metrics for the pods of one pod set, on free loopback ports.

    Token counters are one target (`fake-0`, the endpoint's traffic); the KV-cache gauge is
    one target per pod of MODEL in the region that the API server lists, labelled with the
    pod's name as the chart's pod scrape labels it, so the operator reads every pod's usage
    (`PrometheusReader.pod_loads`). A thread keeps the per-pod targets in step with the pods
    while the target file exists; a test that deletes it makes every pod silent. A pod named
    in `silent` loses its target (Prometheus stops scraping it, as when its target vanishes
    from service discovery); `set_pod` gives one pod a KV usage of its own (its own target).
    """

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.prompt = Counter("vllm:prompt_tokens", "prompt tokens", ["model_name"], registry=r)
        self.generation = Counter(
            "vllm:generation_tokens", "output tokens", ["model_name"], registry=r
        )
        self.port = free_port()
        self.server, self.thread = start_http_server(self.port, addr="127.0.0.1", registry=r)
        self.kv_registry = CollectorRegistry()
        self.kv = Gauge(
            "vllm:kv_cache_usage_perc", "KV usage", ["model_name"], registry=self.kv_registry
        )
        self.kv_port = free_port()
        self.kv_server, _ = start_http_server(
            self.kv_port, addr="127.0.0.1", registry=self.kv_registry
        )
        self.stopped = threading.Event()
        #: pods whose KV target is left out of the targets file
        self.silent: set[str] = set()
        #: pods with a KV usage of their own: (gauge, port, server)
        self.own: dict[str, tuple[Gauge, int, Any]] = {}
        self.set(0.5)

    def set_pod(self, pod: str, usage: float) -> None:
        """One pod's KV usage (the others keep the shared one), served on a port of its own."""
        if pod not in self.own:
            registry = CollectorRegistry()
            gauge = Gauge("vllm:kv_cache_usage_perc", "KV usage", ["model_name"], registry=registry)
            port = free_port()
            server, _ = start_http_server(port, addr="127.0.0.1", registry=registry)
            self.own[pod] = (gauge, port, server)
        self.own[pod][0].labels(MODEL).set(usage)

    def set(self, usage: float) -> None:
        self.kv.labels(MODEL).set(usage)
        self.prompt.labels(MODEL).inc(1000)
        self.generation.labels(MODEL).inc(100)

    def scrape(self, targets_dir: Path, namespace: str, region: str, kubeconfig: Path) -> Path:
        """Register the endpoint's traffic and every pod's KV usage with Prometheus."""
        labels = {"namespace": namespace, "model_deployment": MODEL, "region": region}
        path = targets_dir / f"{namespace}.json"

        def targets(pods: list[str]) -> str:
            return json.dumps(
                [{"targets": [f"127.0.0.1:{self.port}"], "labels": {**labels, "pod": "fake-0"}}]
                + [
                    {
                        "targets": [
                            f"127.0.0.1:{self.own[p][1] if p in self.own else self.kv_port}"
                        ],
                        "labels": {**labels, "pod": p},
                    }
                    for p in pods
                    if p not in self.silent
                ]
            )

        def follow() -> None:
            written = None
            while not self.stopped.wait(1.0) and path.exists():
                text = targets(pod_names(kubeconfig, namespace, region))
                if text != written and path.exists():
                    path.write_text(text)
                    written = text

        path.write_text(targets(pod_names(kubeconfig, namespace, region)))
        threading.Thread(target=follow, daemon=True).start()
        return path

    def close(self) -> None:
        self.stopped.set()
        self.server.shutdown()
        self.kv_server.shutdown()
        for _, _, server in self.own.values():
            server.shutdown()


def pod_names(kubeconfig: Path, namespace: str, region: str) -> list[str]:
    """Names of the running, not terminating pods of MODEL in `region`."""
    selector = f"sageserve.io/model-deployment={MODEL},sageserve.io/region={region}"
    out = kubectl(
        kubeconfig, ["get", "pods", "-n", namespace, "-l", selector, "-o", "json"], check=False
    )
    if out.returncode != 0:
        return []
    return sorted(
        p["metadata"]["name"]
        for p in json.loads(out.stdout)["items"]
        if not p["metadata"].get("deletionTimestamp")
    )


def scaling_policy(strategy: str, **spec: Any) -> dict[str, Any]:
    """ScalingPolicy `fleet`, pacing every 2 s with a 2 s cooldown unless `spec` says more."""
    body: dict[str, Any] = {
        "strategy": strategy,
        "intervals": {"paceSeconds": 2, "cooldownSeconds": 2},
    }
    body.update(spec)
    return {
        "apiVersion": "sageserve.io/v1alpha1",
        "kind": "ScalingPolicy",
        "metadata": {"name": "fleet"},
        "spec": body,
    }


def model_deployment(
    regions: list[str],
    gpu_type: str = A100,
    gpus: int = 4,
    theta: float = 900,
    lo: int = 1,
    hi: int = 2,
    name: str = MODEL,
    policy: str = "fleet",
) -> dict[str, Any]:
    """A Llama-3.1-8B ModelDeployment with one variant (`a100` or `h100`) in `regions`."""
    variant = "a100" if gpu_type == A100 else "h100"
    return {
        "apiVersion": "sageserve.io/v1alpha1",
        "kind": "ModelDeployment",
        "metadata": {"name": name},
        "spec": {
            "model": {"name": "meta-llama/Llama-3.1-8B-Instruct"},
            "variants": [
                {
                    "name": variant,
                    "gpuType": gpu_type,
                    "gpusPerInstance": gpus,
                    "capacityTokensPerSecond": theta,
                }
            ],
            "regions": [{"name": r, "minInstances": lo, "maxInstances": hi} for r in regions],
            "tiers": ["iw-f", "iw-n", "niw"],
            "policyRef": {"name": policy},
        },
    }


def apply(kubeconfig: Path, namespace: str, *docs: dict[str, Any]) -> None:
    for doc in docs:
        kubectl(kubeconfig, ["apply", "-n", namespace, "-f", "-"], stdin=yaml.safe_dump(doc))


def tier_keys(
    kubeconfig: Path, namespace: str, secret: str, keys: dict[str, str], *tiers: str
) -> None:
    """API keys (`keys`: the Secret's data key -> the key) in the Secret `secret`, listed
    by each of `tiers` (`spec.match.apiKeysSecretRef`)."""
    doc = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": secret}, "stringData": keys}
    apply(kubeconfig, namespace, doc)
    patch = json.dumps({"spec": {"match": {"apiKeysSecretRef": {"name": secret}}}})
    for tier in tiers:
        kubectl(
            kubeconfig,
            ["patch", "workloadtier", tier, "-n", namespace, "--type=merge", "-p", patch],
        )


def prepare_namespace(kubeconfig: Path, name: str) -> None:
    """CRDs installed (taken over from helm if it installed them), a namespace with tiers."""
    for path in sorted((REPO / "crds").glob("*.yaml")):
        kubectl(kubeconfig, ["apply", "--server-side", "--force-conflicts", "-f", str(path)])
    kubectl(kubeconfig, ["wait", "--for=condition=Established", "crd", "--all", "--timeout=60s"])
    kubectl(kubeconfig, ["create", "namespace", name])
    kubectl(kubeconfig, ["apply", "-n", name, "-f", str(REPO / "policies/base/tiers.yaml")])


def operator_args(namespace: str) -> list[str]:
    """kopf's command line for the sageserve handlers, watching one namespace."""
    return ["run", "--standalone", "--namespace", namespace, "-m", "sageserve.controller.handlers"]


class CommandProcess:
    """A `sageserve` command as its own process: its output collected line by line, and the
    word after `marker` in it (the address it serves on) waited for."""

    def __init__(
        self,
        args: list[str],
        marker: str,
        what: str,
        timeout: float,
        env: dict[str, str] | None = None,
    ) -> None:
        import subprocess
        import sys
        import time

        self.lines: list[str] = []
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "sageserve.cli", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
            cwd=REPO,
        )

        def read() -> None:
            assert self.proc.stdout is not None
            for line in self.proc.stdout:
                self.lines.append(line)

        threading.Thread(target=read, daemon=True).start()
        deadline = time.monotonic() + timeout
        self.address = ""
        while not self.address:
            found = [ln for ln in self.lines if marker in ln]
            if found:
                self.address = found[0].split(marker, 1)[1].split()[0]
            elif self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise AssertionError(f"the {what} did not start:\n" + "".join(self.lines))
            else:
                time.sleep(0.2)

    def output(self) -> str:
        return "".join(self.lines)

    def stop(self) -> None:
        import subprocess

        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class TwinProcess:
    """`sageserve twin` as its own process, scraped by the session's Prometheus.

    It watches `namespace`, serves every serving pod's vLLM metrics and registers them in
    the Prometheus targets directory (one file_sd target per pod, with the pod labels).
    `load(m)` changes the request rate at run time through its HTTP control.
    """

    def __init__(
        self,
        kubeconfig: Path,
        namespace: str,
        targets_dir: Path,
        *args: str,
        timeout: float = 180,
        name: str = "twin",
    ) -> None:
        self.targets_file = targets_dir / f"{name}-{namespace}.json"
        args_ = ["twin", "--namespace", namespace, "--kubeconfig", str(kubeconfig)]
        self.command = CommandProcess(
            [*args_, "--targets-file", str(self.targets_file), *args],
            "twin: serving on ",
            "twin",
            timeout,
        )
        self.proc, self.lines, self.url = (
            self.command.proc,
            self.command.lines,
            self.command.address,
        )

    def status(self) -> dict[str, Any]:
        import urllib.request

        with urllib.request.urlopen(f"{self.url}/status", timeout=10) as resp:
            out: dict[str, Any] = json.loads(resp.read())
            return out

    def load(self, multiplier: float, endpoint: str = "*") -> dict[str, Any]:
        """Set the request-rate multiplier (on top of --scale) of matching endpoints."""
        import urllib.request

        body = json.dumps({"multiplier": multiplier, "endpoint": endpoint}).encode()
        req = urllib.request.Request(f"{self.url}/load", data=body, method="POST")
        with urllib.request.urlopen(req, timeout=10) as resp:
            out: dict[str, Any] = json.loads(resp.read())
            return out

    def output(self) -> str:
        return self.command.output()

    def close(self) -> None:
        self.command.stop()
        self.targets_file.unlink(missing_ok=True)


class SteadyLoad:
    """Token counters of a FakeVllm advanced 4 times a second, e.g. 550 + 50 = 2,400 tokens/s."""

    def __init__(self, fake: FakeVllm, prompt: int = 550, generation: int = 50) -> None:
        import threading

        self._stop = threading.Event()

        def feed() -> None:
            while not self._stop.wait(0.25):
                fake.prompt.labels(MODEL).inc(prompt)
                fake.generation.labels(MODEL).inc(generation)

        threading.Thread(target=feed, daemon=True).start()

    def stop(self) -> None:
        self._stop.set()


def wait_for_token_rate(prometheus_url: str, namespace: str, above: float) -> None:
    """Until the plan loop's own query reads more than `above` tokens/s (rate() needs a full
    window of samples before it reads the true rate)."""
    import time

    from e2e_helpers import eventually

    from sageserve.metrics import queries
    from sageserve.metrics.prometheus import PrometheusReader

    rate = queries.tokens_per_second("60s", namespace)

    def settled() -> bool:
        history = PrometheusReader(prometheus_url).history(rate, time.time(), 60, 30)
        return any(series[-1] > above for series in history.values())

    eventually(settled, 120, "a settled token rate in Prometheus", interval=2)


@contextmanager
def steady_stand_in(
    targets_dir: Path, prometheus_url: str, namespace: str, region: str, kubeconfig: Path
) -> Iterator[FakeVllm]:
    """A stand-in vLLM at a steady 2,400 tokens/s, scraped as (namespace, region), entered
    once the plan loop's own query reads the settled rate; unscraped and closed on exit."""
    fake = FakeVllm()
    load = SteadyLoad(fake)
    target_file = fake.scrape(targets_dir, namespace, region, kubeconfig)
    try:
        wait_for_token_rate(prometheus_url, namespace, 2300)
        yield fake
    finally:
        load.stop()
        target_file.unlink(missing_ok=True)
        fake.close()


def policy_status(kubeconfig: Path, namespace: str) -> dict[str, Any]:
    """`status` of the ScalingPolicy `fleet` ({} before the operator wrote one)."""
    out = kubectl(kubeconfig, ["get", "scalingpolicy", "fleet", "-n", namespace, "-o", "json"])
    status: dict[str, Any] = json.loads(out.stdout).get("status", {})
    return status


def replicas(kubeconfig: Path, namespace: str, region: str) -> int | None:
    """spec.replicas of the llama8b A100 pod set in `region` (None until it exists)."""
    out = kubectl(
        kubeconfig,
        ["get", "deployment", "-n", namespace, f"{MODEL}-{region}-a100", "-o", "json"],
        check=False,
    )
    return json.loads(out.stdout)["spec"]["replicas"] if out.returncode == 0 else None


def spot_workload(region: str, gpu_type: str = A100) -> dict[str, Any]:
    """A batch job (Deployment `spot-batch`, 8 GPUs) that may only use the spot pool's nodes
    of `region` and `gpu_type`: what donation makes room for and reclaim evicts."""
    match = [
        {"key": "topology.kubernetes.io/region", "operator": "In", "values": [region]},
        {"key": "nvidia.com/gpu.product", "operator": "In", "values": [gpu_type]},
        {"key": "sageserve.io/pool", "operator": "In", "values": ["spot"]},
    ]
    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": match}]
            }
        }
    }
    container = {
        "name": "work",
        "image": "batch:latest",
        "resources": {"limits": {"nvidia.com/gpu": "8"}},
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "spot-batch"},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": "spot-batch"}},
            "template": {
                "metadata": {"labels": {"app": "spot-batch"}},
                "spec": {"affinity": affinity, "containers": [container]},
            },
        },
    }


def operator_env(
    monkeypatch: Any,
    kubeconfig: Path,
    namespace: str,
    prometheus_url: str,
    metrics_port: int | None = None,
) -> None:
    """The environment an in-process operator reads: cluster, Prometheus, namespace, and the
    metrics port when given (0 turns the endpoint off)."""
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    monkeypatch.setenv("SAGESERVE_PROMETHEUS_URL", prometheus_url)
    monkeypatch.setenv("SAGESERVE_NAMESPACES", namespace)
    if metrics_port is not None:
        monkeypatch.setenv("SAGESERVE_METRICS_PORT", str(metrics_port))


class RouterProcess:
    """`sageserve router` as its own process, forwarding to the twin's pods and scraped by
    the session's Prometheus (its file_sd target carries no pod labels: the router's own
    series name their endpoint)."""

    def __init__(
        self,
        kubeconfig: Path,
        namespace: str,
        twin_url: str,
        prometheus_url: str,
        targets_dir: Path,
        *args: str,
        timeout: float = 60,
        batch_db: str | None = None,
        name: str = "router",
    ) -> None:
        import os
        import tempfile

        if batch_db is None:  # a queue of its own, gone with the test
            self._queue_dir = tempfile.TemporaryDirectory(prefix="sageserve-router-")
            batch_db = f"sqlite:///{self._queue_dir.name}/batch.db"
        command = CommandProcess(
            [
                "router",
                "--batch-db",
                batch_db,
                "-n",
                namespace,
                "--host",
                "127.0.0.1",
                "--port",
                "0",
                "--backend-url",
                twin_url + "/pods/{namespace}/{pod}",
                "--prometheus-url",
                prometheus_url,
                "--load-refresh-seconds",
                "1",
                # namespaces that list no key stay open unless the test asks otherwise
                *([] if "--auth" in args else ["--auth", "per-namespace"]),
                *args,
            ],
            "router listening on ",
            "router",
            timeout,
            {**os.environ, "KUBECONFIG": str(kubeconfig)},
        )
        self.command, self.proc = command, command.proc
        self.url = "http://" + command.address
        self.targets_file = targets_dir / f"{name}-{namespace}.json"
        target = self.url.removeprefix("http://")
        self.targets_file.write_text(json.dumps([{"targets": [target], "labels": {}}]))

    def post(
        self,
        path: str,
        body: bytes | dict[str, Any],
        headers: dict[str, str] | None = None,
        timeout: float = 60,
    ) -> tuple[int, bytes]:
        import urllib.error
        import urllib.request

        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        req = urllib.request.Request(
            self.url + path,
            data=data,
            method="POST",
            headers={"Content-Type": "application/json", **(headers or {})},
        )
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                return resp.status, resp.read()
        except urllib.error.HTTPError as err:
            return err.code, err.read()

    def metric(self, name: str, **labels: str) -> float:
        """A sample of the router's own /metrics (0 when absent)."""
        import urllib.request

        from prometheus_client.parser import text_string_to_metric_families

        with urllib.request.urlopen(self.url + "/metrics", timeout=10) as resp:
            text = resp.read().decode()
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                    return float(s.value)
        return 0.0

    def close(self) -> None:
        self.command.stop()
        self.targets_file.unlink(missing_ok=True)

    def kill(self) -> None:
        """SIGKILL: no shutdown code runs, as when a node dies."""
        import signal

        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=30)
        self.targets_file.unlink(missing_ok=True)
