"""`actuation: keda` in the pace pass: the same decisions as direct mode, recorded for the
operator's KEDA scaler instead of written to replicas, one ScaledObject per pod set, and
the switches between the two modes (controller.actuation, controller.pace_loop).

The pass runs in process against the Prometheus and Kubernetes stand-ins of the batch
deadline tests (a need of 2400 tokens/s scales r1 from 2 to 3 and r2 from 1 to 2), the
Kubernetes one extended with ScaledObjects.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from sageserve.controller.faults import Sizing, ownership
from sageserve.controller.kube import keda_unavailable
from sageserve.controller.pace_loop import PacePass, PaceState
from sageserve.core.labels import ANNOTATION_ACTUATION, ANNOTATION_REPLICAS
from sageserve.keda import externalscaler_pb2 as pb
from sageserve.keda.scaler import METRIC_NAME, DecisionBoard
from sageserve.keda.server import ExternalScaler
from tests.controller.test_deadlines import (
    MODEL,
    NS,
    FakeKube,
    PrometheusStub,
    prometheus,  # noqa: F401  (the fixture)
    sample,
)

ADDRESS = "127.0.0.1:9100"
#: what direct mode writes for a need of 2400 tokens/s (test_deadlines)
DIRECT = {"m-r1-h100": 3, "m-r2-h100": 2}
CURRENT = {"m-r1-h100": 2, "m-r1-a100": 0, "m-r2-h100": 1, "m-r2-a100": 0}


class KedaKube(FakeKube):
    """The Kubernetes stand-in with KEDA's ScaledObjects (or without its CRD), recording
    every write of replicas."""

    def __init__(self, crd: bool = True) -> None:
        super().__init__()
        self.crd = crd
        self.scaled: dict[str, dict[str, Any]] = {}
        self.replica_writes: list[tuple[str, int]] = []
        self.annotations: list[tuple[str, dict[str, str]]] = []
        self.policy_status: dict[str, Any] = {}
        self.hpas: dict[str, list[str]] = {}

    def autoscalers(self, namespace: str) -> dict[str, list[str]]:
        return self.hpas

    def scaled_objects(self, namespace: str) -> dict[str, dict[str, Any]]:
        if not self.crd:
            raise keda_unavailable(ApiException(status=404, reason="Not Found"), namespace)
        return {k: dict(v) for k, v in self.scaled.items()}

    def apply_scaled_object(self, body: dict[str, Any]) -> None:
        self.scaled[body["metadata"]["name"]] = body

    def delete_scaled_object(self, namespace: str, name: str) -> None:
        self.scaled.pop(name, None)

    def annotate_deployment(self, namespace: str, name: str, annotations: dict[str, str]) -> None:
        self.annotations.append((name, annotations))
        self.pod_sets[name]["metadata"]["annotations"].update(annotations)

    def set_replicas(
        self,
        namespace: str,
        observed: dict[str, Any],
        replicas: int,
        drop_scaling: bool = False,
        drop_actuation: bool = False,
    ) -> None:
        self.replica_writes.append((observed["metadata"]["name"], replicas))
        super().set_replicas(namespace, observed, replicas, drop_scaling)
        if drop_actuation:
            self.pod_sets[observed["metadata"]["name"]]["metadata"]["annotations"].pop(
                ANNOTATION_ACTUATION, None
            )

    def patch_status(self, namespace: str, plural: str, name: str, status: dict[str, Any]) -> None:
        super().patch_status(namespace, plural, name, status)
        if plural == "scalingpolicies":
            self.policy_status.update(status)

    def hpa_writes(self, replicas: dict[str, int]) -> None:
        """KEDA's HPA sizes pod sets (through /scale, as kube-controller-manager)."""
        for name, n in replicas.items():
            d = self.pod_sets[name]
            d["spec"]["replicas"] = n
            d["metadata"]["managedFields"] = [
                {
                    "manager": "kube-controller-manager",
                    "operation": "Update",
                    "subresource": "scale",
                    "time": "2026-01-01T00:00:00Z",
                    "fieldsV1": {"f:spec": {"f:replicas": {}}},
                }
            ]

    def actuation(self) -> tuple[str, str, str]:
        c = next(c for c in self.policy_status["conditions"] if c["type"] == "Actuation")
        return c["status"], c["reason"], c["message"]


def keda_policy(actuation: str = "keda") -> dict[str, Any]:
    return {
        "apiVersion": "sageserve.io/v1alpha1",
        "kind": "ScalingPolicy",
        "metadata": {"name": "p", "namespace": NS, "generation": 1},
        "spec": {
            "strategy": "reactive",
            "spot": {"enabled": False},
            "actuation": actuation,
            "keda": {"scalerAddress": ADDRESS, "failureThreshold": 4},
        },
    }


def run(
    kube: FakeKube,
    state: PaceState,
    board: DecisionBoard,
    stub: PrometheusStub,
    need: float,
    actuation: str = "keda",
) -> None:
    stub.need = [sample(need, namespace=NS, model_deployment=MODEL)] if need else []
    policy = keda_policy(actuation)
    PacePass(kube, policy, state, logging.getLogger("t"), board).run()  # type: ignore[arg-type]


