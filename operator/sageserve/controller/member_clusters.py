"""The fleet's member clusters, read through kubeconfig Secrets (the operator's side of
`plan.member_clusters`).

A member is a Secret in the operator's namespace labelled `sageserve.io/member-cluster:
<cluster name>` whose data holds a kubeconfig under `kubeconfig` or `value`. Why kubeconfig
Secrets and not SIG-Multicluster's ClusterProfile: they are what Cluster API
(`<cluster>-kubeconfig`, key `value`), Open Cluster Management's managed-cluster
credentials, Karmada and Argo CD already hand out, so a platform team points sageserve at
the credentials it keeps today; a ClusterProfile inventory still needs a credential
plugin per provider to be dialled. The hub's own nodes stay part of the fleet, so a region
may remain a node label in the hub while others live in members.

Each plan pass lists every member's Nodes with a bounded timeout. A member that does not
answer is silent: `plan.member_clusters.fleet_view` holds its regions (the ones recorded in
`status.clusters` when it last answered) and names it in the `Clusters` condition.
"""

from __future__ import annotations

import base64
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import yaml
from kubernetes import client, config

from sageserve.controller.kube import Kube
from sageserve.core.labels import NodeLabels
from sageserve.core.nodes import parse_nodes
from sageserve.plan.member_clusters import ClusterReading, FleetView

#: label of a member's kubeconfig Secret; its value is the cluster's name in the fleet
LABEL_MEMBER = "sageserve.io/member-cluster"
#: seconds one member's Node list may take before it counts as silent
READ_TIMEOUT_S = 5.0
#: a member that did not answer is dialled again this many seconds later, not before
SILENT_RETRY_S = 10.0


#: `on`: read the member clusters (the chart's `fleet.hub.enabled`); anything else: the fleet
#: is this cluster alone
ENV_MEMBERS = "SAGESERVE_MEMBER_CLUSTERS"
#: the namespace whose Secrets name the members (the operator's own, as for its Lease)
ENV_NAMESPACE = "SAGESERVE_LEASE_NAMESPACE"
#: this cluster's name in the fleet (`status.clusters`)
ENV_CLUSTER_NAME = "SAGESERVE_CLUSTER_NAME"


class MemberConfigError(ValueError):
    """A member Secret that cannot be turned into a client: the message names the Secret and
    the fix."""


def kubeconfig_of(secret: Mapping[str, Any]) -> dict[str, Any]:
    """The kubeconfig a member Secret carries (`data.kubeconfig`, or Cluster API's
    `data.value`), decoded; a MemberConfigError naming the Secret otherwise."""
    meta = secret.get("metadata") or {}
    name = f"Secret {meta.get('namespace', '')}/{meta.get('name', '')}"
    data = secret.get("data") or {}
    raw = data.get("kubeconfig") or data.get("value")
    if not raw:
        raise MemberConfigError(f"{name}: no kubeconfig (put it under data.kubeconfig)")
    try:
        parsed = yaml.safe_load(base64.b64decode(raw, validate=True))
    except (ValueError, yaml.YAMLError) as exc:
        raise MemberConfigError(f"{name}: data.kubeconfig is not base64 YAML: {exc}") from exc
    if not isinstance(parsed, dict) or not parsed.get("clusters"):
        raise MemberConfigError(f"{name}: data.kubeconfig holds no clusters entry")
    return parsed


@dataclass
class Member:
    """One member cluster and its client, rebuilt when its Secret changes."""

    name: str
    secret_version: str
    kube: Kube | None
    #: why no client could be built (a bad Secret)
    error: str = ""


