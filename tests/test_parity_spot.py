"""One inventory and one pending demand, two worlds, the same spot pass (SageServe §2.3, §6.4).

The operator's spot pass reads Nodes and Pods as the API server returns them
(`controller.spot.SpotPass`, in memory: `tests.controller.test_spot.FakeKube`); the
simulator reads its inventory (`sim.cluster.Cluster.spot_pass`). Both call
`pace.spot.plan_moves`: the same spot nodes must be reclaimed for the same pending
instances, same model first by the operator's identity (`namespace/ModelDeployment`, any
variant), and the same whole idle serving nodes donated, none in a busy pair.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

import sageserve.controller.spot as spot_module
from sageserve.controller.spot import ANNOTATION_DONATED_AT, ANNOTATION_LAST_MODEL, SpotPass
from sageserve.core.labels import NodeLabels
from sageserve.core.types import EndpointKey
from sageserve.sim.cluster import Cluster, Delays, nodes_from_manifests
from sageserve.sim.instance import Instance, InstanceHooks, Job
from tests.controller.test_spot import FakeKube
from tests.sim.helpers import H100, flat_perf

LABELS = NodeLabels()
NS = "llm"
#: (region, model) -> pod set name, as `pod_set_name` makes it for variant "h100"
POD_SETS = {
    ("west", "llama"): "llama-west-h100",
    ("west", "bloom"): "bloom-west-h100",
    ("east", "llama"): "llama-east-h100",
    ("north", "llama"): "llama-north-h100",
}


class NoHooks(InstanceHooks):
    def schedule(self, inst: Instance, when: float) -> None:
        pass

    def on_finish(self, job: Job, now: float) -> None:
        pass

    def on_idle(self, inst: Instance, now: float) -> None:
        pass


def node(name: str, region: str, pool: str, **annotations: str) -> dict:
    return {
        "metadata": {
            "name": name,
            "labels": {LABELS.region: region, LABELS.gpu_type: H100, LABELS.pool: pool},
            "annotations": dict(annotations),
        },
        "status": {"allocatable": {"nvidia.com/gpu": "8"}},
    }


def pod(name: str, model: str, region: str, node_name: str | None) -> dict:
    return {
        "metadata": {
            "name": name,
            "namespace": NS,
            "labels": {
                "app.kubernetes.io/managed-by": "sageserve",
                "sageserve.io/model-deployment": model,
                "sageserve.io/region": region,
                "sageserve.io/variant": "h100",
            },
        },
        "spec": {
            "nodeName": node_name,
            "containers": [{"resources": {"limits": {"nvidia.com/gpu": "8"}}}],
        },
        "status": {"phase": "Running" if node_name else "Pending"},
    }


def inventory() -> list[dict]:
    """west: two serving nodes, three spot nodes (llama's newer, llama's older, bloom's);
    east: two serving nodes; north: three serving nodes."""
    return [
        node("west-s0", "west", "serving"),
        node("west-s1", "west", "serving"),
        node(
            "west-p-bloom",
            "west",
            "spot",
            **{ANNOTATION_LAST_MODEL: f"{NS}/bloom", ANNOTATION_DONATED_AT: "2026-11-21T08:00:00Z"},
        ),
        node(
            "west-p-llama-old",
            "west",
            "spot",
            **{ANNOTATION_LAST_MODEL: f"{NS}/llama", ANNOTATION_DONATED_AT: "2026-11-21T07:00:00Z"},
        ),
        node(
            "west-p-llama-new",
            "west",
            "spot",
            **{ANNOTATION_LAST_MODEL: f"{NS}/llama", ANNOTATION_DONATED_AT: "2026-11-21T09:00:00Z"},
        ),
        node("east-s0", "east", "serving"),
        node("east-s1", "east", "serving"),
        node("north-s0", "north", "serving"),
        node("north-s1", "north", "serving"),
        node("north-s2", "north", "serving"),
    ]


@pytest.mark.parametrize(
    "pending_llama,pending_bloom,reclaimed",
    [
        (0, 0, []),
        (1, 0, ["west-p-llama-new"]),  # same model, the newest donated first
        (2, 1, ["west-p-llama-new", "west-p-llama-old", "west-p-bloom"]),
        # no same-model node left for bloom: llama's nodes all taken, bloom's by llama
        (3, 1, ["west-p-llama-new", "west-p-llama-old", "west-p-bloom"]),
        # another model's node: the longest donated first
        (0, 2, ["west-p-bloom", "west-p-llama-old"]),
    ],
)
def test_both_worlds_reclaim_and_donate_the_same_nodes(
    pending_llama: int,
    pending_bloom: int,
    reclaimed: list[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # the simulator: west full (llama and bloom serving), east one llama (one node idle),
    # north one llama serving and one coming up (busy: its idle node is not donated)
    cl = Cluster(nodes_from_manifests(inventory()), NoHooks(), Delays(), seed=0)
    perf = flat_perf(gpus=8)
    deps = {}
    for (region, model), name in POD_SETS.items():
        ep = cl.add_endpoint(EndpointKey(model, region), 0, 8, 1.0)
        deps[region, model] = cl.add_deployment(ep, name, replace(perf, model=model))
    cl.start_instances(deps["west", "llama"], 1, 0.0)
    cl.start_instances(deps["west", "bloom"], 1, 0.0)
    cl.start_instances(deps["east", "llama"], 1, 0.0)
    cl.start_instances(deps["north", "llama"], 1, 0.0)
    assert cl.scale_out(EndpointKey("llama", "north"), 0.0) is not None  # coming up
    for _ in range(pending_llama):
        assert cl.scale_out(EndpointKey("llama", "west"), 0.0) is None
    for _ in range(pending_bloom):
        assert cl.scale_out(EndpointKey("bloom", "west"), 0.0) is None
    sim = cl.spot_pass(10.0)

    # the operator: the same pods, where the simulator placed its instances
    pods = [
        pod(inst.id, model, region, inst.node.name)
        for (region, model), dep in deps.items()
        for inst in [*dep.instances, *dep.endpoint.provisioning]
        if inst.node is not None
    ]
    pods += [pod(f"llama-west-pending-{i}", "llama", "west", None) for i in range(pending_llama)]
    pods += [pod(f"bloom-west-pending-{i}", "bloom", "west", None) for i in range(pending_bloom)]
    region_of = {name: (region, H100) for (region, _m), name in POD_SETS.items()}
    kube = FakeKube(inventory(), pods, set())
    monkeypatch.setattr(spot_module.time, "time", lambda: 1_800_000_000.0)
    operator = SpotPass(kube, LABELS).run(  # type: ignore[arg-type]
        region_of, {("north", H100)}, dry_run=True
    )

    assert sim == operator
    # east's idle node goes to the spot pool; north's idle one does not (an instance is
    # coming up there), nor west's (instances pending), nor a half-used node
    assert sim == (reclaimed, ["east-s1"])
