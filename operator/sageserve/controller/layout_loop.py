"""The layout loop: OServe's layouts on Kubernetes (OServe §4.2, §4.3, §5.1, §5.2).

For a policy with `spec.layouts`, per (ModelDeployment, region, GPU type) whose
ModelDeployment lists two or more variants of that GPU type, every `replanSeconds`:

1. reads the requests the routers answered per log-2 (prompt, output) bucket over
   `historySeconds` (`PrometheusReader.request_shapes`) and turns them into request types
   and rates (`plan.oserve_layouts.mix_from_buckets`: the types of a measured capacity
   table when the ModelDeployment names one, else weighted k-means, OServe §5.1);
2. takes n per (variant, type): measured (the ConfigMap the annotation
   `sageserve.io/type-capacity` names, key `type-capacity.yaml`, the file of `sageserve
   calibrate --by-type`) or analytical (`perf/capacity.py` on the variant's (TP, PP)
   profile);
3. the GPU budget: the plan in force's instances of those variants × their GPUs when a plan
   covers the (model, region), else the GPUs their pod sets hold now
   (`plan.oserve_layouts.budget_gpus`);
4. runs `plan.layout_switch.replan` (Algorithm 1 restricted to the declared variants, then
   gain against cost and the `SwitchGate`'s hysteresis) from the layout in force, over the
   horizon cut into windows: with `spec.layouts.forecast: policy` (the default) each type's
   per-step rate (`PrometheusReader.request_shape_series`, summed per type) forecast with
   the policy's forecaster (`plan.oserve_layouts.forecast_windows`), with `persist` the
   measured rates for `historySeconds`; the budget moving (a new plan) is followed without
   the gate: the plan already chose the size;
5. executes a switch make-before-break: `plan_switch` with the GPUs free on the region's
   nodes of that type as headroom, stepped every pace pass by `switch_targets` as the
   started pods become Ready, so old pods go only once the new ones serve;
6. publishes `status.layouts` (only that field: the plan loop owns `status.plan`): replicas
   per variant, the types with their rates and the assignment's per-variant weights (§4.2),
   and a message naming the last decision; an Event on each switch.

The layout in force becomes the targets of those variants (`with_layouts` over the plan in
force, in `PacePass.run`), which the decision step moves per variant. What this loop keeps
in memory (the gate's streak, a switch in progress) is lost on restart: the next pass
re-plans from the pod sets' replicas (a half-done switch then finishes as a resize).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from sageserve.api.model_deployment import ModelDeployment, pod_set_name
from sageserve.api.scaling_policy import LayoutForecast, Layouts, ScalingPolicy
from sageserve.controller.kube import Kube
from sageserve.controller.spot import pod_gpus
from sageserve.controller.status import essence, is_ready, set_condition
from sageserve.core.labels import LABEL_DEPLOYMENT, LABEL_REGION, LABEL_VARIANT, NodeLabels
from sageserve.core.nodes import parse_nodes
from sageserve.core.snapshot import Plan
from sageserve.metrics.exporter import OPERATOR_METRICS
from sageserve.metrics.prometheus import MetricsUnavailable, PrometheusReader
from sageserve.perf.model import PerfCatalog, load_catalog
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
from sageserve.plan.layout_search import (
    Strategy,
)
from sageserve.plan.layout_step import replan_layout
from sageserve.plan.layout_switch import Window
from sageserve.plan.oserve_layouts import (
    TYPE_CAPACITY_ANNOTATION,
    LayoutGroup,
    LayoutTargets,
    MeasuredCapacity,
    Mix,
    analytical_capacity,
    forecast_windows,
    layout_forecast_spec,
    layout_groups,
    layout_history_seconds,
    measured_capacity,
    mix_from_buckets,
    type_series,
)

Logger = logging.Logger | logging.LoggerAdapter[Any]
_CATALOG: list[PerfCatalog] = []


def catalog() -> PerfCatalog:
    """The bundled perf profiles, read once per process."""
    if not _CATALOG:
        _CATALOG.append(load_catalog())
    return _CATALOG[0]


@dataclass
class LayoutState:
    """The layout loop's memory for one policy (lost on restart, see the module doc)."""

    next_replan: float = 0.0
    groups: dict[GroupKey, GroupState] = field(default_factory=dict)
    changed_at: float = 0.0
    written: list[dict[str, Any]] | None = None
    #: errors already posted as Events, so one broken object is one Event
    reported: set[str] = field(default_factory=set)

    def targets(self) -> LayoutTargets:
        """The layouts in force as the decision step's targets (`managed_targets`)."""
        return managed_targets(self.groups, self.changed_at)


