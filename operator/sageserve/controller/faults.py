"""What goes wrong around the pod sets, read from the objects a pace pass lists (pure).

The faults users of LLM autoscalers report and the pace pass must not make worse
(docs/reliability.md):

- **another writer of replicas** (`kubectl scale`, an HPA, KEDA's HPA): two controllers
  writing one field flap it forever. sageserve stamps every count it writes or accepts
  (`sageserve.io/replicas`); a `spec.replicas` that differs and is owned by another field
  manager (`metadata.managedFields` says who) is a conflict: the pod set is held, never
  overwritten, until a person hands it over (`sageserve.io/scaling: external`) or takes
  it back (`resume`). The HPA of a ScaledObject sageserve owns under `actuation: keda` is
  no other writer: its pod set carries `sageserve.io/actuation: keda`;
- **a pod that never finishes terminating** (a finalizer nobody removes, a kubelet gone):
  it still holds its GPUs, serves nothing and is not coming back. It is past its
  `deletionTimestamp` (the API server's deadline for it to be gone), so no further
  scale-in of its endpoint is sent until it is gone: a second scale-in would strand a
  second instance's GPUs the same way;
- **instances that cannot be placed** (no free GPU, nothing to reclaim): the scheduler
  says `Unschedulable`; they stay counted as capacity on its way (`replicas`), so the
  strategy does not ask for more of what cannot be placed, and they are reported per
  (model, region) once they have waited a bounded time;
- **a node lost** (its Ready condition not True: the kubelet says NotReady, or the node
  controller heard nothing and says Unknown): its pods serve nothing, whatever their own
  Ready condition still says, so they are not counted as serving; once the node has been
  lost for a bounded time they are evicted, so that their pod sets' ReplicaSets place
  replacements where capacity exists (Kubernetes itself waits 300 s, the default
  toleration of `node.kubernetes.io/unreachable`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from sageserve.controller.kube import FIELD_MANAGER, PACE_MANAGER
from sageserve.controller.spot import is_serving_pod, pod_gpus
from sageserve.core.labels import (
    ACTUATION_KEDA,
    ANNOTATION_ACTUATION,
    ANNOTATION_REPLICAS,
    ANNOTATION_SCALING,
    LABEL_DEPLOYMENT,
    LABEL_REGION,
    SCALING_EXTERNAL,
    SCALING_RESUME,
)
from sageserve.core.nodes import parse_time

#: Field managers that are sageserve itself (reconcile's apply, the pace loop's scale).
OWN_MANAGERS = frozenset({FIELD_MANAGER, PACE_MANAGER})


@dataclass(frozen=True)
class Writer:
    """A field manager that owns `spec.replicas` of a pod set."""

    manager: str
    operation: str
    subresource: str
    time: str

    def __str__(self) -> str:
        how = f"{self.operation} of /{self.subresource}" if self.subresource else self.operation
        return f"{self.manager} ({how} at {self.time or 'an unknown time'})"


def replicas_writers(deployment: Mapping[str, Any]) -> list[Writer]:
    """The field managers owning `spec.replicas`, latest first."""
    out = []
    for entry in (deployment.get("metadata") or {}).get("managedFields") or []:
        fields = (entry.get("fieldsV1") or {}).get("f:spec") or {}
        if "f:replicas" in fields:
            out.append(
                Writer(
                    str(entry.get("manager", "")),
                    str(entry.get("operation", "")),
                    str(entry.get("subresource", "")),
                    str(entry.get("time", "")),
                )
            )
    return sorted(out, key=lambda w: w.time, reverse=True)


class Sizing(StrEnum):
    """Who sizes a pod set now."""

    OURS = "ours"  # stamped with its replicas: the pace loop sizes it
    ADOPT = "adopt"  # not stamped yet (new, or only sageserve wrote it): stamp, then ours
    HANDED_OVER = "handed-over"  # `sageserve.io/scaling: external`: never written
    RESUME = "resume"  # `sageserve.io/scaling: resume`: stamp its size, drop the annotation
    CONFLICT = "conflict"  # someone else wrote replicas: held, reported
    UNKNOWN = "unknown"  # an annotation value sageserve does not know: held, reported
    #: `sageserve.io/actuation: keda`: KEDA's HPA writes the replicas sageserve decides
    #: (sanctioned); paced in keda mode, taken back once its ScaledObject is gone in direct
    KEDA = "keda"


#: Pod sets the pace loop leaves alone.
HELD = frozenset({Sizing.HANDED_OVER, Sizing.CONFLICT, Sizing.UNKNOWN})


@dataclass(frozen=True)
class Ownership:
    """One pod set's sizing state and what it rests on."""

    pod_set: str
    model: str
    region: str
    sizing: Sizing
    replicas: int
    stamped: int | None
    #: other field managers owning spec.replicas, latest first
    others: tuple[Writer, ...] = ()
    annotation: str | None = None

    @property
    def needs_stamp(self) -> bool:
        """Whether the stamp must be (re)written: a size adopted, taken back or followed."""
        if self.sizing in (Sizing.ADOPT, Sizing.RESUME):
            return True
        return self.sizing is Sizing.HANDED_OVER and self.stamped != self.replicas


