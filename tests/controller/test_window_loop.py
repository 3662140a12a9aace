"""The operator's window plan for `preserve` (PreServe §4.1, Alg. 2): the pure parts, and the
loop against a real Prometheus holding vLLM's two token counters."""

from __future__ import annotations

import logging
import math
import shutil
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from typing import Any

import pytest

from sageserve.api.model_deployment import ModelDeployment, pod_set_name
from sageserve.api.scaling_policy import PlanStatus, ScalingPolicySpec
from sageserve.controller.pace_loop import Loops, PaceState
from sageserve.controller.plan_loop import recorded_plan
from sageserve.controller.window_loop import window_status
from sageserve.core.types import EndpointKey
from sageserve.metrics import queries
from sageserve.plan.preserve import apportion_batch, plan_window, window_history_minutes
from sageserve.twin.backfill import create_blocks, install_blocks
from tests.controller.plan_fakes import READY

NS = "llm"
MODEL = "m"
#: μ_t, μ_p, μ_d of the variant: a decode-heavy minute needs many more instances than a
#: prompt-heavy one of the same total.
CAPACITY, PREFILL, DECODE = 4000.0, 1200.0, 300.0
#: (prompt, generated) tokens/s per region, over two hours ending now; r3's decode triples
#: for the last 20 minutes.
MIXES: dict[str, Callable[[float], tuple[float, float]]] = {
    "decode-heavy": lambda age_s: (300.0, 900.0),
    "prompt-heavy": lambda age_s: (900.0, 300.0),
    "rising": lambda age_s: (300.0, 900.0 if age_s < 1200 else 300.0),
}


def model_raw() -> dict[str, Any]:
    return {
        "apiVersion": "sageserve.io/v1alpha1",
        "kind": "ModelDeployment",
        "metadata": {"name": MODEL, "namespace": NS},
        "spec": {
            "model": {"name": "meta-llama/Llama-2-70b-hf"},
            "engine": {"image": "vllm/vllm-openai:v0.11.0"},
            "variants": [
                {
                    "name": "h100",
                    "gpuType": "GPU-h100",
                    "gpusPerInstance": 4,
                    "capacityTokensPerSecond": CAPACITY,
                    "prefillTokensPerSecond": PREFILL,
                    "decodeTokensPerSecond": DECODE,
                }
            ],
            "regions": [{"name": r, "minInstances": 0, "maxInstances": 8} for r in MIXES],
            "tiers": ["iw-f"],
            "policyRef": {"name": "p"},
        },
        "status": READY,
    }


def policy_raw(status: dict[str, Any] | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "apiVersion": "sageserve.io/v1alpha1",
        "kind": "ScalingPolicy",
        "metadata": {"name": "p", "namespace": NS, "generation": 1},
        "spec": {
            "strategy": "preserve",
            "forecast": {"method": "persistence"},
            "preserve": {"windowSeconds": 600},
        },
    }
    if status is not None:
        body["status"] = status
    return body


# ---- pure parts ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("prompt", "decode", "batch", "expected"),
    [
        # batch split in the minute's prompt : generated proportion (3 : 1)
        (300.0, 100.0, 40.0, (270.0, 90.0, 30.0, 10.0)),
        # no batch: all of it interactive
        (300.0, 100.0, 0.0, (300.0, 100.0, 0.0, 0.0)),
        # no traffic counted by vLLM but batch counted by the router: half each, never < 0
        (0.0, 0.0, 10.0, (0.0, 0.0, 5.0, 5.0)),
        # batch above what vLLM counted (scrape skew): interactive floors at 0
        (30.0, 10.0, 80.0, (0.0, 0.0, 60.0, 20.0)),
    ],
)
def test_batch_tokens_are_split_by_the_minutes_prompt_share(
    prompt: float, decode: float, batch: float, expected: tuple[float, ...]
) -> None:
    got = apportion_batch([prompt], [decode], [batch])
    assert tuple(s[0] for s in got) == pytest.approx(expected)


def test_a_gap_in_any_series_stays_a_gap() -> None:
    p, d, bp, bd = apportion_batch([100.0, math.nan], [50.0, 50.0], [math.nan, 10.0])
    assert (p[0], d[0]) == (100.0, 50.0) and math.isnan(bp[0]) and math.isnan(bd[0])
    assert math.isnan(p[1]) and math.isnan(bp[1])


@pytest.mark.parametrize(
    ("forecast", "window_s", "minutes"),
    [
        ({}, 600, 150),  # the seasonal AR fits on 15 windows
        ({"method": "persistence"}, 600, 60),  # the training window
        ({}, 1200, 300),
        ({"method": "persistence", "trainingWindowSeconds": 7200}, 600, 120),
        ({"method": "persistence"}, 1800, 90),  # three windows at least
    ],
)
def test_the_window_plan_reads_as_much_history_as_its_forecaster_fits_on(
    forecast: dict[str, Any], window_s: int, minutes: int
) -> None:
    spec = ScalingPolicySpec.model_validate(
        {"forecast": forecast, "preserve": {"windowSeconds": window_s}}
    )
    assert window_history_minutes(spec) == minutes


