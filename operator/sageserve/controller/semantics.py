"""Checks a manifest can pass the schema and still fail: references and GPU fit.

Why here and not in CEL: they need other objects (the ScalingPolicy, the WorkloadTiers,
the Nodes). The API server cannot see them, so the operator reports the problem as
`Ready=False` with a reason, and keeps reconciling every other object.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from sageserve.api.model_deployment import ModelDeployment
from sageserve.core.labels import NodeLabels
from sageserve.core.nodes import parse_nodes


@dataclass(frozen=True)
class NodeShape:
    """What the scheduler will see of one node: where it is and how many GPUs it offers."""

    region: str
    gpu_type: str
    gpus: int


@dataclass(frozen=True)
class SemanticProblem:
    """A reason the operator cannot act on an object as written; `reason` is CamelCase."""

    reason: str
    message: str


def model_deployment_problems(
    md: ModelDeployment,
    policies: Iterable[str],
    tiers: Iterable[str],
    nodes: Iterable[NodeShape],
) -> list[SemanticProblem]:
    """Problems of `md` given the policies, tiers and nodes of its cluster/namespace."""
    problems: list[SemanticProblem] = []
    spec = md.spec
    if spec.policy_ref.name not in set(policies):
        problems.append(
            SemanticProblem(
                "PolicyNotFound",
                f"spec.policyRef.name: ScalingPolicy {spec.policy_ref.name!r} does not exist "
                "in this namespace; create it or point policyRef at an existing one",
            )
        )
    missing = [t for t in spec.tiers if t not in set(tiers)]
    if missing:
        problems.append(
            SemanticProblem(
                "TierNotFound",
                f"spec.tiers: WorkloadTier(s) {', '.join(repr(t) for t in missing)} do not "
                "exist in this namespace; create them or remove them from spec.tiers",
            )
        )
    largest: dict[tuple[str, str], int] = {}
    for node in nodes:
        key = (node.region, node.gpu_type)
        largest[key] = max(largest.get(key, 0), node.gpus)
    for region in spec.regions:
        if region.max_instances == 0:
            continue
        fits = [
            v
            for v in spec.variants
            if largest.get((region.name, v.gpu_type), 0) >= v.gpus_per_instance
        ]
        if not fits:
            wanted = ", ".join(f"{v.gpus_per_instance}x {v.gpu_type}" for v in spec.variants)
            problems.append(
                SemanticProblem(
                    "NoFittingNodes",
                    f"spec.regions[{region.name}]: no node in region {region.name!r} offers "
                    f"{wanted} GPUs on one node; add such nodes or change the variants",
                )
            )
    return problems


def node_shapes(nodes: Iterable[Mapping[str, Any]], labels: NodeLabels) -> list[NodeShape]:
    """NodeShapes of v1.Node objects (dicts), read by `core.nodes`: GPU nodes only."""
    return [NodeShape(n.region, n.gpu_type, n.gpus) for n in parse_nodes(nodes, labels)]
