"""The API server and Prometheus as the hourly plan loop (`controller.plan_loop.PlanPass`)
reads them, in process: the paper's fleet (policies/base, the 3-region inventory) with a
batch tier, and per (model, region) token-rate series the test chooses."""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from sageserve.api.model_deployment import ModelDeployment, pod_set_name
from sageserve.controller.plan_loop import PlanPass
from sageserve.controller.status import essence
from sageserve.core.labels import NodeLabels
from sageserve.metrics import queries
from sageserve.metrics.prometheus import MetricsUnavailable
from sageserve.plan.cycle import PlanCycle

ROOT = Path(__file__).resolve().parents[2]
NS = "llm"
POLICY = "fleet"
#: the planner's grid: 10-minute steps, six hours of history
STEP_S = 600
TRAINING_S = 6 * 3600
Series = Mapping[tuple[str, str], list[float]]


def _docs(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


#: the status of a ModelDeployment the operator reconciled (the plan sizes only those)
READY = {
    "conditions": [
        {
            "type": "Ready",
            "status": "True",
            "reason": "PodSetsApplied",
            "lastTransitionTime": "2026-12-01T00:00:00Z",
        }
    ]
}


def model_docs(count: int = 1) -> list[dict[str, Any]]:
    """The first `count` ModelDeployments of policies/base, in namespace `NS`, Ready."""
    out = []
    for d in _docs(ROOT / "policies" / "base" / "models.yaml")[:count]:
        d["metadata"]["namespace"] = NS
        d["status"] = dict(READY)
        out.append(d)
    return out


def models(count: int = 1) -> list[ModelDeployment]:
    return [ModelDeployment.model_validate(essence(d)) for d in model_docs(count)]


def tier_docs() -> list[dict[str, Any]]:
    return _docs(ROOT / "policies" / "base" / "tiers.yaml")


def node_docs() -> list[dict[str, Any]]:
    return _docs(ROOT / "e2e" / "inventory" / "paper-3regions.yaml")


def policy_body() -> dict[str, Any]:
    return {
        "apiVersion": "sageserve.io/v1alpha1",
        "kind": "ScalingPolicy",
        "metadata": {"name": POLICY, "namespace": NS, "generation": 1},
        "spec": {
            "strategy": "lt-immediate",
            "forecast": {
                "granularitySeconds": STEP_S,
                "trainingWindowSeconds": TRAINING_S,
                "method": "persistence",
            },
        },
    }


class FakeKube:
    """The objects of namespace `NS`, every model's pod sets at `current` replicas; records
    status patches and Events."""

    def __init__(self, count: int = 1, current: Mapping[tuple[str, str, str], int] | None = None):
        self.mds = model_docs(count)
        self.current = dict(current or {})
        self.patches: list[dict[str, Any]] = []
        self.events: list[tuple[str, str]] = []
        #: the type (Normal, Warning) of the last Event of each reason
        self.event_types: dict[str, str] = {}

    def objects(self, namespace: str, plural: str) -> list[dict[str, Any]]:
        return {"modeldeployments": self.mds, "workloadtiers": tier_docs()}.get(plural, [])

    def deployments_by_owner(self, namespace: str) -> dict[str, dict[str, dict[str, Any]]]:
        out: dict[str, dict[str, dict[str, Any]]] = {}
        for (m, r, v), n in self.current.items():
            out.setdefault(m, {})[pod_set_name(m, r, v)] = {"spec": {"replicas": n}}
        return out

    def nodes(self) -> list[dict[str, Any]]:
        return node_docs()

    def patch_status(self, namespace: str, plural: str, name: str, patch: dict[str, Any]) -> None:
        self.patches.append(patch)

    def event(self, body: dict[str, Any], type_: str, reason: str, message: str) -> None:
        self.events.append((reason, message))
        self.event_types[reason] = type_

    def plan(self) -> dict[str, Any]:
        """The last `status.plan` written."""
        return next(p["plan"] for p in reversed(self.patches) if "plan" in p)


class FakeReader:
    """Prometheus holding, per (model, region) of `NS`, the tokens/s vLLM counts (`total`,
    interactive and batch together), the batch tokens/s the routers served and received,
    and per model the batch deadline need the routers export (`need`: None, no series at
    all; `need_fails`: the query is not answered)."""

    def __init__(
        self,
        total: Series,
        served: Series | None = None,
        received: Series | None = None,
        need: Mapping[str, float] | None = None,
        need_fails: bool = False,
    ) -> None:
        self.total, self.served, self.received = total, served or {}, received or {}
        self.need = need
        self.need_fails = need_fails
        self.instants: list[str] = []

    def history(
        self, expr: str, end: float, seconds: float, step: float
    ) -> dict[tuple[str, str, str], list[float]]:
        if queries.BATCH_ACCEPTED_TOKENS in expr:
            series = self.received
        elif queries.ROUTER_POOL_REQUESTS in expr:
            series = {}
        elif "sageserve_router_tokens" in expr:
            series = self.served
        else:
            series = self.total
        n = max(1, int(seconds // step))
        return {(NS, m, r): ([math.nan] * n + list(v))[-n:] for (m, r), v in series.items()}

    def instant(self, expr: str) -> dict[tuple[str, str, str], float]:
        self.instants.append(expr)
        if self.need_fails:
            raise MetricsUnavailable("Prometheus at fake did not answer: 503")
        assert expr == queries.batch_deadline_need(NS)
        return {(NS, m, ""): v for m, v in (self.need or {}).items()}


def plan_pass(kube: FakeKube, reader: FakeReader, log: logging.Logger) -> PlanCycle | None:
    """One hourly plan of the `fleet` policy, as the operator's plan loop runs it."""
    return PlanPass(kube, policy_body(), [], log).run(reader, NodeLabels())  # type: ignore[arg-type]
