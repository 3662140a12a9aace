"""Node lost: the serving node of a model goes NotReady, on the real API
server, controller-manager (its node lifecycle controller taints the node) and scheduler.

KWOK keeps the nodes it manages Ready (its node stages rewrite the Ready condition and
renew the node's Lease). For this test the kwok controller manages only the nodes
annotated `kwok.x-k8s.io/node: fake` (`kwok_cluster.kwok_managing`); the lost node's
annotation is changed, so KWOK leaves it alone like a machine whose kubelet died, and its
Ready condition is set to False as that kubelet's last report would.

What the platform team sees: the pod on the lost node is not counted as serving; after the
bound (SAGESERVE_NODE_LOST_SECONDS) it is evicted with a `NodeLost` Warning Event naming
the node and the pod, and its replacement runs where capacity exists (the region's spot
node, reclaimed); the spot pool's count (`status.donatedNodes`) stays right: the lost node
is never donated nor counted as spot, even once no pod holds it; when the node comes back
Ready and idle, it is donated as usual.
"""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest
from e2e_helpers import eventually, kubectl
from fault_kit import events, figure, pods, steady
from kopf.testing import KopfRunner
from operator_kit import (
    FakeVllm,
    apply,
    model_deployment,
    operator_args,
    operator_env,
    policy_status,
    scaling_policy,
)

from e2e import kwok_cluster, state

pytestmark = pytest.mark.slow
REGION = "us-west"
SERVING_NODE = f"gpu-{REGION}-a100-serving-0"
SPOT_NODE = f"gpu-{REGION}-a100-spot-0"
SELECTOR = "sageserve.io/model-deployment=llama8b"
KWOK_ANNOTATION = "kwok.x-k8s.io/node"
BOUND = 5


def node_doc(kubeconfig: Path, name: str) -> dict:
    found: dict = json.loads(kubectl(kubeconfig, ["get", "node", name, "-o", "json"]).stdout)
    return found


def ready(kubeconfig: Path, name: str) -> str:
    conditions = node_doc(kubeconfig, name).get("status", {}).get("conditions", [])
    return next((c["status"] for c in conditions if c["type"] == "Ready"), "")


def lose(kubeconfig: Path, name: str) -> None:
    """KWOK stops managing the node; its Ready condition goes False (a kubelet's report)."""
    kubectl(kubeconfig, ["annotate", "node", name, f"{KWOK_ANNOTATION}=lost", "--overwrite"])
    now = datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")
    patch = {
        "status": {
            "conditions": [
                {
                    "type": "Ready",
                    "status": "False",
                    "reason": "KubeletNotReady",
                    "message": "container runtime is down (e2e: node lost)",
                    "lastHeartbeatTime": now,
                    "lastTransitionTime": now,
                }
            ]
        }
    }
    kubectl(
        kubeconfig,
        [
            "patch",
            "node",
            name,
            "--subresource=status",
            "--type=strategic",
            "-p",
            json.dumps(patch),
        ],
    )


def bring_back(kubeconfig: Path, name: str) -> None:
    """KWOK manages the node again and marks it Ready."""
    kubectl(kubeconfig, ["annotate", "node", name, f"{KWOK_ANNOTATION}=fake", "--overwrite"])
    eventually(lambda: ready(kubeconfig, name) == "True", 90, f"{name} Ready again")


def force_delete_on(kubeconfig: Path, namespace: str, node: str) -> None:
    for pod in pods(kubeconfig, namespace, SELECTOR):
        if pod["spec"].get("nodeName") == node:
            kubectl(
                kubeconfig,
                [
                    "delete",
                    "pod",
                    pod["metadata"]["name"],
                    "-n",
                    namespace,
                    "--grace-period=0",
                    "--force",
                ],
                check=False,
            )


