"""A drained instance is stopped `drainSeconds` after it left the router, as Kubernetes
kills a terminating pod at its grace period: what it still serves then is cut. Interactive
requests cut are lost; batch requests cut are served again."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from sageserve.api.model_deployment import ModelDeployment
from sageserve.controller.podset import render_pod_set
from sageserve.core.types import IW_F, NIW, ActionKind, Request, ScalingAction, Tier
from sageserve.pace import make_strategy
from sageserve.sim.engine import Simulation
from tests.sim.helpers import config, flat_perf

#: a request whose decode alone takes 500 s (50,000 tokens at 10 ms a step)
LONG_OUTPUT = 50_000


class ScaleInOnceAt:
    """The reactive strategy, plus one scale-in of one instance at `at` seconds."""

    def __init__(self, at: float) -> None:
        self.inner = make_strategy("reactive")
        self.at = at
        self.done = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def step(self, obs: Any, plan: Any) -> ScalingAction | None:
        if obs.time >= self.at and not self.done:
            self.done = True
            return ScalingAction(ActionKind.SCALE_IN, obs.key, 1, "test: one scale-in")
        return None


def run(drain_s: float, tier: Tier) -> Any:
    cfg = config(flat_perf(), initial=2, lo=1, hi=2, end_s=1200.0, drain_s=3600.0)
    model = replace(cfg.models[0], drain_seconds={"v": drain_s})
    cfg = replace(cfg, models=(model,))
    # two long requests, one per instance (the picker spreads them), then quiet
    reqs = [Request(i, 1.0 + i, "m", tier, "r1", 500, LONG_OUTPUT) for i in range(2)]
    return Simulation(cfg, ScaleInOnceAt(100.0), iter(reqs)).run()  # type: ignore[arg-type]


def test_a_request_longer_than_the_grace_period_is_cut_and_the_instance_stops() -> None:
    res = run(drain_s=60.0, tier=IW_F)
    assert res.events["scale_in"] == 1
    assert res.events["drain_cut_requests"] == 1
    st = res.stats[(IW_F.name, "m")]
    assert st.dropped == 1 and st.finished == 1  # the other instance's request finished


def test_within_the_grace_period_the_drained_instance_finishes_its_request() -> None:
    res = run(drain_s=1000.0, tier=IW_F)
    assert res.events["scale_in"] == 1
    assert res.events.get("drain_cut_requests", 0) == 0
    st = res.stats[(IW_F.name, "m")]
    assert st.dropped == 0 and st.finished == 2


def test_a_batch_request_cut_is_served_again() -> None:
    res = run(drain_s=60.0, tier=NIW)
    assert res.events["drain_cut_requests"] == 1
    st = res.stats[(NIW.name, "m")]
    assert st.dropped == 0 and st.finished == 2  # both served, the cut one from the start again


@pytest.mark.parametrize(("drain", "grace"), [(None, 600), (45, 45), (3600, 3600)])
def test_the_pod_sets_grace_period_is_the_variants_drain_seconds(
    drain: int | None, grace: int
) -> None:
    variant: dict[str, Any] = {
        "name": "h100",
        "gpuType": "NVIDIA-H100-80GB-HBM3",
        "gpusPerInstance": 4,
        "capacityTokensPerSecond": 500,
    }
    if drain is not None:
        variant["drainSeconds"] = drain
    md = ModelDeployment.model_validate(
        {
            "apiVersion": "sageserve.io/v1alpha1",
            "kind": "ModelDeployment",
            "metadata": {"name": "llama", "namespace": "llm"},
            "spec": {
                "model": {"name": "meta-llama/Llama-3.1-70B"},
                "variants": [variant],
                "regions": [{"name": "us-east", "maxInstances": 2}],
                "tiers": ["iw-f"],
                "policyRef": {"name": "p"},
            },
        }
    )
    pod_set = render_pod_set(md, md.spec.regions[0], md.spec.variants[0], 1, "llm")
    assert pod_set["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == grace
