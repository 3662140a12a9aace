"""Build the pacing strategy a ScalingPolicy asks for, with its thresholds and windows.

One mapping from the CRD's fields to the strategy parameters, used by the operator and
the simulator alike, so a policy means the same thing in both worlds.
"""

from __future__ import annotations

from typing import Any

from sageserve.api.scaling_policy import ScalingPolicySpec
from sageserve.pace.base import PacingStrategy, make_strategy


def strategy_params(spec: ScalingPolicySpec) -> dict[str, Any]:
    """The parameters every registered strategy reads, from a ScalingPolicy spec."""
    return {
        "scale_out_above": spec.thresholds.scale_out_emu,
        "scale_in_below": spec.thresholds.scale_in_emu,
        "cooldown_s": float(spec.intervals.cooldown_seconds),
        "plan_interval_s": float(spec.intervals.plan_seconds),
        "gap_window_s": float(spec.forecast_gap.window_seconds),
        "gap_scale_up_ratio": spec.forecast_gap.scale_up_ratio,
        "gap_scale_down_ratio": spec.forecast_gap.scale_down_ratio,
        "overload_emu": spec.forecast_gap.overload_emu,
        "interactive_share": 1.0 - spec.siloed.batch_instance_fraction,
        "interactive_busy_above": spec.chiron.interactive_busy_above,
        "window_s": float(spec.preserve.window_seconds),
        "lookahead": spec.preserve.lookahead_iterations,
        "overload_kv": spec.preserve.overload_kv_usage,
        "overload_share": spec.preserve.overload_iteration_share,
        "scale_down_kv": spec.preserve.scale_down_kv_usage,
        "queue_pressure": spec.preserve.queue_pressure,
    }


def strategy_for(spec: ScalingPolicySpec) -> PacingStrategy:
    """The strategy named by `spec.strategy`, configured from the rest of the spec."""
    return make_strategy(spec.strategy.value, strategy_params(spec))