def ownership(deployment: Mapping[str, Any]) -> Ownership:
    """Who sizes `deployment` (a pod set as listed, with its managedFields)."""
    meta = deployment.get("metadata") or {}
    annotations = meta.get("annotations") or {}
    labels = meta.get("labels") or {}
    replicas = int((deployment.get("spec") or {}).get("replicas") or 0)
    try:
        stamped: int | None = int(annotations[ANNOTATION_REPLICAS])
    except (KeyError, ValueError):
        stamped = None
    others = tuple(w for w in replicas_writers(deployment) if w.manager not in OWN_MANAGERS)
    mode = annotations.get(ANNOTATION_SCALING)
    if mode is None and annotations.get(ANNOTATION_ACTUATION) == ACTUATION_KEDA:
        sizing = Sizing.KEDA
    elif mode == SCALING_EXTERNAL:
        sizing = Sizing.HANDED_OVER
    elif mode == SCALING_RESUME:
        sizing = Sizing.RESUME
    elif mode is not None:
        sizing = Sizing.UNKNOWN
    elif stamped == replicas:
        sizing = Sizing.OURS
    elif stamped is None or not others:
        # nothing stamped yet, or a count only sageserve wrote (its own apply racing its
        # scale): nobody else is sizing it
        sizing = Sizing.ADOPT
    else:
        sizing = Sizing.CONFLICT
    return Ownership(
        str(meta.get("name", "")),
        str(labels.get(LABEL_DEPLOYMENT, "")),
        str(labels.get(LABEL_REGION, "")),
        sizing,
        replicas,
        stamped,
        others,
        mode,
    )


@dataclass(frozen=True)
class StuckPod:
    """A pod of a pod set past the time the API server gave it to be gone."""

    name: str
    model: str
    region: str
    overdue_s: float
    gpus: int
    finalizers: tuple[str, ...]
    #: the `deletionTimestamp`, as the API server wrote it
    deadline: str = ""

    def describe(self) -> str:
        """Stable while the pod stays (no running count): a condition's message changes
        only when the facts do."""
        cause = (
            f"finalizers {', '.join(self.finalizers)}"
            if self.finalizers
            else "no finalizer: its node does not confirm"
        )
        return (
            f"pod {self.name} still terminating, due gone at {self.deadline} ({cause}); "
            f"its {self.gpus} GPU(s) stay taken"
        )


def overdue_pods(pods: Iterable[Mapping[str, Any]], now: float) -> list[StuckPod]:
    """Pods of pod sets whose `deletionTimestamp` has passed (they should be gone)."""
    out = []
    for pod in pods:
        meta = pod.get("metadata") or {}
        deadline = parse_time(meta.get("deletionTimestamp"))
        if deadline is None or deadline > now or LABEL_DEPLOYMENT not in (meta.get("labels") or {}):
            continue
        labels = meta["labels"]
        out.append(
            StuckPod(
                str(meta.get("name")),
                str(labels.get(LABEL_DEPLOYMENT)),
                str(labels.get(LABEL_REGION, "")),
                now - deadline,
                pod_gpus(pod),
                tuple(str(f) for f in meta.get("finalizers") or []),
                str(meta.get("deletionTimestamp")),
            )
        )
    return sorted(out, key=lambda s: s.name)


