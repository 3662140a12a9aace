"""A real endpoint picker (GAIE's EPP) on the real control plane, scraping the twin's pods.

The ModelDeployment's pods are KWOK pods with loopback IPs; the twin (`--pod-listeners`)
answers at each pod's own `podIP:8000`, as its vLLM server would. An InferencePool
selects the pods; the EPP (its own process, built from the pinned GAIE release) finds
them through the API server, scrapes `http://<podIP>:8000/metrics` of each, and exports
its pool gauges, which the kit's Prometheus scrapes. The test raises and lowers the
trace's rate through the twin and checks, in Prometheus, that the picker's view of the
pool follows: nothing set by hand, every wait a bounded condition.
"""

from __future__ import annotations

import ipaddress
import json
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import pytest
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
)

from e2e import epp, state
from sageserve.metrics.prometheus import PrometheusReader

TRACE = REPO / "data/traces/azure-llm-2023/AzureLLMInferenceTrace_conv.csv.gz"
MODEL = "bloom"
SERVED = "bigscience/bloom"
POOL = "bloom-pool"
PORT = 8000  # the ModelDeployment's engine port (its default)
#: bloom-176b on 8 A100s against the conversation trace: at 0.05× an instance idles
#: (KV ≈ 7 %, nothing waits); at 0.4× it saturates (KV ≈ 98 %), so at 1× requests arrive
#: faster than it serves them and wait (see test_e2e_twin.py for the curve).
LOW, HIGH = 0.05, 1.0

T = TypeVar("T")


def bloom() -> dict[str, Any]:
    """One bloom instance in each of two regions (one 8-GPU A100 node per region)."""
    md = model_deployment(["us-east", "us-west"], A100, gpus=8, theta=114, lo=1, hi=1, name=MODEL)
    md["metadata"]["annotations"] = {"sageserve.io/perf-profile": "bloom-176b"}
    md["spec"]["model"] = {"name": SERVED}
    return md


def serving_pods(kubeconfig: Path, namespace: str) -> dict[str, str]:
    """Ready pods of the model deployment → their pod IP."""
    items = json.loads(
        kubectl(
            kubeconfig,
            [
                *("get", "pods", "-n", namespace, "-o", "json"),
                *("-l", f"sageserve.io/model-deployment={MODEL}"),
            ],
        ).stdout
    )["items"]
    return {
        p["metadata"]["name"]: p["status"].get("podIP", "")
        for p in items
        if not p["metadata"].get("deletionTimestamp")
        and any(
            c["type"] == "Ready" and c["status"] == "True"
            for c in p["status"].get("conditions", [])
        )
    }


def only_if(value: T, ok: Callable[[T], bool]) -> T | None:
    """`value` when `ok(value)`, else None (for `eventually`)."""
    return value if ok(value) else None


class PoolView:
    """The picker's gauges for the pool, as Prometheus has them."""

    def __init__(self, prometheus_url: str) -> None:
        self.reader = PrometheusReader(prometheus_url)
        self.selector = f'name="{POOL}",epp_pool="{POOL}",job="sageserve-e2e"'

    def value(self, metric: str) -> float | None:
        found = self.reader.samples(f"{metric}{{{self.selector}}}")
        return found[0][1] if len(found) == 1 else None

    def per_pod_queue(self) -> dict[str, float]:
        found = self.reader.samples(f"inference_pool_per_pod_queue_size{{{self.selector}}}")
        return {labels["model_server_pod"]: value for labels, value in found}

    def series(self) -> list[str]:
        """Every series the picker exports about the pool, for a failure message."""
        found = self.reader.samples(f'{{__name__=~"inference_pool_.*",{self.selector}}}')
        return sorted(f"{dict(labels)} {value}" for labels, value in found)


@contextmanager
def explained(
    twin: TwinProcess, picker: epp.EppProcess, view: PoolView | None = None
) -> Iterator[None]:
    """On a failed assertion, add the twin's pods, the picker's log and its series."""
    try:
        yield
    except AssertionError as err:
        status = twin.status()
        keep = {k: status.get(k) for k in ("pods", "listeners", "listenerErrors", "samples")}
        series = "\n".join(view.series()) if view is not None else ""
        raise AssertionError(
            f"{err}\n--- twin\n{json.dumps(keep, indent=1)[-3000:]}\n--- epp log\n"
            f"{picker.output()}\n--- epp series in Prometheus\n{series}"
        ) from None


