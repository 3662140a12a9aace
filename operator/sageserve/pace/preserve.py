"""PreServe's instance scaler (PreServe §4.3.2) as a pacing strategy, and the static baseline.

`preserve` follows the window plan (`plan.preserve`: N_{i+1} from the separate prompt and
decode forecasts of the next 10-minute window) and corrects it within the window from each
instance's *projected* KV usage (`dispatch.anticipator`), never from usage that has already
happened:

- **window boundary**: the first step after a new window plan moves the endpoint to its N
  at once (pre-starting instances for a rise, draining for a fall), as the paper's
  "pre-initialisation" at each window;
- **in-window scale-up**: +1 instance per instance projected above `overload_kv` (95 %) in
  more than `overload_share` (10 %) of its look-ahead iterations;
- **queue pressure** (`queue_pressure`, off by default: not the paper's): also +1 within
  the window when the decision step's queue pressure (`pace.pressure`) is at its level, for
  instances bound by prefill or decode time before their KV cache fills;
- **in-window scale-down**: only while every instance's projected peak is below
  `scale_down_kv` (T_f = 30 %), down to ⌈Σ peaks ÷ T_f⌉ instances, and at most once per
  window. The window's boundary move counts as that one scale-down when it shrinks the
  fleet (a shrink the forecast just asked for is not shrunk again by the same window).

Before the first window plan (no forecast yet: the paper's cold start, "default scaling
strategies can be employed") the strategy is the reactive 70/30 rule, and says so.

The per-window state (when the endpoint last scaled, and last scaled in) is the decision
step's (`pace.step.StepState`), passed in the observation, so this stays a pure rule of one
observation and the plan, the same in the operator and the simulator.

`static` is PreServe §5's static allocation: the plan's target (sized for the peak by the
executor's planner) applied once, then nothing.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sageserve.core.snapshot import EndpointPlan
from sageserve.core.types import ActionKind, EndpointObservation, ScalingAction
from sageserve.pace.base import PlanCadence, PlanSource, PoolLayout, register_strategy
from sageserve.pace.longterm import clamp, immediate_step
from sageserve.pace.reactive import ReactiveParams, reactive_decision


@dataclass(frozen=True)
class PreserveParams:
    """The scaler's window and thresholds (PreServe §4.1, §4.3.2: paper values)."""

    window_s: float = 600.0
    lookahead: int = 100
    overload_kv: float = 0.95
    overload_share: float = 0.10
    scale_down_kv: float = 0.30
    cooldown_s: float = 15.0
    #: the cold-start fallback's thresholds (reactive 70/30)
    scale_out_above: float = 0.70
    scale_in_below: float = 0.30
    #: also scale out within the window on the step's queue pressure (not in the paper)
    queue_pressure: bool = False

    @classmethod
    def from_mapping(cls, raw: Mapping[str, Any]) -> PreserveParams:
        known: dict[str, Any] = {}
        for k in cls.__dataclass_fields__:
            if k not in raw:
                continue
            if k == "lookahead":
                known[k] = int(raw[k])
            elif k == "queue_pressure":
                known[k] = bool(raw[k])
            else:
                known[k] = float(raw[k])
        return cls(**known)


def overloaded(projection: Sequence[float], level: float, share: float) -> bool:
    """PreServe §4.3.2's "potentially overloaded": usage above `level` in more than `share`
    of the projected iterations (`dispatch.anticipator.LoadAnticipator.overloaded` on a
    projection that has travelled through a snapshot)."""
    if not projection:
        return False
    above = sum(1 for u in projection if u > level)
    return above > share * len(projection)


def overloaded_count(
    projections: Sequence[Sequence[float]], level: float = 0.95, share: float = 0.10
) -> int:
    """How many instances are potentially overloaded: the in-window scale-up count."""
    return sum(1 for p in projections if overloaded(p, level, share))


def shrink_to(projections: Sequence[Sequence[float]], floor_kv: float = 0.30) -> int | None:
    """Instances the projected load needs when every instance's projected peak is below
    `floor_kv`: ⌈Σ peaks ÷ T_f⌉ (at least 1), PreServe §4.3.2's N_c − Σ max(U′)/T_f
    isolated; None when some instance reaches T_f (no scale-down) or nothing is projected."""
    if not projections or floor_kv <= 0:
        return None
    peaks = [max(p) if p else 0.0 for p in projections]
    if any(u >= floor_kv for u in peaks):
        return None
    return max(1, math.ceil(sum(peaks) / floor_kv - 1e-9))


def window_start_done(obs: EndpointObservation, plan: EndpointPlan) -> bool:
    """Whether the endpoint has scaled since the window plan in force was made (then the
    boundary move is done, or was not needed and an in-window rule has acted since)."""
    return obs.last_event_at is not None and obs.last_event_at >= plan.computed_at


