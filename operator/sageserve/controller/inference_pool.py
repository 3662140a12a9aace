"""InferencePools and InferenceObjectives for ModelDeployments (Gateway API Inference Extension).

A gateway that implements the Gateway API Inference Extension (Istio, agentgateway, NGINX
Gateway Fabric) routes an HTTPRoute's requests to an `InferencePool`
(`inference.networking.k8s.io/v1`): a label selector over serving pods, their port, and
the endpoint picker (EPP) Service it asks which pod takes each request. The operator owns
one pool per (ModelDeployment, region), or per (ModelDeployment, region, variant) where
the parallelism layouts are dispatched apart, and one `InferenceObjective` per (pool, tier)
carrying the tier's priority, so that the gateway's flow control serves tiers in the order
the router does.

Everything is owned by the ModelDeployment (ownerReferences): Kubernetes' garbage collector
removes it with the ModelDeployment. The API is discovered, not assumed: a cluster without
the InferencePool CRD runs the operator as before, and the condition `InferencePools` says
why there are no pools. The rendering is pure; `reconcile_gateway` is the only part that
speaks to the API server.
"""

from __future__ import annotations

import hashlib
import re
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, cast

from kubernetes.client.exceptions import ApiException
from pydantic import ValidationError

from sageserve.api.common import DNS_LABEL
from sageserve.api.model_deployment import (
    POOL_PLACEHOLDER,
    EndpointPicker,
    FailureMode,
    GatewayParent,
    ModelDeployment,
    PoolScope,
    RegionPlacement,
    inference_pool_name,
    pod_set_name,
)
from sageserve.api.scaling_policy import spill_from_status
from sageserve.api.workload_tier import TierType
from sageserve.controller.kube import FIELD_MANAGER, Kube
from sageserve.controller.podset import pod_set_metadata
from sageserve.controller.status import covers, set_condition
from sageserve.core.labels import (
    COMPONENT_INFERENCE,
    COMPONENT_LABEL,
    LABEL_DEPLOYMENT,
    LABEL_REGION,
    LABEL_VARIANT,
    MANAGED_BY,
    MANAGED_BY_LABEL,
)

POOL_GROUP = "inference.networking.k8s.io"
POOL_VERSION = "v1"
POOL_KIND = "InferencePool"
POOL_PLURAL = "inferencepools"
#: InferenceObjective APIs, in order of preference: llm-d-router's (where the objective
#: moved with the EPP), then the one the Gateway API Inference Extension shipped up to
#: v1.5. Both have the same spec (poolRef, priority).
OBJECTIVE_APIS: tuple[tuple[str, str], ...] = (
    ("llm-d.ai", "v1alpha2"),
    ("inference.networking.x-k8s.io", "v1alpha2"),
)
OBJECTIVE_KIND = "InferenceObjective"
OBJECTIVE_PLURAL = "inferenceobjectives"
#: The request header a gateway's endpoint picker reads the objective's name from.
OBJECTIVE_HEADER = "x-gateway-inference-objective"
#: Label naming the WorkloadTier an InferenceObjective stands for.
LABEL_TIER = "sageserve.io/tier"
#: GAIE's multi-cluster export (proposal 1374): the pool is mirrored into every cluster of
#: the ClusterSet as an InferencePoolImport
EXPORT_ANNOTATION = "inference.networking.x-k8s.io/export"
EXPORT_TO = "ClusterSet"
IMPORT_GROUP = "inference.networking.x-k8s.io"
IMPORT_VERSION = "v1alpha1"
IMPORT_KIND = "InferencePoolImport"
IMPORT_PLURAL = "inferencepoolimports"
ROUTE_GROUP = "gateway.networking.k8s.io"
ROUTE_VERSION = "v1"
ROUTE_PLURAL = "httproutes"
#: The header GAIE's body-based router sets to the request's model: a route matches on it
MODEL_HEADER = "X-Gateway-Model-Name"
#: A route's weights add up to this (Gateway API weights are relative integers)
WEIGHT_TOTAL = 1000

