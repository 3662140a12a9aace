"""What the router learns from the cluster: ready pods, ModelDeployments, WorkloadTiers, the
routing rules of each model's ScalingPolicy (spec) and the plans' spill-over weights and
OServe layouts (ScalingPolicy status).

One thread per kind runs a Kubernetes list + watch (no polling loop) and hands the whole
current set to the event loop after every change; an expired watch (410 Gone) or a broken
connection re-lists after a pause, so the router's view is level-triggered like the
operator's. Only Ready, not terminating pods of sageserve pod sets become backends.
"""

from __future__ import annotations

import asyncio
import base64
import functools
import json
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from kubernetes import client, watch

from sageserve.api.common import GROUP, VERSION
from sageserve.api.model_deployment import ModelDeployment
from sageserve.api.scaling_policy import (
    LayoutWeights,
    ScalingPolicy,
    ScalingPolicySpec,
    layouts_from_status,
    spill_from_status,
)
from sageserve.api.workload_tier import LimitScope, RateLimits, TierType, WorkloadTier
from sageserve.core.labels import LABEL_DEPLOYMENT, LABEL_REGION, LABEL_VARIANT
from sageserve.dispatch.deadlines import capacity_at_max
from sageserve.dispatch.from_policy import (
    instance_scheduling_of,
    release_rules_of,
    route_threshold_of,
)
from sageserve.dispatch.rate_limit import Limits
from sageserve.dispatch.tiers import TierMatch
from sageserve.perf.layout_check import profile_names
from sageserve.perf.model import PerfCatalog, load_catalog, request_decode_tps
from sageserve.plan.learned_capacity import deadline_theta
from sageserve.router.fleet import Backend, Fleet, ModelRoute
from sageserve.router.pool_switcher import PoolSwitcher, pool_routes

log = logging.getLogger("sageserve.router")
#: Where the router forwards a pod's requests; fields: pod_ip, port, namespace, pod.
DEFAULT_BACKEND_URL = "http://{pod_ip}:{port}"


def backend_of(pod: Mapping[str, Any], url_template: str) -> Backend | None:
    """The pod as a backend, if it is a Ready, not terminating pod of a pod set."""
    meta = pod.get("metadata") or {}
    labels = meta.get("labels") or {}
    status = pod.get("status") or {}
    if LABEL_DEPLOYMENT not in labels or meta.get("deletionTimestamp"):
        return None
    conditions = status.get("conditions") or []
    if not any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions):
        return None
    containers = (pod.get("spec") or {}).get("containers") or [{}]
    ports = containers[0].get("ports") or [{}]
    url = url_template.format(
        pod_ip=status.get("podIP", ""),
        port=ports[0].get("containerPort", 8000),
        namespace=meta.get("namespace", ""),
        pod=meta.get("name", ""),
    )
    return Backend(
        namespace=str(meta.get("namespace")),
        pod=str(meta.get("name")),
        model_deployment=str(labels[LABEL_DEPLOYMENT]),
        region=str(labels.get(LABEL_REGION, "")),
        variant=str(labels.get(LABEL_VARIANT, "")),
        url=url,
    )


@functools.cache
def perf_catalog() -> PerfCatalog:
    """The bundled perf profiles (read once): the simulator's."""
    return load_catalog()


def request_rate(md: ModelDeployment, catalog: PerfCatalog) -> float:
    """Tokens/s one request of `md` decodes at on a full instance, the slowest variant's
    (`perf.model.request_decode_tps`, the rate the simulator's Queue Manager is given):
    from the first perf profile that describes every variant (`profile_names`: the
    `sageserve.io/perf-profile` annotation, the ModelDeployment's name, the model's);
    0 when none does."""
    for name in profile_names(md):
        try:
            perfs = [catalog.get(name, v.gpu_type, v.gpus_per_instance) for v in md.spec.variants]
        except KeyError:
            continue
        return request_decode_tps(perfs)
    return 0.0


def model_route(obj: Mapping[str, Any], catalog: PerfCatalog | None = None) -> ModelRoute | None:
    """A ModelDeployment as the router serves it; None if it does not validate. Its
    per-request decode rate (`request_rate`) and its capacity at maxInstances (θ, the
    fastest variant's θ in force, declared or learned: `plan.learned_capacity.
    deadline_theta`, × Σ regions' maxInstances, as the simulator and the operator reckon
    it) are what the batch Queue Manager's deadline rules read."""
    try:
        md = ModelDeployment.model_validate(
            {k: obj[k] for k in ("apiVersion", "kind", "metadata", "spec")}
        )
    except (KeyError, ValueError):
        return None
    spec = md.spec
    return ModelRoute(
        namespace=str(md.metadata.namespace),
        name=md.metadata.name,
        served_name=spec.model.served_name or spec.model.name,
        regions=tuple(r.name for r in spec.regions),
        tiers=tuple(spec.tiers),
        variants=tuple(v.name for v in spec.variants),
        policy=spec.policy_ref.name,
        request_tps=request_rate(md, catalog or perf_catalog()),
        capacity_at_max_tps=capacity_at_max(
            deadline_theta(md, obj),
            (r.max_instances for r in spec.regions),
        ),
    )


