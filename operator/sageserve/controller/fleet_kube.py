"""The fleet's clusters as one `Kube`: sageserve's own objects in the hub, each pod set in
the cluster its region lives in.

SageServe plans one fleet across regions (§5) and its pacing acts per endpoint (§4.3).
When regions are clusters (docs/regions.md), the hub's operator runs every loop as before
and only the place an object lives changes: the ModelDeployments, policies, tiers, their
status and Events stay in the hub; pod sets, their pods, the Nodes, the autoscalers and
KEDA's ScaledObjects are listed in every cluster that answers and written in the one that
holds them. So the plan, the pace step, the guard, spot donation and the KEDA hand-over
are the same code for one cluster and for many, and spot donation and reclaim stay within
each cluster (a Node is only ever written where it was listed).

Where an object is written:
- a pod set (server-side apply, replicas, annotations, deletion) and its ScaledObject: in
  the home cluster of its region (`plan.member_clusters.fleet_view`), the one whose GPU
  nodes carry the region label;
- a pod or a Node: in the cluster it was listed from.

A pod set applied into a member carries no owner reference (its ModelDeployment lives in
the hub, and a member's garbage collector deletes whatever names an owner it does not
have); `collect_orphans` deletes the member pod sets whose ModelDeployment is gone.

A silent member (its API server does not answer) is left out of every listing, so the
loops neither see nor size its pod sets: they stay as they are (nothing is scaled in
because a cluster went silent), and a write routed to it is refused (`ClusterSilent`),
never sent elsewhere.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

from kubernetes.client.exceptions import ApiException

from sageserve.controller.kube import KedaUnavailable, Kube
from sageserve.controller.member_clusters import Members, hub_name, members_of, short
from sageserve.core.labels import (
    LABEL_REGION,
    MANAGED_BY,
    MANAGED_BY_LABEL,
    NodeLabels,
)
from sageserve.core.nodes import parse_nodes
from sageserve.plan.member_clusters import ClusterReading, FleetView, fleet_view

#: A fleet is read again (every member's Nodes listed) at most this often: each pass reads
#: it at its start (`refresh`: the pace pass, the plan, each reconcile) and lists and writes
#: on that reading; the passes and reconciles of the same two seconds share one.
REFRESH_S = 2.0

T = TypeVar("T")


class FleetWriteError(RuntimeError):
    """A pod-set write the fleet could not carry out; the message names the cluster and the
    fix."""


class ClusterSilent(FleetWriteError):
    """A write routed to a cluster that does not answer (or to a region no cluster serves):
    refused, never sent to another cluster."""


class FleetKube(Kube):
    """The hub's client for sageserve's objects, every answering cluster's for the rest."""

    def __init__(self, hub: Kube, members: Members, name: str, labels: NodeLabels) -> None:
        # not Kube.__init__: the hub's client does the hub's calls (and whatever reaches for
        # the raw API objects, e.g. the InferencePools, works in the hub)
        for attr in ("api", "core", "apps", "custom"):
            if hasattr(hub, attr):
                setattr(self, attr, getattr(hub, attr))
        self.hub = hub
        self.members = members
        self.name = name
        self.labels = labels
        self._lock = threading.RLock()
        self._read_at = float("-inf")
        #: each cluster as the last read found it (the hub first)
        self.readings: list[ClusterReading] = []
        #: the clients of the clusters that answered the last read (the hub's included)
        self.clients: dict[str, Kube] = {name: hub}
        self._nodes: dict[str, list[dict[str, Any]]] = {}
        #: region → cluster, kept across reads: a silent member's regions are the ones it
        #: served when it last answered
        self._home: dict[str, str] = {}
        self.view = FleetView()
        #: (kind, namespace, name) → the cluster it was listed from (several: ambiguous)
        self._where: dict[tuple[str, str, str], set[str]] = {}
        #: namespaces where member pod sets were seen (the orphan sweep looks there)
        self._namespaces: set[str] = set()

    # ---- the fleet -------------------------------------------------------------------

    def refresh(self, force: bool = False, last_home: dict[str, str] | None = None) -> None:
        """Read the fleet (the hub's Nodes and each member's) unless read within REFRESH_S.
        `last_home` (region → cluster, from a policy's `status.clusters`) tells a restarted
        operator where a member that is silent now served."""
        with self._lock:
            for region, cluster in (last_home or {}).items():
                self._home.setdefault(region, cluster)
            if not force and time.monotonic() - self._read_at < REFRESH_S:
                return
            own = self.hub.nodes()
            read = self.members.read(self.labels)
            hub_regions = frozenset(n.region for n in parse_nodes(own, self.labels))
            self.readings = [ClusterReading(self.name, hub_regions), *read.readings]
            self.clients = {self.name: self.hub, **read.clients}
            self._nodes = {self.name: own, **read.nodes}
            self._remember("node", "", self._nodes)
            self._settle()
            self._read_at = time.monotonic()

    def _settle(self) -> None:
        self.view = fleet_view(self.readings, self._home)
        self._home.update(self.view.home)

    def _silence(self, cluster: str, exc: BaseException) -> None:
        """A member that failed a listing mid-pass is silent until it answers a read again."""
        with self._lock:
            if cluster == self.name or cluster not in self.clients:
                return
            del self.clients[cluster]
            self.readings = [
                ClusterReading(r.name, reachable=False, error=short(exc))
                if r.name == cluster
                else r
                for r in self.readings
            ]
            self._settle()

    def held_regions(self) -> frozenset[str]:
        """Regions whose cluster is silent (or that several clusters claim): their pod sets
        are neither listed nor written."""
        self.refresh()
        return self.view.held_regions

    def cluster_of_region(self, region: str) -> str | None:
        """The cluster a region's pod sets are written in (None: no cluster serves it; the
        hub's own, as for one cluster, when no cluster's nodes carry it yet)."""
        self._ensure_read()
        if region in self.view.held_regions:
            return None
        return self.view.home.get(region, self.name)

    def placed(self, body: dict[str, Any]) -> dict[str, Any]:
        """A pod set as it is written where its region lives: in a member, without the
        owner reference to the hub's ModelDeployment."""
        region = ((body.get("metadata") or {}).get("labels") or {}).get(LABEL_REGION)
        if region is None or self.cluster_of_region(str(region)) in (self.name, None):
            return body
        meta = {k: v for k, v in body["metadata"].items() if k != "ownerReferences"}
        return {**body, "metadata": meta}

    def by_cluster(self, regions: Iterable[str]) -> list[tuple[Kube, frozenset[str], bool]]:
        """`regions` by home cluster, for the clusters that answer (a held region is in
        none: nothing of it is written or deleted)."""
        self._ensure_read()
        grouped: dict[str, set[str]] = {}
        for region in regions:
            cluster = self.cluster_of_region(region)
            if cluster is not None and cluster in self.clients:
                grouped.setdefault(cluster, set()).add(region)
        return [
            (self.clients[c], frozenset(rs), c != self.name) for c, rs in sorted(grouped.items())
        ]

    @property
    def spans_clusters(self) -> bool:
        return True

    # ---- listings: every answering cluster --------------------------------------------

    def _ensure_read(self) -> None:
        """Listings and writes use the fleet as last read (each pass reads it once at its
        start, `refresh`); read it only if it never was."""
        if self._read_at == float("-inf"):
            self.refresh()

    def _each(self, fn: Callable[[Kube], T]) -> dict[str, T]:
        """`fn` on every answering cluster; a member that fails is silenced for the pass (the
        hub's failure is the pass's, as for one cluster)."""
        self._ensure_read()
        out: dict[str, T] = {}
        for cluster, k in list(self.clients.items()):
            try:
                out[cluster] = fn(k)
            except KedaUnavailable as exc:  # a member without KEDA: named, not silenced
                if cluster == self.name:
                    raise
                raise KedaUnavailable(exc.reason, f"member cluster {cluster}: {exc}") from exc
            except Exception as exc:
                if cluster == self.name:
                    raise
                self._silence(cluster, exc)
        return out

    def _remember(
        self,
        kind: str,
        namespace: str,
        listed: Mapping[str, Iterable[dict[str, Any]]],
        complete: bool = True,
    ) -> None:
        """Record where each listed object lives. A `complete` listing (every object of the
        kind in `namespace`, or everywhere when it is "") replaces what was known, so the
        record holds what exists now, never every pod that ever did."""
        with self._lock:
            if complete:
                self._where = {
                    key: found
                    for key, found in self._where.items()
                    if key[0] != kind or (namespace and key[1] != namespace)
                }
            for cluster, objs in listed.items():
                for obj in objs:
                    meta = obj.get("metadata") or {}
                    ns = namespace or str(meta.get("namespace") or "")
                    key = (kind, ns, str(meta.get("name")))
                    self._where.setdefault(key, set()).add(cluster)
                    if kind == "deploy" and cluster != self.name:
                        self._namespaces.add(ns)

    def _kube_of(self, kind: str, namespace: str, name: str) -> Kube:
        """The client of the cluster `name` was listed from."""
        found = self._where.get((kind, namespace, name), set())
        if len(found) > 1:
            raise ClusterSilent(
                f"{kind} {namespace}/{name} is in clusters {', '.join(sorted(found))}; not "
                "written (rename it in all but one)"
            )
        cluster = next(iter(found), self.name)
        k = self.clients.get(cluster)
        if k is None:
            raise ClusterSilent(f"cluster {cluster} does not answer; {namespace}/{name} held")
        return k

    def _kube_of_region(self, region: str | None, what: str) -> tuple[str, Kube]:
        if region is None:
            return self.name, self.hub
        cluster = self.cluster_of_region(region)
        k = self.clients.get(cluster) if cluster is not None else None
        if cluster is None or k is None:
            raise ClusterSilent(f"region {region}'s cluster does not answer; {what} held")
        return cluster, k

    def _pod_set_kube(self, namespace: str, name: str) -> Kube:
        """A pod set's cluster: where it was listed, else where its region lives."""
        if ("deploy", namespace, name) in self._where:
            return self._kube_of("deploy", namespace, name)
        return self.hub

    def nodes(self, timeout_s: float | None = None) -> list[dict[str, Any]]:
        self._ensure_read()
        return [n for cluster in self.clients for n in self._nodes.get(cluster, [])]

    def pods(self) -> list[dict[str, Any]]:
        listed = self._each(lambda k: k.pods())
        self._remember("pod", "", listed)
        return [p for pods in listed.values() for p in pods]

    def pods_of(self, namespace: str) -> list[dict[str, Any]]:
        listed = self._each(lambda k: k.pods_of(namespace))
        self._remember("pod", namespace, listed)
        return [p for pods in listed.values() for p in pods]

    def autoscalers(self, namespace: str) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for found in self._each(lambda k: k.autoscalers(namespace)).values():
            for name, hpas in found.items():
                out.setdefault(name, []).extend(hpas)
        return out

    def deployments_of(self, namespace: str, owner: str) -> dict[str, dict[str, Any]]:
        listed = self._each(lambda k: k.deployments_of(namespace, owner))
        self._remember(
            "deploy", namespace, {c: d.values() for c, d in listed.items()}, complete=False
        )
        return {name: d for found in listed.values() for name, d in found.items()}

    def deployments_by_owner(self, namespace: str) -> dict[str, dict[str, dict[str, Any]]]:
        listed = self._each(lambda k: k.deployments_by_owner(namespace))
        self._remember(
            "deploy",
            namespace,
            {c: [d for sets in by.values() for d in sets.values()] for c, by in listed.items()},
        )
        out: dict[str, dict[str, dict[str, Any]]] = {}
        for by_owner in listed.values():
            for owner, sets in by_owner.items():
                out.setdefault(owner, {}).update(sets)
        return out

    def scaled_objects(self, namespace: str) -> dict[str, dict[str, Any]]:
        listed = self._each(lambda k: k.scaled_objects(namespace))
        self._remember("scaledobject", namespace, {c: f.values() for c, f in listed.items()})
        return {name: o for found in listed.values() for name, o in found.items()}

    # ---- writes: where the object lives -------------------------------------------------

    def apply(self, body: dict[str, Any]) -> dict[str, Any]:
        meta = body["metadata"]
        region = (meta.get("labels") or {}).get(LABEL_REGION)
        cluster, k = self._kube_of_region(region, f"pod set {meta['name']}")
        try:
            return k.apply(self.placed(body))
        except ApiException as exc:
            if cluster == self.name or exc.status not in (403, 404):
                raise
            namespace = meta["namespace"]
            raise FleetWriteError(
                f"member cluster {cluster} refused pod set {namespace}/{meta['name']} "
                f"({exc.status} {exc.reason}): create namespace {namespace} there and list "
                "it in that member's fleet.member.namespaces (its role writes pod sets only "
                "there)"
            ) from exc

    def set_replicas(
        self,
        namespace: str,
        observed: dict[str, Any],
        replicas: int,
        drop_scaling: bool = False,
        drop_actuation: bool = False,
    ) -> None:
        k = self._pod_set_kube(namespace, observed["metadata"]["name"])
        k.set_replicas(namespace, observed, replicas, drop_scaling, drop_actuation)

    def annotate_deployment(self, namespace: str, name: str, annotations: dict[str, str]) -> None:
        self._pod_set_kube(namespace, name).annotate_deployment(namespace, name, annotations)

    def deployment_replicas(self, namespace: str, name: str) -> int | None:
        return self._pod_set_kube(namespace, name).deployment_replicas(namespace, name)

    def delete_deployment(self, namespace: str, name: str) -> None:
        self._pod_set_kube(namespace, name).delete_deployment(namespace, name)

    def annotate_pod(self, namespace: str, name: str, annotations: dict[str, str]) -> None:
        self._kube_of("pod", namespace, name).annotate_pod(namespace, name, annotations)

    def evict(self, namespace: str, name: str) -> str | None:
        return self._kube_of("pod", namespace, name).evict(namespace, name)

    def mark_node(self, name: str, labels: dict[str, str], annotations: dict[str, str]) -> None:
        self._kube_of("node", "", name).mark_node(name, labels, annotations)

    def scaled_object(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self._pod_set_kube(namespace, name).scaled_object(namespace, name)

    def apply_scaled_object(self, body: dict[str, Any]) -> None:
        meta = body["metadata"]
        target = str(((body.get("spec") or {}).get("scaleTargetRef") or {}).get("name"))
        self._pod_set_kube(meta["namespace"], target).apply_scaled_object(body)

    def delete_scaled_object(self, namespace: str, name: str) -> None:
        self._pod_set_kube(namespace, name).delete_scaled_object(namespace, name)

    def collect_orphans(self, owners: dict[str, set[str]]) -> list[str]:
        """Delete the member pod sets whose ModelDeployment or ModelPool is gone from the hub
        (`owners`: namespace → the names that exist there); returns what was deleted. Only
        sageserve's pod sets, in members that answer."""
        self._ensure_read()
        gone = []
        for namespace in sorted(self._namespaces | set(owners)):
            for cluster, k in list(self.clients.items()):
                if cluster == self.name:
                    continue  # the hub's own are garbage-collected through their owner
                try:
                    listed = k.deployments_by_owner(namespace)
                except Exception as exc:
                    self._silence(cluster, exc)
                    continue
                for owner, sets in listed.items():
                    if owner in owners.get(namespace, set()):
                        continue
                    for name, d in sets.items():
                        labels = (d.get("metadata") or {}).get("labels") or {}
                        if labels.get(MANAGED_BY_LABEL) == MANAGED_BY:  # listed by owner label
                            k.delete_deployment(namespace, name)
                            gone.append(f"{cluster}:{namespace}/{name}")
        return gone

    # ---- sageserve's own objects: the hub ----------------------------------------------

    def names(self, namespace: str, plural: str) -> list[str]:
        return self.hub.names(namespace, plural)

    def objects(self, namespace: str, plural: str) -> list[dict[str, Any]]:
        return self.hub.objects(namespace, plural)

    def objects_in(self, namespaces: list[str] | None, plural: str) -> list[dict[str, Any]]:
        return self.hub.objects_in(namespaces, plural)

    def event(self, obj: dict[str, Any], type_: str, reason: str, message: str) -> None:
        self.hub.event(obj, type_, reason, message)

    def patch_status(self, namespace: str, plural: str, name: str, status: dict[str, Any]) -> None:
        self.hub.patch_status(namespace, plural, name, status)

    def config_map_data(self, namespace: str, name: str) -> dict[str, str] | None:
        return self.hub.config_map_data(namespace, name)

    def labelled_secrets(self, namespace: str, label: str) -> list[dict[str, Any]]:
        return self.hub.labelled_secrets(namespace, label)


_fleets: dict[tuple[int, str], FleetKube] = {}


def fleet_of(hub: Kube, env: Mapping[str, str]) -> Kube:
    """The client the loops act through: the hub alone, or (`SAGESERVE_MEMBER_CLUSTERS=on`)
    the hub with every member named by a kubeconfig Secret, one per hub client."""
    members = members_of(hub, env)
    if members is None:
        return hub
    key = (id(hub), members.namespace)
    if key not in _fleets:
        _fleets[key] = FleetKube(hub, members, hub_name(env), NodeLabels.from_env(env))
    return _fleets[key]