#: Environment the operator reads (set by `sageserve operator` and the Helm chart).
ENV_POOLS = "SAGESERVE_INFERENCE_POOLS"
ENV_ENDPOINT_PICKER = "SAGESERVE_ENDPOINT_PICKER"
#: The served APIs are discovered at most this often (CRDs installed later are found).
DISCOVERY_SECONDS = 10.0

CONDITION = "InferencePools"

#: Objective names are DNS subdomains: at most 253 characters.
NAME_MAX = 253


class GatewayConfigError(ValueError):
    """The operator's InferencePool settings do not parse; the message names the fix."""


@dataclass(frozen=True)
class GatewayConfig:
    """The operator's InferencePool settings: on or off, and its default endpoint picker."""

    enabled: bool = True
    endpoint_picker: EndpointPicker | None = None


def parse_endpoint_picker(text: str) -> EndpointPicker:
    """`SERVICE:PORT[:FailOpen|FailClose]` as an endpoint picker, e.g. `{pool}-epp:9002`.

    Raises GatewayConfigError naming what is wrong and the form expected."""
    form = (
        "expected SERVICE:PORT[:FailOpen|FailClose], e.g. {pool}-epp:9002:FailClose "
        "({pool} stands for each InferencePool's name)"
    )
    parts = text.strip().split(":")
    if len(parts) not in (2, 3) or not parts[0] or not parts[1]:
        raise GatewayConfigError(f"endpoint picker {text!r}: {form}")
    if not parts[1].isdigit():
        raise GatewayConfigError(
            f"endpoint picker {text!r}: port {parts[1]!r} is not a number; {form}"
        )
    modes = [m.value for m in FailureMode]
    if len(parts) == 3 and parts[2] not in modes:
        raise GatewayConfigError(
            f"endpoint picker {text!r}: failure mode {parts[2]!r} is not one of {modes}"
        )
    wire: dict[str, Any] = {"name": parts[0], "port": int(parts[1])}
    if len(parts) == 3:
        wire["failureMode"] = parts[2]
    try:
        return EndpointPicker.model_validate(wire)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise GatewayConfigError(
            f"endpoint picker {text!r}: {where}: {first['msg']} "
            "(the Service name is a DNS label, where {pool} stands for the pool's name; the "
            "port 1-65535)"
        ) from exc


def gateway_config(env: Mapping[str, str]) -> GatewayConfig:
    """The settings from the environment (`SAGESERVE_INFERENCE_POOLS`: auto or off;
    `SAGESERVE_ENDPOINT_PICKER`: SERVICE:PORT[:MODE]). Raises GatewayConfigError naming
    the variable, the `sageserve operator` flag and the Helm value to fix."""
    mode = env.get(ENV_POOLS, "auto").strip().lower() or "auto"
    if mode not in ("auto", "off"):
        raise GatewayConfigError(
            f"{ENV_POOLS}={mode!r} is not auto or off (sageserve operator "
            "--inference-pools/--no-inference-pools; Helm gateway.inferencePool.enabled)"
        )
    raw = env.get(ENV_ENDPOINT_PICKER, "").strip()
    try:
        picker = parse_endpoint_picker(raw) if raw else None
    except GatewayConfigError as exc:
        raise GatewayConfigError(
            f"{ENV_ENDPOINT_PICKER}: {exc} (sageserve operator --endpoint-picker; Helm "
            "gateway.endpointPicker.service/port/failureMode)"
        ) from exc
    return GatewayConfig(enabled=mode == "auto", endpoint_picker=picker)


# --- pure rendering -------------------------------------------------------------------


@dataclass(frozen=True)
class PoolTarget:
    """One InferencePool of a ModelDeployment: its name and the pods it selects."""

    name: str
    region: str
    variant: str | None  # None: every variant of the region


