"""The operator bench: the real operator process against a fleet-sized KWOK cluster.

A test harness, so it lives beside the cluster tooling and not in the installed package:
`python -m e2e.bench_operator` runs it (on a private cluster it starts, or with `--running`
on the one `python -m e2e.cluster env` describes).

The goals of the operator at fleet size, measured end to end against a running cluster
(a real kube-apiserver with KWOK GPU nodes) and a real Prometheus:

1. first reconcile: from applying every ModelDeployment until every pod set exists;
2. one plan + reconcile round: the policy switches to LT-I, the operator forecasts every
   (model, region) from Prometheus history, solves the ILP and patches the replicas; the
   operator's own `sageserve_round_seconds{kind="plan"}` times it, and the bench checks
   from outside that every endpoint reached its target;
3. CR change → Deployment patched: `spec.engine.image` edits, one at a time, each timed
   until a watch sees every pod set of that ModelDeployment carry the new image;
4. the operator's peak RSS (VmHWM of its process).

The cluster is given, never started here: `KUBECONFIG`, `SAGESERVE_PROMETHEUS_URL` and
`SAGESERVE_PROMETHEUS_TARGETS_DIR` (what `python -m e2e.cluster env` prints; `python -m
e2e.bench_operator --running`), or the private cluster `python -m e2e.bench_operator`
starts with the bench's inventory. The bench adds the KWOK GPU nodes it needs, installs the CRDs
(generated from `sageserve.api`) and the paper's three tiers into a fresh namespace.

Token load comes from a stand-in vLLM endpoint in this process that Prometheus scrapes
(one file_sd target, series labelled like the chart's scrape configuration labels them),
so the forecasts have history. The operator is started as `python -m sageserve.cli
operator`, the same entry point as `sageserve operator`. Figures are printed, never
asserted.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import yaml
from rich.console import Console
from rich.table import Table

from sageserve.core.percentile import percentile

REGIONS = ("us-east", "us-central", "us-west")
GPU_TYPES = {"a100": "NVIDIA-A100-SXM4-80GB", "h100": "NVIDIA-H100-80GB-HBM3"}
#: (GPUs per instance, capacity tokens/s at SLO) of each variant of a bench model.
VARIANT_SHAPES = {"a100": (4, 900.0), "h100": (2, 1200.0)}
IMAGE = "vllm/vllm-openai"
POLICY = "fleet"
GPUS_PER_NODE = 8
#: Every fourth node of a (region, GPU type) starts in the spot pool.
SPOT_EVERY = 4
MIN_INSTANCES, MAX_INSTANCES = 1, 6

#: At most this long for every pod to be Ready before the plan round is measured anyway.
READY_WAIT_S = 300.0
GOALS = {"plan_round_s": 10.0, "change_p99_s": 2.0, "rss_peak_mb": 300.0}


class BenchError(RuntimeError):
    """The benchmark could not run (missing binaries, cluster down, operator died)."""


@dataclass
class BenchConfig:
    """Sizes and switches of one run."""

    models: int = 200
    regions: int = 3
    nodes: int = 2000
    variants: int = 2
    changes: int = 100
    timeout_s: float = 900.0


@dataclass(frozen=True)
class ClusterTarget:
    """A running cluster: what `python -m e2e.cluster env` exports.

    `targets_dir` is a directory of Prometheus file_sd files (`*.json`) that the Prometheus
    at `prometheus_url` reads; the bench registers its stand-in endpoint there.
    """

    kubeconfig: str
    prometheus_url: str
    targets_dir: Path

    @classmethod
    def from_env(
        cls,
        kubeconfig: str | None = None,
        prometheus_url: str | None = None,
        targets_dir: Path | None = None,
    ) -> ClusterTarget:
        """Options first, then the environment; BenchError naming what is missing."""
        kube = kubeconfig or os.environ.get("KUBECONFIG", "")
        url = prometheus_url or os.environ.get("SAGESERVE_PROMETHEUS_URL", "")
        targets = targets_dir or Path(os.environ.get("SAGESERVE_PROMETHEUS_TARGETS_DIR", ""))
        missing = [
            name
            for name, value in (
                ("KUBECONFIG / --kubeconfig", kube),
                ("SAGESERVE_PROMETHEUS_URL / --prometheus-url", url),
                ("SAGESERVE_PROMETHEUS_TARGETS_DIR / --targets-dir", str(targets or "")),
            )
            if not value or value == "."
        ]
        if missing:
            raise BenchError(
                "no cluster given (" + ", ".join(missing) + "): start one with "
                '`python -m e2e.cluster up && eval "$(python -m e2e.cluster env)"`, or run '
                "`python -m e2e.bench_operator` without --running, which starts a private one"
            )
        return cls(kube, url, targets)


@dataclass
class BenchResult:
    """What one run measured (seconds unless named otherwise)."""

    models: int
    regions: int
    variants: int
    nodes: int
    pod_sets: int
    cluster_up_s: float = 0.0
    first_reconcile_s: float = 0.0
    pods_ready_s: float | None = None
    plan_round_s: float | None = None
    plan_solver_s: float | None = None
    plan_status: str = ""
    plan_applied_s: float | None = None
    endpoints_at_target: int = 0
    endpoints: int = 0
    changes: int = 0
    changes_seen: int = 0
    change_p50_s: float | None = None
    change_p99_s: float | None = None
    change_max_s: float | None = None
    rss_peak_mb: float = 0.0
    rss_end_mb: float = 0.0
    resync_s: list[float] = field(default_factory=list)
    pace_s: list[float] = field(default_factory=list)
    machine: str = ""


# --- inventory and manifests (pure) ----------------------------------------------------


def inventory_nodes(count: int) -> list[dict[str, Any]]:
    """`count` KWOK GPU Nodes, round-robin over 3 regions × 2 GPU types, 1 in 4 spot.

    The same Node form as `e2e/inventory/*.yaml`, so the simulator can read the file too.
    """
    resources = {
        "cpu": "96",
        "memory": "1000Gi",
        "pods": "110",
        "ephemeral-storage": "2Ti",
        "nvidia.com/gpu": str(GPUS_PER_NODE),
    }
    pairs = [(r, short, gpu) for r in REGIONS for short, gpu in GPU_TYPES.items()]
    out = []
    for i in range(count):
        region, short, gpu = pairs[i % len(pairs)]
        k = i // len(pairs)
        pool = "spot" if k % SPOT_EVERY == SPOT_EVERY - 1 else "serving"
        name = f"gpu-{region}-{short}-{pool}-{k}"
        labels = {
            "kubernetes.io/arch": "amd64",
            "kubernetes.io/os": "linux",
            "kubernetes.io/hostname": name,
            "type": "kwok",
            "topology.kubernetes.io/region": region,
            "topology.kubernetes.io/zone": f"{region}-1",
            "nvidia.com/gpu.present": "true",
            "nvidia.com/gpu.product": gpu,
            "nvidia.com/gpu.count": str(GPUS_PER_NODE),
            "sageserve.io/pool": pool,
        }
        out.append(
            {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {
                    "name": name,
                    "annotations": {
                        "kwok.x-k8s.io/node": "fake",
                        "node.alpha.kubernetes.io/ttl": "0",
                    },
                    "labels": labels,
                },
                "status": {
                    "allocatable": dict(resources),
                    "capacity": dict(resources),
                    "phase": "Running",
                },
            }
        )
    return out


def write_inventory(nodes: list[dict[str, Any]], path: Path) -> Path:
    """Write Nodes as a multi-document YAML inventory (what `e2e.lifecycle.up` reads)."""
    dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
    header = f"# {len(nodes)} KWOK GPU nodes generated by `python -m e2e.bench_operator`.\n"
    path.write_text(header + yaml.dump_all(nodes, Dumper=dumper, sort_keys=False))
    return path


def bench_policy(strategy: str) -> dict[str, Any]:
    """The one ScalingPolicy: planning every minute (the CRD's floor), pacing every 2 s.

    Spot donation is off: idle nodes of a 2,000-node inventory would be relabelled by the
    hundred on the first pass, which measures the API server, not the operator's rounds.
    """
    return {
        "apiVersion": "sageserve.io/v1alpha1",
        "kind": "ScalingPolicy",
        "metadata": {"name": POLICY},
        "spec": {
            "strategy": strategy,
            "intervals": {"planSeconds": 60, "paceSeconds": 2, "cooldownSeconds": 2},
            "forecastGap": {"windowSeconds": 20},
            "spot": {"enabled": False},
        },
    }


def model_name(i: int) -> str:
    return f"m{i:03d}"


def bench_model(i: int, regions: int, variants: int) -> dict[str, Any]:
    """ModelDeployment `m<i>`: `variants` GPU types (A100 first), `regions` regions."""
    shorts = list(GPU_TYPES)[:variants] if i % 2 == 0 else list(GPU_TYPES)[::-1][:variants]
    return {
        "apiVersion": "sageserve.io/v1alpha1",
        "kind": "ModelDeployment",
        "metadata": {"name": model_name(i)},
        "spec": {
            "model": {"name": f"bench/model-{i:03d}"},
            "engine": {"image": f"{IMAGE}:v0"},
            "variants": [
                {
                    "name": short,
                    "gpuType": GPU_TYPES[short],
                    "gpusPerInstance": VARIANT_SHAPES[short][0],
                    "capacityTokensPerSecond": VARIANT_SHAPES[short][1],
                }
                for short in shorts
            ],
            "regions": [
                {"name": r, "minInstances": MIN_INSTANCES, "maxInstances": MAX_INSTANCES}
                for r in REGIONS[:regions]
            ],
            "tiers": ["iw-f", "iw-n", "niw"],
            "policyRef": {"name": POLICY},
        },
    }


def offered_tps(i: int, region_index: int) -> float:
    """Tokens/s the stand-in endpoint reports for (model i, region): 0.5–3.5 A100 instances."""
    return VARIANT_SHAPES["a100"][1] * (0.5 + (i + region_index) % 4)


# --- the stand-in vLLM endpoint ----------------------------------------------------------


class FleetMetrics:
    """vLLM's metric names for every (model, region) of the bench, on one loopback port.

    The series carry `namespace`, `model_deployment`, `region` and `pod` themselves (the
    target has no such labels, so Prometheus keeps them): one scrape target for the fleet.
    Token counters are one series per endpoint (the forecast sums them per endpoint); KV
    usage is one series per serving pod of the namespace, by its real name, because the
    operator reads it per pod and holds any scale-in of an endpoint whose pods do not all
    report (`follow_pods` keeps the list).
    """

    def __init__(self, namespace: str, models: int, regions: int) -> None:
        self.namespace = namespace
        self.endpoints = [
            (model_name(i), REGIONS[j], offered_tps(i, j))
            for i in range(models)
            for j in range(regions)
        ]
        self.started = time.time()
        #: (pod, model deployment, region, variant) of every Ready, non-terminating pod.
        self.pods: list[tuple[str, str, str, str]] = []
        self.stopped = threading.Event()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = outer.exposition().encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *_: Any) -> None:
                return

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = int(self.server.server_address[1])
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def exposition(self) -> str:
        elapsed = time.time() - self.started
        lines = {
            "vllm:kv_cache_usage_perc": ["# TYPE vllm:kv_cache_usage_perc gauge"],
            "vllm:prompt_tokens_total": ["# TYPE vllm:prompt_tokens_total counter"],
            "vllm:generation_tokens_total": ["# TYPE vllm:generation_tokens_total counter"],
        }
        for pod, model, region, variant in self.pods:
            labels = (
                f'namespace="{self.namespace}",model_deployment="{model}",'
                f'region="{region}",variant="{variant}",pod="{pod}",model_name="{model}"'
            )
            lines["vllm:kv_cache_usage_perc"].append(f"vllm:kv_cache_usage_perc{{{labels}}} 0.5")
        for model, region, tps in self.endpoints:
            labels = (
                f'namespace="{self.namespace}",model_deployment="{model}",'
                f'region="{region}",pod="{model}-{region}-0",model_name="{model}"'
            )
            prompt, output = 0.8 * tps * elapsed, 0.2 * tps * elapsed
            lines["vllm:prompt_tokens_total"].append(
                f"vllm:prompt_tokens_total{{{labels}}} {prompt}"
            )
            lines["vllm:generation_tokens_total"].append(
                f"vllm:generation_tokens_total{{{labels}}} {output}"
            )
        return "\n".join(line for group in lines.values() for line in group) + "\n"

    def register(self, targets_dir: Path) -> Path:
        """A file_sd target file for the session's Prometheus (job sageserve-e2e)."""
        targets_dir.mkdir(parents=True, exist_ok=True)
        path = targets_dir / f"bench-{self.namespace}.json"
        path.write_text(json.dumps([{"targets": [f"127.0.0.1:{self.port}"], "labels": {}}]))
        return path

    def follow_pods(self, api: Any, period: float = 5.0) -> None:
        """List the namespace's serving pods every `period` seconds, in a daemon thread."""
        from kubernetes import client

        core = client.CoreV1Api(api)

        def loop() -> None:
            while True:
                with contextlib.suppress(Exception):  # the next round lists again
                    raw: Any = core.list_namespaced_pod(self.namespace, _preload_content=False)
                    self.pods = serving_pods(json.loads(raw.data).get("items", []))
                if self.stopped.wait(period):
                    return

        threading.Thread(target=loop, name="bench-pods", daemon=True).start()

    def close(self) -> None:
        self.stopped.set()
        self.server.shutdown()


def serving_pods(items: list[dict[str, Any]]) -> list[tuple[str, str, str, str]]:
    """(pod, model deployment, region, variant) of the Ready pod-set pods not terminating."""
    from sageserve.core.labels import LABEL_DEPLOYMENT, LABEL_REGION, LABEL_VARIANT

    out = []
    for pod in items:
        meta = pod.get("metadata") or {}
        labels = meta.get("labels") or {}
        conditions = (pod.get("status") or {}).get("conditions") or []
        ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
        if ready and not meta.get("deletionTimestamp") and LABEL_DEPLOYMENT in labels:
            out.append(
                (
                    str(meta["name"]),
                    str(labels[LABEL_DEPLOYMENT]),
                    str(labels.get(LABEL_REGION, "")),
                    str(labels.get(LABEL_VARIANT, "")),
                )
            )
    return sorted(out)


# --- watching pod sets -----------------------------------------------------------------


class PodSetWatch(threading.Thread):
    """Every Deployment of the namespace as a watch sees it, with when each was first seen
    and when each image first appeared on it (the moment the watch event arrived)."""

    def __init__(self, api: Any, namespace: str) -> None:
        super().__init__(name="bench-watch", daemon=True)
        from kubernetes import client

        self.apps = client.AppsV1Api(api)
        self.namespace = namespace
        self.lock = threading.Condition()
        self.latest: dict[str, dict[str, Any]] = {}
        self.first_seen: dict[str, float] = {}
        self.image_seen: dict[tuple[str, str], float] = {}
        self.stopped = threading.Event()

    def _record(self, obj: dict[str, Any], now: float) -> None:
        name = obj["metadata"]["name"]
        containers = obj["spec"]["template"]["spec"]["containers"]
        with self.lock:
            self.latest[name] = obj
            self.first_seen.setdefault(name, now)
            self.image_seen.setdefault((name, containers[0]["image"]), now)
            self.lock.notify_all()

    def run(self) -> None:
        from kubernetes import watch

        while not self.stopped.is_set():
            try:
                raw: Any = self.apps.list_namespaced_deployment(
                    self.namespace, _preload_content=False
                )
                listed = json.loads(raw.data)
                now = time.monotonic()
                for obj in listed.get("items", []):
                    self._record(obj, now)
                w = watch.Watch()
                for event in w.stream(
                    self.apps.list_namespaced_deployment,
                    self.namespace,
                    resource_version=listed["metadata"]["resourceVersion"],
                    timeout_seconds=120,
                    deserialize=False,
                ):
                    if self.stopped.is_set():
                        w.stop()
                        break
                    now = time.monotonic()
                    obj = event["object"]
                    if event["type"] in ("ADDED", "MODIFIED"):
                        self._record(obj, now)
            except Exception:  # watch expired or the connection dropped: list again
                time.sleep(0.2)

    def wait_for(self, check: Callable[[], bool], timeout: float) -> bool:
        """Block until `check()` (called under the lock) holds, or the timeout passes."""
        with self.lock:
            return self.lock.wait_for(check, timeout)


# --- the run -----------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def machine() -> str:
    """CPU model, cores and memory of this machine (for the record)."""
    cpu = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
        mem_kb = int(Path("/proc/meminfo").read_text().split()[1])
    except (OSError, ValueError, IndexError):
        mem_kb = 0
    return f"{cpu}, {os.cpu_count()} cores, {mem_kb / 2**20:.0f} GiB"


def status_kb(pid: int, key: str) -> int:
    """A `VmHWM:`/`VmRSS:` line of /proc/<pid>/status, in kB (0 once the process is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def scrape(url: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Samples of a Prometheus text exposition, keyed by (name, labels)."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(url, timeout=5) as response:
        text = response.read().decode()
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = float(s.value)
    return out


def rounds(samples: dict[tuple[str, frozenset[tuple[str, str]]], float], kind: str) -> float:
    """(count) of `sageserve_round_seconds` observations of one kind, over every policy."""
    return sum(
        v
        for (name, labels), v in samples.items()
        if name == "sageserve_round_seconds_count" and ("kind", kind) in labels
    )


def round_sum(samples: dict[tuple[str, frozenset[tuple[str, str]]], float], kind: str) -> float:
    return sum(
        v
        for (name, labels), v in samples.items()
        if name == "sageserve_round_seconds_sum" and ("kind", kind) in labels
    )


class OperatorProcess:
    """`python -m sageserve.cli operator -n NS` with its metrics on a free port."""

    def __init__(self, namespace: str, kubeconfig: str, prometheus_url: str, log: Path) -> None:
        self.metrics_port = free_port()
        env = dict(os.environ)
        env.pop("SAGESERVE_LEASE_NAMESPACE", None)
        env.update(
            KUBECONFIG=kubeconfig,
            SAGESERVE_PROMETHEUS_URL=prometheus_url,
            SAGESERVE_METRICS_PORT=str(self.metrics_port),
        )
        self.log = log
        self._log_file = log.open("wb")
        argv = [sys.executable, "-m", "sageserve.cli", "operator", "-n", namespace]
        self.proc = subprocess.Popen(
            [*argv, "--log-level", "warning"],
            env=env,
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
        )
        self.peak_kb = 0

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}/metrics"

    def check(self) -> None:
        """Raise with the tail of the log if the operator exited; sample its RSS peak."""
        if self.proc.poll() is not None:
            tail = self.log.read_text(errors="replace")[-3000:]
            raise BenchError(f"the operator exited with {self.proc.returncode}:\n{tail}")
        self.peak_kb = max(self.peak_kb, status_kb(self.proc.pid, "VmHWM"))

    def metrics(self) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
        self.check()
        return scrape(self.metrics_url)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self._log_file.close()


def wait(check: Callable[[], Any], timeout: float, what: str, interval: float = 0.25) -> Any:
    """Poll `check` until it returns something truthy; BenchError naming `what` otherwise."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise BenchError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


def run_bench(
    config: BenchConfig, target: ClusterTarget, console: Console, cluster_up_s: float = 0.0
) -> BenchResult:
    """Run the whole benchmark on `target`; returns the figures (also when a goal is missed).

    `cluster_up_s` is recorded as is (the caller that started the cluster timed it).
    """
    from kubernetes import config as kube_config

    regions = max(1, min(config.regions, len(REGIONS)))
    variants = max(1, min(config.variants, len(GPU_TYPES)))
    result = BenchResult(
        config.models,
        regions,
        variants,
        config.nodes,
        config.models * regions * variants,
        cluster_up_s=cluster_up_s,
        machine=machine(),
    )
    result.endpoints = config.models * regions
    with ExitStack() as stack:
        workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="sageserve-bench-")))
        api = kube_config.new_client_from_config(config_file=target.kubeconfig)
        stack.callback(api.close)
        run = _Run(config, target, result, api, console)
        run.say(f"{config.nodes} KWOK GPU nodes (created where missing)")
        add_nodes(api, inventory_nodes(config.nodes), timeout=600)
        run.start(stack, workdir)
        run.first_reconcile()
        run.plan_round()
        run.spec_changes()
        run.finish()
    return result


