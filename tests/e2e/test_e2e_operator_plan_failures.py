"""What a user sees when the plan cannot be what they hoped: a forecaster without enough
history (named fallback in status) and demand above what the fleet may hold (shortfall per
(model, region) in status, `PlanReady` reason `Shortfall`), against the real control plane
and a real Prometheus, with the operator in-process.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from e2e_helpers import eventually
from kopf.testing import KopfRunner
from operator_kit import (
    apply,
    model_deployment,
    operator_args,
    operator_env,
    policy_status,
    scaling_policy,
    steady_stand_in,
)

from sageserve.metrics import queries

REGION = "us-west"


@pytest.mark.usefixtures("restore_node_pools")
def test_short_history_names_the_fallback_and_excess_demand_is_reported_per_region(
    kubeconfig: Path,
    namespace: str,
    prometheus_url: str,
    prometheus_targets_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    operator_env(monkeypatch, kubeconfig, namespace, prometheus_url, 0)
    # the stand-in serves 2,400 tokens/s
    with steady_stand_in(prometheus_targets_dir, prometheus_url, namespace, REGION, kubeconfig):
        # ARIMA wants a day of history; Prometheus has minutes of it
        forecast = {
            "method": "arima",
            "fallback": "persistence",
            "granularitySeconds": 30,
            "trainingWindowSeconds": 86400,
        }
        apply(kubeconfig, namespace, model_deployment([REGION], hi=2))
        apply(kubeconfig, namespace, scaling_policy("lt-immediate", forecast=forecast))
        with KopfRunner(operator_args(namespace), timeout=120) as runner:

            def status() -> dict | None:
                got = policy_status(kubeconfig, namespace)
                return got if got.get("plan") else None

            got = eventually(status, 90, "a plan in the ScalingPolicy status")
            plan = got["plan"]
            [fc] = plan["forecasts"]
            assert fc["method"] == "persistence"
            # Prometheus has minutes of a day's window: most of it is missing
            assert "missing" in fc["fallbackReason"] or "history" in fc["fallbackReason"], fc
            assert plan["solverStatus"] == "shortfall"
            [short] = plan["shortfalls"]
            assert (short["model"], short["region"]) == ("llama8b", REGION)
            assert 400 < short["tokensPerSecond"] < 1100, short
            [ready] = [c for c in got["conditions"] if c["type"] == "PlanReady"]
            assert ready["reason"] == "Shortfall"
            assert f"llama8b/{REGION}" in ready["message"]
            [target] = plan["targets"]
            assert target["target"] == 2  # the plan still serves what it can
        assert runner.exception is None, runner.output


@pytest.mark.usefixtures("restore_node_pools")
def test_batch_tokens_query_moves_batch_load_from_the_forecast_into_beta(
    kubeconfig: Path,
    namespace: str,
    prometheus_url: str,
    prometheus_targets_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    operator_env(monkeypatch, kubeconfig, namespace, prometheus_url, 0)
    # the stand-in serves 2,400 tokens/s in all
    with steady_stand_in(prometheus_targets_dir, prometheus_url, namespace, REGION, kubeconfig):
        # a gateway would label batch work; here a quarter of the traffic is called batch
        batch_query = f"0.25 * ({queries.tokens_per_second('60s', namespace)})"
        forecast = {
            "method": "persistence",
            "granularitySeconds": 30,
            "trainingWindowSeconds": 300,
            "batchTokensQuery": batch_query,
        }
        apply(kubeconfig, namespace, model_deployment([REGION], hi=6))
        apply(kubeconfig, namespace, scaling_policy("lt-immediate", forecast=forecast))
        with KopfRunner(operator_args(namespace), timeout=120) as runner:
            recorded = eventually(
                lambda: policy_status(kubeconfig, namespace).get("plan"),
                90,
                "a plan in the ScalingPolicy status",
            )
            [fc] = recorded["forecasts"]
            # β = 10 % of the batch rate's mean over the history there is (≤ 600 tokens/s:
            # the first points are rate() warming up); the forecast is of the interactive
            # three quarters (1,800 tokens/s), not of all 2,400
            beta = fc["batchBufferTokensPerSecond"]
            assert 20 < beta <= 61, fc
            assert 1700 < fc["tokensPerSecond"] - beta < 1900, fc
        assert runner.exception is None, runner.output
