"""The pace pass's guard: which pod sets it must leave alone, which decisions it must not
send, and what it reports (the faults of `controller.faults`, docs/reliability.md).

Kept out of `pace_loop` so that the pass reads as observe → decide → act: the guard is
asked which endpoints someone else sizes (not paced) and which pods are stuck terminating
(the decision step holds a scale-in there: `EndpointSnapshot.stuck_terminating`), reports
what changed, and writes only the `sageserve.io/replicas` stamps of pod sets it adopts or follows.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from sageserve.api.model_deployment import ModelDeployment, pod_set_name
from sageserve.controller.faults import (
    HELD,
    Ownership,
    Sizing,
    StuckPod,
    UnplacedPod,
    overdue_pods,
    ownership,
    shortfall_message,
    unplaced_pods,
)
from sageserve.controller.kube import Kube, ReplicasMoved
from sageserve.core.labels import ANNOTATION_SCALING, SCALING_EXTERNAL, SCALING_RESUME
from sageserve.core.types import EndpointKey

Logger = logging.Logger | logging.LoggerAdapter[Any]
#: Conditions and Events are posted this callable's way: (type, status, reason, message).
ConditionFn = Callable[[str, bool, str, str], None]
EventFn = Callable[[dict[str, Any], str, str, str], None]


def report_after_s() -> float:
    """A stuck pod, an unplaced instance or an endpoint with some pods silent is reported
    once it has lasted this long (SAGESERVE_REPORT_AFTER_SECONDS, 60 s: past a normal
    drain, a spot reclaim, or a new pod's first scrape)."""
    return float(os.environ.get("SAGESERVE_REPORT_AFTER_SECONDS", "60"))


def dry_run(policy_dry_run: bool) -> bool:
    """Whether a pass may only report: the policy's `spec.dryRun`, or SAGESERVE_DRY_RUN
    (the chart's `dryRun` value), which overrides every policy for every writer (pod set
    sizes, pooled pod sets, spot nodes)."""
    forced = os.environ.get("SAGESERVE_DRY_RUN", "false").lower() == "true"
    return forced or policy_dry_run


@dataclass
class Guard:
    """What one pass found around its pod sets."""

    namespace: str
    owned: dict[str, Ownership]
    stuck: list[StuckPod]
    unplaced: list[UnplacedPod]
    #: whether the policy's actuation is keda: its KEDA-sized pod sets are paced (their
    #: decisions go to the scaler); in direct mode they are held until taken back
    keda: bool = False

    @classmethod
    def observe(
        cls,
        namespace: str,
        pod_sets: Mapping[str, Mapping[str, Mapping[str, Any]]],
        pods: Iterable[Mapping[str, Any]],
        now: float,
        keda: bool = False,
    ) -> Guard:
        owned = {name: ownership(d) for sets in pod_sets.values() for name, d in sets.items()}
        listed = list(pods)
        return cls(namespace, owned, overdue_pods(listed, now), unplaced_pods(listed, now), keda)

    def is_held(self, own: Ownership) -> bool:
        """Whether the pass leaves this pod set alone: someone else sizes it, or KEDA still
        does while the policy is back in direct mode (until it is taken back)."""
        return own.sizing in HELD or (own.sizing is Sizing.KEDA and not self.keda)

    def held(self, md: ModelDeployment, region: str) -> list[Ownership]:
        """The pod sets of (md, region) someone else sizes: its endpoint is not paced."""
        names = (pod_set_name(md.metadata.name, region, v.name) for v in md.spec.variants)
        return [o for n in names if (o := self.owned.get(n)) and self.is_held(o)]

    def stuck_at(self, key: EndpointKey) -> list[StuckPod]:
        return [s for s in self.stuck if (s.model, s.region) == (key.model, key.region)]

    def settle(self, kube: Kube, observed: Mapping[str, dict[str, Any]], log: Logger) -> None:
        """Stamp the pod sets adopted, taken back or followed (one JSON patch each, which
        fails rather than overwrite a count written since it was read)."""
        for name, own in self.owned.items():
            if not own.needs_stamp or name not in observed:
                continue
            try:
                kube.set_replicas(
                    self.namespace,
                    observed[name],
                    own.replicas,
                    drop_scaling=own.sizing is Sizing.RESUME,
                )
            except ReplicasMoved:
                log.info("pod set %s changed while being stamped; next pass", name)


@dataclass
class FaultReport:
    """Conditions and Events for a pass's guard, each posted once per transition."""

    condition: ConditionFn
    event: EventFn
    #: keys of the faults already posted as Events (kept by the caller between passes)
    seen: set[str] = field(default_factory=set)
    #: `{pod set: [autoscaler]}` of the namespace, asked only when a conflict is new
    autoscalers: Callable[[], Mapping[str, list[str]]] = dict
    #: keys of the faults of this pass
    now: set[str] = field(default_factory=set)

    def post(
        self, guard: Guard, owners: Mapping[str, dict[str, Any]], conditions: set[str]
    ) -> None:
        """Report `guard`; `owners[model]` is the ModelDeployment's body (Events go there),
        `conditions` the condition types the policy already has."""
        self.now = set()
        self._sizing(guard, owners, conditions)
        self._stuck(guard, owners, conditions)
        self._unplaced(guard, owners, conditions)
        self.seen &= self.now  # a fault that ended and comes back is reported again

    def _new(self, key: str) -> bool:
        """Whether the fault `key` is new (not posted yet); it is remembered either way."""
        self.now.add(key)
        fresh = key not in self.seen
        self.seen.add(key)
        return fresh

    def _set(self, conditions: set[str], type_: str, bad: bool, reason: str, msg: str) -> None:
        # a condition that was never bad is only written once something is wrong: no
        # "all is well" Event for each new type on every policy at start-up
        if bad or type_ in conditions:
            self.condition(type_, bad, reason, msg)

    def _sizing(
        self, guard: Guard, owners: Mapping[str, dict[str, Any]], conditions: set[str]
    ) -> None:
        problems, handed, through_keda = [], [], []
        for name, own in sorted(guard.owned.items()):
            body = owners.get(own.model)
            if own.sizing is Sizing.CONFLICT:
                problems.append(conflict_message(own, guard.namespace))
                if self._new(f"conflict/{name}/{own.replicas}/{own.others[0].manager}"):
                    self._conflict_events(own, body, guard.namespace)
            elif own.sizing is Sizing.UNKNOWN:
                problems.append(held_message(own, guard.namespace))
            elif own.sizing is Sizing.KEDA:
                through_keda.append(name)
            elif own.sizing is Sizing.HANDED_OVER:
                handed.append(name)
                if self._new(f"handed/{name}") and body is not None:
                    message = (
                        f"pod set {name} handed over ({ANNOTATION_SCALING}={SCALING_EXTERNAL})"
                    )
                    self.event(body, "Normal", "HandedOver", message)
            elif (
                own.sizing is Sizing.RESUME
                and self._new(f"resume/{name}/{own.replicas}")
                and body is not None
            ):
                message = f"pod set {name} taken back at {own.replicas} replica(s)"
                self.event(body, "Normal", "TookBack", message)
        if problems:
            self.condition("Conflict", True, "ReplicasWrittenElsewhere", "; ".join(problems))
        elif handed:
            message = "handed over, not sized by sageserve: " + ", ".join(handed)
            self._set(conditions, "Conflict", False, "HandedOver", message)
        else:
            message = "sageserve alone sizes its pod sets"
            if through_keda:
                message += f" ({len(through_keda)} through the HPA of its KEDA ScaledObject)"
            self._set(conditions, "Conflict", False, "SoleWriter", message)

    def _conflict_events(self, own: Ownership, body: dict[str, Any] | None, ns: str) -> None:
        """A Warning on the ModelDeployment and on the pod set (where the other writer
        acted, so `kubectl describe deployment` shows it too)."""
        message = conflict_message(own, ns)
        scalers = self.autoscalers().get(own.pod_set) or []
        if scalers:
            message += f"; autoscaler(s) targeting it: {', '.join(scalers)}"
        deployment = {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": own.pod_set, "namespace": ns},
        }
        for obj in (body, deployment):
            if obj is not None:
                self.event(obj, "Warning", "ReplicasConflict", message)

    def _stuck(
        self, guard: Guard, owners: Mapping[str, dict[str, Any]], conditions: set[str]
    ) -> None:
        late = [s for s in guard.stuck if s.overdue_s >= report_after_s()]
        messages = [
            f"{s.model}/{s.region}: {s.describe()}; no further scale-in there" for s in late
        ]
        for s, message in zip(late, messages, strict=True):
            body = owners.get(s.model)
            if self._new(f"stuck/{s.name}") and body is not None:
                self.event(body, "Warning", "TerminationStuck", message)
        if late:
            self.condition("TerminationStuck", True, "PodsNotGone", "; ".join(messages))
        else:
            message = "no pod is stuck terminating"
            self._set(conditions, "TerminationStuck", False, "NoneStuck", message)

    def _unplaced(
        self, guard: Guard, owners: Mapping[str, dict[str, Any]], conditions: set[str]
    ) -> None:
        late = [u for u in guard.unplaced if u.waiting_s >= report_after_s()]
        for model, region in sorted({(u.model, u.region) for u in late}):
            body = owners.get(model)
            if self._new(f"unplaced/{model}/{region}") and body is not None:
                mine = [u for u in late if (u.model, u.region) == (model, region)]
                self.event(body, "Warning", "CapacityShortfall", shortfall_message(mine))
        if late:
            self.condition("CapacityShortfall", True, "Unschedulable", shortfall_message(late))
        else:
            message = "every instance is placed"
            self._set(conditions, "CapacityShortfall", False, "AllPlaced", message)


def held_message(own: Ownership, namespace: str) -> str:
    """Why a pod set in `HELD` is left at its size, for a person to read."""
    if own.sizing is Sizing.CONFLICT:
        return conflict_message(own, namespace)
    if own.sizing is Sizing.HANDED_OVER:
        return (
            f"pod set {own.pod_set} is handed over ({ANNOTATION_SCALING}={SCALING_EXTERNAL}); "
            f"to let sageserve size it again: {ANNOTATION_SCALING}={SCALING_RESUME}"
        )
    return (
        f"pod set {own.pod_set}: {ANNOTATION_SCALING}={own.annotation!r} is not understood "
        f"(use {SCALING_EXTERNAL} or {SCALING_RESUME}); holding it"
    )


def conflict_message(own: Ownership, namespace: str) -> str:
    """What a person reads: who wrote what, that sageserve holds, the two ways out."""
    writer = own.others[0] if own.others else "another writer"
    annotate = f"kubectl annotate deployment {own.pod_set} -n {namespace} {ANNOTATION_SCALING}="
    return (
        f"pod set {own.pod_set}: replicas {own.replicas} written by {writer}, not by "
        f"sageserve (it set {own.stamped}); sageserve holds it. Hand it over: "
        f"{annotate}{SCALING_EXTERNAL}; or take it back at its size: {annotate}{SCALING_RESUME}"
    )
