"""The operator's own metrics: what it planned, forecast and did, for dashboards and alerts.

A private registry (not the process-global one) so tests and the twin can run several
exporters in one process, and so only sageserve's metrics are served.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

ENDPOINT = ("namespace", "model", "region")


class OperatorMetrics:
    """Every metric the operator exports, with its labels."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.target_instances = Gauge(
            "sageserve_target_instances",
            "Instances the current plan asks for, per pod set.",
            [*ENDPOINT, "variant"],
            registry=r,
        )
        self.instances = Gauge(
            "sageserve_instances",
            "Replicas of each pod set.",
            [*ENDPOINT, "variant"],
            registry=r,
        )
        self.forecast_tps = Gauge(
            "sageserve_forecast_tokens_per_second",
            "Forecast peak tokens/s (incl. batch buffer) the plan was sized for.",
            [*ENDPOINT, "method"],
            registry=r,
        )
        self.forecast_error = Gauge(
            "sageserve_forecast_error_ratio",
            "Observed / forecast tokens/s over the last plan interval, minus 1.",
            ENDPOINT,
            registry=r,
        )
        self.solver_seconds = Histogram(
            "sageserve_solver_seconds",
            "Wall time of each ILP solve.",
            ["solver", "status"],
            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120),
            registry=r,
        )
        self.round_seconds = Histogram(
            "sageserve_round_seconds",
            "Wall time of the background loop's rounds per policy: plan (forecast, ILP, "
            "status, then the pace pass that patches replicas), pace (a pace pass alone), "
            "resync (reconciling every ModelDeployment; policy is empty).",
            ["namespace", "policy", "kind"],
            buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 30, 60, 120),
            registry=r,
        )
        self.scaling_events = Counter(
            "sageserve_scaling_events",
            "Scaling events by direction and strategy.",
            [*ENDPOINT, "direction", "strategy"],
            registry=r,
        )
        self.gpus = Gauge(
            "sageserve_gpus",
            "GPUs by state: serving (ready pods), provisioning (pods not ready yet), donated "
            "(nodes in the spot pool; model is empty). Integrate over time for GPU-hours.",
            [*ENDPOINT, "state"],
            registry=r,
        )
        self.donated_nodes = Gauge(
            "sageserve_donated_nodes",
            "Nodes currently in the spot pool, per region and GPU type.",
            ["region", "gpu_type"],
            registry=r,
        )
        self.shortfall_tps = Gauge(
            "sageserve_shortfall_tokens_per_second",
            "Forecast demand the plan cannot serve with the GPUs available.",
            ENDPOINT,
            registry=r,
        )
        self.layout_replicas = Gauge(
            "sageserve_layout_replicas",
            "OServe layouts: instances of each variant in the layout in force (the targets "
            "during a switch), per (model, region, variant).",
            [*ENDPOINT, "variant"],
            registry=r,
        )
        self.layout_switches = Counter(
            "sageserve_layout_switches",
            "OServe layout switches started, per (model, region, GPU type).",
            [*ENDPOINT, "gpu_type"],
            registry=r,
        )

        self.batch_deadline_at_risk = Gauge(
            "sageserve_batch_deadline_at_risk",
            "1 while a model's batch queue needs more tokens/s to meet every deadline than "
            "its regions serve at maxInstances (condition BatchDeadlinesAtRisk), else 0.",
            ["namespace", "model_deployment"],
            registry=r,
        )
        self.batch_deadline_shortfall = Gauge(
            "sageserve_batch_deadline_shortfall_tokens_per_second",
            "Tokens/s a model's batch deadlines need beyond what its regions serve at "
            "maxInstances (0 while within it).",
            ["namespace", "model_deployment"],
            registry=r,
        )

    def record_plan(self, namespace: str, plan: Mapping[str, Any], solver: str) -> None:
        """Export a plan as recorded in a ScalingPolicy's status (`status.plan`)."""
        for t in plan.get("targets", []):
            labels = (namespace, t["model"], t["region"], t["variant"])
            self.target_instances.labels(*labels).set(t["target"])
        for f in plan.get("forecasts", []):
            labels = (namespace, f["model"], f["region"], f["method"])
            self.forecast_tps.labels(*labels).set(f["tokensPerSecond"])
        for endpoint in {(f["model"], f["region"]) for f in plan.get("forecasts", [])}:
            self.shortfall_tps.labels(namespace, *endpoint).set(0.0)
        for s in plan.get("shortfalls", []):
            self.shortfall_tps.labels(namespace, s["model"], s["region"]).set(s["tokensPerSecond"])
        self.solver_seconds.labels(solver, plan["solverStatus"]).observe(plan["solverSeconds"])

    def record_pools(
        self,
        spot_nodes: Mapping[tuple[str, str], int],
        gpus_per_node: Mapping[tuple[str, str], int],
    ) -> None:
        """Export how many nodes (and GPUs) sit in the spot pool per (region, GPU type)."""
        donated_gpus: dict[str, int] = {}
        for (region, gpu), count in spot_nodes.items():
            self.donated_nodes.labels(region, gpu).set(count)
            donated_gpus[region] = donated_gpus.get(region, 0) + count * gpus_per_node.get(
                (region, gpu), 0
            )
        for region, gpus in donated_gpus.items():
            self.gpus.labels("", "", region, "donated").set(gpus)

    def exposition(self) -> bytes:
        """The metrics in the Prometheus text format, as served on /metrics."""
        return generate_latest(self.registry)


#: The operator process's metrics (one per process, served by `sageserve operator`).
OPERATOR_METRICS = OperatorMetrics()