@dataclass(frozen=True)
class UnplacedPod:
    """A serving pod the scheduler found no node for, and since when."""

    name: str
    model: str
    region: str
    waiting_s: float
    gpus: int
    scheduler: str
    #: when the scheduler first said so (RFC 3339)
    since: str = ""


def unplaced_pods(pods: Iterable[Mapping[str, Any]], now: float) -> list[UnplacedPod]:
    """Serving pods not bound to a node whose `PodScheduled` is False (Unschedulable)."""
    out = []
    for pod in pods:
        if not is_serving_pod(pod) or (pod.get("spec") or {}).get("nodeName"):
            continue
        meta = pod.get("metadata") or {}
        if meta.get("deletionTimestamp"):
            continue
        conditions = (pod.get("status") or {}).get("conditions") or []
        scheduled = next((c for c in conditions if c.get("type") == "PodScheduled"), None)
        if scheduled is None or scheduled.get("status") != "False":
            continue
        since = parse_time(scheduled.get("lastTransitionTime")) or parse_time(
            meta.get("creationTimestamp")
        )
        labels = meta.get("labels") or {}
        out.append(
            UnplacedPod(
                str(meta.get("name")),
                str(labels.get(LABEL_DEPLOYMENT)),
                str(labels.get(LABEL_REGION, "")),
                max(0.0, now - since) if since is not None else 0.0,
                pod_gpus(pod),
                str(scheduled.get("message") or scheduled.get("reason") or ""),
                str(scheduled.get("lastTransitionTime") or meta.get("creationTimestamp") or ""),
            )
        )
    return sorted(out, key=lambda u: u.name)


def shortfall_message(unplaced: list[UnplacedPod]) -> str:
    """`model/region: N instance(s) of G GPU(s) Pending since T, … (scheduler: …)` per
    (model, region), T the longest wait's start (stable while the shortfall lasts)."""
    groups: dict[tuple[str, str], list[UnplacedPod]] = {}
    for u in unplaced:
        groups.setdefault((u.model, u.region), []).append(u)
    parts = []
    for (model, region), pods in sorted(groups.items()):
        oldest = max(pods, key=lambda u: u.waiting_s)
        gpus = sorted({u.gpus for u in pods})
        parts.append(
            f"{model}/{region}: {len(pods)} instance(s) of {'/'.join(map(str, gpus))} GPU(s) "
            f"Pending since {oldest.since}, no free or spot GPU node to take "
            f"(scheduler: {oldest.scheduler[:200]})"
        )
    return "; ".join(parts)


@dataclass(frozen=True)
class LostPod:
    """A pod of a pod set on a node that is not Ready."""

    name: str
    model: str
    region: str
    node: str
    #: how long the node has been lost
    lost_s: float
    #: when the node's Ready condition left True (RFC 3339)
    since: str

    def describe(self) -> str:
        return (
            f"node {self.node} not Ready since {self.since}: pod {self.name} "
            f"({self.model}/{self.region}) is not counted as serving and is evicted so that "
            "its pod set places a replacement where capacity exists"
        )


def lost_pods(
    pods: Iterable[Mapping[str, Any]], lost: Mapping[str, float], now: float
) -> list[LostPod]:
    """Pods of pod sets, not terminating yet, on the nodes of `lost` (`{node: not Ready
    since}`); the caller evicts those lost for long enough."""
    out = []
    for pod in pods:
        meta = pod.get("metadata") or {}
        node = (pod.get("spec") or {}).get("nodeName")
        labels = meta.get("labels") or {}
        if not node or node not in lost or meta.get("deletionTimestamp"):
            continue
        if LABEL_DEPLOYMENT not in labels:
            continue
        since = lost[node]
        out.append(
            LostPod(
                str(meta.get("name")),
                str(labels.get(LABEL_DEPLOYMENT)),
                str(labels.get(LABEL_REGION, "")),
                str(node),
                max(0.0, now - since),
                datetime.fromtimestamp(since, UTC)
                .isoformat(timespec="seconds")
                .replace("+00:00", "Z")
                if since
                else "an unknown time",
            )
        )
    return sorted(out, key=lambda p: p.name)
