"""Eviction blocked: a spot workload whose PodDisruptionBudget forbids
its eviction sits on the spot node a scale-out reclaims first, on the real API server
(its Eviction API answers 429), controller-manager (the budget's status) and scheduler.

What the platform team sees: the budget is honoured (the spot pod is never evicted); the
reclaim retries for the bound (SAGESERVE_RECLAIM_TIMEOUT_SECONDS), then gives that node
back to the spot pool and takes the next one, so the new instance serves without waiting
for ever; a `ReclaimBlocked` condition and a Warning Event name the node, the pod and the
budget.
"""

from __future__ import annotations

import copy
import json
import time
from pathlib import Path

import pytest
import yaml
from e2e.inventory import DEFAULT_INVENTORY, load_nodes
from e2e_helpers import eventually, kubectl
from fault_kit import condition, events, figure, pods, wait_condition
from kopf.testing import KopfRunner
from operator_kit import (
    FakeVllm,
    apply,
    model_deployment,
    operator_args,
    operator_env,
    replicas,
    scaling_policy,
    spot_workload,
)

pytestmark = pytest.mark.slow
REGION = "us-east"
SPOT_NODE = f"gpu-{REGION}-a100-spot-0"
SERVING_NODE = f"gpu-{REGION}-a100-serving-0"
#: a second spot node of the same shape, for this test only (the inventory has one)
OTHER_SPOT = f"gpu-{REGION}-a100-spot-1"
SELECTOR = "sageserve.io/model-deployment=llama8b"
BOUND = 10
PDB = "spot-batch-keep"


def node_doc(kubeconfig: Path, name: str) -> dict:
    out = kubectl(kubeconfig, ["get", "node", name, "-o", "json"]).stdout
    found: dict = json.loads(out)
    return found


def add_spot_node(kubeconfig: Path) -> None:
    """A copy of the inventory's spot node under another name; KWOK makes it Ready."""
    [doc] = [n for n in load_nodes(DEFAULT_INVENTORY) if n["metadata"]["name"] == SPOT_NODE]
    doc = copy.deepcopy(doc)
    doc["metadata"]["name"] = OTHER_SPOT
    doc["metadata"]["labels"]["kubernetes.io/hostname"] = OTHER_SPOT
    kubectl(kubeconfig, ["create", "-f", "-"], stdin=yaml.safe_dump(doc))

    def ready() -> bool:
        conditions = node_doc(kubeconfig, OTHER_SPOT).get("status", {}).get("conditions", [])
        return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)

    eventually(ready, 60, f"{OTHER_SPOT} Ready")


def others_on(kubeconfig: Path, node: str, namespace: str) -> list[str]:
    """Pods of other namespaces still on `node` (an earlier test's namespace is deleted
    without waiting: its pods may hold the serving node's GPUs for a while)."""
    out = kubectl(
        kubeconfig,
        ["get", "pods", "-A", "--field-selector", f"spec.nodeName={node}", "-o", "json"],
    ).stdout
    items = json.loads(out)["items"]
    return [
        f"{p['metadata']['namespace']}/{p['metadata']['name']}"
        for p in items
        if p["metadata"]["namespace"] != namespace
    ]


