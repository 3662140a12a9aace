"""Which node to reclaim from the spot pool, and which to donate to it (SageServe §2.3, §6.4).

SageServe's order for new capacity: a spot node that last served the *same* model (weights
still cached, ≈1 min), then a spot node of another model (redeploy, ≈10 min), then capacity
outside both pools (new node). Scale-in donates to spot a node that no serving pod uses any
more; serving pods are never evicted by a donation. Pure functions over node summaries, so
the operator (Nodes and their annotations) and any other executor share one rule.

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


class Source(StrEnum):
    """Where a new instance's GPUs come from, fastest first."""

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
        (
            n
            for n in nodes
            if n.pool == serving_pool
            and n.ready
            and n.region == region
            and n.gpu_type == gpu_type
            and n.serving_gpus == 0
        ),
        key=lambda n: n.name,
    )


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
