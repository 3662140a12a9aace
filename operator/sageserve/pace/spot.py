"""Where a new instance's GPUs come from, and which nodes go to the spot pool (SageServe
§2.3, §6.4).

The capacity order (`capacity_order`), one rule for the operator and the simulator:

1. free GPUs on a serving-pool node (the scheduler places the pod at once: its pod set's
   affinity is `pool=serving`);
2. only for a pod that stays Pending (no serving node has room): a spot node reclaimed for
   it, a node that last served the *same* model first (weights cached on the node, ≈1 min),
   then another model's (redeploy, ≈10 min) (`reclaim_order`). One spot node per Pending
   pod per pass (`plan_moves`); the reclaim starts a fresh pod on the node.

Nothing else: a GPU node outside both pools is never used, so a scale-out the pools cannot
place stays Pending (counted in `spec.replicas`, so the strategy does not ask again) until
capacity frees. A model is `namespace/ModelDeployment` (any variant).

Donation (`donation_candidates`, `plan_moves`): a whole serving-pool node that no serving
pod uses, in a (region, GPU type) pair with nothing Pending and no pod set still coming up
(replicas > ready), evaluated each pace pass. Serving pods are never evicted by a donation.
Pure functions over node summaries, so the operator (Nodes and their annotations) and the
simulator (its inventory) share one rule.

A reclaim evicts the node's spot pods through the Eviction API, which a
PodDisruptionBudget may refuse (429). It is retried every pass for a bounded time
(`reclaim_step`); past it, the node goes back to the spot pool, is skipped for a while
(`reclaim_order`'s `retry_after_s`) and the next node in the order is taken, so a refused
eviction never holds a pending instance for ever. A node that is not Ready (lost) is
neither donated nor reclaimed nor counted in either pool.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum

from sageserve.core.labels import NodeLabels

#: A node whose reclaim was given up is skipped this many reclaim timeouts.
RETRY_AFTER_TIMEOUTS = 5


class Source(StrEnum):
    """Where a new instance's GPUs come from, in the capacity order."""

    FREE_SERVING = "free-serving"
    SAME_MODEL_SPOT = "same-model-spot"
    OTHER_MODEL_SPOT = "other-model-spot"


@dataclass(frozen=True)
class PoolNode:
    """One GPU node as the spot logic sees it.

    `serving_gpus` are GPUs held by serving pods; `last_model` and `donated_at` come from
    the annotations written when the node was donated.
    """

    name: str
    region: str
    gpu_type: str
    pool: str
    gpus: int
    serving_gpus: int = 0
    last_model: str | None = None
    donated_at: float | None = None
    #: False when the node's Ready condition is not True (lost): no pool counts it
    ready: bool = True
    #: when sageserve last took the node back from the spot pool
    reclaimed_at: float | None = None
    #: when a reclaim of the node was given up (its spot pods' eviction refused)
    blocked_at: float | None = None
    #: spot pods (`namespace/name`) still on the node and not leaving: what a reclaim evicts
    tenants: tuple[str, ...] = ()
    #: spot pods on the node already terminating (evicted, on their way out)
    leaving: int = 0


def reclaim_order(
    nodes: Iterable[PoolNode],
    model: str,
    region: str,
    gpu_type: str,
    gpus_per_instance: int,
    spot_pool: str = "spot",
    now: float | None = None,
    retry_after_s: float = 0.0,
) -> list[tuple[PoolNode, Source]]:
    """Spot nodes that can host an instance of `model`, in the order to reclaim them.

    Same-model nodes first, the most recently donated first (their weights are the most
    likely to still be cached); then other models' nodes, the longest-donated first
    (the least likely to be asked back by their own model soon). Ties by name, so the
    choice is deterministic. Nodes that are not Ready are left out, and so, when `now` is
    given, are nodes whose reclaim was given up less than `retry_after_s` ago.
    """
    fits = [
        n
        for n in nodes
        if n.pool == spot_pool
        and n.ready
        and n.region == region
        and n.gpu_type == gpu_type
        and n.gpus >= gpus_per_instance
        and not skipped(n, now, retry_after_s)
    ]
    same = sorted(
        (n for n in fits if n.last_model == model),
        key=lambda n: (-(n.donated_at or 0.0), n.name),
    )
    other = sorted(
        (n for n in fits if n.last_model != model),
        key=lambda n: (n.donated_at or 0.0, n.name),
    )
    return [(n, Source.SAME_MODEL_SPOT) for n in same] + [
        (n, Source.OTHER_MODEL_SPOT) for n in other
    ]


