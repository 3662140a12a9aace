"""Which pods of sageserve pod sets exist, and which of them serve.

The twin simulates load on exactly the pods the cluster runs: a pod that is Running on a
node (and not being deleted) serves; a Pending pod, or one on its way out, does not. Pods
are found by the labels `controller.podset` gives every pod set; the GPU type and GPU
count come from the pod's own spec (node affinity, `nvidia.com/gpu` limits), so the twin
needs no other object to pick the performance profile.

Why polling rather than a watch: one LIST per second of a label-selected set is cheap,
and a list is level-triggered (a missed watch event cannot leave a ghost instance).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sageserve.core.labels import (
    DEFAULT_NODE_LABELS,
    GPU_RESOURCE,
    LABEL_DEPLOYMENT,
    LABEL_REGION,
    LABEL_VARIANT,
    MANAGED_BY,
    MANAGED_BY_LABEL,
    NodeLabels,
)
from sageserve.core.pooled_engines import PooledEngine, awake_per_instance, pooled_engines

#: The label selector of every pod of every sageserve pod set.
POD_SELECTOR = f"{MANAGED_BY_LABEL}={MANAGED_BY},{LABEL_DEPLOYMENT}"
#: ModelDeployment annotation naming the perf profile (the simulator's convention).
PERF_PROFILE_ANNOTATION = "sageserve.io/perf-profile"

#: (namespace, model deployment, region): the unit requests are routed to.
EndpointId = tuple[str, str, str]


@dataclass(frozen=True)
class PodInfo:
    """What the twin needs of one pod."""

    namespace: str
    name: str
    model_deployment: str
    region: str
    variant: str
    phase: str
    serving: bool
    node: str
    gpu_type: str
    gpus: int
    #: The served model name (vLLM's `model_name` label).
    model_name: str
    #: vLLM's `--max-model-len` when the pod sets it (`spec.model.contextLength`); else the
    #: model's own context length applies (its perf profile).
    max_model_len: int | None = None
    #: a pooled pod's engines (one per pooled model, `core.pooled_engines`); empty for other pods
    engines: tuple[PooledEngine, ...] = ()
    #: how many of them may be awake at once
    awake_quota: int = 1
    #: vLLM's `--tensor-parallel-size` / `--pipeline-parallel-size` (or `-tp` / `-pp`) when
    #: the pod sets them (the pod set renders both from the ModelDeployment variant); the
    #: twin then picks the (TP, PP) profile, not just one of the same GPU count
    tensor_parallel: int | None = None
    pipeline_parallel: int | None = None
    #: vLLM's `--scheduling-policy priority` (last occurrence wins): the engine serves the
    #: lowest request `priority` first; else FCFS, and a request with a priority is refused
    priority_scheduling: bool = False
    #: the pod's IP (`status.podIP`; empty until a node gives it one)
    pod_ip: str = ""
    #: TCP ports the vLLM container declares (`containerPort`), where its server listens
    ports: tuple[int, ...] = ()

    @property
    def endpoint(self) -> EndpointId:
        return (self.namespace, self.model_deployment, self.region)

    @property
    def key(self) -> tuple[str, str]:
        return (self.namespace, self.name)


def _arg(args: Sequence[str], flag: str) -> str | None:
    for i, a in enumerate(args):
        if a == flag and i + 1 < len(args):
            return str(args[i + 1])
        if a.startswith(flag + "="):
            return a.split("=", 1)[1]
    return None


def _last_arg(args: Sequence[str], flag: str) -> str | None:
    """The value of `flag`'s last occurrence (argparse: the last one wins)."""
    value: str | None = None
    for i, a in enumerate(args):
        if a == flag and i + 1 < len(args):
            value = str(args[i + 1])
        elif a.startswith(flag + "="):
            value = a.split("=", 1)[1]
    return value


def _int_arg(args: Sequence[str], flag: str) -> int | None:
    """The integer value of `flag`'s last occurrence (argparse: the last one wins, so the
    user's `spec.engine.args` override what sageserve sets before them)."""
    value: str | None = None
    for i, a in enumerate(args):
        if a == flag and i + 1 < len(args):
            value = str(args[i + 1])
        elif a.startswith(flag + "="):
            value = a.split("=", 1)[1]
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def _int_arg_any(args: Sequence[str], *flags: str) -> int | None:
    """`_int_arg` over aliases of one flag (`--tensor-parallel-size` and `-tp`): the last
    occurrence of any of them wins, as argparse's would."""
    value: int | None = None
    for i, a in enumerate(args):
        for flag in flags:
            if a == flag or a.startswith(flag + "="):
                found = _int_arg(args[i : i + 2], flag)
                if found is not None:
                    value = found
    return value


def _gpu_type(spec: Mapping[str, Any], gpu_label: str) -> str:
    """The GPU product the pod's node affinity requires (the pod set pins exactly one)."""
    terms = (
        ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
            "requiredDuringSchedulingIgnoredDuringExecution"
        )
        or {}
    ).get("nodeSelectorTerms") or []
    for term in terms:
        for expr in term.get("matchExpressions") or []:
            if expr.get("key") == gpu_label and expr.get("values"):
                return str(expr["values"][0])
    selector = spec.get("nodeSelector") or {}
    return str(selector.get(gpu_label, ""))