class _Run:
    """One run's clients, stand-ins and figures; each phase of the bench is a method."""

    def __init__(
        self,
        config: BenchConfig,
        target: ClusterTarget,
        result: BenchResult,
        api: Any,
        console: Console,
    ) -> None:
        from kubernetes import client

        self.config, self.target, self.result, self.api = config, target, result, api
        self.console = console
        self.custom = client.CustomObjectsApi(api)
        self.namespace = f"bench-{uuid.uuid4().hex[:6]}"
        self.t_apply = 0.0

    def say(self, message: str) -> None:
        self.console.print(f"[dim]{time.strftime('%H:%M:%S')}[/dim] {message}")

    def start(self, stack: ExitStack, workdir: Path) -> None:
        """CRDs, namespace, tiers, policy, the stand-in endpoint, the operator, the watch."""
        from kubernetes import client

        prepare(self.api, self.namespace)
        stack.callback(delete_namespace, client.CoreV1Api(self.api), self.namespace)
        metrics = FleetMetrics(self.namespace, self.config.models, self.result.regions)
        stack.callback(metrics.close)
        metrics.follow_pods(self.api)
        target_file = metrics.register(self.target.targets_dir)
        stack.callback(target_file.unlink, missing_ok=True)
        self._create("scalingpolicies", bench_policy("reactive"))
        self.operator = OperatorProcess(
            self.namespace,
            self.target.kubeconfig,
            self.target.prometheus_url,
            workdir / "operator.log",
        )
        stack.callback(self.operator.stop)
        wait(lambda: _answers(self.operator), 60, "the operator's metrics endpoint")
        self.watch = PodSetWatch(self.api, self.namespace)
        self.watch.start()
        stack.callback(self.watch.stopped.set)

    def _create(self, plural: str, body: dict[str, Any]) -> None:
        self.custom.create_namespaced_custom_object(
            "sageserve.io", "v1alpha1", self.namespace, plural, body
        )

    def _patch(self, plural: str, name: str, body: dict[str, Any]) -> None:
        self.custom.patch_namespaced_custom_object(
            "sageserve.io", "v1alpha1", self.namespace, plural, name, body
        )

    def first_reconcile(self) -> None:
        """(1) Every ModelDeployment applied at once, until every pod set exists."""
        config, result, watch = self.config, self.result, self.watch
        self.say(
            f"applying {config.models} ModelDeployments × {result.regions} regions × "
            f"{result.variants} variants"
        )
        self.t_apply = time.monotonic()
        with ThreadPoolExecutor(8) as pool:
            models = [bench_model(i, result.regions, result.variants) for i in range(config.models)]
            list(pool.map(lambda body: self._create("modeldeployments", body), models))
        deadline = config.timeout_s
        if not watch.wait_for(lambda: len(watch.first_seen) >= result.pod_sets, deadline):
            self.operator.check()
            raise BenchError(
                f"only {len(watch.first_seen)} of {result.pod_sets} pod sets after {deadline:.0f}s"
            )
        result.first_reconcile_s = max(watch.first_seen.values()) - self.t_apply
        self.say(f"{result.pod_sets} pod sets exist after {result.first_reconcile_s:.1f}s")
        # The control plane's own pace (controller-manager and KWOK client rate limits),
        # not the operator's: waited for so the rounds below run on a settled cluster.
        if watch.wait_for(lambda: _all_ready(watch.latest), min(deadline, READY_WAIT_S)):
            result.pods_ready_s = time.monotonic() - self.t_apply
        self.operator.check()

    def plan_round(self) -> None:
        """(2) One plan + reconcile round: the policy switches to LT-I, which plans at once."""
        result, operator = self.result, self.operator
        url, namespace = self.target.prometheus_url, self.namespace
        wait(lambda: _history_ready(url, namespace), 120, "token history")
        before = operator.metrics()
        self.say("switching the policy to lt-immediate: one plan + reconcile round")
        t_plan = time.monotonic()
        self._patch("scalingpolicies", POLICY, {"spec": {"strategy": "lt-immediate"}})
        after = wait(
            lambda: (m := operator.metrics()) and rounds(m, "plan") > rounds(before, "plan") and m,
            self.config.timeout_s,
            "a plan round",
        )
        n = rounds(after, "plan") - rounds(before, "plan")
        result.plan_round_s = (round_sum(after, "plan") - round_sum(before, "plan")) / n
        policy: dict[str, Any] = self.custom.get_namespaced_custom_object(  # type: ignore[assignment]
            "sageserve.io", "v1alpha1", namespace, "scalingpolicies", POLICY
        )
        plan = (policy.get("status") or {}).get("plan") or {}
        result.plan_solver_s = plan.get("solverSeconds")
        result.plan_status = str(plan.get("solverStatus", ""))
        goals = endpoint_goals(plan)

        def reached() -> bool:
            result.endpoints_at_target = at_target(self.watch.latest, goals)
            return result.endpoints_at_target == len(goals)

        if self.watch.wait_for(reached, 120):
            result.plan_applied_s = time.monotonic() - t_plan
        self.say(
            f"plan round {result.plan_round_s:.2f}s (solver {result.plan_solver_s}s, "
            f"{result.plan_status}); {result.endpoints_at_target}/{len(goals)} endpoints at target"
        )

    def spec_changes(self) -> None:
        """(3) CR change → Deployment patched, one edit at a time."""
        config, result, watch = self.config, self.result, self.watch
        self.say(f"{config.changes} image edits, each until every pod set of its model carries it")
        latencies = []
        for k in range(config.changes):
            name, image = model_name((k * 7) % config.models), f"{IMAGE}:v{k + 1}"
            sets = {d for d in watch.latest if d.startswith(f"{name}-")}
            t0 = time.monotonic()
            self._patch("modeldeployments", name, {"spec": {"engine": {"image": image}}})

            def patched(s: set[str] = sets, im: str = image) -> bool:
                return all((d, im) in watch.image_seen for d in s)

            if watch.wait_for(patched, 30):
                latencies.append(max(watch.image_seen[(d, image)] for d in sets) - t0)
            self.operator.check()
        result.changes = config.changes
        result.changes_seen = len(latencies)
        if latencies:
            result.change_p50_s = statistics.median(latencies)
            result.change_p99_s = percentile(latencies, 99)
            result.change_max_s = max(latencies)

    def finish(self) -> None:
        """(4) RSS, and the background rounds the operator timed meanwhile."""
        result, operator = self.result, self.operator
        final = operator.metrics()
        result.rss_peak_mb = operator.peak_kb / 1024
        result.rss_end_mb = status_kb(operator.proc.pid, "VmRSS") / 1024
        for kind, into in (("resync", result.resync_s), ("pace", result.pace_s)):
            count = rounds(final, kind)
            if count:
                into.append(round(round_sum(final, kind) / count, 3))
        operator.check()


