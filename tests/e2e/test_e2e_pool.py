"""Aegaeon on Kubernetes: 20 pooled models on a few GPUs, switched per request with vLLM's
sleep mode, sized by the plan.

The operator (in-process) renders the ModelPool's pod set on the real control plane (KWOK
H100 nodes); the twin (its own process) runs each pooled pod's 20 sleep-mode engines with
their simulated switch time; the router (its own process) wakes the model a request needs
over real HTTP (`POST /wake_up`, the least recently used idle model put to sleep first) and
puts idle ones to sleep; Prometheus scrapes the router's per-model request counter, whose
rate the plan turns into E[m] and the pool's size.
"""

from __future__ import annotations

import json
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from e2e_helpers import eventually, kubectl
from kopf.testing import KopfRunner
from operator_kit import (
    H100,
    RouterProcess,
    TwinProcess,
    apply,
    operator_args,
    operator_env,
    scaling_policy,
)

MODELS = 20
POOL = "tail"
POD_SET = f"{POOL}-us-east-h100"


def served(i: int) -> str:
    return f"acme/llama-2-70b-ft-{i:02d}"


def model_pool() -> dict[str, Any]:
    """20 fine-tunes of Llama-2-70B on pods of 4 H100s, 2 awake per pod, 1 to 3 pods."""
    return {
        "apiVersion": "sageserve.io/v1alpha1",
        "kind": "ModelPool",
        "metadata": {"name": POOL},
        "spec": {
            "models": [{"name": f"ft-{i:02d}", "model": served(i)} for i in range(MODELS)],
            "variant": {"name": "h100", "gpuType": H100, "gpusPerInstance": 4},
            "regions": [{"name": "us-east", "minInstances": 1, "maxInstances": 3}],
            "awakePerInstance": 2,
            "idleSleepSeconds": 8,
            "tiers": ["iw-f", "iw-n"],
            # a request keeps its model active 60 s: E[m] = Σ(1 − e^(−60 λᵢ))
            "sizing": {"meanOutputTokens": 600, "tbtSeconds": 0.1, "activeQuantile": None},
            "policyRef": {"name": "fleet"},
        },
    }


def policy() -> dict[str, Any]:
    """Plans every minute on a persistence forecast of 15 s steps (the last rate persists)."""
    return scaling_policy(
        "lt-immediate",
        intervals={"planSeconds": 60, "paceSeconds": 2, "cooldownSeconds": 2},
        forecast={"method": "persistence", "granularitySeconds": 15, "trainingWindowSeconds": 600},
        forecastGap={"windowSeconds": 60},
    )


def deployment(kubeconfig: Path, namespace: str) -> dict[str, Any] | None:
    out = kubectl(
        kubeconfig, ["get", "deploy", "-n", namespace, POD_SET, "-o", "json"], check=False
    )
    return json.loads(out.stdout) if out.returncode == 0 else None


def ready(kubeconfig: Path, namespace: str) -> int:
    d = deployment(kubeconfig, namespace)
    return int((d or {}).get("status", {}).get("readyReplicas") or 0)


def engines(twin: TwinProcess) -> dict[str, dict[str, str]]:
    """Each pooled pod's engines as the twin runs them: asleep, waking, awake, ..."""
    found: dict[str, dict[str, str]] = twin.status().get("engines", {})
    return found


def ask(router: RouterProcess, i: int, **kw: Any) -> int:
    body = {"model": served(i), "prompt": "Say hello.", "max_tokens": 8, **kw}
    status, _ = router.post("/v1/completions", body, {"x-sageserve-region": "us-east"}, 120)
    return status


