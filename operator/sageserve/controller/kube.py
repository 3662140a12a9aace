"""Thin adapter over the Kubernetes API: the few reads and writes the handlers need.

Kept apart from the handlers so that the decisions stay in pure functions and this is the
only module that speaks HTTP to the API server.
"""

from __future__ import annotations

from typing import Any, cast

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from sageserve.api.common import GROUP, VERSION
from sageserve.controller.podset import LABEL_DEPLOYMENT

FIELD_MANAGER = "sageserve"


class Kube:
    """Typed access to what the operator reads and writes."""

    def __init__(self, api: client.ApiClient | None = None) -> None:
        self.api = api or client.ApiClient()
        self.core = client.CoreV1Api(self.api)
        self.apps = client.AppsV1Api(self.api)
        self.custom = client.CustomObjectsApi(self.api)

    def names(self, namespace: str, plural: str) -> list[str]:
        """Names of the sageserve objects of one kind in a namespace."""
        listed = cast(
            dict[str, Any],
            self.custom.list_namespaced_custom_object(GROUP, VERSION, namespace, plural),
        )
        return [item["metadata"]["name"] for item in listed.get("items", [])]

    def nodes(self) -> list[dict[str, Any]]:
        """Every Node, as plain dicts (the form the pure code reads)."""
        listed = self.core.list_node()
        return [self.api.sanitize_for_serialization(n) for n in listed.items]

    def deployments_of(self, namespace: str, owner: str) -> dict[str, dict[str, Any]]:
        """The pod sets currently in the cluster for one ModelDeployment, by name."""
        listed = self.apps.list_namespaced_deployment(
            namespace, label_selector=f"{LABEL_DEPLOYMENT}={owner}"
        )
        plain = [self.api.sanitize_for_serialization(d) for d in listed.items]
        return {d["metadata"]["name"]: d for d in plain}

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
        )
        return dict(self.api.sanitize_for_serialization(result))

    def delete_deployment(self, namespace: str, name: str) -> None:
        """Delete a pod set that no longer belongs to its ModelDeployment's spec."""
        try:
            self.apps.delete_namespaced_deployment(name, namespace)
        except ApiException as exc:
            if exc.status != 404:
                raise
