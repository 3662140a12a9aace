"""Who writes the replicas the pace pass decides: the operator (`direct`) or KEDA (`keda`).

In keda mode the pace pass decides as in direct mode, then, instead of patching replicas:

1. records each paced pod set's decided replicas (and the demand that keeps it active) on
   the board the gRPC scaler answers KEDA from (`keda.scaler.DecisionBoard`), seeded with
   the pod set's current replicas before any decision, so handing over causes no jump;
2. marks each such pod set `sageserve.io/actuation: keda` (the writes of its HPA are then
   sanctioned, not a conflict: `controller.faults`) and server-side-applies its
   ScaledObject (`keda.scaledobject`), whose fallback carries the plan in force;
3. deletes the ScaledObjects of pod sets it no longer paces (handed over, held).

Back in direct mode it deletes the ScaledObjects of the policy's pod sets (their
`restoreToOriginalReplicaCount: false` leaves the replicas where they are), and once a pod
set's ScaledObject is gone takes it back at its current size (stamp, annotation removed),
so direct writes resume from there. Without KEDA's CRD a keda-mode policy says so in its
`Actuation` condition and nothing is written: it never falls back to direct silently.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from sageserve.api.model_deployment import ModelDeployment, pod_set_name
from sageserve.api.scaling_policy import ScalingPolicy
from sageserve.controller.faults import Sizing
from sageserve.controller.guard import Guard
from sageserve.controller.kube import KedaUnavailable, Kube, ReplicasMoved
from sageserve.controller.status import covers
from sageserve.core.labels import ACTUATION_KEDA, ANNOTATION_ACTUATION, LABEL_DEPLOYMENT
from sageserve.keda.scaledobject import ScaledObjectSpec, hpa_name, render_scaled_object
from sageserve.keda.scaler import DecisionBoard, Desired
from sageserve.metrics.prometheus import Series
from sageserve.pace.pressure import batch_capacity_tps

Logger = logging.Logger | logging.LoggerAdapter[Any]
ConditionFn = Callable[[str, bool, str, str], None]
EventFn = Callable[[dict[str, Any], str, str, str], None]
CONDITION = "Actuation"
#: ScaledObjects named in the condition's message, at most (the rest are counted)
NAMED = 20


def scaler_address(policy: ScalingPolicy) -> str | None:
    """The address KEDA dials: the policy's `spec.keda.scalerAddress`, else the operator's
    --scaler-address (SAGESERVE_SCALER_ADDRESS)."""
    return policy.spec.keda.scaler_address or os.environ.get("SAGESERVE_SCALER_ADDRESS") or None


def deadline_pressure(
    need_tps: float, serving: int, theta_tps: float, release_below: float
) -> bool:
    """Whether a model's batch deadlines need more tokens/s than what serves it gives batch
    work (`pace.pressure.batch_capacity_tps`): work that waits for capacity."""
    return need_tps > 0 and need_tps > batch_capacity_tps(serving, theta_tps, release_below)


def desired_pod_sets(
    md: ModelDeployment,
    namespace: str,
    sized: Mapping[str, int],
    decided: Mapping[str, int],
    held_requests: Series,
    pressure: bool,
) -> dict[str, Desired]:
    """What the scaler answers for each paced pod set of `md` (pure): the replicas decided
    this pass, else what the pod set is sized at (`sized`: the recorded decision, or its
    current replicas before any); requests held and batch deadline pressure wake only the
    first variant of an endpoint no variant of which is decided above 0."""
    out: dict[str, Desired] = {}
    name = md.metadata.name
    for region in md.spec.regions:
        names = [pod_set_name(name, region.name, v.name) for v in md.spec.variants]
        replicas = {n: decided.get(n, sized[n]) for n in names if n in sized}
        idle = all(r <= 0 for r in replicas.values())
        held = int(held_requests.get((namespace, name, region.name), 0))
        for i, pod_set in enumerate(names):
            if pod_set in replicas:
                out[pod_set] = Desired(replicas[pod_set], held, pressure, i == 0 and idle)
    return out


@dataclass(frozen=True)
class Managed:
    """One pod set KEDA sizes for a policy: where it is and what its ScaledObject carries."""

    md: ModelDeployment
    raw: dict[str, Any]
    region: str
    variant: str
    pod_set: str
    desired: Desired


def scaled_object_for(
    managed: Managed, policy: ScalingPolicy, namespace: str, address: str
) -> dict[str, Any]:
    """The ScaledObject of one managed pod set (`keda.scaledobject.render_scaled_object`)."""
    region = next(r for r in managed.md.spec.regions if r.name == managed.region)
    floor = region.min_instances if len(managed.md.spec.variants) == 1 else 0
    return render_scaled_object(
        ScaledObjectSpec(
            namespace=namespace,
            model_deployment=managed.md.metadata.name,
            owner_uid=(managed.raw.get("metadata") or {}).get("uid"),
            region=managed.region,
            variant=managed.variant,
            pod_set=managed.pod_set,
            scaler_address=address,
            plan_replicas=managed.desired.replicas,
            min_replicas=floor,
            max_replicas=max(region.max_instances, floor),
            failure_threshold=policy.spec.keda.failure_threshold,
            pace_seconds=policy.spec.intervals.pace_seconds,
        )
    )


def foreign_autoscalers(
    autoscalers: Mapping[str, list[str]], managed: Iterable[str]
) -> dict[str, list[str]]:
    """`{pod set: [HorizontalPodAutoscaler/name]}` of the managed pod sets that an
    autoscaler other than their ScaledObject's HPA (`keda-hpa-<pod set>`) targets too."""
    out = {}
    for pod_set in sorted(managed):
        ours = f"HorizontalPodAutoscaler/{hpa_name(pod_set)}"
        others = [a for a in autoscalers.get(pod_set, []) if a != ours]
        if others:
            out[pod_set] = others
    return out


