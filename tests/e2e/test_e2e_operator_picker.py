"""The endpoint picker's signals pace a region, end to end on the real control plane.

The operator owns the region's InferencePool (the Gateway API Inference Extension's CRDs
installed, as a user with a gateway has them); the real endpoint picker (GAIE's EPP, its
own process) watches that pool, scrapes each twin pod at its own `podIP:8000` and exports
its pool gauges, which the kit's Prometheus scrapes under the pool's namespace. The
ScalingPolicy asks for `spec.signals.endpointPicker: gaie`.

Until the picker is scraped the operator says which series it misses (`PickerSignals`
False, `PickerMetricsMissing`, naming the pool); once they are in Prometheus it reports
them (`PickerSignals` True, `Reported`). Then the load is many requests of a small model
(Llama-3.1-8B on 4 A100s: at most 512 sequences in a batch, 2 M tokens of KV), more than
one instance serves: its batch is full at about a quarter of its KV, so requests queue
while the KV cache stays far below the 70 % scale-out threshold, and the region scales out
on the queue, with the picker's queue and KV readings checked in Prometheus.

Without flow control the picker's waiting requests are the engines' own queues (its pool
gauges are their mean × its ready pods, read a moment apart), so the engines' queue alone
would scale out as well, and the Event names whichever reading is larger at the pass. Demand
the engines do not see is what the picker holds in its flow-control queue, which only
traffic through a gateway puts there.

Every wait is a bounded condition on what the cluster, Prometheus or the operator say.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from e2e_helpers import eventually, kubectl
from fault_kit import events
from kopf.testing import KopfRunner
from operator_kit import (
    A100,
    REPO,
    TwinProcess,
    apply,
    model_deployment,
    operator_args,
    operator_env,
    replicas,
    scaling_policy,
)

from e2e import epp, gaie
from sageserve.controller import inference_pool
from sageserve.metrics.prometheus import PrometheusReader

LOG = logging.getLogger(__name__)
TRACE = REPO / "data/traces/azure-llm-2023/AzureLLMInferenceTrace_conv.csv.gz"
REGION = "us-east"
MODEL = "llama8b"
POOL = f"{MODEL}-{REGION}"  # the pool the operator owns, and the name the picker reads
POOL_CRDS = (
    "inferencepools.inference.networking.k8s.io",
    "inferenceobjectives.inference.networking.x-k8s.io",
)
#: The conversation trace's rate × LOW: one instance idles; × HIGH: several times what one
#: instance serves, so its batch is full (512 sequences) and the rest waits.
LOW, HIGH = 0.5, 40.0


def llama8b() -> dict[str, Any]:
    """Llama-3.1-8B on 4 A100s in one region, 1 to 2 instances."""
    md = model_deployment([REGION], A100, gpus=4, lo=1, hi=2, name=MODEL)
    md["metadata"]["annotations"] = {"sageserve.io/perf-profile": "llama-3-1-8b"}
    return md


def policy(picker: str) -> dict[str, Any]:
    return scaling_policy("reactive", signals={"endpointPicker": picker})


def condition(kubeconfig: Path, namespace: str, type_: str) -> dict[str, Any] | None:
    out = kubectl(kubeconfig, ["get", "scalingpolicy", "fleet", "-n", namespace, "-o", "json"])
    found = [
        c
        for c in json.loads(out.stdout).get("status", {}).get("conditions", [])
        if c["type"] == type_
    ]
    return found[0] if found else None


class PickerView:
    """The picker's gauges for the pool, as Prometheus has them (the series the operator
    reads: `name` the pool, `namespace` the pool's)."""

    def __init__(self, prometheus_url: str, namespace: str) -> None:
        self.reader = PrometheusReader(prometheus_url)
        self.selector = f'name="{POOL}",namespace="{namespace}"'

    def value(self, metric: str) -> float | None:
        found = self.reader.samples(f"{metric}{{{self.selector}}}")
        return found[0][1] if len(found) == 1 else None

    def waiting(self) -> float:
        """The pool's mean queue × its ready pods: what the operator reads as waiting."""
        queue = self.value("inference_pool_average_queue_size")
        ready = self.value("inference_pool_ready_pods")
        return (queue or 0.0) * (ready or 0.0)

    def series(self) -> list[str]:
        """Every series the picker exports about the pool, labels and value."""
        found = self.reader.samples(f'{{__name__=~"inference_pool_.*",{self.selector}}}')
        return sorted(f"{dict(sorted(labels.items()))} {value}" for labels, value in found)


@pytest.fixture
def pool_crds(kubeconfig: Path) -> Iterator[None]:
    """The extension's InferencePool and InferenceObjective CRDs, so that the operator owns
    the region's pool; removed afterwards (other modules expect a cluster without them)."""
    for path in gaie.crd_paths():
        kubectl(kubeconfig, ["apply", "--server-side", "--force-conflicts", "-f", str(path)])
    kubectl(kubeconfig, ["wait", "--for=condition=Established", "crd", *POOL_CRDS])
    inference_pool.forget_discovery()
    yield
    kubectl(kubeconfig, ["delete", "crd", *POOL_CRDS, "--ignore-not-found", "--wait=true"])
    inference_pool.forget_discovery()


