"""θ learned from the fleet, on the real control plane, through a real Prometheus.

The twin (`sageserve twin`, its own process) replays the Azure conversation trace on the
two pods of one pod set and serves vLLM's token counters and KV usage per pod; a router
(`sageserve router`, its own process) forwards streamed requests of one interactive tier
to those pods over HTTP and counts their time to first token per tier; Prometheus scrapes
all three. With `spec.capacity.learn`, each plan reads the last minutes back from
Prometheus (`controller/capacity_observe.read_windows`), keeps the minutes that met the
tier's SLO, and once enough of them qualify plans with the θ they show
(`plan/learned_capacity.py`, PreServe §4.1, Alg. 1 generalised): the ModelDeployment's
`status.capacity` shows declared, learned and in-force θ with the evidence, and the plan
sizes the endpoint with the θ in force.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, closing, contextmanager
from pathlib import Path
from typing import Any

import pytest
from e2e_helpers import eventually, kubectl
from fault_kit import figure
from kopf.testing import KopfRunner
from operator_kit import (
    A100,
    REPO,
    RouterProcess,
    TwinProcess,
    apply,
    model_deployment,
    operator_args,
    operator_env,
    policy_status,
    scaling_policy,
)

from sageserve.metrics import queries
from sageserve.metrics.prometheus import PrometheusReader

REGION = "us-east"
MODEL = "llama7b"
SERVED = "meta-llama/Llama-2-7b-hf"
TRACE = REPO / "data/traces/azure-llm-2023/AzureLLMInferenceTrace_conv.csv.gz"
#: declared θ far below what an instance serves at this load, so the learned θ (bounded
#: by declared × [minFactor, maxFactor]) is what the plan must change to
DECLARED = 50.0
INSTANCES = 2
#: qualifying one-minute windows before the learned θ is trusted
MIN_WINDOWS = 2


def _entries(kubeconfig: Path, namespace: str) -> list[dict[str, Any]]:
    """The ModelDeployment's `status.capacity`."""
    out = kubectl(kubeconfig, ["get", "modeldeployment", MODEL, "-n", namespace, "-o", "json"])
    return list((json.loads(out.stdout).get("status") or {}).get("capacity") or [])


def _capacity(kubeconfig: Path, namespace: str) -> dict[str, Any] | None:
    """The ModelDeployment's `status.capacity` entry once it is trusted (else None)."""
    found = next((e for e in _entries(kubeconfig, namespace) if e["region"] == REGION), None)
    return found if found is not None and found["trusted"] else None


def _planned_theta(kubeconfig: Path, namespace: str) -> float | None:
    plan = policy_status(kubeconfig, namespace).get("plan") or {}
    for f in plan.get("forecasts") or []:
        if f["model"] == MODEL and f["region"] == REGION:
            return float(f["instanceTokensPerSecond"])
    return None


@contextmanager
def _streaming(router: RouterProcess, every_s: float) -> Iterator[list[int]]:
    """Streamed requests of the IW-N tier through the router, one every `every_s`, until
    the block ends; yields the statuses answered so far."""
    statuses: list[int] = []
    stop = threading.Event()
    body = {"model": SERVED, "prompt": "Say hello.", "max_tokens": 8, "stream": True}
    headers = {"x-sageserve-region": REGION, "x-sageserve-tier": "iw-n"}

    def send() -> None:
        while not stop.wait(every_s):
            status, _ = router.post("/v1/completions", body, headers, 60)
            statuses.append(status)

    thread = threading.Thread(target=send, daemon=True)
    thread.start()
    try:
        yield statuses
    finally:
        stop.set()
        thread.join(timeout=90)


