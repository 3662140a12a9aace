"""The pace loop applies a decision as the simulator does: the chosen pod drains first."""

from __future__ import annotations

import logging
from typing import Any

from sageserve.controller.pace_loop import PacePass, PaceState
from sageserve.core.labels import ANNOTATION_DELETION_COST, DRAIN_DELETION_COST
from sageserve.core.snapshot import Decision
from sageserve.core.types import ActionKind, EndpointKey
from tests.test_parity_operator_simulator import NS, model_deployment


class RecordingKube:
    """Records the writes a pass makes (a stand-in at the adapter's edge)."""

    def __init__(self) -> None:
        self.writes: list[tuple[str, str, Any]] = []

    def annotate_pod(self, namespace: str, name: str, annotations: dict[str, str]) -> None:
        self.writes.append(("annotate", name, annotations))

    def set_replicas(
        self, namespace: str, observed: dict[str, Any], replicas: int, drop_scaling: bool = False
    ) -> None:
        self.writes.append(("scale", observed["metadata"]["name"], replicas))


def policy(dry_run: bool = False) -> dict[str, Any]:
    return {
        "apiVersion": "sageserve.io/v1alpha1",
        "kind": "ScalingPolicy",
        "metadata": {"name": "p", "namespace": NS, "generation": 1},
        "spec": {"strategy": "reactive", "dryRun": dry_run},
    }


def pod_set(name: str, replicas: int) -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": {"replicas": replicas}}


def test_scale_in_marks_the_chosen_pod_before_lowering_replicas() -> None:
    kube = RecordingKube()
    step = PacePass(kube, policy(), PaceState(), logging.getLogger("t"))  # type: ignore[arg-type]
    step.observed = {"llama-us-east-h100": pod_set("llama-us-east-h100", 3)}
    decision = Decision(
        EndpointKey("llama", "us-east"), ActionKind.SCALE_IN, 1, {"h100": 2}, "emu", ("h100-1",)
    )
    reason, message = step.act({}, model_deployment(), decision)
    assert kube.writes == [
        ("annotate", "h100-1", {ANNOTATION_DELETION_COST: str(DRAIN_DELETION_COST)}),
        ("scale", "llama-us-east-h100", 2),
    ]
    assert reason == "ScaledIn" and "draining h100-1" in message


def test_dry_run_writes_nothing() -> None:
    kube = RecordingKube()
    step = PacePass(kube, policy(True), PaceState(), logging.getLogger("t"))  # type: ignore[arg-type]
    decision = Decision(EndpointKey("llama", "us-east"), ActionKind.SCALE_OUT, 1, {"a100": 1}, "x")
    assert step.act({}, model_deployment(), decision)[0] == "DryRunScaledOut"
    assert kube.writes == []


def test_degraded_names_the_endpoint_and_how_many_pods_report() -> None:
    from sageserve.controller.pace_loop import degraded
    from sageserve.pace.step import Held

    key = EndpointKey("llama", "us-east")
    assert degraded([]) == (False, "MetricsAvailable", "every pod set reports its load")
    partial = Held(key, "2 of 3 report", 2, 3, since=0.0)
    status, reason, message = degraded([partial])
    assert (status, reason) == (True, "MetricsPartial")
    assert message == "no scale-in at llama/us-east: 2 of 3 pods reporting since 00:00:00Z"
    missing = Held(EndpointKey("llama", "us-west"), "none", 0, 2)
    status, reason, message = degraded([partial, missing])
    assert (status, reason) == (True, "MetricsMissing")
    assert "llama/us-west: none of 2 pods reports its load" in message
    assert "llama/us-east: 2 of 3 pods reporting" in message


def test_degraded_names_the_series_the_engine_should_export() -> None:
    """An SGLang deployment whose pods export nothing sageserve reads: the condition says
    which series was expected where (a wrong `spec.engine.kind` or scrape path shows)."""
    from sageserve.controller.pace_loop import degraded
    from sageserve.pace.step import Held

    key = EndpointKey("qwen", "us-east")
    expected = {key: "sglang:token_usage at /metrics"}
    _, reason, message = degraded([Held(key, "none", 0, 2)], expected)
    assert reason == "MetricsMissing"
    assert message == (
        "holding qwen/us-east: none of 2 pods reports its load (no sglang:token_usage at /metrics)"
    )
