"""Donation and reclaim of GPU nodes against the real control plane and Prometheus.

A spot workload runs on the region's spot node. Rising load needs a second instance that
does not fit the serving pool: the operator evicts the spot pod through the Eviction API,
moves the node to `serving`, and the serving pod lands there. Falling load scales in; the
idle node goes back to `spot` (annotated with the model it served) and the spot workload
runs on it again.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from e2e_helpers import eventually, kubectl
from kopf.testing import KopfRunner
from operator_kit import (
    FakeVllm,
    apply,
    model_deployment,
    operator_args,
    operator_env,
    scaling_policy,
    spot_workload,
)

REGION = "us-west"
SPOT_NODE = "gpu-us-west-a100-spot-0"


@pytest.fixture
def fake_vllm() -> Iterator[FakeVllm]:
    fake = FakeVllm()
    yield fake
    fake.close()


def get(kubeconfig: Path, *what: str) -> dict:
    return json.loads(kubectl(kubeconfig, ["get", *what, "-o", "json"]).stdout)


@pytest.mark.usefixtures("restore_node_pools")
def test_scale_out_reclaims_a_spot_node_and_scale_in_donates_it_back(
    kubeconfig: Path,
    namespace: str,
    prometheus_url: str,
    prometheus_targets_dir: Path,
    fake_vllm: FakeVllm,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    operator_env(monkeypatch, kubeconfig, namespace, prometheus_url)
    apply(kubeconfig, namespace, spot_workload(REGION))

    def spot_pod_node() -> str | None:
        pods = get(kubeconfig, "pods", "-n", namespace, "-l", "app=spot-batch")["items"]
        running = [p for p in pods if p["status"].get("phase") == "Running"]
        return running[0]["spec"]["nodeName"] if running else None

    assert eventually(spot_pod_node, 60, "the spot workload running") == SPOT_NODE

    target_file = fake_vllm.scrape(prometheus_targets_dir, namespace, REGION, kubeconfig)
    policy = scaling_policy("reactive")
    model = model_deployment([REGION], gpus=8, theta=1800)

    def serving_nodes() -> list[str]:
        pods = get(
            kubeconfig, "pods", "-n", namespace, "-l", "sageserve.io/model-deployment=llama8b"
        )["items"]
        return sorted(p["spec"]["nodeName"] for p in pods if p["status"].get("phase") == "Running")

    def pool(node: str) -> str:
        return get(kubeconfig, "node", node)["metadata"]["labels"]["sageserve.io/pool"]

    args = operator_args(namespace)
    try:
        with KopfRunner(args, timeout=240) as runner:
            fake_vllm.set(0.5)
            apply(kubeconfig, namespace, policy)
            apply(kubeconfig, namespace, model)
            assert eventually(
                lambda: len(serving_nodes()) == 1 and serving_nodes(), 60, "one serving instance"
            )

            fake_vllm.set(0.9)  # rising load: a second instance, which needs the spot node
            both = eventually(
                lambda: len(serving_nodes()) == 2 and serving_nodes(),
                120,
                "a second instance on the reclaimed node",
            )
            assert SPOT_NODE in both
            assert pool(SPOT_NODE) == "serving"
            assert (
                "sageserve.io/reclaimed-at"
                in get(kubeconfig, "node", SPOT_NODE)["metadata"]["annotations"]
            )
            batch = get(kubeconfig, "pods", "-n", namespace, "-l", "app=spot-batch")["items"]
            assert [p["status"]["phase"] for p in batch] == ["Pending"]  # evicted, waiting for spot

            fake_vllm.set(0.1)  # falling load: back to one instance, the idle node is donated
            eventually(lambda: len(serving_nodes()) == 1, 120, "scale-in to one instance")
            freed = eventually(
                lambda: next(
                    (n for n in both if n not in serving_nodes() and pool(n) == "spot"), None
                ),
                60,
                "the idle node donated to spot",
            )
            annotations = get(kubeconfig, "node", freed)["metadata"]["annotations"]
            assert annotations["sageserve.io/last-model"] == f"{namespace}/llama8b"
            assert "sageserve.io/donated-at" in annotations
            assert eventually(spot_pod_node, 60, "the spot workload running again") == freed
            events = kubectl(kubeconfig, ["get", "events", "-n", namespace, "-o", "json"]).stdout
            assert "Reclaimed" in events and "Donated" in events
        assert runner.exception is None, runner.output
    finally:
        target_file.unlink(missing_ok=True)
