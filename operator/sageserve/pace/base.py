"""The strategy interface and the registry of strategies by name.

Why this shape: SageServe's strategies differ only in *when* they move the fleet toward a
target. LT-I/U/UA get hourly targets from the planner (`on_plan`) and react to per-endpoint
load (`on_arrival`, evaluated when a request reaches an endpoint, as the paper does) or to
a periodic global view (`on_tick`). Baselines ignore the targets. A strategy also declares
its pool layout (unified or siloed) and whether batch work goes through the Queue Manager,
because the siloed baseline is defined by exactly that.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from sageserve.core.types import (
    POOL_BATCH,
    POOL_INTERACTIVE,
    POOL_UNIFIED,
    EndpointKey,
    EndpointObservation,
    Observation,
    ScalingAction,
    Tier,
)


@dataclass(frozen=True)
class PoolLayout:
    """How a (model, region) fleet is split into pools.

    Unified: one pool serves every tier. Siloed: an interactive and a batch pool, each
    scaled on its own; SageServe's motivation experiment starts them at 16 + 4 of 20
    (`interactive_share` = 0.8) and each keeps its own minimum (2 + 2 in the paper).
    """

    siloed: bool = False
    interactive_share: float = 0.8

    def pools(self) -> tuple[str, ...]:
        return (POOL_INTERACTIVE, POOL_BATCH) if self.siloed else (POOL_UNIFIED,)

    def pool_for(self, tier: Tier) -> str:
        if not self.siloed:
            return POOL_UNIFIED
        return POOL_INTERACTIVE if tier.interactive else POOL_BATCH

    def split(self, total: int) -> dict[str, int]:
        """Initial instances per pool out of `total` (each siloed pool gets at least 1)."""
        if not self.siloed:
            return {POOL_UNIFIED: total}
        inter = max(1, round(total * self.interactive_share))
        batch = max(1, total - inter)
        return {POOL_INTERACTIVE: inter, POOL_BATCH: batch}


@runtime_checkable
class PacingStrategy(Protocol):
    """What the simulator and the operator call. Implementations must be deterministic."""

    name: str
    layout: PoolLayout
    #: True: batch requests wait in the Queue Manager; False: routed like interactive ones.
    batch_via_queue_manager: bool

    def on_plan(
        self,
        now: float,
        targets: Mapping[EndpointKey, int],
        forecasts: Mapping[EndpointKey, float] | None = None,
        instance_tps: Mapping[EndpointKey, float] | None = None,
    ) -> None:
        """New hourly targets (instances per endpoint), the forecast tokens/s they serve and
        the tokens/s one planned instance of each endpoint serves (θ)."""
        ...

    def on_arrival(self, obs: EndpointObservation) -> list[ScalingAction]:
        """A request reached endpoint `obs.key`; return actions (often none)."""
        ...

    def on_tick(self, obs: Observation) -> list[ScalingAction]:
        """Periodic global view (every pace interval); return actions."""
        ...


StrategyFactory = Callable[[Mapping[str, Any]], PacingStrategy]
_REGISTRY: dict[str, StrategyFactory] = {}


def register_strategy(name: str) -> Callable[[StrategyFactory], StrategyFactory]:
    """Decorator: make a strategy constructible by `make_strategy(name, params)`."""

    def deco(factory: StrategyFactory) -> StrategyFactory:
        _REGISTRY[name] = factory
        return factory

    return deco


def make_strategy(name: str, params: Mapping[str, Any] | None = None) -> PacingStrategy:
    """Build the strategy registered under `name` with `params` (thresholds, cooldown...)."""
    # importing the built-ins registers them
    from sageserve.pace import longterm, reactive  # noqa: F401

    try:
        factory = _REGISTRY[name]
    except KeyError:
        raise KeyError(
            f"unknown scaling strategy {name!r}; available: {', '.join(available_strategies())}"
        ) from None
    return factory(params or {})


def available_strategies() -> list[str]:
    from sageserve.pace import longterm, reactive  # noqa: F401

    return sorted(_REGISTRY)
