"""The accelerated clock, and which pods the twin counts as serving."""

from __future__ import annotations

import pytest

from sageserve.twin.clock import AcceleratedClock, ManualClock
from sageserve.twin.pods import pod_info
from tests.twin.helpers import A100, api_pod


class Wall:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_accelerated_clock_runs_speed_times_faster_than_the_wall() -> None:
    wall = Wall()
    clock = AcceleratedClock(speed=60, start=3600, wall=wall)
    assert clock.now() == 3600
    wall.t += 2
    assert clock.now() == 3600 + 120


def test_changing_speed_keeps_time_continuous() -> None:
    wall = Wall()
    clock = AcceleratedClock(speed=10, wall=wall)
    wall.t += 1
    clock.set_speed(1)
    assert clock.now() == 10
    wall.t += 5
    assert clock.now() == 15


@pytest.mark.parametrize("speed", [0, -1])
def test_a_clock_refuses_a_speed_that_is_not_positive(speed: float) -> None:
    with pytest.raises(ValueError, match="positive"):
        AcceleratedClock(speed=speed)


def test_manual_clock_moves_only_when_told() -> None:
    clock = ManualClock(5)
    assert clock.now() == 5
    assert clock.advance(2.5) == 7.5 == clock.now()


def test_a_running_pod_on_a_node_serves_with_its_gpus_and_model_name() -> None:
    info = pod_info(api_pod())
    assert info is not None
    assert info.serving
    assert info.endpoint == ("llm", "bloom-176b", "us-east")
    assert (info.variant, info.gpu_type, info.gpus) == ("a100", A100, 8)
    assert info.model_name == "bloom"
    assert info.node == "gpu-us-east-a100-serving-0"


@pytest.mark.parametrize(
    "pod",
    [
        api_pod(phase="Pending", node=None),
        api_pod(phase="Pending"),  # bound, container not started
        api_pod(deleting=True),  # terminating: no new requests
        api_pod(phase="Succeeded"),
    ],
    ids=["unscheduled", "bound-pending", "terminating", "finished"],
)
def test_pods_that_are_not_running_do_not_serve(pod: dict[str, object]) -> None:
    info = pod_info(pod)
    assert info is not None
    assert not info.serving


def test_pods_of_other_workloads_are_ignored() -> None:
    assert pod_info(api_pod(labels={"app": "spot-batch"})) is None
    assert pod_info(api_pod(labels={"app.kubernetes.io/managed-by": "sageserve"})) is None


def test_max_model_len_is_read_from_the_server_arguments() -> None:
    from sageserve.twin.pods import pod_info
    from tests.twin.helpers import api_pod

    raw = api_pod()
    assert pod_info(raw) is not None and pod_info(raw).max_model_len is None  # type: ignore[union-attr]
    raw["spec"]["containers"][0]["args"] += ["--max-model-len", "4096"]
    assert pod_info(raw).max_model_len == 4096  # type: ignore[union-attr]


def test_tensor_and_pipeline_parallel_sizes_are_read_from_the_server_arguments() -> None:
    """Both spellings (`--tensor-parallel-size 4`, `-tp=8`); the last occurrence wins, as
    in argparse, so `spec.engine.args` override what the pod set renders."""
    from sageserve.twin.pods import pod_info
    from tests.twin.helpers import api_pod

    raw = api_pod()
    info = pod_info(raw)
    assert info is not None and (info.tensor_parallel, info.pipeline_parallel) == (None, None)
    raw["spec"]["containers"][0]["args"] += [
        "--tensor-parallel-size",
        "4",
        "--pipeline-parallel-size",
        "2",
    ]
    info = pod_info(raw)
    assert info is not None and (info.tensor_parallel, info.pipeline_parallel) == (4, 2)
    raw["spec"]["containers"][0]["args"] += ["-tp=8", "-pp", "1"]
    info = pod_info(raw)
    assert info is not None and (info.tensor_parallel, info.pipeline_parallel) == (8, 1)


def test_the_context_length_of_a_model_deployment_reaches_the_pods_and_the_twin() -> None:
    """spec.model.contextLength → vLLM's --max-model-len on the pod set → the twin's limit;
    an explicit --max-model-len in spec.engine.args comes later and wins, as in argparse."""
    from pathlib import Path

    import yaml

    from sageserve.api.model_deployment import ModelDeployment
    from sageserve.controller.podset import render_pod_set

    root = Path(__file__).resolve().parents[2]
    md = ModelDeployment.model_validate(
        next(iter(yaml.safe_load_all((root / "scenarios/default/models.yaml").read_text())))
    )
    md.spec.model.context_length = 2048

    def pod_of(md: ModelDeployment) -> dict[str, object]:
        d = render_pod_set(md, md.spec.regions[0], md.spec.variants[0], 1, "llm")
        template = d["spec"]["template"]
        return {
            "metadata": {"name": "p", "namespace": "llm", **template["metadata"]},
            "spec": {**template["spec"], "nodeName": "n"},
            "status": {"phase": "Running"},
        }

    info = pod_info(pod_of(md))
    assert info is not None and info.max_model_len == 2048
    md.spec.engine.args = ["--max-model-len=1024"]
    info = pod_info(pod_of(md))
    assert info is not None and info.max_model_len == 1024
    md.spec.model.context_length = None
    md.spec.engine.args = []
    info = pod_info(pod_of(md))
    assert info is not None and info.max_model_len is None  # the profile's then applies