def pool_scope(md: ModelDeployment, layouts_declared: bool) -> PoolScope:
    """`spec.gateway.poolScope`, else Variant when the ModelDeployment's ScalingPolicy
    declares OServe layouts (each layout is dispatched apart) and it has several variants,
    else Region."""
    if md.spec.gateway is not None and md.spec.gateway.pool_scope is not None:
        return md.spec.gateway.pool_scope
    if layouts_declared and len(md.spec.variants) > 1:
        return PoolScope.VARIANT
    return PoolScope.REGION


def policy_declares_layouts(policies: Sequence[Mapping[str, Any]], name: str) -> bool:
    """Whether the ScalingPolicy `name` among `policies` (raw objects) sets spec.layouts."""
    for raw in policies:
        if (raw.get("metadata") or {}).get("name") == name:
            return bool((raw.get("spec") or {}).get("layouts"))
    return False


def pool_targets(md: ModelDeployment, scope: PoolScope) -> list[PoolTarget]:
    """The pools of `md`: per region the one `spec.regions[].inferencePool` names (default
    `<name>-<region>`, the name the picker's signals are read under, `metrics.picker`), or
    the pod set's name `<name>-<region>-<variant>` per (region, variant)."""
    name = md.metadata.name
    if scope is PoolScope.REGION:
        return [PoolTarget(inference_pool_name(md, r), r.name, None) for r in md.spec.regions]
    return [
        PoolTarget(pod_set_name(name, r.name, v.name), r.name, v.name)
        for r in md.spec.regions
        for v in md.spec.variants
    ]


def pool_selector(deployment: str, target: PoolTarget) -> dict[str, str]:
    """The labels that select exactly the serving pods of one pool: the ModelDeployment's
    pods (its component label keeps out a ModelPool's pods of the same name) in the
    region, of the variant when the pool has one."""
    selector = {
        MANAGED_BY_LABEL: MANAGED_BY,
        COMPONENT_LABEL: COMPONENT_INFERENCE,
        LABEL_DEPLOYMENT: deployment,
        LABEL_REGION: target.region,
    }
    if target.variant is not None:
        selector[LABEL_VARIANT] = target.variant
    return selector


def _labels(deployment: str, target: PoolTarget) -> dict[str, str]:
    labels = {
        MANAGED_BY_LABEL: MANAGED_BY,
        LABEL_DEPLOYMENT: deployment,
        LABEL_REGION: target.region,
    }
    if target.variant is not None:
        labels[LABEL_VARIANT] = target.variant
    return labels


def endpoint_picker_of(md: ModelDeployment, config: GatewayConfig) -> EndpointPicker | None:
    """The ModelDeployment's endpoint picker, else the operator's default, else None."""
    if md.spec.gateway is not None and md.spec.gateway.endpoint_picker is not None:
        return md.spec.gateway.endpoint_picker
    return config.endpoint_picker


def picker_service(picker: EndpointPicker, pool: str) -> str:
    """The endpoint picker Service of `pool`: the picker's name with `{pool}` replaced."""
    return picker.name.replace(POOL_PLACEHOLDER, pool)


def picker_problem(picker: EndpointPicker, targets: Sequence[PoolTarget]) -> str | None:
    """Why the picker's name gives no valid Service name for some pool, else None."""
    for target in targets:
        name = picker_service(picker, target.name)
        if len(name) > 63 or not re.fullmatch(DNS_LABEL, name):
            return (
                f"endpoint picker {picker.name!r} gives the Service name {name!r} for pool "
                f"{target.name}, not an RFC 1123 label of at most 63 characters: shorten "
                "spec.gateway.endpointPicker.name (or the operator's --endpoint-picker), "
                "or the ModelDeployment, region or variant name"
            )
    return None


def render_pool(
    md: ModelDeployment,
    target: PoolTarget,
    picker: EndpointPicker,
    namespace: str,
    owner_uid: str | None,
) -> dict[str, Any]:
    """The InferencePool of one target: the engine port, the selector, the picker."""
    name = md.metadata.name
    return {
        "apiVersion": f"{POOL_GROUP}/{POOL_VERSION}",
        "kind": POOL_KIND,
        "metadata": pod_set_metadata(target.name, namespace, _labels(name, target), md, owner_uid),
        "spec": {
            "selector": {"matchLabels": pool_selector(name, target)},
            "targetPorts": [{"number": md.spec.engine.port}],
            "endpointPickerRef": {
                "group": "",
                "kind": "Service",
                "name": picker_service(picker, target.name),
                "port": {"number": picker.port},
                "failureMode": picker.failure_mode.value,
            },
        },
    }


