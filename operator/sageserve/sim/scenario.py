"""Scenario = the files a user keeps in Git, read into a simulator configuration.

A scenario is a directory holding:
- manifests: ModelDeployment / ModelPool / WorkloadTier / ScalingPolicy YAML (validated
  with the pydantic models of `sageserve.api`, the same ones the CRDs are generated from);
  a ModelPool's pooled models are served by its pods (`sim.pooled_pods`), and a workload
  source names them by `spec.models[].name` like any model;
- a node inventory: plain v1.Node YAML (the format of `e2e/inventory/*.yaml`);
- `workload.yaml`: trace sources and their mapping to (model, region, tier), see
  `sim.workload`.

An optional `scenario.yaml` names the files explicitly (paths relative to it):

```yaml
name: default
description: ...
manifests: [models.yaml, tiers.yaml, policy.yaml]
inventory: nodes.yaml
workload: workload.yaml
drain: 2h          # keep simulating after the window so in-flight work can finish
policies: [reactive, siloed]   # what `sageserve simulate` compares by default
picker: token-jsq  # the routers' in-region pod choice (`sageserve router --picker`)
```

Without it, every `*.yaml` of the directory is read and documents are sorted by `kind`.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import yaml

from sageserve.api.model_deployment import ModelDeployment, Variant, model_theta_tps
from sageserve.api.model_pool import ModelPool, initial_size, parse_pool
from sageserve.api.scaling_policy import ScalingPolicy
from sageserve.api.workload_tier import WorkloadTier
from sageserve.core.nodes import plannable_gpus
from sageserve.core.snapshot import Plan
from sageserve.core.types import EndpointKey, Request, Tier, TierKind
from sageserve.dispatch.from_policy import (
    instance_scheduling_of,
    release_rules_of,
    route_threshold_of,
)
from sageserve.dispatch.instance_picker import DEFAULT_PICKER, picker_names
from sageserve.metrics.picker import PickerKind
from sageserve.pace.base import PacingStrategy, PlanSource, make_strategy
from sageserve.perf.layout_check import variant_layout_problems, variant_parallelism
from sageserve.perf.model import DEFAULT_NODE_GPUS, PerfCatalog, VariantPerf, load_catalog
from sageserve.perf.switch import sleep_mode_switch_seconds
from sageserve.sim.cluster import Delays, Node, nodes_from_manifests
from sageserve.sim.engine import ModelSetup, PerKeySeries, Planner, RegionPlacement, SimConfig
from sageserve.sim.member_clusters import SimFleet, parse_clusters
from sageserve.sim.pooled_pods import PoolObservation, PoolSetup
from sageserve.sim.window_tokens import WindowTokens

if TYPE_CHECKING:
    from sageserve.plan.learned_capacity import ThetaTable
    from sageserve.sim.layout_loop import SimLayouts
from sageserve.sim.workload import (
    TokenSeries,
    Workload,
    load_workload,
    parse_duration,
    requests,
    requests_per_minute,
    token_series,
    tokens_per_minute,
)

PERF_PROFILE_ANNOTATION = "sageserve.io/perf-profile"


@dataclass
class Scenario:
    name: str
    root: Path
    description: str
    models: list[ModelDeployment]
    tiers: dict[str, Tier]
    policy: ScalingPolicy | None
    nodes: list[Node]
    workload: Workload
    drain_s: float
    policies: list[str] = field(default_factory=lambda: ["reactive", "siloed"])
    catalog: PerfCatalog = field(default_factory=load_catalog)
    #: ModelPools of the scenario (`sim.pooled_pods`)
    pools: list[ModelPool] = field(default_factory=list)
    #: ConfigMaps of the scenario's manifests by name: their `data` (a measured capacity
    #: table for OServe layouts, named by the annotation `sageserve.io/type-capacity`)
    config_maps: dict[str, dict[str, str]] = field(default_factory=dict)
    #: the fleet's member clusters (`clusters` in scenario.yaml; none: one cluster)
    fleet: SimFleet = field(default_factory=SimFleet)
    #: the routers' in-region pod choice (`picker` in scenario.yaml: what the deployment
    #: runs `sageserve router --picker` with; `dispatch.instance_picker`)
    picker: str = DEFAULT_PICKER

    # ---- what one run needs --------------------------------------------------------------

    def sim_config(self, seed: int | None = None) -> SimConfig:
        setups = []
        for md in self.models:
            pname = md.metadata.annotations.get(PERF_PROFILE_ANNOTATION, md.metadata.name)
            self.check_layouts([md])
            variants = tuple((v.name, self.variant_perf(md, pname, v)) for v in md.spec.variants)
            regions = tuple(
                RegionPlacement(
                    r.name,
                    r.min_instances,
                    r.max_instances,
                    r.initial_instances if r.initial_instances is not None else r.min_instances,
                )
                for r in md.spec.regions
            )
            context = self.context_length(md)
            for vname, perf in variants:
                if context > perf.kv_capacity_tokens:
                    raise ValueError(
                        f"ModelDeployment {md.metadata.name}: a context of {context} tokens does "
                        f"not fit variant {vname}'s KV cache ({perf.kv_capacity_tokens} tokens), "
                        "so vLLM would refuse to start; set spec.model.contextLength to at most "
                        f"{perf.kv_capacity_tokens}"
                    )
            theta = model_theta_tps(md)
            drain = {v.name: float(v.drain_seconds) for v in md.spec.variants}
            setups.append(ModelSetup(md.metadata.name, variants, regions, context, theta, drain))
        sp = self.policy.spec if self.policy is not None else None
        cfg = SimConfig(
            models=tuple(setups),
            nodes=tuple(replace(n) for n in self.nodes),
            start_s=self.workload.start_s,
            end_s=self.workload.end_s,
            drain_s=self.drain_s,
            seed=self.workload.seed if seed is None else seed,
            region_order=tuple(self.workload.region_order),
            fleet=self.fleet.shifted(self.workload.start_s),
            picker=self.picker,
        )
        if sp is not None:
            cfg = replace(
                cfg,
                route_threshold=route_threshold_of(sp),
                release_rules=release_rules_of(sp),
                instance_scheduling=instance_scheduling_of(sp),
                pace_s=float(sp.intervals.pace_seconds),
                history_minutes=math.ceil(sp.forecast.training_window_seconds / 60),
                scale_in_stabilization_s=float(sp.intervals.scale_in_stabilization_seconds),
                delays=Delays(
                    reclaim_same_model_median_s=float(sp.spot.reclaim_same_model_seconds),
                    reclaim_same_model_max_s=float(sp.spot.reclaim_same_model_max_seconds),
                    redeploy_s=float(sp.spot.redeploy_seconds),
                    remote_redeploy_s=float(sp.spot.remote_redeploy_seconds),
                ),
                spot_enabled=sp.spot.enabled,
                endpoint_picker=sp.signals.endpoint_picker is not PickerKind.NONE,
            )
            from sageserve.plan.learned_capacity import declared_theta, settings_for
            from sageserve.sim.capacity_windows import CapacitySetup

            setup = CapacitySetup(settings_for(sp), declared_theta(self.models))
            cfg = replace(cfg, capacity=setup)
        promo = [t.promotion_age_s for t in self.tiers.values() if t.promotion_age_s]
        if promo:
            cfg = replace(cfg, promotion_age_s=min(promo))
        if self.pools:
            cfg = replace(cfg, pools=tuple(self.pool_setup(p) for p in self.pools))
        layouts = self.layout_setup()
        if layouts is not None:
            cfg = replace(cfg, layouts=layouts)
        return cfg

    def pool_profile(self, pool: ModelPool) -> str:
        """The perf profile of a pool's pods: its `sageserve.io/perf-profile` annotation,
        else its name (as for a ModelDeployment); every pooled model is a fine-tune of it."""
        return pool.metadata.annotations.get(PERF_PROFILE_ANNOTATION, pool.metadata.name)

    def pool_setup(self, pool: ModelPool) -> PoolSetup:
        """One ModelPool for the simulator: one pod = one instance of the base model's
        profile on the variant's GPUs; a switch as the twin charges it."""
        s = pool.spec
        profile = self.pool_profile(pool)
        gpu, gpus = s.variant.gpu_type, s.variant.gpus_per_instance
        perf = self.catalog.get(profile, gpu, gpus)
        base = self.catalog.context_length(profile)
        return PoolSetup(
            name=pool.metadata.name,
            policy=s.policy_ref.name,
            models=tuple(m.name for m in s.models),
            variant=s.variant.name,
            perf=replace(perf, model=pool.metadata.name),
            regions=tuple(
                (r.name, r.min_instances, r.max_instances, initial_size(r)) for r in s.regions
            ),
            awake_per_instance=s.awake_per_instance,
            idle_sleep_s=float(s.idle_sleep_seconds),
            switch_s=sleep_mode_switch_seconds(profile, gpu, gpus),
            manifest=pool,
            contexts=tuple(
                (m.name, m.context_length or base) for m in s.models if m.context_length or base
            ),
        )

    def node_gpus(self) -> dict[str, int]:
        """GPUs of the inventory's largest node per GPU type."""
        out: dict[str, int] = {}
        for n in self.nodes:
            out[n.gpu_type] = max(out.get(n.gpu_type, 0), n.gpus)
        return out

    def variant_perf(self, md: ModelDeployment, pname: str, v: Variant) -> VariantPerf:
        """A variant's profile: with tensorParallel or pipelineParallel declared, the
        (TP, PP) profile as the pod set renders it (TP = tensorParallel, else
        gpusPerInstance / pipelineParallel; `PerfCatalog.layout`, PP > 1 derived, on the
        inventory's node size), as the twin picks it from the pod's vLLM arguments; else the
        measured profile of its GPU count."""
        if v.tensor_parallel is None and v.pipeline_parallel == 1:
            return self.catalog.get(pname, v.gpu_type, v.gpus_per_instance)
        tp, pp = variant_parallelism(v)
        node = self.node_gpus().get(v.gpu_type) or DEFAULT_NODE_GPUS
        try:
            return self.catalog.layout(pname, v.gpu_type, tp, pp, node_gpus=node)
        except (KeyError, ValueError) as exc:
            msg = exc.args[0] if exc.args else str(exc)
            raise ValueError(
                f"ModelDeployment {md.metadata.name}: spec.variants[{v.name}] "
                f"(tensorParallel {tp} × pipelineParallel {pp}): {msg}"
            ) from None

    def layout_setup(self) -> SimLayouts | None:
        """The OServe layouts the run simulates (`sim.layout_loop`), None when the policy
        sets no `spec.layouts`. Refused, naming the field and the fix: two variants of one
        GPU type with the same (TP, PP), a variant without a profile to compute n from, a
        measured capacity table (the annotation `sageserve.io/type-capacity`) missing from
        the scenario's ConfigMaps or broken (the operator's `LayoutsReady=False` texts), and
        a policy with layouts that no ModelDeployment can run (no GPU type with two or more
        variants)."""
        if self.policy is None or self.policy.spec.layouts is None:
            return None
        from sageserve.plan.oserve_layouts import (
            TYPE_CAPACITY_ANNOTATION,
            analytical_capacity,
            layout_groups,
            measured_capacity,
        )
        from sageserve.sim.layout_loop import LayoutModel, SimLayouts

        node_gpus = self.node_gpus()
        models = []
        for md in self.models:
            name = md.metadata.name
            try:
                groups = layout_groups(md)
                if not groups:
                    continue
                cm = md.metadata.annotations.get(TYPE_CAPACITY_ANNOTATION, "")
                namespace = md.metadata.namespace or "default"
                measured = measured_capacity(md, groups, namespace, self.config_maps.get(cm))
                for group in groups:  # n analytical where no measured table covers it
                    if measured is None or measured.gpu_type != group.gpu_type:
                        node = node_gpus.get(group.gpu_type) or DEFAULT_NODE_GPUS
                        analytical_capacity(self.catalog, md, group, [(512.0, 128.0)], node)
            except ValueError as exc:
                raise ValueError(f"ModelDeployment {name}: {exc}") from None
            models.append(LayoutModel(md, tuple(groups), measured))
        if not models:
            policy = self.policy.metadata.name
            raise ValueError(
                f"scenario {self.name}: ScalingPolicy {policy} sets spec.layouts, but no "
                "ModelDeployment lists two or more variants of one GPU type (with different "
                "tensorParallel × pipelineParallel), so there is no layout to choose; add a "
                "variant, e.g. {name: tp4pp2, gpusPerInstance: 8, tensorParallel: 4, "
                "pipelineParallel: 2} next to a TP4 one, or simulate the policy without "
                "layouts (--set layouts=)"
            )
        return SimLayouts(self.policy.spec, tuple(models), self.catalog)

    def check_layouts(self, models: Sequence[ModelDeployment] | None = None) -> None:
        """Refuse a variant vLLM or the inventory's nodes cannot run: TP not dividing the
        model's attention heads, or a TP group larger than the largest node of its GPU type
        (`perf/layout_check.py`; the operator reports the same message as Ready=False).
        `models`: default every ModelDeployment of the scenario."""
        node_gpus: dict[str, int] = {}
        for n in self.nodes:
            node_gpus[n.gpu_type] = max(node_gpus.get(n.gpu_type, 0), n.gpus)
        for md in self.models if models is None else models:
            found = variant_layout_problems(md, self.catalog, node_gpus)
            if found:
                raise ValueError(
                    f"ModelDeployment {md.metadata.name}: " + "; ".join(m for _, m in found)
                )

    def context_length(self, md: ModelDeployment) -> int:
        """The model's context length: `spec.model.contextLength`, else its perf profile's
        (the config.json value vLLM would derive); 0 when neither names one."""
        pname = md.metadata.annotations.get(PERF_PROFILE_ANNOTATION, md.metadata.name)
        return md.spec.model.context_length or self.catalog.context_length(pname)

    def contexts(self) -> dict[str, int]:
        """Context length per model (those that have one); a pooled model's is its
        `contextLength`, else its pool's profile's."""
        out = {md.metadata.name: self.context_length(md) for md in self.models}
        for pool in self.pools:
            base = self.catalog.context_length(self.pool_profile(pool))
            for m in pool.spec.models:
                out[m.name] = m.context_length or base
        return {m: c for m, c in out.items() if c}

    def strategy(self, name: str | None = None) -> PacingStrategy:
        """The named strategy with the thresholds of the scenario's ScalingPolicy."""
        from sageserve.pace.from_policy import strategy_params

        sp = self.policy.spec if self.policy is not None else None
        params: dict[str, Any] = strategy_params(sp) if sp is not None else {}
        chosen = name or (str(sp.strategy) if sp is not None else "reactive")
        return make_strategy(chosen, params)

    def requests(self) -> Iterator[Request]:
        return requests(self.workload, self.tiers, self.contexts())

    def with_picker(self, picker: str | None) -> Scenario:
        """The scenario with its routers choosing pods by `picker` (None: as it says);
        an unknown name raises ValueError naming the pickers there are."""
        if picker is None:
            return self
        return replace(self, picker=checked_picker(picker, "--picker"))

    def with_seed(self, seed: int | None) -> Scenario:
        """The scenario with its workload drawn from `seed` (arrivals, and the model, region
        and tier of each client); the simulation's own draws follow the same seed
        (`sim_config`). None: the scenario's seed."""
        if seed is None or seed == self.workload.seed:
            return self
        return replace(self, workload=replace(self.workload, seed=seed))

    def history(self, minutes: int) -> tuple[PerKeySeries, PerKeySeries]:
        """The planner's history before the window: (interactive, batch) tokens/s per minute."""
        return tokens_per_minute(self.workload, self.tiers, minutes, self.contexts())

    def pool_history(self, minutes: int) -> PerKeySeries:
        """The pooled models' requests/s per minute before the window, per (model, home
        region): what the router's counter holds when the window starts."""
        if not self.pools:
            return {}
        pooled = {m.name for p in self.pools for m in p.spec.models}
        got = requests_per_minute(self.workload, self.tiers, minutes, self.contexts())
        return {k: v for k, v in got.items() if k[0] in pooled}

    def planner_for(self, strategy: PacingStrategy) -> Planner:
        """The planner of the plan `strategy` follows (`PlanCadence.source`): PreServe's
        window plan (`plan.preserve`), the peak-sized fleet, else the hourly cycle
        (`planner`)."""
        source = strategy.plan_cadence.source
        if source is PlanSource.WINDOW:
            return self.window_planner()
        if source is PlanSource.PEAK:
            return self.static_planner()
        return self.planner()

    def _token_series(self, history_minutes: int) -> TokenSeries:
        return token_series(self.workload, self.tiers, history_minutes, self.contexts())

    def window_planner(self) -> Planner:
        """PreServe's planner for the sim, fed as the operator's window loop is: per served
        (model, region) and minute, the prompt and generated tokens/s of all traffic and the
        batch tokens/s served (the run's own counts, `sim.window_tokens`, after the trace's
        minutes before the window by home region, what Prometheus holds when the run
        starts), through `plan.preserve.window_inputs` and `plan_window`."""
        from sageserve.api.scaling_policy import ScalingPolicySpec
        from sageserve.plan.preserve import plan_window, window_history_minutes, window_inputs

        spec = self.policy.spec if self.policy is not None else ScalingPolicySpec()
        history_minutes = window_history_minutes(spec)
        series = self._token_series(history_minutes)
        start = self.workload.start_s

        def before(*parts: dict[tuple[str, str], np.ndarray]) -> dict[tuple[str, str], list[float]]:
            keys = {k for part in parts for k in part}
            summed = {k: np.sum([p[k] for p in parts if k in p], axis=0) for k in keys}
            return series.before(summed, start, history_minutes)

        pre_prompt = before(series.iw_prompt, series.niw_prompt)
        pre_decode = before(series.iw_decode, series.niw_decode)
        pre_batch = before(series.niw_prompt, series.niw_decode)
        models = self.models
        fleet = self.fleet.shifted(start)

        def joined(
            pre: dict[tuple[str, str], list[float]], run: Mapping[tuple[str, str], list[float]]
        ) -> dict[tuple[str, str], list[float]]:
            return {
                k: (pre.get(k, []) + list(run.get(k, [])))[-history_minutes:]
                for k in set(pre) | set(run)
            }

        def plan(
            now: float,
            _history: Mapping[tuple[str, str], Sequence[float]],
            _batch: Mapping[tuple[str, str], Sequence[float]],
            current: Mapping[tuple[str, str, str], int],
            _received: Mapping[tuple[str, str], Sequence[float]],
            _need: Mapping[str, float],
            /,
            *,
            pools: PoolObservation | None = None,
            tokens: WindowTokens | None = None,
            capacity: ThetaTable | None = None,
        ) -> Plan:
            run = tokens if tokens is not None else WindowTokens()
            window = plan_window(
                models,
                spec,
                *window_inputs(
                    joined(pre_prompt, run.prompt),
                    joined(pre_decode, run.decode),
                    joined(pre_batch, run.batch),
                ),
                current,
                capacity,
                fleet.held_at(now),
            )
            return window.in_force(now)

        return plan

    def static_planner(self) -> Planner:
        """The static baseline's fleet: per (model, region), PreServe's N at the busiest
        window of the whole run (window means of interactive prompt and decode tokens/s,
        plus the batch buffer over the run), known in advance as a static fleet's owner
        sizes it for the peak."""
        from sageserve.api.scaling_policy import ScalingPolicySpec
        from sageserve.forecast.api import batch_buffer_tps
        from sageserve.plan.preserve import service_rates, window_instances, window_means

        spec = self.policy.spec if self.policy is not None else ScalingPolicySpec()
        series = self._token_series(0)
        w = float(spec.preserve.window_seconds)
        frac = spec.forecast.batch_buffer_fraction
        targets: dict[tuple[EndpointKey, str], int] = {}
        for md in self.models:
            first = md.spec.variants[0]
            mu = service_rates(first)
            for region in md.spec.regions:
                key = (md.metadata.name, region.name)
                zero = np.zeros(1)
                ps = window_means(list(series.iw_prompt.get(key, zero)), w) or [0.0]
                ds = window_means(list(series.iw_decode.get(key, zero)), w) or [0.0]
                bp = batch_buffer_tps(list(series.niw_prompt.get(key, zero)), frac)
                bd = batch_buffer_tps(list(series.niw_decode.get(key, zero)), frac)
                n = max(window_instances(p + bp, d + bd, mu) for p, d in zip(ps, ds, strict=True))
                n = max(region.min_instances, min(region.max_instances, n))
                for v in md.spec.variants:
                    targets[(EndpointKey(*key), v.name)] = n if v is first else 0

        def plan(
            now: float,
            _history: Mapping[tuple[str, str], Sequence[float]],
            _batch: Mapping[tuple[str, str], Sequence[float]],
            _current: Mapping[tuple[str, str, str], int],
            _received: Mapping[tuple[str, str], Sequence[float]],
            _need: Mapping[str, float],
            /,
            *,
            pools: PoolObservation | None = None,
            tokens: WindowTokens | None = None,
            capacity: ThetaTable | None = None,
        ) -> Plan:
            return Plan(now, targets)

        return plan

    def planner(self) -> Planner:
        """The hourly plan cycle of the operator (forecast + ILP, `plan.cycle`) for the sim.

        History is the interactive tokens/s (input + output) per minute of each (model,
        served region). β is 10 % of the batch tokens/s *received* in the last hour
        (SageServe §6.3), per (model, home region), as the operator's plan loop reads
        `sageserve_batch_accepted_tokens_total`; the batch tokens/s *served* (per serving
        region) still give the expected batch load of the window. Received and served
        differ exactly while the Queue Manager holds work for the troughs. Each model's batch
        deadline need at plan time (its Queue Manager's `required_tps`, as the operator reads
        the routers' gauge) enters ρ as max(β, need) (`plan.batch_demand`). With `pools`, the
        ModelPools are sized in the same cycle from each pooled model's requests/s per minute
        and their pods now (`plan.pool_cycle`, as the operator's plan loop passes them), and
        what the plan grants is set in `pools.granted`.
        """
        from sageserve.api.scaling_policy import ScalingPolicySpec
        from sageserve.forecast.realised import REALISED
        from sageserve.plan.cycle import history_at_policy_step, run_plan_cycle
        from sageserve.sim.reference import realised_future

        spec = self.policy.spec if self.policy is not None else ScalingPolicySpec()
        gpus = plannable_gpus(self.nodes)  # as the operator's plan loop counts them
        models = self.models
        manifests = list(self.pools)
        fleet = self.fleet.shifted(self.workload.start_s)
        # the achievable reference's forecast: the load that will arrive (`sim.reference`)
        future = self._token_series(0) if spec.forecast.method.value == REALISED else None

        def plan(
            now: float,
            history: Mapping[tuple[str, str], Sequence[float]],
            batch: Mapping[tuple[str, str], Sequence[float]],
            current: Mapping[tuple[str, str, str], int],
            received: Mapping[tuple[str, str], Sequence[float]],
            need: Mapping[str, float],
            /,
            *,
            pools: PoolObservation | None = None,
            tokens: WindowTokens | None = None,
            capacity: ThetaTable | None = None,
        ) -> Plan:
            cycle = run_plan_cycle(
                models,
                spec,
                history_at_policy_step(spec, history),
                history_at_policy_step(spec, batch),
                current,
                gpus,
                batch_received=history_at_policy_step(spec, received) or None,
                batch_need=need,
                pools=manifests if pools is not None else (),
                pool_rates=(
                    {k: history_at_policy_step(spec, v) for k, v in pools.rates.items()}
                    if pools is not None
                    else None
                ),
                pool_current=pools.current if pools is not None else None,
                capacity_tps=capacity,
                realised_tps=realised_future(future, now, spec) if future is not None else None,
                held_regions=fleet.held_at(now),
            )
            if pools is not None:
                pools.granted = cycle.pools
            return cycle.in_force(now)

        return plan