def _answers(operator: OperatorProcess) -> bool:
    operator.check()
    try:
        scrape(operator.metrics_url)
    except OSError:
        return False
    return True


def _all_ready(latest: dict[str, dict[str, Any]]) -> bool:
    return all(
        int((d.get("status") or {}).get("readyReplicas") or 0) == int(d["spec"]["replicas"] or 0)
        for d in latest.values()
    )


def _history_ready(prometheus_url: str, namespace: str) -> bool:
    """Whether Prometheus has a token rate for the bench's endpoints (the forecast's input)."""
    from sageserve.metrics.prometheus import MetricsUnavailable, PrometheusReader

    try:
        return bool(PrometheusReader(prometheus_url).tokens_per_second(namespace))
    except MetricsUnavailable:
        return False


def endpoint_goals(plan: dict[str, Any]) -> dict[tuple[str, str], int]:
    """Instances per (model, region) LT-I moves to: the plan's targets within min/max."""
    totals: dict[tuple[str, str], int] = {}
    for t in plan.get("targets", []):
        key = (t["model"], t["region"])
        totals[key] = totals.get(key, 0) + int(t["target"])
    return {k: max(MIN_INSTANCES, min(MAX_INSTANCES, v)) for k, v in totals.items()}


def at_target(latest: dict[str, dict[str, Any]], goals: dict[tuple[str, str], int]) -> int:
    """How many endpoints' replicas (summed over variants) equal their goal."""
    have: dict[tuple[str, str], int] = {}
    for d in latest.values():
        labels = d["metadata"].get("labels") or {}
        key = (
            str(labels.get("sageserve.io/model-deployment")),
            str(labels.get("sageserve.io/region")),
        )
        have[key] = have.get(key, 0) + int(d["spec"]["replicas"] or 0)
    return sum(1 for k, v in goals.items() if have.get(k) == v)