def serving_room(
    nodes: Iterable[PoolNode],
    region: str,
    gpu_type: str,
    gpus_per_instance: int,
    serving_pool: str = "serving",
) -> list[PoolNode]:
    """Ready serving-pool nodes of (region, GPU type) with `gpus_per_instance` GPUs no
    serving pod holds: where the scheduler places a new pod at once, by name."""
    return sorted(
        (
            n
            for n in _ready_serving(nodes, region, gpu_type, serving_pool)
            if n.gpus - n.serving_gpus >= gpus_per_instance
        ),
        key=lambda n: n.name,
    )


def _ready_serving(
    nodes: Iterable[PoolNode], region: str, gpu_type: str, serving_pool: str
) -> Iterable[PoolNode]:
    """Ready serving-pool nodes of (region, GPU type): a node that is not Ready is lost,
    neither room for a new pod nor idle."""
    return (
        n
        for n in nodes
        if n.pool == serving_pool and n.ready and n.region == region and n.gpu_type == gpu_type
    )


def capacity_order(
    nodes: Iterable[PoolNode],
    model: str,
    region: str,
    gpu_type: str,
    gpus_per_instance: int,
    labels: NodeLabels | None = None,
    now: float | None = None,
    retry_after_s: float = 0.0,
) -> list[tuple[PoolNode, Source]]:
    """Where an instance of `model` gets its GPUs, first choice first: serving-pool nodes
    with room (`serving_room`), then spot nodes to reclaim (`reclaim_order`). Nothing
    outside the two pools. On Kubernetes the scheduler takes the first part and the spot
    pass (`plan_moves`) the second, for pods left Pending."""
    serving, spot = (
        ("serving", "spot")
        if labels is None
        else (
            labels.serving_pool,
            labels.spot_pool,
        )
    )
    nodes = list(nodes)
    free = serving_room(nodes, region, gpu_type, gpus_per_instance, serving)
    return [(n, Source.FREE_SERVING) for n in free] + reclaim_order(
        nodes, model, region, gpu_type, gpus_per_instance, spot, now, retry_after_s
    )


def donation_candidates(
    nodes: Iterable[PoolNode],
    region: str,
    gpu_type: str,
    serving_pool: str = "serving",
) -> list[PoolNode]:
    """Serving-pool nodes of (region, GPU type) that no serving pod uses: safe to donate.

    A node that is not Ready is not idle but lost: it is never given to the spot pool.

    Nodes are returned by name so that repeated reconciles donate the same ones.
    """
    return sorted(
        (n for n in _ready_serving(nodes, region, gpu_type, serving_pool) if n.serving_gpus == 0),
        key=lambda n: n.name,
    )


@dataclass(frozen=True)
class Pending:
    """A serving pod the scheduler could not place: it needs a node of (region, GPU type)."""

    model: str
    region: str
    gpu_type: str
    gpus: int


