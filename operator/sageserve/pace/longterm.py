"""SageServe's long-term strategies LT-I, LT-U and LT-UA (SageServe §6.4).

All three take the hourly ILP target per endpoint (the plan in force) and differ in *when* they
move toward it:

- LT-I (`lt-immediate`): the whole difference at once, at the plan.
- LT-U (`lt-utilization`): one instance at a time, out only while EMU > 70 %, in only while
  EMU < 30 %, never past the target (so a burst beyond the forecast is not followed).
- LT-UA (`lt-utilization-arima`): LT-U, and in the last 20 minutes of the plan interval,
  once the target is reached, it follows *traffic* instead of memory: observed tokens/s
  ≥ 5× the forecast keeps scaling out, ≤ 0.5× keeps scaling in. Above `overload_emu`
  (90 %) it scales out past the target at any time (the reference code's valve).

Ambiguities settled here (the paper says "continue scaling" without a stopping rule, the
public code scales out on every check while the ratio holds): LT-UA moves toward the
instances the *observed* traffic needs, ⌈observed ÷ θ⌉ with θ the tokens/s one planned
instance serves (`instance_tps`, from the plan), one step per cooldown, within the
endpoint's min/max. Not ⌈target × observed / forecast⌉: a target held at `minInstances`
is not proportional to its forecast, so "5× a forecast of almost nothing" would have asked
for 5× the floor while the floor alone serves it (that rule, kept as the fallback when no θ
is known, cost 19 of LT-UA's 86 provisioning GPU-hours on `scenarios/peak-day`). A traffic
step out also needs EMU above the scale-in threshold and a step in EMU below the scale-out
threshold, so minute-to-minute noise on a quiet endpoint does not flap it. Instances still
provisioning count toward the target, as in the reactive baselines, so a plan is never
executed twice while nodes come up.

"Utilisation" throughout is the largest of EMU and the queue-side pressure
(`pace.pressure.load`: backlog per instance, TTFT over the tier's SLO), so the valve also
opens for a queue that grows while the KV cache stays low.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from sageserve.core.snapshot import EndpointPlan
from sageserve.core.types import ActionKind, EndpointObservation, ScalingAction
from sageserve.pace.base import PlanCadence, PlanSource, PoolLayout, register_strategy
from sageserve.pace.pressure import load, load_reason


@dataclass(frozen=True)
class LongTermParams:
    """Thresholds and windows of the LT strategies (paper defaults)."""

    scale_out_above: float = 0.70
    scale_in_below: float = 0.30
    cooldown_s: float = 15.0
    plan_interval_s: float = 3600.0
    gap_window_s: float = 1200.0
    gap_scale_up_ratio: float = 5.0
    gap_scale_down_ratio: float = 0.5
    overload_emu: float = 0.9

    @classmethod
    def from_mapping(cls, raw: Mapping[str, Any]) -> LongTermParams:
        known = {k: float(raw[k]) for k in cls.__dataclass_fields__ if k in raw}
        return cls(**known)


def clamp(value: int, obs: EndpointObservation) -> int:
    """`value` within the endpoint's [min, max] instance bounds."""
    return max(obs.min_instances, min(obs.max_instances, value))


def immediate_step(obs: EndpointObservation, target: int) -> ScalingAction | None:
    """LT-I: the whole way to the target in one action."""
    goal = clamp(target, obs)
    if goal > obs.active:
        count = goal - obs.active
        return ScalingAction(ActionKind.SCALE_OUT, obs.key, count, f"LT-I: target {goal}")
    if goal < obs.active and obs.serving > 0:
        count = min(obs.active - goal, obs.serving)
        return ScalingAction(ActionKind.SCALE_IN, obs.key, count, f"LT-I: target {goal}")
    return None


def utilization_step(
    obs: EndpointObservation, target: int, p: LongTermParams
) -> ScalingAction | None:
    """LT-U: one step toward the target, only when utilisation asks for it."""
    goal = clamp(target, obs)
    used = load(obs, p.scale_out_above)
    if goal > obs.active and used > p.scale_out_above:
        why = load_reason(obs, p.scale_out_above)
        reason = f"LT-U: {why} > {p.scale_out_above:.0%}, target {goal}"
        return ScalingAction(ActionKind.SCALE_OUT, obs.key, 1, reason)
    if goal < obs.active and used < p.scale_in_below and obs.provisioning == 0:
        reason = f"LT-U: EMU {obs.emu:.0%} < {p.scale_in_below:.0%}, target {goal}"
        return ScalingAction(ActionKind.SCALE_IN, obs.key, 1, reason)
    return None