def objective_priority(tier_type: TierType, priority: int) -> int:
    """A WorkloadTier's priority as an InferenceObjective's.

    sageserve serves the lower `spec.priority` first (0..1000) and interactive work always
    before batch work; an InferenceObjective's higher priority is served first, and a
    request with no objective counts as 0. So interactive tiers map to 1000 - p (0..1000,
    IW-F 0 → 1000, IW-N 1 → 999) and batch tiers to -1 - p (below every interactive tier
    and below requests that name no objective)."""
    if tier_type is TierType.INTERACTIVE:
        return 1000 - priority
    return -1 - priority


def objective_name(pool: str, tier: str) -> str:
    """`<pool>-<tier>`, shortened with a hash past 253 characters."""
    name = f"{pool}-{tier}"
    if len(name) <= NAME_MAX:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:8]
    return f"{name[: NAME_MAX - 9].rstrip('-.')}-{digest}"


@dataclass(frozen=True)
class TierPriority:
    """What an InferenceObjective needs of a WorkloadTier."""

    name: str
    type: TierType
    priority: int


def tier_priorities(tiers: Sequence[Mapping[str, Any]]) -> dict[str, TierPriority]:
    """`{name: TierPriority}` of raw WorkloadTier objects; one that does not parse is left
    out (it reports its own problem)."""
    out: dict[str, TierPriority] = {}
    for raw in tiers:
        spec = raw.get("spec") or {}
        try:
            out[raw["metadata"]["name"]] = TierPriority(
                raw["metadata"]["name"], TierType(spec["type"]), int(spec["priority"])
            )
        except (KeyError, ValueError, TypeError):
            continue
    return out


def render_objective(
    md: ModelDeployment,
    target: PoolTarget,
    tier: TierPriority,
    api: tuple[str, str],
    namespace: str,
    owner_uid: str | None,
) -> dict[str, Any]:
    """The InferenceObjective of (pool, tier): the tier's priority on that pool."""
    labels = {**_labels(md.metadata.name, target), LABEL_TIER: tier.name}
    name = objective_name(target.name, tier.name)
    return {
        "apiVersion": f"{api[0]}/{api[1]}",
        "kind": OBJECTIVE_KIND,
        "metadata": pod_set_metadata(name, namespace, labels, md, owner_uid),
        "spec": {
            "poolRef": {"group": POOL_GROUP, "kind": POOL_KIND, "name": target.name},
            "priority": objective_priority(tier.type, tier.priority),
        },
    }


