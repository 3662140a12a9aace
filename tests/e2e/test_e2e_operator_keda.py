"""`ScalingPolicy.spec.actuation: keda` on the real control plane with a real KEDA.

The operator runs in-process and serves KEDA's external scaler gRPC interface on
loopback (where the KEDA operator, a process on this machine, dials it); KEDA's
HorizontalPodAutoscaler `keda-hpa-<pod set>` is synced by the real kube-controller-manager
through the API server's `external.metrics.k8s.io` (KEDA's metrics adapter). What a
platform team relies on:

- the pace step decides, KEDA writes: a scale-out reaches the Deployment through KEDA's
  HPA (the last writer of `spec.replicas` in managedFields is the controller-manager
  through `deployments/scale`, never the operator), and no `ReplicasConflict` is raised;
- switching direct → keda → direct moves no replica: each pod set keeps its size across
  each switch until the next decision, the ScaledObjects and their HPAs are gone on the
  way back, and the operator writes again after;
- a model at zero wakes through KEDA's activation (`IsActive`) on requests the real router
  holds for it;
- with the operator stopped, the pod set stays at the plan in force (the ScaledObject's
  `fallback.replicas`), not at zero: the HPA cannot read its metric and keeps the size,
  and KEDA does not scale to zero on a scaler error while `fallback.replicas` is above 0.
  (KEDA v2.20.2's own fallback counter does not run for an unreachable external scaler:
  docs/keda.md, When the operator dies.)
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from e2e.keda import KedaState
from e2e_helpers import eventually, kubectl
from fault_kit import condition, deployment, events, steady, wait_condition
from kopf.testing import KopfRunner
from operator_kit import (
    MODEL,
    FakeVllm,
    RouterProcess,
    apply,
    free_port,
    model_deployment,
    operator_args,
    operator_env,
    replicas,
    scaling_policy,
)

from sageserve.core.labels import ACTUATION_KEDA, ANNOTATION_ACTUATION, ANNOTATION_REPLICAS

HPA_MANAGER = "kube-controller-manager"  # the HPA controller writes through deployments/scale
KEDA_MANAGER = "keda-operator"  # KEDA's own writes (activation from zero)
PACE_MANAGER = "sageserve-pace"  # the operator's replica writes
SERVED = "meta-llama/Llama-3.1-8B-Instruct"
#: one decision through KEDA: the pace pass (2 s), KEDA's poll (2 s), the HPA's sync (2 s),
#: a Prometheus scrape (5 s), with room for a loaded machine
STEP_S = 60


def keda_env(monkeypatch: pytest.MonkeyPatch, keda: KedaState) -> str:
    """The operator serves the scaler where the KEDA operator reaches it; the address."""
    address = f"{keda.scaler_host}:{free_port()}"
    monkeypatch.setenv("SAGESERVE_SCALER_LISTEN", address)
    monkeypatch.setenv("SAGESERVE_SCALER_ADDRESS", address)
    return address


def get(kubeconfig: Path, namespace: str, kind: str, name: str) -> dict[str, Any] | None:
    out = kubectl(kubeconfig, ["get", kind, name, "-n", namespace, "-o", "json"], check=False)
    if out.returncode != 0:
        return None
    found: dict[str, Any] = json.loads(out.stdout)
    return found


def with_fields(kubeconfig: Path, namespace: str, name: str) -> dict[str, Any]:
    """The Deployment with its managedFields (kubectl leaves them out unless asked)."""
    args = ["get", "deployment", name, "-n", namespace, "-o", "json", "--show-managed-fields"]
    found: dict[str, Any] = json.loads(kubectl(kubeconfig, args).stdout)
    return found


def replicas_writers(dep: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(manager, operation, subresource) of the managedFields entries owning spec.replicas."""
    return [
        (e.get("manager", ""), e.get("operation", ""), e.get("subresource", ""))
        for e in dep["metadata"].get("managedFields") or []
        if "f:replicas" in ((e.get("fieldsV1") or {}).get("f:spec") or {})
    ]


def set_actuation(kubeconfig: Path, namespace: str, actuation: str) -> None:
    patch = json.dumps({"spec": {"actuation": actuation}})
    kubectl(
        kubeconfig,
        ["patch", "scalingpolicy", "fleet", "-n", namespace, "--type=merge", "-p", patch],
    )