@pytest.mark.usefixtures("restore_node_pools")
def test_a_reclaim_a_disruption_budget_refuses_gives_up_after_a_bound_and_takes_another_node(
    kubeconfig: Path,
    namespace: str,
    prometheus_url: str,
    prometheus_targets_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    operator_env(monkeypatch, kubeconfig, namespace, prometheus_url, 0)
    monkeypatch.setenv("SAGESERVE_RECLAIM_TIMEOUT_SECONDS", str(BOUND))
    # the spot workload on the spot node, protected by a budget that allows no disruption
    apply(kubeconfig, namespace, spot_workload(REGION))
    budget = {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": PDB},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "spot-batch"}}},
    }
    apply(kubeconfig, namespace, budget)

    def batch() -> list[dict]:
        return pods(kubeconfig, namespace, "app=spot-batch")

    [spot_pod] = eventually(
        lambda: [p for p in batch() if p["status"].get("phase") == "Running"] or None,
        60,
        "the spot workload running",
    )
    assert spot_pod["spec"]["nodeName"] == SPOT_NODE
    spot_name = spot_pod["metadata"]["name"]

    def budget_holds() -> bool:
        out = kubectl(kubeconfig, ["get", "pdb", PDB, "-n", namespace, "-o", "json"]).stdout
        status = json.loads(out).get("status", {})
        return status.get("currentHealthy") == 1 and status.get("disruptionsAllowed") == 0

    eventually(budget_holds, 60, "the budget computed: no disruption allowed")
    add_spot_node(kubeconfig)

    fake = FakeVllm()
    fake.set(0.5)
    target = fake.scrape(prometheus_targets_dir, namespace, REGION, kubeconfig)
    model = model_deployment([REGION], gpus=8, theta=1800, lo=1, hi=2)

    def serving_nodes() -> list[str]:
        found = pods(kubeconfig, namespace, SELECTOR)
        return sorted(p["spec"]["nodeName"] for p in found if p["status"].get("phase") == "Running")

    def pool(node: str) -> str:
        return str(node_doc(kubeconfig, node)["metadata"]["labels"]["sageserve.io/pool"])

    # the first instance must fit the serving node, or its own reclaim would meet the budget
    # first and put the spot node out of reach for the bound's five times
    eventually(
        lambda: not others_on(kubeconfig, SERVING_NODE, namespace),
        180,
        f"{SERVING_NODE} free of earlier tests' pods",
    )
    try:
        with KopfRunner(operator_args(namespace), timeout=600) as runner:
            apply(kubeconfig, namespace, scaling_policy("reactive"), model)
            eventually(lambda: len(serving_nodes()) == 1, 90, "one instance running")
            assert serving_nodes() == [SERVING_NODE]

            fake.set(0.9)  # a second instance: no serving GPU left, a spot node is reclaimed
            started = time.monotonic()
            eventually(lambda: replicas(kubeconfig, namespace, REGION) == 2, 60, "scale-out")
            # spot-0 comes first (by name); its eviction is refused while the bound runs
            eventually(lambda: pool(SPOT_NODE) == "serving", 30, f"{SPOT_NODE} reclaimed")
            blocked = wait_condition(
                kubeconfig, namespace, "ReclaimBlocked", "True", BOUND + 60, "EvictionRefused"
            )
            gave_up = time.monotonic() - started
            message = blocked["message"]
            assert SPOT_NODE in message, message
            assert f"pod {namespace}/{spot_name}" in message, message
            assert f"PodDisruptionBudget {namespace}/{PDB}" in message, message
            [warning] = events(kubeconfig, namespace, "ReclaimBlocked")
            assert warning["type"] == "Warning"
            assert SPOT_NODE in warning["message"] and spot_name in warning["message"]
            assert PDB in warning["message"]
            assert gave_up >= BOUND  # it did retry for the bound before giving up

            # the next node is taken: the new instance serves there
            both = eventually(
                lambda: len(serving_nodes()) == 2 and serving_nodes(),
                90,
                "the second instance running on the other spot node",
            )
            recovered = time.monotonic() - started
            assert OTHER_SPOT in both and SPOT_NODE not in both, both
            assert pool(SPOT_NODE) == "spot" and pool(OTHER_SPOT) == "serving"
            annotations = node_doc(kubeconfig, SPOT_NODE)["metadata"]["annotations"]
            assert PDB in annotations["sageserve.io/reclaim-blocked-by"]
            # the budget was honoured: the protected pod was never evicted
            [still] = batch()
            assert still["metadata"]["name"] == spot_name
            assert still["status"]["phase"] == "Running" and not still["metadata"].get(
                "deletionTimestamp"
            )
            assert still["spec"]["nodeName"] == SPOT_NODE
            reclaimed = [e["message"] for e in events(kubeconfig, namespace, "Reclaimed")]
            assert len(reclaimed) == 2, reclaimed
            assert SPOT_NODE in reclaimed[0] and OTHER_SPOT in reclaimed[1], reclaimed
            assert len(events(kubeconfig, namespace, "ReclaimBlocked")) == 1
            assert (condition(kubeconfig, namespace, "ReclaimBlocked") or {})["status"] == "True"
            figure(
                "eviction blocked",
                f"reclaim given up {gave_up:.1f} s after the scale-out (bound {BOUND} s); "
                f"second instance Running on {OTHER_SPOT} {recovered:.1f} s after it; "
                "0 pods evicted against the budget, 2 reclaims, 1 give-up",
            )
        assert runner.exception is None, runner.output
    finally:
        target.unlink(missing_ok=True)
        fake.close()
        kubectl(kubeconfig, ["delete", "pdb", PDB, "-n", namespace], check=False)
        kubectl(kubeconfig, ["delete", "node", OTHER_SPOT, "--wait=false"], check=False)