@pytest.mark.usefixtures("restore_node_pools")
def test_pooled_models_wake_for_a_burst_sleep_when_idle_and_the_plan_sizes_the_pool(
    kubeconfig: Path,
    namespace: str,
    prometheus_url: str,
    prometheus_targets_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    operator_env(monkeypatch, kubeconfig, namespace, prometheus_url, 0)
    twin = TwinProcess(
        kubeconfig,
        namespace,
        prometheus_targets_dir,
        "--scale",
        "0",
        "--profile",
        f"{POOL}=llama-2-70b",
    )
    router: RouterProcess | None = None
    try:
        with KopfRunner(operator_args(namespace), timeout=900):
            apply(kubeconfig, namespace, policy(), model_pool())
            eventually(lambda: ready(kubeconfig, namespace) == 1, 120, "one pooled pod Ready")
            d = deployment(kubeconfig, namespace)
            assert d is not None
            container = d["spec"]["template"]["spec"]["containers"][0]
            assert "--enable-sleep-mode" in container["command"][-1]
            assert len(container["ports"]) == MODELS
            assert {"name": "VLLM_SERVER_DEV_MODE", "value": "1"} in container["env"]
            router = RouterProcess(
                kubeconfig,
                namespace,
                twin.url,
                prometheus_url,
                prometheus_targets_dir,
                "--backend-url",
                twin.url + "/pods/{namespace}/{pod}/port/{port}",
                "--hold-seconds",
                "60",
            )
            rp = router
            [pod] = eventually(lambda: list(engines(twin)), 30, "the pooled pod in the twin")
            assert set(engines(twin)[pod].values()) == {"asleep"}  # as its launcher leaves them

            # a burst on a sleeping model: it is woken once and every request is served
            # over real HTTP through the router
            eventually(lambda: ask(rp, 7) == 200, 60, "the router serving the pooled models")
            assert engines(twin)[pod][served(7)] == "awake"
            with ThreadPoolExecutor(12) as burst:
                codes = list(burst.map(lambda _: ask(rp, 3), range(12)))
            assert codes == [200] * 12
            states = engines(twin)[pod]
            assert states[served(3)] == "awake"
            assert sum(s != "asleep" for s in states.values()) <= 2  # the awake quota
            wakes = rp.metric(
                "sageserve_router_pool_switches_total",
                model_deployment=POOL,
                action="wake",
                reason="request",
            )
            assert wakes == 2, rp.command.output()[-3000:]
            assert rp.metric("sageserve_router_pool_wake_seconds_count", model_deployment=POOL) == 2

            # idle models go to sleep after idleSleepSeconds
            eventually(
                lambda: set(engines(twin)[pod].values()) == {"asleep"},
                60,
                "every pooled model asleep once idle",
            )
            assert (
                rp.metric(
                    "sageserve_router_pool_switches_total",
                    model_deployment=POOL,
                    action="sleep",
                    reason="idle",
                )
                >= 2
            )

            # load on every model: the plan's forecast of each model's request rate rises,
            # E[m] with it, and the operator resizes the pool (1 → 3 pods, its maximum; the
            # third needs the spot node, which is reclaimed for it)
            assert deployment(kubeconfig, namespace)["spec"]["replicas"] == 1  # type: ignore[index]
            loading = threading.Event()
            failed: list[int] = []

            def load() -> None:
                with ThreadPoolExecutor(4) as pool:
                    while not loading.is_set():
                        failed.extend(
                            c for c in pool.map(lambda i: ask(rp, i), range(MODELS)) if c != 200
                        )

            feeder = threading.Thread(target=load, daemon=True)
            feeder.start()
            try:
                eventually(
                    lambda: (
                        (deployment(kubeconfig, namespace) or {}).get("spec", {}).get("replicas")
                        == 3
                    ),
                    300,
                    "the pool resized to 3 pods by the plan",
                    interval=2,
                )
                eventually(
                    lambda: ready(kubeconfig, namespace) == 3,
                    120,
                    "three pooled pods Ready",
                    interval=2,
                )
                eventually(lambda: len(engines(twin)) == 3, 60, "three pooled pods in the twin")
                # the new pods serve too: the router wakes models there
                eventually(
                    lambda: (
                        sum(any(s != "asleep" for s in e.values()) for e in engines(twin).values())
                        >= 2
                    ),
                    60,
                    "models awake on more than one pod",
                )
            finally:
                loading.set()
                feeder.join(120)
            assert not failed, failed[:10]
            pool = json.loads(
                kubectl(
                    kubeconfig, ["get", "modelpool", POOL, "-n", namespace, "-o", "json"]
                ).stdout
            )
            assert pool["status"]["targetInstances"] == 3
            assert pool["status"]["expectedActiveModels"] > 4  # more than 2 pods of 2 awake
            sized = [c for c in pool["status"]["conditions"] if c["type"] == "Sized"]
            assert [(c["status"], c["reason"]) for c in sized] == [("True", "Planned")]
            events = kubectl(kubeconfig, ["get", "events", "-n", namespace, "-o", "json"]).stdout
            assert "PoolResized" in events

            # the policy moves to a strategy that does not size pools: the pool says so by
            # the next resync, without being touched itself
            patch = json.dumps({"spec": {"strategy": "reactive"}})
            kubectl(
                kubeconfig,
                ["patch", "scalingpolicy", "fleet", "-n", namespace, "--type=merge", "-p", patch],
            )

            def sized_now() -> list[tuple[str, str]]:
                out = kubectl(kubeconfig, ["get", "modelpool", POOL, "-n", namespace, "-o", "json"])
                conditions = json.loads(out.stdout)["status"]["conditions"]
                return [(c["status"], c["reason"]) for c in conditions if c["type"] == "Sized"]

            eventually(
                lambda: sized_now() == [("False", "StrategyDoesNotSizePools")],
                120,
                "Sized=False after the policy's strategy changed",
            )
    finally:
        if router is not None:
            router.close()
        twin.close()
