"""Leader election with a coordination.k8s.io Lease, so only one replica paces and plans.

Two operator replicas run for availability; both handle ModelDeployment events (server-side
apply of the same objects is idempotent), but only the Lease holder scales, plans and moves
nodes, so nothing is done twice. The holder renews the Lease every pass; another replica
takes it over once it has not been renewed for `duration_s`.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from sageserve.controller.kube import Kube

LEASE_NAME = "sageserve-operator"


def identity() -> str:
    """This replica's name in the Lease (the pod name in a cluster)."""
    return os.environ.get("POD_NAME") or f"{socket.gethostname()}-{os.getpid()}"


def may_take(lease: dict[str, Any], me: str, now: datetime) -> bool:
    """Whether `me` may hold `lease` now: it is ours, free, or expired (pure)."""
    spec = lease.get("spec") or {}
    holder = spec.get("holderIdentity")
    if not holder or holder == me:
        return True
    renewed = spec.get("renewTime")
    if not renewed:
        return True
    last = datetime.fromisoformat(str(renewed).replace("Z", "+00:00"))
    return now - last > timedelta(seconds=int(spec.get("leaseDurationSeconds") or 15))


@dataclass
class LeaderElection:
    """Acquire-or-renew on every call; `True` means this replica leads for this pass."""

    kube: Kube
    namespace: str
    me: str
    duration_s: int = 15

    def lead(self) -> bool:
        api = client.CoordinationV1Api(self.kube.api)
        now = datetime.now(UTC)

        def lease(resource_version: str | None, acquired: datetime | None) -> client.V1Lease:
            return client.V1Lease(
                metadata=client.V1ObjectMeta(
                    name=LEASE_NAME, namespace=self.namespace, resource_version=resource_version
                ),
                spec=client.V1LeaseSpec(
                    holder_identity=self.me,
                    lease_duration_seconds=self.duration_s,
                    renew_time=now,
                    acquire_time=acquired,
                ),
            )

        try:
            current = self.kube.api.sanitize_for_serialization(
                api.read_namespaced_lease(LEASE_NAME, self.namespace)
            )
        except ApiException as exc:
            if exc.status != 404:
                raise
            try:
                api.create_namespaced_lease(self.namespace, lease(None, now))
                return True
            except ApiException as create_exc:
                if create_exc.status == 409:  # another replica created it first
                    return False
                raise
        if not may_take(current, self.me, now):
            return False
        ours = (current.get("spec") or {}).get("holderIdentity") == self.me
        acquired = None if ours else now
        if ours and (current.get("spec") or {}).get("acquireTime"):
            acquired = datetime.fromisoformat(current["spec"]["acquireTime"].replace("Z", "+00:00"))
        try:
            # The resourceVersion makes this fail if another replica renewed meanwhile.
            api.replace_namespaced_lease(
                LEASE_NAME, self.namespace, lease(current["metadata"]["resourceVersion"], acquired)
            )
        except ApiException as exc:
            if exc.status == 409:
                return False
            raise
        return True
