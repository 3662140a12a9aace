"""Status of a ModelDeployment, computed from what is in the cluster (pure).

Conditions follow `metav1.Condition`: the transition time only moves when the status
does, so `kubectl get` shows how long an object has been (not) Ready.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

from sageserve.controller.semantics import SemanticProblem
from sageserve.core.labels import LABEL_REGION, LABEL_VARIANT


def essence(obj: Mapping[str, Any]) -> dict[str, Any]:
    """An object's apiVersion, kind, metadata and spec: what its pydantic model validates
    (the status is the operator's own)."""
    return {k: obj[k] for k in ("apiVersion", "kind", "metadata", "spec") if k in obj}


def is_ready(obj: Mapping[str, Any]) -> bool:
    """Whether the object's `Ready` condition is True (pods and sageserve objects alike)."""
    conditions = (obj.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def is_refused(obj: Mapping[str, Any]) -> bool:
    """Whether the object's `Ready` condition is False: the operator found it cannot act on
    it (an object with no `Ready` condition yet has not been looked at)."""
    conditions = (obj.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "False" for c in conditions)


def set_condition(
    conditions: Sequence[Mapping[str, Any]],
    type_: str,
    status: bool,
    reason: str,
    message: str,
    now: datetime,
    generation: int | None = None,
) -> list[dict[str, Any]]:
    """`conditions` with `type_` set; other types are kept as they are."""
    value = "True" if status else "False"
    out = [dict(c) for c in conditions if c.get("type") != type_]
    previous = next((c for c in conditions if c.get("type") == type_), None)
    moved = previous is None or previous.get("status") != value
    condition: dict[str, Any] = {
        "type": type_,
        "status": value,
        "reason": reason,
        "message": message,
        "lastTransitionTime": now.isoformat().replace("+00:00", "Z")
        if moved
        else previous["lastTransitionTime"],  # type: ignore[index]
    }
    if generation is not None:
        condition["observedGeneration"] = generation
    out.append(condition)
    return sorted(out, key=lambda c: str(c["type"]))


def pod_set_status(
    deployments: Iterable[Mapping[str, Any]], gpu_types: Mapping[str, str]
) -> list[dict[str, Any]]:
    """`status.podSets` from the Deployments in the cluster; `gpu_types[variant]`."""
    out = []
    for d in deployments:
        labels = d["metadata"].get("labels", {})
        variant = labels.get(LABEL_VARIANT, "")
        replicas = int(d.get("spec", {}).get("replicas") or 0)
        out.append(
            {
                "name": d["metadata"]["name"],
                "region": labels.get(LABEL_REGION, ""),
                "variant": variant,
                "gpuType": gpu_types.get(variant, ""),
                "replicas": replicas,
                "readyReplicas": int(d.get("status", {}).get("readyReplicas") or 0),
                "target": replicas,
            }
        )
    return sorted(out, key=lambda p: p["name"])


def model_deployment_status(
    previous: Mapping[str, Any],
    deployments: Iterable[Mapping[str, Any]],
    gpu_types: Mapping[str, str],
    problems: Sequence[SemanticProblem],
    now: datetime,
    generation: int | None,
) -> dict[str, Any]:
    """The whole `status` of a ModelDeployment after one reconcile."""
    conditions = previous.get("conditions", [])
    if problems:
        message = "; ".join(p.message for p in problems)
        conditions = set_condition(
            conditions, "Ready", False, problems[0].reason, message, now, generation
        )
        return {"observedGeneration": generation, "conditions": conditions}
    pod_sets = pod_set_status(deployments, gpu_types)
    ready = sum(p["readyReplicas"] for p in pod_sets)
    wanted = sum(p["replicas"] for p in pod_sets)
    message = f"{len(pod_sets)} pod set(s), {ready}/{wanted} instance(s) ready"
    conditions = set_condition(
        conditions, "Ready", True, "PodSetsApplied", message, now, generation
    )
    return {
        "observedGeneration": generation,
        "conditions": conditions,
        "instances": wanted,
        "targetInstances": sum(p["target"] for p in pod_sets),
        "podSets": pod_sets,
    }


def covers(actual: Any, wanted: Any, *, absent_is_false: bool = False) -> bool:
    """Whether every field of `wanted` has its value in `actual` (server defaults aside):
    what the operator applied is still there, so applying it again would change nothing.

    `absent_is_false`: a wanted `false` is also met by an absent field. KEDA writes its
    ScaledObjects back from Go structs whose booleans are `omitempty` (adding its finalizer
    drops `restoreToOriginalReplicaCount: false`), and false is the default those fields read
    as; without this every pass would apply the ScaledObject again and KEDA would drop it
    again."""
    if isinstance(wanted, Mapping):
        return isinstance(actual, Mapping) and all(
            covers(actual[k], v, absent_is_false=absent_is_false)
            if k in actual
            else (absent_is_false and v is False)
            for k, v in wanted.items()
        )
    if isinstance(wanted, list):
        return (
            isinstance(actual, list)
            and len(actual) == len(wanted)
            and all(
                covers(a, w, absent_is_false=absent_is_false)
                for a, w in zip(actual, wanted, strict=True)
            )
        )
    return bool(actual == wanted)
