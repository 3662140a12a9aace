"""Checks a manifest can pass the schema and still fail: references and GPU fit.

Why here and not in CEL: they need other objects (the ScalingPolicy, the WorkloadTiers,
the Nodes). The API server cannot see them, so the operator reports the problem as
`Ready=False` with a reason, and keeps reconciling every other object.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cache
from typing import Any

from sageserve.api.model_deployment import ModelDeployment
from sageserve.api.scaling_policy import ScalingPolicySpec
from sageserve.core.labels import NodeLabels
from sageserve.core.nodes import parse_nodes
from sageserve.perf.layout_check import variant_layout_problems
from sageserve.perf.model import PerfCatalog, load_catalog


@cache
def bundled_catalog() -> PerfCatalog:
    """The perf profiles shipped with sageserve, read once per process (the layout rules
    need each model's attention heads and layers)."""
    return load_catalog()


@dataclass(frozen=True)
class NodeShape:
    """What the scheduler will see of one node: where it is and how many GPUs it offers."""

    region: str
    gpu_type: str
    gpus: int
    #: nodes of this shape (`shape_counts` sums them; one per Node as read)
    count: int = 1


def shape_counts(shapes: Iterable[NodeShape]) -> list[NodeShape]:
    """One NodeShape per distinct (region, GPU type, GPUs), with how many nodes have it."""
    counts: dict[tuple[str, str, int], int] = {}
    for n in shapes:
        key = (n.region, n.gpu_type, n.gpus)
        counts[key] = counts.get(key, 0) + n.count
    return [NodeShape(r, g, gpus, c) for (r, g, gpus), c in sorted(counts.items())]


def placeable(md: ModelDeployment, region: str, nodes: Iterable[NodeShape]) -> int:
    """The most instances of `md` the cluster's nodes of `region` could ever hold (every
    GPU node, serving or spot, empty of anything else): per GPU type, the variant that fits
    most, summed over the types. An upper bound: a minInstances above it can never be met."""
    here = [n for n in nodes if n.region == region]
    total = 0
    for gpu_type in {v.gpu_type for v in md.spec.variants}:
        total += max(
            sum(n.count * (n.gpus // v.gpus_per_instance) for n in here if n.gpu_type == gpu_type)
            for v in md.spec.variants
            if v.gpu_type == gpu_type
        )
    return total


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
    catalog: PerfCatalog | None = None,
    held: frozenset[str] = frozenset(),
) -> list[SemanticProblem]:
    """Problems of `md` given the policies, tiers and nodes of its cluster/namespace, and
    the perf profiles (`catalog`, default the bundled ones) for the layout rules. The
    regions in `held` live in a cluster that does not answer now: their nodes are not
    checked (unread is not absent)."""
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
    nodes = list(nodes)
    # TP must divide the heads and stay inside a node (OServe §4.3's filters, perf/model.py):
    # vLLM would refuse to start, or the pods would never schedule. Before the node checks,
    # whose problems (no fitting node, minInstances out of reach) may only follow from it.
    node_gpus: dict[str, int] = {}
    for node in nodes:
        node_gpus[node.gpu_type] = max(node_gpus.get(node.gpu_type, 0), node.gpus)
    for _, message in variant_layout_problems(md, catalog or bundled_catalog(), node_gpus):
        problems.append(SemanticProblem("InvalidParallelLayout", message))
    largest: dict[tuple[str, str], int] = {}
    for node in nodes:
        key = (node.region, node.gpu_type)
        largest[key] = max(largest.get(key, 0), node.gpus)
    for region in spec.regions:
        if region.max_instances == 0 or region.name in held:
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
        elif region.min_instances > (room := placeable(md, region.name, nodes)):
            problems.append(
                SemanticProblem(
                    "MinInstancesUnreachable",
                    f"spec.regions[{region.name}].minInstances: {region.min_instances} "
                    f"instance(s) can never run there: every GPU node of region "
                    f"{region.name!r} together holds at most {room}; lower minInstances to "
                    f"{room} or less, or add nodes",
                )
            )
    return problems


def policy_problems(spec: ScalingPolicySpec, gpu_types: Iterable[str]) -> list[SemanticProblem]:
    """Problems of a ScalingPolicy given the GPU types the cluster's nodes offer: a cost
    for a GPU type no node has is a typo that would silently price the real type at the
    default (and steer the ILP away from or toward it)."""
    known = sorted(set(gpu_types))
    unknown = [c.gpu_type for c in spec.optimizer.gpu_hour_costs if c.gpu_type not in known]
    if not unknown:
        return []
    return [
        SemanticProblem(
            "UnknownGpuType",
            f"spec.optimizer.gpuHourCosts: no node offers GPU type(s) "
            f"{', '.join(repr(g) for g in unknown)}; the cluster's are "
            f"{', '.join(known) or 'none'}: correct the name or remove the entry",
        )
    ]


def node_shapes(nodes: Iterable[Mapping[str, Any]], labels: NodeLabels) -> list[NodeShape]:
    """NodeShapes of v1.Node objects (dicts), read by `core.nodes`: GPU nodes only."""
    return [NodeShape(n.region, n.gpu_type, n.gpus) for n in parse_nodes(nodes, labels)]
