"""Operator killed (SIGKILL) in the middle of a change: the restart converges, no double scaling.

The operator runs as its own process (`sageserve operator`), as in a pod. It plans (LT-I,
target 3 from 1) and starts moving; we kill it as soon as the plan is in status, so the
replica patch may or may not have happened. The restarted operator must take the plan from
status instead of solving again (the plan interval has not elapsed), end at exactly the
target, and never go past it on the way.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from e2e_helpers import eventually, kubectl
from operator_kit import (
    REPO,
    apply,
    free_port,
    model_deployment,
    policy_status,
    replicas,
    scaling_policy,
    steady_stand_in,
)

REGION = "us-central"


def _start(kubeconfig: Path, namespace: str, prometheus_url: str, log: Path) -> subprocess.Popen:
    env = {
        **os.environ,
        "KUBECONFIG": str(kubeconfig),
        "SAGESERVE_PROMETHEUS_URL": prometheus_url,
        "SAGESERVE_METRICS_PORT": str(free_port()),
    }
    cmd = [sys.executable, "-m", "sageserve.cli", "operator", "-n", namespace]
    with log.open("a") as out:
        return subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, cwd=REPO)


@pytest.mark.usefixtures("restore_node_pools")
def test_a_killed_operator_restarts_from_the_recorded_plan_without_double_scaling(
    kubeconfig: Path,
    namespace: str,
    prometheus_url: str,
    prometheus_targets_dir: Path,
    tmp_path: Path,
) -> None:
    log = tmp_path / "operator.log"
    procs: list[subprocess.Popen] = []
    # the stand-in serves 2,400 tokens/s
    with steady_stand_in(prometheus_targets_dir, prometheus_url, namespace, REGION, kubeconfig):
        try:
            forecast = {
                "method": "persistence",
                "granularitySeconds": 30,
                "trainingWindowSeconds": 300,
            }
            apply(kubeconfig, namespace, model_deployment([REGION], hi=6))
            apply(kubeconfig, namespace, scaling_policy("lt-immediate", forecast=forecast))

            procs.append(_start(kubeconfig, namespace, prometheus_url, log))
            first = eventually(
                lambda: policy_status(kubeconfig, namespace).get("plan"), 90, "a first plan"
            )
            procs[0].send_signal(signal.SIGKILL)  # mid-change: the patch may not have happened
            procs[0].wait(timeout=10)
            [target] = first["targets"]
            assert target["target"] == 3, first
            before_restart = replicas(kubeconfig, namespace, REGION)
            assert before_restart in (1, 3)

            procs.append(_start(kubeconfig, namespace, prometheus_url, log))
            seen: list[int] = []

            def at_target() -> bool:
                value = replicas(kubeconfig, namespace, REGION)
                if value is not None:
                    seen.append(value)
                return value == 3

            eventually(
                at_target, 90, "the restarted operator at the planned 3 replicas", interval=1
            )
            # a few more pace intervals (2 s each): nothing moves past the target
            for _ in range(10):
                time.sleep(1)
                at_target()
            assert max(seen) == 3 and seen[-1] == 3, seen
            after = policy_status(kubeconfig, namespace)["plan"]
            assert after["computedAt"] == first["computedAt"], "the restart solved the plan again"
            events = json.loads(
                kubectl(
                    kubeconfig,
                    [
                        "get",
                        "events",
                        "-n",
                        namespace,
                        "--field-selector",
                        "reason=ScaledOut",
                        "-o",
                        "json",
                    ],
                ).stdout
            )["items"]
            # one scale-out from 1 to 3 in all (none if the kill fell between patch and Event)
            assert sum(e.get("count", 1) for e in events) <= 1, [e.get("message") for e in events]
        finally:
            for p in procs:
                if p.poll() is None:
                    p.terminate()
                    try:
                        p.wait(timeout=15)
                    except subprocess.TimeoutExpired:
                        p.kill()
