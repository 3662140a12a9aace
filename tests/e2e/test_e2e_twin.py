"""The closed loop on the real control plane: operator, real Prometheus, the metrics twin.

The twin (`sageserve twin`, its own process) watches the pods of the pod sets, replays the
Azure conversation trace on exactly the pods that run (the simulator's instance model) and
registers each serving pod with Prometheus; the operator reads what Prometheus scraped.
Nothing here sets a metric by hand: the test only turns the trace's rate up and down
and checks what a user sees in the cluster. Waits are `eventually`,
never sleeps, so the assertions are about behaviour, not timing.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml
from e2e_helpers import eventually, kubectl
from kopf.testing import KopfRunner
from operator_kit import (
    A100,
    REPO,
    TwinProcess,
    apply,
    model_deployment,
    operator_args,
    operator_env,
    scaling_policy,
    spot_workload,
)

from sageserve.api.model_deployment import ModelDeployment
from sageserve.controller.podset import render_pod_sets
from sageserve.metrics import queries
from sageserve.metrics.prometheus import PrometheusReader

REGION = "us-east"
SERVING_NODE = f"gpu-{REGION}-a100-serving-0"
SPOT_NODE = f"gpu-{REGION}-a100-spot-0"
MODEL = "bloom"  # named after no profile: the annotation picks the perf profile
TRACE = REPO / "data/traces/azure-llm-2023/AzureLLMInferenceTrace_conv.csv.gz"
# bloom-176b on 8 A100s (KV cache of 55,679 tokens) against the conversation trace: at 0.05×
# one instance idles (KV ≈ 7 %), at 0.4× one instance saturates (≈ 98 %) and two stay busy
# (≈ 96 %), so the 70/30 reactive thresholds see rising, falling and rising load.
LOW, HIGH = 0.05, 0.4


def get(kubeconfig: Path, *what: str) -> dict[str, Any]:
    out: dict[str, Any] = json.loads(kubectl(kubeconfig, ["get", *what, "-o", "json"]).stdout)
    return out


def bloom() -> dict[str, Any]:
    md = model_deployment([REGION], A100, gpus=8, theta=114, lo=1, hi=2, name=MODEL)
    md["metadata"]["annotations"] = {"sageserve.io/perf-profile": "bloom-176b"}
    md["spec"]["model"] = {"name": "bigscience/bloom"}
    return md


class Cluster:
    """What the test reads back from the API server."""

    def __init__(self, kubeconfig: Path, namespace: str) -> None:
        self.kubeconfig = kubeconfig
        self.namespace = namespace

    def pods(self, selector: str) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = get(
            self.kubeconfig, "pods", "-n", self.namespace, "-l", selector
        )["items"]
        return items

    def serving(self) -> dict[str, str]:
        """Running serving pods → their node."""
        return {
            p["metadata"]["name"]: p["spec"]["nodeName"]
            for p in self.pods(f"sageserve.io/model-deployment={MODEL}")
            if p["status"].get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")
        }

    def replicas(self) -> int | None:
        out = kubectl(
            self.kubeconfig,
            ["get", "deployment", "-n", self.namespace, f"{MODEL}-{REGION}-a100", "-o", "json"],
            check=False,
        )
        return json.loads(out.stdout)["spec"]["replicas"] if out.returncode == 0 else None

    def spot_pod(self) -> tuple[str, str]:
        """(phase, node) of the spot workload's pod."""
        live = [
            p for p in self.pods("app=spot-batch") if not p["metadata"].get("deletionTimestamp")
        ]
        if len(live) != 1:
            return ("", "")
        return (live[0]["status"].get("phase", ""), live[0]["spec"].get("nodeName", ""))

    def spot_running(self) -> str | None:
        """The node the spot workload runs on, if it runs."""
        phase, node = self.spot_pod()
        return node if phase == "Running" else None

    def node(self, name: str) -> dict[str, Any]:
        return get(self.kubeconfig, "node", name)["metadata"]

    def pool(self, name: str) -> str:
        return str(self.node(name)["labels"]["sageserve.io/pool"])

    def describe(self) -> str:
        """Pods, nodes and events, for a failure message."""
        k = self.kubeconfig
        args = ["-o", "wide", "--show-labels"]
        pods = kubectl(k, ["get", "pods", "-n", self.namespace, *args], check=False).stdout
        nodes = kubectl(k, ["get", "nodes", "-L", "sageserve.io/pool"], check=False).stdout
        events = kubectl(
            k, ["get", "events", "-n", self.namespace, "--sort-by=.lastTimestamp"], check=False
        ).stdout
        return f"\n--- pods\n{pods}\n--- nodes\n{nodes}\n--- events\n{events}"

    def events(self) -> str:
        return kubectl(
            self.kubeconfig, ["get", "events", "-n", self.namespace, "-o", "json"]
        ).stdout


