"""One planning cycle: forecast every (model, region), solve the ILP, derive the targets.

The hourly step of SageServe (SageServe §5, §6.3), as one pure function of its inputs so the
operator's plan loop and the simulator run exactly the same decision:

    ρ(m, r) = provisioned forecast of the next-hour peak + max(β, need(m, r))

per forecast step of the planned hour (the path scaled to that peak), so that C2 covers the
peak of the model's summed demand rather than the sum of its regional peaks. β is 10 % of
the last hour's batch load (§6.3); need(m, r) is region r's share of the tokens/s model m's
batch queue needs to meet every deadline (`plan.batch_demand`: why the larger of the two,
and how a model's need is split over its regions).

LT-UA compares observed tokens/s with what the forecast expects *at that time*, not with the
provisioned peak: `expected_tps` is the point forecast averaged over the gap window (the
last `forecastGap.windowSeconds` of the plan interval) plus the last hour's whole batch rate,
since observed traffic at an endpoint is interactive and batch together. Comparing with the
hour's peak + β would read every off-peak minute as "observed ≤ 0.5× forecast".

A (model, region) with no usable observation at all is *held*: its demand is set to what
its current instances serve, so the plan neither grows nor shrinks it on no information;
only a share of the queue's deadline need above that grows it (the need is information).

A region whose cluster cannot be reached (`plan.member_clusters`) is held harder: it is left
out of the ILP altogether and keeps the instances it has, so no other region's demand is
planned onto GPUs nobody can reach, and nothing there moves until its cluster answers.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

import numpy as np

from sageserve.api.model_deployment import ModelDeployment
from sageserve.api.model_pool import ModelPool
from sageserve.api.scaling_policy import ScalingPolicySpec
from sageserve.core.snapshot import Plan, PlanSolve
from sageserve.core.types import EndpointKey
from sageserve.forecast.api import batch_buffer_tps, forecast_peak
from sageserve.forecast.realised import (
    REALISED,
    REALISED_ONLY_IN_SIMULATION,
    realised_forecast,
)
from sageserve.forecast.types import Forecast, ForecastSpec
from sageserve.plan.batch_demand import batch_demand_tps, split_need
from sageserve.plan.fleet import (
    VariantCounts,
    build_problem,
    endpoint_targets,
    planned_variants,
    variant_targets,
)
from sageserve.plan.flow import spillover
from sageserve.plan.ilp import PlanOptions, solve_plan
from sageserve.plan.learned_capacity import ThetaTable, theta_of
from sageserve.plan.pool_cycle import PoolRates, PoolTarget, add_pools, granted, size_pools
from sageserve.plan.result import PlanResult

#: (model deployment, region) → a series or a value.
PerEndpoint = Mapping[tuple[str, str], Sequence[float]]


@dataclass(frozen=True)
class PlanCycle:
    """What one cycle decided, with everything the status and the strategies need."""

    forecasts: dict[tuple[str, str], Forecast]
    batch_buffer_tps: dict[tuple[str, str], float]
    demand_tps: dict[tuple[str, str], float]
    expected_tps: dict[tuple[str, str], float]
    result: PlanResult
    targets: VariantCounts
    endpoint_targets: dict[EndpointKey, int]
    #: tokens/s one planned instance of each endpoint serves (θ, averaged over its variants)
    instance_tps: dict[EndpointKey, float]
    #: per model: share of each home region's demand planned to be served elsewhere
    spill: dict[str, dict[str, dict[str, float]]]
    #: each ModelPool's pods per region, sized from its models' forecast rates (Aegaeon)
    pools: tuple[PoolTarget, ...] = ()
    #: each (model, region)'s share of its model's batch deadline need, tokens/s (0: none);
    #: the batch part of `demand_tps` is max(β, this) (`plan.batch_demand`)
    batch_need_tps: dict[tuple[str, str], float] = field(default_factory=dict)
    #: regions held out of this cycle because their cluster is silent (`plan.member_clusters`)
    held_regions: frozenset[str] = frozenset()

    def in_force(self, computed_at: float) -> Plan:
        """This cycle as the plan the decision step follows (targets per variant)."""
        return Plan(
            computed_at,
            {(EndpointKey(m, r), v): n for (m, r, v), n in self.targets.items()},
            self.forecast_tps,
            self.instance_tps,
            self.spill,
            solve=PlanSolve(
                self.result.status,
                self.result.solve_seconds,
                self.result.mip_gap,
                self.held_regions,
            ),
        )

    @property
    def forecast_tps(self) -> dict[EndpointKey, float]:
        """Expected load per endpoint in the gap window, which LT-UA compares observed load
        against."""
        return {EndpointKey(m, r): v for (m, r), v in self.expected_tps.items()}


def forecast_spec(policy: ScalingPolicySpec) -> ForecastSpec:
    """The forecaster's settings from a ScalingPolicy's `spec.forecast`."""
    f = policy.forecast
    return ForecastSpec(
        step_seconds=float(f.granularity_seconds),
        lead_seconds=float(f.lead_seconds),
        horizon_seconds=float(f.horizon_seconds),
        quantile=f.quantile,
        min_history_seconds=float(f.training_window_seconds),
        arima_order=(f.order.p, f.order.d, f.order.q) if f.order else None,
    )


#: a series key: (model, region), or a pooled model's name
K = TypeVar("K")


def training_points(policy: ScalingPolicySpec) -> int:
    """How many steps of history the plan's forecaster is given: `trainingWindowSeconds` at
    `granularitySeconds` (SageServe §4.2: 60 steps of 1 min), as the operator's plan loop
    asks Prometheus for them."""
    f = policy.forecast
    return max(1, int(f.training_window_seconds // f.granularity_seconds))


def history_at_policy_step(
    policy: ScalingPolicySpec, per_minute: Mapping[K, Sequence[float]]
) -> dict[K, list[float]]:
    """A world that counts tokens/s per minute (the simulator) gives the forecaster what the
    operator reads from Prometheus: the policy's step (`rate` over max(step, 1 min) sampled
    every step: a step of k minutes is the mean of its k minutes, counted back from now; a
    step under a minute repeats the minute's rate), the last `training_points` of it.

    Why here: the forecast depends on how much history it is fitted on; a simulator that
    fitted on more than the policy declares would measure a forecast the operator never
    makes."""
    step = float(policy.forecast.granularity_seconds)
    keep = training_points(policy)
    out: dict[K, list[float]] = {}
    for key, values in per_minute.items():
        xs = list(values)
        if step >= 60.0:
            k = max(1, round(step / 60.0))
            xs = xs[len(xs) % k :]
            xs = [sum(xs[i : i + k]) / k for i in range(0, len(xs), k)]
        else:
            xs = [x for x in xs for _ in range(round(60.0 / step))]
        out[key] = xs[-keep:]
    return out


def plan_options(policy: ScalingPolicySpec) -> PlanOptions:
    """The solver's settings from a ScalingPolicy's `spec.optimizer`: the node limit is the
    deterministic budget, the time limit a safety stop."""
    o = policy.optimizer
    return PlanOptions(
        solver=o.solver.value,
        time_limit=o.time_limit_seconds,
        mip_gap=o.relative_gap,
        node_limit=o.node_limit,
    )


def expected_in_window(
    fc: Forecast, spec: ForecastSpec, window_start_s: float, window_end_s: float
) -> float:
    """Mean point forecast over [now + start, now + end] (the peak when there is no path)."""
    if not fc.path_tps:
        return fc.peak_tps
    first = int(window_start_s // spec.step_seconds)
    last = max(first + 1, int(np.ceil(window_end_s / spec.step_seconds - 1e-9)))
    window = fc.path_tps[first:last] or fc.path_tps[-1:]
    return float(np.mean(window))


def provisioned_path(fc: Forecast, spec: ForecastSpec, provisioned: float) -> list[float]:
    """The forecast path over the planned window [now + lead, now + horizon], scaled so that
    its peak is what is provisioned (the upper quantile of the peak).

    Why a path and not one number per region: C2 asks the model's capacity to cover the
    peak of the *summed* demand (SageServe §5); regions whose peaks fall at different times
    need less together than the sum of their peaks, which matters once ε < 1 lets them
    share capacity. With ε = 1 each region still covers its own peak (C1), unchanged.
    """
    times = [(i + 1) * spec.step_seconds for i in range(len(fc.path_tps))]
    window = [
        v
        for t, v in zip(times, fc.path_tps, strict=True)
        if spec.lead_seconds - 1e-9 <= t <= spec.horizon_seconds + 1e-9
    ]
    top = max(window, default=0.0)
    if top <= 0:
        return [provisioned]
    return [v * provisioned / top for v in window]


def run_plan_cycle(
    mds: Sequence[ModelDeployment],
    policy: ScalingPolicySpec,
    history_tps: PerEndpoint,
    batch_tps_last_hour: PerEndpoint,
    current: Mapping[tuple[str, str, str], int],
    gpu_capacity: Mapping[tuple[str, str], int] | None = None,
    batch_received: PerEndpoint | None = None,
    pools: Sequence[ModelPool] = (),
    pool_rates: PoolRates | None = None,
    pool_current: Mapping[tuple[str, str], int] | None = None,
    batch_need: Mapping[str, float] | None = None,
    capacity_tps: ThetaTable | None = None,
    realised_tps: PerEndpoint | None = None,
    held_regions: frozenset[str] = frozenset(),
) -> PlanCycle:
    """Forecast, plan and derive targets for `mds` under `policy`.

    `history_tps[(md, region)]` is the interactive tokens/s per `granularitySeconds` step
    ending now (NaN for gaps); `batch_tps_last_hour` the batch tokens/s served over the last
    hour; `batch_received` the batch tokens/s received (accepted into a queue) over the last
    hour, which β is taken from when given (it differs from what was served while a queue
    waits for the troughs). `pools` are sized from `pool_rates` (requests/s per pooled
    model and step) and enter the same ILP as GPU demand (`plan.pool_cycle`);
    `pool_current[(pool, region)]` are their pods now. `batch_need[model]` is the tokens/s
    the model's batch queue needs to meet every deadline (none when absent); each region
    plans for max(β, its share of it) as the batch part of ρ (`plan.batch_demand`).
    `capacity_tps[(model, variant, region)]` is a trusted learned θ (`plan.learned_capacity`)
    that replaces the variant's declared capacityTokensPerSecond in that region in the whole
    cycle.
    `realised_tps[(md, region)]` is the interactive tokens/s per step after now that did
    arrive, which only a simulation knows: the forecast of `spec.forecast.method: realised`
    (`forecast.realised`); that method without it is refused.
    `held_regions` are regions whose cluster is silent (`plan.member_clusters`): their
    endpoints keep `current` as their targets, are neither forecast nor planned, and give
    and take no spill-over.
    """
    every_md = mds
    mds = [m for m in (without_regions(md, held_regions) for md in mds) if m.spec.regions]
    spec = forecast_spec(policy)
    method, fallback = policy.forecast.method.value, policy.forecast.fallback.value
    if method == REALISED and realised_tps is None:
        raise ValueError(REALISED_ONLY_IN_SIMULATION)
    forecasts: dict[tuple[str, str], Forecast] = {}
    buffers: dict[tuple[str, str], float] = {}
    demand: dict[tuple[str, str], float] = {}
    expected: dict[tuple[str, str], float] = {}
    paths: dict[tuple[str, str], list[float]] = {}
    needs: dict[tuple[str, str], float] = {}
    interval = float(policy.intervals.plan_seconds)
    gap_start = max(0.0, interval - float(policy.forecast_gap.window_seconds))
    for md in mds:
        variants = planned_variants(md)
        name = md.metadata.name
        interactive: dict[str, float] = {}  # per region: provisioned forecast, or held
        for region in md.spec.regions:
            key = (name, region.name)
            if realised_tps is not None and method == REALISED:
                fc = realised_forecast(realised_tps.get(key, []), spec)
            else:
                fc = forecast_peak(history_tps.get(key, []), spec, method=method, fallback=fallback)
            forecasts[key] = fc
            batch = batch_tps_last_hour.get(key, [])
            arrived = (batch_received or {}).get(key, batch)
            buffers[key] = batch_buffer_tps(arrived, policy.forecast.batch_buffer_fraction)
            batch_rate = batch_buffer_tps(batch, 1.0)  # the whole last-hour batch rate
            expected[key] = expected_in_window(fc, spec, gap_start, interval) + batch_rate
            if fc.reliable:
                provisioned = fc.upper_tps if policy.forecast.quantile > 0.5 else fc.peak_tps
                interactive[region.name] = provisioned
                paths[key] = provisioned_path(fc, spec, provisioned)
            else:  # hold: ask for what the current instances serve
                interactive[region.name] = sum(
                    current.get((name, region.name, v.name), 0)
                    * theta_of(name, v, region.name, capacity_tps)
                    for v in variants.values()
                )
        shares = split_need((batch_need or {}).get(name, 0.0), interactive)
        for region_name, planned in interactive.items():
            key = (name, region_name)
            needs[key] = shares[region_name]
            if key in paths:
                extra = batch_demand_tps(buffers[key], needs[key])
                demand[key] = planned + extra
                paths[key] = [v + extra for v in paths[key]]
            else:  # held: grown only by a need beyond what its instances serve
                demand[key] = max(planned, needs[key])
    windows = max((len(v) for v in paths.values()), default=1)
    per_window = {k: paths.get(k) or [v] * windows for k, v in demand.items()}
    problem = (
        build_problem(mds, policy, current, per_window, gpu_capacity, capacity_tps) if mds else None
    )
    if problem is None and not pools and held_regions and every_md:
        raise ValueError(
            f"every region of every ModelDeployment is held ({', '.join(sorted(held_regions))}):"
            " nothing to plan until a silent cluster answers"
        )
    pool_targets = size_pools(pools, spec, policy, pool_rates or {}, pool_current or {})
    if pool_targets:
        problem = add_pools(problem, pools, pool_targets, policy, pool_current or {}, gpu_capacity)
    if problem is None:
        raise ValueError("mds: nothing to plan (no ModelDeployment and no ModelPool)")
    result = solve_plan(problem, plan_options(policy))
    pool_targets = granted(pool_targets, result)
    targets = variant_targets(mds, result) if result.target else {}
    targets.update(held_targets(every_md, held_regions, current))
    return PlanCycle(
        forecasts=forecasts,
        batch_buffer_tps=buffers,
        demand_tps=demand,
        expected_tps=expected,
        result=result,
        targets=targets,
        endpoint_targets=endpoint_targets(targets),
        instance_tps=instance_capacity(every_md, targets, capacity_tps),
        spill=spill_shares(mds, targets, demand, capacity_tps),
        pools=tuple(pool_targets),
        batch_need_tps=needs,
        held_regions=frozenset(held_regions),
    )


def without_regions(md: ModelDeployment, regions: frozenset[str]) -> ModelDeployment:
    """`md` as the plan sees it when `regions` are held: those regions left out."""
    if not regions or not any(r.name in regions for r in md.spec.regions):
        return md
    kept = [r for r in md.spec.regions if r.name not in regions]
    return md.model_copy(update={"spec": md.spec.model_copy(update={"regions": kept})})


def held_targets(
    mds: Sequence[ModelDeployment],
    regions: frozenset[str],
    current: Mapping[tuple[str, str, str], int],
) -> VariantCounts:
    """The targets of endpoints in held regions: the instances they have (every variant,
    planned or not), so the plan in force there is the one before the cluster went silent."""
    return {
        (md.metadata.name, r.name, v.name): current.get((md.metadata.name, r.name, v.name), 0)
        for md in mds
        for r in md.spec.regions
        if r.name in regions
        for v in planned_variants(md).values()
    }


def spill_shares(
    mds: Sequence[ModelDeployment],
    targets: VariantCounts,
    demand: Mapping[tuple[str, str], float],
    theta: ThetaTable | None = None,
) -> dict[str, dict[str, dict[str, float]]]:
    """Per model, the share of each home region's planned demand the plan expects another
    region to serve (`plan.flow.spillover` on the targets' capacity), for the router's
    bounds. A model whose every region covers its own demand gets no entry: nothing to
    bound, the paper's unbounded rule applies (SageServe §5 C2, §6.1)."""
    out: dict[str, dict[str, dict[str, float]]] = {}
    for md in mds:
        name = md.metadata.name
        variants = planned_variants(md).values()
        capacity = {
            r.name: sum(
                targets.get((name, r.name, v.name), 0) * theta_of(name, v, r.name, theta)
                for v in variants
            )
            for r in md.spec.regions
        }
        wanted = {r.name: demand.get((name, r.name), 0.0) for r in md.spec.regions}
        routes = spillover(wanted, capacity).routes
        shares = {
            home: {to: tps / wanted[home] for to, tps in sorted(sent.items())}
            for home, sent in sorted(routes.items())
            if wanted.get(home, 0.0) > 0
        }
        if shares:
            out[name] = shares
    return out


def instance_capacity(
    mds: Sequence[ModelDeployment], targets: VariantCounts, theta: ThetaTable | None = None
) -> dict[EndpointKey, float]:
    """Tokens/s one planned instance of each endpoint serves: θ of its variants weighted by
    their targets (the first planned variant's θ when the target is 0).

    LT-UA turns observed tokens/s into instances with it; the plan knows the variant mix,
    the strategy does not.
    """
    out: dict[EndpointKey, float] = {}
    for md in mds:
        variants = list(planned_variants(md).values())
        if not variants:
            continue
        name = md.metadata.name
        for region in md.spec.regions:
            counts = [
                (targets.get((name, region.name, v.name), 0), theta_of(name, v, region.name, theta))
                for v in variants
            ]
            total = sum(n for n, _ in counts)
            capacity = sum(n * t for n, t in counts)
            out[EndpointKey(name, region.name)] = capacity / total if total else counts[0][1]
    return out
