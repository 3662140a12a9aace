"""Batch that always finishes, on the real control plane: the routers' batch queue states
the token rate its deadlines need, the operator scales out for it (SageServe's trough
release alone never would: released batch work holds an instance under the 60 % release
threshold, below every scale-out threshold), and a miss that no scale-out can prevent is
reported while there is still time to act, on the ModelDeployment and on the Batch.

One region of bloom, 1 to 2 instances, at a low interactive load. The variant's θ is set
low (20 tokens/s) so that a few hundred small requests ask more than one instance's batch
capacity (θ × 60 %) and less than θ × maxInstances: the figures the decision step reads,
not the speed of this machine, decide what happens.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from e2e_helpers import eventually, kubectl
from fault_kit import events
from operator_kit import RouterProcess, TwinProcess
from test_e2e_batch import (
    batch_lines,
    batch_of,
    finished,
    interactive_attainment,
    reactive_fleet,
    ready,
    submit,
)
from test_e2e_router import MODEL, bloom

#: the variant's tokens/s per instance the operator sizes with
THETA = 20.0
MAX_INSTANCES = 2
#: a completion window whose slack (window − 30 min margin − service time) outlasts the test
WINDOW = "60m"
WINDOW_S = 60 * 60
#: output tokens per request (the prompt adds a few)
OUTPUT = 256
#: batch A: needs ~18 tok/s, above one instance's 12 (θ × 60 %), below θ × max = 40
N_FITS = 240
#: batch B: ~45 tok/s on its own, above θ × maxInstances whatever A has left
N_AT_RISK = 600


def model_condition(kubeconfig: Path, namespace: str, type_: str) -> dict[str, Any] | None:
    out = kubectl(kubeconfig, ["get", "modeldeployment", MODEL, "-n", namespace, "-o", "json"])
    found = (json.loads(out.stdout).get("status") or {}).get("conditions") or []
    return next((c for c in found if c["type"] == type_), None)


def replicas(kubeconfig: Path, namespace: str) -> int:
    out = kubectl(kubeconfig, ["get", "deployments", "-n", namespace, "-o", "json"])
    return sum(
        int(d["spec"].get("replicas") or 0)
        for d in json.loads(out.stdout)["items"]
        if d["metadata"]["name"].startswith(MODEL)
    )


@pytest.fixture
def slow_theta_fleet(
    kubeconfig: Path,
    namespace: str,
    prometheus_url: str,
    prometheus_targets_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[TwinProcess]:
    md = bloom(["us-east"], 1, MAX_INSTANCES)
    for variant in md["spec"]["variants"]:
        variant["capacityTokensPerSecond"] = THETA
    with reactive_fleet(
        md, kubeconfig, namespace, prometheus_url, prometheus_targets_dir, monkeypatch
    ) as twin:
        yield twin


@pytest.mark.usefixtures("restore_node_pools")
def test_deadline_pressure_scales_out_a_batch_that_fits_and_reports_one_that_cannot(
    kubeconfig: Path,
    namespace: str,
    prometheus_url: str,
    prometheus_targets_dir: Path,
    slow_theta_fleet: TwinProcess,
) -> None:
    twin = slow_theta_fleet
    router = RouterProcess(kubeconfig, namespace, twin.url, prometheus_url, prometheus_targets_dir)
    try:
        ready(router)
        assert replicas(kubeconfig, namespace) == 1
        alone = interactive_attainment(router, 10)

        # batch A: more than the trough release of one instance gives before its deadline
        fits = submit(router, batch_lines(N_FITS, OUTPUT, "fits"), WINDOW)
        need = eventually(
            lambda: router.metric(
                "sageserve_batch_deadline_need_tokens_per_second", model_deployment=MODEL
            ),
            30,
            "the router stating the queue's deadline need",
        )
        # one instance's batch capacity is θ × 60 %; the need is above it, below θ × max
        assert THETA * 0.6 < need < THETA * MAX_INSTANCES, need
        scaled = eventually(
            lambda: [
                e
                for e in events(kubeconfig, namespace, "ScaledOut")
                if "batch deadline pressure" in e.get("message", "")
            ],
            180,
            "a scale-out Event naming the batch deadline pressure",
        )
        eventually(lambda: replicas(kubeconfig, namespace) == MAX_INSTANCES, 60, "2 instances")
        assert model_condition(kubeconfig, namespace, "BatchDeadlinesAtRisk") is None

        # batch B on top: more than θ × maxInstances can serve before the deadlines
        at_risk = submit(router, batch_lines(N_AT_RISK, OUTPUT, "risk"), WINDOW)
        risk = eventually(
            lambda: (
                (c := model_condition(kubeconfig, namespace, "BatchDeadlinesAtRisk"))
                and c["status"] == "True"
                and c
            ),
            120,
            "BatchDeadlinesAtRisk=True on the ModelDeployment",
        )
        assert MODEL in risk["message"]
        try:
            marked = eventually(
                lambda: batch_of(router, at_risk["id"]).get("deadline_at_risk"),
                60,
                "the at-risk batch says so",
            )
        except AssertionError:
            sys.__stderr__.write(
                f"router metrics: need "
                f"{router.metric('sageserve_batch_deadline_need_tokens_per_second')}, at risk "
                f"{router.metric('sageserve_router_batch_deadline_at_risk')}; batch "
                f"{batch_of(router, at_risk['id'])}\nrouter output:\n"
                f"{router.command.output()[-4000:]}\n"
            )
            raise
        assert events(kubeconfig, namespace, "BatchDeadlinesAtRisk")

        # the team cancels B: the risk clears, and A, which fits, finishes before its deadline
        r = requests.post(f"{router.url}/v1/batches/{at_risk['id']}/cancel", timeout=30)
        assert r.status_code == 200, r.text
        eventually(
            lambda: (
                (c := model_condition(kubeconfig, namespace, "BatchDeadlinesAtRisk"))
                and c["status"] == "False"
            ),
            120,
            "BatchDeadlinesAtRisk=False once the batch is cancelled",
        )
        during = interactive_attainment(router, 10)
        closed = finished(router, fits["id"], WINDOW_S)
        assert closed["status"] == "completed", closed
        assert closed["request_counts"] == {"total": N_FITS, "completed": N_FITS, "failed": 0}
        assert closed["completed_at"] <= closed["expires_at"]
        assert not closed.get("deadline_at_risk")
        assert during >= alone - 0.1, (alone, during)
        sys.__stderr__.write(
            f"batch deadlines: need {need:.1f} tok/s at submission; scale-out Event "
            f"{scaled[0]['message']!r}; at risk: {risk['message']!r}, batch field {marked}; "
            f"A done {closed['completed_at'] - closed['created_at']} s after submission "
            f"(window {WINDOW_S} s); IW-F TTFT≤1s {alone:.0%} alone, {during:.0%} with the "
            f"batch; checked at {time.strftime('%H:%M:%S')}\n"
        )
    finally:
        router.close()
