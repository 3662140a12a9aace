"""The strategy interface and the registry of strategies by name.

Why this shape: SageServe's strategies (§6.4) differ only in *when* they move the fleet toward
a target. LT-I/U/UA read the hourly plan's target for the endpoint; the baselines ignore it.
Each is a stateless rule from one endpoint observation to an action; `pace.step.decide`
calls it for every endpoint it observes and owns what is shared (cooldowns, plan adoption,
hold rules, the split over variants). A strategy also declares
its pool layout (unified or siloed) and whether batch work goes through the Queue Manager,
because the siloed baseline is defined by exactly that, and what every world needs to drive
it: which plan it follows and how often (`PlanCadence`, stepped by `pace.cadence`), and
whether its observations carry the routers' look-ahead projections. Nothing a world asks of
a strategy is read by name or by `getattr`; `register_strategy` refuses a strategy that
lacks a member of the interface.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, is_dataclass, replace
from enum import StrEnum
from typing import Any, Protocol, runtime_checkable

from sageserve.core.snapshot import EndpointPlan
from sageserve.core.types import (
    POOL_BATCH,
    POOL_INTERACTIVE,
    POOL_UNIFIED,
    EndpointObservation,
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


class PlanSource(StrEnum):
    """Which plan a strategy follows, so a world knows which planner to run for it."""

    #: none: the baselines ignore forecasts (reactive, siloed)
    NONE = "none"
    #: the forecast + ILP cycle every `spec.intervals.planSeconds` (SageServe §5)
    CYCLE = "cycle"
    #: PreServe's window plan, once per `spec.preserve.windowSeconds` (PreServe §4.1, Alg. 2)
    WINDOW = "window"
    #: a fleet sized once for the window's peak (PreServe §5's static baseline)
    PEAK = "peak"


@dataclass(frozen=True)
class PlanCadence:
    """Which plan a strategy follows and how often it is made (`pace.cadence.plan_step`)."""

    source: PlanSource = PlanSource.NONE
    #: seconds between two plans
    interval_s: float = 3600.0
    #: whether the first plan waits for load history (a forecast needs some; a peak-sized
    #: fleet is known from the start): without history it comes one interval in
    needs_history: bool = True

    @property
    def plans(self) -> bool:
        """Whether any plan is made for the strategy (executors run no planner otherwise)."""
        return self.source is not PlanSource.NONE


#: A strategy that follows no plan.
NO_PLAN = PlanCadence()


@runtime_checkable
class PacingStrategy(Protocol):
    """What the decision step calls: a stateless, deterministic rule for one endpoint.

    Cooldowns, the plan in force and the hold rules live in `pace.step.decide`, so that a
    strategy is a pure function of one observation and the endpoint's share of the plan,
    whichever world calls it.
    """

    @property
    def name(self) -> str: ...

    @property
    def layout(self) -> PoolLayout: ...

    @property
    def batch_via_queue_manager(self) -> bool:
        """True: batch requests wait in the Queue Manager; False: routed like interactive."""
        ...

    @property
    def plan_cadence(self) -> PlanCadence:
        """Which plan the strategy follows and how often (no plan for the baselines)."""
        ...

    @property
    def uses_projection(self) -> bool:
        """Whether each instance's look-ahead KV projection (the routers' PreServe §4.2
        anticipator) must be attached to its observation."""
        ...

    @property
    def queue_signals(self) -> bool:
        """Whether the decision step adds the queue-side signals to EMU (`pace.pressure`:
        backlog, TTFT over the SLO, batch deadline need) and holds scale-in after them; off
        for the literal baselines, which read only their own signals."""
        ...

    @property
    def uses_interactive_busy(self) -> bool:
        """Whether each instance's count of running interactive requests must be observed
        (Chiron's interactive backpressure, `pace.chiron`)."""
        ...

    @property
    def periodic(self) -> bool:
        """Whether every endpoint is evaluated each pace period (LT-I), not only when a
        request reaches it (the paper's rule for the others; the operator samples every
        period anyway)."""
        ...

    @property
    def cooldown_s(self) -> float:
        """Minimum seconds between two scaling events of one endpoint (SageServe: 15 s)."""
        ...

    def step(self, obs: EndpointObservation, plan: EndpointPlan | None) -> ScalingAction | None:
        """The action for endpoint `obs.key` now (often none)."""
        ...


def sizes_pools(strategy: PacingStrategy) -> bool:
    """Whether the plan `strategy` follows sizes ModelPools: only the hourly cycle forecasts
    each pooled model's request rate and puts the pool into the ILP (Aegaeon §3,
    `plan.pool_cycle`); under any other plan a pool keeps its size."""
    return strategy.plan_cadence.source is PlanSource.CYCLE


def simulation_only(strategy: PacingStrategy) -> str | None:
    """Why the operator cannot run `strategy` (None when it can), read off what the strategy
    declares: separate interactive and batch pools (the operator runs one pool per model
    and region), or a fleet sized for a whole trace's peak (only a simulation knows the
    trace in advance). Both are baselines for `sageserve simulate`."""
    if strategy.layout.siloed:
        return (
            "needs separate interactive and batch pod sets; it is a simulation baseline "
            "(sageserve simulate), the operator runs unified pools"
        )
    if strategy.plan_cadence.source is PlanSource.PEAK:
        return (
            "sizes a fleet from a whole trace's peak; it is a simulation baseline (sageserve "
            "simulate), pin minInstances = maxInstances for a fixed fleet"
        )
    return None


StrategyFactory = Callable[[Mapping[str, Any]], PacingStrategy]
_REGISTRY: dict[str, StrategyFactory] = {}


#: What every world may ask of a strategy: the members `PacingStrategy` declares.
INTERFACE = tuple(sorted(n for n in vars(PacingStrategy) if not n.startswith("_")))


def missing_members(strategy: object) -> list[str]:
    """The members of `PacingStrategy` that `strategy` lacks (none for a complete one)."""
    return [m for m in INTERFACE if not hasattr(strategy, m)]


def register_strategy(name: str) -> Callable[[StrategyFactory], StrategyFactory]:
    """Decorator: make a strategy constructible by `make_strategy(name, params)`.

    The factory is called once with no parameters and its strategy checked against the
    interface, so a strategy that lacks a capability fails where it is registered, naming
    the members, not in the middle of a simulation or a pace pass."""

    def deco(factory: StrategyFactory) -> StrategyFactory:
        missing = missing_members(factory({}))
        if missing:
            raise TypeError(
                f"strategy {name!r} lacks {', '.join(missing)} of the PacingStrategy "
                "interface (pace/base.py); declare them on its class"
            )
        _REGISTRY[name] = factory
        return factory

    return deco


#: The paper's short names, accepted wherever a strategy is named (`simulate --policy`).
ALIASES = {"lt-i": "lt-immediate", "lt-u": "lt-utilization", "lt-ua": "lt-utilization-arima"}


def make_strategy(name: str, params: Mapping[str, Any] | None = None) -> PacingStrategy:
    """Build the strategy registered under `name` (or its short alias) with `params`."""
    # importing the built-ins registers them
    from sageserve.pace import chiron, longterm, preserve, reactive  # noqa: F401

    try:
        factory = _REGISTRY[ALIASES.get(name, name)]
    except KeyError:
        raise KeyError(
            f"unknown scaling strategy {name!r}; available: {', '.join(available_strategies())}"
        ) from None
    strategy = factory(params or {})
    if name in ALIASES and is_dataclass(strategy):
        strategy = replace(strategy, name=name)  # reports keep the name the user gave
    return strategy


def available_strategies() -> list[str]:
    from sageserve.pace import chiron, longterm, preserve, reactive  # noqa: F401

    return sorted(_REGISTRY)