@pytest.mark.usefixtures("restore_node_pools")
def test_the_endpoint_picker_scrapes_the_twins_pods_and_its_pool_gauges_follow_their_load(
    start_epp: Callable[..., epp.EppProcess],
    kubeconfig: Path,
    namespace: str,
    prometheus_url: str,
    prometheus_targets_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    operator_env(monkeypatch, kubeconfig, namespace, prometheus_url)
    cluster = state.load()
    assert cluster is not None and cluster.pod_cidr, "the kit gives KWOK pods a loopback range"
    cidr = ipaddress.ip_network(cluster.pod_cidr)
    twin = TwinProcess(
        kubeconfig,
        namespace,
        prometheus_targets_dir,
        "--pod-listeners",
        "--trace",
        str(TRACE),
        "--scale",
        str(LOW),
        "--speed",
        "4",  # backlogs build and drain 4× faster
    )
    try:
        with KopfRunner(operator_args(namespace), timeout=600):
            apply(kubeconfig, namespace, scaling_policy("reactive"), bloom())
            pods = eventually(
                lambda: only_if(serving_pods(kubeconfig, namespace), lambda p: len(p) == 2),
                90,
                "two bloom pods Ready",
            )
            for name, ip in pods.items():
                assert ipaddress.ip_address(ip) in cidr, (name, ip, cidr)

            # each pod answers at its own address, as its vLLM server would
            eventually(
                lambda: sum(len(v) for v in twin.status()["listeners"].values()) == 2,
                60,
                "the twin listening at both pods' addresses",
            )
            for ip in pods.values():
                with urllib.request.urlopen(f"http://{ip}:{PORT}/metrics", timeout=10) as resp:
                    assert "vllm:num_requests_waiting" in resp.read().decode()
                body = json.dumps({"model": SERVED, "prompt": "Say hello.", "max_tokens": 4})
                req = urllib.request.Request(
                    f"http://{ip}:{PORT}/v1/completions",
                    data=body.encode(),
                    headers={"Content-Type": "application/json"},
                )
                with urllib.request.urlopen(req, timeout=60) as resp:
                    assert json.loads(resp.read())["usage"]["completion_tokens"] == 4

            pool = epp.inference_pool(POOL, {"sageserve.io/model-deployment": MODEL}, PORT)
            apply(kubeconfig, namespace, pool)
            picker = start_epp(POOL, namespace)
            view = PoolView(prometheus_url)
            with explained(twin, picker, view):
                # the picker found both pods and reads fresh metrics from each
                eventually(
                    lambda: view.value("inference_pool_ready_pods") == 2,
                    90,
                    "the picker's ready_pods for the pool at 2 in Prometheus",
                )
                assert set(view.per_pod_queue()) == {f"{p}-rank-0" for p in pods}
                # at a low rate nothing waits and the KV caches are nearly empty
                eventually(
                    lambda: view.value("inference_pool_average_queue_size") == 0,
                    60,
                    "an empty queue at the low rate",
                )
                low_kv = view.value("inference_pool_average_kv_cache_utilization")
                assert low_kv is not None and 0 <= low_kv < 0.5, low_kv

                # load beyond what two instances serve: requests run, KV fills, queues grow
                twin.load(HIGH / LOW)
                eventually(
                    lambda: (view.value("inference_pool_average_queue_size") or 0) > 1,
                    180,
                    "the pool's average queue above 1 under load",
                )
                queues = eventually(
                    lambda: only_if(
                        view.per_pod_queue(), lambda q: len(q) == 2 and min(q.values()) > 0
                    ),
                    120,
                    "requests waiting on both pods",
                )
                assert set(queues) == {f"{p}-rank-0" for p in pods}
                high_kv = view.value("inference_pool_average_kv_cache_utilization")
                assert high_kv is not None and high_kv > max(0.5, low_kv), (low_kv, high_kv)
                running = view.value("inference_pool_average_running_requests")
                assert running is not None and running >= 1, running
                assert view.value("inference_pool_ready_pods") == 2

                # no arrivals: the backlog drains and the picker sees the queues empty
                twin.load(0)
                eventually(
                    lambda: (
                        view.value("inference_pool_average_queue_size") == 0
                        and view.per_pod_queue() == dict.fromkeys(queues, 0.0)
                    ),
                    240,
                    "the pool's queues empty again once arrivals stop",
                )
                assert picker.alive(), picker.output()
    finally:
        twin.close()