def test_with_that_history_the_default_forecaster_sizes_the_window_not_its_fallback() -> None:
    md = ModelDeployment.model_validate(model_raw())
    spec = ScalingPolicySpec()
    minutes = window_history_minutes(spec)
    prompt = {(MODEL, r): [300.0 + 10 * math.sin(i / 9) for i in range(minutes)] for r in MIXES}
    decode = {(MODEL, r): [900.0 + 30 * math.sin(i / 9) for i in range(minutes)] for r in MIXES}
    window = plan_window([md], spec, prompt, decode, {}, {}, {})
    assert {f.method for f in window.forecasts.values()} == {"arima"}
    short = {k: v[-60:] for k, v in prompt.items()}, {k: v[-60:] for k, v in decode.items()}
    fallback = plan_window([md], spec, *short, {}, {}, {})
    assert {f.method for f in fallback.forecasts.values()} == {"moving-average"}


def test_a_held_region_keeps_its_instances_in_the_window_plan() -> None:
    """A region whose cluster is silent keeps what it has whatever its history says; the
    others are sized from their forecasts."""
    md = ModelDeployment.model_validate(model_raw())
    spec = ScalingPolicySpec()
    minutes = window_history_minutes(spec)
    prompt = {(MODEL, r): [300.0] * minutes for r in MIXES}
    decode = {(MODEL, r): [900.0] * minutes for r in MIXES}
    current = {(MODEL, r, "h100"): 7 for r in MIXES}
    free = plan_window([md], spec, prompt, decode, {}, {}, current)
    held = plan_window([md], spec, prompt, decode, {}, {}, current, None, frozenset({"rising"}))
    assert free.targets[(MODEL, "rising", "h100")] != 7
    assert held.targets[(MODEL, "rising", "h100")] == 7
    assert held.forecasts[(MODEL, "rising")].method == "held"
    for r in ("decode-heavy", "prompt-heavy"):
        assert held.targets[(MODEL, r, "h100")] == free.targets[(MODEL, r, "h100")]


def test_window_status_is_a_valid_crd_status_and_restores_the_window_plan() -> None:
    md = ModelDeployment.model_validate(model_raw())
    spec = ScalingPolicySpec.model_validate(policy_raw()["spec"])
    minutes = 60
    prompt = {(MODEL, r): [MIXES[r](0.0)[0]] * minutes for r in MIXES}
    decode = {(MODEL, r): [MIXES[r](0.0)[1]] * minutes for r in MIXES}
    current = {(MODEL, r, "h100"): 1 for r in MIXES}
    window = plan_window([md], spec, prompt, decode, {}, {}, current)
    at = datetime(2026, 1, 1, tzinfo=UTC)
    status = window_status(window, [md], current, at)
    parsed = PlanStatus.model_validate(status)
    assert parsed.solver_status == "window"
    heavy = next(f for f in parsed.forecasts if f.region == "decode-heavy")
    assert (heavy.prompt_tokens_per_second, heavy.decode_tokens_per_second) == (300.0, 900.0)
    restored = recorded_plan({"status": {"plan": status}})
    assert restored is not None
    in_force = window.in_force(at.timestamp())
    assert restored.computed_at == in_force.computed_at
    assert restored.variant_targets == in_force.variant_targets
    assert restored.instance_tps == in_force.instance_tps
    assert restored.forecasts == pytest.approx(in_force.forecasts)


def test_the_reader_asks_for_prompt_and_generated_tokens_apart() -> None:
    prompt = queries.prompt_tokens_per_second("60s", NS)
    generated = queries.generation_tokens_per_second("60s", NS)
    assert "prompt_tokens" in prompt and "generation_tokens" not in prompt
    assert "generation_tokens" in generated and "prompt_tokens" not in generated
    assert (
        queries.tokens_per_second("60s", NS)
        == f"(({prompt}) + ({generated})) or ({prompt}) or ({generated})"
    )


# ---- the loop against a real Prometheus ------------------------------------------------------


