"""A ModelPool's pod set: one sleep-mode vLLM engine per pooled model, each on its own port,
started and put to sleep one after another; what the router and the twin read on the pod."""

from __future__ import annotations

import json
import logging
from typing import Any, cast

import pytest

from sageserve.api.model_pool import ModelPool
from sageserve.api.scaling_policy import Strategy
from sageserve.controller.guard import dry_run
from sageserve.controller.kube import Kube, ReplicasMoved
from sageserve.controller.pool_podsets import (
    apply_pool_targets,
    engine_args,
    launcher_script,
    pool_drain_choice,
    pool_problems,
    render_pool_pod_sets,
)
from sageserve.core.labels import (
    ANNOTATION_DELETION_COST,
    ANNOTATION_REPLICAS,
    ANNOTATION_SCALING,
    DRAIN_DELETION_COST,
    LABEL_DEPLOYMENT,
    LABEL_REGION,
    SCALING_EXTERNAL,
)
from sageserve.core.pooled_engines import pooled_engines
from sageserve.metrics.prometheus import PodLoad
from sageserve.pace.base import make_strategy
from sageserve.plan.pool_cycle import pool_sizing

H100 = "NVIDIA-H100-80GB-HBM3"


def pool(**spec: Any) -> ModelPool:
    body: dict[str, Any] = {
        "models": [
            {"name": "support", "model": "acme/support"},
            {"name": "legal", "model": "acme/legal", "servedName": "legal", "contextLength": 4096},
            {"name": "sql", "model": "acme/sql"},
        ],
        "variant": {"name": "h100", "gpuType": H100, "gpusPerInstance": 4},
        "regions": [
            {"name": "us-east", "minInstances": 1, "maxInstances": 3},
            {"name": "us-west", "minInstances": 0, "maxInstances": 2, "initialInstances": 2},
        ],
        "awakePerInstance": 2,
        "tiers": ["iw-f"],
        "policyRef": {"name": "fleet"},
        **spec,
    }
    return ModelPool.model_validate(
        {
            "apiVersion": "sageserve.io/v1alpha1",
            "kind": "ModelPool",
            "metadata": {"name": "tail"},
            "spec": body,
        }
    )


def test_each_region_gets_a_pod_set_at_its_initial_size_unless_sized_already() -> None:
    sets = render_pool_pod_sets(pool(), {"us-east": 3}, "llm", owner_uid="u1")
    assert [(d["metadata"]["name"], d["spec"]["replicas"]) for d in sets] == [
        ("tail-us-east-h100", 3),
        ("tail-us-west-h100", 2),
    ]
    d = sets[0]
    assert d["metadata"]["ownerReferences"][0]["kind"] == "ModelPool"
    labels = d["spec"]["template"]["metadata"]["labels"]
    assert labels["sageserve.io/model-deployment"] == "tail"  # one endpoint per region
    assert labels["sageserve.io/model-pool"] == "tail"
    container = d["spec"]["template"]["spec"]["containers"][0]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "4"
    assert [p["containerPort"] for p in container["ports"]] == [8000, 8001, 8002]
    assert {"name": "VLLM_SERVER_DEV_MODE", "value": "1"} in container["env"]


def test_the_pod_names_its_engines_for_the_router_and_the_twin() -> None:
    d = render_pool_pod_sets(pool(), {}, "llm")[0]
    annotations = d["spec"]["template"]["metadata"]["annotations"]
    engines = pooled_engines(annotations)
    assert [(e.name, e.served_name, e.port) for e in engines] == [
        ("support", "acme/support", 8000),
        ("legal", "legal", 8001),
        ("sql", "acme/sql", 8002),
    ]
    assert annotations["sageserve.io/awake-per-instance"] == "2"
    assert json.loads(annotations["sageserve.io/pooled-models"])[1]["port"] == 8001