def plan_moves(
    nodes: list[PoolNode],
    pending: list[Pending],
    scope: set[tuple[str, str]],
    labels: NodeLabels,
    busy: set[tuple[str, str]] | None = None,
    now: float | None = None,
    timeout_s: float = 60.0,
) -> tuple[list[tuple[PoolNode, Pending]], list[PoolNode]]:
    """(reclaims, donations) for one pace pass, the operator's spot pass and the
    simulator's: one spot node per pending pod that fits, in `reclaim_order` (the second
    part of `capacity_order`: a pod is Pending because no serving node had room); whole
    idle serving nodes of (region, GPU type) pairs in `scope` with nothing pending,
    donated (`donation_candidates`). `pending` is in the order the pods are served.

    `busy` pairs have pod sets still coming up (replicas not all ready): their idle nodes
    are about to be used, so they are not donated. With `now`, a reclaim still under way
    (`pace.spot.under_way`) stands for one pending pod it fits, and nodes given up less
    than RETRY_AFTER_TIMEOUTS × `timeout_s` ago are not taken."""
    reclaims: list[tuple[PoolNode, Pending]] = []
    taken: set[str] = set()
    coming = under_way(nodes, now, timeout_s, labels.serving_pool) if now is not None else []
    for p in pending:
        covering = next(
            (
                n
                for n in coming
                if n.name not in taken
                and (n.region, n.gpu_type) == (p.region, p.gpu_type)
                and n.gpus >= p.gpus
            ),
            None,
        )
        if covering is not None:
            taken.add(covering.name)
            continue
        for node, _source in reclaim_order(
            nodes,
            p.model,
            p.region,
            p.gpu_type,
            p.gpus,
            labels.spot_pool,
            now,
            RETRY_AFTER_TIMEOUTS * timeout_s,
        ):
            if node.name not in taken:
                taken.add(node.name)
                reclaims.append((node, p))
                break
    waiting = {(p.region, p.gpu_type) for p in pending} | (busy or set())
    donations = [
        n
        for region, gpu in sorted(scope - waiting)
        for n in donation_candidates(nodes, region, gpu, labels.serving_pool)
    ]
    return reclaims, donations


def skipped(node: PoolNode, now: float | None, retry_after_s: float) -> bool:
    """Whether a reclaim of `node` was given up less than `retry_after_s` before `now`."""
    if now is None or node.blocked_at is None:
        return False
    return now - node.blocked_at < retry_after_s


class ReclaimStep(StrEnum):
    """What a pass does with a node reclaimed earlier whose spot pods are still on it."""

    #: within the bound: evict (again) the spot pods still on it
    EVICT = "evict"
    #: the bound has passed: one last eviction; if it is refused, the node goes back to the
    #: spot pool (skipped for a while) and the pending instance takes another node
    GIVE_UP = "give-up"


def reclaim_step(
    node: PoolNode, now: float, timeout_s: float, serving_pool: str = "serving"
) -> ReclaimStep | None:
    """The step for `node` in this pass, None when no reclaim of it is under way.

    A reclaim is under way on a serving-pool node sageserve took back (`reclaimed_at`)
    that still runs spot pods not leaving (`tenants`). Evictions are retried for
    `timeout_s`; from then until `2 * timeout_s` the reclaim is given up if they are still
    refused. Later (an operator down meanwhile), or when a serving pod already runs on it,
    or when the node is lost, the node is left as it is: giving it back would strand
    serving pods on a spot node, and an idle serving node is donated the usual way.
    """
    if node.pool != serving_pool or node.reclaimed_at is None or not node.tenants:
        return None
    age = now - node.reclaimed_at
    if age < timeout_s:
        return ReclaimStep.EVICT
    if age < 2 * timeout_s and node.serving_gpus == 0 and node.ready:
        return ReclaimStep.GIVE_UP
    return None


def under_way(
    nodes: Iterable[PoolNode], now: float, timeout_s: float, serving_pool: str = "serving"
) -> list[PoolNode]:
    """Reclaimed nodes still being emptied: spot pods on them, refused or leaving, within
    `2 * timeout_s` of the reclaim. Each stands for the pending instance it was taken for,
    so no second node is reclaimed for it meanwhile."""
    return sorted(
        (
            n
            for n in nodes
            if n.pool == serving_pool
            and n.ready
            and n.reclaimed_at is not None
            and (n.tenants or n.leaving)
            and now - n.reclaimed_at < 2 * timeout_s
        ),
        key=lambda n: n.name,
    )
