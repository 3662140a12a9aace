"""The paper's baselines as the decision step runs them: `reactive-paper` (SageServe §7.1's
Reactive, literally) and `chiron` (SageServe v3 §7.1's Chiron), as tables through
`pace.step.decide`, the one function both worlds call."""

from __future__ import annotations

import pytest

from sageserve.api.scaling_policy import ScalingPolicySpec
from sageserve.core.snapshot import EndpointSnapshot, InstanceView, Snapshot
from sageserve.core.types import ActionKind, EndpointKey
from sageserve.pace import make_strategy
from sageserve.pace.from_policy import strategy_for
from sageserve.pace.pressure import SCALE_IN_STABILIZATION_S
from sageserve.pace.step import StepState, decide

KEY = EndpointKey("llama", "us-east")
PAPER = make_strategy("reactive-paper")
REACTIVE = make_strategy("reactive")
CHIRON = make_strategy("chiron")


def endpoint(
    kv: list[float],
    *,
    interactive: list[int] | None = None,
    coming: int = 0,
    waiting: int = 0,
    ttft_p95: float | None = None,
    need: float = 0.0,
    capacity: float = 0.0,
    lo: int = 1,
    hi: int = 10,
) -> EndpointSnapshot:
    """An endpoint of `len(kv)` serving instances at these KV fractions, `coming` more on
    their way; `interactive` each one's running interactive requests (None: not observed)."""
    running = interactive if interactive is not None else [None] * len(kv)
    views = tuple(
        InstanceView(f"i{n}", "h100", used * 100, 100.0, interactive_running=r)
        for n, (used, r) in enumerate(zip(kv, running, strict=True))
    )
    return EndpointSnapshot(
        key=KEY,
        min_instances=lo,
        max_instances=hi,
        replicas={"h100": len(kv) + coming},
        serving=len(kv),
        instances=views,
        waiting=waiting,
        variants=("h100",),
        ttft_p95_s={"iw-f": ttft_p95} if ttft_p95 is not None else {},
        ttft_samples={"iw-f": 100} if ttft_p95 is not None else {},
        ttft_slo_s={"iw-f": 1.0},
        batch_need_tps=need,
        batch_capacity_tps=capacity,
    )


def kind(ep: EndpointSnapshot, strategy, state: StepState | None = None, t: float = 100.0):
    out = decide(t, Snapshot(t, {KEY: ep}), None, state or StepState(), strategy)
    return out.decisions[0].kind if out.decisions else None


OUT, IN = ActionKind.SCALE_OUT, ActionKind.SCALE_IN


@pytest.mark.parametrize(
    ("ep", "paper", "ours"),
    [
        # the 70/30 band on EMU: both agree
        (endpoint([0.8, 0.8]), OUT, OUT),
        (endpoint([0.5, 0.5]), None, None),
        (endpoint([0.1, 0.1]), IN, IN),
        # 1. capacity on its way: ours counts it (EMU 80 % x 2/3 = 53 %), the paper does not
        (endpoint([0.8, 0.8], coming=1), OUT, None),
        # 2. ours waits for an instance coming up before it scales in; the paper does not
        (endpoint([0.1, 0.1], coming=1), IN, None),
        # 3. queue signals: a backlog of 20 per instance, a TTFT P95 at 3x its SLO, a batch
        #    deadline need at twice the batch capacity scale ours out; the paper reads EMU
        (endpoint([0.2, 0.2], waiting=40), IN, OUT),
        (endpoint([0.2, 0.2], ttft_p95=3.0), IN, OUT),
        (endpoint([0.2, 0.2], need=200.0, capacity=100.0), IN, OUT),
        # the ceiling and the floor are every strategy's
        (endpoint([0.9, 0.9], hi=2), None, None),
        (endpoint([0.1], lo=1), None, None),
    ],
)
def test_reactive_paper_is_the_70_30_rule_on_emu_alone(
    ep: EndpointSnapshot, paper: ActionKind | None, ours: ActionKind | None
) -> None:
    assert kind(ep, PAPER) is paper
    assert kind(ep, REACTIVE) is ours


