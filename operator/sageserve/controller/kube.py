"""Thin adapter over the Kubernetes API: the few reads and writes the handlers need.

Kept apart from the handlers so that the decisions stay in pure functions and this is the
only module that speaks HTTP to the API server.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any, cast

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from sageserve.api.common import GROUP, VERSION
from sageserve.core.labels import (
    ANNOTATION_ACTUATION,
    ANNOTATION_REPLICAS,
    ANNOTATION_SCALING,
    LABEL_DEPLOYMENT,
    MANAGED_BY,
    MANAGED_BY_LABEL,
)
from sageserve.keda import scaledobject as so

FIELD_MANAGER = "sageserve"

#: The pace loop owns replica counts; reconciling owns the rest of each pod set.
PACE_MANAGER = "sageserve-pace"


class ReplicasMoved(Exception):
    """A pod set's replicas changed between the pass's read and its write: not written."""


class KedaUnavailable(Exception):
    """KEDA's ScaledObjects cannot be used: the CRD is not installed (`reason`
    `KedaNotInstalled`) or the operator may not touch them (`KedaForbidden`)."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def _pointer(key: str) -> str:
    """`key` as one JSON Pointer token (RFC 6901)."""
    return key.replace("~", "~0").replace("/", "~1")


def _plain(response: Any) -> dict[str, Any]:
    """The JSON body of a call made with `_preload_content=False`, as plain dicts.

    The operator reads Nodes, Pods and Deployments as dicts; letting the client build its
    model objects first (and serialising them back) cost seconds and hundreds of MB per
    list of 2,000 Nodes."""
    return cast(dict[str, Any], json.loads(response.data))


def refusal(namespace: str, status: int, body: str) -> str:
    """What refused an eviction, from the API server's answer: `PodDisruptionBudget
    <namespace>/<name> (<its message>)` when a budget did, else the status and message."""
    try:
        answer = json.loads(body)
    except ValueError:
        return f"{status} {body[:200]}"
    causes = (answer.get("details") or {}).get("causes") or []
    for cause in causes:
        message = str(cause.get("message") or "")
        found = re.search(r"disruption budget (\S+)", message)
        if cause.get("reason") == "DisruptionBudget" and found:
            return f"PodDisruptionBudget {namespace}/{found.group(1)} ({message})"
    return f"{status} {answer.get('reason', '')}: {answer.get('message', '')}"[:300]