#: The paper's three tiers (SageServe §2.2: IW-F, IW-N, NIW), as in policies/base/tiers.yaml.
BENCH_TIERS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("iw-f", {"type": "interactive", "priority": 0, "slo": {"ttftP95Seconds": 1}}),
    ("iw-n", {"type": "interactive", "priority": 1, "slo": {"ttftP95Seconds": 60}}),
    (
        "niw",
        {
            "type": "batch",
            "priority": 2,
            "batch": {"deadlineSeconds": 86400, "promotionAgeSeconds": 36000},
        },
    ),
)


def install_crds(api: Any, timeout: float = 60.0) -> None:
    """Create (or replace) the CRDs generated from `sageserve.api`; wait until Established."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    from sageserve.api.crd import KINDS, crd

    # Plain dicts in and out: the generated YAML is the body, no model objects needed.
    ext: Any = client.ApiextensionsV1Api(api)
    names = []
    for kind in KINDS:
        body = crd(kind)
        names.append(kind.crd_name)
        try:
            ext.create_custom_resource_definition(body)
        except ApiException as e:
            if e.status != 409:
                raise
            current = ext.read_custom_resource_definition(kind.crd_name)
            body["metadata"]["resourceVersion"] = current.metadata.resource_version
            ext.replace_custom_resource_definition(kind.crd_name, body)

    def established() -> bool:
        for name in names:
            status = ext.read_custom_resource_definition(name).status
            conditions = (status.conditions if status else None) or []
            if not any(c.type == "Established" and c.status == "True" for c in conditions):
                return False
        return True

    wait(established, timeout, "the CRDs to be Established")


def add_nodes(api: Any, nodes: list[dict[str, Any]], timeout: float) -> None:
    """Create the Nodes that do not exist yet (8 in flight) and wait until KWOK has marked
    every one Ready (a kubelet registering itself sends the same body, status included)."""
    from kubernetes import client

    core = client.CoreV1Api(api)

    def ready_names() -> dict[str, bool]:
        raw: Any = core.list_node(_preload_content=False)
        items = json.loads(raw.data).get("items", [])
        return {
            n["metadata"]["name"]: any(
                c.get("type") == "Ready" and c.get("status") == "True"
                for c in (n.get("status") or {}).get("conditions", [])
            )
            for n in items
        }

    existing = ready_names()
    fresh = [n for n in nodes if n["metadata"]["name"] not in existing]
    if fresh:
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda body: core.create_node(body), fresh))
    wanted = [n["metadata"]["name"] for n in nodes]

    def all_ready() -> bool:
        ready = ready_names()
        return all(ready.get(name) for name in wanted)

    wait(all_ready, timeout, f"{len(wanted)} KWOK nodes to become Ready", interval=1.0)


def prepare(api: Any, namespace: str) -> None:
    """CRDs, the namespace and the paper's tiers."""
    from kubernetes import client

    install_crds(api)
    client.CoreV1Api(api).create_namespace(
        client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace))
    )
    custom = client.CustomObjectsApi(api)
    for name, spec in BENCH_TIERS:
        body = {
            "apiVersion": "sageserve.io/v1alpha1",
            "kind": "WorkloadTier",
            "metadata": {"name": name},
            "spec": spec,
        }
        custom.create_namespaced_custom_object(
            "sageserve.io", "v1alpha1", namespace, "workloadtiers", body
        )