def ready_per_variant(pods: Sequence[Mapping[str, Any]], model: str, region: str) -> dict[str, int]:
    """Ready (not terminating) pods of each variant of one (model, region)."""
    out: dict[str, int] = {}
    for pod in pods:
        labels = (pod.get("metadata") or {}).get("labels") or {}
        if labels.get(LABEL_DEPLOYMENT) != model or labels.get(LABEL_REGION) != region:
            continue
        if is_ready(pod) and not (pod.get("metadata") or {}).get("deletionTimestamp"):
            v = str(labels.get(LABEL_VARIANT))
            out[v] = out.get(v, 0) + 1
    return out


def free_gpus(
    nodes: Sequence[Mapping[str, Any]],
    pods: Sequence[Mapping[str, Any]],
    labels: NodeLabels,
    region: str,
    gpu_type: str,
    spot: bool = False,
) -> tuple[int, int]:
    """(GPUs free, node size) of `gpu_type` in `region`'s serving pool (and its spot pool
    when `spot`: the pace loop reclaims a spot node for pods that cannot be scheduled): node
    GPUs less those the pods bound to those nodes request (terminated pods hold none). The
    headroom a switch may start its new pods on before the old ones stop."""
    pools = {labels.serving_pool, labels.spot_pool} if spot else {labels.serving_pool}
    mine = {
        n.name: n
        for n in parse_nodes(nodes, labels)
        if n.region == region and n.gpu_type == gpu_type and n.pool in pools
    }
    used = 0
    for pod in pods:
        if (pod.get("spec") or {}).get("nodeName") not in mine:
            continue
        if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            continue
        used += pod_gpus(pod)
    size = max((n.gpus for n in mine.values()), default=8)
    return max(0, sum(n.gpus for n in mine.values() if n.ready) - used), size


def layout_entry(
    group: LayoutGroup, region: str, g: GroupState, weights: list[dict[str, float]]
) -> dict[str, Any]:
    """One `status.layouts` entry (pure)."""
    at = datetime.fromtimestamp(g.computed_at or time.time(), UTC)
    return {
        "model": group.model,
        "region": region,
        "gpuType": group.gpu_type,
        "computedAt": at.isoformat().replace("+00:00", "Z"),
        "replicas": [
            {"variant": v.name, "replicas": g.targets.get(v.name, 0)} for v in group.variants
        ],
        "types": published_types(g.mix, weights),
        "message": g.message[:2048],
    }


