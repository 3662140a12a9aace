"""A ScalingPolicy's fields reach the strategy it names."""

from __future__ import annotations

import pytest

from sageserve.api.scaling_policy import ScalingPolicySpec, Strategy
from sageserve.pace import ReactiveParams, SiloedReactive, UnifiedReactive
from sageserve.pace.from_policy import strategy_for
from sageserve.pace.longterm import LongTerm


@pytest.mark.parametrize("strategy", list(Strategy))
def test_every_strategy_of_the_crd_can_be_built(strategy: Strategy) -> None:
    built = strategy_for(ScalingPolicySpec(strategy=strategy))
    assert built.name == strategy.value


def test_thresholds_cooldown_and_windows_come_from_the_policy() -> None:
    spec = ScalingPolicySpec.model_validate(
        {
            "strategy": "lt-utilization-arima",
            "thresholds": {"scaleOutEmu": 0.8, "scaleInEmu": 0.2},
            "intervals": {"cooldownSeconds": 30, "planSeconds": 1800},
            "forecast": {"horizonSeconds": 1800},
            "forecastGap": {"windowSeconds": 600, "scaleUpRatio": 3},
        }
    )
    lt = strategy_for(spec)
    assert isinstance(lt, LongTerm)
    p = lt.params
    assert (p.scale_out_above, p.scale_in_below, p.cooldown_s) == (0.8, 0.2, 30.0)
    assert (p.plan_interval_s, p.gap_window_s, p.gap_scale_up_ratio) == (1800.0, 600.0, 3.0)
    reactive = strategy_for(spec.model_copy(update={"strategy": Strategy.REACTIVE}))
    assert isinstance(reactive, UnifiedReactive)
    assert reactive.params == ReactiveParams(0.8, 0.2, 30.0)


def test_siloed_split_follows_the_batch_fraction() -> None:
    spec = ScalingPolicySpec.model_validate(
        {"strategy": "siloed", "siloed": {"batchInstanceFraction": 0.25}}
    )
    siloed = strategy_for(spec)
    assert isinstance(siloed, SiloedReactive)
    assert siloed.layout.split(20) == {"interactive": 15, "batch": 5}