def policy_routing(
    objs: list[dict[str, Any]],
) -> tuple[dict[str, dict[str, dict[str, float]]], LayoutWeights]:
    """What the router follows of a namespace's ScalingPolicies' status (of their specs,
    the routing rules: `policy_specs`): the plans' spill-over weights
    (`status.plan.spillover`, by model deployment) and OServe layouts (`status.layouts`:
    per (model deployment, region) the request types and their weights per variant,
    OServe §4.2). Policies' entries for one endpoint are put together."""
    spill: dict[str, dict[str, dict[str, float]]] = {}
    layouts: LayoutWeights = {}
    for obj in objs:
        status = obj.get("status") or {}
        spill.update(spill_from_status(status.get("plan") or {}))
        for key, types in layouts_from_status(status).items():
            layouts.setdefault(key, []).extend(types)
    return spill, layouts


def policy_specs(objs: list[dict[str, Any]]) -> dict[str, ScalingPolicySpec]:
    """A namespace's ScalingPolicies' specs by name, those that validate; the routing rules
    a model follows are its policy's (`follow_policy`)."""
    out: dict[str, ScalingPolicySpec] = {}
    for obj in objs:
        try:
            sp = ScalingPolicy.model_validate(
                {k: obj[k] for k in ("apiVersion", "kind", "metadata", "spec") if k in obj}
            )
        except ValueError:
            continue
        out[sp.metadata.name] = sp.spec
    return out


def follow_policy(route: ModelRoute, specs: Mapping[str, ScalingPolicySpec]) -> ModelRoute:
    """`dispatch` with the region threshold (SageServe §6.1), batch release rules (§6.2)
    and instance order (v3 §6.5) of the ScalingPolicy it names, mapped as the simulator maps them
    (`dispatch.from_policy`), so that the router and the simulator of one policy agree. A
    policy missing from `specs` (not created yet, deleted, or not validating) counts as
    the default policy: the paper's 70 % and 1 under 60 % / 2 under 50 %."""
    spec = specs.get(route.policy) or ScalingPolicySpec()
    return replace(
        route,
        route_threshold=route_threshold_of(spec),
        release_rules=release_rules_of(spec),
        instance_scheduling=instance_scheduling_of(spec),
    )


def tier_limits(limits: RateLimits | None) -> Limits | None:
    """A WorkloadTier's `spec.limits` as the router's limiter reads them (None: unlimited,
    also for limits naming no limit, which the API server's CEL rule refuses anyway)."""
    if limits is None or not (limits.requests_per_minute or limits.tokens_per_minute):
        return None
    return Limits(
        requests_per_minute=limits.requests_per_minute,
        tokens_per_minute=limits.tokens_per_minute,
        per_tier=limits.per == LimitScope.TIER,
    )


#: How often key Secrets are read again: a revoked key works at most this long after.
DEFAULT_KEY_RESYNC_SECONDS = 30.0