@pytest.mark.usefixtures("restore_node_pools")
def test_pods_of_a_lost_node_are_replaced_and_the_spot_counts_stay_right(
    e2e_cluster: state.ClusterState,
    kubeconfig: Path,
    namespace: str,
    prometheus_url: str,
    prometheus_targets_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    if e2e_cluster.provider != "kwok":
        pytest.fail("losing a node needs the kwok provider's processes")
    operator_env(monkeypatch, kubeconfig, namespace, prometheus_url, 0)
    monkeypatch.setenv("SAGESERVE_NODE_LOST_SECONDS", str(BOUND))
    fake = FakeVllm()
    fake.set(0.5)  # between the thresholds: one instance is right all along
    target = fake.scrape(prometheus_targets_dir, namespace, REGION, kubeconfig)
    model = model_deployment([REGION], gpus=8, theta=1800, lo=1, hi=2)

    def running() -> list[tuple[str, str]]:
        return sorted(
            (p["metadata"]["name"], p["spec"]["nodeName"])
            for p in pods(kubeconfig, namespace, SELECTOR)
            if p["status"].get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")
        )

    def pool(node: str) -> str:
        return str(node_doc(kubeconfig, node)["metadata"]["labels"]["sageserve.io/pool"])

    def donated() -> int | None:
        value = policy_status(kubeconfig, namespace).get("donatedNodes")
        return None if value is None else int(value)

    kwok = kwok_cluster.kwok_managing(Path(e2e_cluster.workdir), f"{KWOK_ANNOTATION}=fake")
    try:
        with kwok, KopfRunner(operator_args(namespace), timeout=600) as runner:
            apply(kubeconfig, namespace, scaling_policy("reactive"), model)
            [(lost_pod, node)] = eventually(
                lambda: len(running()) == 1 and running(), 90, "one instance running"
            )
            assert node == SERVING_NODE
            eventually(lambda: donated() == 1, 30, "the region's spot node counted")

            started = time.monotonic()
            lose(kubeconfig, SERVING_NODE)
            [warning] = eventually(
                lambda: events(kubeconfig, namespace, "NodeLost"), BOUND + 60, "NodeLost"
            )
            detect = time.monotonic() - started
            assert warning["type"] == "Warning"
            assert warning["involvedObject"]["kind"] == "ModelDeployment"
            assert SERVING_NODE in warning["message"] and lost_pod in warning["message"]
            assert detect >= BOUND  # not before the bound
            # the replacement runs where there is capacity: the spot node, reclaimed
            [(_, placed)] = eventually(
                lambda: (r := running()) and r[0][0] != lost_pod and r, 90, "a replacement"
            )
            recovered = time.monotonic() - started
            assert placed == SPOT_NODE
            assert pool(SPOT_NODE) == "serving" and pool(SERVING_NODE) == "serving"
            eventually(lambda: donated() == 0, 30, "the reclaimed node no longer counted")
            assert len(events(kubeconfig, namespace, "NodeLost")) == 1
            assert len(events(kubeconfig, namespace, "ScaledOut")) == 0  # replaced, not added
            figure(
                "node lost",
                f"pod evicted {detect:.1f} s after the node went NotReady (bound {BOUND} s); "
                f"replacement Running on the reclaimed spot node {recovered:.1f} s after",
            )

            # the lost node's pod is force-deleted (as one does once a machine is gone): no
            # pod holds the node any more, yet it is neither donated nor counted as spot
            force_delete_on(kubeconfig, namespace, SERVING_NODE)
            eventually(
                lambda: all(
                    p["spec"].get("nodeName") != SERVING_NODE
                    for p in pods(kubeconfig, namespace, SELECTOR)
                ),
                30,
                "the lost node's pod gone",
            )
            assert steady(lambda: (pool(SERVING_NODE), donated()), 12, "pools") == ("serving", 0)
            assert not events(kubeconfig, namespace, "Donated")

            # the node comes back Ready and idle: donated as usual
            started = time.monotonic()
            bring_back(kubeconfig, SERVING_NODE)
            eventually(lambda: pool(SERVING_NODE) == "spot", 60, "the node back, donated")
            eventually(lambda: donated() == 1, 30, "the donated node counted")
            figure(
                "node lost",
                f"node back Ready and donated {time.monotonic() - started:.1f} s after; "
                "donatedNodes 1 -> 0 (reclaim) -> 1 (donation), never counting the lost node",
            )
        assert runner.exception is None, runner.output
    finally:
        target.unlink(missing_ok=True)
        fake.close()
        force_delete_on(kubeconfig, namespace, SERVING_NODE)
        if ready(kubeconfig, SERVING_NODE) != "True":
            bring_back(kubeconfig, SERVING_NODE)
