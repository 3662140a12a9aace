"""What a pooled pod says about its engines, read the same way by the router and the twin.

A pod of a ModelPool's pod set runs one vLLM engine per pooled model, each on its own port.
The operator writes the list on the pod template (annotation `sageserve.io/pooled-models`,
JSON), so whoever meets the pod — the router forwarding to it, the twin emulating it —
knows which model listens where without reading the ModelPool.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

#: Pod label naming the ModelPool a pod serves (besides `sageserve.io/model-deployment`,
#: which carries the pool's name too, so pods, metrics and routing treat a pool as one
#: endpoint per region).
LABEL_POOL = "sageserve.io/model-pool"
#: Pod annotation: the engines of a pooled pod, `[{"name", "servedName", "port"}]`.
ANNOTATION_POOLED_MODELS = "sageserve.io/pooled-models"
#: Pod annotation: how many engines may be awake at once (the pool's awakePerInstance).
ANNOTATION_AWAKE_PER_INSTANCE = "sageserve.io/awake-per-instance"


@dataclass(frozen=True)
class PooledEngine:
    """One pooled model's engine in a pod."""

    name: str
    served_name: str
    port: int


def encode_engines(engines: Sequence[PooledEngine]) -> str:
    return json.dumps(
        [{"name": e.name, "servedName": e.served_name, "port": e.port} for e in engines],
        separators=(",", ":"),
    )


def pooled_engines(annotations: Mapping[str, Any] | None) -> list[PooledEngine]:
    """The engines a pod's annotations declare ([] for a pod that is not pooled, or a
    value that does not parse: such a pod is served as an ordinary one)."""
    raw = (annotations or {}).get(ANNOTATION_POOLED_MODELS)
    if not raw:
        return []
    try:
        items = json.loads(str(raw))
        return [
            PooledEngine(str(i["name"]), str(i["servedName"]), int(i["port"]))
            for i in items
            if isinstance(i, dict)
        ]
    except (ValueError, KeyError, TypeError):
        return []


def awake_per_instance(annotations: Mapping[str, Any] | None, default: int = 1) -> int:
    try:
        return max(1, int(str((annotations or {}).get(ANNOTATION_AWAKE_PER_INSTANCE))))
    except ValueError:
        return default
