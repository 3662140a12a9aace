"""The KEDA ScaledObject the operator owns for one pod set in `actuation: keda` (pure).

One ScaledObject per pod set (Deployment), named as the pod set, owned by its
ModelDeployment (garbage-collected with it). Its one `external` trigger dials the operator's
scaler (`keda.server`) with the pod set's coordinates; everything else is set so that KEDA's
HPA writes exactly what the decision step decided, no more and no later:

- the metric is the decided replicas with an AverageValue target of 1, so the HPA's
  desired replicas are the metric;
- `behavior`: no stabilization either way and policies that permit any move up to
  maxReplicaCount per period (the decision step already holds and cools down), and
  tolerance 0 so that a move of one replica among many is not swallowed by the HPA's
  default 10 % (HPAConfigurableTolerance, Kubernetes 1.33+; an API server without it drops
  the field and keeps its 10 %);
- `fallback.replicas` is the plan in force for the pod set, rewritten when it changes:
  after `failureThreshold` failed metric reads KEDA feeds it to the HPA, and while it is
  above 0 KEDA never scales the pod set to zero on a scaler error. (KEDA v2.20 counts no
  failed read while the scaler is unreachable, kedacore/keda#8056: with the operator
  down the HPA then keeps the pod set at its size; docs/keda.md);
- `restoreToOriginalReplicaCount: false`: deleting the ScaledObject (back to direct mode)
  leaves the replicas where they are, and direct writes resume from them;
- minReplicaCount 0 (KEDA scales to zero only when the scaler says inactive, i.e. the plan
  says 0), or the region's minInstances where the ModelDeployment has one variant (the
  floor is per endpoint; with several variants the decision step spreads it);
  maxReplicaCount the region's maxInstances.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sageserve.core.labels import (
    LABEL_DEPLOYMENT,
    LABEL_REGION,
    LABEL_VARIANT,
    MANAGED_BY,
    MANAGED_BY_LABEL,
)

API_VERSION = "keda.sh/v1alpha1"
KIND = "ScaledObject"
GROUP = "keda.sh"
VERSION = "v1alpha1"
PLURAL = "scaledobjects"
#: the CRD whose absence keeps a keda-mode policy from acting
CRD = f"{PLURAL}.{GROUP}"
#: how long each allowed move may take (seconds, the HPA's policy period)
POLICY_PERIOD_SECONDS = 15


@dataclass(frozen=True)
class ScaledObjectSpec:
    """Everything one pod set's ScaledObject is rendered from."""

    namespace: str
    model_deployment: str
    owner_uid: str | None
    region: str
    variant: str
    pod_set: str
    scaler_address: str
    #: the plan in force for the pod set (fallback.replicas)
    plan_replicas: int
    min_replicas: int
    max_replicas: int
    failure_threshold: int
    #: how often KEDA asks IsActive (its pollingInterval), and how long after the last
    #: active answer it scales to zero (cooldownPeriod): the pace interval
    pace_seconds: int


def hpa_name(scaled_object: str) -> str:
    """The HorizontalPodAutoscaler KEDA creates for a ScaledObject (its default name)."""
    return f"keda-hpa-{scaled_object}"


def _rules(max_replicas: int) -> dict[str, Any]:
    return {
        "stabilizationWindowSeconds": 0,
        "selectPolicy": "Max",
        "policies": [
            {"type": "Pods", "value": max(1, max_replicas), "periodSeconds": POLICY_PERIOD_SECONDS}
        ],
        "tolerance": "0",
    }


def render_scaled_object(spec: ScaledObjectSpec) -> dict[str, Any]:
    """The keda.sh/v1alpha1 ScaledObject sizing `spec.pod_set` (see the module doc)."""
    if spec.max_replicas < spec.min_replicas:
        raise ValueError(
            f"{spec.pod_set}: maxReplicaCount {spec.max_replicas} below minReplicaCount "
            f"{spec.min_replicas}"
        )
    fallback = min(max(spec.plan_replicas, spec.min_replicas), spec.max_replicas)
    metadata: dict[str, Any] = {
        "name": spec.pod_set,
        "namespace": spec.namespace,
        "labels": {
            MANAGED_BY_LABEL: MANAGED_BY,
            LABEL_DEPLOYMENT: spec.model_deployment,
            LABEL_REGION: spec.region,
            LABEL_VARIANT: spec.variant,
        },
    }
    if spec.owner_uid is not None:
        metadata["ownerReferences"] = [
            {
                "apiVersion": "sageserve.io/v1alpha1",
                "kind": "ModelDeployment",
                "name": spec.model_deployment,
                "uid": spec.owner_uid,
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ]
    return {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": metadata,
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": spec.pod_set},
            "pollingInterval": spec.pace_seconds,
            "cooldownPeriod": spec.pace_seconds,
            "minReplicaCount": spec.min_replicas,
            "maxReplicaCount": spec.max_replicas,
            "fallback": {"failureThreshold": spec.failure_threshold, "replicas": fallback},
            "advanced": {
                "restoreToOriginalReplicaCount": False,
                "horizontalPodAutoscalerConfig": {
                    "name": hpa_name(spec.pod_set),
                    "behavior": {
                        "scaleUp": _rules(spec.max_replicas),
                        "scaleDown": _rules(spec.max_replicas),
                    },
                },
            },
            "triggers": [
                {
                    "type": "external",
                    "metricType": "AverageValue",
                    "metadata": {
                        "scalerAddress": spec.scaler_address,
                        "namespace": spec.namespace,
                        "modelDeployment": spec.model_deployment,
                        "region": spec.region,
                        "variant": spec.variant,
                        "podSet": spec.pod_set,
                    },
                }
            ],
        },
    }


def fallback_replicas(scaled_object: dict[str, Any]) -> int | None:
    """The plan a ScaledObject carries (`spec.fallback.replicas`), None if it has none."""
    value = ((scaled_object.get("spec") or {}).get("fallback") or {}).get("replicas")
    return int(value) if isinstance(value, int) else None
