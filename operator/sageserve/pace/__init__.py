"""Pacing strategies: turn hourly plan targets and per-tick observations into scaling actions.

Strategies sit behind one small interface (`PacingStrategy`) and are chosen by name through
`make_strategy`, like cluster-autoscaler's expanders: `reactive` (unified 70/30) and
`siloed` are here; LT-I / LT-U / LT-UA register themselves the same way.
"""

from sageserve.pace.base import (
    PacingStrategy,
    PoolLayout,
    available_strategies,
    make_strategy,
    register_strategy,
)
from sageserve.pace.reactive import ReactiveParams, SiloedReactive, UnifiedReactive

__all__ = [
    "PacingStrategy",
    "PoolLayout",
    "ReactiveParams",
    "SiloedReactive",
    "UnifiedReactive",
    "available_strategies",
    "make_strategy",
    "register_strategy",
]