def _tcp_ports(container: Mapping[str, Any]) -> tuple[int, ...]:
    """The container's TCP `containerPort`s, in declaration order."""
    out: list[int] = []
    for port in container.get("ports") or []:
        if str(port.get("protocol") or "TCP") != "TCP":
            continue
        try:
            out.append(int(port["containerPort"]))
        except (KeyError, TypeError, ValueError):
            continue
    return tuple(out)


def pod_info(
    pod: Mapping[str, Any], gpu_label: str = DEFAULT_NODE_LABELS.gpu_type
) -> PodInfo | None:
    """The twin's view of a pod (a Kubernetes API dict); None if it is no pod-set pod."""
    meta = pod.get("metadata") or {}
    labels = meta.get("labels") or {}
    if labels.get(MANAGED_BY_LABEL) != MANAGED_BY or LABEL_DEPLOYMENT not in labels:
        return None
    spec = pod.get("spec") or {}
    status = pod.get("status") or {}
    containers = spec.get("containers") or [{}]
    main = next((c for c in containers if c.get("name") == "vllm"), containers[0])
    args = [str(a) for a in (main.get("args") or [])]
    gpus = 0
    for c in containers:
        res = c.get("resources") or {}
        value = (res.get("limits") or {}).get(GPU_RESOURCE) or (res.get("requests") or {}).get(
            GPU_RESOURCE
        )
        gpus += int(str(value or 0))
    phase = str(status.get("phase") or "Pending")
    node = str(spec.get("nodeName") or "")
    deleting = meta.get("deletionTimestamp") is not None
    return PodInfo(
        namespace=str(meta.get("namespace") or ""),
        name=str(meta.get("name") or ""),
        model_deployment=str(labels[LABEL_DEPLOYMENT]),
        region=str(labels.get(LABEL_REGION, "")),
        variant=str(labels.get(LABEL_VARIANT, "")),
        phase=phase,
        serving=phase == "Running" and bool(node) and not deleting,
        node=node,
        gpu_type=_gpu_type(spec, gpu_label),
        gpus=gpus,
        model_name=_arg(args, "--served-model-name") or _arg(args, "--model") or "",
        max_model_len=_int_arg(args, "--max-model-len"),
        engines=tuple(pooled_engines(meta.get("annotations"))),
        awake_quota=awake_per_instance(meta.get("annotations")),
        tensor_parallel=_int_arg_any(args, "--tensor-parallel-size", "-tp"),
        pipeline_parallel=_int_arg_any(args, "--pipeline-parallel-size", "-pp"),
        priority_scheduling=_last_arg(args, "--scheduling-policy") == "priority",
        pod_ip=str(status.get("podIP") or ""),
        ports=_tcp_ports(main),
    )


class ClusterPods:
    """Lists pod-set pods (and ModelDeployment perf-profile annotations) from the API server.

    `namespaces` empty = every namespace. Uses the kubeconfig at `kubeconfig` (else
    $KUBECONFIG / ~/.kube/config), or the in-cluster service account.
    """

    def __init__(self, namespaces: Sequence[str] = (), kubeconfig: Path | None = None) -> None:
        from kubernetes import client
        from kubernetes import config as kube_config

        config: Any = kube_config  # untyped module: keep the calls out of strict checking
        self.namespaces = list(namespaces)
        if kubeconfig is None and "KUBERNETES_SERVICE_HOST" in os.environ:
            config.load_incluster_config()
            self.api: Any = client.ApiClient()
        else:
            self.api = config.new_client_from_config(
                config_file=str(kubeconfig) if kubeconfig else None
            )
        self.core = client.CoreV1Api(self.api)
        self.custom = client.CustomObjectsApi(self.api)
        self.gpu_label = NodeLabels.from_env(os.environ).gpu_type

    def _raw(self, response: Any) -> dict[str, Any]:
        data: dict[str, Any] = json.loads(response.data)
        return data

    def list(self) -> list[PodInfo]:
        """Every pod-set pod in the watched namespaces."""
        items: list[dict[str, Any]] = []
        if not self.namespaces:
            resp = self.core.list_pod_for_all_namespaces(
                label_selector=POD_SELECTOR, _preload_content=False
            )
            items = self._raw(resp).get("items", [])
        for ns in self.namespaces:
            resp = self.core.list_namespaced_pod(
                ns, label_selector=POD_SELECTOR, _preload_content=False
            )
            items += self._raw(resp).get("items", [])
        found = (pod_info(p, self.gpu_label) for p in items)
        return [p for p in found if p is not None]

    def perf_profiles(self, namespace: str) -> dict[str, str]:
        """ModelDeployment name → its `sageserve.io/perf-profile` annotation, where set."""
        from kubernetes.client.exceptions import ApiException

        try:
            resp = self.custom.list_namespaced_custom_object(
                "sageserve.io",
                "v1alpha1",
                namespace,
                "modeldeployments",
                _preload_content=False,
            )
        except ApiException:  # CRDs not installed or no access: fall back to names
            return {}
        out = {}
        for md in self._raw(resp).get("items", []):
            meta = md.get("metadata") or {}
            profile = (meta.get("annotations") or {}).get(PERF_PROFILE_ANNOTATION)
            if profile:
                out[str(meta["name"])] = str(profile)
        return out

    def close(self) -> None:
        self.api.close()