class Kube:
    """Typed access to what the operator reads and writes."""

    def __init__(self, api: client.ApiClient | None = None) -> None:
        self.api = api or client.ApiClient()
        self.core = client.CoreV1Api(self.api)
        self.apps = client.AppsV1Api(self.api)
        self.custom = client.CustomObjectsApi(self.api)

    def held_regions(self) -> frozenset[str]:
        """Regions whose pod sets may not be written now: none in one cluster (a fleet of
        clusters holds a silent member's, `controller.fleet_kube`)."""
        return frozenset()

    def placed(self, body: dict[str, Any]) -> dict[str, Any]:
        """A pod set as it is written where it lives (here: as it is)."""
        return body

    def by_cluster(self, regions: Iterable[str]) -> list[tuple[Kube, frozenset[str], bool]]:
        """`regions` grouped by the cluster that serves them: (its client, its regions,
        whether it is a member rather than this cluster). One cluster: this one, all."""
        return [(self, frozenset(regions), False)]

    @property
    def spans_clusters(self) -> bool:
        """Whether the fleet is several clusters (`controller.fleet_kube`)."""
        return False

    def names(self, namespace: str, plural: str) -> list[str]:
        """Names of the sageserve objects of one kind in a namespace."""
        return [item["metadata"]["name"] for item in self.objects(namespace, plural)]

    def objects(self, namespace: str, plural: str) -> list[dict[str, Any]]:
        """The sageserve objects of one kind in a namespace, as plain dicts."""
        listed = cast(
            dict[str, Any],
            self.custom.list_namespaced_custom_object(GROUP, VERSION, namespace, plural),
        )
        return list(listed.get("items", []))

    def objects_in(self, namespaces: list[str] | None, plural: str) -> list[dict[str, Any]]:
        """Sageserve objects of one kind in `namespaces`, or in every namespace if None."""
        if namespaces is None:
            listed = cast(
                dict[str, Any],
                self.custom.list_cluster_custom_object(GROUP, VERSION, plural),
            )
            return list(listed.get("items", []))
        return [obj for ns in namespaces for obj in self.objects(ns, plural)]

    def event(self, obj: dict[str, Any], type_: str, reason: str, message: str) -> None:
        """Post a core/v1 Event about `obj` (from any thread, unlike kopf's posting)."""
        meta = obj["metadata"]
        now = datetime.now(UTC)
        self.core.create_namespaced_event(
            meta["namespace"],
            client.CoreV1Event(
                metadata=client.V1ObjectMeta(generate_name=f"{meta['name']}."),
                involved_object=client.V1ObjectReference(
                    api_version=obj["apiVersion"],
                    kind=obj["kind"],
                    name=meta["name"],
                    namespace=meta["namespace"],
                    uid=meta.get("uid"),
                ),
                type=type_,
                reason=reason,
                message=message[:1024],
                source=client.V1EventSource(component="sageserve"),
                reporting_component="sageserve",
                reporting_instance=os.environ.get("HOSTNAME", "sageserve"),
                first_timestamp=now,
                last_timestamp=now,
                count=1,
            ),
        )

    def patch_status(self, namespace: str, plural: str, name: str, status: dict[str, Any]) -> None:
        """Merge-patch the status subresource of a sageserve object."""
        self.custom.patch_namespaced_custom_object_status(
            GROUP, VERSION, namespace, plural, name, {"status": status}
        )

    def set_replicas(
        self,
        namespace: str,
        observed: dict[str, Any],
        replicas: int,
        drop_scaling: bool = False,
        drop_actuation: bool = False,
    ) -> None:
        """Set a pod set's replicas and stamp them (`sageserve.io/replicas`), only if they
        are still what the pass read: a JSON patch whose `test` makes the API server refuse
        it when someone else wrote replicas since (then `ReplicasMoved`), so sageserve
        never overwrites another writer's count it has not seen. `drop_scaling` removes
        the `sageserve.io/scaling: resume` annotation in the same write, `drop_actuation`
        the `sageserve.io/actuation: keda` one (taken back from KEDA)."""
        meta = observed.get("metadata") or {}
        before = int((observed.get("spec") or {}).get("replicas") or 0)
        annotations = meta.get("annotations") or {}
        stamp = str(replicas)
        ops: list[dict[str, Any]] = [
            {"op": "test", "path": "/spec/replicas", "value": before},
            {"op": "replace", "path": "/spec/replicas", "value": replicas},
        ]
        if meta.get("annotations"):
            path = "/metadata/annotations/" + _pointer(ANNOTATION_REPLICAS)
            ops.append({"op": "add", "path": path, "value": stamp})
        else:
            ops.append(
                {
                    "op": "add",
                    "path": "/metadata/annotations",
                    "value": {ANNOTATION_REPLICAS: stamp},
                }
            )
        if drop_scaling:
            path = "/metadata/annotations/" + _pointer(ANNOTATION_SCALING)
            ops.append({"op": "remove", "path": path})
        if drop_actuation and ANNOTATION_ACTUATION in annotations:
            path = "/metadata/annotations/" + _pointer(ANNOTATION_ACTUATION)
            ops.append({"op": "remove", "path": path})
        try:
            self.apps.patch_namespaced_deployment(
                meta["name"], namespace, ops, field_manager=PACE_MANAGER
            )
        except ApiException as exc:
            if exc.status in (409, 422):  # a failed `test` is 422 Unprocessable
                raise ReplicasMoved(f"{meta['name']}: {exc.reason}") from exc
            raise

    def autoscalers(self, namespace: str) -> dict[str, list[str]]:
        """`{Deployment name: [HorizontalPodAutoscaler/name]}` of a namespace (KEDA's
        ScaledObjects act through an HPA it names keda-hpa-<name>); empty if not allowed."""
        try:
            listed = _plain(
                client.AutoscalingV2Api(self.api).list_namespaced_horizontal_pod_autoscaler(
                    namespace, _preload_content=False
                )
            )
        except ApiException:
            return {}
        out: dict[str, list[str]] = {}
        for hpa in listed.get("items") or []:
            ref = (hpa.get("spec") or {}).get("scaleTargetRef") or {}
            if ref.get("kind") == "Deployment":
                name = f"HorizontalPodAutoscaler/{hpa['metadata']['name']}"
                out.setdefault(str(ref.get("name")), []).append(name)
        return out

    def pods(self) -> list[dict[str, Any]]:
        """Every pod of the cluster (spot workloads live in other namespaces), as dicts."""
        listed = _plain(self.core.list_pod_for_all_namespaces(_preload_content=False))
        return list(listed.get("items") or [])

    def config_map_data(self, namespace: str, name: str) -> dict[str, str] | None:
        """A ConfigMap's `data`, None when there is no such ConfigMap (the OServe layout loop
        reads measured per-type capacity from one)."""
        try:
            found = _plain(
                self.core.read_namespaced_config_map(name, namespace, _preload_content=False)
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return {str(k): str(v) for k, v in (found.get("data") or {}).items()}

    def pods_of(self, namespace: str) -> list[dict[str, Any]]:
        """The pods of every sageserve pod set of a namespace, as dicts."""
        listed = _plain(
            self.core.list_namespaced_pod(
                namespace, label_selector=LABEL_DEPLOYMENT, _preload_content=False
            )
        )
        return list(listed.get("items") or [])

    def annotate_pod(self, namespace: str, name: str, annotations: dict[str, str]) -> None:
        """Merge-patch a pod's annotations (the deletion cost of a pod chosen for draining);
        a pod already gone is fine."""
        try:
            self.core.patch_namespaced_pod(
                name, namespace, {"metadata": {"annotations": annotations}}
            )
        except ApiException as exc:
            if exc.status != 404:
                raise

    def evict(self, namespace: str, name: str) -> str | None:
        """Evict a pod through the Eviction API, so PodDisruptionBudgets are honoured.

        None when the pod is evicted or already gone; what refused it otherwise: a 429
        (a PodDisruptionBudget allows no disruption now, named from the answer's cause) or a
        500 (more than one budget selects the pod). The caller retries or gives up."""
        body = client.V1Eviction(metadata=client.V1ObjectMeta(name=name, namespace=namespace))
        try:
            self.core.create_namespaced_pod_eviction(name, namespace, body)
        except ApiException as exc:
            if exc.status == 404:
                return None
            if exc.status in (429, 500):
                return refusal(namespace, exc.status, str(exc.body or exc.reason))
            raise
        return None

    def mark_node(self, name: str, labels: dict[str, str], annotations: dict[str, str]) -> None:
        """Merge-patch a node's labels and annotations (moving it between pools)."""
        self.core.patch_node(name, {"metadata": {"labels": labels, "annotations": annotations}})

    def nodes(self, timeout_s: float | None = None) -> list[dict[str, Any]]:
        """Every Node, as plain dicts (the form the pure code reads); `timeout_s` bounds the
        call (a member cluster that does not answer must not stall the pass)."""
        kwargs: dict[str, Any] = {"_preload_content": False}
        if timeout_s is not None:
            kwargs["_request_timeout"] = timeout_s
        listed = _plain(self.core.list_node(**kwargs))
        return list(listed.get("items") or [])

    def labelled_secrets(self, namespace: str, label: str) -> list[dict[str, Any]]:
        """The Secrets of `namespace` carrying `label` (any value), as plain dicts."""
        listed = _plain(
            self.core.list_namespaced_secret(
                namespace, label_selector=label, _preload_content=False
            )
        )
        return list(listed.get("items") or [])

    def deployments_of(self, namespace: str, owner: str) -> dict[str, dict[str, Any]]:
        """The pod sets currently in the cluster for one ModelDeployment, by name."""
        listed = _plain(
            self.apps.list_namespaced_deployment(
                namespace, label_selector=f"{LABEL_DEPLOYMENT}={owner}", _preload_content=False
            )
        )
        return {d["metadata"]["name"]: d for d in listed.get("items") or []}

    def deployments_by_owner(self, namespace: str) -> dict[str, dict[str, dict[str, Any]]]:
        """Every pod set of a namespace, by ModelDeployment then name: one list call for a
        whole pass instead of one per ModelDeployment."""
        listed = _plain(
            self.apps.list_namespaced_deployment(
                namespace, label_selector=LABEL_DEPLOYMENT, _preload_content=False
            )
        )
        out: dict[str, dict[str, dict[str, Any]]] = {}
        for d in listed.get("items") or []:
            owner = ((d.get("metadata") or {}).get("labels") or {}).get(LABEL_DEPLOYMENT)
            out.setdefault(str(owner), {})[d["metadata"]["name"]] = d
        return out

    def apply(self, body: dict[str, Any]) -> dict[str, Any]:
        """Server-side apply of a Deployment under sageserve's field manager."""
        meta = body["metadata"]
        result = self.apps.patch_namespaced_deployment(
            meta["name"],
            meta["namespace"],
            body,
            field_manager=FIELD_MANAGER,
            force=True,
            _content_type="application/apply-patch+yaml",
            _preload_content=False,
        )
        return _plain(result)

    def scaled_objects(self, namespace: str) -> dict[str, dict[str, Any]]:
        """The ScaledObjects sageserve owns in a namespace, by name; `KedaUnavailable` when
        KEDA's CRD is not served or the operator may not list them."""
        try:
            listed = cast(
                dict[str, Any],
                self.custom.list_namespaced_custom_object(
                    so.GROUP,
                    so.VERSION,
                    namespace,
                    so.PLURAL,
                    label_selector=f"{MANAGED_BY_LABEL}={MANAGED_BY}",
                ),
            )
        except ApiException as exc:
            raise keda_unavailable(exc, namespace) from exc
        return {o["metadata"]["name"]: o for o in listed.get("items") or []}

    def scaled_object(self, namespace: str, name: str) -> dict[str, Any] | None:
        """One ScaledObject, None when it (or KEDA's CRD) is not there."""
        try:
            return cast(
                dict[str, Any],
                self.custom.get_namespaced_custom_object(
                    so.GROUP, so.VERSION, namespace, so.PLURAL, name
                ),
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def apply_scaled_object(self, body: dict[str, Any]) -> None:
        """Server-side apply of a ScaledObject under sageserve's field manager."""
        meta = body["metadata"]
        try:
            self.custom.patch_namespaced_custom_object(
                so.GROUP,
                so.VERSION,
                meta["namespace"],
                so.PLURAL,
                meta["name"],
                body,
                field_manager=FIELD_MANAGER,
                force=True,
                _content_type="application/apply-patch+yaml",
            )
        except ApiException as exc:
            if exc.status in (403, 404):
                raise keda_unavailable(exc, meta["namespace"]) from exc
            raise

    def delete_scaled_object(self, namespace: str, name: str) -> None:
        """Delete a ScaledObject (KEDA then deletes its HPA; replicas stay); gone is fine."""
        try:
            self.custom.delete_namespaced_custom_object(
                so.GROUP, so.VERSION, namespace, so.PLURAL, name
            )
        except ApiException as exc:
            if exc.status != 404:
                raise

    def annotate_deployment(self, namespace: str, name: str, annotations: dict[str, str]) -> None:
        """Merge-patch a pod set's annotations (no replicas written)."""
        self.apps.patch_namespaced_deployment(
            name, namespace, {"metadata": {"annotations": annotations}}, field_manager=PACE_MANAGER
        )

    def deployment_replicas(self, namespace: str, name: str) -> int | None:
        """A pod set's `spec.replicas`, None when there is no such Deployment."""
        try:
            found = _plain(
                self.apps.read_namespaced_deployment(name, namespace, _preload_content=False)
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return int((found.get("spec") or {}).get("replicas") or 0)

    def delete_deployment(self, namespace: str, name: str) -> None:
        """Delete a pod set that no longer belongs to its ModelDeployment's spec."""
        try:
            self.apps.delete_namespaced_deployment(name, namespace)
        except ApiException as exc:
            if exc.status != 404:
                raise


def keda_unavailable(exc: ApiException, namespace: str) -> KedaUnavailable:
    """What an API error on ScaledObjects means to a person (the fix named)."""
    if exc.status == 404:
        return KedaUnavailable(
            "KedaNotInstalled",
            f"the CustomResourceDefinition {so.CRD} is not installed (install KEDA v2.20+); "
            "replicas are left as they are",
        )
    if exc.status == 403:
        return KedaUnavailable(
            "KedaForbidden",
            f"the operator may not manage {so.CRD} in namespace {namespace} (set the chart's "
            "keda.enabled=true for its RBAC); replicas are left as they are",
        )
    return KedaUnavailable("KedaUnreachable", f"{so.CRD}: {exc.status} {exc.reason}")


_shared: dict[str | None, Kube] = {}


def kube() -> Kube:
    """The process's API client, from in-cluster config or the kubeconfig in KUBECONFIG.

    One client per KUBECONFIG value, read when first needed (not when the client library
    was imported), so an operator restarted in-process with other credentials uses them.
    """
    source = os.environ.get("KUBECONFIG")
    if source not in _shared:
        configuration = client.Configuration()
        try:
            config.load_incluster_config(client_configuration=configuration)
        except config.ConfigException:
            config.load_kube_config(config_file=source, client_configuration=configuration)
        _shared[source] = Kube(client.ApiClient(configuration))
    return _shared[source]