def tier_from_manifest(wt: WorkloadTier) -> Tier:
    spec = wt.spec
    interactive = str(spec.type) == "interactive"
    batch = spec.batch
    return Tier(
        name=wt.metadata.name,
        kind=TierKind.INTERACTIVE if interactive else TierKind.BATCH,
        ttft_slo_s=spec.slo.ttft_p95_seconds,
        tbt_slo_s=spec.slo.tbt_p95_seconds,
        deadline_s=float(batch.deadline_seconds) if batch is not None else None,
        # interactive: the declared priority orders the interactive tiers (instance_order);
        # batch: the instance scheduler's batch priority (SageServe §6.1)
        priority=spec.priority if interactive else 1,
        promotion_age_s=float(batch.promotion_age_seconds) if batch is not None else None,
    )


def _docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def _check_models(
    path: Path,
    workload: Workload,
    models: Sequence[ModelDeployment],
    pools: Sequence[ModelPool] = (),
) -> None:
    """Every model a workload source names (shares and overflow) is a ModelDeployment or a
    pooled model (`spec.models[].name` of a ModelPool): otherwise its requests would find no
    endpoint and count as lost, silently. A source's tiers must all be served by the pool
    of each pooled model it names (`spec.tiers`); a pooled model takes no overflow (a pool's
    models share one context)."""
    known = {md.metadata.name for md in models}
    pooled = {m.name: p for p in pools for m in p.spec.models}
    for src in workload.sources:
        for where, names in (("models", src.models), ("overflow", src.overflow)):
            for m in names:
                if m in known or m in pooled:
                    continue
                have = ", ".join(sorted(known))
                also = f"; pooled: {', '.join(sorted(pooled))}" if pooled else ""
                raise ValueError(
                    f"{path}: sources[{src.name}].{where} names model {m!r}, which is neither "
                    f"a ModelDeployment nor a pooled model (a ModelPool's spec.models[].name) "
                    f"of the scenario (ModelDeployments: {have}{also})"
                )
        for m in src.overflow:
            if m in pooled:
                raise ValueError(
                    f"{path}: sources[{src.name}].overflow: {m!r} is a pooled model; list "
                    "ModelDeployments only"
                )
        for m in src.models:
            pool = pooled.get(m)
            if pool is None:
                continue
            missing = sorted(t for t in src.tiers if t not in pool.spec.tiers)
            if missing:
                raise ValueError(
                    f"{path}: sources[{src.name}].tiers: {', '.join(missing)} not in ModelPool "
                    f"{pool.metadata.name}'s spec.tiers ({', '.join(pool.spec.tiers)}), yet the "
                    f"source sends pooled model {m!r} requests of it; add the tier to "
                    "spec.tiers or give the pooled models a source of their own"
                )