def served(board: DecisionBoard, kube: KedaKube, pod_set: str) -> tuple[float, bool]:
    """What the gRPC scaler answers KEDA for `pod_set`, from its ScaledObject's trigger."""
    meta = kube.scaled[pod_set]["spec"]["triggers"][0]["metadata"]
    scaler = ExternalScaler(lambda ns, name: CURRENT.get(name), board)
    ref = pb.ScaledObjectRef(name=pod_set, namespace=NS, scalerMetadata=meta)
    request = pb.GetMetricsRequest(scaledObjectRef=ref, metricName=METRIC_NAME)
    value = scaler.get_metrics(request, None).metricValues[0].metricValueFloat  # type: ignore[arg-type]
    return value, scaler.is_active(ref, None).result  # type: ignore[arg-type]


def test_keda_mode_serves_exactly_what_direct_mode_writes_and_writes_no_replicas(
    prometheus: PrometheusStub,  # noqa: F811
) -> None:
    direct = KedaKube()
    run(direct, PaceState(), DecisionBoard(), prometheus, 2400.0, actuation="direct")
    assert dict(direct.replica_writes) == DIRECT

    kube, board = KedaKube(), DecisionBoard()
    run(kube, PaceState(), board, prometheus, 2400.0)
    assert kube.replica_writes == []  # KEDA's HPA writes them
    for name, current in CURRENT.items():
        expected = DIRECT.get(name, current)
        assert served(board, kube, name) == (float(expected), expected > 0)
        so = kube.scaled[name]["spec"]
        assert so["fallback"] == {"failureThreshold": 4, "replicas": expected}
        assert so["scaleTargetRef"]["name"] == name and so["maxReplicaCount"] in (4, 2)
    # marked before its ScaledObject exists: the HPA's first write is no conflict
    assert sorted(n for n, a in kube.annotations) == sorted(CURRENT)
    status, reason, message = kube.actuation()
    assert (status, reason) == ("True", "Keda") and "m-r1-h100" in message and ADDRESS in message
    scaled = [m for _, _, r, m in kube.events if r == "ScaledOut"]
    assert "r1/h100=3" in scaled[0] and "through KEDA" in scaled[0]
    assert [r for kind, _, r, _ in kube.events if kind == "ModelDeployment"].count(
        "ScaledObjectsCreated"
    ) == 1


def test_handing_over_to_keda_starts_from_the_current_replicas(
    prometheus: PrometheusStub,  # noqa: F811
) -> None:
    kube, board = KedaKube(), DecisionBoard()
    run(kube, PaceState(), board, prometheus, 0.0)  # nothing to change
    for name, current in CURRENT.items():
        assert served(board, kube, name) == (float(current), current > 0)
        assert kube.scaled[name]["spec"]["fallback"]["replicas"] == current
    assert kube.replica_writes == []


def without_false(value: Any) -> Any:
    """`value` as KEDA writes a ScaledObject back (Go `omitempty`: false booleans dropped)."""
    if isinstance(value, dict):
        return {k: without_false(v) for k, v in value.items() if v is not False}
    if isinstance(value, list):
        return [without_false(v) for v in value]
    return value


def test_a_scaled_object_keda_wrote_back_is_not_applied_again_each_pass(
    prometheus: PrometheusStub,  # noqa: F811
) -> None:
    kube, board, state = KedaKube(), DecisionBoard(), PaceState()
    run(kube, state, board, prometheus, 0.0)
    assert kube.scaled["m-r1-h100"]["spec"]["advanced"]["restoreToOriginalReplicaCount"] is False
    # KEDA adds its finalizer with an Update that drops restoreToOriginalReplicaCount: false
    kube.scaled = {name: without_false(so) for name, so in kube.scaled.items()}
    applied: list[str] = []
    original = kube.apply_scaled_object
    kube.apply_scaled_object = lambda body: (  # type: ignore[method-assign]
        applied.append(body["metadata"]["name"]),
        original(body),
    )[-1]
    run(kube, state, board, prometheus, 0.0)
    assert applied == []  # nothing changed: no write, no reconcile of KEDA's for nothing
    run(kube, state, board, prometheus, 2400.0)  # a decision changes the fallback: applied
    assert sorted(applied) == sorted(DIRECT)


def test_the_hpa_of_our_scaled_object_is_no_conflict_and_its_sizes_are_paced_on(
    prometheus: PrometheusStub,  # noqa: F811
) -> None:
    kube, board, state = KedaKube(), DecisionBoard(), PaceState()
    run(kube, state, board, prometheus, 2400.0)
    kube.hpa_writes(DIRECT)
    assert ownership(kube.pod_sets["m-r1-h100"]).sizing is Sizing.KEDA
    run(kube, state, board, prometheus, 2400.0)
    assert kube.replica_writes == []
    assert not any(r == "ReplicasConflict" for _, _, r, _ in kube.events)
    conditions = {c["type"]: c for c in kube.policy_status["conditions"]}
    assert "Conflict" not in conditions or conditions["Conflict"]["status"] == "False"
    # a writer that is not ours, in direct mode, is still a conflict held as before
    foreign = KedaKube()
    foreign.hpa_writes({"m-r1-h100": 5})
    assert ownership(foreign.pod_sets["m-r1-h100"]).sizing is Sizing.CONFLICT


