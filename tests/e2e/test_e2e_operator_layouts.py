"""OServe layouts on the real control plane (OServe §4.2, §4.3, §5.2).

Llama-2-70B on H100 with two variants of one GPU type, `tp4` (4 GPUs) and `tp4pp2`
(TP4 × PP2, 8 GPUs): two layouts of the region's 8 held GPUs, 2 × TP4 or one TP4xPP2. A
ConfigMap written here holds measured per-type capacity with hand-chosen n that cross:
short requests are best on TP4 (2 req/s each against 1), long prompts on the pipeline
(1 req/s against 0.1). Requests go over real HTTP through `sageserve router` (its own
process) to the twin's pods; the routers' request-shape counter reaches Prometheus, and the
in-process operator's layout loop re-plans every 10 s on the last 60 s of it.

Long prompts first: the operator switches 2 × TP4 → TP4xPP2, make-before-break (the
pipeline's pod starts on the region's spot node, reclaimed for it, before the TP4 pods
stop), then short requests switch it back. What a user sees is checked: status.layouts
(replicas per variant, per-type weights), the pod sets, and that the Ready GPUs of the
model never fall below the smaller layout's 8 while switching.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from e2e_helpers import eventually, kubectl
from kopf.testing import KopfRunner
from operator_kit import (
    H100,
    RouterProcess,
    TwinProcess,
    apply,
    operator_args,
    operator_env,
    policy_status,
    scaling_policy,
)

MODEL = "llama70"
SERVED = "meta-llama/Llama-2-70b-hf"
REGION = "us-central"
GPUS = {"tp4": 4, "tp4pp2": 8}
#: n (requests/s per replica) per type: short (8 prompt / 8 output tokens), long prompt
#: (2,048 / 16); chosen to cross, and small so that ~1-3 req/s saturate a layout
TABLE = {
    "kind": "sageserve.io/type-capacity",
    "model": "llama-2-70b",
    "gpuType": H100,
    "slo": {"ttftSeconds": 5.0, "tpotSeconds": 0.2, "attainment": 0.9},
    "types": [
        {"promptTokens": 8, "outputTokens": 8},
        {"promptTokens": 2048, "outputTokens": 16},
    ],
    "capacity": {"TP4": [2.0, 0.1], "TP4xPP2": [1.0, 1.0]},
}
SHORT = {"model": SERVED, "prompt": "Say hello please.", "max_tokens": 8}
LONG = {"model": SERVED, "prompt": "x" * 8000, "max_tokens": 16}  # 2,000 tokens (len // 4)


def model() -> dict[str, Any]:
    variant = {"gpuType": H100, "capacityTokensPerSecond": 1000, "startupSeconds": 10}
    return {
        "apiVersion": "sageserve.io/v1alpha1",
        "kind": "ModelDeployment",
        "metadata": {
            "name": MODEL,
            "annotations": {
                "sageserve.io/perf-profile": "llama-2-70b",
                "sageserve.io/type-capacity": "llama70-n",
            },
        },
        "spec": {
            "model": {"name": SERVED},
            "variants": [
                {"name": "tp4", "gpusPerInstance": 4, **variant},
                {
                    "name": "tp4pp2",
                    "gpusPerInstance": 8,
                    "tensorParallel": 4,
                    "pipelineParallel": 2,
                    **variant,
                },
            ],
            "regions": [
                {"name": REGION, "minInstances": 1, "maxInstances": 4, "initialInstances": 2}
            ],
            "tiers": ["iw-f", "iw-n", "niw"],
            "policyRef": {"name": "fleet"},
        },
    }


def config_map() -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "llama70-n"},
        "data": {"type-capacity.yaml": yaml.safe_dump(TABLE)},
    }


def pods(kubeconfig: Path, namespace: str) -> list[dict[str, Any]]:
    out = kubectl(
        kubeconfig,
        [
            "get",
            "pods",
            "-n",
            namespace,
            "-l",
            f"sageserve.io/model-deployment={MODEL}",
            "-o",
            "json",
        ],
    ).stdout
    items: list[dict[str, Any]] = json.loads(out)["items"]
    return items


def ready_gpus(kubeconfig: Path, namespace: str) -> dict[str, int]:
    """Ready, not terminating pods' GPUs per variant."""
    out: dict[str, int] = {}
    for p in pods(kubeconfig, namespace):
        if p["metadata"].get("deletionTimestamp"):
            continue
        conditions = p.get("status", {}).get("conditions") or []
        if any(c["type"] == "Ready" and c["status"] == "True" for c in conditions):
            v = p["metadata"]["labels"]["sageserve.io/variant"]
            out[v] = out.get(v, 0) + GPUS[v]
    return out