def _check_pools(
    pools: Sequence[ModelPool],
    models: Sequence[ModelDeployment],
    nodes: Sequence[Node],
    catalog: PerfCatalog,
    files: Mapping[str, Path],
) -> None:
    """What the simulator cannot run, each error naming the pool's file and field: a pooled
    model named like a ModelDeployment or like another pool's model, a variant whose GPU
    type or size no node of the inventory has, a pool with no perf profile."""
    deployments = {md.metadata.name for md in models}
    seen: dict[str, str] = {}
    sizes: dict[str, int] = {}
    for n in nodes:
        sizes[n.gpu_type] = max(sizes.get(n.gpu_type, 0), n.gpus)
    for pool in pools:
        name = pool.metadata.name
        where = f"{files[name]}: ModelPool {name}"
        for m in pool.spec.models:
            if m.name in deployments:
                raise ValueError(
                    f"{where}: spec.models[].name {m.name!r} is also a ModelDeployment; "
                    "requests could not tell them apart: rename one"
                )
            if m.name in seen:
                raise ValueError(
                    f"{where}: spec.models[].name {m.name!r} is pooled by ModelPool "
                    f"{seen[m.name]} too: keep it in one pool"
                )
            seen[m.name] = name
        v = pool.spec.variant
        if v.gpu_type not in sizes:
            raise ValueError(
                f"{where}: spec.variant.gpuType {v.gpu_type}: no node of the inventory has "
                f"this GPU type (have {', '.join(sorted(sizes))}); the pool could never place "
                "a pod"
            )
        if v.gpus_per_instance > sizes[v.gpu_type]:
            raise ValueError(
                f"{where}: spec.variant.gpusPerInstance {v.gpus_per_instance}: the largest "
                f"{v.gpu_type} node has {sizes[v.gpu_type]} GPUs; lower gpusPerInstance"
            )
        profile = pool.metadata.annotations.get(PERF_PROFILE_ANNOTATION, name)
        try:
            catalog.get(profile, v.gpu_type, v.gpus_per_instance)
        except KeyError:
            raise ValueError(
                f"{where}: no perf profile {profile!r} on {v.gpus_per_instance}×{v.gpu_type} "
                f"for its pods; name the pooled models' base model with the annotation "
                f"metadata.annotations[{PERF_PROFILE_ANNOTATION}] (have "
                f"{', '.join(sorted(catalog.models()))})"
            ) from None


