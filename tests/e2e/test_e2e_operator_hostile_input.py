"""Hostile or broken input to the operator, on the real API server and
Prometheus: a ModelDeployment edited 1,000 times in under a minute, KV readings of NaN,
+Inf, below 0 and above 100 %, a minInstances no node can hold and a ScalingPolicy pricing a
GPU type no node has.

What the platform team sees: the operator keeps up and the last spec wins (its bound is
the one the next scale-out stops at); impossible readings are never acted on (sizes held,
`Degraded` says which endpoint and that nothing reports); specs that pass the schema but
cannot be met get `Ready=False` with the fix, and the rest goes on.
"""

from __future__ import annotations

import json
import math
import threading
import time
from pathlib import Path

import pytest
from e2e_helpers import eventually, kubectl
from fault_kit import figure, steady, wait_condition
from kopf.testing import KopfRunner
from operator_kit import (
    A100,
    FakeVllm,
    apply,
    model_deployment,
    operator_args,
    operator_env,
    replicas,
    scaling_policy,
)

from sageserve.api.common import GROUP, VERSION

pytestmark = pytest.mark.slow
REGION = "us-east"
EDITS, WRITERS = 1000, 8


def md_status(kubeconfig: Path, namespace: str, name: str) -> dict:
    out = kubectl(kubeconfig, ["get", "modeldeployment", name, "-n", namespace, "-o", "json"])
    found: dict = json.loads(out.stdout)
    return found


def storm(api_client: object, namespace: str, last: int) -> float:
    """EDITS merge patches of spec.regions (maxInstances 1..4) from WRITERS threads, the very
    last one setting maxInstances=`last`; seconds taken."""
    from kubernetes import client

    custom = client.CustomObjectsApi(api_client)

    def patch(m: int) -> None:
        body = {"spec": {"regions": [{"name": REGION, "minInstances": 1, "maxInstances": m}]}}
        custom.patch_namespaced_custom_object(
            GROUP, VERSION, namespace, "modeldeployments", "llama8b", body
        )

    def writer(k: int) -> None:
        for i in range(k, EDITS - 1, WRITERS):
            patch(1 + i % 4)

    started = time.monotonic()
    threads = [threading.Thread(target=writer, args=(k,)) for k in range(WRITERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    patch(last)
    return time.monotonic() - started


@pytest.mark.usefixtures("restore_node_pools")
def test_an_edit_storm_impossible_readings_and_impossible_specs_are_survived(
    kubeconfig: Path,
    namespace: str,
    prometheus_url: str,
    prometheus_targets_dir: Path,
    api_client: object,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    operator_env(monkeypatch, kubeconfig, namespace, prometheus_url, 0)
    fake = FakeVllm()
    fake.set(0.5)
    target = fake.scrape(prometheus_targets_dir, namespace, REGION, kubeconfig)

    def size() -> int | None:
        return replicas(kubeconfig, namespace, REGION)

    try:
        with KopfRunner(operator_args(namespace), timeout=900) as runner:
            apply(kubeconfig, namespace, scaling_policy("reactive"))
            apply(kubeconfig, namespace, model_deployment([REGION], gpus=2, lo=1, hi=4))
            eventually(lambda: size() == 1, 60, "the pod set at 1")

            # 1,000 edits as fast as the writers can send them; the last says maxInstances 2
            took = storm(api_client, namespace, 2)
            done = time.monotonic()
            generation = md_status(kubeconfig, namespace, "llama8b")["metadata"]["generation"]
            eventually(
                lambda: (
                    (md_status(kubeconfig, namespace, "llama8b").get("status", {})).get(
                        "observedGeneration"
                    )
                    == generation
                ),
                60,
                "the last generation reconciled",
            )
            caught_up = time.monotonic() - done
            fake.set(0.9)  # saturated: scale out up to the last spec's bound, no further
            eventually(lambda: size() == 2, 60, "scale-out to the last maxInstances")
            steady(size, 8, "the pod set at the last spec's maximum")
            figure(
                "edit storm",
                f"{EDITS} edits in {took:.1f} s; last generation reconciled "
                f"{caught_up:.1f} s after the last edit; the next scale-out stopped at its bound",
            )

            # readings no vLLM can give: never acted on, reported
            fake.set(0.1)  # would scale in, were it read ...
            for bad in (math.nan, math.inf, -0.5, 7.0):
                fake.kv.labels("llama8b").set(bad)
                degraded = wait_condition(
                    kubeconfig, namespace, "Degraded", "True", 60, "MetricsMissing"
                )
                assert f"llama8b/{REGION}" in degraded["message"], degraded
                steady(size, 6, f"the pod set with a KV reading of {bad}")
                fake.kv.labels("llama8b").set(0.5)  # a true reading between the thresholds
                wait_condition(kubeconfig, namespace, "Degraded", "False", 60)
            assert size() == 2

            # a minInstances no node can hold: Ready=False with the fix, the rest goes on
            huge = model_deployment(["us-west"], gpus=8, lo=50, hi=60, name="huge")
            apply(kubeconfig, namespace, huge)

            def huge_ready() -> dict | None:
                conditions = md_status(kubeconfig, namespace, "huge").get("status", {})
                found = [c for c in conditions.get("conditions", []) if c["type"] == "Ready"]
                return found[0] if found and found[0]["status"] == "False" else None

            ready = eventually(huge_ready, 60, "Ready=False on the impossible minInstances")
            assert ready["reason"] == "MinInstancesUnreachable", ready
            assert "lower minInstances to" in ready["message"], ready
            absent = kubectl(
                kubeconfig, ["get", "deployment", "huge-us-west-a100", "-n", namespace], check=False
            )
            assert absent.returncode != 0  # no pod set of 50 Pending pods

            # a policy pricing a GPU type no node has: held, Ready=False naming the real ones
            apply(kubeconfig, namespace, model_deployment([REGION], gpus=2, lo=1, hi=4))
            costs = {"gpuHourCosts": [{"gpuType": "NVIDIA-A100", "costPerGpuHour": 4}]}
            apply(kubeconfig, namespace, scaling_policy("reactive", optimizer=costs))
            refused = wait_condition(kubeconfig, namespace, "Ready", "False", 60, "UnknownGpuType")
            assert "'NVIDIA-A100'" in refused["message"] and A100 in refused["message"]
            fake.kv.labels("llama8b").set(0.9)  # would scale out (max 4 now), were it paced
            steady(size, 6, "the pod set under a policy that cannot be acted on")
            costs["gpuHourCosts"][0]["gpuType"] = A100
            apply(kubeconfig, namespace, scaling_policy("reactive", optimizer=costs))
            wait_condition(kubeconfig, namespace, "Ready", "True", 60, "Pacing")
            eventually(lambda: size() == 3, 60, "pacing again once the policy is fixed")
        assert runner.exception is None, runner.output
    finally:
        target.unlink(missing_ok=True)
        fake.close()
