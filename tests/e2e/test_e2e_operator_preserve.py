"""`strategy: preserve` on the operator: the window plan (PreServe §4.1, Alg. 2) against the
real control plane and a real Prometheus.

A stand-in vLLM endpoint serves vLLM's two token counters at a steady rate; the test moves
its mix from prompt-heavy to decode-heavy at the same total tokens/s. The hourly plan sizes
on the total and would keep one instance; PreServe's window plan forecasts prompt and decode
tokens apart, sees decode above what one instance decodes (μ_d), and the operator moves the
pod set to two instances within a few one-minute windows. What a user sees is checked: the
pod set's replicas, `status.plan` (solverStatus `window`, P̂ and D̂) and the Ready message.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from e2e_helpers import eventually
from kopf.testing import KopfRunner
from operator_kit import (
    FakeVllm,
    SteadyLoad,
    apply,
    model_deployment,
    operator_args,
    operator_env,
    policy_status,
    replicas,
    scaling_policy,
)

REGION = "us-central"
#: μ_t, μ_p, μ_d of the variant (tokens/s one instance serves)
THETA, PREFILL, DECODE = 5000, 3000, 1000


@pytest.fixture
def fake_vllm() -> Iterator[FakeVllm]:
    fake = FakeVllm()
    yield fake
    fake.close()


def preserve_policy() -> dict[str, Any]:
    """One-minute windows, forecast by persistence on three minutes of history."""
    return scaling_policy(
        "preserve",
        preserve={"windowSeconds": 60},
        forecast={"method": "persistence", "trainingWindowSeconds": 180},
    )


def model() -> dict[str, Any]:
    body = model_deployment([REGION], theta=THETA, lo=1, hi=2)
    variant = body["spec"]["variants"][0]
    variant["prefillTokensPerSecond"] = PREFILL
    variant["decodeTokensPerSecond"] = DECODE
    return body


def window_forecast(kubeconfig: Path, namespace: str) -> dict[str, Any] | None:
    plan = policy_status(kubeconfig, namespace).get("plan") or {}
    if plan.get("solverStatus") != "window":
        return None
    found = [f for f in plan.get("forecasts", []) if f["region"] == REGION]
    return found[0] if found else None


@pytest.mark.usefixtures("restore_node_pools")
def test_the_window_plan_sizes_the_endpoint_on_decode_when_the_mix_turns(
    kubeconfig: Path,
    namespace: str,
    prometheus_url: str,
    prometheus_targets_dir: Path,
    fake_vllm: FakeVllm,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    operator_env(monkeypatch, kubeconfig, namespace, prometheus_url)
    # prompt-heavy: 2,200 prompt + 200 generated tokens/s (4 ticks a second)
    load = SteadyLoad(fake_vllm, prompt=550, generation=50)
    target_file = fake_vllm.scrape(prometheus_targets_dir, namespace, REGION, kubeconfig)
    try:
        with KopfRunner(operator_args(namespace), timeout=600) as runner:
            apply(kubeconfig, namespace, preserve_policy())
            apply(kubeconfig, namespace, model())
            eventually(lambda: replicas(kubeconfig, namespace, REGION) == 1, 60, "the pod set at 1")
            # one instance: 2,200 / μ_p 3,000, 200 / μ_d 1,000 and 2,400 / θ 5,000 all ≤ 1

            def prompt_heavy() -> dict[str, Any] | None:
                f = window_forecast(kubeconfig, namespace)
                return f if f and f["promptTokensPerSecond"] > 2000 else None

            first = eventually(
                prompt_heavy,
                240,
                "a window plan forecasting the prompt-heavy mix",
                interval=2,
            )
            assert first["decodeTokensPerSecond"] < 400
            plan = policy_status(kubeconfig, namespace)["plan"]
            assert [t["target"] for t in plan["targets"]] == [1]
            conditions = policy_status(kubeconfig, namespace)["conditions"]
            ready = next(c for c in conditions if c["type"] == "Ready")
            assert "window plan every 60 s" in ready["message"], ready

            # the same 2,400 tokens/s, decode-heavy: 400 prompt + 2,000 generated
            load.stop()
            load = SteadyLoad(fake_vllm, prompt=100, generation=500)
            turned = time.monotonic()
            eventually(
                lambda: replicas(kubeconfig, namespace, REGION) == 2,
                300,
                "the window plan to add an instance for decode (2,000 / μ_d 1,000)",
                interval=2,
            )
            took = time.monotonic() - turned

            # the window that straddled the turn forecast both mixes' peaks; once the
            # windows hold the new mix alone, the total is what it was, and N is still 2
            def decode_heavy() -> dict[str, Any] | None:
                f = window_forecast(kubeconfig, namespace)
                return f if f and f["promptTokensPerSecond"] < 600 else None

            forecast = eventually(decode_heavy, 180, "a window plan of the new mix alone")
            assert forecast["decodeTokensPerSecond"] > 1500, forecast
            assert forecast["tokensPerSecond"] == pytest.approx(2400, rel=0.15)
            plan = policy_status(kubeconfig, namespace)["plan"]
            assert [t["target"] for t in plan["targets"]] == [2]
            assert replicas(kubeconfig, namespace, REGION) == 2
            print(f"decode-heavy mix to two instances in {took:.0f} s")
        assert runner.exit_code == 0, runner.output
    finally:
        load.stop()
        target_file.unlink(missing_ok=True)