def test_theta_learned_from_prometheus_is_shown_and_sizes_the_plan(
    kubeconfig: Path,
    namespace: str,
    prometheus_url: str,
    prometheus_targets_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    operator_env(monkeypatch, kubeconfig, namespace, prometheus_url, 0)
    # Llama-2-7B on one A100 each (111,618 KV tokens): the trace at its own rate keeps the
    # two instances' caches partly full, so their minutes say something about capacity
    md = model_deployment(
        [REGION], A100, gpus=1, theta=DECLARED, lo=INSTANCES, hi=INSTANCES, name=MODEL
    )
    md["metadata"]["annotations"] = {"sageserve.io/perf-profile": "llama-2-7b"}
    md["spec"]["model"] = {"name": SERVED}
    policy = scaling_policy(
        "lt-immediate",
        forecast={"method": "persistence", "granularitySeconds": 30, "trainingWindowSeconds": 300},
        intervals={"planSeconds": 60, "paceSeconds": 2, "cooldownSeconds": 2},
        forecastGap={"windowSeconds": 20},
        spot={"enabled": False},
        capacity={
            "learn": True,
            "minWindows": MIN_WINDOWS,
            "minEmu": 0.05,
            "maxFactor": 100,
            "historySeconds": 900,
        },
    )
    with ExitStack() as stack:
        twin = stack.enter_context(
            closing(
                TwinProcess(kubeconfig, namespace, prometheus_targets_dir, "--trace", str(TRACE))
            )
        )
        runner = stack.enter_context(KopfRunner(operator_args(namespace), timeout=900))
        apply(kubeconfig, namespace, policy, md)
        router = stack.enter_context(
            closing(
                RouterProcess(
                    kubeconfig, namespace, twin.url, prometheus_url, prometheus_targets_dir
                )
            )
        )
        reader = PrometheusReader(prometheus_url)

        def serving() -> bool:
            loads = reader.pod_loads(namespace)
            return len([p for p in loads if MODEL in p]) == INSTANCES

        eventually(serving, 180, "both pods' KV usage in Prometheus")
        started, loaded = time.time(), time.monotonic()
        with _streaming(router, 0.5) as statuses:
            learned = eventually(
                lambda: _capacity(kubeconfig, namespace), 600, "a trusted learned θ"
            )
            ended, trusted_s = time.time(), time.monotonic() - loaded
        assert statuses and all(s == 200 for s in statuses), statuses

        # what the status shows: the evidence, and θ in force within declared × the bounds
        assert learned["variant"] == "a100"
        assert learned["declaredTokensPerSecond"] == DECLARED
        assert learned["qualifyingWindows"] >= MIN_WINDOWS
        assert learned["windows"] >= learned["qualifyingWindows"]
        theta = learned["learnedTokensPerSecond"]
        assert learned["inForceTokensPerSecond"] == pytest.approx(min(theta, DECLARED * 100))
        assert theta > 2 * DECLARED  # the fleet serves far more than was declared

        # the learned θ is per instance: the pod set's tokens/s over the loaded minutes,
        # read here straight from Prometheus, divided by its two instances
        per_minute = [
            v
            for labels, values in reader.series(
                queries.variant_tokens_per_second("60s", namespace),
                ended,
                ended - started + 120,  # the minutes the plans read, and one before
                60.0,
            )
            if labels.get("model_deployment") == MODEL
            for v in values
            if v == v and v > 0
        ]
        assert per_minute, "no tokens/s of the pod set in Prometheus"
        assert min(per_minute) / INSTANCES * 0.9 <= theta <= max(per_minute) / INSTANCES * 1.1

        # the plan sizes the endpoint with the θ in force (the next plan at the latest)
        planned = eventually(
            lambda: (t := _planned_theta(kubeconfig, namespace)) and t > 2 * DECLARED and t,
            120,
            "the plan sizing with the learned θ",
        )
        current = _capacity(kubeconfig, namespace)
        assert current is not None
        assert planned == pytest.approx(current["inForceTokensPerSecond"], rel=1e-3)

        # learning turned off: the next plan sizes with the declared θ again and clears
        # status.capacity (a merge patch's null through the API server's status subresource)
        off = json.dumps({"spec": {"capacity": {"learn": False}}})
        kubectl(
            kubeconfig,
            ["patch", "scalingpolicy", "fleet", "-n", namespace, "--type=merge", "-p", off],
        )
        eventually(
            lambda: (
                not _entries(kubeconfig, namespace)
                and _planned_theta(kubeconfig, namespace) == DECLARED
            ),
            150,
            "status.capacity cleared and the plan on the declared θ",
        )
    assert runner.exception is None, runner.output
    figure(
        "learned capacity",
        f"θ trusted {trusted_s:.0f} s after both pods served (minWindows {MIN_WINDOWS}, plan "
        f"every 60 s): learned {theta:.0f} tokens/s per instance from "
        f"{learned['qualifyingWindows']} of {learned['windows']} windows (the pod set's "
        f"minutes in Prometheus: {min(per_minute) / INSTANCES:.0f}–"
        f"{max(per_minute) / INSTANCES:.0f} per instance), declared {DECLARED:.0f}; the plan "
        f"sized with {planned:.0f}",
    )
