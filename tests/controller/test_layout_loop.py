"""The operator's layout loop (OServe §4.2, §4.3, §5.2 on Kubernetes) against fakes of the
API server and Prometheus: a measured capacity table in a ConfigMap, a mix that favours the
pipeline, a make-before-break switch stepped as the new pod becomes Ready, status.layouts
with per-variant weights, and a broken ConfigMap that keeps the layout in force."""

from __future__ import annotations

import logging
from typing import Any

import pytest
import yaml

from sageserve.api.model_deployment import pod_set_name
from sageserve.api.scaling_policy import LayoutEntry, layouts_from_status
from sageserve.controller.layout_loop import LayoutPass, LayoutState, free_gpus
from sageserve.core.labels import LABEL_DEPLOYMENT, LABEL_REGION, LABEL_VARIANT, NodeLabels
from sageserve.core.snapshot import Plan
from sageserve.core.types import EndpointKey
from sageserve.forecast.request_types import shape_bucket
from sageserve.metrics.exporter import OPERATOR_METRICS
from sageserve.plan.oserve_layouts import TYPE_CAPACITY_KEY, with_layouts

NS, MODEL, REGION, GPU = "llm", "m", "r1", "NVIDIA-H100-80GB-HBM3"
LOG = logging.getLogger("t")
TABLE = {
    "kind": "sageserve.io/type-capacity",
    "model": "llama-2-70b",
    "gpuType": GPU,
    "types": [
        {"promptTokens": 100, "outputTokens": 100},
        {"promptTokens": 2000, "outputTokens": 20},
    ],
    "capacity": {"TP4": [2.0, 0.2], "TP4xPP2": [2.2, 1.0]},
}


def md_raw(annotated: bool = True) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": MODEL, "namespace": NS, "uid": "u1"}
    if annotated:
        meta["annotations"] = {"sageserve.io/type-capacity": "n"}
    return {
        "apiVersion": "sageserve.io/v1alpha1",
        "kind": "ModelDeployment",
        "metadata": meta,
        "spec": {
            "model": {"name": "meta-llama/Llama-2-70b-hf"},
            "engine": {"image": "vllm/vllm-openai:v0.11.0"},
            "variants": [
                {
                    "name": "tp4",
                    "gpuType": GPU,
                    "gpusPerInstance": 4,
                    "capacityTokensPerSecond": 1000,
                    "startupSeconds": 5,
                },
                {
                    "name": "tp4pp2",
                    "gpuType": GPU,
                    "gpusPerInstance": 8,
                    "tensorParallel": 4,
                    "pipelineParallel": 2,
                    "capacityTokensPerSecond": 1000,
                    "startupSeconds": 5,
                },
            ],
            "regions": [{"name": REGION, "minInstances": 0, "maxInstances": 4}],
            "tiers": ["iw-f"],
            "policyRef": {"name": "p"},
        },
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    }


def policy_raw(forecast: str | None = None) -> dict[str, Any]:
    layouts: dict[str, Any] = {"replanSeconds": 10, "confirmations": 1}
    if forecast is not None:
        layouts["forecast"] = forecast
    return {
        "apiVersion": "sageserve.io/v1alpha1",
        "kind": "ScalingPolicy",
        "metadata": {"name": "p", "namespace": NS, "generation": 1},
        "spec": {"strategy": "reactive", "layouts": layouts},
    }