def delete_namespace(core: Any, namespace: str) -> None:
    with contextlib.suppress(Exception):  # best effort: a private cluster goes anyway
        core.delete_namespace(namespace)


# --- report --------------------------------------------------------------------------------


def _fmt(value: float | None, unit: str = "s") -> str:
    return "—" if value is None else f"{value:.2f} {unit}"


def report(result: BenchResult, console: Console) -> bool:
    """Print the figures against the goals (`GOALS`); returns whether every goal is met."""
    title = (
        f"operator at {result.models} ModelDeployments × {result.regions} regions × "
        f"{result.variants} variants ({result.pod_sets} pod sets) on {result.nodes} KWOK nodes"
    )
    table = Table(title=title)
    table.add_column("figure")
    table.add_column("measured", justify="right")
    table.add_column("goal", justify="right")
    table.add_column("", justify="center")

    def row(name: str, value: float | None, goal: float | None, unit: str = "s") -> bool:
        ok = value is not None and (goal is None or value <= goal)
        mark = "" if goal is None else ("[green]✓[/green]" if ok else "[red]✗[/red]")
        table.add_row(name, _fmt(value, unit), "" if goal is None else f"≤ {goal:g} {unit}", mark)
        return ok or goal is None

    ok = True
    row("first reconcile: MDs applied → all pod sets exist", result.first_reconcile_s, None)
    row("  … and every pod Ready (KWOK)", result.pods_ready_s, None)
    ok &= row("plan + reconcile round (operator)", result.plan_round_s, GOALS["plan_round_s"])
    row("  of which ILP solve", result.plan_solver_s, None)
    row("  policy edit → every endpoint at target", result.plan_applied_s, None)
    ok &= row("CR change → Deployment patched, P99", result.change_p99_s, GOALS["change_p99_s"])
    row("  P50", result.change_p50_s, None)
    row("  max", result.change_max_s, None)
    ok &= row("operator RSS, peak (VmHWM)", result.rss_peak_mb, GOALS["rss_peak_mb"], "MB")
    console.print(table)
    console.print(
        f"endpoints at target after the plan: {result.endpoints_at_target}/{result.endpoints}; "
        f"changes seen: {result.changes_seen}/{result.changes}; mean resync sweep "
        f"{result.resync_s or '—'} s, mean pace pass {result.pace_s or '—'} s; "
        + (f"cluster up {result.cluster_up_s:.0f} s; " if result.cluster_up_s else "")
        + result.machine
    )
    return ok


def bench_operator_command(
    config: BenchConfig,
    target: ClusterTarget,
    output: Path | None,
    console: Console,
    cluster_up_s: float = 0.0,
) -> bool:
    """Run, print, optionally write JSON; True if goals are met."""
    result = run_bench(config, target, console, cluster_up_s)
    ok = report(result, console)
    if output is not None:
        output.write_text(json.dumps({**asdict(result), "goals": GOALS}, indent=2) + "\n")
    return ok