@dataclass
class _Manifests:
    """A scenario's objects by kind (a ModelPool by its name and file)."""

    models: list[ModelDeployment] = field(default_factory=list)
    tiers: dict[str, Tier] = field(default_factory=dict)
    policy: ScalingPolicy | None = None
    node_docs: list[dict[str, Any]] = field(default_factory=list)
    pools: list[ModelPool] = field(default_factory=list)
    #: pool name -> the file it came from
    pool_files: dict[str, Path] = field(default_factory=dict)
    config_maps: dict[str, dict[str, str]] = field(default_factory=dict)


def _read_manifests(docs: Sequence[tuple[Path, dict[str, Any]]]) -> _Manifests:
    """The scenario's objects by kind; an invalid one is an error naming its file."""
    m = _Manifests()
    for f, d in docs:
        kind = d.get("kind")
        try:
            if kind == "ModelDeployment":
                m.models.append(ModelDeployment.model_validate(d))
            elif kind == "WorkloadTier":
                m.tiers[d["metadata"]["name"]] = tier_from_manifest(WorkloadTier.model_validate(d))
            elif kind == "ScalingPolicy":
                m.policy = ScalingPolicy.model_validate(d)
            elif kind == "Node":
                m.node_docs.append(d)
            elif kind == "ModelPool":
                pool = parse_pool(d)
                m.pools.append(pool)
                m.pool_files[pool.metadata.name] = f
            elif kind == "ConfigMap":
                data = d.get("data") or {}
                m.config_maps[d["metadata"]["name"]] = {str(k): str(v) for k, v in data.items()}
        except Exception as e:  # pydantic's message names the field; add the file
            raise ValueError(f"{f}: invalid {kind}: {e}") from e
    return m