def pod_set_replicas(kubeconfig: Path, namespace: str) -> dict[str, int]:
    out = kubectl(kubeconfig, ["get", "deployments", "-n", namespace, "-o", "json"]).stdout
    return {
        d["metadata"]["labels"]["sageserve.io/variant"]: int(d["spec"]["replicas"])
        for d in json.loads(out)["items"]
        if d["metadata"].get("labels", {}).get("sageserve.io/model-deployment") == MODEL
    }


def layout(kubeconfig: Path, namespace: str) -> dict[str, Any] | None:
    entries = policy_status(kubeconfig, namespace).get("layouts") or []
    return next((e for e in entries if e["model"] == MODEL and e["region"] == REGION), None)


def replicas_in_force(kubeconfig: Path, namespace: str) -> dict[str, int]:
    entry = layout(kubeconfig, namespace) or {}
    return {r["variant"]: r["replicas"] for r in entry.get("replicas", [])}


class Traffic:
    """`threads` clients posting `body` through the router back to back, until stopped."""

    def __init__(self, router: RouterProcess, body: dict[str, Any], threads: int) -> None:
        self.stopped = threading.Event()
        self.codes: dict[int, int] = {}
        self.threads = [
            threading.Thread(target=self.run, args=(router, body), daemon=True)
            for _ in range(threads)
        ]
        for t in self.threads:
            t.start()

    def run(self, router: RouterProcess, body: dict[str, Any]) -> None:
        headers = {"x-sageserve-region": REGION, "x-sageserve-tier": "iw-f"}
        while not self.stopped.is_set():
            try:
                code, _ = router.post("/v1/completions", body, headers, timeout=30)
            except OSError:
                code = 0
            self.codes[code] = self.codes.get(code, 0) + 1
            if code != 200:
                time.sleep(0.5)

    def stop(self) -> None:
        self.stopped.set()
        for t in self.threads:
            t.join(timeout=40)


class ReadyFloor:
    """Polls the model's Ready GPUs while switching; `low` is the least seen."""

    def __init__(self, kubeconfig: Path, namespace: str) -> None:
        self.low: int | None = None
        self.seen: list[dict[str, int]] = []
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self.run, args=(kubeconfig, namespace), daemon=True)
        self.thread.start()

    def run(self, kubeconfig: Path, namespace: str) -> None:
        while not self.stopped.is_set():
            try:
                now = ready_gpus(kubeconfig, namespace)
            except Exception:  # an API hiccup is no reading
                continue
            self.seen.append(now)
            total = sum(now.values())
            self.low = total if self.low is None else min(self.low, total)
            self.stopped.wait(0.3)

    def stop(self) -> None:
        self.stopped.set()
        self.thread.join(timeout=30)


