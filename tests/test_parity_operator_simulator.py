"""One recorded sequence of observations, two worlds, the same decisions; and one hour of
token rates and queued batch work, two worlds, the same plan.

Each step of the recording says what every instance of one endpoint reports (KV usage,
queue, whether it is scraped at all), how many instances are still coming up, and how
many requests wait for an endpoint with nothing serving. The operator's adapter sees it
as the API server and Prometheus would give it (pods, Deployments, per-pod samples:
`controller.observe`); the simulator's adapter as its instances (`sim.cluster.Endpoint`).
Both go through `pace.step.decide`; the snapshots and the decisions must be identical,
step after step, with a missing-data spell, a plan change, a burst and a quiet spell.
The batch deadline need is one more such fact: the routers' gauge on the operator's side,
the Queue Manager's on the simulator's; both worlds share it over a model's endpoints
alike and scale out alike for it.

The hourly plan (SageServe §5, §6.3) is made by the operator's plan loop from what
Prometheus and the API server hold (`controller.plan_loop.PlanPass`, in process:
`tests.controller.plan_fakes`) and by the simulator's planner from its own counters
(`sim.scenario.Scenario.planner`): the same history, batch, current sizes, GPUs and batch
deadline need must give the same plan. And both plan at the same moments: the strategy's
cadence (`pace.cadence.plan_step`) through the operator's plan loop and the simulator's
minute tick, over two hours of looks.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from sageserve.api.model_deployment import ModelDeployment, model_theta_tps, pod_set_name
from sageserve.api.scaling_policy import ScalingPolicy
from sageserve.controller.observe import endpoint_snapshots
from sageserve.core.labels import LABEL_DEPLOYMENT, LABEL_REGION, LABEL_VARIANT
from sageserve.core.snapshot import Decision, EndpointSnapshot, Plan, Snapshot
from sageserve.core.types import EndpointKey
from sageserve.metrics.prometheus import PodLoad
from sageserve.pace import make_strategy
from sageserve.pace.step import StepState, decide
from sageserve.sim.cluster import Deployment, Endpoint, nodes_from_manifests
from sageserve.sim.engine import Simulation
from sageserve.sim.scenario import Scenario
from sageserve.sim.workload import Workload
from tests.controller import plan_fakes
from tests.sim.helpers import flat_perf

NS, MODEL, REGION = "llm", "llama", "us-east"
KEY = EndpointKey(MODEL, REGION)
VARIANTS = ("h100", "a100")
BLOCK = 16
#: KV capacity (tokens) of one instance of each variant: num_gpu_blocks × block size.
CAPACITY = {"h100": 4000 * BLOCK, "a100": 1000 * BLOCK}


@dataclass(frozen=True)
class Inst:
    name: str
    variant: str
    usage: float  # KV usage 0–1, as vLLM's gauge reports it
    waiting: int = 0
    scraped: bool = True


@dataclass(frozen=True)
class Step:
    """What the world looks like at time `t` (and, optionally, a new plan)."""

    t: float
    instances: tuple[Inst, ...]
    coming: dict[str, int] = field(default_factory=dict)  # instances still starting
    held: int = 0  # requests the router holds while nothing serves
    plan: Plan | None = None


def plan(at: float, h100: int, a100: int) -> Plan:
    return Plan(at, {(KEY, "h100"): h100, (KEY, "a100"): a100}, {KEY: 1000.0}, {KEY: 500.0})


def fleet(usage: float, n: int = 3, variant: str = "h100") -> tuple[Inst, ...]:
    return tuple(Inst(f"{variant}-{i}", variant, usage) for i in range(n))


RECORDING = [
    Step(0.0, fleet(0.5), plan=plan(0.0, 3, 0)),
    Step(15.0, (*fleet(0.1, 2), Inst("h100-2", "h100", 0.1, scraped=False))),  # partial
    Step(30.0, tuple(Inst(i.name, i.variant, 0.1, scraped=False) for i in fleet(0.1))),  # none
    Step(45.0, fleet(0.9)),  # burst: LT-I holds at the plan, reactive scales out
    Step(60.0, fleet(0.9), plan=plan(60.0, 3, 2)),  # plan change: the a100 share
    Step(75.0, (*fleet(0.8), Inst("a100-0", "a100", 0.6, waiting=4)), coming={"a100": 1}),
    Step(90.0, (*fleet(0.05), Inst("a100-0", "a100", 0.02)), coming={}),  # quiet spell
    Step(105.0, (Inst("h100-1", "h100", 0.01), Inst("h100-2", "h100", 0.3, waiting=2))),
    Step(120.0, (), held=5),  # nothing serves, requests wait: from zero
    Step(135.0, (), held=0),
]


def model_deployment() -> ModelDeployment:
    return ModelDeployment.model_validate(
        {
            "apiVersion": "sageserve.io/v1alpha1",
            "kind": "ModelDeployment",
            "metadata": {"name": MODEL, "namespace": NS},
            "spec": {
                "model": {"name": "meta-llama/Llama-2-70b-hf"},
                "engine": {"image": "vllm/vllm-openai:v0.11.0"},
                "variants": [
                    {
                        "name": v,
                        "gpuType": f"GPU-{v}",
                        "gpusPerInstance": 4,
                        "capacityTokensPerSecond": 1000,
                    }
                    for v in VARIANTS
                ],
                "regions": [{"name": REGION, "minInstances": 0, "maxInstances": 8}],
                "tiers": ["iw-f"],
                "policyRef": {"name": "p"},
            },
        }
    )


# ---- the operator's view: what the API server and Prometheus return ----------------------


def pod(i: Inst, region: str = REGION) -> dict[str, Any]:
    return {
        "metadata": {
            "name": i.name,
            "namespace": NS,
            "labels": {LABEL_DEPLOYMENT: MODEL, LABEL_REGION: region, LABEL_VARIANT: i.variant},
        },
        "status": {"conditions": [{"type": "Ready", "status": "True"}]},
    }


def operator_snapshot(md: ModelDeployment, step: Step) -> EndpointSnapshot:
    counts = {v: sum(1 for i in step.instances if i.variant == v) for v in VARIANTS}
    deployments = {
        pod_set_name(MODEL, REGION, v): {"spec": {"replicas": counts[v] + step.coming.get(v, 0)}}
        for v in VARIANTS
    }
    loads = {
        i.name: PodLoad(i.usage, CAPACITY[i.variant], i.waiting)
        for i in step.instances
        if i.scraped
    }
    snaps = endpoint_snapshots(
        md,
        NS,
        deployments,
        [pod(i) for i in step.instances],
        loads,
        {(NS, MODEL, REGION): 100.0},
        {(NS, MODEL, REGION): float(step.held)},
    )
    return snaps[KEY]


# ---- the simulator's view: its instances ---------------------------------------------------


@dataclass
class SimInstance:
    """What `sim.cluster.Endpoint` reads of an instance (a stand-in at the adapter's edge)."""

    id: str
    usage: float
    kv_cap: int
    waiting: int
    reporting: bool
    endpoint: Deployment | None = None
    running: int = 0

    def kv_at(self, t: float) -> float:
        return self.usage * self.kv_cap


def simulator_snapshot(step: Step) -> EndpointSnapshot:
    return simulator_endpoint(step).snapshot(step.t)


def simulator_endpoint(step: Step, key: EndpointKey = KEY) -> Endpoint:
    ep = Endpoint(key, 0, 8, refresh_s=0.0)
    for v in VARIANTS:
        dep = Deployment(f"{MODEL}-{REGION}-{v}", flat_perf(), ep)
        dep.variant = v
        ep.deployments.append(dep)
        mine = [i for i in step.instances if i.variant == v]
        dep.instances = [  # type: ignore[list-item]
            SimInstance(i.name, i.usage, CAPACITY[v], i.waiting, i.scraped) for i in mine
        ]
        for n in range(step.coming.get(v, 0)):
            coming = SimInstance(f"{v}-coming-{n}", 0.0, CAPACITY[v], 0, True, dep)
            ep.provisioning.append(coming)  # type: ignore[arg-type]
    ep.backlog = [object()] * step.held  # type: ignore[list-item]
    ep.tokens_per_s = 100.0
    return ep


@pytest.mark.parametrize("strategy", ["reactive", "lt-immediate", "lt-utilization-arima"])
def test_both_worlds_decide_alike_on_one_recording(strategy: str) -> None:
    md = model_deployment()
    chosen = make_strategy(strategy, {"cooldown_s": 10.0})
    states = {"operator": StepState(), "simulator": StepState()}
    seen: list[tuple[list[Decision], list[str]]] = []
    for step in RECORDING:
        snaps = {"operator": operator_snapshot(md, step), "simulator": simulator_snapshot(step)}
        assert snaps["operator"] == snaps["simulator"], f"t={step.t}"
        decisions = {}
        for world, snap in snaps.items():
            out = decide(step.t, Snapshot(step.t, {KEY: snap}), step.plan, states[world], chosen)
            states[world] = out.state
            decisions[world] = (out.decisions, [h.reason for h in out.held])
        assert decisions["operator"] == decisions["simulator"], f"t={step.t}"
        seen.append(decisions["operator"])
    # the recording exercises the rules it claims to
    reasons = [d.reason for ds, _ in seen for d in ds]
    assert any(r.startswith("from zero") for r in reasons)
    assert seen[2] == ([], ["none of 3 serving instance(s) reports its load"])
    if strategy == "reactive":  # quiet, but one pod silent: no scale-in on partial data
        assert seen[1] == ([], ["2 of 3 serving instance(s) report: no scale-in"])
        assert seen[6][0][0].drain == ("h100-0",)  # the least-loaded instance drains
    else:  # the plan change moves the GPU-type split to the planned a100s
        assert seen[4][0][0].replicas.keys() == {"a100"}


def test_the_operator_weighs_pods_by_their_kv_cache_size() -> None:
    md = model_deployment()
    step = Step(0.0, (Inst("h100-0", "h100", 0.9), Inst("a100-0", "a100", 0.1)))
    snap = operator_snapshot(md, step)
    expected = (0.9 * CAPACITY["h100"] + 0.1 * CAPACITY["a100"]) / sum(CAPACITY.values())
    assert snap.emu == pytest.approx(expected)  # 0.74, where the mean of the gauges is 0.5


def test_an_operator_endpoint_at_zero_comes_back_when_requests_wait() -> None:
    md = model_deployment()
    snap = operator_snapshot(md, Step(0.0, (), held=2))
    out = decide(0.0, Snapshot(0.0, {KEY: snap}), None, StepState(), make_strategy("reactive"))
    assert [(d.kind.value, d.replicas) for d in out.decisions] == [("scale_out", {"h100": 1})]


# ---- the batch deadline need ---------------------------------------------------------------

WEST = "us-west"
#: the Queue Manager's release threshold (`spec.routing.batchRelease`, SageServe §6.2)
RELEASE_BELOW = 0.6
#: (t, serving instances in us-east, in us-west, the model's batch deadline need tokens/s)
NEEDS = [
    (0.0, 2, 1, 0.0),  # nothing queued with a deadline
    (15.0, 2, 1, 1200.0),  # within the 3 × 1000 × 60 % the troughs give
    (30.0, 2, 1, 2400.0),  # above it: both endpoints scale out, each for its share
    (45.0, 3, 2, 2400.0),  # more serving: within again
]


def two_regions() -> ModelDeployment:
    raw = model_deployment().model_dump(by_alias=True, exclude_none=True)
    raw["spec"]["regions"].append({"name": WEST, "minInstances": 0, "maxInstances": 8})
    return ModelDeployment.model_validate(raw)


def operator_deadline_snapshots(
    md: ModelDeployment, steps: dict[str, Step], need: float
) -> dict[EndpointKey, EndpointSnapshot]:
    """The operator's snapshots of both regions, the need as the routers' gauge gives it."""
    deployments = {
        pod_set_name(MODEL, region, v): {
            "spec": {"replicas": sum(1 for i in step.instances if i.variant == v)}
        }
        for region, step in steps.items()
        for v in VARIANTS
    }
    instances = [(i, region) for region, step in steps.items() for i in step.instances]
    return endpoint_snapshots(
        md,
        NS,
        deployments,
        [pod(i, region) for i, region in instances],
        {i.name: PodLoad(i.usage, CAPACITY[i.variant], i.waiting) for i, _ in instances},
        {},
        batch_need_tps=need,
        release_below=RELEASE_BELOW,
    )


def simulator_deadline_snapshots(
    md: ModelDeployment, steps: dict[str, Step], need: float, t: float
) -> dict[EndpointKey, EndpointSnapshot]:
    """The simulator's snapshots of both regions, through its own `_with_deadlines` with
    the engine's state as a stand-in (the need its Queue Manager read, θ per model)."""
    eps = {
        EndpointKey(MODEL, region): simulator_endpoint(step, EndpointKey(MODEL, region))
        for region, step in steps.items()
    }
    for ep in eps.values():
        ep.tokens_per_s = 0.0
    engine = SimpleNamespace(
        _batch_need={MODEL: need} if need > 0 else {},
        _theta={MODEL: model_theta_tps(md)},
        _release_below=RELEASE_BELOW,
        _eps_of_model={MODEL: list(eps.values())},
    )
    return {
        key: Simulation._with_deadlines(engine, ep.snapshot(t))  # type: ignore[arg-type]
        for key, ep in eps.items()
    }


@pytest.mark.parametrize("strategy", ["reactive", "lt-immediate", "lt-utilization-arima"])
def test_the_same_deadline_need_gives_the_same_decisions_in_both_worlds(strategy: str) -> None:
    md = two_regions()
    chosen = make_strategy(strategy, {"cooldown_s": 10.0})
    states = {"operator": StepState(), "simulator": StepState()}
    seen: list[list[Decision]] = []
    for t, east, west, need in NEEDS:
        steps = {
            REGION: Step(t, fleet(0.4, east)),
            WEST: Step(t, tuple(Inst(f"w-{i}", "h100", 0.4) for i in range(west))),
        }
        snaps = {
            "operator": operator_deadline_snapshots(md, steps, need),
            "simulator": simulator_deadline_snapshots(md, steps, need, t),
        }
        assert snaps["operator"] == snaps["simulator"], f"t={t}"
        decisions = {}
        for world, endpoints in snaps.items():
            out = decide(t, Snapshot(t, endpoints), None, states[world], chosen)
            states[world] = out.state
            decisions[world] = out.decisions
        assert decisions["operator"] == decisions["simulator"], f"t={t}"
        seen.append(decisions["operator"])
    # the need is shared by serving instances: 2 of 3 in us-east, 1 of 3 in us-west
    east_snap = operator_deadline_snapshots(
        md, {REGION: Step(0.0, fleet(0.4, 2)), WEST: Step(0.0, fleet(0.4, 1, "a100"))}, 2400.0
    )
    assert east_snap[KEY].batch_need_tps == pytest.approx(1600.0)
    if strategy == "reactive":  # EMU at 40 %: only the deadline need scales
        assert seen[0] == [] and seen[1] == []
        reasons = {d.key.region: d.reason for d in seen[2]}
        assert set(reasons) == {REGION, WEST}
        assert reasons[REGION].startswith("batch deadline pressure: 1600 tok/s needed")
        assert reasons[WEST].startswith("batch deadline pressure: 800 tok/s needed")


# ---- the hourly plan -------------------------------------------------------------------------

LLAMA = "llama-2-70b"
PLAN_REGIONS = ("us-east", "us-central", "us-west")


def simulator_planner() -> Any:
    """The simulator's hourly planner on the operator's manifests and inventory."""
    scenario = Scenario(
        name="parity",
        root=Path("."),
        description="",
        models=plan_fakes.models(),
        tiers={},
        policy=ScalingPolicy.model_validate(plan_fakes.policy_body()),
        nodes=nodes_from_manifests(plan_fakes.node_docs()),
        workload=Workload(0, 0.0, 3600.0, list(PLAN_REGIONS)),
        drain_s=0.0,
    )
    return scenario.planner()


def per_minute(values: list[float]) -> list[float]:
    """A series on the policy's step as the simulator counts it: one value a minute."""
    return [x for x in values for _ in range(plan_fakes.STEP_S // 60)]


def per_minute_all(
    series: dict[tuple[str, str], list[float]],
) -> dict[tuple[str, str], list[float]]:
    return {k: per_minute(v) for k, v in series.items()}


@pytest.mark.parametrize(
    ("need", "observed", "grows"),
    [
        (None, PLAN_REGIONS, False),  # no queue behind: the paper's β
        ({LLAMA: 1800.0}, PLAN_REGIONS, True),  # a starving queue: its need, by region demand
        ({LLAMA: 20.0}, PLAN_REGIONS, False),  # a need below β changes nothing
        ({LLAMA: 3000.0}, PLAN_REGIONS[:2], True),  # us-west unobserved: held, takes a share
    ],
)
def test_both_worlds_plan_alike_from_the_same_hour(
    need: dict[str, float] | None, observed: tuple[str, ...], grows: bool
) -> None:
    level = {"us-east": 800.0, "us-central": 600.0, "us-west": 400.0}
    steps = plan_fakes.TRAINING_S // plan_fakes.STEP_S
    # the last step is not the hour's peak, so a world that read the wrong steps would show
    interactive = {
        (LLAMA, r): [level[r] + 25.0 * ((steps - 1 - i) % 4) for i in range(steps)]
        for r in observed
    }
    served = {(LLAMA, r): [100.0] * 6 for r in observed}  # the troughs let 100 tokens/s through
    received = {(LLAMA, r): [400.0] * 6 for r in PLAN_REGIONS}  # while 400 arrive: β = 40
    current = {(LLAMA, "us-east", "h100"): 4, (LLAMA, "us-central", "h100"): 4}
    current[(LLAMA, "us-west", "h100")] = 1
    # the operator reads all of vLLM's tokens, the router's batch served and received
    total = {
        k: [*v[:-6], *(x + b for x, b in zip(v[-6:], served[k], strict=True))]
        for k, v in interactive.items()
    }
    kube = plan_fakes.FakeKube(current=current)
    reader = plan_fakes.FakeReader(total, served, received, need)
    cycle = plan_fakes.plan_pass(kube, reader, logging.getLogger("parity"))
    assert cycle is not None and cycle.result.status == "optimal"
    now = 3600.0
    operator = cycle.in_force(now)
    planner = simulator_planner()
    # the simulator counts per minute and keeps more than the training window: it must give
    # the forecaster what Prometheus gives the operator (the policy's step and window)
    older = {k: [3.0 * level[k[1]]] * 120 for k in interactive}
    sim_interactive = {k: older[k] + per_minute(v) for k, v in interactive.items()}
    sim_served, sim_received = per_minute_all(served), per_minute_all(received)
    simulator = planner(now, sim_interactive, sim_served, current, sim_received, need or {})
    assert simulator == operator
    # and that plan is the one the need calls for: more instances only when it exceeds β
    shares = {f["region"]: f["batchDeadlineNeedTokensPerSecond"] for f in kube.plan()["forecasts"]}
    assert sum(shares.values()) == pytest.approx(sum((need or {}).values()), abs=1e-2)
    paper = planner(now, sim_interactive, sim_served, current, sim_received, {})
    grown = [k for k, n in operator.targets.items() if n > paper.targets[k]]
    assert bool(grown) == grows
    assert all(n >= paper.targets[k] for k, n in operator.targets.items())


# ---- when each world plans ------------------------------------------------------------------

#: Two hours of looks, one a minute (the simulator's minute tick; the operator looks more often
#: but plans only when due).
LOOKS = [60.0 * m for m in range(121)]


def cadence_policy(strategy: str) -> ScalingPolicy:
    return ScalingPolicy.model_validate(
        {
            "apiVersion": "sageserve.io/v1alpha1",
            "kind": "ScalingPolicy",
            "metadata": {"name": "p", "namespace": NS},
            "spec": {
                "strategy": strategy,
                "intervals": {"planSeconds": 1800},
                "preserve": {"windowSeconds": 300},
            },
        }
    )


def operator_plan_times(
    policy: ScalingPolicy, start: float, monkeypatch: pytest.MonkeyPatch
) -> list[float]:
    """The moments `Loops.plan_if_due` runs a plan pass when it looks at `LOOKS` (its
    plan passes recorded, not run: this is about when, not what)."""
    from sageserve.controller import pace_loop

    clock = SimpleNamespace(now=start)
    ran: list[float] = []

    class Pass:
        def __init__(self, *_args: Any) -> None:
            pass

        def run(self, *_args: Any) -> Any:
            ran.append(clock.now)
            return SimpleNamespace(in_force=lambda wall: Plan(wall, {}))

        run_window = run

    monkeypatch.setattr(pace_loop.time, "time", lambda: clock.now)
    monkeypatch.setattr(pace_loop, "PlanPass", Pass)
    monkeypatch.setattr(pace_loop, "WindowPass", Pass)
    monkeypatch.setattr(pace_loop, "prometheus_reader", lambda **_kw: None)
    loops = pace_loop.Loops([NS], lambda _: None, 3600.0, logging.getLogger("parity"))
    state = pace_loop.PaceState()
    body = policy.model_dump(by_alias=True, mode="json")
    for t in LOOKS:
        clock.now = start + t
        loops.plan_if_due(None, body, state)  # type: ignore[arg-type]
    return [t - start for t in ran]


def simulator_plan_times(policy: ScalingPolicy) -> list[float]:
    """The moments the simulator calls its planner over the same two hours, with load
    history before the window (as Prometheus holds it for the operator)."""
    from sageserve.pace.from_policy import strategy_for
    from tests.sim.helpers import config

    ran: list[float] = []

    def planner(now: float, *_args: Any, **_kwargs: Any) -> Plan:
        ran.append(now)
        return Plan(now, {})

    cfg = config(flat_perf(), end_s=LOOKS[-1] + 1.0)
    history = ({("m", "r1"): [1.0]}, {})
    Simulation(cfg, strategy_for(policy.spec), iter([]), None, planner, history).run()
    return ran


@pytest.mark.parametrize(
    ("strategy", "every_s"),
    [("lt-utilization-arima", 1800.0), ("lt-immediate", 1800.0), ("preserve", 300.0)],
)
def test_both_worlds_plan_at_the_same_moments(
    strategy: str, every_s: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    policy = cadence_policy(strategy)
    expected = [t for t in LOOKS if t % every_s == 0]
    assert simulator_plan_times(policy) == expected
    assert operator_plan_times(policy, 1.8e9, monkeypatch) == expected


def test_neither_world_plans_for_the_baselines(monkeypatch: pytest.MonkeyPatch) -> None:
    policy = cadence_policy("reactive")
    assert simulator_plan_times(policy) == []
    assert operator_plan_times(policy, 1.8e9, monkeypatch) == []


# ---- the endpoint picker's signals ---------------------------------------------------------

POOL = f"{MODEL}-{REGION}"  # the default InferencePool name of (llama, us-east)


@dataclass(frozen=True)
class PickedInst:
    name: str
    usage: float  # dyadic, so KV used ÷ capacity gives the usage back exactly
    waiting: int
    running: int = 0


@dataclass(frozen=True)
class Picked:
    """One look at an endpoint an endpoint picker fronts: its instances (h100), those still
    coming up, and the requests the picker holds in its own queue."""

    t: float
    instances: tuple[PickedInst, ...]
    held: int = 0
    coming: int = 0


PICKED = [
    Picked(0.0, tuple(PickedInst(f"h100-{i}", 0.5, 1, 3) for i in range(3))),
    # the queue grows at the gateway while KV stays at 50 %: only the picker sees it
    Picked(15.0, tuple(PickedInst(f"h100-{i}", 0.5, 2, 4) for i in range(3)), held=30),
    Picked(30.0, tuple(PickedInst(f"h100-{i}", 0.5, 4, 4) for i in range(3)), coming=1),
    # one pod's queue: the picker's saturation (mean of max(9/5, ...)) passes 1
    Picked(
        45.0,
        (PickedInst("h100-0", 0.875, 9, 6), PickedInst("h100-1", 0.5, 0, 2)),
        coming=0,
    ),
    Picked(60.0, (), held=4),  # nothing serves, the picker holds requests: from zero
    Picked(75.0, ()),
]


def epp_readings(step: Picked) -> dict[str, Any]:
    """What Prometheus answers the picker queries with (`metrics.picker`), as the picker
    computes its gauges (`pkg/epp/.../logger.go`, the utilization detector): mean queue and
    running over its ready pods × their number, its own queue, the mean of each pod's
    max(waiting ÷ 5, KV ÷ 0.8) (an empty pool: 1.0)."""
    from sageserve.metrics import picker

    n = len(step.instances)
    mean_queue = sum(i.waiting for i in step.instances) / n if n else 0.0
    mean_running = sum(i.running for i in step.instances) / n if n else 0.0
    scores = [
        max(i.waiting / picker.QUEUE_THRESHOLD, i.usage / picker.KV_THRESHOLD)
        for i in step.instances
    ]
    return picker.combine(
        {POOL: mean_queue * n},
        {POOL: float(step.held)} if step.held else {},
        {POOL: sum(scores) / n if n else 1.0},
        {POOL: mean_running * n},
    )


def operator_picked(md: ModelDeployment, step: Picked, with_picker: bool) -> EndpointSnapshot:
    """The operator's snapshot: pods and their engines' series, no router in front (the
    picker is), the picker's series per pool when the policy reads them."""
    insts = [Inst(i.name, "h100", i.usage, i.waiting) for i in step.instances]
    deployments = {
        pod_set_name(MODEL, REGION, v): {
            "spec": {"replicas": (len(insts) + step.coming) if v == "h100" else 0}
        }
        for v in VARIANTS
    }
    snaps = endpoint_snapshots(
        md,
        NS,
        deployments,
        [pod(i) for i in insts],
        {i.name: PodLoad(i.usage, CAPACITY["h100"], i.waiting) for i in insts},
        {(NS, MODEL, REGION): 100.0},
        {},
        picker=epp_readings(step) if with_picker else None,
    )
    return snaps[KEY]


def simulator_picked(step: Picked, with_picker: bool) -> EndpointSnapshot:
    """The simulator's snapshot: its instances, the requests held its picker's queue."""
    ep = Endpoint(KEY, 0, 8, refresh_s=0.0)
    for v in VARIANTS:
        dep = Deployment(f"{MODEL}-{REGION}-{v}", flat_perf(), ep)
        dep.variant = v
        ep.deployments.append(dep)
        if v != "h100":
            continue
        dep.instances = [  # type: ignore[list-item]
            SimInstance(i.name, i.usage, CAPACITY[v], i.waiting, True, running=i.running)
            for i in step.instances
        ]
        for n in range(step.coming):
            coming = SimInstance(f"{v}-coming-{n}", 0.0, CAPACITY[v], 0, True, dep)
            ep.provisioning.append(coming)  # type: ignore[arg-type]
    ep.backlog = [object()] * step.held  # type: ignore[list-item]
    ep.tokens_per_s = 100.0
    return ep.snapshot(step.t, picker=with_picker)


@pytest.mark.parametrize("strategy", ["reactive", "lt-immediate", "lt-utilization-arima"])
def test_the_same_picker_readings_give_the_same_decisions_in_both_worlds(strategy: str) -> None:
    md = model_deployment()
    chosen = make_strategy(strategy, {"cooldown_s": 10.0})
    states = {"operator": StepState(), "simulator": StepState()}
    seen: list[list[Decision]] = []
    for step in PICKED:
        snaps = {
            "operator": operator_picked(md, step, True),
            "simulator": simulator_picked(step, True),
        }
        assert snaps["operator"] == snaps["simulator"], f"t={step.t}"
        assert snaps["operator"].picker is not None
        decisions = {}
        for world, snap in snaps.items():
            out = decide(step.t, Snapshot(step.t, {KEY: snap}), None, states[world], chosen)
            states[world] = out.state
            decisions[world] = out.decisions
        assert decisions["operator"] == decisions["simulator"], f"t={step.t}"
        seen.append(decisions["operator"])
    assert [d.reason for d in seen[4]] == ["from zero: 4 request(s) waiting"]
    if strategy == "reactive":  # the LT strategies hold at their plan (none here)
        assert [d.kind.value for d in seen[1]] == ["scale_out"]
        assert seen[1][0].reason.startswith("endpoint picker: 36 waiting, 12.0 per instance")
        assert seen[2] == []  # the queue drained to 0.8 of its level: no scale-in either
        assert seen[3][0].reason.startswith("endpoint picker saturation 1.21")


def test_without_the_picker_a_gateway_queue_is_invisible() -> None:
    """The control: the same world, no picker read; the engines' queues (2 per instance)
    and KV (50 %) stay under every threshold while 30 requests wait at the gateway."""
    md = model_deployment()
    step = PICKED[1]
    snaps = [operator_picked(md, step, False)]
    out = decide(
        step.t, Snapshot(step.t, {KEY: snaps[0]}), None, StepState(), make_strategy("reactive")
    )
    assert out.decisions == []