def _cluster_nodes(entries: object, root: Path) -> dict[str, list[Node]]:
    """Each declared cluster's GPU nodes, by cluster name: from its Node YAML
    (`clusters[].inventory`) or, for fleets too large to list node by node, from counts
    (`clusters[].nodePools: [{region, gpuType, gpusPerNode, serving, spot}]`). The entries'
    other fields are checked by `sim.member_clusters.parse_clusters`."""
    if entries is None:
        return {}
    if not isinstance(entries, list):
        raise ValueError("clusters: expected a list of {name, inventory, silent} entries")
    out: dict[str, list[Node]] = {}
    for i, entry in enumerate(entries):
        if not isinstance(entry, dict) or not (entry.get("inventory") or entry.get("nodePools")):
            raise ValueError(
                f"clusters[{i}]: name the cluster's Node YAML (inventory) or its nodePools"
            )
        name = str(entry.get("name", i))
        nodes: list[Node] = []
        if entry.get("inventory"):
            path = root / str(entry["inventory"])
            if not path.is_file():
                raise ValueError(f"clusters[{i}].inventory: {path} does not exist")
            nodes += nodes_from_manifests(_docs(path))
        for j, np_ in enumerate(entry.get("nodePools") or []):
            at = f"clusters[{i}].nodePools[{j}]"
            try:
                region, gpu = str(np_["region"]), str(np_["gpuType"])
                per_node = int(np_.get("gpusPerNode", DEFAULT_NODE_GPUS))
                counts = {"serving": int(np_.get("serving", 0)), "spot": int(np_.get("spot", 0))}
            except (KeyError, TypeError, ValueError) as e:
                raise ValueError(
                    f"{at}: expected {{region, gpuType, gpusPerNode, serving, spot}} ({e})"
                ) from e
            if per_node <= 0 or min(counts.values()) < 0:
                raise ValueError(f"{at}: gpusPerNode must be > 0 and node counts ≥ 0")
            nodes += [
                Node(f"{name}-{region}-{gpu}-{pool}-{k}", region, gpu, pool, per_node)
                for pool, n in counts.items()
                for k in range(n)
            ]
        out[name] = nodes
    return out


