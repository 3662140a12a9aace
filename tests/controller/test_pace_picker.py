"""The pace loop says which InferencePools the endpoint picker is silent on, naming the
series it expected, rather than pacing those endpoints on a reading of zero."""

from __future__ import annotations

import logging
from typing import Any

from sageserve.controller.guard import Guard
from sageserve.controller.pace_loop import Observed, PacePass, PaceState
from sageserve.core.snapshot import EndpointSnapshot, PickerSignals
from sageserve.core.types import EndpointKey
from tests.test_parity_operator_simulator import NS, model_deployment


class ConditionKube:
    """Records the Events and status writes of a pass (a stand-in at the adapter's edge)."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str, str]] = []
        self.status: list[dict[str, Any]] = []

    def event(self, obj: dict[str, Any], type_: str, reason: str, message: str) -> None:
        self.events.append((type_, reason, message))

    def patch_status(self, namespace: str, plural: str, name: str, body: dict[str, Any]) -> None:
        self.status.append(body)


def policy(picker: str) -> dict[str, Any]:
    return {
        "apiVersion": "sageserve.io/v1alpha1",
        "kind": "ScalingPolicy",
        "metadata": {"name": "p", "namespace": NS, "generation": 1},
        "spec": {"strategy": "reactive", "signals": {"endpointPicker": picker}},
    }


def observed(picker: PickerSignals | None) -> Observed:
    key = EndpointKey("llama", "us-east")
    snap = EndpointSnapshot(key, 0, 8, {"h100": 2}, 2, variants=("h100",), picker=picker)
    seen = Observed(Guard.observe(NS, {}, [], 0.0))
    seen.endpoints[key] = snap
    return seen


def run(picker: str, seen: Observed, read: dict[str, PickerSignals] | None) -> ConditionKube:
    kube = ConditionKube()
    step = PacePass(kube, policy(picker), PaceState(), logging.getLogger("t"))  # type: ignore[arg-type]
    md = model_deployment()
    step.report_picker([({}, md)], seen, read)
    return kube


def test_a_pool_the_picker_is_silent_on_is_named_with_the_series_expected() -> None:
    kube = run("gaie", observed(None), {})
    [(type_, reason, message)] = kube.events
    assert (type_, reason) == ("Warning", "PickerMetricsMissing")
    assert "inference_pool_average_queue_size{name=...}" in message
    assert "inference_pool_ready_pods" in message
    assert "InferencePool(s) llama-us-east" in message  # <ModelDeployment>-<region>
    assert "spec.regions[].inferencePool" in message
    [condition] = kube.status[-1]["conditions"]
    assert (condition["type"], condition["status"]) == ("PickerSignals", "False")


def test_a_pool_named_in_the_model_deployment_is_the_one_expected() -> None:
    kube = ConditionKube()
    step = PacePass(kube, policy("llm-d"), PaceState(), logging.getLogger("t"))  # type: ignore[arg-type]
    md = model_deployment()
    md.spec.regions[0].inference_pool = "llama-east-pool"
    step.report_picker([({}, md)], observed(None), {})
    [(_, _, message)] = kube.events
    assert "InferencePool(s) llama-east-pool" in message
    assert "llm_d_epp_average_queue_size" in message


def test_every_pool_reported_is_said_once_and_no_picker_says_nothing() -> None:
    kube = run("llm-d", observed(PickerSignals(3, 0.5, 4)), {"llama-us-east": PickerSignals(3)})
    assert [(t, r) for t, r, _ in kube.events] == [("Normal", "Reported")]
    assert run("none", observed(None), None).events == []


def test_nothing_paced_yet_is_no_report_that_every_pool_is_heard() -> None:
    """Before a region has a pod set, no pool is paced: saying the picker reports every
    paced pool would be True of nothing, and flip to missing once the pods come."""
    empty = Observed(Guard.observe(NS, {}, [], 0.0))
    kube = run("gaie", empty, {})
    assert kube.events == [] and kube.status == []