def preserve_step(
    obs: EndpointObservation, plan: EndpointPlan | None, p: PreserveParams
) -> ScalingAction | None:
    """One endpoint's action under PreServe's scaler (see the module doc)."""
    if plan is None:
        kind = reactive_decision(
            obs, ReactiveParams(p.scale_out_above, p.scale_in_below, p.cooldown_s)
        )
        if kind is None:
            return None
        reason = f"PreServe: no window forecast yet, reactive EMU {obs.emu:.0%}"
        return ScalingAction(kind, obs.key, 1, reason)
    if not window_start_done(obs, plan):
        action = immediate_step(obs, plan.target)
        if action is not None:
            reason = f"PreServe: window target {clamp(plan.target, obs)}"
            return ScalingAction(action.kind, obs.key, action.count, reason)
    hot = overloaded_count(obs.projections, p.overload_kv, p.overload_share)
    if hot and obs.active < obs.max_instances:
        count = min(hot, obs.max_instances - obs.active)
        reason = (
            f"PreServe: {hot} instance(s) projected above {p.overload_kv:.0%} KV in more "
            f"than {p.overload_share:.0%} of {p.lookahead} iterations"
        )
        return ScalingAction(ActionKind.SCALE_OUT, obs.key, count, reason)
    if p.queue_pressure and obs.pressure >= 1.0 and obs.active < obs.max_instances:
        reason = f"PreServe + queue pressure: {obs.pressure_reason}"
        return ScalingAction(ActionKind.SCALE_OUT, obs.key, 1, reason)
    scaled_in_this_window = (
        obs.last_scale_in_at is not None and obs.last_scale_in_at >= plan.computed_at
    )
    if hot or scaled_in_this_window or obs.provisioning:
        return None
    # only the reporting instances are projected: partial data never scales in (the step)
    need = shrink_to(obs.projections, p.scale_down_kv)
    if need is None or len(obs.projections) < obs.serving:
        return None
    goal = max(obs.min_instances, need)
    if goal >= obs.serving:
        return None
    reason = (
        f"PreServe: every instance projected below {p.scale_down_kv:.0%} KV, "
        f"{goal} instance(s) carry the projected load"
    )
    return ScalingAction(ActionKind.SCALE_IN, obs.key, obs.serving - goal, reason)


@dataclass(frozen=True)
class Preserve:
    """PreServe §4.3.2's instance scaler on the window plan (`plan.preserve`)."""

    params: PreserveParams = field(default_factory=PreserveParams)
    name: str = "preserve"
    layout: PoolLayout = field(default_factory=PoolLayout)
    batch_via_queue_manager: bool = True
    #: in-window rules read projections, which change without arrivals: every pace period
    periodic: bool = True
    #: executors attach each instance's look-ahead projection to the snapshot
    uses_projection: bool = True
    queue_signals: bool = True
    uses_interactive_busy: bool = False

    @property
    def cooldown_s(self) -> float:
        return self.params.cooldown_s

    @property
    def plan_cadence(self) -> PlanCadence:
        """The window: executors plan (forecast + N) once per window, not hourly."""
        return PlanCadence(PlanSource.WINDOW, self.params.window_s)

    def step(self, obs: EndpointObservation, plan: EndpointPlan | None) -> ScalingAction | None:
        return preserve_step(obs, plan, self.params)


#: `static`'s fleet is sized from the whole window's peak, known from the start (no history
#: needed), and re-asserted every minute, so an instance lost to a fault is replaced within one.
STATIC_CADENCE = PlanCadence(PlanSource.PEAK, 60.0, needs_history=False)


@dataclass(frozen=True)
class Static:
    """A fixed fleet: the plan's target once (sized for the peak by the planner), then
    nothing (PreServe §5's "Static"). Without a plan, nothing moves."""

    cooldown_s: float = 15.0
    name: str = "static"
    layout: PoolLayout = field(default_factory=PoolLayout)
    batch_via_queue_manager: bool = True
    plan_cadence: PlanCadence = STATIC_CADENCE
    uses_projection: bool = False
    queue_signals: bool = True
    uses_interactive_busy: bool = False
    periodic: bool = True

    def step(self, obs: EndpointObservation, plan: EndpointPlan | None) -> ScalingAction | None:
        if plan is None or window_start_done(obs, plan):
            return None
        action = immediate_step(obs, plan.target)
        if action is None:
            return None
        reason = f"static: {clamp(plan.target, obs)} instance(s) for the peak"
        return ScalingAction(action.kind, obs.key, action.count, reason)


@register_strategy("preserve")
def _make_preserve(params: Mapping[str, Any]) -> Preserve:
    return Preserve(PreserveParams.from_mapping(params))


@register_strategy("static")
def _make_static(params: Mapping[str, Any]) -> Static:
    return Static(cooldown_s=float(params.get("cooldown_s", 15.0)))


__all__ = [
    "Preserve",
    "PreserveParams",
    "Static",
    "overloaded",
    "overloaded_count",
    "preserve_step",
    "shrink_to",
]