def node(name: str) -> dict[str, Any]:
    labels = NodeLabels()
    return {
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {
                labels.region: REGION,
                labels.gpu_type: GPU,
                labels.pool: labels.serving_pool,
            },
        },
        "status": {
            "capacity": {"nvidia.com/gpu": "8"},
            "allocatable": {"nvidia.com/gpu": "8"},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


def pod(variant: str, i: int, gpus: int, ready: bool, node_name: str = "n1") -> dict[str, Any]:
    return {
        "metadata": {
            "name": f"{MODEL}-{variant}-{i}",
            "labels": {LABEL_DEPLOYMENT: MODEL, LABEL_REGION: REGION, LABEL_VARIANT: variant},
        },
        "spec": {
            "nodeName": node_name,
            "containers": [{"resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}],
        },
        "status": {
            "phase": "Running",
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


class FakeKube:
    """Two 8-GPU H100 nodes; the model's two TP4 pods on the first."""

    def __init__(self, table: Any = TABLE, annotated: bool = True) -> None:
        self.md = md_raw(annotated)
        self.replicas = {"tp4": 2, "tp4pp2": 0}
        self.my_pods = [pod("tp4", 0, 4, True), pod("tp4", 1, 4, True)]
        self.data = None if table is None else {TYPE_CAPACITY_KEY: yaml.safe_dump(table)}
        self.patches: list[dict[str, Any]] = []
        self.events: list[tuple[str, str]] = []

    def objects(self, namespace: str, plural: str) -> list[dict[str, Any]]:
        return [self.md] if plural == "modeldeployments" else []

    def deployments_by_owner(self, namespace: str) -> dict[str, dict[str, dict[str, Any]]]:
        return {
            MODEL: {
                pod_set_name(MODEL, REGION, v): {"spec": {"replicas": n}}
                for v, n in self.replicas.items()
            }
        }

    def pods_of(self, namespace: str) -> list[dict[str, Any]]:
        return self.my_pods

    def pods(self) -> list[dict[str, Any]]:
        return self.my_pods

    def nodes(self) -> list[dict[str, Any]]:
        return [node("n1"), node("n2")]

    def config_map_data(self, namespace: str, name: str) -> dict[str, str] | None:
        return self.data

    def patch_status(self, namespace: str, plural: str, name: str, patch: dict[str, Any]) -> None:
        self.patches.append(patch)

    def event(self, body: dict[str, Any], type_: str, reason: str, message: str) -> None:
        self.events.append((reason, message))

    def layouts(self) -> list[dict[str, Any]]:
        return next(p["layouts"] for p in reversed(self.patches) if "layouts" in p)


class FakeReader:
    """The routers' shape counter: `counts` requests per (prompt, output) over the history;
    per step, each bucket's series (`series`) or else its mean rate over the hour."""

    def __init__(
        self,
        *requests: tuple[int, int, float],
        series: dict[tuple[int, int], list[float]] | None = None,
    ) -> None:
        self.counts: dict[tuple[str, str], float] = {}
        for p, o, c in requests:
            key = (shape_bucket(p), shape_bucket(o))
            self.counts[key] = self.counts.get(key, 0.0) + c
        self.series = {
            (shape_bucket(p), shape_bucket(o)): v for (p, o), v in (series or {}).items()
        }
        self.asked: list[tuple[str, str, str, int]] = []
        self.asked_series: list[tuple[str, str, str, float, float]] = []

    def request_shapes(
        self, namespace: str, model: str, region: str, seconds: int
    ) -> dict[tuple[str, str], float]:
        self.asked.append((namespace, model, region, seconds))
        return self.counts

    def request_shape_series(
        self, namespace: str, model: str, region: str, seconds: float, step: float
    ) -> dict[tuple[str, str], list[float]]:
        self.asked_series.append((namespace, model, region, seconds, step))
        n = int(seconds // step)
        out = {k: [c / 3600.0] * n for k, c in self.counts.items()}
        out.update({k: v[-n:] for k, v in self.series.items()})
        return out


#: over the default hour: 0.5 req/s short, 0.8 req/s long prompts
LONG_HEAVY = FakeReader((100, 100, 1800), (2000, 20, 2880))
SHORT_ONLY = FakeReader((100, 100, 7200))


def run(
    kube: FakeKube,
    state: LayoutState,
    reader: Any,
    now: float,
    plan: Plan | None = None,
    forecast: str | None = None,
) -> bool:
    conditions: list[dict[str, Any]] = []
    changed = LayoutPass(  # type: ignore[arg-type]
        kube, policy_raw(forecast), state, conditions, LOG
    ).run(reader, plan, now)
    kube.conditions = conditions  # type: ignore[attr-defined]
    return changed


def switches() -> float:
    labels = {"namespace": NS, "model": MODEL, "region": REGION, "gpu_type": GPU}
    value = OPERATOR_METRICS.registry.get_sample_value("sageserve_layout_switches_total", labels)
    return value or 0.0


def test_a_long_prompt_mix_switches_to_the_pipeline_make_before_break() -> None:
    kube, state = FakeKube(), LayoutState()
    before = switches()
    assert run(kube, state, LONG_HEAVY, 1000.0)
    assert switches() == before + 1
    assert LONG_HEAVY.asked[-1] == (NS, MODEL, REGION, 3600)
    # the start first: both TP4 replicas stay while the pipeline loads on the free node
    targets = state.targets()
    assert dict(targets.targets) == {
        (EndpointKey(MODEL, REGION), "tp4"): 2,
        (EndpointKey(MODEL, REGION), "tp4pp2"): 1,
    }
    (entry,) = kube.layouts()
    parsed = LayoutEntry.model_validate(entry)
    assert {r.variant: r.replicas for r in parsed.replicas} == {"tp4": 2, "tp4pp2": 1}
    assert "switching TP4 ×2 → TP4xPP2" in (parsed.message or "")
    assert "make-before-break" in (parsed.message or "")
    assert [r for r, _ in kube.events] == ["LayoutSwitch"]
    # per-type weights of the target layout; the router reads them
    long_type = parsed.types[1]
    assert (long_type.prompt_tokens, long_type.output_tokens) == (2000, 20)
    assert long_type.rate == pytest.approx(0.8)
    assert {w.variant: w.weight for w in long_type.weights} == {"tp4": 0.0, "tp4pp2": 1.0}
    assert layouts_from_status({"layouts": kube.layouts()})[(MODEL, REGION)][1][2] == {
        "tp4": 0.0,
        "tp4pp2": 1.0,
    }

    # the new pod comes up but is not Ready: nothing stops
    kube.replicas["tp4pp2"] = 1
    kube.my_pods.append(pod("tp4pp2", 0, 8, False, "n2"))
    assert not run(kube, state, LONG_HEAVY, 1001.0)
    assert state.targets().targets[(EndpointKey(MODEL, REGION), "tp4")] == 2
    # Ready: the old replicas go
    kube.my_pods[-1] = pod("tp4pp2", 0, 8, True, "n2")
    assert run(kube, state, LONG_HEAVY, 1002.0)
    assert state.targets().targets[(EndpointKey(MODEL, REGION), "tp4")] == 0
    assert kube.events[-1][0] == "LayoutSwitched"
    assert {r["variant"]: r["replicas"] for r in kube.layouts()[0]["replicas"]} == {
        "tp4": 0,
        "tp4pp2": 1,
    }
    # the pace loop's plan: the layout's targets, per variant
    plan = with_layouts(None, state.targets())
    assert plan is not None
    assert plan.layout_targets(EndpointKey(MODEL, REGION)) == {"tp4": 0, "tp4pp2": 1}


def test_a_short_mix_keeps_the_layout_and_says_why() -> None:
    kube, state = FakeKube(), LayoutState()
    run(kube, state, SHORT_ONLY, 1000.0)
    (entry,) = kube.layouts()
    assert entry["message"].startswith("layout TP4 ×2 kept on 8 GPUs (held)")
    assert {r["variant"]: r["replicas"] for r in entry["replicas"]} == {"tp4": 2, "tp4pp2": 0}
    assert not kube.events
    # not due again before replanSeconds: Prometheus is not asked
    asked = len(SHORT_ONLY.asked)
    assert not run(kube, state, SHORT_ONLY, 1005.0)
    assert len(SHORT_ONLY.asked) == asked


def ramping_long_prompts() -> FakeReader:
    """0.5 req/s of short requests steady; long prompts ramping from 0 to 0.3 req/s over
    the hour read (0.15 on average): at the measured mean both layouts serve everything,
    but the next hour's long prompts overload two TP4 replicas."""
    ramp = [0.3 * (i + 1) / 60 for i in range(60)]
    return FakeReader(
        (100, 100, 1800),
        (2000, 20, sum(ramp) * 60),
        series={(2000, 20): ramp},
    )


def test_a_ramping_long_prompt_type_switches_before_persistence_would() -> None:
    kube, state = FakeKube(), LayoutState()
    persisted = ramping_long_prompts()
    run(kube, state, persisted, 1000.0, forecast="persist")
    (entry,) = kube.layouts()
    assert entry["message"].startswith("layout TP4 ×2 kept on 8 GPUs (held)")
    assert not persisted.asked_series  # persistence reads no series
    assert not kube.events

    kube, state = FakeKube(), LayoutState()
    forecast = ramping_long_prompts()
    run(kube, state, forecast, 1000.0)
    (entry,) = kube.layouts()
    assert "switching TP4 ×2 → TP4xPP2" in entry["message"]
    # the forecast is of the long-prompt type (arima), above its measured mean
    assert "per-type forecast over 3600 s in 12 windows" in entry["message"]
    assert "type 1 0.152 → " in entry["message"] and "(arima)" in entry["message"]
    assert forecast.asked_series == [(NS, MODEL, REGION, 3600.0, 60.0)]
    # status.layouts publishes the measured mix, not the forecast
    assert entry["types"][1]["rate"] == pytest.approx(0.1525)
    assert [r for r, _ in kube.events] == ["LayoutSwitch"]


def test_a_type_with_too_little_history_keeps_its_measured_rate_and_says_so() -> None:
    kube, state = FakeKube(), LayoutState()
    # the routers have counted for 20 minutes only
    short = {(100, 100): [0.5] * 20, (2000, 20): [0.15] * 20}
    reader = FakeReader((100, 100, 600), (2000, 20, 180), series=short)
    run(kube, state, reader, 1000.0)
    (entry,) = kube.layouts()
    assert "type 1: too little history: 20 points, arima needs 60" in entry["message"]
    assert "its measured rate persists" in entry["message"]
    assert "type 1 0.05 → 0.05 req/s (persisted)" in entry["message"]


@pytest.mark.parametrize(
    ("table", "fragment"),
    [
        (None, "does not exist; create it"),
        ({**TABLE, "capacity": {"TP4": [2.0, 0.2]}}, "no row 'TP4xPP2' for variant tp4pp2"),
        ({**TABLE, "kind": "x"}, "kind is 'x'"),
    ],
)
def test_a_broken_configmap_is_reported_and_the_layout_in_force_kept(
    table: Any, fragment: str
) -> None:
    kube, state = FakeKube(), LayoutState()
    assert run(kube, state, LONG_HEAVY, 1000.0)  # switching
    before = dict(state.targets().targets)
    kube.data = None if table is None else {TYPE_CAPACITY_KEY: yaml.safe_dump(table)}
    assert not run(kube, state, LONG_HEAVY, 2000.0)
    assert dict(state.targets().targets) == before
    (cond,) = [c for c in kube.conditions if c["type"] == "LayoutsReady"]  # type: ignore[attr-defined]
    assert cond["status"] == "False" and fragment in cond["message"]
    assert "ConfigMap llm/n" in cond["message"] and "layouts in force are kept" in cond["message"]
    assert kube.events[-1][0] == "LayoutInvalid"


def test_without_a_table_n_is_analytical_and_types_are_fitted() -> None:
    kube, state = FakeKube(annotated=False), LayoutState()
    run(kube, state, LONG_HEAVY, 1000.0)
    (entry,) = kube.layouts()
    assert len(entry["types"]) == 2  # two distinct buckets: k-means finds two types
    assert all(t["weights"] for t in entry["types"])
    assert [c["status"] for c in kube.conditions if c["type"] == "LayoutsReady"] == ["True"]  # type: ignore[attr-defined]


def test_nothing_is_pinned_before_the_pod_sets_exist_or_while_the_layout_is_empty() -> None:
    kube, state = FakeKube(), LayoutState()
    kube.replicas = {"tp4": 2}  # the tp4pp2 pod set is not created yet
    run(kube, state, LONG_HEAVY, 1000.0)
    assert not state.targets().targets
    assert kube.layouts()[0]["message"] == "waiting for the pod sets of every variant"
    # an empty layout: the strategy's from-zero rule sizes the endpoint, not the layout
    kube.replicas = {"tp4": 0, "tp4pp2": 0}
    run(kube, state, LONG_HEAVY, 1005.0)
    assert not state.targets().targets
    # once it holds GPUs the layout takes over from what runs
    kube.replicas = {"tp4": 1, "tp4pp2": 0}
    run(kube, state, LONG_HEAVY, 1006.0)
    assert state.targets().targets[(EndpointKey(MODEL, REGION), "tp4")] == 1


def test_a_model_deployment_not_ready_is_left_alone() -> None:
    kube, state = FakeKube(), LayoutState()
    kube.md["status"] = {"conditions": [{"type": "Ready", "status": "False"}]}
    run(kube, state, LONG_HEAVY, 1000.0)
    assert not state.groups and kube.layouts() == []


def test_a_new_plans_budget_is_followed_without_the_gate_even_with_no_traffic() -> None:
    kube, state = FakeKube(), LayoutState()
    key = EndpointKey(MODEL, REGION)
    plan = Plan(0.0, {(key, "tp4"): 4})  # the ILP's 4 × 4 GPUs where 8 are held
    assert run(kube, state, FakeReader(), 1000.0, plan)
    assert dict(state.targets().targets) == {(key, "tp4"): 4, (key, "tp4pp2"): 0}
    switch = next(m for r, m in kube.events if r == "LayoutSwitch")
    assert "budget 16 GPUs (plan) where TP4 ×2 holds 8, no request counted" in switch
    assert kube.layouts()[0]["message"].startswith("switched TP4 ×2 → TP4 ×4")
    # with traffic the search spreads the plan's GPUs over the layouts
    kube2, state2 = FakeKube(), LayoutState()
    run(kube2, state2, LONG_HEAVY, 1000.0, plan)
    replicas = {v: n for (_, v), n in state2.targets().targets.items()}
    assert replicas["tp4pp2"] >= 1 and 4 * replicas["tp4"] + 8 * replicas["tp4pp2"] >= 16


def test_free_gpus_count_the_nodes_less_what_pods_on_them_hold() -> None:
    pods = [pod("tp4", 0, 4, True, "n1"), pod("tp4", 1, 4, False, "n2")]
    assert free_gpus([node("n1"), node("n2")], pods, NodeLabels(), REGION, GPU) == (8, 8)
    assert free_gpus([node("n1")], pods, NodeLabels(), "elsewhere", GPU) == (0, 8)
    spot = node("s1")
    spot["metadata"]["labels"][NodeLabels().pool] = NodeLabels().spot_pool
    assert free_gpus([node("n1"), spot], pods, NodeLabels(), REGION, GPU) == (4, 8)
    assert free_gpus([node("n1"), spot], pods, NodeLabels(), REGION, GPU, spot=True) == (12, 8)


def test_a_switch_whose_new_pods_never_serve_is_abandoned_and_not_retried_at_once() -> None:
    # the pipeline's pod is created but never Ready (an image that does not pull): after two
    # start-ups (5 s each) and the 120 s grace the switch is given up, the old layout kept
    kube, state = FakeKube(), LayoutState()
    assert run(kube, state, LONG_HEAVY, 1000.0)
    kube.replicas["tp4pp2"] = 1
    kube.my_pods.append(pod("tp4pp2", 0, 8, False, "n2"))
    assert not run(kube, state, LONG_HEAVY, 1129.0)  # still waiting: both TP4 serve
    assert state.groups[(MODEL, REGION, GPU)].switch is not None
    assert run(kube, state, LONG_HEAVY, 1131.0)
    key = EndpointKey(MODEL, REGION)
    assert dict(state.targets().targets) == {(key, "tp4"): 2, (key, "tp4pp2"): 0}
    reasons = [r for r, _ in kube.events]
    assert reasons == ["LayoutSwitch", "LayoutSwitchAbandoned"]
    message = dict(kube.events)["LayoutSwitchAbandoned"]
    assert "1 pod(s) of variant tp4pp2 not Ready" in message
    assert "layout kept at TP4 ×2" in message
    assert "abandoned after 131 s" in kube.layouts()[0]["message"]
    # the next re-plan proposes the pipeline again: held back for an hour
    assert not run(kube, state, LONG_HEAVY, 1200.0)
    (entry,) = kube.layouts()
    assert "was abandoned" in entry["message"] and "not proposed again" in entry["message"]
    assert [r for r, _ in kube.events].count("LayoutSwitch") == 1
    # an hour later it may be tried again
    assert run(kube, state, LONG_HEAVY, 1131.0 + 3601.0)
    assert [r for r, _ in kube.events].count("LayoutSwitch") == 2
