"""Shared pieces of the twin's unit tests: pods and a steady synthetic trace."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from typing import Any

from sageserve.perf.model import load_catalog
from sageserve.sim.traces import TraceRow
from sageserve.twin.load import LoadControl, PerfResolver, TwinSim
from sageserve.twin.pods import PodInfo

A100 = "NVIDIA-A100-SXM4-80GB"
CATALOG = load_catalog()


def pod(
    name: str, serving: bool = True, region: str = "us-east", md: str = "bloom-176b"
) -> PodInfo:
    return PodInfo(
        namespace="llm",
        name=name,
        model_deployment=md,
        region=region,
        variant="a100",
        phase="Running" if serving else "Pending",
        serving=serving,
        node="gpu-0" if serving else "",
        gpu_type=A100,
        gpus=8,
        model_name="bigscience/bloom",
    )


def pending(p: PodInfo) -> PodInfo:
    return replace(p, phase="Pending", serving=False, node="")


def steady(gap: float = 1.0, prompt: int = 600, output: int = 150):  # type: ignore[no-untyped-def]
    """A trace of one request every `gap` seconds, from `start` on, without end."""

    def rows(start: float, seed: int) -> Iterator[TraceRow]:
        k = int(start // gap) + 1
        while True:
            yield TraceRow(k * gap, 0, prompt, output)
            k += 1

    return rows


def sim(load: float = 1.0, gap: float = 1.0, **kw: Any) -> TwinSim:
    return TwinSim(steady(gap), PerfResolver(CATALOG).resolve, LoadControl(scale=load), **kw)


def api_pod(
    name: str = "bloom-176b-us-east-a100-abc",
    phase: str = "Running",
    node: str | None = "gpu-us-east-a100-serving-0",
    deleting: bool = False,
    labels: dict[str, str] | None = None,
) -> dict[str, Any]:
    """A pod as the API server returns it for a pod set rendered by controller.podset."""
    meta: dict[str, Any] = {
        "name": name,
        "namespace": "llm",
        "labels": labels
        if labels is not None
        else {
            "app.kubernetes.io/managed-by": "sageserve",
            "sageserve.io/model-deployment": "bloom-176b",
            "sageserve.io/region": "us-east",
            "sageserve.io/variant": "a100",
        },
    }
    if deleting:
        meta["deletionTimestamp"] = "2025-01-01T00:00:00Z"
    spec: dict[str, Any] = {
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {
                            "matchExpressions": [
                                {"key": "topology.kubernetes.io/region", "values": ["us-east"]},
                                {"key": "nvidia.com/gpu.product", "values": [A100]},
                                {"key": "sageserve.io/pool", "values": ["serving"]},
                            ]
                        }
                    ]
                }
            }
        },
        "containers": [
            {
                "name": "vllm",
                "args": ["--model", "bigscience/bloom", "--served-model-name", "bloom"],
                "resources": {"limits": {"nvidia.com/gpu": "8"}},
            }
        ],
    }
    if node:
        spec["nodeName"] = node
    return {"metadata": meta, "spec": spec, "status": {"phase": phase}}