def test_every_engine_has_sleep_mode_and_a_share_of_memory_that_fits_the_quota() -> None:
    args = engine_args(pool(engine={"args": ["--enforce-eager"]}), 1)
    assert args[:6] == ["--model", "acme/legal", "--served-model-name", "legal", "--port", "8001"]
    assert "--enable-sleep-mode" in args
    assert args[args.index("--gpu-memory-utilization") + 1] == "0.450"  # 0.9 / 2 awake
    assert args[args.index("--tensor-parallel-size") + 1] == "4"
    assert args[args.index("--max-model-len") + 1] == "4096"
    assert args[-1] == "--enforce-eager"  # the user's own arguments last


def test_the_launcher_starts_and_sleeps_engines_one_at_a_time() -> None:
    script = launcher_script(pool())
    lines = script.splitlines()
    serves = [i for i, ln in enumerate(lines) if ln.startswith("vllm serve")]
    waits = [i for i, ln in enumerate(lines) if ln.startswith("python3 -c")]
    assert len(serves) == len(waits) == 3
    assert all(s + 1 == w for s, w in zip(serves, waits, strict=True))
    assert "/sleep?level=1" in script and lines[-1] == "wait"


def test_a_missing_policy_or_tier_is_named_with_its_fix() -> None:
    problems = pool_problems(pool(tiers=["iw-f", "gold"]), policies=[], tiers=["iw-f"])
    assert [p.reason for p in problems] == ["PolicyNotFound", "TierNotFound"]
    assert "spec.tiers" in problems[1].message and "gold" in problems[1].message


@pytest.mark.parametrize(
    ("strategy", "sized", "reason"),
    [
        (Strategy.LT_IMMEDIATE, True, "Planned"),
        (Strategy.LT_UTILIZATION, True, "Planned"),
        (Strategy.LT_UTILIZATION_ARIMA, True, "Planned"),
        (Strategy.REACTIVE, False, "StrategyDoesNotSizePools"),
        (Strategy.PRESERVE, False, "StrategyDoesNotSizePools"),
    ],
)
def test_a_pool_under_a_strategy_that_does_not_plan_says_it_keeps_its_size(
    strategy: Strategy, sized: bool, reason: str
) -> None:
    got, why, message = pool_sizing("fleet", make_strategy(strategy.value))
    assert (got, why) == (sized, reason)
    if not sized:  # the field, the strategy and both ways out
        assert message.startswith("spec.policyRef.name: ScalingPolicy 'fleet'")
        assert strategy.value in message and "lt-utilization-arima" in message
        assert "minInstances = maxInstances" in message


class PoolKube:
    """The pool's two pod sets as listed (with the annotations given), recording writes and
    Events; `moves` names pod sets another writer changes between the read and the write."""

    def __init__(
        self, annotations: dict[str, dict[str, str]], moves: frozenset[str] = frozenset()
    ) -> None:
        self.sets = {
            name: {
                "metadata": {
                    "name": name,
                    "annotations": {ANNOTATION_REPLICAS: "1", **annotations.get(name, {})},
                },
                "spec": {"replicas": 1},
            }
            for name in ("tail-us-east-h100", "tail-us-west-h100")
        }
        self.moves = moves
        self.writes: list[tuple[str, int]] = []
        #: every write in order: ("cost", pod) or ("replicas", pod set)
        self.ops: list[tuple[str, str]] = []
        self.events: list[tuple[str, str, str]] = []
        self.status: dict[str, Any] = {}

    def deployments_by_owner(self, namespace: str) -> dict[str, dict[str, dict[str, Any]]]:
        return {"tail": self.sets}

    def set_replicas(
        self, namespace: str, observed: dict[str, Any], replicas: int, drop_scaling: bool = False
    ) -> None:
        name = observed["metadata"]["name"]
        if name in self.moves:
            raise ReplicasMoved(f"{name}: Unprocessable Entity")
        self.writes.append((name, replicas))
        self.ops.append(("replicas", name))

    def annotate_pod(self, namespace: str, name: str, annotations: dict[str, str]) -> None:
        assert annotations == {ANNOTATION_DELETION_COST: str(DRAIN_DELETION_COST)}
        self.ops.append(("cost", name))

    def event(self, body: dict[str, Any], type_: str, reason: str, message: str) -> None:
        self.events.append((type_, reason, message))

    def patch_status(self, namespace: str, plural: str, name: str, patch: dict[str, Any]) -> None:
        self.status = patch


