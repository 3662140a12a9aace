"""GPU capacity is real: the kube-scheduler places 8-GPU pods by region, GPU type and
pool on KWOK nodes from the inventory, and refuses what does not fit."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from e2e_helpers import eventually
from kubernetes import client

from e2e import inventory

REGION, PRODUCT, POOL = inventory.REGION_LABEL, inventory.GPU_PRODUCT_LABEL, inventory.POOL_LABEL
H100 = "NVIDIA-H100-80GB-HBM3"
NAMESPACE = "gpu-e2e"


def gpu_pod_template(
    app: str, region: str, product: str, pool: str, gpus: int = 8
) -> client.V1PodTemplateSpec:
    """A pod like the operator's pod sets: GPU request plus required node affinity."""
    terms = [
        client.V1NodeSelectorRequirement(key=k, operator="In", values=[v])
        for k, v in ((REGION, region), (PRODUCT, product), (POOL, pool))
    ]
    affinity = client.V1Affinity(
        node_affinity=client.V1NodeAffinity(
            required_during_scheduling_ignored_during_execution=client.V1NodeSelector(
                node_selector_terms=[client.V1NodeSelectorTerm(match_expressions=terms)]
            )
        )
    )
    resources = client.V1ResourceRequirements(
        requests={"cpu": "1", "memory": "1Gi", "nvidia.com/gpu": str(gpus)},
        limits={"nvidia.com/gpu": str(gpus)},
    )
    return client.V1PodTemplateSpec(
        metadata=client.V1ObjectMeta(labels={"app": app}),
        spec=client.V1PodSpec(
            affinity=affinity,
            containers=[
                client.V1Container(
                    name="vllm", image="vllm/vllm-openai:v0.11.0", resources=resources
                )
            ],
        ),
    )


def deployment(name: str, replicas: int, template: client.V1PodTemplateSpec) -> client.V1Deployment:
    return client.V1Deployment(
        metadata=client.V1ObjectMeta(name=name),
        spec=client.V1DeploymentSpec(
            replicas=replicas,
            selector=client.V1LabelSelector(match_labels={"app": name}),
            template=template,
        ),
    )


@pytest.fixture(scope="module")
def core(api_client: Any) -> Iterator[client.CoreV1Api]:
    api = client.CoreV1Api(api_client)
    api.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=NAMESPACE)))
    # Pods need the namespace's default ServiceAccount, made by the controller-manager.
    eventually(
        lambda: api.list_namespaced_service_account(NAMESPACE).items, 60, "default ServiceAccount"
    )
    yield api
    api.delete_namespace(NAMESPACE)


@pytest.fixture(scope="module")
def apps(api_client: Any) -> client.AppsV1Api:
    return client.AppsV1Api(api_client)


def pods_of(core: client.CoreV1Api, app: str) -> list[client.V1Pod]:
    return list(core.list_namespaced_pod(NAMESPACE, label_selector=f"app={app}").items)


def test_inventory_nodes_are_ready_with_8_gpus(core: client.CoreV1Api) -> None:
    expected = {n["metadata"]["name"]: n for n in inventory.load_nodes(inventory.DEFAULT_INVENTORY)}
    nodes = {n.metadata.name: n for n in core.list_node().items}
    assert set(expected) <= set(nodes)
    for name, want in expected.items():
        node = nodes[name]
        assert node.status.allocatable["nvidia.com/gpu"] == "8"
        for key in (REGION, PRODUCT, POOL):
            assert node.metadata.labels[key] == want["metadata"]["labels"][key]
        ready = [c for c in node.status.conditions if c.type == "Ready"]
        assert ready and ready[0].status == "True", name


def test_gpu_deployment_runs_on_matching_node_and_extra_pod_stays_pending(
    core: client.CoreV1Api, apps: client.AppsV1Api
) -> None:
    # The small inventory has exactly one us-west H100 serving node: 8 GPUs, one pod.
    name = "llama-us-west-h100"
    template = gpu_pod_template(name, "us-west", H100, "serving")
    apps.create_namespaced_deployment(NAMESPACE, deployment(name, 2, template))

    def one_running_one_pending() -> tuple[client.V1Pod, client.V1Pod] | None:
        pods = pods_of(core, name)
        running = [p for p in pods if p.status.phase == "Running"]
        pending = [
            p
            for p in pods
            if p.status.phase == "Pending"
            and any(
                c.type == "PodScheduled" and c.status == "False" and c.reason == "Unschedulable"
                for c in (p.status.conditions or [])
            )
        ]
        if len(pods) == 2 and len(running) == 1 and len(pending) == 1:
            return running[0], pending[0]
        return None

    running, pending = eventually(
        one_running_one_pending, 90, "one pod Running and one Unschedulable"
    )
    assert running.spec.node_name == "gpu-us-west-h100-serving-0"
    assert pending.spec.node_name is None
    message = next(c.message for c in pending.status.conditions if c.type == "PodScheduled")
    assert "nvidia.com/gpu" in message or "node affinity" in message, message


def test_spot_pool_pod_lands_on_spot_node(core: client.CoreV1Api, apps: client.AppsV1Api) -> None:
    name = "batch-us-east-a100-spot"
    template = gpu_pod_template(name, "us-east", "NVIDIA-A100-SXM4-80GB", "spot")
    apps.create_namespaced_deployment(NAMESPACE, deployment(name, 1, template))

    def running() -> list[client.V1Pod]:
        return [p for p in pods_of(core, name) if p.status.phase == "Running"]

    pods = eventually(running, 90, "the spot pod to run")
    assert pods[0].spec.node_name == "gpu-us-east-a100-spot-0"


def test_pod_asking_more_gpus_than_any_node_has_stays_pending(core: client.CoreV1Api) -> None:
    template = gpu_pod_template("too-big", "us-central", H100, "serving", gpus=16)
    pod = client.V1Pod(
        metadata=client.V1ObjectMeta(name="too-big", labels={"app": "too-big"}), spec=template.spec
    )
    core.create_namespaced_pod(NAMESPACE, pod)

    def unschedulable() -> str | None:
        got = core.read_namespaced_pod("too-big", NAMESPACE)
        for cond in got.status.conditions or []:
            if cond.type == "PodScheduled" and cond.reason == "Unschedulable":
                return str(cond.message)
        return None

    message = eventually(unschedulable, 60, "the scheduler to mark the pod Unschedulable")
    assert "Insufficient nvidia.com/gpu" in message
    assert core.read_namespaced_pod("too-big", NAMESPACE).status.phase == "Pending"