def load_scenario(path: Path) -> Scenario:
    """Read a scenario directory (or its `scenario.yaml`)."""
    path = Path(path)
    index = path if path.is_file() else path / "scenario.yaml"
    root = index.parent if index.exists() else path
    meta: dict[str, Any] = _docs(index)[0] if index.exists() else {}
    if meta:
        manifest_files = [root / f for f in meta.get("manifests", [])]
        inv_files = [root / meta["inventory"]] if meta.get("inventory") else []
        wl_file = root / meta.get("workload", "workload.yaml")
    else:
        manifest_files = sorted(p for p in root.glob("*.yaml") if p.name != "workload.yaml")
        inv_files = []
        wl_file = root / "workload.yaml"
    docs: list[tuple[Path, dict[str, Any]]] = []
    for f in manifest_files + inv_files:
        docs += [(f, d) for d in _docs(f)]
    m = _read_manifests(docs)
    models, tiers = m.models, m.tiers
    if not models:
        raise ValueError(f"{root}: no ModelDeployment manifest found")
    if not tiers:
        raise ValueError(f"{root}: no WorkloadTier manifest found")
    members = _cluster_nodes(meta.get("clusters"), root) if meta else {}
    nodes = nodes_from_manifests(m.node_docs) + [n for ns in members.values() for n in ns]
    if not nodes:
        raise ValueError(f"{root}: no GPU Node in the inventory")
    fleet = SimFleet()
    if members:
        regions_of = {name: frozenset(n.region for n in ns) for name, ns in members.items()}
        fleet = parse_clusters(meta["clusters"], regions_of, parse_duration)
    catalog = load_catalog()
    _check_pools(m.pools, models, nodes, catalog, m.pool_files)
    workload = load_workload(wl_file)
    _check_models(wl_file, workload, models, m.pools)
    scenario = Scenario(
        name=str(meta.get("name", root.name)),
        root=root,
        description=str(meta.get("description", "")),
        models=models,
        tiers=tiers,
        policy=m.policy,
        nodes=nodes,
        workload=workload,
        drain_s=parse_duration(meta.get("drain", "1h")),
        policies=[str(p) for p in meta.get("policies", ["reactive", "siloed"])],
        pools=m.pools,
        catalog=catalog,
        config_maps=m.config_maps,
        fleet=fleet,
        picker=checked_picker(str(meta.get("picker", DEFAULT_PICKER)), f"{index}: picker"),
    )
    scenario.check_layouts()  # at load, as the operator's Ready=False would stop it
    return scenario