def test_without_keda_s_crd_keda_mode_says_so_and_leaves_replicas_alone(
    prometheus: PrometheusStub,  # noqa: F811
) -> None:
    kube, board = KedaKube(crd=False), DecisionBoard()
    run(kube, PaceState(), board, prometheus, 2400.0)
    status, reason, message = kube.actuation()
    assert (status, reason) == ("False", "KedaNotInstalled")
    assert "scaledobjects.keda.sh is not installed" in message
    assert kube.replica_writes == [] and kube.annotations == [] and kube.scaled == {}
    assert board.get(NS, "m-r1-h100") is None
    assert any(t == "Warning" and r == "KedaNotInstalled" for _, t, r, _ in kube.events)


def test_back_to_direct_deletes_the_scaled_objects_then_takes_the_pod_sets_back(
    prometheus: PrometheusStub,  # noqa: F811
) -> None:
    kube, board, state = KedaKube(), DecisionBoard(), PaceState()
    run(kube, state, board, prometheus, 2400.0)
    kube.hpa_writes(DIRECT)
    run(kube, state, board, prometheus, 0.0, actuation="direct")
    assert kube.scaled == {}  # deleted: restoreToOriginalReplicaCount false keeps sizes
    assert kube.replica_writes == []  # held until the ScaledObjects are gone
    assert "waiting for ScaledObject(s)" in kube.actuation()[2]
    run(kube, state, board, prometheus, 0.0, actuation="direct")
    assert sorted(kube.replica_writes) == sorted({**CURRENT, **DIRECT}.items())  # stamped
    for d in kube.pod_sets.values():
        assert ANNOTATION_ACTUATION not in d["metadata"]["annotations"]
        assert d["metadata"]["annotations"][ANNOTATION_REPLICAS] == str(d["spec"]["replicas"])
        assert ownership(d).sizing is Sizing.OURS
    assert kube.actuation()[:2] == ("True", "Direct")
    assert board.get(NS, "m-r1-h100") is None
    took = [m for kind, _, r, m in kube.events if r == "TookBack"]
    assert any("m-r1-h100 taken back from KEDA at 3 replica(s)" in m for m in took)
    kube.replica_writes.clear()
    # direct writes resume from the sizes KEDA left (a new state: no cooldown in the way)
    run(kube, PaceState(), board, prometheus, 4000.0, actuation="direct")
    assert kube.replica_writes and all(n > DIRECT.get(p, 0) for p, n in kube.replica_writes)


@pytest.mark.parametrize("dry_run", ["true"])
def test_a_dry_run_creates_no_scaled_object(
    prometheus: PrometheusStub,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch,
    dry_run: str,
) -> None:
    monkeypatch.setenv("SAGESERVE_DRY_RUN", dry_run)
    kube, board = KedaKube(), DecisionBoard()
    run(kube, PaceState(), board, prometheus, 2400.0)
    assert kube.scaled == {} and kube.replica_writes == [] and board.get(NS, "m-r1-h100") is None


def test_a_foreign_autoscaler_on_a_keda_sized_pod_set_is_named(
    prometheus: PrometheusStub,  # noqa: F811
) -> None:
    kube, board = KedaKube(), DecisionBoard()
    kube.hpas = {
        "m-r1-h100": ["HorizontalPodAutoscaler/keda-hpa-m-r1-h100", "HorizontalPodAutoscaler/team"]
    }
    run(kube, PaceState(), board, prometheus, 0.0)
    status, reason, message = kube.actuation()
    assert (status, reason) == ("False", "ForeignAutoscaler")
    assert "pod set m-r1-h100: also sized by HorizontalPodAutoscaler/team" in message
    assert "keda-hpa-m-r1-h100," not in message  # its own HPA is no foreign one
    assert any(t == "Warning" and r == "ForeignAutoscaler" for _, t, r, _ in kube.events)


def test_a_direct_policy_never_drops_the_decisions_of_a_keda_one_beside_it(
    prometheus: PrometheusStub,  # noqa: F811
) -> None:
    kube, board = KedaKube(), DecisionBoard()
    run(kube, PaceState(), board, prometheus, 2400.0)
    board.record(NS, {"other-r1-h100": board.get(NS, "m-r1-h100")})  # type: ignore[dict-item]
    kube.md["spec"]["policyRef"]["name"] = "q"  # m now under another policy: p paces nothing
    run(kube, PaceState(), board, prometheus, 0.0, actuation="direct")
    assert board.get(NS, "other-r1-h100") is not None
