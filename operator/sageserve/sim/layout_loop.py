"""The OServe layout loop in the fleet simulator (OServe §4.2, §4.3, §5.1, §5.2).

The operator's loop (`controller.layout_loop`) on the simulator's own state, on its cadence:
for a policy with `spec.layouts`, per (ModelDeployment, region, GPU type) whose
ModelDeployment lists two or more variants of that GPU type, every pace pass steps a switch
in progress, and every `replanSeconds` a re-plan (`plan.layout_step.replan_layout`) sees:

- the layout in force: the variants' instances, serving or coming up (a pod set's
  spec.replicas), and their serving instances as the Ready pods;
- the budget: the plan in force's instances of those variants × their GPUs when a plan covers
  the (model, region), else the GPUs of the layout in force (`plan.layout_group.observation`);
- the GPUs free beyond it: unplaced GPUs of the region's serving-pool nodes of that type (and
  spot-pool nodes when `spec.spot.enabled`) (a drained instance is gone and its GPUs free,
  as a scaled-in pod on Kubernetes);
- the request mix: what the simulated router answered per log-2 (prompt, output) bucket over
  `historySeconds` (`ShapeCounter`, `forecast.request_types.shape_bucket`, the buckets of
  `sageserve_router_request_shapes_total`), by whole minutes, turned into types and rates
  by `plan.oserve_layouts.mix_from_buckets`;
- per-type n: measured (the scenario's ConfigMap named by the ModelDeployment's annotation
  `sageserve.io/type-capacity`, the file of `sageserve calibrate --by-type`, whose types
  the buckets are classified into) or analytical (`perf/capacity.py` on each variant's
  (TP, PP) profile);
- the horizon: `spec.layouts.forecast: policy` forecasts each type's per-step rate (the
  buckets' per-minute counts as Prometheus' `rate()` on the policy's step) with the policy's
  forecaster (`plan.oserve_layouts.forecast_windows`); `persist` keeps the measured rates.

The targets go into the plan the decision step sees (`plan.oserve_layouts.with_layouts`), so
`pace.step.decide` moves each layout variant to its own target (`layout_move`): starts
before stops, make-before-break where GPUs are free. Requests are dispatched between the
variants by type with the weights of the layout in force (`dispatch.layout_dispatch`, the
router's rule), which the loop publishes on each endpoint (`Endpoint.dispatch`) as the
operator publishes `status.layouts` for the routers.
"""

from __future__ import annotations

import math
from collections import Counter, deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from sageserve.api.model_deployment import ModelDeployment
from sageserve.api.scaling_policy import (
    LayoutForecast,
    Layouts,
    ScalingPolicySpec,
    layouts_from_status,
)
from sageserve.core.labels import SERVING_POOL, SPOT_POOL
from sageserve.core.snapshot import Plan
from sageserve.core.types import EndpointKey
from sageserve.dispatch.layout_dispatch import EndpointLayout, dispatch_by_type, endpoint_layout
from sageserve.forecast.request_types import shape_bucket
from sageserve.perf.model import PerfCatalog
from sageserve.plan.layout_group import (
    GroupKey,
    GroupState,
    abandoned_message,
    advance,
    begin,
    finished_message,
    group_weights,
    layout_settings,
    managed_targets,
    observation,
    published_types,
    take_in_force,
    with_mix,
)
from sageserve.plan.layout_search import describe
from sageserve.plan.layout_step import replan_layout
from sageserve.plan.layout_switch import Window
from sageserve.plan.oserve_layouts import (
    LayoutGroup,
    LayoutTargets,
    MeasuredCapacity,
    Mix,
    analytical_capacity,
    forecast_windows,
    layout_forecast_spec,
    layout_history_seconds,
    mix_from_buckets,
    type_series,
)
from sageserve.sim.cluster import Cluster, Deployment, Endpoint

#: (prompt_le, output_le)
Shape = tuple[str, str]


@dataclass(frozen=True)
class LayoutModel:
    """One ModelDeployment with layouts: its GPU types with two or more variants, and the
    measured capacity table it names (None: analytical n)."""

    md: ModelDeployment
    groups: tuple[LayoutGroup, ...]
    measured: MeasuredCapacity | None = None


@dataclass(frozen=True)
class SimLayouts:
    """What the simulator's layout loop runs: the policy's spec (its `layouts`, forecast and
    spot settings) and the ModelDeployments with layouts."""

    policy: ScalingPolicySpec
    models: tuple[LayoutModel, ...]
    catalog: PerfCatalog = field(compare=False, repr=False)

    @property
    def settings(self) -> Layouts:
        assert self.policy.layouts is not None
        return self.policy.layouts