def render_gateway(
    md: ModelDeployment,
    scope: PoolScope,
    picker: EndpointPicker,
    tiers: Mapping[str, TierPriority],
    objective_api: tuple[str, str] | None,
    namespace: str,
    owner_uid: str | None,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Every InferencePool of `md` and, when an objective API is served, one
    InferenceObjective per (pool, tier of `spec.tiers` that exists)."""
    targets = pool_targets(md, scope)
    pools = [render_pool(md, t, picker, namespace, owner_uid) for t in targets]
    objectives = (
        [
            render_objective(md, t, tiers[name], objective_api, namespace, owner_uid)
            for t in targets
            for name in md.spec.tiers
            if name in tiers
        ]
        if objective_api is not None
        else []
    )
    return pools, objectives


def route_weights(shares: Mapping[str, float]) -> tuple[int, dict[str, int]]:
    """(the home pool's weight, {imported pool: weight}) out of WEIGHT_TOTAL: each planned
    share rounded (shares adding up past 1 scaled down to 1), home the rest. Table-tested."""
    positive = {k: v for k, v in shares.items() if v > 0}
    total = sum(positive.values())
    scale = 1.0 / total if total > 1.0 else 1.0
    weights = {k: round(WEIGHT_TOTAL * v * scale) for k, v in sorted(positive.items())}
    weights = {k: w for k, w in weights.items() if w > 0}
    return max(0, WEIGHT_TOTAL - sum(weights.values())), weights


def render_route(
    md: ModelDeployment,
    pool: PoolTarget,
    parents: Sequence[GatewayParent],
    shares: Mapping[str, float],
    namespace: str,
    owner_uid: str | None,
) -> dict[str, Any]:
    """The HTTPRoute of one region: the model's requests (by GAIE's model header) to the
    region's own pool and, by the plan's spill-over `shares` (imported pool name →
    share), to other clusters' pools as InferencePoolImports."""
    home, imported = route_weights(shares)
    backends: list[dict[str, Any]] = [
        {"group": POOL_GROUP, "kind": POOL_KIND, "name": pool.name, "weight": home}
    ]
    backends += [
        {"group": IMPORT_GROUP, "kind": IMPORT_KIND, "name": name, "weight": weight}
        for name, weight in imported.items()
    ]
    parent_refs = []
    for p in parents:
        ref: dict[str, Any] = {"group": ROUTE_GROUP, "kind": "Gateway", "name": p.name}
        if p.namespace is not None:
            ref["namespace"] = p.namespace
        if p.section_name is not None:
            ref["sectionName"] = p.section_name
        parent_refs.append(ref)
    served = md.spec.model.served_name or md.spec.model.name
    match = {"headers": [{"type": "Exact", "name": MODEL_HEADER, "value": served}]}
    return {
        "apiVersion": f"{ROUTE_GROUP}/{ROUTE_VERSION}",
        "kind": "HTTPRoute",
        "metadata": pod_set_metadata(
            pool.name, namespace, _labels(md.metadata.name, pool), md, owner_uid
        ),
        "spec": {
            "parentRefs": parent_refs,
            "rules": [{"matches": [match], "backendRefs": backends}],
        },
    }


def planned_shares(
    policies: Sequence[Mapping[str, Any]], md: ModelDeployment
) -> dict[str, dict[str, float]]:
    """home region → {region: share} of `md` in its ScalingPolicy's plan in force."""
    for raw in policies:
        if (raw.get("metadata") or {}).get("name") == md.spec.policy_ref.name:
            plan = (raw.get("status") or {}).get("plan") or {}
            return spill_from_status(plan).get(md.metadata.name, {})
    return {}


@dataclass
class GatewayOutcome:
    """What one pass did: the pools and objectives now owned, and the condition."""

    ok: bool
    reason: str
    message: str
    pools: list[str] = field(default_factory=list)
    objectives: list[str] = field(default_factory=list)
    objective_api: str | None = None
    routes: list[str] = field(default_factory=list)


def gateway_status(
    conditions: Sequence[Mapping[str, Any]],
    outcome: GatewayOutcome,
    now: datetime,
    generation: int | None,
) -> dict[str, Any]:
    """`status.gateway` and the conditions with `InferencePools` set."""
    gateway: dict[str, Any] = {
        "inferencePools": sorted(outcome.pools),
        "inferenceObjectives": sorted(outcome.objectives),
        "routes": sorted(outcome.routes),
    }
    if outcome.objective_api is not None:
        gateway["objectiveApi"] = outcome.objective_api
    return {
        "gateway": gateway,
        "conditions": set_condition(
            conditions, CONDITION, outcome.ok, outcome.reason, outcome.message, now, generation
        ),
    }


# --- the API server ----------------------------------------------------------------------


@dataclass(frozen=True)
class ServedApis:
    """Which of the inference APIs the cluster serves."""

    pools: bool
    objective: tuple[str, str] | None
    #: Gateway API HTTPRoute
    routes: bool = False
    #: GAIE's multi-cluster InferencePoolImport
    imports: bool = False


_discovery_lock = threading.Lock()
_discovered: dict[int, tuple[float, ServedApis]] = {}


def _serves(k: Kube, group: str, version: str, plural: str) -> bool:
    try:
        listed = k.custom.get_api_resources(group, version)
    except ApiException as exc:
        if exc.status in (404, 503):
            return False
        raise
    return any(r.name == plural for r in listed.resources or [])


def served_apis(k: Kube) -> ServedApis:
    """The served APIs, discovered at most every DISCOVERY_SECONDS per client."""
    with _discovery_lock:
        at, found = _discovered.get(id(k), (float("-inf"), ServedApis(False, None)))
        if time.monotonic() - at < DISCOVERY_SECONDS:
            return found
    pools = _serves(k, POOL_GROUP, POOL_VERSION, POOL_PLURAL)
    objective = next((api for api in OBJECTIVE_APIS if _serves(k, *api, OBJECTIVE_PLURAL)), None)
    routes = _serves(k, ROUTE_GROUP, ROUTE_VERSION, ROUTE_PLURAL)
    imports = _serves(k, IMPORT_GROUP, IMPORT_VERSION, IMPORT_PLURAL)
    found = ServedApis(pools, objective, routes, imports)
    with _discovery_lock:
        _discovered[id(k)] = (time.monotonic(), found)
    return found


def forget_discovery() -> None:
    """Discover the APIs again on the next pass (CRDs just installed or removed)."""
    with _discovery_lock:
        _discovered.clear()


def _owned(k: Kube, api: tuple[str, str], plural: str, namespace: str, md: str) -> dict[str, Any]:
    listed = cast(
        dict[str, Any],
        k.custom.list_namespaced_custom_object(
            api[0],
            api[1],
            namespace,
            plural,
            label_selector=f"{MANAGED_BY_LABEL}={MANAGED_BY},{LABEL_DEPLOYMENT}={md}",
        ),
    )
    return {o["metadata"]["name"]: o for o in listed.get("items") or []}


def _region(body: Mapping[str, Any]) -> str:
    return str(body["metadata"]["labels"][LABEL_REGION])


def exported(pool: dict[str, Any], fleet: bool) -> dict[str, Any]:
    """A pool as written in a fleet of clusters: annotated for export to the ClusterSet
    (GAIE's multi-cluster InferencePools: a multi-cluster controller mirrors it into the
    other clusters as an InferencePoolImport of the same name, which their HTTPRoutes can
    name as a backend); as it is in one cluster."""
    if not fleet:
        return pool
    meta = dict(pool["metadata"])
    meta["annotations"] = {**(meta.get("annotations") or {}), EXPORT_ANNOTATION: EXPORT_TO}
    return {**pool, "metadata": meta}


def _sync(
    k: Kube,
    api: tuple[str, str],
    plural: str,
    namespace: str,
    md: ModelDeployment,
    desired: Sequence[dict[str, Any]],
) -> list[str]:
    """Apply `desired` (server-side, skipping what already matches) and delete the owned
    objects no longer desired; returns the names now owned. In a member, the objects carry
    no owner reference (the ModelDeployment is the hub's)."""
    existing = _owned(k, api, plural, namespace, md.metadata.name)
    for body in desired:
        name = body["metadata"]["name"]
        have = existing.get(name)
        if have is not None and covers(have, {"metadata": body["metadata"], "spec": body["spec"]}):
            continue
        k.custom.patch_namespaced_custom_object(
            api[0],
            api[1],
            namespace,
            plural,
            name,
            body,
            field_manager=FIELD_MANAGER,
            force=True,
            _content_type="application/apply-patch+yaml",
        )
    wanted = {b["metadata"]["name"] for b in desired}
    for name in sorted(set(existing) - wanted):
        try:
            k.custom.delete_namespaced_custom_object(api[0], api[1], namespace, plural, name)
        except ApiException as exc:
            if exc.status != 404:
                raise
    return sorted(wanted)


def _refused(exc: ApiException) -> str:
    return f"{exc.status} {exc.reason}: {str(exc.body or '')[:300]}"


@dataclass
class Synced:
    """What `_sync_where_served` left in the clusters."""

    pools: list[str] = field(default_factory=list)
    objectives: list[str] = field(default_factory=list)
    routes: list[str] = field(default_factory=list)
    #: regions whose cluster serves no InferencePool API
    absent: list[str] = field(default_factory=list)
    #: why a route asked for was not written, per region
    unrouted: list[str] = field(default_factory=list)


def _sync_where_served(
    k: Kube,
    md: ModelDeployment,
    scope: PoolScope,
    picker: EndpointPicker,
    tiers: Mapping[str, TierPriority],
    apis: ServedApis,
    namespace: str,
    uid: str | None,
    policies: Sequence[Mapping[str, Any]],
) -> Synced:
    """Each region's pools and objectives where its pods are (a member region's in the
    member, `Kube.by_cluster`), and with `spec.gateway.route` its HTTPRoute there."""
    out = Synced()
    placement = {r.name: r for r in md.spec.regions}
    clusters = k.by_cluster(placement)
    home_of = {region: i for i, (_, regions, _) in enumerate(clusters) for region in regions}
    shares = planned_shares(policies, md)
    for i, (client, regions, remote) in enumerate(clusters):
        served = served_apis(client) if remote else apis
        if not served.pools:
            out.absent += sorted(regions)
            continue
        owner = None if remote else uid
        pools, objectives = render_gateway(
            md, scope, picker, tiers, served.objective, namespace, owner
        )
        pools = [exported(p, k.spans_clusters) for p in pools if _region(p) in regions]
        out.pools += _sync(client, (POOL_GROUP, POOL_VERSION), POOL_PLURAL, namespace, md, pools)
        if served.objective is not None:
            objectives = [o for o in objectives if _region(o) in regions]
            out.objectives += _sync(
                client, served.objective, OBJECTIVE_PLURAL, namespace, md, objectives
            )
        routes, unrouted = _routes_for(
            k, md, scope, served, regions, placement, shares, i, home_of, namespace, owner
        )
        out.unrouted += unrouted
        if served.routes:
            route_api = (ROUTE_GROUP, ROUTE_VERSION)
            try:  # none asked for: the ones written before go (where they may be listed)
                out.routes += _sync(client, route_api, ROUTE_PLURAL, namespace, md, routes)
            except ApiException as exc:
                if routes or exc.status != 403:
                    raise
    return out


def _routes_for(
    k: Kube,
    md: ModelDeployment,
    scope: PoolScope,
    served: ServedApis,
    regions: frozenset[str],
    placement: Mapping[str, RegionPlacement],
    shares: Mapping[str, Mapping[str, float]],
    cluster: int,
    home_of: Mapping[str, int],
    namespace: str,
    owner: str | None,
) -> tuple[list[dict[str, Any]], list[str]]:
    """The HTTPRoute of one cluster's region when `spec.gateway.route` asks for it: the
    region's pool, and the planned shares to regions of other clusters as their imported
    pools (where this cluster serves InferencePoolImport); else why there is none."""
    route = md.spec.gateway.route if md.spec.gateway is not None else None
    if route is None:
        return [], []
    why = "its cluster serves no HTTPRoute" if not served.routes else ""
    why = why or _unroutable(k, scope, regions)
    if why:
        return [], [f"{r}: {why}" for r in sorted(regions)]
    [region] = regions
    target = PoolTarget(inference_pool_name(md, placement[region]), region, None)
    away = {
        inference_pool_name(md, placement[to]): share
        for to, share in shares.get(region, {}).items()
        if to in placement and home_of.get(to, cluster) != cluster and served.imports
    }
    return [render_route(md, target, route.parent_refs, away, namespace, owner)], []


def _unroutable(k: Kube, scope: PoolScope, regions: frozenset[str]) -> str:
    """Why a cluster's regions get no route, or "" (one region, one pool, several
    clusters): a Gateway sees every client of its cluster, so a cluster holding two of the
    model's regions cannot tell whose share a request is."""
    if not k.spans_clusters:
        return "routes carry shares between clusters; this fleet is one cluster"
    if scope is not PoolScope.REGION:
        return "routes need spec.gateway.poolScope Region (one pool per region)"
    if len(regions) > 1:
        return "it shares its cluster with another of the model's regions"
    return ""


def reconcile_gateway(
    k: Kube,
    md: ModelDeployment,
    namespace: str,
    uid: str | None,
    policies: Sequence[Mapping[str, Any]],
    env: Mapping[str, str],
) -> GatewayOutcome:
    """Make the cluster's InferencePools and InferenceObjectives of `md` what its spec
    says; never raises for what a person must fix (the outcome's condition says it)."""
    try:
        config = gateway_config(env)
    except GatewayConfigError as exc:
        return GatewayOutcome(False, "InvalidGatewayConfig", str(exc))
    if not config.enabled:
        return GatewayOutcome(
            False,
            "Disabled",
            "InferencePools are turned off (sageserve operator --no-inference-pools; Helm "
            "gateway.inferencePool.enabled=false)",
        )
    try:
        apis = served_apis(k)
    except ApiException as exc:
        return GatewayOutcome(False, "DiscoveryFailed", f"API discovery: {_refused(exc)}")
    if not apis.pools:
        return GatewayOutcome(
            False,
            "InferencePoolApiAbsent",
            f"the cluster does not serve {POOL_GROUP}/{POOL_VERSION} {POOL_KIND}: install the "
            "Gateway API Inference Extension CRDs (v1.0 or later) to get InferencePools; "
            "requests go through the sageserve router meanwhile",
        )
    picker = endpoint_picker_of(md, config)
    if picker is None:
        return GatewayOutcome(
            False,
            "NoEndpointPicker",
            "no endpoint picker for the InferencePools: set spec.gateway.endpointPicker "
            "(name, port) or the operator's default (sageserve operator --endpoint-picker "
            "SERVICE:PORT; Helm gateway.endpointPicker.service and .port)",
        )
    scope = pool_scope(md, policy_declares_layouts(policies, md.spec.policy_ref.name))
    problem = picker_problem(picker, pool_targets(md, scope))
    if problem is not None:
        return GatewayOutcome(False, "InvalidEndpointPicker", problem)
    tiers = tier_priorities(k.objects(namespace, "workloadtiers"))
    try:
        synced = _sync_where_served(k, md, scope, picker, tiers, apis, namespace, uid, policies)
    except ApiException as exc:
        forget_discovery()  # a CRD removed meanwhile answers 404: look again next pass
        return GatewayOutcome(False, "ApplyFailed", f"InferencePools: {_refused(exc)}")
    pools, objectives, routes = sorted(synced.pools), sorted(synced.objectives), synced.routes
    api = f"{apis.objective[0]}/{apis.objective[1]}" if apis.objective else None
    if synced.absent:
        return GatewayOutcome(
            False,
            "InferencePoolApiAbsent",
            f"the member cluster(s) of region(s) {', '.join(synced.absent)} do not serve "
            f"{POOL_GROUP}/{POOL_VERSION} {POOL_KIND}: install the Gateway API Inference "
            "Extension CRDs there; the other regions' pools are applied",
            pools,
            objectives,
            api,
            routes,
        )
    where = "per (region, variant)" if scope is PoolScope.VARIANT else "per region"
    message = f"{len(pools)} InferencePool(s) {where}, endpoint picker {picker.name}:{picker.port}"
    if api is not None:
        message += f"; {len(objectives)} InferenceObjective(s) ({api})"
    else:
        message += (
            "; no InferenceObjective API served (llm-d.ai/v1alpha2 or "
            "inference.networking.x-k8s.io/v1alpha2): the gateway does not see the tiers' "
            "priorities"
        )
    if routes:
        message += f"; {len(routes)} HTTPRoute(s) with the plan's spill-over weights"
    if synced.unrouted:
        message = f"{message}; no HTTPRoute for {'; '.join(synced.unrouted)}"
        return GatewayOutcome(False, "RouteNotWritten", message, pools, objectives, api, routes)
    return GatewayOutcome(True, "PoolsApplied", message, pools, objectives, api, routes)