class Members:
    """The member clusters of one operator, cached across passes by Secret version."""

    def __init__(
        self,
        hub: Kube,
        namespace: str,
        timeout_s: float = READ_TIMEOUT_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.hub = hub
        self.clock = clock
        self.namespace = namespace
        self.timeout_s = timeout_s
        self._members: dict[str, Member] = {}
        #: when a member that did not answer is dialled again
        self._retry_at: dict[str, float] = {}
        self._errors: dict[str, str] = {}

    def refresh(self) -> list[Member]:
        """The members the Secrets name now (a client per member, built once per version)."""
        secrets = self.hub.labelled_secrets(self.namespace, LABEL_MEMBER)
        seen: dict[str, Member] = {}
        for secret in secrets:
            meta = secret.get("metadata") or {}
            name = str((meta.get("labels") or {}).get(LABEL_MEMBER) or meta.get("name"))
            version = str(meta.get("resourceVersion", ""))
            known = self._members.get(name)
            if known is not None and known.secret_version == version:
                seen[name] = known
                continue
            try:
                configuration = client.Configuration()
                config.load_kube_config_from_dict(
                    kubeconfig_of(secret), client_configuration=configuration
                )
                seen[name] = Member(name, version, Kube(client.ApiClient(configuration)))
            except (MemberConfigError, config.ConfigException) as exc:
                seen[name] = Member(name, version, None, str(exc))
        self._members = seen
        return sorted(seen.values(), key=lambda m: m.name)

    def read(self, labels: NodeLabels) -> MemberRead:
        """Each member as this pass reads it: its GPU nodes and client when it answered.
        Members are dialled at once (one that hangs costs the read READ_TIMEOUT_S, not
        that times the number of members), and one that did not answer is dialled again
        only SILENT_RETRY_S later (until then it stays silent with its last error), so a
        member whose API server hangs does not slow every pass of the loops."""
        members = self.refresh()
        now = self.clock()
        due = [m for m in members if m.kube is not None and now >= self._retry_at.get(m.name, 0)]
        with ThreadPoolExecutor(max(1, min(8, len(due)))) as pool:
            answers = dict(zip([m.name for m in due], pool.map(self._nodes_of, due), strict=True))
        names = {m.name for m in members}
        self._retry_at = {n: t for n, t in self._retry_at.items() if n in names}
        self._errors = {n: e for n, e in self._errors.items() if n in names}
        out = MemberRead()
        for member in members:
            answer = answers.get(member.name)
            if member.kube is None:
                answer = member.error
            elif answer is None:  # not dialled: silent since its last failure
                answer = self._errors.get(member.name, "not reachable")
            if isinstance(answer, str):
                self._errors[member.name] = answer
                if member.name in answers:
                    self._retry_at[member.name] = now + SILENT_RETRY_S
                out.readings.append(ClusterReading(member.name, reachable=False, error=answer))
                continue
            self._retry_at.pop(member.name, None)
            regions = frozenset(n.region for n in parse_nodes(answer, labels))
            out.readings.append(ClusterReading(member.name, regions))
            out.nodes[member.name] = answer
            out.clients[member.name] = member.kube  # type: ignore[assignment]
        return out

    def _nodes_of(self, member: Member) -> list[dict[str, Any]] | str:
        """A member's Nodes, or why they could not be read."""
        assert member.kube is not None
        try:
            return member.kube.nodes(timeout_s=self.timeout_s)
        except Exception as exc:  # any failure to read is silence, never a crash
            return short(exc)


@dataclass
class MemberRead:
    """What one read of the members found."""

    readings: list[ClusterReading] = field(default_factory=list)
    #: the Nodes of each member that answered
    nodes: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    #: the client of each member that answered
    clients: dict[str, Kube] = field(default_factory=dict)


def short(exc: BaseException) -> str:
    """An API or connection error in one line a condition can carry."""
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text}"[:300]


def clusters_status(view: FleetView, readings: Sequence[ClusterReading]) -> list[dict[str, Any]]:
    """`status.clusters`: each member, its regions and whether it answered (pure). The
    regions of a silent member are the ones it had when last read, which the next pass reads
    back as `last_home` (so a restarted operator still knows what to hold)."""
    out = []
    for reading in sorted(readings, key=lambda r: r.name):
        silent = view.silent.get(reading.name)
        regions = sorted(silent[0]) if silent else sorted(reading.regions)
        entry: dict[str, Any] = {
            "name": reading.name,
            "regions": regions,
            "reachable": reading.reachable,
        }
        if not reading.reachable:
            entry["message"] = reading.error[:300] or "not reachable"
        out.append(entry)
    return out


def last_home(status_clusters: object) -> dict[str, str]:
    """region → member from a recorded `status.clusters` (pure; tolerant of anything else)."""
    out: dict[str, str] = {}
    if not isinstance(status_clusters, list):
        return out
    for entry in status_clusters:
        if isinstance(entry, dict) and isinstance(entry.get("regions"), list):
            for region in entry["regions"]:
                out[str(region)] = str(entry.get("name"))
    return out


_members: dict[tuple[int, str], Members] = {}


def members_of(hub: Kube, env: Mapping[str, str]) -> Members | None:
    """The operator's members (one cache per hub client and namespace), or None when the
    fleet is this cluster alone."""
    if env.get(ENV_MEMBERS, "").strip().lower() != "on":
        return None
    namespace = env.get(ENV_NAMESPACE) or "default"
    key = (id(hub), namespace)
    if key not in _members:
        _members[key] = Members(hub, namespace)
    return _members[key]


def hub_name(env: Mapping[str, str]) -> str:
    """This cluster's own name in the fleet."""
    return env.get(ENV_CLUSTER_NAME, "").strip() or "hub"
