"""The operator's view of PreServe's projections: the routers' exports reach the snapshot."""

from __future__ import annotations

from typing import Any

from sageserve.api.model_deployment import ModelDeployment
from sageserve.controller.observe import endpoint_snapshots
from sageserve.core.types import EndpointKey
from sageserve.metrics.prometheus import PodLoad, PrometheusReader

LABELS = {
    "app.kubernetes.io/managed-by": "sageserve",
    "sageserve.io/model-deployment": "llama",
    "sageserve.io/region": "us-east",
    "sageserve.io/variant": "a100",
}
MD = ModelDeployment.model_validate(
    {
        "apiVersion": "sageserve.io/v1alpha1",
        "kind": "ModelDeployment",
        "metadata": {"name": "llama", "namespace": "llm"},
        "spec": {
            "model": {"name": "m"},
            "variants": [
                {
                    "name": "a100",
                    "gpuType": "NVIDIA-A100",
                    "gpusPerInstance": 4,
                    "capacityTokensPerSecond": 900,
                }
            ],
            "regions": [{"name": "us-east", "minInstances": 1, "maxInstances": 4}],
            "tiers": ["iw-f"],
            "policyRef": {"name": "p"},
        },
    }
)


def ready_pod(name: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": LABELS},
        "spec": {"nodeName": "gpu-0"},
        "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]},
    }


def test_each_pods_projection_reaches_its_instance_view() -> None:
    pods = [ready_pod("a"), ready_pod("b")]
    sets = {"llama-us-east-a100": {"spec": {"replicas": 2}}}
    loads = {"a": PodLoad(0.5, 1000.0), "b": PodLoad(0.2, 1000.0)}
    hot = (1.0,) * 100
    snap = endpoint_snapshots(MD, "llm", sets, pods, loads, {}, projections={"a": hot})[
        EndpointKey("llama", "us-east")
    ]
    views = {v.name: v.projection for v in snap.instances}
    assert views == {"a": hot, "b": ()}  # a pod no router projects has no projection
    assert snap.observation(0.0).projections == (hot,)


def test_the_reader_rebuilds_projections_from_the_routers_quantiles() -> None:
    reader = PrometheusReader("http://prometheus.invalid")
    samples = [({"pod": "a", "quantile": f"{q / 10:g}"}, q / 10) for q in range(11)]
    samples += [({"pod": "b", "quantile": "1"}, float("nan")), ({"quantile": "1"}, 0.3)]
    reader.samples = lambda expr: samples  # type: ignore[method-assign]
    got = reader.pod_projections("llm")
    assert set(got) == {"a"}  # non-finite readings and unnamed pods are left out
    assert len(got["a"]) == 100 and max(got["a"]) == 1.0 and min(got["a"]) == 0.0
