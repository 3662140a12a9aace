"""The plan loop: every `spec.intervals.planSeconds`, forecast and solve for one policy.

Reads each (model, region)'s token-rate history and each model's batch deadline need from
Prometheus, the GPUs of the serving and spot pools from the Nodes, and the current pod sets;
runs the same planning cycle the simulator runs (`plan.cycle`); records the plan in the
policy's status (forecasts with β and the deadline need, targets, objective, solver time,
shortfalls) with a `PlanReady` condition, and hands the targets and forecasts to the
pacing strategy. A plan survives restarts in status: the loop plans again
only when the one recorded there is older than the interval. A `preserve` policy plans per
window instead (`controller.window_loop`), with no hourly cycle.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sageserve.api.model_deployment import ModelDeployment, pod_set_name
from sageserve.api.model_pool import ModelPool, parse_pool
from sageserve.api.scaling_policy import ScalingPolicy, spill_from_status
from sageserve.api.workload_tier import TierType
from sageserve.controller.capacity_observe import capacity_status, interactive_slos, read_windows
from sageserve.controller.fleet_kube import FleetKube
from sageserve.controller.guard import dry_run
from sageserve.controller.kube import Kube
from sageserve.controller.member_clusters import clusters_status, last_home
from sageserve.controller.pool_podsets import apply_pool_targets
from sageserve.controller.status import essence, is_refused, set_condition
from sageserve.core.labels import NodeLabels
from sageserve.core.nodes import parse_nodes, plannable_gpus
from sageserve.core.snapshot import Plan
from sageserve.core.types import EndpointKey
from sageserve.metrics import queries
from sageserve.metrics.exporter import OPERATOR_METRICS
from sageserve.metrics.prometheus import MetricsUnavailable, PodLoad, PrometheusReader
from sageserve.plan.cycle import PlanCycle, run_plan_cycle
from sageserve.plan.fleet import planned_variants
from sageserve.plan.learned_capacity import (
    CapacityKey,
    declared_theta,
    learn,
    planned_theta,
    settings_for,
)

Logger = logging.Logger | logging.LoggerAdapter[Any]


def split_batch(
    total: Mapping[tuple[str, str], Sequence[float]],
    batch: Mapping[tuple[str, str], Sequence[float]],
    step: float,
) -> tuple[dict[tuple[str, str], list[float]], dict[tuple[str, str], list[float]]]:
    """(interactive history, batch of the last hour) from all traffic and its batch part.

    Why: the forecaster predicts interactive load and β adds a share of batch load on top;
    feeding it all traffic would count batch twice. A gap in either series stays a gap.
    """
    interactive: dict[tuple[str, str], list[float]] = {}
    for key, values in total.items():
        b = batch.get(key)
        if b is None:
            interactive[key] = list(values)
            continue
        interactive[key] = [
            max(0.0, t - x) if math.isfinite(t) and math.isfinite(x) else t
            for t, x in zip(values, b, strict=False)
        ]
    last_hour = max(1, math.ceil(3600.0 / step))
    return interactive, {k: list(v[-last_hour:]) for k, v in batch.items()}


def deadline_needs(
    samples: Mapping[tuple[str, str, str], float], namespace: str, logger: Logger
) -> dict[str, float]:
    """Per model of `namespace`, the tokens/s its batch queue needs to finish every queued
    request by its deadline, as the routers export it (`queries.batch_deadline_need`): the
    plan provisions it when it is above β (`plan.batch_demand`, SageServe §6.3).

    A model without a series has no need (no queue, or no router exporting it): the plan
    is the paper's. A reading that is not a rate (NaN, ±inf, negative: a broken exporter)
    is logged and read as no need; never provisioned for."""
    out: dict[str, float] = {}
    for (ns, model, _), value in sorted(samples.items()):
        if ns != namespace or not model:
            continue
        if not (math.isfinite(value) and value >= 0):
            logger.warning(
                "batch deadline need of %s/%s is %r, not a rate: planned as no need",
                namespace,
                model,
                value,
            )
            value = 0.0
        out[model] = max(out.get(model, 0.0), value)
    return out


def gpu_capacity(
    nodes: Iterable[Mapping[str, Any]], labels: NodeLabels
) -> dict[tuple[str, str], int]:
    """GPUs per (region, GPU type) in the serving and spot pools (`core.nodes.plannable_gpus`,
    as the simulator's plan counts them)."""
    return plannable_gpus(parse_nodes(nodes, labels), labels)


def target_entries(
    planned: Mapping[tuple[str, str, str], int],
    mds: Sequence[ModelDeployment],
    current: Mapping[tuple[str, str, str], int],
) -> list[dict[str, Any]]:
    """`status.plan.targets`: each planned (model, region, variant) with its current size."""
    targets = []
    for md in mds:
        for gpu, variant in planned_variants(md).items():
            for region in md.spec.regions:
                key = (md.metadata.name, region.name, variant.name)
                if key not in planned:
                    continue
                now_n, target = current.get(key, 0), planned[key]
                targets.append(
                    {
                        "model": key[0],
                        "region": key[1],
                        "variant": key[2],
                        "gpuType": gpu,
                        "current": now_n,
                        "target": target,
                        "delta": target - now_n,
                    }
                )
    return targets


def plan_status(
    cycle: PlanCycle,
    mds: Sequence[ModelDeployment],
    current: Mapping[tuple[str, str, str], int],
    strategy: str,
    now: datetime,
) -> dict[str, Any]:
    """`status.plan` of a ScalingPolicy for one cycle (pure)."""
    result = cycle.result
    forecasts = [
        {
            "model": m,
            "region": r,
            "tokensPerSecond": round(cycle.demand_tps[(m, r)], 3),
            "batchBufferTokensPerSecond": round(cycle.batch_buffer_tps[(m, r)], 3),
            "batchDeadlineNeedTokensPerSecond": round(cycle.batch_need_tps.get((m, r), 0.0), 3),
            "expectedTokensPerSecond": round(cycle.expected_tps[(m, r)], 3),
            "instanceTokensPerSecond": round(cycle.instance_tps[EndpointKey(m, r)], 3),
            "method": fc.method,
            **({"fallbackReason": fc.fallback_reason[:1024]} if fc.fallback_reason else {}),
            **({"ignoredPoints": fc.gaps} if fc.gaps else {}),
        }
        for (m, r), fc in sorted(cycle.forecasts.items())
    ]
    targets = target_entries(cycle.targets, mds, current)
    shortfalls = [
        {"model": m, "region": r, "tokensPerSecond": round(v, 3)}
        for m, per_region in sorted(result.shortfall_tps.items())
        for r, v in sorted(per_region.items())
        if v > 0
    ]
    status: dict[str, Any] = {
        "computedAt": now.isoformat().replace("+00:00", "Z"),
        "strategy": strategy,
        "solverStatus": result.status,
        "solverSeconds": round(result.solve_seconds, 4),
        "forecasts": forecasts,
        "targets": targets,
        "shortfalls": shortfalls,
        "spillover": [
            {"model": m, "from": home, "to": to, "share": round(min(share, 1.0), 4)}
            for m, per_home in sorted(cycle.spill.items())
            for home, per_to in sorted(per_home.items())
            for to, share in sorted(per_to.items())
        ],
    }
    if result.objective is not None:
        status["objective"] = round(result.objective, 4)
    return status


def pool_expected(cycle: PlanCycle) -> dict[str, float]:
    """E[m] per pool, summed over its regions."""
    out: dict[str, float] = {}
    for t in cycle.pools:
        out[t.pool] = out.get(t.pool, 0.0) + t.expected_active
    return out


def router_batch_queries(
    window: str, namespace: str, tiers: Sequence[Mapping[str, Any]]
) -> tuple[str, str] | None:
    """(batch tokens/s served, batch tokens/s received) as `sageserve router` counts them
    for the namespace's batch tiers: the split of served load and β (10 % of the batch load
    received in the last hour, SageServe §6.3) with no PromQL from the user. None: the
    namespace has no batch tier."""
    batch = sorted(
        str(o["metadata"]["name"])
        for o in tiers
        if (o.get("spec") or {}).get("type") == TierType.BATCH.value
    )
    if not batch:
        return None
    return (
        queries.router_tokens(window, namespace, batch),
        queries.batch_received(window, namespace, batch),
    )


@dataclass(frozen=True)
class PlanHistory:
    """What a plan pass reads from Prometheus, per (model, region) on the forecaster's grid:
    interactive and batch tokens/s, batch received, and per (pool, region) each model's
    requests/s."""

    interactive: dict[tuple[str, str], list[float]]
    batch: dict[tuple[str, str], list[float]]
    received: dict[tuple[str, str], list[float]]
    pool_rates: dict[tuple[str, str], dict[str, list[float]]]


class PlanPass:
    """One planning pass for one policy."""

    def __init__(
        self, kube: Kube, body: dict[str, Any], conditions: list[dict[str, Any]], logger: Logger
    ) -> None:
        self.kube = kube
        self.body = body
        self.conditions = conditions
        self.logger = logger
        self.policy = ScalingPolicy.model_validate(essence(body))
        self.namespace = str(body["metadata"]["namespace"])

    def run(self, reader: PrometheusReader, labels: NodeLabels) -> PlanCycle | None:
        """Read → `run_plan_cycle` → write status (and pool targets); the cycle, or None
        when the fleet could not be planned."""
        spec = self.policy.spec
        mds = self.models()
        pools = [
            (o, parse_pool(o))
            for o in self.kube.objects(self.namespace, "modelpools")
            if (o.get("spec") or {}).get("policyRef", {}).get("name") == self.policy.metadata.name
        ]
        if not mds and not pools:
            return None
        history = self.read_history(reader, [pool for _, pool in pools])
        if history is None:
            return None
        pod_sets = self.kube.deployments_by_owner(self.namespace)
        current = self.sizes(mds, pod_sets)
        held, clusters = self.fleet()
        nodes = self.kube.nodes()  # every answering cluster's
        current.update(self.held_sizes(held))
        pool_current = {
            (pool.metadata.name, r.name): int(d["spec"].get("replicas") or 0)
            for _, pool in pools
            for r in pool.spec.regions
            if (
                d := pod_sets.get(pool.metadata.name, {}).get(
                    pod_set_name(pool.metadata.name, r.name, pool.spec.variant.name)
                )
            )
            is not None
        }
        cycle = run_plan_cycle(
            mds,
            spec,
            history.interactive,
            history.batch,
            current,
            gpu_capacity(nodes, labels),
            batch_received=history.received or None,
            pools=[pool for _, pool in pools],
            pool_rates=history.pool_rates,
            pool_current=pool_current,
            batch_need=self.deadline_need(reader),
            capacity_tps=self.learned_capacity(reader, mds),
            held_regions=held,
        )
        if pools:
            apply_pool_targets(
                self.kube,
                self.namespace,
                pools,
                {(t.pool, t.region): t.target for t in cycle.pools},
                pool_expected(cycle),
                self.logger,
                dry_run=dry_run(spec.dry_run),
                pods=self.kube.pods_of(self.namespace),
                loads=self.pod_loads(reader),
            )
        self.write(cycle, mds, current, clusters)
        return cycle

    def fleet(self) -> tuple[frozenset[str], list[dict[str, Any]] | None]:
        """The regions held because their cluster is silent or ambiguous, and
        `status.clusters`; nothing when the fleet is this cluster alone (`fleet_kube`).
        Sets the `Clusters` condition."""
        if not isinstance(self.kube, FleetKube):
            return frozenset(), None
        recorded = (self.body.get("status") or {}).get("clusters")
        self.kube.refresh(last_home=last_home(recorded))
        view = self.kube.view
        self.set("Clusters", *view.condition())
        return view.held_regions, clusters_status(view, self.kube.readings)

    def held_sizes(self, held: frozenset[str]) -> dict[tuple[str, str, str], int]:
        """The sizes of held regions' pod sets: a silent cluster's cannot be read, so the
        plan in force (recorded in status) stands for them."""
        recorded = recorded_plan(self.body) if held else None
        return {
            (key.model, key.region, variant): n
            for (key, variant), n in (recorded.variant_targets if recorded else {}).items()
            if key.region in held
        }

    def learned_capacity(
        self, reader: PrometheusReader, mds: Sequence[ModelDeployment]
    ) -> dict[CapacityKey, float] | None:
        """θ per (model, variant, region) learned from the fleet's windows, for the plan, when the
        policy sets `spec.capacity.learn` (`plan.learned_capacity`); each ModelDeployment's
        `status.capacity` shows declared and learned θ and the evidence. Unreadable, the
        plan keeps the declared θ (the starting point) and the log says why."""
        spec = self.policy.spec
        if not spec.capacity.learn:
            self.forget_capacity()
            return None
        if not mds:
            return None
        settings = settings_for(spec)
        slo = interactive_slos(self.kube.objects(self.namespace, "workloadtiers"))
        now = time.time()
        try:
            windows = read_windows(reader, self.namespace, slo, now, settings.history_s)
        except MetricsUnavailable as exc:
            self.logger.warning("capacity windows unread, planning with the declared θ: %s", exc)
            return None
        learned = learn(windows, declared_theta(mds), now, settings)
        stamp = datetime.fromtimestamp(now, UTC)
        for name, entries in capacity_status(learned, stamp).items():
            self.kube.patch_status(self.namespace, "modeldeployments", name, {"capacity": entries})
        return planned_theta(learned)

    def forget_capacity(self) -> None:
        """Learning off: `status.capacity` cleared where a learning policy left it, so the
        status says what the plan sizes with (the declared θ) and nothing reads a θ the
        plan no longer uses (`plan.learned_capacity.recorded_theta`)."""
        for o in self.kube.objects(self.namespace, "modeldeployments"):
            ref = ((o.get("spec") or {}).get("policyRef") or {}).get("name")
            if ref == self.policy.metadata.name and (o.get("status") or {}).get("capacity"):
                name = str(o["metadata"]["name"])
                self.kube.patch_status(self.namespace, "modeldeployments", name, {"capacity": None})

    def pod_loads(self, reader: PrometheusReader) -> dict[str, PodLoad]:
        """Each pod's load for choosing which pooled pods a scale-in removes; none when
        Prometheus does not answer (the ReplicaSet then chooses, as without sageserve)."""
        try:
            return reader.pod_loads(self.namespace)
        except MetricsUnavailable as exc:
            self.logger.info("pod loads unreadable (%s); a pool scale-in drains any pod", exc)
            return {}

    def read_history(
        self, reader: PrometheusReader, pools: Sequence[ModelPool]
    ) -> PlanHistory | None:
        """The forecaster's history from Prometheus, per (model, region) of this namespace
        on its grid: tokens/s (interactive and batch apart), batch received, each pool's
        requests per model; None, with `PlanReady` saying why, when Prometheus is away."""
        spec = self.policy.spec
        step = float(spec.forecast.granularity_seconds)
        window = f"{max(int(step), 60)}s"

        def read(expr: str) -> dict[tuple[str, str], list[float]]:
            seconds = float(spec.forecast.training_window_seconds)
            got = reader.history(expr, end=time.time(), seconds=seconds, step=step)
            return {(m, r): v for (ns, m, r), v in got.items() if ns == self.namespace}

        try:
            per_endpoint = read(queries.tokens_per_second(window, self.namespace))
            from_router = router_batch_queries(
                window, self.namespace, self.kube.objects(self.namespace, "workloadtiers")
            )
            batch_query, received_query = (
                (spec.forecast.batch_tokens_query, None)
                if spec.forecast.batch_tokens_query
                else from_router or (None, None)
            )
            batch = read(batch_query) if batch_query else {}
            received = read(received_query) if received_query else {}
            pool_rates = {
                (pool.metadata.name, r.name): {
                    m: v
                    for (m, region), v in read(
                        queries.pool_requests(window, self.namespace, pool.metadata.name)
                    ).items()
                    if region == r.name
                }
                for pool in pools
                for r in pool.spec.regions
            }
        except MetricsUnavailable as exc:
            self.set("PlanReady", False, "PrometheusUnreachable", f"no plan this interval: {exc}")
            return None
        if batch:
            per_endpoint, batch = split_batch(per_endpoint, batch, step)
        received = split_batch({}, received, step)[1]
        return PlanHistory(per_endpoint, batch, received, pool_rates)

    def write(
        self,
        cycle: PlanCycle,
        mds: Sequence[ModelDeployment],
        current: Mapping[tuple[str, str, str], int],
        clusters: list[dict[str, Any]] | None = None,
    ) -> None:
        """`status.plan` and the `PlanReady` condition that describes it in one write (a
        reader, a user's `kubectl get -o yaml` or a GitOps diff, never sees a plan without
        its condition), the plan's metrics, and an Event when the condition moved."""
        spec = self.policy.spec
        status = plan_status(cycle, mds, current, spec.strategy.value, datetime.now(UTC))
        OPERATOR_METRICS.record_plan(self.namespace, status, spec.optimizer.solver.value)
        result = cycle.result
        if result.status == "infeasible":
            condition = ("PlanReady", False, "Infeasible", result.reason or "no plan exists")
        elif result.status == "shortfall":
            unmet = ", ".join(
                f"{s['model']}/{s['region']} {s['tokensPerSecond']:.0f} tok/s"
                for s in status["shortfalls"]
            )
            condition = (
                "PlanReady",
                True,
                "Shortfall",
                f"demand above what GPUs and maxInstances allow; unmet: {unmet}",
            )
        else:
            condition = (
                "PlanReady",
                True,
                "Planned",
                f"{result.status} in {result.solve_seconds:.2f}s",
            )
        event = self.condition(*condition)
        self.kube.patch_status(
            self.namespace,
            "scalingpolicies",
            self.policy.metadata.name,
            {
                "plan": status,
                "conditions": self.conditions,
                **({"clusters": clusters} if clusters is not None else {}),
            },
        )
        if event is not None:
            self.kube.event(self.body, *event)

    def deadline_need(self, reader: PrometheusReader) -> dict[str, float]:
        """The batch deadline need per model (`deadline_needs`). Unreadable, the cycle
        plans with β alone, as the paper does, and says so in the log: the need only ever
        adds capacity, so missing it is never worse than the paper's plan."""
        try:
            samples = reader.instant(queries.batch_deadline_need(self.namespace))
        except MetricsUnavailable as exc:
            self.logger.warning("batch deadline need unread, planning with β alone: %s", exc)
            return {}
        return deadline_needs(samples, self.namespace, self.logger)

    def models(self) -> list[ModelDeployment]:
        """The ModelDeployments of the namespace this policy sizes, but those the operator
        found it cannot act on (`Ready=False`: no node fits, minInstances beyond the
        region's GPUs, a GPU type no node offers; each says why in its own condition):
        planning one would reserve GPUs for pod sets that do not exist, and its floors
        alone can make every other model's plan infeasible. One not reconciled yet (no
        `Ready` condition, as right after the operator starts) is planned: its pod sets are
        on their way, and the next plan may be an hour off."""
        return [
            ModelDeployment.model_validate(essence(o))
            for o in self.kube.objects(self.namespace, "modeldeployments")
            if (o.get("spec") or {}).get("policyRef", {}).get("name") == self.policy.metadata.name
            and not is_refused(o)
        ]

    @staticmethod
    def sizes(
        mds: Sequence[ModelDeployment], pod_sets: Mapping[str, Mapping[str, Any]]
    ) -> dict[tuple[str, str, str], int]:
        """Replicas of each (model, region, variant) pod set that exists."""
        current: dict[tuple[str, str, str], int] = {}
        for md in mds:
            deployments = pod_sets.get(md.metadata.name, {})
            for region in md.spec.regions:
                for variant in md.spec.variants:
                    d = deployments.get(pod_set_name(md.metadata.name, region.name, variant.name))
                    if d is not None:
                        current[(md.metadata.name, region.name, variant.name)] = int(
                            d["spec"].get("replicas") or 0
                        )
        return current

    def condition(
        self, type_: str, ok: bool, reason: str, message: str
    ) -> tuple[str, str, str] | None:
        """Set a condition in `self.conditions` (written by the caller); the Event to post
        (type, reason, message) when its status or reason changed, else None."""
        before = {c["type"]: (c["status"], c["reason"]) for c in self.conditions}
        self.conditions[:] = set_condition(
            self.conditions,
            type_,
            ok,
            reason,
            message,
            datetime.now(UTC),
            self.body["metadata"].get("generation"),
        )
        if before.get(type_) == ("True" if ok else "False", reason):
            return None
        # a plan with a shortfall is made (True) but asks for attention
        return ("Normal" if ok and reason != "Shortfall" else "Warning", reason, message)

    def set(self, type_: str, ok: bool, reason: str, message: str) -> None:
        """Set a condition, and write it and post an Event when it changes."""
        event = self.condition(type_, ok, reason, message)
        if event is not None:
            self.kube.event(self.body, *event)
            self.kube.patch_status(
                self.namespace,
                "scalingpolicies",
                self.policy.metadata.name,
                {"conditions": self.conditions},
            )


def recorded_plan(body: Mapping[str, Any]) -> Plan | None:
    """The plan in status, if any, as the decision step follows it (a restarted operator
    keeps the plan in force instead of solving again)."""
    plan = ((body.get("status") or {}).get("plan")) or None
    if not plan:
        return None
    try:
        at = datetime.fromisoformat(plan["computedAt"].replace("Z", "+00:00")).timestamp()
    except (KeyError, ValueError):
        return None
    targets = {
        (EndpointKey(t["model"], t["region"]), str(t["variant"])): int(t["target"])
        for t in plan.get("targets", [])
    }
    forecasts = {  # LT-UA's yardstick; plans recorded before it existed have the peak only
        EndpointKey(f["model"], f["region"]): float(
            f.get("expectedTokensPerSecond", f["tokensPerSecond"])
        )
        for f in plan.get("forecasts", [])
    }
    per_instance = {
        EndpointKey(f["model"], f["region"]): float(f["instanceTokensPerSecond"])
        for f in plan.get("forecasts", [])
        if f.get("instanceTokensPerSecond")
    }
    return Plan(at, targets, forecasts, per_instance, spill_from_status(plan))


def prometheus_reader(deadline: float | None = None) -> PrometheusReader:
    """The Prometheus the operator reads, configured by the environment the chart sets.

    SAGESERVE_PROMETHEUS_URL; optional SAGESERVE_PROMETHEUS_BEARER_TOKEN_FILE, or
    SAGESERVE_PROMETHEUS_USERNAME with SAGESERVE_PROMETHEUS_PASSWORD_FILE; and
    SAGESERVE_PROMETHEUS_INSECURE=true to skip TLS verification. Files are read on every
    pass so that rotated credentials are picked up. Every read is done by `deadline`
    (monotonic seconds) or given up (`MetricsTooSlow`).
    """
    env = os.environ
    token_file = env.get("SAGESERVE_PROMETHEUS_BEARER_TOKEN_FILE")
    password_file = env.get("SAGESERVE_PROMETHEUS_PASSWORD_FILE")
    username = env.get("SAGESERVE_PROMETHEUS_USERNAME")
    return PrometheusReader(
        env.get("SAGESERVE_PROMETHEUS_URL", "http://127.0.0.1:9090"),
        bearer_token=Path(token_file).read_text().strip() if token_file else None,
        basic_auth=(username, Path(password_file).read_text().strip())
        if username and password_file
        else None,
        verify_tls=env.get("SAGESERVE_PROMETHEUS_INSECURE", "false").lower() != "true",
        deadline=deadline,
    )