class ShapeCounter:
    """The simulated router's `sageserve_router_request_shapes_total`: answered requests per
    (model, serving region) and log-2 (prompt, output) bucket, kept by minute for as long as
    the re-plans read back (`historySeconds`, or the policy forecaster's history)."""

    def __init__(self, keep_minutes: int) -> None:
        #: whole minutes, oldest first; the last one ends at minute `self.minute`
        self.minutes: deque[dict[tuple[str, str], Counter[Shape]]] = deque(maxlen=keep_minutes)
        self.current: dict[tuple[str, str], Counter[Shape]] = {}
        self.minute = 0

    def count(self, model: str, region: str, prompt: float, output: int) -> None:
        """One answered request (the router counts it once its output length is known)."""
        if not output:
            return
        c = self.current.get((model, region))
        if c is None:
            c = self.current[(model, region)] = Counter()
        c[(shape_bucket(prompt), shape_bucket(output))] += 1

    def roll(self) -> None:
        """Close the minute."""
        self.minutes.append(self.current)
        self.current = {}
        self.minute += 1

    def counts(self, model: str, region: str, seconds: float) -> dict[Shape, float]:
        """Requests per bucket over the last `seconds`, in whole minutes (Prometheus'
        `increase` over the history, at minute resolution)."""
        n = max(1, int(seconds // 60))
        out: Counter[Shape] = Counter()
        for minute in list(self.minutes)[-n:]:
            out.update(minute.get((model, region), {}))
        return {k: float(v) for k, v in out.items()}

    def series(
        self, model: str, region: str, seconds: float, step_s: float
    ) -> dict[Shape, list[float]]:
        """Requests/s per bucket on a grid of `step_s` over the last `seconds`, oldest first:
        each point the count over the window of max(`step_s`, 60 s) ending there, ÷ the
        window (Prometheus' `rate()` at minute resolution); NaN where the window reaches
        before the run's first minute (nothing was scraped then)."""
        minutes = list(self.minutes)
        first = self.minute - len(minutes)  # index of minutes[0]
        width = max(1, round(max(step_s, 60.0) / 60.0))
        points = max(1, int(seconds // step_s))
        ends = [self.minute - int(((points - 1 - i) * step_s) // 60) for i in range(points)]
        keys: set[Shape] = set()
        for m in minutes:
            keys.update(m.get((model, region), {}))
        out: dict[Shape, list[float]] = {k: [] for k in sorted(keys)}
        for end in ends:
            lo = end - width
            if lo < 0 or lo < first:
                for values in out.values():
                    values.append(math.nan)
                continue
            total: Counter[Shape] = Counter()
            for m in minutes[lo - first : end - first]:
                total.update(m.get((model, region), {}))
            for k, values in out.items():
                values.append(total.get(k, 0) / (width * 60.0))
        return out


def _variant_of(inst: Any) -> str:
    dep = inst.endpoint
    return dep.variant if isinstance(dep, Deployment) else ""


@dataclass
class GroupRecord:
    """What a run reports of one (model, region, GPU type)'s layout."""

    replans: int = 0
    switches: int = 0
    finished: int = 0
    abandoned: int = 0
    #: (time, the decision's line) of every switch started, finished or abandoned
    events: list[tuple[float, str]] = field(default_factory=list)


class SimLayoutLoop:
    """The layout loop of one run (see the module doc)."""

    def __init__(self, setup: SimLayouts, cluster: Cluster) -> None:
        self.setup = setup
        self.cluster = cluster
        spec = setup.policy
        self.spec = setup.settings
        self.settings = layout_settings(self.spec)
        history = float(self.spec.history_seconds)
        keep = max(history, layout_history_seconds(spec, history))
        step = layout_forecast_spec(spec, history).step_seconds
        self.shapes = ShapeCounter(math.ceil((keep + max(step, 60.0)) / 60.0) + 1)
        self.groups: dict[GroupKey, GroupState] = {}
        self.records: dict[GroupKey, GroupRecord] = {}
        self.changed_at = 0.0
        self.next_replan = 0.0
        #: per endpoint, the layout requests are dispatched by (as the router reads it)
        self.published: dict[EndpointKey, EndpointLayout] = {}
        #: (model, region, type, variant, overflowed) → requests dispatched by type
        self.dispatched: Counter[tuple[str, str, int, str, bool]] = Counter()
        #: the last weights computed (the assignment LP), by what they depend on
        self._weights: dict[GroupKey, tuple[Any, list[dict[str, float]]]] = {}
        #: (model, GPU type) → its group
        self.group_of = {
            (lm.md.metadata.name, gr.gpu_type): gr for lm in setup.models for gr in lm.groups
        }

    # ---- the pass --------------------------------------------------------------------------

    def targets(self) -> LayoutTargets:
        return managed_targets(self.groups, self.changed_at)

    def run(self, now: float, plan: Plan | None) -> bool:
        """One pass before the pace pass (the operator's order): step switches, re-plan when
        due, publish the dispatch weights. Returns whether the targets changed."""
        due = now >= self.next_replan
        if due:
            self.next_replan = now + float(self.spec.replan_seconds)
        before = self.targets().targets
        for lm in self.setup.models:
            for group in lm.groups:
                for region in lm.md.spec.regions:
                    ep = self.cluster.endpoints.get(EndpointKey(lm.md.metadata.name, region.name))
                    if ep is not None:
                        self.group_pass(lm, group, ep, now, plan, due)
        changed = self.targets().targets != before
        if changed:
            self.changed_at = now
        self.publish()
        return changed

    def group_pass(
        self,
        lm: LayoutModel,
        group: LayoutGroup,
        ep: Endpoint,
        now: float,
        plan: Plan | None,
        due: bool,
    ) -> None:
        region = ep.key.region
        key = (lm.md.metadata.name, region, group.gpu_type)
        g = self.groups.setdefault(key, GroupState())
        rec = self.records.setdefault(key, GroupRecord())
        running = ep.replicas()
        replicas = {v.name: running.get(v.name, 0) for v in group.variants}
        take_in_force(g, group, replicas)
        ready = {d.variant: len(d.instances) for d in ep.deployments}
        self.step(g, group, rec, ready, now)
        if due and g.switch is None:
            rec.replans += 1
            self.replan(lm, group, region, g, rec, replicas, plan, now)
            self.step(g, group, rec, ready, now)

    def step(
        self,
        g: GroupState,
        group: LayoutGroup,
        rec: GroupRecord,
        ready: Mapping[str, int],
        now: float,
    ) -> None:
        since = g.switch_since
        adv = advance(g, group, now, ready, self.settings)
        if adv.abandoned:
            g.message = abandoned_message(g, adv, now, since)
            rec.abandoned += 1
            rec.events.append((now, g.message))
        elif adv.finished:
            g.message = finished_message(g, adv, ready)
            rec.finished += 1
            rec.events.append((now, g.message))

    def replan(
        self,
        lm: LayoutModel,
        group: LayoutGroup,
        region: str,
        g: GroupState,
        rec: GroupRecord,
        replicas: Mapping[str, int],
        plan: Plan | None,
        now: float,
    ) -> None:
        """One re-plan: observe the run, `replan_layout`, apply (as the operator's). With a
        measured table of the group's GPU type, its types and n; else k-means types and
        analytical n."""
        md = lm.md
        spare, node_gpus = self.free_gpus(region, group.gpu_type)
        history = float(self.spec.history_seconds)
        counts = self.shapes.counts(md.metadata.name, region, history)
        table = lm.measured if lm.measured and lm.measured.gpu_type == group.gpu_type else None
        mix = mix_from_buckets(
            counts,
            history,
            k=self.spec.types,
            centroids=table.centroids if table is not None else None,
        )
        obs = observation(g, group, region, plan, replicas, spare, now, history)
        if mix is not None:
            if table is not None:
                rows = table.rows(group)
            else:
                rows = analytical_capacity(self.setup.catalog, md, group, mix.centroids, node_gpus)
            obs, needs_windows = with_mix(g, obs, mix, rows, node_gpus)
            if needs_windows:
                windows, outlook = self.windows(md.metadata.name, region, mix)
                obs = replace(obs, windows=tuple(windows), outlook=outlook)
        outcome = replan_layout(obs, g.memory, self.settings)
        if begin(g, outcome, now):
            rec.switches += 1
            rec.events.append((now, g.message))

    # ---- inputs ----------------------------------------------------------------------------

    def free_gpus(self, region: str, gpu_type: str) -> tuple[int, int]:
        """(GPUs free, node size) of `gpu_type` in `region` (`controller.layout_loop.free_gpus`
        on the inventory): unplaced GPUs of the serving-pool nodes (and spot-pool nodes with
        `spec.spot.enabled`)."""
        pools = {SERVING_POOL, SPOT_POOL} if self.setup.policy.spot.enabled else {SERVING_POOL}
        mine = [
            n
            for n in self.cluster.nodes
            if n.region == region and n.gpu_type == gpu_type and n.pool in pools
        ]
        size = max((n.gpus for n in mine), default=8)
        return sum(n.free_gpus for n in mine), size

    def windows(self, model: str, region: str, mix: Mix) -> tuple[list[Window], str]:
        """The re-plan's horizon (`controller.layout_loop.LayoutPass.windows` on the run's
        shape counts): `persist`, one window of `historySeconds` at the measured rates;
        `policy`, each type's per-step rate forecast with the policy's forecaster."""
        history = float(self.spec.history_seconds)
        if self.spec.forecast == LayoutForecast.PERSIST:
            return [Window(history, mix.rates)], ""
        policy = self.setup.policy
        spec = layout_forecast_spec(policy, history)
        seconds = layout_history_seconds(policy, history)
        series = self.shapes.series(model, region, seconds, spec.step_seconds)
        per_type = type_series(series, mix.centroids)
        fc = forecast_windows(
            per_type,
            mix.rates,
            spec,
            policy.forecast.method.value,
            float(self.spec.replan_seconds),
        )
        return list(fc.windows), fc.summary(mix.rates)

    # ---- dispatch --------------------------------------------------------------------------

    def publish(self) -> None:
        """Each endpoint's dispatch layout from its groups' weights, as the router reads
        `status.layouts` (`layouts_from_status`, `endpoint_layout`): an endpoint whose
        published types did not change keeps its round robin's credits."""
        entries = []
        for (model, region, gpu), g in self.groups.items():
            weights = self.weights((model, region, gpu), g)
            entries.append(
                {"model": model, "region": region, "types": published_types(g.mix, weights)}
            )
        for (model, region), types in layouts_from_status({"layouts": entries}).items():
            key = EndpointKey(model, region)
            ep = self.cluster.endpoints.get(key)
            if ep is None:
                continue
            new = endpoint_layout(types)
            old = self.published.get(key)
            if new is None:
                self.published.pop(key, None)
                ep.dispatch = None
                continue
            if old is None or old.types != new.types:
                self.published[key] = new
            ep.dispatch = self.published[key]

    def dispatch(
        self,
        ep: Endpoint,
        layout: EndpointLayout,
        prompt: float,
        predicted: float,
        pick: Callable[[list[Any]], Any],
        load: Callable[[Any], float],
    ) -> Any | None:
        """The instance of `ep` a request goes to by its type (`dispatch_by_type`, the
        router's rule), counted; None: the type-free rule decides."""
        insts = [i for d in ep.deployments for i in d.instances]
        if not insts:
            return None
        got = dispatch_by_type(layout, insts, _variant_of, pick, load, prompt, predicted)
        if got is None:
            return None
        inst, j, overflowed = got
        self.dispatched[(ep.key.model, ep.key.region, j, _variant_of(inst), overflowed)] += 1
        return inst

    def weights(self, key: GroupKey, g: GroupState) -> list[dict[str, float]]:
        """The group's per-type weights per variant (`group_weights`); none when the LP
        fails, as the operator then publishes none."""
        inputs = (g.layout, g.mix, tuple(sorted(g.capacity.items())))
        cached = self._weights.get(key)
        if cached is not None and cached[0] == inputs:
            return cached[1]
        try:
            weights = group_weights(self.group_of[(key[0], key[2])], g)
        except (RuntimeError, ValueError):
            weights = []
        # they change only with a re-plan or a switch
        self._weights[key] = (inputs, weights)
        return weights

    # ---- the run's record ------------------------------------------------------------------

    def summary(self) -> dict[str, Any]:
        """Per (model, region, GPU type): re-plans, switches (started, finished, abandoned),
        the layout in force at the end with its replicas per variant, the last decision and
        every switch's line; per (model, region) the requests dispatched per type and
        variant (and how many of them overflowed)."""
        groups: dict[str, Any] = {}
        for (model, region, gpu), g in sorted(self.groups.items()):
            rec = self.records.get((model, region, gpu), GroupRecord())
            groups[f"{model}/{region}/{gpu}"] = {
                "replans": rec.replans,
                "switches": rec.switches,
                "switches_finished": rec.finished,
                "switches_abandoned": rec.abandoned,
                "layout": describe(g.layout),
                "replicas": dict(sorted(g.targets.items())),
                "switching": g.switch is not None,
                "types": published_types(g.mix, self.weights((model, region, gpu), g)),
                "message": g.message,
                "events": [{"t": t, "message": m} for t, m in rec.events],
            }
        dispatched: dict[str, dict[str, dict[str, int]]] = {}
        for (model, region, j, variant, over), n in sorted(self.dispatched.items()):
            per = dispatched.setdefault(f"{model}/{region}", {}).setdefault(f"type {j}", {})
            per[variant] = per.get(variant, 0) + n
            if over:
                per["overflowed"] = per.get("overflowed", 0) + n
        return {"groups": groups, "dispatched": dispatched}
