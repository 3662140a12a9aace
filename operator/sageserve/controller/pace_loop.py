"""The pace loop: every ScalingPolicy's fleets move as its strategy decides.

One background thread of the operator (not a kopf daemon per object: kopf puts a finalizer
on objects with daemons or timers, and then a namespace cannot be deleted while the
operator is down). For each policy, every `spec.intervals.paceSeconds` it reads
utilisation and token rates from Prometheus, asks the policy's strategy (the same objects
the simulator drives) for actions, and sets replicas. Failure behaviour (DESIGN.md):
Prometheus unreachable, slower than one pace interval, or a region's series missing →
hold every affected size, `Degraded=True` with the reason, one Event per transition; some
pods of an endpoint silent → no scale-in there, `Degraded=True/MetricsPartial` naming it
and how many pods report. The pass reads from Prometheus on the loop's own thread, one
query at a time, each bounded by what is left of the pace interval: a slow Prometheus
costs one pass at most one interval, and queries never pile up. `dryRun` decides and reports
(Events) without changing replicas. Around the pod sets (`controller.guard`): a pod set
someone else sizes is held (`Conflict`), no scale-in goes where an earlier one is stuck
(`TerminationStuck`), instances nothing can place are reported (`CapacityShortfall`),
pods on a lost node are not serving and are evicted after a bound (`NodeLost` Events), a
spot reclaim a PodDisruptionBudget refuses is given up after a bound (`ReclaimBlocked`).
Each ModelDeployment whose batch queue needs more than its regions serve at maxInstances
gets `BatchDeadlinesAtRisk=True` (`controller.deadlines`), its endpoints having been
scaled for that need as far as they go (the deadline signal, `pace.pressure`). Under
`actuation: keda` the pass decides the same, but records the decisions for the operator's
KEDA scaler instead of writing replicas, and keeps one ScaledObject per pod set
(`controller.actuation`, docs/keda.md).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any, TypeVar

from sageserve.api.model_deployment import (
    ModelDeployment,
    inference_pool_name,
    pod_set_name,
)
from sageserve.api.model_pool import ModelPool, parse_pool
from sageserve.api.scaling_policy import Actuation, ForecastMethod, ScalingPolicy, Strategy
from sageserve.controller import deadlines
from sageserve.controller.actuation import CONDITION as ACTUATION
from sageserve.controller.actuation import (
    Actuator,
    Managed,
    deadline_pressure,
    desired_pod_sets,
)
from sageserve.controller.faults import lost_pods
from sageserve.controller.fleet_kube import FleetKube, fleet_of
from sageserve.controller.guard import FaultReport, Guard, dry_run, report_after_s
from sageserve.controller.kube import Kube, ReplicasMoved, kube
from sageserve.controller.layout_loop import LayoutPass, LayoutState
from sageserve.controller.leader import LeaderElection, identity
from sageserve.controller.member_clusters import clusters_status, last_home
from sageserve.controller.observe import endpoint_snapshots, interactive_ttft_slo, pod_set_changes
from sageserve.controller.plan_loop import PlanPass, prometheus_reader, recorded_plan
from sageserve.controller.semantics import SemanticProblem, node_shapes, policy_problems
from sageserve.controller.spot import SpotPass
from sageserve.controller.status import essence, is_ready, set_condition
from sageserve.controller.window_loop import WindowPass
from sageserve.core.labels import (
    ANNOTATION_DELETION_COST,
    DRAIN_DELETION_COST,
    LABEL_DEPLOYMENT,
    NodeLabels,
)
from sageserve.core.nodes import not_ready_since
from sageserve.core.snapshot import Decision, EndpointSnapshot, PickerSignals, Plan, Snapshot
from sageserve.core.types import ActionKind, EndpointKey
from sageserve.forecast.realised import REALISED_ONLY_IN_SIMULATION
from sageserve.keda.scaler import BOARD, DecisionBoard
from sageserve.metrics.engines import engine
from sageserve.metrics.exporter import OPERATOR_METRICS
from sageserve.metrics.picker import PICKERS, PickerKind
from sageserve.metrics.prometheus import (
    MetricsTooSlow,
    MetricsUnavailable,
    PodLoad,
    Series,
    TierTtft,
)
from sageserve.pace.base import PacingStrategy, PlanSource, simulation_only
from sageserve.pace.cadence import PlanClock, PlanMove, plan_step
from sageserve.pace.from_policy import strategy_for
from sageserve.pace.step import Held, StepState, decide
from sageserve.plan.learned_capacity import deadline_theta
from sageserve.plan.oserve_layouts import with_layouts

Logger = logging.Logger | logging.LoggerAdapter[Any]
#: Every Prometheus read of one plan, window or layout pass is done within this many seconds
#: or the pass gives up (`MetricsTooSlow`; the plan in force is kept, the pass says so in
#: `PlanReady`). Why: one thread paces every policy, and a struggling Prometheus answering
#: each of a plan's tens of queries just inside the reader's timeout held pacing for
#: minutes; a plan's reads take a few seconds on a healthy one.
PLAN_READ_SECONDS = float(os.environ.get("SAGESERVE_PLAN_READ_SECONDS", "120"))
#: The leader renews its Lease this often (a third of the Lease's 15 s duration).
LEASE_RENEW_SECONDS = 5.0
#: Scale calls (and their Events) of one pass in flight at once. Each waits ~10-30 ms on
#: the API server; one after another, a plan that moves 600 endpoints took 20 s to apply.
WRITERS = int(os.environ.get("SAGESERVE_WRITERS", "8"))
T = TypeVar("T")
R = TypeVar("R")
#: Condition types that are bad when True (the others, Ready and PlanReady, when False).
ABNORMAL_WHEN_TRUE = frozenset(
    {"Degraded", "Conflict", "TerminationStuck", "CapacityShortfall", "ReclaimBlocked"}
)


def node_lost_s() -> float:
    """Pods on a node that is not Ready are evicted (to be replaced) once it has been lost
    this long (SAGESERVE_NODE_LOST_SECONDS, 60 s; Kubernetes' own default is 300 s)."""
    return float(os.environ.get("SAGESERVE_NODE_LOST_SECONDS", "60"))


def concurrently(fn: Callable[[T], R], items: list[T]) -> list[R]:
    """`fn` over `items` with up to WRITERS API writes in flight, results in order."""
    if len(items) > 1 and WRITERS > 1:
        with ThreadPoolExecutor(min(WRITERS, len(items))) as pool:
            return list(pool.map(fn, items))
    return [fn(item) for item in items]


@dataclass
class PaceState:
    """What one policy's loop keeps between passes: the decision step's state (plan in
    force, cooldowns), the newest plan and when the next one is due, and the conditions."""

    step: StepState = field(default_factory=StepState)
    conditions: list[dict[str, Any]] = field(default_factory=list)
    #: The newest plan (made here or restored from status); `decide` adopts it.
    plan: Plan | None = None
    #: when the next plan is due (`pace.cadence.plan_step`, as in the simulator)
    plan_clock: PlanClock = field(default_factory=PlanClock)
    donated_nodes: int | None = None
    #: faults already posted as Events (`controller.guard.FaultReport`)
    faults_seen: set[str] = field(default_factory=set)
    #: OServe layouts in force and the layout loop's memory (`controller.layout_loop`)
    layouts: LayoutState = field(default_factory=LayoutState)
    #: per ModelDeployment, the batch deadline outlook its `BatchDeadlinesAtRisk` says
    #: (`controller.deadlines.report`)
    deadline_outlooks: dict[str, deadlines.DeadlineOutlook] = field(default_factory=dict)


def degraded(
    held: list[Held], expected: Mapping[EndpointKey, str] | None = None
) -> tuple[bool, str, str]:
    """The `Degraded` condition (status, reason, message) for the endpoints the step held
    for lack of data: `MetricsPartial` when each of them has some pods reporting (only
    scale-in is held), `MetricsMissing` when one has none, naming the series its engine
    was expected to export (`expected`, `metrics.engines`) so a wrong `spec.engine.kind`
    or scrape path shows."""
    if not held:
        return False, "MetricsAvailable", "every pod set reports its load"
    parts = []
    for h in held:
        where = f"{h.key.model}/{h.key.region}"
        if h.partial:
            at = datetime.fromtimestamp(h.since or 0.0, UTC).strftime("%H:%M:%SZ")
            parts.append(f"{where}: {h.reporting} of {h.serving} pods reporting since {at}")
        else:
            series = (expected or {}).get(h.key)
            hint = f" (no {series})" if series else ""
            parts.append(f"{where}: none of {h.serving} pods reports its load{hint}")
    if all(h.partial for h in held):
        return True, "MetricsPartial", "no scale-in at " + "; ".join(parts)
    return True, "MetricsMissing", "holding " + "; ".join(parts)


@dataclass(frozen=True)
class PaceSamples:
    """What one pace pass reads from Prometheus (`PrometheusReader`)."""

    tokens_per_s: Series
    loads: dict[str, PodLoad]
    held_requests: Series
    deadline_needs: dict[str, float]
    projections: dict[str, tuple[float, ...]]
    #: each interactive tier's TTFT over the last minute, per endpoint (the routers')
    ttft: dict[tuple[str, str, str], TierTtft] = field(default_factory=dict)
    #: each pod's interactive requests in flight (the routers'), None unless the strategy
    #: reads Chiron's interactive backpressure
    interactive: dict[str, int] | None = None
    #: what the endpoint picker reports per InferencePool name, None unless the policy
    #: reads one (`spec.signals.endpointPicker`)
    picker: dict[str, PickerSignals] | None = None


@dataclass
class Observed:
    """The endpoints one pace pass observed, the ModelDeployment owning each, and the
    guard that says which writes may go out."""

    guard: Guard
    endpoints: dict[EndpointKey, EndpointSnapshot] = field(default_factory=dict)
    owner: dict[EndpointKey, tuple[dict[str, Any], ModelDeployment]] = field(default_factory=dict)


class PacePass:
    """One pass of the loop for one policy; separated from the daemon for readability."""

    def __init__(
        self,
        kube: Kube,
        body: dict[str, Any],
        state: PaceState,
        logger: Logger,
        board: DecisionBoard = BOARD,
    ) -> None:
        self.kube = kube
        self.body = body
        self.state = state
        self.logger = logger
        self.board = board
        self.policy = ScalingPolicy.model_validate(essence(body))
        #: `actuation: keda`: decisions go to the scaler (`board`), not to replicas
        self.keda = self.policy.spec.actuation is Actuation.KEDA
        #: in keda mode, the replicas this pass decided per pod set (written by `act`)
        self.decided: dict[str, int] = {}
        self._decided_lock = threading.Lock()
        self.namespace = str(self.policy.metadata.namespace or body["metadata"]["namespace"])
        self.now = time.time()
        self.dry_run = dry_run(self.policy.spec.dry_run)
        #: the pod sets as this pass listed them, by name (writes test against them)
        self.observed: dict[str, dict[str, Any]] = {}
        self._nodes: list[dict[str, Any]] | None = None

    def nodes(self) -> list[dict[str, Any]]:
        """Every Node, listed once per pass (the spot pass, the checks and lost nodes)."""
        if self._nodes is None:
            self._nodes = self.kube.nodes()
        return self._nodes

    def condition(self, type_: str, status: bool, reason: str, message: str) -> None:
        """Set a condition on the policy (written when its status, reason or message
        changes); post an Event when its status or reason does."""
        before = {c["type"]: c for c in self.state.conditions}
        self.state.conditions = set_condition(
            self.state.conditions,
            type_,
            status,
            reason,
            message,
            datetime.now(UTC),
            self.body["metadata"].get("generation"),
        )
        old = before.get(type_)
        moved = old is None or (old["status"], old["reason"]) != (
            "True" if status else "False",
            reason,
        )
        if moved:
            bad = (type_ in ABNORMAL_WHEN_TRUE) == status
            self.kube.event(self.body, "Warning" if bad else "Normal", reason, message)
        if moved or old.get("message") != message:  # type: ignore[union-attr]
            self.kube.patch_status(
                self.namespace,
                "scalingpolicies",
                self.policy.metadata.name,
                {"conditions": self.state.conditions},
            )

    def run(self) -> None:
        """Observe → `decide` → apply, for every endpoint of the policy's fleet."""
        if not self.ready():
            return
        self.report_clusters()
        actuator = Actuator(
            self.kube,
            self.policy,
            self.namespace,
            self.condition,
            self.kube.event,
            self.board,
            self.logger,
        )
        keda = actuator.usable() if self.keda else None
        if self.keda and keda is None:
            return  # Actuation=False says why; replicas are left alone
        fleet = [
            (raw, ModelDeployment.model_validate(essence(raw)))
            for raw in self.kube.objects(self.namespace, "modeldeployments")
            if (raw.get("spec") or {}).get("policyRef", {}).get("name") == self.policy.metadata.name
            and is_ready(raw)
        ]
        self.spot([md for _, md in fleet], self.pools())
        strategy = strategy_for(self.policy.spec)
        samples = self.read_samples(strategy)
        if samples is None:
            return
        seen = self.observe(fleet, samples)
        outcome = decide(
            self.now,
            Snapshot(self.now, seen.endpoints),
            with_layouts(self.state.plan, self.state.layouts.targets()),
            self.state.step,
            strategy,
            report_partial_after_s=report_after_s(),
            scale_in_stabilization_s=float(
                self.policy.spec.intervals.scale_in_stabilization_seconds
            ),
        )
        self.state.step = outcome.state
        self.apply(outcome.decisions, seen)
        if not self.dry_run:
            if keda is not None:
                self.actuate_keda(actuator, fleet, seen, samples, *keda)
            else:
                had = any(c["type"] == ACTUATION for c in self.state.conditions)
                actuator.direct(seen.guard, self.observed, fleet, had)
        self.report_faults(seen.guard, fleet)
        self.report_picker(fleet, seen, samples.picker)
        expected = {
            key: f"{engine(md.spec.engine.kind).kv_usage} at "
            f"{engine(md.spec.engine.kind).metrics_path}"
            for key, (_, md) in seen.owner.items()
        }
        self.condition("Degraded", *degraded(outcome.held, expected))
        try:
            self.report_deadlines(fleet, samples.deadline_needs)
        except Exception:  # a status write refused: reported again next pass
            self.logger.exception("reporting batch deadlines at risk failed")

    def report_clusters(self) -> None:
        """With member clusters (`fleet_kube`): the `Clusters` condition and
        `status.clusters` every pass, so a silent member is named within one pace interval
        whatever the plan's cadence (its pod sets are then neither listed nor sized)."""
        if not isinstance(self.kube, FleetKube):
            return
        status = self.body.get("status") or {}
        self.kube.refresh(last_home=last_home(status.get("clusters")))
        view = self.kube.view
        self.condition("Clusters", *view.condition())
        clusters = clusters_status(view, self.kube.readings)
        if clusters != status.get("clusters"):
            self.kube.patch_status(
                self.namespace, "scalingpolicies", self.policy.metadata.name, {"clusters": clusters}
            )

    def ready(self) -> bool:
        """`Ready`: False (and nothing paced) for a simulation-only strategy or a policy
        whose objects do not fit together; True naming how the fleet is paced."""
        strategy = self.policy.spec.strategy
        refused = simulation_only(strategy_for(self.policy.spec))
        if refused is not None:
            message = f"spec.strategy: {strategy.value} {refused}"
            self.condition("Ready", False, "UnsupportedStrategy", message)
            return False
        if self.policy.spec.forecast.method is ForecastMethod.REALISED:
            self.condition("Ready", False, "UnsupportedForecast", REALISED_ONLY_IN_SIMULATION)
            return False
        problems = self.problems()
        if problems:
            message = "; ".join(p.message for p in problems) + "; holding every size"
            self.condition("Ready", False, problems[0].reason, message)
            return False
        pacing = f"strategy {strategy.value}"
        if strategy is Strategy.PRESERVE:
            pacing += (
                f": window targets from PreServe's window plan every "
                f"{self.policy.spec.preserve.window_seconds} s (prompt and generated tokens "
                "forecast apart, no hourly plan), in-window moves from the routers' projections"
            )
        self.condition("Ready", True, "Pacing", pacing)
        return True

    def read_samples(self, strategy: PacingStrategy) -> PaceSamples | None:
        """Prometheus' side of the observation, every read within one pace interval (else
        the next pass is due and this one's data is late); None, with `Degraded` saying
        why, when it cannot be had: every size is then held."""
        interval = float(self.policy.spec.intervals.pace_seconds)
        picker = self.policy.spec.signals.endpoint_picker
        with_picker = picker is not PickerKind.NONE
        reader = prometheus_reader(deadline=time.monotonic() + interval)
        try:
            return PaceSamples(
                reader.tokens_per_second(self.namespace),
                reader.pod_loads(self.namespace),
                reader.held_requests(self.namespace),
                reader.batch_deadline_needs(self.namespace),
                reader.pod_projections(self.namespace) if strategy.uses_projection else {},
                reader.tier_ttft(self.namespace),
                reader.pod_interactive_running(self.namespace)
                if strategy.uses_interactive_busy
                else None,
                reader.picker_signals(self.namespace, picker) if with_picker else None,
            )
        except MetricsTooSlow as exc:
            message = f"holding all sizes: reads slower than the pace interval ({interval:g} s)"
            self.condition("Degraded", True, "PrometheusSlow", f"{message}: {exc}")
        except MetricsUnavailable as exc:
            self.condition("Degraded", True, "PrometheusUnreachable", f"holding all sizes: {exc}")
        return None

    def observe(
        self, fleet: list[tuple[dict[str, Any], ModelDeployment]], samples: PaceSamples
    ) -> Observed:
        """The API server's side of the observation joined with the samples: who else
        writes replicas (`Guard`), lost nodes (their pods replaced), and one snapshot per
        endpoint this policy paces (`observe.endpoint_snapshots`)."""
        pod_sets = self.kube.deployments_by_owner(self.namespace)
        pods = self.kube.pods_of(self.namespace)
        mine = {md.metadata.name for _, md in fleet}  # another policy's pod sets are its own
        mine_pods = [
            p for p in pods if (p["metadata"].get("labels") or {}).get(LABEL_DEPLOYMENT) in mine
        ]
        guard = Guard.observe(
            self.namespace,
            {name: sets for name, sets in pod_sets.items() if name in mine},
            mine_pods,
            self.now,
            keda=self.keda,
        )
        self.observed = {name: d for sets in pod_sets.values() for name, d in sets.items()}
        if not self.dry_run:
            guard.settle(self.kube, self.observed, self.logger)
        lost = {
            name: since
            for obj in self.nodes()
            if (since := not_ready_since(obj)) is not None
            and (name := str((obj.get("metadata") or {}).get("name")))
        }
        self.replace_lost(lost, mine_pods, {md.metadata.name: raw for raw, md in fleet})
        seen = Observed(guard)
        release = self.policy.spec.routing.batch_release
        slo = interactive_ttft_slo(self.kube.objects(self.namespace, "workloadtiers"))
        for raw, md in fleet:
            snaps = endpoint_snapshots(
                md,
                self.namespace,
                pod_sets.get(md.metadata.name, {}),
                pods,
                samples.loads,
                samples.tokens_per_s,
                samples.held_requests,
                lost,
                samples.projections,
                samples.deadline_needs.get(md.metadata.name, 0.0),
                max(release.one_below_emu, release.two_below_emu),
                samples.ttft,
                slo,
                samples.interactive,
                samples.picker,
                deadline_theta(md, raw),
            )
            self.export_sizes(md, snaps)
            # an endpoint with a pod set someone else sizes is not paced at all
            snaps = {
                k: replace(
                    v,
                    stuck_terminating=len(guard.stuck_at(k)),
                    replicas=self.sized(md, k.region, v.replicas),
                )
                for k, v in snaps.items()
                if not guard.held(md, k.region)
            }
            seen.endpoints.update(snaps)
            seen.owner.update(dict.fromkeys(snaps, (raw, md)))
        return seen

    def report_picker(
        self,
        fleet: list[tuple[dict[str, Any], ModelDeployment]],
        seen: Observed,
        picker: dict[str, PickerSignals] | None,
    ) -> None:
        """`PickerSignals`: whether the endpoint picker reported every paced endpoint's pool.
        A pool it is silent on is named with the series expected, so a wrong pool name or a
        missing scrape shows, never reads as an idle picker (the engines' signals still
        drive that endpoint)."""
        kind = self.policy.spec.signals.endpoint_picker
        if picker is None or kind is PickerKind.NONE:
            return
        regions = {(md.metadata.name, r.name): (md, r) for _, md in fleet for r in md.spec.regions}
        if not any((k.model, k.region) in regions for k in seen.endpoints):
            return  # nothing paced yet (no pod set): no pool to have heard of, either way
        silent = sorted(
            inference_pool_name(*regions[(k.model, k.region)])
            for k, snap in seen.endpoints.items()
            if snap.picker is None and (k.model, k.region) in regions
        )
        if not silent:
            message = f"{kind.value} endpoint picker reports every paced pool"
            self.condition("PickerSignals", True, "Reported", message)
            return
        table = PICKERS[kind]
        message = (
            f"no {table.average_queue}{{name=...}} × {table.ready_pods} in namespace "
            f"{self.namespace} for InferencePool(s) {', '.join(silent)}: those endpoints "
            "are paced on their engines' signals alone; check the picker's scrape and "
            "spec.regions[].inferencePool"
        )
        self.condition("PickerSignals", False, "PickerMetricsMissing", message)

    def sized(
        self, md: ModelDeployment, region: str, replicas: Mapping[str, int]
    ) -> dict[str, int]:
        """Each variant's replicas as the decision step reads them: the pod set's
        `spec.replicas`; in keda mode the replicas last decided for it (what direct mode
        would have written), since KEDA's HPA writes them a little later."""
        if not self.keda:
            return dict(replicas)
        out = {}
        for variant, n in replicas.items():
            recorded = self.board.get(
                self.namespace, pod_set_name(md.metadata.name, region, variant)
            )
            out[variant] = n if recorded is None else recorded.replicas
        return out

    def actuate_keda(
        self,
        actuator: Actuator,
        fleet: list[tuple[dict[str, Any], ModelDeployment]],
        seen: Observed,
        samples: PaceSamples,
        address: str,
        listed: dict[str, dict[str, Any]],
    ) -> None:
        """Record this pass's decisions for the scaler (every paced pod set: decided, else
        as sized) and keep the ScaledObjects in step (`controller.actuation`)."""
        release = self.policy.spec.routing.batch_release
        below = max(release.one_below_emu, release.two_below_emu)
        managed: list[Managed] = []
        for raw, md in fleet:
            name = md.metadata.name
            sized: dict[str, int] = {}
            where: dict[str, tuple[str, str]] = {}
            for region in md.spec.regions:
                for v in md.spec.variants:
                    pod_set = pod_set_name(name, region.name, v.name)
                    own = seen.guard.owned.get(pod_set)
                    if pod_set not in self.observed or (own and seen.guard.is_held(own)):
                        continue
                    recorded = self.board.get(self.namespace, pod_set)
                    current = int((self.observed[pod_set].get("spec") or {}).get("replicas") or 0)
                    sized[pod_set] = current if recorded is None else recorded.replicas
                    where[pod_set] = (region.name, v.name)
            serving = sum(s.serving for k, s in seen.endpoints.items() if k.model == name)
            need = samples.deadline_needs.get(name, 0.0)
            pressure = deadline_pressure(need, serving, deadline_theta(md, raw), below)
            with self._decided_lock:
                decided = dict(self.decided)
            desired = desired_pod_sets(
                md, self.namespace, sized, decided, samples.held_requests, pressure
            )
            self.board.record(self.namespace, desired)
            managed += [Managed(md, raw, *where[p], p, d) for p, d in desired.items()]
        actuator.keda(managed, self.observed, listed, fleet, address)

    def apply(self, decisions: Sequence[Decision], seen: Observed) -> None:
        """Write the decisions, concurrently (each touches its own
        pod sets), then one Event per ModelDeployment and reason listing every action and
        its cause: a plan that moves 600 endpoints writes 200 Events, not 600."""
        work = [(*seen.owner[d.key], d) for d in decisions]
        done = concurrently(lambda w: self.act(*w), work)
        grouped: dict[tuple[str, str], tuple[dict[str, Any], list[str]]] = {}
        for (raw, md, _decision), (reason, message) in zip(work, done, strict=True):
            grouped.setdefault((md.metadata.name, reason), (raw, []))[1].append(message)
        events = [(raw, reason, "; ".join(msgs)) for (_, reason), (raw, msgs) in grouped.items()]
        concurrently(lambda e: self.kube.event(e[0], "Normal", e[1], e[2]), events)

    def report_deadlines(
        self, fleet: list[tuple[dict[str, Any], ModelDeployment]], needs: dict[str, float]
    ) -> None:
        """`BatchDeadlinesAtRisk` on each ModelDeployment whose batch queue needs more than
        its regions serve at maxInstances (a Warning Event when it turns True, a Normal one
        when it clears), and `sageserve_batch_deadline_at_risk` / `_shortfall_tokens_per_
        second` for each: `controller.deadlines`."""
        for raw, md in fleet:
            name = md.metadata.name
            now = deadlines.outlook(md, needs.get(name, 0.0), deadline_theta(md, raw))
            OPERATOR_METRICS.batch_deadline_at_risk.labels(self.namespace, name).set(
                1.0 if now.at_risk else 0.0
            )
            OPERATOR_METRICS.batch_deadline_shortfall.labels(self.namespace, name).set(
                now.shortfall_tps
            )
            conditions = (raw.get("status") or {}).get("conditions") or []
            current = next((c for c in conditions if c.get("type") == deadlines.CONDITION), None)
            todo = deadlines.report(current, self.state.deadline_outlooks.get(name), now)
            status, reason, message = now.condition()
            if todo.event:
                if status:
                    self.kube.event(raw, "Warning", deadlines.CONDITION, message)
                else:
                    self.kube.event(raw, "Normal", reason, message)
            if todo.write:
                written = set_condition(
                    conditions,
                    deadlines.CONDITION,
                    status,
                    reason,
                    message,
                    datetime.now(UTC),
                    raw["metadata"].get("generation"),
                )
                self.kube.patch_status(
                    self.namespace, "modeldeployments", name, {"conditions": written}
                )
            if todo.write or todo.event:
                self.state.deadline_outlooks[name] = now
        names = {md.metadata.name for _, md in fleet}
        for gone in set(self.state.deadline_outlooks) - names:
            del self.state.deadline_outlooks[gone]

    def replace_lost(
        self,
        lost: dict[str, float],
        pods: list[dict[str, Any]],
        owners: dict[str, dict[str, Any]],
    ) -> None:
        """Evict the pods of nodes lost for longer than the bound (their pod sets' ReplicaSets
        replace them where capacity exists), with a Warning Event on the ModelDeployment."""
        if self.dry_run or not lost:
            return
        bound = node_lost_s()
        for pod in lost_pods(pods, lost, self.now):
            if pod.lost_s < bound:
                continue
            refused = self.kube.evict(self.namespace, pod.name)
            message = pod.describe() + (f"; eviction refused: {refused}" if refused else "")
            self.logger.warning("%s", message)
            body = owners.get(pod.model)
            if body is not None:
                self.kube.event(body, "Warning", "NodeLost", message)

    def problems(self) -> list[SemanticProblem]:
        """What in the policy passes the schema but cannot be acted on (the nodes are
        listed only when the policy names GPU types)."""
        if not self.policy.spec.optimizer.gpu_hour_costs:
            return []
        shapes = node_shapes(self.nodes(), NodeLabels.from_env(os.environ))
        return policy_problems(self.policy.spec, (n.gpu_type for n in shapes))

    def report_faults(
        self, guard: Guard, fleet: list[tuple[dict[str, Any], ModelDeployment]]
    ) -> None:
        """Conditions and Events for what the guard found (once per transition)."""
        report = FaultReport(
            self.condition,
            self.kube.event,
            self.state.faults_seen,
            lambda: self.kube.autoscalers(self.namespace),
        )
        owners = {md.metadata.name: raw for raw, md in fleet}
        report.post(guard, owners, {c["type"] for c in self.state.conditions})
        self.state.faults_seen = report.seen

    def export_sizes(self, md: ModelDeployment, snaps: dict[EndpointKey, EndpointSnapshot]) -> None:
        """Instances per pod set and GPUs per state, as operator metrics."""
        per_gpu = {v.name: v.gpus_per_instance for v in md.spec.variants}
        name = md.metadata.name
        for key, snap in snaps.items():
            for variant, replicas in snap.replicas.items():
                labels = (self.namespace, name, key.region, variant)
                OPERATOR_METRICS.instances.labels(*labels).set(replicas)
            gpus_each = max((per_gpu[v] for v in snap.replicas), default=0)
            serving_gpus = sum(per_gpu.get(i.variant, 0) for i in snap.instances)
            for state, value in (
                ("serving", serving_gpus or snap.serving * gpus_each),
                ("provisioning", snap.provisioning * gpus_each),
            ):
                OPERATOR_METRICS.gpus.labels(self.namespace, name, key.region, state).set(value)

    def pools(self) -> list[ModelPool]:
        """The ModelPools this policy sizes (their pods need GPUs as a model's do)."""
        return [
            parse_pool(o)
            for o in self.kube.objects(self.namespace, "modelpools")
            if (o.get("spec") or {}).get("policyRef", {}).get("name") == self.policy.metadata.name
        ]

    def spot(self, mds: list[ModelDeployment], pools: list[ModelPool] | None = None) -> None:
        """Reclaim spot nodes for unschedulable serving pods (pooled ones too); donate idle
        serving nodes."""
        pools = pools or []
        if not self.policy.spec.spot.enabled or not (mds or pools):
            return
        region_of = {
            pod_set_name(md.metadata.name, r.name, v.name): (r.name, v.gpu_type)
            for md in mds
            for r in md.spec.regions
            for v in md.spec.variants
        } | {
            pod_set_name(p.metadata.name, r.name, p.spec.variant.name): (
                r.name,
                p.spec.variant.gpu_type,
            )
            for p in pools
            for r in p.spec.regions
        }
        busy = set()
        pod_sets = self.kube.deployments_by_owner(self.namespace)
        for owner in [md.metadata.name for md in mds] + [p.metadata.name for p in pools]:
            for name, d in pod_sets.get(owner, {}).items():
                wanted = int((d.get("spec") or {}).get("replicas") or 0)
                if name in region_of and wanted > int(
                    (d.get("status") or {}).get("readyReplicas") or 0
                ):
                    busy.add(region_of[name])
        dry = self.dry_run
        spot_pass = SpotPass(self.kube, NodeLabels.from_env(os.environ))
        reclaimed, donated = spot_pass.run(region_of, busy, dry, self.nodes())
        if spot_pass.spot_nodes != self.state.donated_nodes:
            self.state.donated_nodes = spot_pass.spot_nodes
            self.kube.patch_status(
                self.namespace,
                "scalingpolicies",
                self.policy.metadata.name,
                {"donatedNodes": spot_pass.spot_nodes},
            )
        prefix = "DryRun" if dry else ""
        if reclaimed:
            message = f"spot node(s) {', '.join(reclaimed)} back to serving for unschedulable pods"
            self.kube.event(self.body, "Normal", prefix + "Reclaimed", message)
        if donated:
            message = f"idle serving node(s) {', '.join(donated)} donated to the spot pool"
            self.kube.event(self.body, "Normal", prefix + "Donated", message)
        self.report_blocked(spot_pass)

    def report_blocked(self, spot_pass: SpotPass) -> None:
        """A Warning Event `ReclaimBlocked` for each reclaim given up (naming the node, the
        pod and the PodDisruptionBudget); `ReclaimBlocked=True` while a node given up is
        skipped."""
        for blocked in spot_pass.given_up:
            message = blocked.describe(spot_pass.timeout_s)
            self.kube.event(self.body, "Warning", "ReclaimBlocked", message)
        if spot_pass.blocked:
            message = "; ".join(b.describe(spot_pass.timeout_s) for b in spot_pass.blocked)
            self.condition("ReclaimBlocked", True, "EvictionRefused", message)
        elif any(c["type"] == "ReclaimBlocked" for c in self.state.conditions):
            message = "no spot reclaim is blocked"
            self.condition("ReclaimBlocked", False, "NoneBlocked", message)

    def act(self, raw: dict[str, Any], md: ModelDeployment, decision: Decision) -> tuple[str, str]:
        """Carry out one decision (unless dry run); the Event's (reason, message) saying why.

        Scale-in first marks the pods the step chose to drain with a low
        `pod-deletion-cost`, so the ReplicaSet removes exactly those (the least loaded)."""
        changes = pod_set_changes(md, decision)
        dry = self.dry_run
        if not dry:
            for pod in decision.drain:
                self.kube.annotate_pod(
                    self.namespace, pod, {ANNOTATION_DELETION_COST: str(DRAIN_DELETION_COST)}
                )
            for name, replicas in changes.items():
                if name not in self.observed:
                    self.logger.info("pod set %s not created yet; not scaled", name)
                    continue
                if self.keda:  # KEDA's HPA writes it: the scaler serves the decision
                    with self._decided_lock:
                        self.decided[name] = replicas
                    continue
                try:
                    self.kube.set_replicas(self.namespace, self.observed[name], replicas)
                except ReplicasMoved as exc:  # another writer since the read: not overwritten
                    return "ScaleSkipped", f"{exc}; the next pass decides on what it wrote"
        direction = "out" if decision.kind is ActionKind.SCALE_OUT else "in"
        if not dry:
            OPERATOR_METRICS.scaling_events.labels(
                self.namespace,
                md.metadata.name,
                decision.key.region,
                direction,
                self.policy.spec.strategy.value,
            ).inc()
        verb = "ScaledOut" if decision.kind is ActionKind.SCALE_OUT else "ScaledIn"
        sizes = ", ".join(f"{decision.key.region}/{v}={n}" for v, n in decision.replicas.items())
        drained = f", draining {', '.join(decision.drain)}" if decision.drain else ""
        prefix = "dry run, not applied: " if dry else ""
        through = " through KEDA" if self.keda and not dry else ""
        reason = ("DryRun" if dry else "") + verb
        return reason, f"{prefix}{sizes}{drained}{through} ({decision.reason})"


def policy_strategy(policy: dict[str, Any]) -> PacingStrategy | None:
    """The strategy a ScalingPolicy asks for, configured from its spec; None for a spec
    that does not validate (the pace pass reports it)."""
    try:
        spec = ScalingPolicy.model_validate(essence(policy)).spec
    except ValueError:
        return None
    return strategy_for(spec)


class Loops(threading.Thread):
    """The operator's background work: pace passes per policy, resyncs of ModelDeployments.

    Level-triggered: each pass lists the objects afresh, so a restart loses only the
    strategies' cooldown timers, and the first pass after it acts on the current state.
    """

    def __init__(
        self,
        namespaces: list[str] | None,
        resync: Callable[[dict[str, Any]], None],
        resync_s: float,
        logger: Logger,
    ) -> None:
        super().__init__(name="sageserve-loops", daemon=True)
        self.namespaces = namespaces
        self.resync = resync
        self.resync_s = resync_s
        self.logger = logger
        self.stopped = threading.Event()
        self.states: dict[tuple[str, str], PaceState] = {}
        self.due: dict[tuple[str, str], float] = {}
        self.next_resync = 0.0
        self.sweep: threading.Thread | None = None
        self.is_leader = False
        self.lease_check = 0.0

    def run(self) -> None:
        while not self.stopped.wait(0.5):
            try:
                self.tick(time.monotonic())
            except Exception:  # listing failed (API server away): try again next tick
                self.logger.exception("background pass failed; retrying")

    def leading(self, k: Kube, now: float) -> bool:
        """Whether this replica holds the Lease (always, when no Lease namespace is set)."""
        namespace = os.environ.get("SAGESERVE_LEASE_NAMESPACE")
        if not namespace:
            return True
        if now >= self.lease_check:
            was = self.is_leader
            self.is_leader = LeaderElection(k, namespace, identity()).lead()
            self.lease_check = now + LEASE_RENEW_SECONDS
            if self.is_leader != was:
                self.logger.info(
                    "leader: %s", "this replica" if self.is_leader else "another replica"
                )
        return self.is_leader

    def plan_or_keep(self, k: Kube, policy: dict[str, Any], state: PaceState) -> bool:
        """`plan_if_due`, where a plan pass that fails unexpectedly (a solver or API error
        the plan loop does not handle itself) keeps the plan in force and is reported as
        `PlanReady=False/PlanFailed`: the pace pass that follows still runs, so reactive
        scaling and the floors are never held hostage by the planner. The cadence has
        already moved on, so the plan is tried again when it is next due, not every pass."""
        name = f"{policy['metadata']['namespace']}/{policy['metadata']['name']}"
        try:
            return self.plan_if_due(k, policy, state)
        except Exception as exc:
            self.logger.exception("plan of %s failed; pacing on with the plan in force", name)
            message = f"no new plan: {type(exc).__name__}: {exc}"[:1024]
            try:
                PlanPass(k, policy, state.conditions, self.logger).set(
                    "PlanReady", False, "PlanFailed", message + "; pacing on the plan in force"
                )
            except Exception:  # the API server is away too: the log says it
                self.logger.exception("PlanReady of %s not written", name)
            return False

    def plan_if_due(self, k: Kube, policy: dict[str, Any], state: PaceState) -> bool:
        """Plan when the strategy's cadence says so (`pace.cadence.plan_step`, the rule the
        simulator follows too), after a restart adopting the plan recorded in status while
        it is fresh: the hourly cycle (`PlanPass`) for the LT strategies, the window plan
        (`WindowPass`, every `spec.preserve.windowSeconds`) instead of it for `preserve`
        (see `window_loop` for why it replaces rather than overrides the hourly plan).
        `static`'s peak-sized fleet is a simulation baseline (the pace pass says so).

        Returns whether a plan pass ran."""
        strategy = policy_strategy(policy)
        if strategy is None or strategy.plan_cadence.source is PlanSource.PEAK:
            return False
        cadence = strategy.plan_cadence
        recorded = recorded_plan(policy) if state.plan_clock.due_at is None else None
        wall = time.time()
        move, state.plan_clock = plan_step(
            wall,
            state.plan_clock,
            cadence,
            recorded_at=recorded.computed_at if recorded is not None else None,
        )
        if move is PlanMove.ADOPT:
            state.plan = recorded  # restart: the plan in status is still in force
        if move is not PlanMove.PLAN:
            return False
        if cadence.source is PlanSource.WINDOW:
            window = WindowPass(k, policy, state.conditions, self.logger).run_window(
                prometheus_reader(deadline=time.monotonic() + PLAN_READ_SECONDS)
            )
            if window is not None:
                state.plan = window.in_force(wall)
            return window is not None
        cycle = PlanPass(k, policy, state.conditions, self.logger).run(
            prometheus_reader(deadline=time.monotonic() + PLAN_READ_SECONDS),
            NodeLabels.from_env(os.environ),
        )
        if cycle is not None:
            state.plan = cycle.in_force(wall)
        return cycle is not None

    def layouts(self, k: Kube, policy: dict[str, Any], state: PaceState) -> None:
        """The OServe layout loop's pass for a policy with `spec.layouts` (every pace pass
        steps switches in progress; re-plans every `replanSeconds`): `controller.layout_loop`.
        A failure keeps the layouts in force (logged)."""
        if not (policy.get("spec") or {}).get("layouts") and not state.layouts.groups:
            return
        try:
            LayoutPass(k, policy, state.layouts, state.conditions, self.logger).run(
                prometheus_reader(deadline=time.monotonic() + PLAN_READ_SECONDS),
                state.plan,
                time.time(),
            )
        except Exception:
            self.logger.exception("layout pass failed; the layouts in force are kept")

    def resync_all(self, k: Kube) -> None:
        """Reconcile every ModelDeployment and ModelPool once (a policy or node that appeared
        later makes a waiting object Ready; a drifted pod set is restored; a pool's `Sized`
        follows a policy whose strategy changed)."""
        started = time.monotonic()
        try:
            # ModelPools too: a pool's `Sized` condition follows its policy's strategy,
            # which can change without the pool changing
            objs = [
                obj
                for plural in ("modeldeployments", "modelpools")
                for obj in k.objects_in(self.namespaces, plural)
            ]
        except Exception:  # API server away: the next sweep tries again
            self.logger.exception("resync: listing ModelDeployments and ModelPools failed")
            return
        for obj in objs:
            if self.stopped.is_set():
                return
            try:
                self.resync(obj)
            except Exception:
                self.logger.exception("resync of %s failed", obj["metadata"]["name"])
        if isinstance(k, FleetKube):
            owners: dict[str, set[str]] = {}
            for obj in objs:
                owners.setdefault(obj["metadata"]["namespace"], set()).add(obj["metadata"]["name"])
            try:
                for gone in k.collect_orphans(owners):
                    self.logger.info("deleted pod set %s: its ModelDeployment is gone", gone)
            except Exception:
                self.logger.exception("resync: collecting member clusters' orphans failed")
        OPERATOR_METRICS.round_seconds.labels(
            ",".join(self.namespaces or []), "", "resync"
        ).observe(time.monotonic() - started)

    def tick(self, now: float) -> None:
        hub = kube()
        if not self.leading(hub, now):
            return
        k = fleet_of(hub, os.environ)  # the hub alone, or with its member clusters
        if now >= self.next_resync and not (self.sweep and self.sweep.is_alive()):
            # A sweep over every ModelDeployment takes seconds at fleet size: it runs on its
            # own thread so that plan and pace passes keep their cadence meanwhile.
            self.next_resync = now + self.resync_s
            self.sweep = threading.Thread(
                target=self.resync_all, args=(k,), name="sageserve-resync", daemon=True
            )
            self.sweep.start()
        seen = set()
        for policy in k.objects_in(self.namespaces, "scalingpolicies"):
            key = (policy["metadata"]["namespace"], policy["metadata"]["name"])
            seen.add(key)
            if now < self.due.get(key, 0.0):
                continue
            interval = (policy.get("spec") or {}).get("intervals", {}).get("paceSeconds", 15)
            self.due[key] = now + float(interval)
            state = self.states.setdefault(key, PaceState())
            try:
                started = time.monotonic()
                planned = self.plan_or_keep(k, policy, state)
                self.layouts(k, policy, state)
                PacePass(k, policy, state, self.logger).run()
                kind = "plan" if planned else "pace"
                OPERATOR_METRICS.round_seconds.labels(*key, kind).observe(
                    time.monotonic() - started
                )
            except Exception:  # one bad pass must not stop the others; sizes are held
                self.logger.exception("pace pass of %s/%s failed; sizes held", *key)
        for gone in set(self.states) - seen:
            self.states.pop(gone, None)
            self.due.pop(gone, None)