def keda_log(path: str, word: str, lines: int = 40) -> str:
    """The last lines of a KEDA process's log that mention `word` (for a failure's message)."""
    found = [ln for ln in Path(path).read_text(errors="replace").splitlines() if word in ln]
    return "\n".join(ln[:400] for ln in found[-lines:])


def so_condition(obj: dict[str, Any] | None, type_: str) -> dict[str, Any] | None:
    conditions = ((obj or {}).get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c.get("type") == type_), None)


def never_conflicted(kubeconfig: Path, namespace: str) -> None:
    assert events(kubeconfig, namespace, "ReplicasConflict") == [], "a ReplicasConflict Event"
    conflict = condition(kubeconfig, namespace, "Conflict")
    assert conflict is None or conflict["status"] == "False", conflict


@pytest.mark.usefixtures("restore_node_pools")
def test_keda_writes_what_the_pace_step_decides_and_switching_moves_no_replica(
    kubeconfig: Path,
    keda: KedaState,
    namespace: str,
    prometheus_url: str,
    prometheus_targets_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    region = "us-east"
    pod_set = f"{MODEL}-{region}-a100"
    hpa = f"keda-hpa-{pod_set}"
    operator_env(monkeypatch, kubeconfig, namespace, prometheus_url, 0)
    address = keda_env(monkeypatch, keda)
    fake = FakeVllm()  # KV 0.5: between the thresholds, nothing to decide
    target = fake.scrape(prometheus_targets_dir, namespace, region, kubeconfig)

    def size() -> int | None:
        return replicas(kubeconfig, namespace, region)

    def same_size(want: int) -> bool:
        """A probe's side check: the pod set never leaves `want` while a switch settles."""
        now = size()
        assert now == want, f"replicas moved from {want} to {now} across the switch"
        return True

    try:
        with KopfRunner(operator_args(namespace), timeout=600) as runner:
            apply(kubeconfig, namespace, scaling_policy("reactive"))
            apply(kubeconfig, namespace, model_deployment([region], gpus=2, lo=1, hi=3))
            eventually(
                lambda: (
                    size() == 1
                    and deployment(kubeconfig, namespace, pod_set)["metadata"]
                    .get("annotations", {})
                    .get(ANNOTATION_REPLICAS)
                    == "1"
                ),
                STEP_S,
                "the pod set sized at 1 by the operator (direct)",
            )

            # direct -> keda: the ScaledObject and its HPA appear, replicas stay at 1
            set_actuation(kubeconfig, namespace, "keda")
            actuation = wait_condition(kubeconfig, namespace, "Actuation", "True", STEP_S, "Keda")
            assert pod_set in actuation["message"] and address in actuation["message"]
            so = eventually(
                lambda: same_size(1) and get(kubeconfig, namespace, "scaledobject", pod_set),
                STEP_S,
                f"ScaledObject {pod_set}",
            )
            trigger = so["spec"]["triggers"][0]
            assert (trigger["type"], trigger["metadata"]["scalerAddress"]) == ("external", address)
            assert trigger["metadata"]["podSet"] == pod_set
            assert so["spec"]["fallback"]["replicas"] == 1
            # false is KEDA's default, which it leaves out when it writes the object back
            assert so["spec"]["advanced"].get("restoreToOriginalReplicaCount", False) is False
            marked = deployment(kubeconfig, namespace, pod_set)["metadata"]["annotations"]
            assert marked.get(ANNOTATION_ACTUATION) == ACTUATION_KEDA
            assert events(kubeconfig, namespace, "ScaledObjectsCreated")
            # the HPA reads the scaler's answer through the API server: the current size
            eventually(
                lambda: (
                    same_size(1)
                    and (h := get(kubeconfig, namespace, "hpa", hpa))
                    and (h.get("status") or {}).get("currentMetrics")
                    and h["status"].get("desiredReplicas") == 1
                ),
                STEP_S,
                f"HPA {hpa} synced, desiring the current 1 replica",
            )
            # three HPA syncs, three pace passes: neither the size nor the ScaledObject moves
            # (a pass that applied it again each time would bump its generation)
            steady(
                lambda: (
                    size(),
                    (get(kubeconfig, namespace, "scaledobject", pod_set) or {})["metadata"][
                        "generation"
                    ],
                ),
                6,
                "the pod set handed to KEDA and its ScaledObject",
            )
            never_conflicted(kubeconfig, namespace)

            # a scale-out decided by the pace step reaches the Deployment through the HPA
            fake.set(0.9)
            eventually(lambda: size() == 3, 2 * STEP_S, "scale-out to 3 through KEDA")
            dep = with_fields(kubeconfig, namespace, pod_set)
            assert replicas_writers(dep) == [(HPA_MANAGER, "Update", "scale")], dep["metadata"]
            scaled = [e["message"] for e in events(kubeconfig, namespace, "ScaledOut")]
            assert scaled and all("through KEDA" in m for m in scaled), scaled
            hpa_now = get(kubeconfig, namespace, "hpa", hpa)
            assert hpa_now is not None and hpa_now["status"]["desiredReplicas"] == 3
            eventually(
                lambda: (
                    (o := get(kubeconfig, namespace, "scaledobject", pod_set))
                    and o["spec"]["fallback"]["replicas"] == 3
                ),
                STEP_S,
                "fallback.replicas following the plan in force (3)",
            )
            never_conflicted(kubeconfig, namespace)

            # keda -> direct: ScaledObject and HPA gone, taken back at 3, no jump
            fake.set(0.5)
            set_actuation(kubeconfig, namespace, "direct")
            eventually(
                lambda: (
                    same_size(3)
                    and get(kubeconfig, namespace, "scaledobject", pod_set) is None
                    and get(kubeconfig, namespace, "hpa", hpa) is None
                ),
                STEP_S,
                f"ScaledObject {pod_set} and HPA {hpa} deleted",
            )
            took = eventually(
                lambda: same_size(3) and events(kubeconfig, namespace, "TookBack"),
                STEP_S,
                "TookBack",
            )
            assert f"pod set {pod_set} taken back from KEDA at 3 replica(s)" in took[0]["message"]
            assert events(kubeconfig, namespace, "ScaledObjectsDeleted")
            eventually(
                lambda: (
                    same_size(3)
                    and (c := condition(kubeconfig, namespace, "Actuation"))
                    and c["reason"] == "Direct"
                    and "waiting" not in c["message"]
                ),
                STEP_S,
                "Actuation=True/Direct with nothing left to wait for",
            )
            back = deployment(kubeconfig, namespace, pod_set)["metadata"]["annotations"]
            assert ANNOTATION_ACTUATION not in back and back[ANNOTATION_REPLICAS] == "3"

            # the operator writes again: low load scales in by its own patch
            fake.set(0.1)
            eventually(lambda: size() == 1, 2 * STEP_S, "scale-in by the operator")
            dep = with_fields(kubeconfig, namespace, pod_set)
            assert replicas_writers(dep) == [(PACE_MANAGER, "Update", "")], replicas_writers(dep)
            scaled_in = [e["message"] for e in events(kubeconfig, namespace, "ScaledIn")]
            assert scaled_in and not any("through KEDA" in m for m in scaled_in), scaled_in
            never_conflicted(kubeconfig, namespace)
        assert runner.exception is None, runner.output
    finally:
        target.unlink(missing_ok=True)
        fake.close()


class Backend:
    """What answers for the pods once one is Ready: a completion, on loopback."""

    def __init__(self) -> None:
        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                body = json.dumps(
                    {
                        "id": "cmpl-1",
                        "object": "text_completion",
                        "model": SERVED,
                        "choices": [{"index": 0, "text": " hello", "finish_reason": "length"}],
                        "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
                    }
                ).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                return

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def backend() -> Iterator[Backend]:
    found = Backend()
    yield found
    found.close()


@pytest.mark.usefixtures("restore_node_pools")
def test_a_model_at_zero_wakes_through_keda_and_stays_at_the_plan_when_the_operator_stops(
    kubeconfig: Path,
    keda: KedaState,
    namespace: str,
    prometheus_url: str,
    prometheus_targets_dir: Path,
    backend: Backend,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    region = "us-central"
    pod_set = f"{MODEL}-{region}-a100"
    hpa = f"keda-hpa-{pod_set}"
    operator_env(monkeypatch, kubeconfig, namespace, prometheus_url, 0)
    keda_env(monkeypatch, keda)
    model = model_deployment([region], gpus=2, lo=0, hi=2)
    model["spec"]["regions"][0]["initialInstances"] = 0

    def size() -> int | None:
        return replicas(kubeconfig, namespace, region)

    router: RouterProcess | None = None
    try:
        with KopfRunner(operator_args(namespace), timeout=600) as runner:
            apply(kubeconfig, namespace, scaling_policy("reactive", actuation="keda"), model)
            so = eventually(
                lambda: get(kubeconfig, namespace, "scaledobject", pod_set),
                STEP_S,
                f"ScaledObject {pod_set}",
            )
            assert so["spec"]["minReplicaCount"] == 0
            eventually(
                lambda: (
                    (
                        so_condition(get(kubeconfig, namespace, "scaledobject", pod_set), "Active")
                        or {}
                    ).get("status")
                    == "False"
                ),
                STEP_S,
                "KEDA reading the pod set inactive (nothing decided above 0, nothing held)",
            )
            assert size() == 0

            router = RouterProcess(
                kubeconfig,
                namespace,
                backend.url,
                prometheus_url,
                prometheus_targets_dir,
                "--hold-seconds",
                "150",
            )
            answer: dict[str, Any] = {}

            def client() -> None:
                assert router is not None
                answer["reply"] = router.post(
                    "/v1/completions",
                    {"model": SERVED, "prompt": "Say hello.", "max_tokens": 1},
                    {"x-sageserve-region": region},
                    timeout=180,
                )

            waiting = threading.Thread(target=client, daemon=True)
            waiting.start()
            eventually(
                lambda: (
                    router.metric("sageserve_router_held_requests", model_deployment=MODEL) == 1
                ),
                30,
                "the request held by the router",
            )
            eventually(lambda: (size() or 0) >= 1, 2 * STEP_S, "the pod set woken from zero")
            dep = with_fields(kubeconfig, namespace, pod_set)
            writers = replicas_writers(dep)
            # KEDA's activation (0 -> 1); its HPA agrees with the plan of 1 and writes nothing
            assert writers == [(KEDA_MANAGER, "Update", "scale")], writers
            # KEDA writes its Active condition after the scale it decided, on its own pass
            eventually(
                lambda: (
                    (
                        so_condition(get(kubeconfig, namespace, "scaledobject", pod_set), "Active")
                        or {}
                    ).get("status")
                    == "True"
                ),
                STEP_S,
                "KEDA reading the pod set active (a request held for it)",
            )
            woke = [e["message"] for e in events(kubeconfig, namespace, "ScaledOut")]
            assert any("from zero: 1 request(s) waiting" in m for m in woke), woke
            waiting.join(timeout=STEP_S)
            status, body = answer.get("reply", (0, b"no answer"))
            assert status == 200, (body, router.command.output()[-3000:])
            eventually(
                lambda: (
                    (o := get(kubeconfig, namespace, "scaledobject", pod_set))
                    and o["spec"]["fallback"]["replicas"] == 1
                ),
                STEP_S,
                "fallback.replicas at the plan in force (1)",
            )
            never_conflicted(kubeconfig, namespace)
        assert runner.exception is None, runner.output

        # The operator is gone: every call to the scaler is refused. KEDA v2.20.2 asks for
        # the metric spec before it counts a failed metric read, so an unreachable external
        # scaler never reaches its fallback counter (kedacore/keda#8056: `health` stays
        # Happy, the Fallback condition False). What holds the pod set at the plan in force
        # is the HPA, which cannot read the metric and keeps the size it has, and KEDA,
        # which does not scale a target to zero on a scaler error while fallback.replicas
        # is above 0.
        def unable() -> dict[str, Any] | None:
            status = (get(kubeconfig, namespace, "hpa", hpa) or {}).get("status") or {}
            active = next(
                (c for c in status.get("conditions") or [] if c["type"] == "ScalingActive"), {}
            )
            return active if active.get("reason") == "FailedGetExternalMetric" else None

        try:
            eventually(unable, STEP_S, f"HPA {hpa} unable to read the metric")
        except AssertionError as err:
            raise AssertionError(
                f"{err}\nKEDA operator log:\n{keda_log(keda.operator_log, pod_set)}"
            ) from err
        plan = (get(kubeconfig, namespace, "scaledobject", pod_set) or {})["spec"]["fallback"]
        # several HPA syncs and KEDA polls, past its cooldown (the pace interval, 2 s)
        assert steady(size, 8, "the pod set with the operator stopped") == plan["replicas"] == 1
        assert keda_log(keda.operator_log, "connection refused"), "KEDA never dialled the scaler"
    finally:
        if router is not None:
            router.close()