def _apply(k: PoolKube, dry_run: bool = False) -> None:
    p = pool()
    apply_pool_targets(
        cast(Kube, k),
        "llm",
        [({"metadata": {"name": "tail"}}, p)],
        {("tail", "us-east"): 3, ("tail", "us-west"): 2},
        {"tail": 2.5},
        logging.getLogger("test"),
        dry_run=dry_run,
    )


def test_the_plan_resizes_each_pooled_pod_set_and_records_it() -> None:
    k = PoolKube({})
    _apply(k)
    assert k.writes == [("tail-us-east-h100", 3), ("tail-us-west-h100", 2)]
    assert [r for _, r, _ in k.events] == ["PoolResized", "PoolResized"]
    assert k.status == {"targetInstances": 5, "expectedActiveModels": 2.5}


def test_a_pooled_pod_set_handed_to_another_autoscaler_is_not_resized_and_says_why() -> None:
    k = PoolKube({"tail-us-east-h100": {ANNOTATION_SCALING: SCALING_EXTERNAL}})
    _apply(k)
    assert k.writes == [("tail-us-west-h100", 2)]
    held = [(t, m) for t, r, m in k.events if r == "PoolResizeHeld"]
    assert len(held) == 1 and held[0][0] == "Warning"
    assert "asks 3 pooled pod(s) of tail-us-east-h100, held at 1" in held[0][1]
    assert "handed over" in held[0][1]


def test_a_resize_that_loses_a_race_with_another_writer_does_not_stop_the_others() -> None:
    k = PoolKube({}, moves=frozenset({"tail-us-east-h100"}))
    _apply(k)
    assert k.writes == [("tail-us-west-h100", 2)]
    assert k.status["targetInstances"] == 5


def test_the_charts_dry_run_stops_pool_resizes_as_it_stops_every_other_write(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SAGESERVE_DRY_RUN", "true")
    k = PoolKube({})
    _apply(k, dry_run=dry_run(False))
    assert k.writes == []
    assert k.status["targetInstances"] == 5
    monkeypatch.setenv("SAGESERVE_DRY_RUN", "false")
    assert dry_run(False) is False and dry_run(True) is True


def _pool_pod(name: str, ready: bool = True, region: str = "us-east") -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "labels": {LABEL_DEPLOYMENT: "tail", LABEL_REGION: region},
        },
        "status": {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
    }


def test_a_pool_scale_in_removes_the_least_loaded_pods_first() -> None:
    k = PoolKube({})
    k.sets["tail-us-east-h100"]["spec"]["replicas"] = 4
    k.sets["tail-us-west-h100"]["spec"]["replicas"] = 2
    pods = [
        _pool_pod("busy"),
        _pool_pod("idle"),
        _pool_pod("light"),
        _pool_pod("silent"),  # no load reported: may be the busiest, never chosen
        _pool_pod("starting", ready=False),  # the ReplicaSet removes it first anyway
        _pool_pod("west", region="us-west"),
    ]
    loads = {
        "busy": PodLoad(0.9, 1000.0, 3),
        "idle": PodLoad(0.0, 1000.0),
        "light": PodLoad(0.1, 1000.0),
        "starting": PodLoad(0.0, 1000.0),
        "west": PodLoad(0.0, 1000.0),
    }
    apply_pool_targets(
        cast(Kube, k),
        "llm",
        [({"metadata": {"name": "tail"}}, pool())],
        {("tail", "us-east"): 2, ("tail", "us-west"): 2},
        {"tail": 1.0},
        logging.getLogger("test"),
        pods=pods,
        loads=loads,
    )
    # us-east 4 → 2: the two least loaded Ready pods marked, then the replicas written
    assert k.ops == [("cost", "idle"), ("cost", "light"), ("replicas", "tail-us-east-h100")]
    assert any("draining idle, light" in m for _, r, m in k.events if r == "PoolResized")
    assert pool_drain_choice(pods, loads, "tail", "us-east", 5) == ["idle", "light", "busy"]
