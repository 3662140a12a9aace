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