@contextmanager
def explained(cluster: Cluster, twin: TwinProcess) -> Iterator[None]:
    """On a failed assertion, add what the cluster and the twin looked like."""
    try:
        yield
    except AssertionError as err:
        status = json.dumps(twin.status(), indent=1)[-4000:]
        raise AssertionError(f"{err}{cluster.describe()}\n--- twin\n{status}") from None


def on_the_right_nodes(cluster: Cluster) -> None:
    """Every serving pod runs on a serving A100 node of its region."""
    for pod, node in cluster.serving().items():
        labels = cluster.node(node)["labels"]
        assert labels["topology.kubernetes.io/region"] == REGION, (pod, node)
        assert labels["nvidia.com/gpu.product"] == A100, (pod, node)
        assert labels["sageserve.io/pool"] == "serving", (pod, node)


def twin_serves(twin: TwinProcess, pods: set[str]) -> bool:
    """The twin simulates exactly these pods, and each has produced tokens."""
    samples = twin.status()["samples"]
    names = {k.split("/", 1)[1] for k in samples}
    return names == pods and all(s["generationTokens"] > 0 for s in samples.values())


@pytest.mark.usefixtures("restore_node_pools")
def test_load_from_the_twin_drives_scale_out_reclaim_scale_in_donation_and_reclaim_again(
    kubeconfig: Path,
    namespace: str,
    prometheus_url: str,
    prometheus_targets_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    operator_env(monkeypatch, kubeconfig, namespace, prometheus_url)
    cluster = Cluster(kubeconfig, namespace)
    reader = PrometheusReader(prometheus_url)
    apply(kubeconfig, namespace, spot_workload(REGION))
    assert eventually(cluster.spot_running, 60, "the spot workload running") == SPOT_NODE

    twin = TwinProcess(
        kubeconfig,
        namespace,
        prometheus_targets_dir,
        "--trace",
        str(TRACE),
        "--scale",
        str(LOW),
        "--speed",
        "4",  # backlogs drain 4× faster; utilisation is what it would be in real time
    )
    try:
        with KopfRunner(operator_args(namespace), timeout=600) as runner, explained(cluster, twin):
            # a scale-in waits one minute after a backlog (the policy's stabilization window)
            intervals = {"paceSeconds": 2, "cooldownSeconds": 2, "scaleInStabilizationSeconds": 60}
            policy = scaling_policy("reactive", intervals=intervals)
            apply(kubeconfig, namespace, policy, bloom())

            # The pod set lands on the region's serving A100 node; the twin serves it and
            # Prometheus has its KV-cache usage under the operator's query.
            first = eventually(cluster.serving, 60, "one serving pod Running")
            assert list(first.values()) == [SERVING_NODE]
            on_the_right_nodes(cluster)
            eventually(lambda: twin_serves(twin, set(first)), 60, "the twin serving the pod")
            eventually(
                lambda: set(first) <= set(reader.pod_loads(namespace)),
                60,
                "its KV usage in Prometheus",
            )
            assert cluster.replicas() == 1

            # Rising load: utilisation above 70 % raises the target; the second instance
            # does not fit the serving pool, so the spot node is reclaimed for it.
            twin.load(HIGH / LOW)
            eventually(
                lambda: (
                    min((p.kv_usage for p in reader.pod_loads(namespace).values()), default=0) > 0.7
                ),
                90,
                "EMU above 70 %",
            )
            eventually(lambda: cluster.replicas() == 2, 90, "scale-out to two instances")
            both = eventually(
                lambda: len(cluster.serving()) == 2 and cluster.serving(), 120, "two pods Running"
            )
            assert sorted(both.values()) == sorted([SERVING_NODE, SPOT_NODE])
            on_the_right_nodes(cluster)
            reclaimed = cluster.node(SPOT_NODE)
            assert reclaimed["labels"]["sageserve.io/pool"] == "serving"
            assert "sageserve.io/reclaimed-at" in reclaimed["annotations"]
            assert cluster.spot_pod() == ("Pending", "")  # evicted, waiting for a spot node
            eventually(lambda: twin_serves(twin, set(both)), 60, "the twin serving both pods")

            # Falling load: back to one instance; the idle node is donated and the spot
            # workload runs there again.
            # (scale-in waits out the queue signal's stabilization window: the saturated
            # endpoint had a backlog just before)
            twin.load(1)
            eventually(lambda: cluster.replicas() == 1, 480, "scale-in to one instance")
            kept = eventually(
                lambda: len(cluster.serving()) == 1 and cluster.serving(), 60, "one pod"
            )
            [freed] = [n for n in both.values() if n not in kept.values()]
            eventually(lambda: cluster.pool(freed) == "spot", 60, "the idle node donated to spot")
            annotations = cluster.node(freed)["annotations"]
            assert annotations["sageserve.io/last-model"] == f"{namespace}/{MODEL}"
            assert "sageserve.io/donated-at" in annotations
            assert eventually(cluster.spot_running, 60, "the spot workload running again") == freed
            eventually(lambda: twin_serves(twin, set(kept)), 60, "the twin dropping the old pod")

            # Rising again: the spot pod is evicted, the node goes back to serving, and the
            # new serving pod is placed on it.
            twin.load(HIGH / LOW)
            eventually(lambda: cluster.replicas() == 2, 120, "scale-out again")
            again = eventually(
                lambda: len(cluster.serving()) == 2 and cluster.serving(), 120, "two pods again"
            )
            assert freed in again.values()
            assert cluster.pool(freed) == "serving"
            on_the_right_nodes(cluster)
            assert cluster.spot_pod() == ("Pending", "")
            events = cluster.events()
            for reason in ("ScaledOut", "ScaledIn", "Reclaimed", "Donated"):
                assert reason in events, reason
        assert runner.exception is None, runner.output
    finally:
        twin.close()
    assert "Traceback" not in twin.output(), twin.output()


def test_backfilled_history_reaches_the_forecaster_through_prometheus(
    kubeconfig: Path,
    namespace: str,
    prometheus_url: str,
    prometheus_targets_dir: Path,
    e2e_cluster: Any,
    tmp_path: Path,
) -> None:
    """Hours of history before the twin starts: blocks made by promtool, moved into the
    running Prometheus, queried with the plan loop's own query and grid."""
    # The pod set as the operator renders it (no operator needed to backfill); the
    # ModelDeployment names the twin's perf profile.
    apply(kubeconfig, namespace, bloom())
    md = ModelDeployment.model_validate(bloom())
    for pod_set in render_pod_sets(md, {}, namespace):
        kubectl(kubeconfig, ["apply", "-f", "-"], stdin=yaml.safe_dump(pod_set))
    cluster = Cluster(kubeconfig, namespace)
    eventually(lambda: len(cluster.serving()) == 1, 60, "the pod set's pod Running")

    hours = 6
    started = time.monotonic()
    twin = TwinProcess(
        kubeconfig,
        namespace,
        prometheus_targets_dir,
        "--trace",
        str(TRACE),
        "--scale",
        "0.1",
        "--backfill-hours",
        str(hours),
        "--backfill-dir",
        str(tmp_path),
        "--prometheus-data",
        str(Path(e2e_cluster.prometheus_dir) / "data"),
    )
    try:
        took = time.monotonic() - started
        report = next(ln for ln in twin.lines if ln.startswith("backfill: 6 h"))
        print(f"\n{report.strip()} — twin up after {took:.1f} s")
        reader = PrometheusReader(prometheus_url)
        rate = queries.tokens_per_second("5m", namespace)
        key = (namespace, MODEL, REGION)

        def history() -> list[float] | None:
            series = reader.history(rate, time.time(), hours * 3600, 300).get(key)
            return series if series and series[3] == series[3] else None  # not NaN 5 h back

        # Prometheus loads new blocks at its next block reload (once a minute).
        series = eventually(history, 150, "backfilled tokens/s hours back", interval=5)
        known = [v for v in series if v == v]
        assert len(known) >= len(series) - 3  # only the join between history and live
        # 0.1× the conversation trace is ≈ 0.5 requests/s of ≈ 1,000 prompt and ≈ 250
        # output tokens: a few hundred tokens/s, never zero.
        assert all(v > 50 for v in known), known
        # History and live samples are one series per pod (the live scrape carries the
        # labels the history was written with), so no duplicate series appear.
        live = reader.instant(f"count by (pod) ({queries.kv_usage_per_pod(namespace)})")
        assert set(live.values()) == {1.0}
    finally:
        twin.close()
