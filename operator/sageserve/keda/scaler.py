"""What the external scaler answers for a pod set, from the decisions the pace loop records.

The pace loop's decision step computes each pod set's replicas once; in `actuation: keda`
it records them here (`DecisionBoard.record`) instead of writing `spec.replicas`, and the
gRPC server (`keda.server`) reads them back for KEDA. Nothing here decides anything:

- the metric (`GetMetrics`) is the recorded replicas of the pod set, exactly what direct
  mode would have written; with KEDA's target of 1 per replica (`METRIC_TARGET`,
  `AverageValue`), the HPA's desired replicas equal it;
- before the loop recorded anything for a pod set (the operator just started, or this
  replica is not the leader), the answer is the plan the leader last wrote into the pod
  set's ScaledObject (`fallback.replicas`), else the pod set's current replicas: taking
  over causes no jump;
- `IsActive` is True while the pod set should have instances: its replicas above 0, or,
  for an endpoint with nothing decided above 0 yet, requests the router holds for it or
  batch work whose deadlines need more than the model serves (on the endpoint's first
  variant, the one a model coming back from zero starts on). False lets KEDA scale the pod
  set to zero, which then happens only where the plan says 0.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from sageserve.api.model_deployment import pod_set_name

#: The one metric each ScaledObject's trigger gets (KEDA prefixes it with `s0-`).
METRIC_NAME = "sageserve-desired-replicas"
#: Replicas per unit of the metric: with an AverageValue target of 1 the HPA's desired
#: replicas are the metric itself.
METRIC_TARGET = 1
#: The trigger metadata keys the scaler reads, each required (KEDA passes the trigger's
#: metadata as ScaledObjectRef.scalerMetadata; scalerAddress is KEDA's own).
METADATA_KEYS = ("namespace", "modelDeployment", "region", "variant", "podSet")
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")


class BadRequest(ValueError):
    """A request the scaler cannot answer because of what it asked (gRPC INVALID_ARGUMENT)."""


class UnknownPodSet(LookupError):
    """A request naming a pod set sageserve does not know (gRPC NOT_FOUND)."""


@dataclass(frozen=True)
class PodSetRef:
    """The pod set a ScaledObject's trigger names."""

    namespace: str
    model_deployment: str
    region: str
    variant: str
    pod_set: str


def parse_ref(metadata: Mapping[str, str], so_namespace: str) -> PodSetRef:
    """The pod set of a ScaledObjectRef's scalerMetadata; `BadRequest` naming the field
    and what it must be otherwise."""
    values = {}
    for key in METADATA_KEYS:
        value = metadata.get(key, "")
        if not value:
            raise BadRequest(
                f"scalerMetadata.{key}: missing; the ScaledObject's trigger must set "
                f"{', '.join(METADATA_KEYS)} (sageserve writes them on the ScaledObjects it owns)"
            )
        if len(value) > 253 or not _NAME.match(value):
            raise BadRequest(f"scalerMetadata.{key}: {value[:80]!r} is not a Kubernetes name")
        values[key] = value
    if so_namespace and values["namespace"] != so_namespace:
        raise BadRequest(
            f"scalerMetadata.namespace: {values['namespace']!r} is not the ScaledObject's "
            f"namespace {so_namespace!r}; a ScaledObject sizes pod sets of its own namespace"
        )
    expected = pod_set_name(values["modelDeployment"], values["region"], values["variant"])
    if values["podSet"] != expected:
        raise BadRequest(
            f"scalerMetadata.podSet: {values['podSet']!r} is not the pod set of "
            f"modelDeployment/region/variant ({expected!r})"
        )
    return PodSetRef(
        values["namespace"],
        values["modelDeployment"],
        values["region"],
        values["variant"],
        values["podSet"],
    )


@dataclass(frozen=True)
class Desired:
    """One pod set's recorded decision and the demand that keeps it active."""

    replicas: int
    #: requests the router holds for the endpoint (nothing serving there)
    held_requests: int = 0
    #: the model's batch deadlines need more than what serves it
    deadline_pressure: bool = False
    #: whether the pod set is its endpoint's first variant (where a model comes back from
    #: zero) and no variant of the endpoint is decided above 0
    wakes_endpoint: bool = False


def is_active(desired: Desired) -> bool:
    """KEDA's activity: False only where the plan says 0 and no demand waits for it."""
    if desired.replicas > 0:
        return True
    return desired.wakes_endpoint and (desired.held_requests > 0 or desired.deadline_pressure)


def metric_value(desired: Desired) -> int:
    """The metric KEDA's HPA reads: the decided replicas (target 1 per replica)."""
    return max(0, desired.replicas)


#: (namespace, pod set) → replicas, where no decision is recorded: the ScaledObject's
#: fallback.replicas, else the Deployment's spec.replicas; None when there is no such pod set
Lookup = Callable[[str, str], int | None]


class DecisionBoard:
    """The pace loop's decisions per pod set, read by the gRPC server (thread-safe: the
    loop writes on its thread, the server reads on its workers)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._desired: dict[tuple[str, str], Desired] = {}

    def record(self, namespace: str, pod_sets: Mapping[str, Desired]) -> None:
        """Record the decisions of one pace pass for `pod_sets` of `namespace`."""
        with self._lock:
            for name, desired in pod_sets.items():
                self._desired[(namespace, name)] = desired

    def forget(self, namespace: str, pod_sets: set[str] | None = None) -> None:
        """Drop the records of `pod_sets` (all of `namespace` when None): a policy back in
        direct mode, a pod set gone."""
        with self._lock:
            for key in list(self._desired):
                if key[0] == namespace and (pod_sets is None or key[1] in pod_sets):
                    del self._desired[key]

    def get(self, namespace: str, pod_set: str) -> Desired | None:
        with self._lock:
            return self._desired.get((namespace, pod_set))

    def answer(self, ref: PodSetRef, lookup: Lookup) -> Desired:
        """What to tell KEDA about `ref`: the recorded decision, else (none recorded yet)
        the replicas `lookup` finds, which keeps the pod set where it is; `UnknownPodSet`
        when neither knows it."""
        recorded = self.get(ref.namespace, ref.pod_set)
        if recorded is not None:
            return recorded
        current = lookup(ref.namespace, ref.pod_set)
        if current is None:
            raise UnknownPodSet(
                f"scalerMetadata.podSet: no pod set {ref.pod_set!r} in namespace "
                f"{ref.namespace!r} (ModelDeployment {ref.model_deployment!r}, region "
                f"{ref.region!r}, variant {ref.variant!r})"
            )
        return Desired(current)


#: The operator's board: its pace loop records, its scaler server reads.
BOARD = DecisionBoard()