def forecast_gap_step(
    obs: EndpointObservation,
    target: int,
    forecast_tps: float,
    p: LongTermParams,
    instance_tps: float | None = None,
) -> ScalingAction | None:
    """LT-UA's traffic-based step, for use in the last minutes of a plan interval.

    Only once the ILP target is reached in the direction of the gap: observed load far
    above the forecast keeps scaling out, far below keeps scaling in, toward the instances
    the observed load needs at `instance_tps` each (see the module doc).
    """
    if forecast_tps <= 0:
        return None
    ratio = obs.tokens_per_s / forecast_tps
    used = load(obs, p.scale_out_above)
    if instance_tps and instance_tps > 0:
        needed = math.ceil(obs.tokens_per_s / instance_tps - 1e-9)
    else:
        needed = math.ceil(target * ratio)
    goal = clamp(needed, obs)
    if (
        ratio >= p.gap_scale_up_ratio
        and obs.active >= target
        and goal > obs.active
        and used > p.scale_in_below
    ):
        reason = f"LT-UA: observed {ratio:.1f}x forecast, target {goal}"
        return ScalingAction(ActionKind.SCALE_OUT, obs.key, 1, reason)
    if (
        ratio <= p.gap_scale_down_ratio
        and obs.active <= target
        and goal < obs.active
        and obs.provisioning == 0
        and used < p.scale_out_above
    ):
        reason = f"LT-UA: observed {ratio:.2f}x forecast, target {goal}"
        return ScalingAction(ActionKind.SCALE_IN, obs.key, 1, reason)
    return None


def overload_step(obs: EndpointObservation, target: int, p: LongTermParams) -> ScalingAction | None:
    """LT-UA's safety valve: past the target while EMU is above `overload_emu`.

    The paper's LT-U never passes the target, so a burst the forecast missed queues until
    the next plan; the reference code scales up anyway above 90 % utilisation. We keep that
    valve for LT-UA (the strategy meant to correct forecast misses), any time in the hour.
    """
    used = load(obs, p.scale_out_above)
    if obs.active >= target and used > p.overload_emu and obs.active < obs.max_instances:
        why = load_reason(obs, p.scale_out_above)
        reason = f"LT-UA: {why} > {p.overload_emu:.0%} at target {target}"
        return ScalingAction(ActionKind.SCALE_OUT, obs.key, 1, reason)
    return None


def in_gap_window(now: float, plan_time: float, p: LongTermParams) -> bool:
    """Whether `now` is in the last `gap_window_s` of the plan interval begun at `plan_time`."""
    return now - plan_time >= p.plan_interval_s - p.gap_window_s


@dataclass(frozen=True)
class LongTerm:
    """LT-I, LT-U or LT-UA, depending on `mode` ("immediate", "utilization", "arima")."""

    mode: str
    params: LongTermParams = field(default_factory=LongTermParams)
    name: str = "lt-utilization-arima"
    layout: PoolLayout = field(default_factory=PoolLayout)
    batch_via_queue_manager: bool = True
    uses_projection: bool = False
    queue_signals: bool = True
    uses_interactive_busy: bool = False

    @property
    def plan_cadence(self) -> PlanCadence:
        """The forecast + ILP cycle every `spec.intervals.planSeconds` (SageServe §5)."""
        return PlanCadence(PlanSource.CYCLE, self.params.plan_interval_s)

    @property
    def periodic(self) -> bool:
        """LT-I needs no arrivals: it acts on every pace period; the others on arrival."""
        return self.mode == "immediate"

    @property
    def cooldown_s(self) -> float:
        return self.params.cooldown_s

    def step(self, obs: EndpointObservation, plan: EndpointPlan | None) -> ScalingAction | None:
        """The action for one endpoint now, given its share of the plan in force."""
        if plan is None:
            return None  # no plan yet for this endpoint: hold
        target = plan.target
        if self.mode == "immediate":
            return immediate_step(obs, target)
        action = utilization_step(obs, target, self.params)
        if action is None and self.mode == "arima":
            action = overload_step(obs, target, self.params)
        if (
            action is None
            and self.mode == "arima"
            and in_gap_window(obs.time, plan.computed_at, self.params)
        ):
            action = forecast_gap_step(
                obs, target, plan.forecast_tps, self.params, plan.instance_tps
            )
        return action


_MODES = {
    "lt-immediate": "immediate",
    "lt-utilization": "utilization",
    "lt-utilization-arima": "arima",
}


def _factory(name: str) -> Any:
    def make(params: Mapping[str, Any]) -> LongTerm:
        return LongTerm(mode=_MODES[name], params=LongTermParams.from_mapping(params), name=name)

    return make


for _name in _MODES:
    register_strategy(_name)(_factory(_name))
