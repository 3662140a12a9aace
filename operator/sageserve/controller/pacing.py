"""The pace loop's arithmetic: observations from the cluster, replica changes from actions.

Pure, like the HPA's replica calculator: the daemon in `handlers` only fetches and writes.
The rule for missing data is the DESIGN's: an endpoint whose utilisation is unknown while
it has ready pods is *held* — no observation, so no strategy can scale it, least of all in.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from sageserve.api.model_deployment import ModelDeployment, pod_set_name
from sageserve.core.types import ActionKind, EndpointKey, EndpointObservation, ScalingAction
from sageserve.metrics.prometheus import Series


@dataclass(frozen=True)
class PodSetState:
    """Replicas of one pod set as the Deployment reports them."""

    region: str
    variant: str
    replicas: int
    ready: int


def pod_set_states(
    md: ModelDeployment, deployments: Mapping[str, Mapping[str, object]]
) -> list[PodSetState]:
    """States of the pod sets of `md` that exist, in spec order (region, then variant)."""
    out = []
    for region in md.spec.regions:
        for variant in md.spec.variants:
            d = deployments.get(pod_set_name(md.metadata.name, region.name, variant.name))
            if d is None:
                continue
            spec = d.get("spec") or {}
            status = d.get("status") or {}
            assert isinstance(spec, Mapping) and isinstance(status, Mapping)
            out.append(
                PodSetState(
                    region.name,
                    variant.name,
                    int(spec.get("replicas") or 0),
                    int(status.get("readyReplicas") or 0),
                )
            )
    return out


def endpoint_observations(
    md: ModelDeployment,
    namespace: str,
    states: Iterable[PodSetState],
    emu: Series,
    tokens_per_s: Series,
    now: float,
) -> tuple[dict[EndpointKey, EndpointObservation], list[str]]:
    """Observations per (model, region), and the regions held for lack of data."""
    by_region: dict[str, list[PodSetState]] = {}
    for s in states:
        by_region.setdefault(s.region, []).append(s)
    observations: dict[EndpointKey, EndpointObservation] = {}
    held: list[str] = []
    for region in md.spec.regions:
        sets = by_region.get(region.name, [])
        ready = sum(s.ready for s in sets)
        replicas = sum(s.replicas for s in sets)
        key3 = (namespace, md.metadata.name, region.name)
        if key3 not in emu and ready > 0:
            held.append(region.name)
            continue
        key = EndpointKey(md.metadata.name, region.name)
        observations[key] = EndpointObservation(
            time=now,
            key=key,
            emu=emu.get(key3, 0.0),
            serving=ready,
            provisioning=max(0, replicas - ready),
            draining=0,
            min_instances=region.min_instances,
            max_instances=region.max_instances,
            tokens_per_s=tokens_per_s.get(key3, 0.0),
        )
    return observations, held


def replicas_after(
    action: ScalingAction,
    states: Iterable[PodSetState],
    variant_order: list[str],
    targets: Mapping[tuple[str, str], int] | None = None,
) -> dict[tuple[str, str], int]:
    """New replicas per (region, variant) after `action`, for the pod sets it changes.

    Out: each instance goes to the variant furthest below its planned target, else the
    first variant in the spec. In: each comes from the variant furthest above its target
    (with no plan: the one with the most replicas, the later variant on ties).
    Deterministic, so a retried pass decides alike.
    """
    region = action.key.region
    replicas = {(s.region, s.variant): s.replicas for s in states if s.region == region}
    for v in variant_order:
        replicas.setdefault((region, v), 0)
    plan = targets or {}
    rank = {v: i for i, v in enumerate(variant_order)}
    changed: set[tuple[str, str]] = set()
    for _ in range(action.count):
        keys = sorted(replicas, key=lambda k: rank.get(k[1], len(rank)))
        if action.kind is ActionKind.SCALE_OUT:
            key = max(keys, key=lambda k: (plan.get(k, 0) - replicas[k], -rank.get(k[1], 0)))
            if plan.get(key, 0) - replicas[key] <= 0:
                key = keys[0]
            replicas[key] += 1
        else:
            candidates = [k for k in keys if replicas[k] > 0]
            if not candidates:
                break
            key = max(candidates, key=lambda k: (replicas[k] - plan.get(k, 0), rank.get(k[1], 0)))
            replicas[key] -= 1
        changed.add(key)
    return {k: replicas[k] for k in sorted(changed)}