class LayoutPass:
    """One pass of the layout loop for one policy (see the module doc). Every pace pass
    steps the switches in progress; a re-plan runs every `replanSeconds`."""

    def __init__(
        self,
        kube: Kube,
        body: dict[str, Any],
        state: LayoutState,
        conditions: list[dict[str, Any]],
        logger: Logger,
    ) -> None:
        self.kube = kube
        self.body = body
        self.state = state
        self.conditions = conditions
        self.logger = logger
        self.policy = ScalingPolicy.model_validate(essence(body))
        self.namespace = str(body["metadata"]["namespace"])
        self.problems: list[str] = []
        self._cluster: tuple[list[dict[str, Any]], list[dict[str, Any]]] | None = None
        self.settings: Layouts = Layouts()
        self.plan: Plan | None = None
        self.reader: PrometheusReader | None = None
        self.now = 0.0
        self.due = False
        self.pod_sets: dict[str, dict[str, dict[str, Any]]] = {}
        self.pods: list[dict[str, Any]] = []

    def run(self, reader: PrometheusReader | None, plan: Plan | None, now: float) -> bool:
        """Step switches, re-plan when due, write status. Returns whether the targets
        changed (the pace pass then moves pod sets at once)."""
        settings = self.policy.spec.layouts
        if settings is None:
            changed = bool(self.state.groups)
            self.state.groups.clear()
            return changed
        mds = [
            (raw, ModelDeployment.model_validate(essence(raw)))
            for raw in self.kube.objects(self.namespace, "modeldeployments")
            if (raw.get("spec") or {}).get("policyRef", {}).get("name") == self.policy.metadata.name
        ]
        self.settings, self.plan, self.reader, self.now = settings, plan, reader, now
        self.due = now >= self.state.next_replan and reader is not None
        if self.due:
            self.state.next_replan = now + float(settings.replan_seconds)
        self.pod_sets = self.kube.deployments_by_owner(self.namespace)
        self.pods = self.kube.pods_of(self.namespace)
        before = self.state.targets().targets
        seen: set[GroupKey] = set()
        entries: list[dict[str, Any]] = []
        for raw, md in mds:
            if not is_ready(raw):  # as the pace pass: its pod sets may not exist yet
                seen |= {k for k in self.state.groups if k[0] == md.metadata.name}
                entries += [
                    e for e in (self.state.written or []) if e.get("model") == md.metadata.name
                ]
                continue
            try:
                groups = layout_groups(md)
                measured = self.measured(md, groups) if groups else None
            except ValueError as exc:
                self.problem(raw, f"ModelDeployment {md.metadata.name}: {exc}")
                seen |= {k for k in self.state.groups if k[0] == md.metadata.name}
                entries += [
                    e for e in (self.state.written or []) if e.get("model") == md.metadata.name
                ]
                continue
            for group in groups:
                for region in md.spec.regions:
                    seen.add((md.metadata.name, region.name, group.gpu_type))
                    entries.append(self.group_pass(raw, md, group, region.name, measured))
        for gone in set(self.state.groups) - seen:
            self.state.groups.pop(gone, None)
        changed = self.state.targets().targets != before
        if changed:
            self.state.changed_at = now
        self.write(entries)
        self.report()
        return changed

    def group_pass(
        self,
        raw: dict[str, Any],
        md: ModelDeployment,
        group: LayoutGroup,
        region: str,
        measured: MeasuredCapacity | None,
    ) -> dict[str, Any]:
        """Step, and when due re-plan, one (model, region, GPU type); its status entry."""
        name = md.metadata.name
        g = self.state.groups.setdefault((name, region, group.gpu_type), GroupState())
        sets = self.pod_sets.get(name, {})
        found = {v.name: sets.get(pod_set_name(name, region, v.name)) for v in group.variants}
        if any(d is None for d in found.values()):
            g.message = "waiting for the pod sets of every variant"
            return self.entry(group, region, g)
        replicas = {
            v: int((d or {}).get("spec", {}).get("replicas") or 0) for v, d in found.items()
        }
        take_in_force(g, group, replicas)
        ready = ready_per_variant(self.pods, name, region)
        self.step(raw, group, g, ready)
        if self.due and g.switch is None:
            try:
                self.replan(raw, md, group, region, g, replicas, measured)
            except MetricsUnavailable as exc:
                g.message = f"layout kept: Prometheus did not answer: {exc}"
            except ValueError as exc:
                self.problem(raw, f"ModelDeployment {name}: {exc}")
                g.message = f"layout kept: {exc}"
            self.step(raw, group, g, ready)
        return self.entry(group, region, g)

    def cluster(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """Nodes and every pod of the cluster (the free GPUs), listed once per pass."""
        if self._cluster is None:
            self._cluster = (self.kube.nodes(), self.kube.pods())
        return self._cluster

    # ---- inputs ---------------------------------------------------------------------------

    def measured(self, md: ModelDeployment, groups: list[LayoutGroup]) -> MeasuredCapacity | None:
        """The measured table the ModelDeployment names, None when it names none; ValueError
        naming the ConfigMap, the key and the fix when it is missing or broken."""
        name = md.metadata.annotations.get(TYPE_CAPACITY_ANNOTATION)
        if not name:
            return None
        data = self.kube.config_map_data(self.namespace, name)
        return measured_capacity(md, groups, self.namespace, data)

    def capacity(
        self,
        md: ModelDeployment,
        group: LayoutGroup,
        measured: MeasuredCapacity | None,
        centroids: Sequence[tuple[float, float]],
        node_gpus: int,
    ) -> dict[Strategy, tuple[float, ...]]:
        if measured is not None and measured.gpu_type == group.gpu_type:
            return measured.rows(group)
        return analytical_capacity(catalog(), md, group, centroids, node_gpus)

    # ---- decisions ------------------------------------------------------------------------

    def replan(
        self,
        raw: dict[str, Any],
        md: ModelDeployment,
        group: LayoutGroup,
        region: str,
        g: GroupState,
        replicas: Mapping[str, int],
        measured: MeasuredCapacity | None,
    ) -> None:
        """One re-plan of one (model, region, GPU type): observe, `replan_layout`, apply."""
        reader, settings, plan, now = self.reader, self.settings, self.plan, self.now
        assert reader is not None
        labels = NodeLabels.from_env(os.environ)
        spare, node_gpus = free_gpus(
            *self.cluster(), labels, region, group.gpu_type, self.policy.spec.spot.enabled
        )
        history = int(settings.history_seconds)
        counts = reader.request_shapes(self.namespace, md.metadata.name, region, history)
        table = measured if measured is not None and measured.gpu_type == group.gpu_type else None
        mix = mix_from_buckets(
            counts,
            float(history),
            k=settings.types,
            centroids=table.centroids if table is not None else None,
        )
        # held: the layout in force, which the pod sets follow (their spec.replicas lag a
        # pace pass behind a switch's last step)
        obs = observation(g, group, region, plan, replicas, spare, now, float(history))
        if mix is not None:
            rows = self.capacity(md, group, table, mix.centroids, node_gpus)
            obs, needs_windows = with_mix(g, obs, mix, rows, node_gpus)
            if needs_windows:  # only the gate reads the horizon
                windows, outlook = self.windows(md, region, mix)
                obs = replace(obs, windows=tuple(windows), outlook=outlook)
        outcome = replan_layout(obs, g.memory, layout_settings(settings))
        if not begin(g, outcome, now):
            return
        self.kube.event(raw, "Normal", "LayoutSwitch", g.message)
        OPERATOR_METRICS.layout_switches.labels(
            self.namespace, group.model, region, group.gpu_type
        ).inc()
        self.logger.info("%s: %s", group.model, g.message)

    def windows(
        self,
        md: ModelDeployment,
        region: str,
        mix: Mix,
    ) -> tuple[list[Window], str]:
        """The re-plan's horizon as forecast windows, and a line for the status message.

        `spec.layouts.forecast: persist`: one window of `historySeconds` at the measured
        rates. `policy` (the default): the buckets' per-step rates over the history
        (`request_shape_series`, at `spec.forecast.granularitySeconds`, as long as the
        policy's forecaster needs) summed per type of `mix` (its centroids: the same types)
        and each forecast over the horizon in `replanSeconds` windows
        (`plan.oserve_layouts.forecast_windows`); a type the forecaster cannot fit keeps its
        measured rate, and so does every type when Prometheus does not answer the range
        query (the message says which)."""
        settings, reader = self.settings, self.reader
        assert reader is not None
        history = float(settings.history_seconds)
        persisted = [Window(history, mix.rates)]
        if settings.forecast == LayoutForecast.PERSIST:
            return persisted, ""
        policy = self.policy.spec
        spec = layout_forecast_spec(policy, history)
        seconds = layout_history_seconds(policy, history)
        try:
            series = reader.request_shape_series(
                self.namespace, md.metadata.name, region, seconds, spec.step_seconds
            )
        except MetricsUnavailable as exc:
            return persisted, f"no per-type forecast ({exc}): the measured rates persist"
        per_type = type_series(series, mix.centroids)
        fc = forecast_windows(
            per_type, mix.rates, spec, policy.forecast.method.value, float(settings.replan_seconds)
        )
        return list(fc.windows), fc.summary(mix.rates)

    def step(
        self, raw: dict[str, Any], group: LayoutGroup, g: GroupState, ready: Mapping[str, int]
    ) -> None:
        """Advance a switch in progress as its started pods become Ready (`step_switch`);
        a switch whose new pods did not serve in time is abandoned: what serves is kept, a
        Warning names the variants that did not come up and where to look, and the target
        is not proposed again for an hour."""
        since = g.switch_since
        adv = advance(g, group, self.now, ready, layout_settings(self.settings))
        if adv.abandoned:
            g.message = abandoned_message(g, adv, self.now, since)
            self.kube.event(raw, "Warning", "LayoutSwitchAbandoned", g.message)
            self.logger.warning("%s: %s", group.model, g.message)
        elif adv.finished:
            g.message = finished_message(g, adv, ready)
            self.kube.event(raw, "Normal", "LayoutSwitched", g.message)

    # ---- output ---------------------------------------------------------------------------

    def entry(self, group: LayoutGroup, region: str, g: GroupState) -> dict[str, Any]:
        for variant, n in g.targets.items():
            OPERATOR_METRICS.layout_replicas.labels(
                self.namespace, group.model, region, variant
            ).set(n)
        weights: list[dict[str, float]] = []
        try:
            weights = group_weights(group, g)
        except (RuntimeError, ValueError) as exc:  # the LP failed: no weights
            self.logger.warning("layout weights of %s: %s", group.model, exc)
        return layout_entry(group, region, g, weights)

    def write(self, entries: list[dict[str, Any]]) -> None:
        """Patch `status.layouts` when an entry changed (times aside)."""

        def essence(es: list[dict[str, Any]]) -> list[dict[str, Any]]:
            return [{k: v for k, v in e.items() if k != "computedAt"} for e in es]

        if self.state.written is not None and essence(self.state.written) == essence(entries):
            return
        self.kube.patch_status(
            self.namespace, "scalingpolicies", self.policy.metadata.name, {"layouts": entries}
        )
        self.state.written = entries

    def problem(self, raw: dict[str, Any], message: str) -> None:
        self.problems.append(message)
        if message not in self.state.reported:
            self.state.reported.add(message)
            self.kube.event(raw, "Warning", "LayoutInvalid", message)

    def report(self) -> None:
        """The `LayoutsReady` condition: False naming each problem (the layouts in force
        kept), True otherwise."""
        if self.problems:
            ok, reason = False, "LayoutInvalid"
            message = "; ".join(self.problems) + "; the layouts in force are kept"
        else:
            ok, reason = True, "Planned"
            message = f"{len(self.state.groups)} layout(s) of variants side by side"
            self.state.reported.clear()
        before = [dict(c) for c in self.conditions]
        self.conditions[:] = set_condition(
            self.conditions,
            "LayoutsReady",
            ok,
            reason,
            message[:1024],
            datetime.now(UTC),
            self.body["metadata"].get("generation"),
        )
        old = next((c for c in before if c["type"] == "LayoutsReady"), None)
        if old is None or (old["status"], old["reason"], old.get("message")) != (
            "True" if ok else "False",
            reason,
            message[:1024],
        ):
            self.kube.patch_status(
                self.namespace,
                "scalingpolicies",
                self.policy.metadata.name,
                {"conditions": self.conditions},
            )