def checked_picker(name: str, where: str) -> str:
    """`name` if it is a registered in-region picker, else ValueError naming `where` and
    the pickers there are."""
    if name not in picker_names():
        raise ValueError(
            f"{where}: unknown picker {name!r}; choose one of {', '.join(picker_names())}"
        )
    return name


def default_scenario_dir() -> Path:
    """`scenarios/default` of the source tree (the package is installed editable)."""
    here = Path(__file__).resolve()
    for parent in here.parents:
        cand = parent / "scenarios" / "default"
        if cand.is_dir():
            return cand
    raise FileNotFoundError("scenarios/default not found next to the sageserve sources")


def with_policy_settings(sc: Scenario, settings: Sequence[str]) -> Scenario:
    """`sageserve simulate --set PATH=VALUE`: the scenario with fields of its ScalingPolicy's
    spec changed, e.g. `thresholds.scaleOutEmu=0.6` or `forecast.quantile=0.9`.

    Why: trying a policy change is what a simulation is for, and a copied scenario directory
    per value is how results lose the settings that made them. The changed policy is checked
    as `sageserve validate` checks a manifest (schema, then the CRD's CEL rules); a bad path
    or value is an error naming the field and the fix, and nothing runs.
    """
    if not settings:
        return sc
    from sageserve.api.common import API_VERSION
    from sageserve.api.validate import validate_document

    if sc.policy is not None:
        doc = sc.policy.model_dump(by_alias=True, exclude_none=True, mode="json")
    else:
        doc = {"apiVersion": API_VERSION, "kind": "ScalingPolicy", "metadata": {"name": "fleet"}}
    spec = doc.setdefault("spec", {})
    for item in settings:
        path, sep, raw = item.partition("=")
        keys = path.strip().split(".")
        if not sep or not all(keys):
            raise ValueError(
                f"--set {item!r}: expected PATH=VALUE, e.g. thresholds.scaleOutEmu=0.6"
            )
        node = spec
        for key in keys[:-1]:
            child = node.setdefault(key, {})
            if not isinstance(child, dict):
                raise ValueError(f"--set {item!r}: spec.{key} is a value, not an object")
            node = child
        node[keys[-1]] = yaml.safe_load(raw) if raw.strip() else None
    problems, _ = validate_document("--set", 0, doc)
    if problems:
        raise ValueError("; ".join(str(p) for p in problems))
    return replace(sc, policy=ScalingPolicy.model_validate(doc))