class Discovery:
    """List + watch threads that keep a `Fleet` current."""

    def __init__(
        self,
        fleet: Fleet,
        loop: asyncio.AbstractEventLoop,
        namespaces: list[str],
        url_template: str = DEFAULT_BACKEND_URL,
        api: client.ApiClient | None = None,
        pools: PoolSwitcher | None = None,
        key_resync_seconds: float = DEFAULT_KEY_RESYNC_SECONDS,
        pods_api: client.ApiClient | None = None,
    ) -> None:
        """`api` reads the models, tiers, key Secrets and policies; `pods_api` the pods,
        when they live in another cluster (a member's router reads its own cluster's pods
        and the hub's catalogue, docs/regions.md); by default `api` reads both."""
        self.fleet = fleet
        self.pools = pools
        #: routes per namespace and source (ModelDeployments, ModelPools), merged into fleet
        self._routes: dict[str, dict[str, list[ModelRoute]]] = {}
        #: ScalingPolicy specs per namespace, by name: the routes' routing rules
        self._policies: dict[str, dict[str, ScalingPolicySpec]] = {}
        self.loop = loop
        self.namespaces = namespaces
        self.url_template = url_template
        self.core = client.CoreV1Api(api)
        self.pods_core = client.CoreV1Api(pods_api) if pods_api is not None else self.core
        self.custom = client.CustomObjectsApi(api)
        self.stopped = threading.Event()
        #: watches whose first list has not reached the fleet yet
        self.unlisted: set[str] = set()
        #: every namespace's WorkloadTiers as last listed: their key Secrets are read again
        #: every `key_resync_seconds`, so a key removed from a Secret stops working then
        self.key_resync_seconds = key_resync_seconds
        self._last_tiers: dict[str, list[dict[str, Any]]] = {}

    def start(self) -> None:
        """Start every watch; `fleet.listed` is clear until each has delivered its first
        list (a request that arrives before is held, not refused as an unknown model)."""
        self.fleet.listed.clear()
        for ns in self.namespaces:
            self._thread(f"pods/{ns}", self._pods_call(ns), self._pods_for(ns))
            self._thread(
                f"models/{ns}", self._custom_call(ns, "modeldeployments"), self._models_for(ns)
            )
            self._thread(f"tiers/{ns}", self._custom_call(ns, "workloadtiers"), self._tiers_for(ns))
            if self.pools is not None:
                self._thread(
                    f"pools/{ns}", self._custom_call(ns, "modelpools"), self._pools_for(ns)
                )
            self._thread(
                f"policies/{ns}", self._custom_call(ns, "scalingpolicies"), self._policies_for(ns)
            )
        if self.key_resync_seconds > 0:
            threading.Thread(target=self._resync_keys, name="discovery-keys", daemon=True).start()

    def stop(self) -> None:
        self.stopped.set()

    # ---- what each watch lists ----------------------------------------------------------

    def _pods_call(self, ns: str) -> Callable[..., Any]:
        def call(**kw: Any) -> Any:
            return self.pods_core.list_namespaced_pod(ns, label_selector=LABEL_DEPLOYMENT, **kw)

        return call

    def _custom_call(self, ns: str, plural: str) -> Callable[..., Any]:
        def call(**kw: Any) -> Any:
            return self.custom.list_namespaced_custom_object(GROUP, VERSION, ns, plural, **kw)

        return call

    # ---- what each watch hands over -----------------------------------------------------

    def _pods_for(self, ns: str) -> Callable[[list[dict[str, Any]]], None]:
        def on_pods(objs: list[dict[str, Any]]) -> None:
            ready = [b for b in (backend_of(p, self.url_template) for p in objs) if b]

            def apply() -> None:  # this namespace's pods replace this namespace's backends
                others = [b for bs in self.fleet.backends.values() for b in bs if b.namespace != ns]
                if self.pools is not None:
                    self.pools.set_pods(ns, objs)
                self.fleet.set_backends(others + ready)

            self.loop.call_soon_threadsafe(apply)

        return on_pods

    def _models_for(self, ns: str) -> Callable[[list[dict[str, Any]]], None]:
        def on_models(objs: list[dict[str, Any]]) -> None:
            routes = [r for r in (model_route(o) for o in objs) if r]
            self.loop.call_soon_threadsafe(self._set_routes, ns, "modeldeployments", routes)

        return on_models

    def _pools_for(self, ns: str) -> Callable[[list[dict[str, Any]]], None]:
        def on_pools(objs: list[dict[str, Any]]) -> None:
            found = [p for p in (pool_routes(o) for o in objs) if p]
            routes = [r for _, rs in found for r in rs]

            def apply() -> None:
                if self.pools is not None:
                    self.pools.set_pools(ns, [info for info, _ in found])
                self._set_routes(ns, "modelpools", routes)

            self.loop.call_soon_threadsafe(apply)

        return on_pools

    def _set_routes(self, ns: str, source: str, routes: list[ModelRoute]) -> None:
        """This namespace's routes from one kind of object (on the event loop): the models
        of ModelDeployments and of ModelPools side by side."""
        self._routes.setdefault(ns, {})[source] = routes
        self._publish_routes()

    def _publish_routes(self) -> None:
        """Every namespace's routes into the fleet, each with its policy's routing rules."""
        others = [m for m in self.fleet.models.values() if m.namespace not in self._routes]
        mine = [
            follow_policy(r, self._policies.get(ns, {}))
            for ns, per in self._routes.items()
            for rs in per.values()
            for r in rs
        ]
        self.fleet.set_models(others + mine)

    def _resync_keys(self) -> None:
        """Read every listed tier's key Secret again, every `key_resync_seconds` (the
        Secrets themselves are not watched: reading the named ones needs only `get`)."""
        while not self.stopped.wait(self.key_resync_seconds):
            for ns, objs in list(self._last_tiers.items()):
                self._tiers_for(ns)(objs)

    def _tiers_for(self, ns: str) -> Callable[[list[dict[str, Any]]], None]:
        def on_tiers(objs: list[dict[str, Any]]) -> None:
            self._last_tiers[ns] = objs
            tiers = {}
            for obj in objs:
                try:
                    wt = WorkloadTier.model_validate(
                        {k: obj[k] for k in ("apiVersion", "kind", "metadata", "spec")}
                    )
                except (KeyError, ValueError):
                    continue
                keys = self._api_keys(ns, wt)
                tiers[wt.metadata.name] = TierMatch(
                    wt.metadata.name,
                    tuple(wt.spec.match.header_values),
                    keys or (),
                    keys_unreadable=keys is None,
                    batch=wt.spec.type == TierType.BATCH,
                    deadline_s=float(wt.spec.batch.deadline_seconds) if wt.spec.batch else None,
                    limits=tier_limits(wt.spec.limits),
                    priority=wt.spec.priority,
                    ttft_slo_s=wt.spec.slo.ttft_p95_seconds,
                )
            self.loop.call_soon_threadsafe(self.fleet.set_tiers, ns, tiers)

        return on_tiers

    def _policies_for(self, ns: str) -> Callable[[list[dict[str, Any]]], None]:
        def on_policies(objs: list[dict[str, Any]]) -> None:
            spill, layouts = policy_routing(objs)
            specs = policy_specs(objs)

            def apply() -> None:
                self.fleet.set_spill(ns, spill)
                self.fleet.set_layouts(ns, layouts)
                if self._policies.get(ns) != specs:
                    self._policies[ns] = specs
                    self._publish_routes()

            self.loop.call_soon_threadsafe(apply)

        return on_policies

    def _api_keys(self, ns: str, wt: WorkloadTier) -> tuple[str, ...] | None:
        """The keys of a tier's Secret; None when it cannot be read (the namespace then
        fails closed, `dispatch.identity`), never an empty list that would open it."""
        ref = wt.spec.match.api_keys_secret_ref
        if ref is None:
            return ()
        try:
            secret = self.core.read_namespaced_secret(ref.name, ns)
            values = (secret.data or {}).values()
            return tuple(sorted(base64.b64decode(v).decode().strip() for v in values))
        except client.exceptions.ApiException as exc:
            reason = exc.reason
        except (ValueError, UnicodeDecodeError) as exc:
            reason = f"a value is not base64 UTF-8 text: {exc}"
        except Exception as exc:  # API server away: fail closed until the next resync
            reason = str(exc) or type(exc).__name__
        log.warning(
            "tier %s/%s: key Secret %s unreadable (%s); the namespace refuses keys it "
            "cannot check until it is read",
            ns,
            wt.metadata.name,
            ref.name,
            reason,
        )
        return None

    # ---- list + watch -------------------------------------------------------------------

    def _thread(
        self, name: str, call: Callable[..., Any], on_change: Callable[[list[dict[str, Any]]], None]
    ) -> None:
        self.unlisted.add(name)

        def delivered(objs: list[dict[str, Any]]) -> None:
            on_change(objs)  # schedules its update on the loop, so the mark lands after it
            self.loop.call_soon_threadsafe(self._listed, name)

        t = threading.Thread(
            target=self._run, args=(call, delivered), name=f"discovery-{name}", daemon=True
        )
        t.start()

    def _listed(self, name: str) -> None:
        """On the event loop: one watch's list is in the fleet."""
        self.unlisted.discard(name)
        if not self.unlisted:
            self.fleet.listed.set()

    def _run(
        self, call: Callable[..., Any], on_change: Callable[[list[dict[str, Any]]], None]
    ) -> None:
        api = client.ApiClient()
        while not self.stopped.is_set():
            try:
                listed = call(_preload_content=False)
                doc = json.loads(listed.data)
                objs = {
                    o["metadata"]["uid"]: o for o in doc.get("items") or [] if o.get("metadata")
                }
                on_change(list(objs.values()))
                version = doc["metadata"]["resourceVersion"]
                w = watch.Watch()
                for event in w.stream(call, resource_version=version, timeout_seconds=300):
                    if self.stopped.is_set():
                        w.stop()
                        return
                    obj = event["object"]
                    obj = obj if isinstance(obj, dict) else api.sanitize_for_serialization(obj)
                    uid = (obj.get("metadata") or {}).get("uid")
                    if event["type"] == "DELETED":
                        objs.pop(uid, None)
                    elif event["type"] in ("ADDED", "MODIFIED"):
                        objs[uid] = obj
                    else:
                        break  # ERROR (e.g. 410 Gone): list again
                    on_change(list(objs.values()))
            except Exception as exc:  # API server away: list again after a pause
                log.warning("discovery watch failed (%s); listing again", exc)
                time.sleep(1.0)
