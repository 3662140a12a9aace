"""Which node to reclaim from the spot pool, and which to donate to it (SageServe §2.3, §6.4).

SageServe's order for new capacity: a spot node that last served the *same* model (weights
still cached, ≈1 min), then a spot node of another model (redeploy, ≈10 min), then capacity
outside both pools (new node). Scale-in donates to spot a node that no serving pod uses any
more; serving pods are never evicted by a donation. Pure functions over node summaries, so
the operator (Nodes and their annotations) and any other executor share one rule.
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


def reclaim_order(
    nodes: Iterable[PoolNode],
    model: str,
    region: str,
    gpu_type: str,
    gpus_per_instance: int,
    spot_pool: str = "spot",
) -> list[tuple[PoolNode, Source]]:
    """Spot nodes that can host an instance of `model`, in the order to reclaim them.

    Same-model nodes first, the most recently donated first (their weights are the most
    likely to still be cached); then other models' nodes, the longest-donated first
    (the least likely to be asked back by their own model soon). Ties by name, so the
    choice is deterministic.
    """
    fits = [
        n
        for n in nodes
        if n.pool == spot_pool
        and n.region == region
        and n.gpu_type == gpu_type
        and n.gpus >= gpus_per_instance
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

    Nodes are returned by name so that repeated reconciles donate the same ones.
    """
    return sorted(
        (
            n
            for n in nodes
            if n.pool == serving_pool
            and n.region == region
            and n.gpu_type == gpu_type
            and n.serving_gpus == 0
        ),
        key=lambda n: n.name,
    )