def test_reactive_paper_scales_in_after_a_queue_without_the_stabilization_hold() -> None:
    """4. after a backlog at its level, ours keeps the instances for the stabilization
    window; the paper scales in as soon as EMU is under 30 % and the cooldown is over."""
    busy = endpoint([0.2, 0.2], waiting=40)
    quiet = endpoint([0.1, 0.1])
    for strategy, want in ((PAPER, IN), (REACTIVE, None)):
        first = decide(0.0, Snapshot(0.0, {KEY: busy}), None, StepState(), strategy)
        later = 60.0
        assert later < SCALE_IN_STABILIZATION_S
        assert kind(quiet, strategy, first.state, t=later) is want


def test_reactive_paper_keeps_its_15_s_cooldown() -> None:
    first = decide(0.0, Snapshot(0.0, {KEY: endpoint([0.8, 0.8])}), None, StepState(), PAPER)
    assert first.decisions
    assert kind(endpoint([0.9, 0.9]), PAPER, first.state, t=10.0) is None
    assert kind(endpoint([0.9, 0.9]), PAPER, first.state, t=15.0) is OUT


@pytest.mark.parametrize(
    ("ep", "want"),
    [
        # ibp = instances running an interactive request / instances reporting it
        (endpoint([0.1] * 5, interactive=[1, 2, 1, 3, 0]), OUT),  # 80 % > 60 %
        (endpoint([0.1] * 5, interactive=[1, 2, 1, 0, 0]), IN),  # 60 %: not above
        (endpoint([0.9] * 5, interactive=[0, 0, 0, 0, 0]), IN),  # EMU is not Chiron's signal
        (endpoint([0.1] * 5, interactive=[1, 1, 1, 1, 0], hi=5), None),  # at the ceiling
        (endpoint([0.1] * 2, interactive=[0, 0], lo=2), None),  # at the floor
        # no instance reports the count: nothing known, nothing done
        (endpoint([0.1] * 3), None),
        # batch: the need over the batch capacity (pending time over the deadlines) grows it
        (endpoint([0.1] * 4, interactive=[0] * 4, need=150.0, capacity=100.0), OUT),
        # with interactive work idle, a scale-in goes ahead while one instance fewer still
        # meets the need (75 of 100 tok/s with 4: 3 give 75) ...
        (endpoint([0.1] * 4, interactive=[0] * 4, need=75.0, capacity=100.0), IN),
        # ... and holds when one fewer would miss it
        (endpoint([0.1] * 4, interactive=[0] * 4, need=80.0, capacity=100.0), None),
        # the queue-side signals of the step are not Chiron's
        (endpoint([0.1] * 4, interactive=[0] * 4, waiting=100), IN),
    ],
)
def test_chiron_scales_on_interactive_backpressure_and_batch_pending_time(
    ep: EndpointSnapshot, want: ActionKind | None
) -> None:
    assert kind(ep, CHIRON) is want


def test_chirons_threshold_comes_from_the_policy() -> None:
    ep = endpoint([0.1] * 4, interactive=[1, 1, 0, 0])  # ibp 50 %
    assert kind(ep, CHIRON) is IN  # Θ = 0.6 by default (SageServe v3 §7.1)
    spec = ScalingPolicySpec.model_validate(
        {"strategy": "chiron", "chiron": {"interactiveBusyAbove": 0.4}}
    )
    assert kind(ep, strategy_for(spec)) is OUT


def test_the_literal_baselines_run_in_the_operator() -> None:
    from sageserve.pace.base import simulation_only

    assert simulation_only(PAPER) is None
    assert simulation_only(CHIRON) is None
    assert CHIRON.uses_interactive_busy and not PAPER.uses_interactive_busy