@pytest.mark.usefixtures("restore_node_pools")
def test_the_operator_switches_layouts_for_the_measured_mix_make_before_break(
    kubeconfig: Path,
    namespace: str,
    prometheus_url: str,
    prometheus_targets_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    operator_env(monkeypatch, kubeconfig, namespace, prometheus_url)
    twin = TwinProcess(kubeconfig, namespace, prometheus_targets_dir, "--scale", "0.001")
    router: RouterProcess | None = None
    traffic: Traffic | None = None
    try:
        with KopfRunner(operator_args(namespace), timeout=600):
            policy = scaling_policy(
                "reactive",
                layouts={"replanSeconds": 10, "historySeconds": 60, "confirmations": 1},
            )
            apply(kubeconfig, namespace, config_map(), policy, model())
            eventually(
                lambda: ready_gpus(kubeconfig, namespace) == {"tp4": 8},
                120,
                "2 × TP4 Ready (the initial instances on the first variant)",
            )
            eventually(
                lambda: replicas_in_force(kubeconfig, namespace) == {"tp4": 2, "tp4pp2": 0},
                60,
                "status.layouts: the layout in force is what runs",
            )
            router = RouterProcess(
                kubeconfig, namespace, twin.url, prometheus_url, prometheus_targets_dir
            )
            status, body = router.post(
                "/v1/completions", SHORT, {"x-sageserve-region": REGION}, timeout=60
            )
            assert status == 200, body

            # long prompts: 2 × TP4 serve 0.2 req/s of them, TP4xPP2 1 req/s
            floor = ReadyFloor(kubeconfig, namespace)
            traffic = Traffic(router, LONG, threads=3)
            eventually(
                lambda: replicas_in_force(kubeconfig, namespace) == {"tp4": 0, "tp4pp2": 1},
                150,
                "the layout switched to TP4xPP2",
            )
            eventually(
                lambda: (
                    pod_set_replicas(kubeconfig, namespace) == {"tp4": 0, "tp4pp2": 1}
                    and ready_gpus(kubeconfig, namespace) == {"tp4pp2": 8}
                ),
                90,
                "the pod sets moved: one TP4xPP2 Ready, no TP4",
            )
            floor.stop()
            assert floor.low is not None and floor.low >= 8, floor.seen
            assert any(s.get("tp4") and s.get("tp4pp2") for s in floor.seen), (
                "make-before-break: old and new Ready together",
                floor.seen,
            )
            entry = layout(kubeconfig, namespace)
            assert entry is not None
            switches = [
                e["message"]
                for e in json.loads(
                    kubectl(kubeconfig, ["get", "events", "-n", namespace, "-o", "json"]).stdout
                )["items"]
                if e["reason"] == "LayoutSwitch"
            ]
            assert any("switching TP4 ×2 → TP4xPP2" in m for m in switches), switches
            long_type = next(t for t in entry["types"] if t["promptTokens"] > 1000)
            assert long_type["rate"] > 0
            assert {w["variant"]: w["weight"] for w in long_type["weights"]} == {
                "tp4": 0.0,
                "tp4pp2": 1.0,
            }
            assert all(t["weights"] for t in entry["types"]), entry
            # the router follows them: long prompts dispatched by their type to TP4xPP2
            long_j = str(entry["types"].index(long_type))
            eventually(
                lambda: (
                    router is not None
                    and router.metric(
                        "sageserve_router_layout_dispatch_total",
                        namespace=namespace,
                        model_deployment=MODEL,
                        region=REGION,
                        type=long_j,
                        variant="tp4pp2",
                    )
                    > 0
                ),
                60,
                "the router dispatching long prompts by type to TP4xPP2",
            )
            traffic.stop()

            # short requests: back to 2 × TP4 (TP4xPP2 serves 1 req/s of them, 2 × TP4 4)
            floor = ReadyFloor(kubeconfig, namespace)
            traffic = Traffic(router, SHORT, threads=4)
            eventually(
                lambda: replicas_in_force(kubeconfig, namespace) == {"tp4": 2, "tp4pp2": 0},
                150,
                "the layout switched back to 2 × TP4",
            )
            eventually(
                lambda: ready_gpus(kubeconfig, namespace) == {"tp4": 8},
                90,
                "the pod sets moved back: two TP4 Ready",
            )
            floor.stop()
            assert floor.low is not None and floor.low >= 8, floor.seen
            traffic.stop()
            traffic = None
            events = kubectl(kubeconfig, ["get", "events", "-n", namespace, "-o", "json"]).stdout
            reasons = [e["reason"] for e in json.loads(events)["items"]]
            assert reasons.count("LayoutSwitch") >= 2, reasons
    finally:
        if traffic is not None:
            traffic.stop()
        if router is not None:
            router.close()
        twin.close()