@pytest.mark.usefixtures("restore_node_pools", "pool_crds")
def test_the_endpoint_pickers_queue_scales_a_region_out_while_its_kv_cache_stays_low(
    start_epp: Callable[..., epp.EppProcess],
    kubeconfig: Path,
    namespace: str,
    prometheus_url: str,
    prometheus_targets_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    operator_env(monkeypatch, kubeconfig, namespace, prometheus_url)
    monkeypatch.delenv("SAGESERVE_INFERENCE_POOLS", raising=False)  # on: the default
    # the Service a gateway reaches the picker by (the picker here runs outside the
    # cluster and reads only the pool's selector and port)
    monkeypatch.setenv("SAGESERVE_ENDPOINT_PICKER", "{pool}-epp:9002")
    twin = TwinProcess(
        kubeconfig,
        namespace,
        prometheus_targets_dir,
        "--pod-listeners",
        "--trace",
        str(TRACE),
        "--scale",
        str(LOW),
    )
    picker: epp.EppProcess | None = None
    view = PickerView(prometheus_url, namespace)
    started = time.monotonic()
    try:
        with KopfRunner(operator_args(namespace), timeout=600) as runner:
            try:
                apply(kubeconfig, namespace, policy("gaie"), llama8b())
                eventually(lambda: replicas(kubeconfig, namespace, REGION) == 1, 60, "one instance")
                # before a picker is scraped the operator names the series it misses
                missing = eventually(
                    lambda: condition(kubeconfig, namespace, "PickerSignals"),
                    60,
                    "a PickerSignals condition",
                )
                assert (missing["status"], missing["reason"]) == (
                    "False",
                    "PickerMetricsMissing",
                ), missing
                assert "inference_pool_average_queue_size{name=...}" in missing["message"]
                assert f"InferencePool(s) {POOL}:" in missing["message"], missing

                # the picker for the operator's pool
                eventually(
                    lambda: (
                        kubectl(
                            kubeconfig,
                            ["get", "inferencepools", "-n", namespace, POOL, "-o", "name"],
                            check=False,
                        ).returncode
                        == 0
                    ),
                    60,
                    f"the operator's InferencePool {POOL}",
                )
                picker = start_epp(POOL, namespace)
                eventually(
                    lambda: view.value("inference_pool_ready_pods") == 1,
                    90,
                    "the picker's ready_pods for the operator's pool at 1 in Prometheus",
                )
                reported = eventually(
                    lambda: (
                        (c := condition(kubeconfig, namespace, "PickerSignals"))
                        and c["status"] == "True"
                        and c
                    ),
                    60,
                    "PickerSignals=True once the picker's pool gauges are in Prometheus",
                )
                assert reported["reason"] == "Reported", reported
                assert "gaie endpoint picker reports every paced pool" in reported["message"]
                assert view.waiting() == 0  # at the low rate nothing waits
                assert not events(kubeconfig, namespace, "ScaledOut")

                # many requests: the batch fills, requests queue, the KV cache stays low
                twin.load(HIGH / LOW)
                eventually(
                    lambda: replicas(kubeconfig, namespace, REGION) == 2,
                    120,
                    "a scale-out on the queue",
                )
                scaled = [e["message"] for e in events(kubeconfig, namespace, "ScaledOut")]
                assert len(scaled) == 1, scaled
                assert f"{REGION}/a100=2" in scaled[0], scaled
                # the queue's reason (the picker's or the engines': one reading of the same
                # queues, whichever Prometheus scraped later is larger), the EMU it names far
                # below the 70 % at which KV alone would scale out
                assert "waiting" in scaled[0], scaled
                emu = re.search(r"\(EMU (\d+)%\)", scaled[0])
                assert emu is not None and int(emu.group(1)) < 50, scaled
                waiting = view.waiting()
                kv = view.value("inference_pool_average_kv_cache_utilization")
                assert waiting > 5, waiting  # over the 5 per instance that saturate the queue
                assert kv is not None and kv < 0.5, kv  # far below the 70 % EMU threshold
                LOG.info("picker series in Prometheus:\n%s", "\n".join(view.series()))
                LOG.info("scale-out: %s; picker waiting %.0f, KV %.2f", scaled[0], waiting, kv)
                LOG.info("scaled out %.0f s after the start", time.monotonic() - started)
            except AssertionError as err:
                raise AssertionError(
                    f"{err}\n--- picker series\n" + "\n".join(view.series()) + "\n--- epp log\n"
                    f"{picker.output() if picker else ''}\n--- operator\n{runner.output[-4000:]}"
                ) from None
        assert runner.exception is None, runner.output[-4000:]
    finally:
        twin.close()