def named(names: Iterable[str]) -> str:
    listed = sorted(names)
    more = f" and {len(listed) - NAMED} more" if len(listed) > NAMED else ""
    return ", ".join(listed[:NAMED]) + more


class Actuator:
    """The ScaledObjects and pod-set marks of one policy's pass (see the module doc)."""

    def __init__(
        self,
        kube: Kube,
        policy: ScalingPolicy,
        namespace: str,
        condition: ConditionFn,
        event: EventFn,
        board: DecisionBoard,
        logger: Logger,
    ) -> None:
        self.kube = kube
        self.policy = policy
        self.namespace = namespace
        self.condition = condition
        self.event = event
        self.board = board
        self.logger = logger

    def usable(self) -> tuple[str, dict[str, dict[str, Any]]] | None:
        """Keda mode's preconditions: (scaler address, the ScaledObjects sageserve owns in
        the namespace); None, with `Actuation=False` saying what is missing, otherwise."""
        address = scaler_address(self.policy)
        if address is None:
            message = (
                "actuation keda needs the scaler's address: start the operator with "
                "--scaler-address (the chart's keda.enabled=true does) or set "
                "spec.keda.scalerAddress; replicas are left as they are"
            )
            self.condition(CONDITION, False, "ScalerAddressMissing", message)
            return None
        try:
            listed = self.kube.scaled_objects(self.namespace)
        except KedaUnavailable as exc:
            self.condition(CONDITION, False, exc.reason, f"actuation keda: {exc}")
            return None
        return address, listed

    def keda(
        self,
        managed: list[Managed],
        observed: Mapping[str, dict[str, Any]],
        listed: Mapping[str, dict[str, Any]],
        fleet: Iterable[tuple[dict[str, Any], ModelDeployment]],
        address: str,
    ) -> None:
        """Mark, apply and prune the policy's ScaledObjects; `Actuation=True/Keda`."""
        created: dict[str, list[str]] = {}
        for m in managed:
            body = scaled_object_for(m, self.policy, self.namespace, address)
            annotations = (observed.get(m.pod_set, {}).get("metadata") or {}).get(
                "annotations"
            ) or {}
            if annotations.get(ANNOTATION_ACTUATION) != ACTUATION_KEDA:
                # marked first: the HPA's first write must never read as a conflict
                self.kube.annotate_deployment(
                    self.namespace, m.pod_set, {ANNOTATION_ACTUATION: ACTUATION_KEDA}
                )
            have = listed.get(m.pod_set)
            if have is None or not covers(have, {"spec": body["spec"]}, absent_is_false=True):
                self.kube.apply_scaled_object(body)
                if have is None:
                    created.setdefault(m.md.metadata.name, []).append(m.pod_set)
        owners = {md.metadata.name: raw for raw, md in fleet}
        for model, names in created.items():
            message = (
                f"KEDA sizes pod set(s) {named(names)} through ScaledObject(s) of the same "
                "name, each fed the replicas decided for it (its current replicas where "
                f"nothing was decided; scaler {address})"
            )
            self.event(owners[model], "Normal", "ScaledObjectsCreated", message)
        keep = {m.pod_set for m in managed}
        self.prune(listed, keep, owners)
        others = foreign_autoscalers(self.kube.autoscalers(self.namespace), keep)
        if others:
            message = (
                "; ".join(f"pod set {p}: also sized by {', '.join(a)}" for p, a in others.items())
                + ": two writers flap its replicas; delete the other autoscaler (sageserve's "
                "is HorizontalPodAutoscaler/keda-hpa-<pod set>)"
            )
            self.condition(CONDITION, False, "ForeignAutoscaler", message)
            return
        message = (
            f"KEDA writes replicas through ScaledObject(s) {named(keep) or 'none yet'}; "
            f"sageserve decides them and serves them on {address}"
        )
        self.condition(CONDITION, True, "Keda", message)

    def prune(
        self,
        listed: Mapping[str, dict[str, Any]],
        keep: set[str],
        owners: Mapping[str, dict[str, Any]],
    ) -> list[str]:
        """Delete the ScaledObjects sageserve owns for the models in `owners` other than
        `keep`; their names."""
        gone = []
        for name, obj in listed.items():
            model = ((obj.get("metadata") or {}).get("labels") or {}).get(LABEL_DEPLOYMENT)
            if model in owners and name not in keep:
                self.kube.delete_scaled_object(self.namespace, name)
                gone.append(name)
        for model in {
            (listed[n].get("metadata") or {}).get("labels", {}).get(LABEL_DEPLOYMENT) for n in gone
        }:
            mine = [n for n in gone if listed[n]["metadata"]["labels"][LABEL_DEPLOYMENT] == model]
            message = f"ScaledObject(s) {named(mine)} deleted; their replicas stay as they are"
            self.event(owners[str(model)], "Normal", "ScaledObjectsDeleted", message)
        if gone:
            self.board.forget(self.namespace, set(gone))
        return gone

    def direct(
        self,
        guard: Guard,
        observed: Mapping[str, dict[str, Any]],
        fleet: Iterable[tuple[dict[str, Any], ModelDeployment]],
        had_condition: bool,
    ) -> None:
        """Back in direct mode: delete the ScaledObjects of pod sets KEDA still sizes, take
        back those whose ScaledObject is gone; `Actuation=True/Direct` once a policy has
        been in keda mode (a policy that never was gets no condition)."""
        fleet = list(fleet)
        mine = {
            pod_set_name(md.metadata.name, r.name, v.name)
            for _, md in fleet
            for r in md.spec.regions
            for v in md.spec.variants
        }
        leaving = sorted(n for n, o in guard.owned.items() if o.sizing is Sizing.KEDA)
        if not leaving:
            self.board.forget(self.namespace, mine)
            if had_condition:
                message = "sageserve writes each pod set's replicas itself"
                self.condition(CONDITION, True, "Direct", message)
            return
        owners = {md.metadata.name: raw for raw, md in fleet}
        try:
            listed = self.kube.scaled_objects(self.namespace)
        except KedaUnavailable as exc:
            if exc.reason != "KedaNotInstalled":
                self.condition(CONDITION, False, exc.reason, f"leaving keda: {exc}")
                return
            listed = {}  # no KEDA: no ScaledObject left to wait for
        self.prune(listed, set(), owners)
        waiting = []
        for name in leaving:
            if name in listed or name not in observed:
                waiting.append(name)
                continue
            own = guard.owned[name]
            try:  # stamp its size, drop the mark: direct writes resume from here
                self.kube.set_replicas(
                    self.namespace, observed[name], own.replicas, drop_actuation=True
                )
            except ReplicasMoved:
                waiting.append(name)  # KEDA's HPA wrote meanwhile: the next pass
                continue
            body = owners.get(own.model)
            if body is not None:
                message = f"pod set {name} taken back from KEDA at {own.replicas} replica(s)"
                self.event(body, "Normal", "TookBack", message)
        self.board.forget(self.namespace, mine)
        message = "sageserve writes each pod set's replicas itself" + (
            f"; waiting for ScaledObject(s) {named(waiting)} to be gone" if waiting else ""
        )
        self.condition(CONDITION, True, "Direct", message)