def openmetrics(end: float, seconds: float, step: float) -> str:
    """vLLM's two token counters of one pod per region, as vLLM's exporter writes them
    (':' escaped to '_'), sampled every `step` seconds up to `end`."""
    lines = []
    for family, index in (("vllm_prompt_tokens", 0), ("vllm_generation_tokens", 1)):
        lines.append(f"# TYPE {family} counter")
        for region, mix in MIXES.items():
            labels = (
                f'namespace="{NS}",model_deployment="{MODEL}",region="{region}",'
                f'variant="h100",pod="{MODEL}-{region}-0"'
            )
            total, n = 0.0, int(seconds // step)
            for i in range(n + 1):
                t = end - (n - i) * step
                if i:
                    total += mix(end - t)[index] * step
                lines.append(f"{family}_total{{{labels}}} {total:.1f} {t:.3f}")
    return "\n".join(lines) + "\n# EOF\n"


@pytest.fixture(scope="module")
def prometheus_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real Prometheus whose TSDB holds two hours of the counters, ending now."""
    if not (shutil.which("promtool") and shutil.which("prometheus")):
        pytest.skip("prometheus and promtool are not installed (scripts/setup)")
    from e2e import prometheus

    root = tmp_path_factory.mktemp("prometheus")
    history = root / "history.om.txt"
    history.write_text(openmetrics(time.time(), 7200.0, 15.0))
    data = prometheus.PrometheusPaths(root).data
    data.mkdir(parents=True)
    install_blocks(create_blocks(history, root / "blocks"), data)
    _, url = prometheus.start(root)
    try:
        yield url
    finally:
        prometheus.stop(root)


class FakeKube:
    """The API server as the plan loop sees it: one ModelDeployment at one instance per
    region; records status patches and Events."""

    def __init__(self) -> None:
        self.patches: list[dict[str, Any]] = []
        self.events: list[tuple[str, str]] = []

    def objects(self, namespace: str, plural: str) -> list[dict[str, Any]]:
        return [model_raw()] if plural == "modeldeployments" else []

    def deployments_by_owner(self, namespace: str) -> dict[str, dict[str, dict[str, Any]]]:
        return {MODEL: {pod_set_name(MODEL, r, "h100"): {"spec": {"replicas": 1}} for r in MIXES}}

    def patch_status(self, namespace: str, plural: str, name: str, patch: dict[str, Any]) -> None:
        self.patches.append(patch)

    def event(self, body: dict[str, Any], type_: str, reason: str, message: str) -> None:
        self.events.append((reason, message))

    def plan(self) -> dict[str, Any]:
        """The last `status.plan` written."""
        return next(p["plan"] for p in reversed(self.patches) if "plan" in p)


def test_the_operator_sizes_each_endpoint_from_its_prompt_and_decode_forecasts(
    prometheus_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SAGESERVE_PROMETHEUS_URL", prometheus_url)
    kube = FakeKube()
    loops = Loops([NS], lambda _: None, 3600.0, logging.getLogger("t"))
    state = PaceState()
    policy = policy_raw()

    assert loops.plan_if_due(kube, policy, state)  # type: ignore[arg-type]

    assert state.plan is not None
    targets = {k.region: n for k, n in state.plan.targets.items()}
    # same 1,200 tokens/s in total, but 900 of them decode at μ_d = 300: three instances;
    # the prompt-heavy mix needs one (900 / μ_p 1,200 and 300 / μ_d 300), as does the total
    # alone (1,200 / μ_t 4,000) that the hourly plan would size on
    assert targets == {"decode-heavy": 3, "prompt-heavy": 1, "rising": 3}
    plan = PlanStatus.model_validate(kube.plan())
    assert plan.solver_status == "window" and plan.strategy == "preserve"
    forecast = {f.region: f for f in plan.forecasts}
    assert forecast["decode-heavy"].prompt_tokens_per_second == pytest.approx(300, rel=0.05)
    assert forecast["decode-heavy"].decode_tokens_per_second == pytest.approx(900, rel=0.05)
    assert forecast["rising"].decode_tokens_per_second == pytest.approx(900, rel=0.05)
    assert {(t.region, t.current, t.target) for t in plan.targets} == {
        ("decode-heavy", 1, 3),
        ("prompt-heavy", 1, 1),
        ("rising", 1, 3),
    }
    assert (
        "Planned",
        "window plan (PreServe Alg. 2): m/decode-heavy 3, m/prompt-heavy 1, m/rising 3",
    ) in kube.events
    # the next plan is a window away, not the hourly plan's interval
    assert state.plan_clock.due_at is not None
    assert state.plan_clock.due_at - time.time() == pytest.approx(600, abs=30)
    assert not loops.plan_if_due(kube, policy, state)  # type: ignore[arg-type]


def test_a_restarted_operator_keeps_the_window_plan_in_status_until_the_window_ends(
    prometheus_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SAGESERVE_PROMETHEUS_URL", prometheus_url)
    kube = FakeKube()
    loops = Loops([NS], lambda _: None, 3600.0, logging.getLogger("t"))
    first = PaceState()
    assert loops.plan_if_due(kube, policy_raw(), first)  # type: ignore[arg-type]
    recorded = policy_raw({"plan": kube.plan()})

    restarted = PaceState()
    assert not loops.plan_if_due(FakeKube(), recorded, restarted)  # type: ignore[arg-type]
    assert restarted.plan is not None and first.plan is not None
    assert restarted.plan.targets == first.plan.targets
    assert restarted.plan.targets[EndpointKey(MODEL, "decode-heavy")] == 3
