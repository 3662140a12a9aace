"""The ScaledObject the operator owns for a pod set: rendered from the pod set and its plan."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from sageserve.keda.scaledobject import ScaledObjectSpec, fallback_replicas, render_scaled_object

BASE = ScaledObjectSpec(
    namespace="llm",
    model_deployment="llama",
    owner_uid="uid-1",
    region="us-east",
    variant="h100",
    pod_set="llama-us-east-h100",
    scaler_address="sageserve-scaler.ops.svc:9100",
    plan_replicas=3,
    min_replicas=0,
    max_replicas=8,
    failure_threshold=3,
    pace_seconds=15,
)


def test_a_pod_set_s_scaled_object_in_full() -> None:
    rules = {
        "stabilizationWindowSeconds": 0,
        "selectPolicy": "Max",
        "policies": [{"type": "Pods", "value": 8, "periodSeconds": 15}],
        "tolerance": "0",
    }
    assert render_scaled_object(BASE) == {
        "apiVersion": "keda.sh/v1alpha1",
        "kind": "ScaledObject",
        "metadata": {
            "name": "llama-us-east-h100",
            "namespace": "llm",
            "labels": {
                "app.kubernetes.io/managed-by": "sageserve",
                "sageserve.io/model-deployment": "llama",
                "sageserve.io/region": "us-east",
                "sageserve.io/variant": "h100",
            },
            "ownerReferences": [
                {
                    "apiVersion": "sageserve.io/v1alpha1",
                    "kind": "ModelDeployment",
                    "name": "llama",
                    "uid": "uid-1",
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": {
            "scaleTargetRef": {
                "apiVersion": "apps/v1",
                "kind": "Deployment",
                "name": "llama-us-east-h100",
            },
            "pollingInterval": 15,
            "cooldownPeriod": 15,
            "minReplicaCount": 0,
            "maxReplicaCount": 8,
            "fallback": {"failureThreshold": 3, "replicas": 3},
            "advanced": {
                "restoreToOriginalReplicaCount": False,
                "horizontalPodAutoscalerConfig": {
                    "name": "keda-hpa-llama-us-east-h100",
                    "behavior": {"scaleUp": rules, "scaleDown": rules},
                },
            },
            "triggers": [
                {
                    "type": "external",
                    "metricType": "AverageValue",
                    "metadata": {
                        "scalerAddress": "sageserve-scaler.ops.svc:9100",
                        "namespace": "llm",
                        "modelDeployment": "llama",
                        "region": "us-east",
                        "variant": "h100",
                        "podSet": "llama-us-east-h100",
                    },
                }
            ],
        },
    }


def spec_of(obj: dict[str, Any], *path: str) -> Any:
    for key in path:
        obj = obj[key]
    return obj


@pytest.mark.parametrize(
    ("change", "path", "expected"),
    [
        # the fallback is the plan in force, kept within what KEDA may size
        ({"plan_replicas": 5}, ("spec", "fallback", "replicas"), 5),
        ({"plan_replicas": 0}, ("spec", "fallback", "replicas"), 0),
        ({"plan_replicas": 12}, ("spec", "fallback", "replicas"), 8),
        ({"plan_replicas": 0, "min_replicas": 2}, ("spec", "fallback", "replicas"), 2),
        ({"min_replicas": 2}, ("spec", "minReplicaCount"), 2),
        ({"failure_threshold": 7}, ("spec", "fallback", "failureThreshold"), 7),
        ({"pace_seconds": 30}, ("spec", "pollingInterval"), 30),
        ({"pace_seconds": 30}, ("spec", "cooldownPeriod"), 30),
        (
            {"scaler_address": "127.0.0.1:50051"},
            ("spec", "triggers", 0, "metadata", "scalerAddress"),
            "127.0.0.1:50051",
        ),
        # one move may span the whole range: the decision step's holds are the limit
        (
            {"max_replicas": 40},
            (
                "spec",
                "advanced",
                "horizontalPodAutoscalerConfig",
                "behavior",
                "scaleDown",
                "policies",
            ),
            [{"type": "Pods", "value": 40, "periodSeconds": 15}],
        ),
        (
            {"max_replicas": 0},
            (
                "spec",
                "advanced",
                "horizontalPodAutoscalerConfig",
                "behavior",
                "scaleUp",
                "policies",
            ),
            [{"type": "Pods", "value": 1, "periodSeconds": 15}],
        ),
    ],
)
def test_each_field_follows_the_pod_set_and_its_plan(
    change: dict[str, Any], path: tuple[Any, ...], expected: Any
) -> None:
    assert spec_of(render_scaled_object(replace(BASE, **change)), *path) == expected


def test_without_the_owner_s_uid_no_owner_reference_is_written() -> None:
    assert "ownerReferences" not in render_scaled_object(replace(BASE, owner_uid=None))["metadata"]


def test_a_max_below_the_floor_is_refused_naming_the_pod_set() -> None:
    with pytest.raises(
        ValueError, match="llama-us-east-h100: maxReplicaCount 1 below minReplicaCount 2"
    ):
        render_scaled_object(replace(BASE, min_replicas=2, max_replicas=1))


def test_the_plan_is_read_back_from_the_fallback() -> None:
    assert fallback_replicas(render_scaled_object(BASE)) == 3
    assert fallback_replicas({"spec": {}}) is None
