"""One plan and one pacing over three real control planes.

The session's cluster is the hub (region us-east, its operator in process); two more
control planes (their own etcd, API server, controller-manager, scheduler and KWOK GPU
nodes) are members serving eu-west and ap-south, each with the chart's member role
installed and read by the hub with that role's token alone. One Prometheus scrapes every
cluster's pods (the twins register them), as a federated one would.

What a platform team would check:
1. the hub writes each member's pod sets there (no owner reference a member could
   garbage-collect), and the members' pods serve;
2. a model's load in us-east outgrows its one instance: the plan gives a share of it to
   the other clusters, and the us-east router sends that share (no more) over HTTP to their
   routers, which serve it from their own pods with the hub's catalogue (read with the
   chart's member-router identity alone); each region's HTTPRoute carries the same shares
   as weights, and the members' InferencePools are theirs, exported to the ClusterSet;
3. a member's API server stopped: the `Clusters` condition names it, its pod sets keep the
   replicas they had (the load there fell, but nothing is scaled in), the other member keeps
   pacing (scales out); back, pacing resumes there (the scale-in comes then).
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, closing, contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import yaml
from e2e_helpers import eventually, kubectl
from fault_kit import figure
from fleet_kit import chart, control_plane, member_secret, token_kubeconfig, token_of
from kopf.testing import KopfRunner
from operator_kit import (
    A100,
    REPO,
    RouterProcess,
    TwinProcess,
    apply,
    model_deployment,
    operator_args,
    operator_env,
    policy_status,
    scaling_policy,
)

from e2e import gaie, kwok_cluster
from sageserve.api.model_deployment import pod_set_name
from sageserve.controller import inference_pool
from sageserve.metrics.prometheus import PrometheusReader

TRACE = REPO / "data/traces/azure-llm-2023/AzureLLMInferenceTrace_conv.csv.gz"
MODEL = "bloom"
SERVED = "bigscience/bloom"
#: bloom-176b on 8 A100s: at 0.05× of the conversation trace an instance idles, at 0.5× it
#: is saturated (test_e2e_twin.py)
LOW, HIGH = 0.05, 0.5
HOME, EU, AP = "us-east", "eu-west", "ap-south"


def _member_role(admin: Path, namespace: str) -> dict[str, Any]:
    """The chart's member role installed in the member (pod sets granted in `namespace`
    only); a kubeconfig with its ServiceAccount's token alone."""
    kubectl(admin, ["create", "namespace", namespace])
    release = f"m{uuid.uuid4().hex[:6]}"
    rendered = chart(
        release,
        namespace,
        "fleet.member.enabled=true",
        f"fleet.member.namespaces={{{namespace}}}",
        "gateway.inferencePool.enabled=true",
    )
    kubectl(admin, ["apply", "-n", namespace, "-f", "-"], stdin=rendered)
    return token_kubeconfig(admin, token_of(admin, namespace, f"{release}-sageserve-member-token"))


def _member_router_identity(hub: Path, namespace: str, into: Path) -> Path:
    """The hub chart's identity for member routers (`fleet.hub.memberRouters`), installed
    in the hub alone (no second operator); the path of a kubeconfig with its token alone."""
    release = f"h{uuid.uuid4().hex[:6]}"
    rendered = chart(
        release,
        namespace,
        "fleet.hub.enabled=true",
        "fleet.hub.memberRouters=true",
        f"router.namespaces={{{namespace}}}",
    )
    mine = [
        d
        for d in yaml.safe_load_all(rendered)
        if d and d["metadata"]["name"].startswith(f"{release}-sageserve-member-router")
    ]
    assert {d["kind"] for d in mine} == {"ServiceAccount", "Secret", "Role", "RoleBinding"}
    kubectl(hub, ["apply", "-n", namespace, "-f", "-"], stdin=yaml.safe_dump_all(mine))
    token = token_of(hub, namespace, f"{release}-sageserve-member-router-token")
    into.write_text(yaml.safe_dump(token_kubeconfig(hub, token)))
    return into


#: the Gateway API Inference Extension's CRDs (multi-cluster import included) and the
#: Gateway API's, in every cluster
CRDS = (
    "inferencepools.inference.networking.k8s.io",
    "inferenceobjectives.inference.networking.x-k8s.io",
    "inferencepoolimports.inference.networking.x-k8s.io",
    "gatewayclasses.gateway.networking.k8s.io",
    "gateways.gateway.networking.k8s.io",
    "httproutes.gateway.networking.k8s.io",
)


@contextmanager
def _gateway_crds(*kubeconfigs: Path) -> Iterator[None]:
    """The CRDs installed in each cluster, removed afterwards (the session's cluster serves
    later tests that expect none)."""
    paths = [*gaie.crd_paths(), gaie.import_crd(), *gaie.gateway_api_crds()]
    try:
        for kc in kubeconfigs:
            for path in paths:
                kubectl(kc, ["apply", "--server-side", "--force-conflicts", "-f", str(path)])
            kubectl(kc, ["wait", "--for=condition=Established", "crd", *CRDS, "--timeout=60s"])
        inference_pool.forget_discovery()
        yield
    finally:
        kubectl(kubeconfigs[0], ["delete", "crd", *CRDS, "--ignore-not-found", "--wait=true"])
        inference_pool.forget_discovery()


def _custom(kubeconfig: Path, namespace: str, kind: str, name: str) -> dict[str, Any] | None:
    out = kubectl(kubeconfig, ["get", kind, name, "-n", namespace, "-o", "json"], check=False)
    return json.loads(out.stdout) if out.returncode == 0 else None


def _weights(kubeconfig: Path, namespace: str, name: str) -> dict[str, int] | None:
    """An HTTPRoute's backends: `<kind>/<name>` → weight."""
    route = _custom(kubeconfig, namespace, "httproutes.gateway.networking.k8s.io", name)
    if route is None:
        return None
    [rule] = route["spec"]["rules"]
    return {f"{b['kind']}/{b['name']}": int(b["weight"]) for b in rule["backendRefs"]}


def _pod_set(kubeconfig: Path, namespace: str, region: str) -> dict[str, Any] | None:
    out = kubectl(
        kubeconfig,
        ["get", "deployment", pod_set_name(MODEL, region, "a100"), "-n", namespace, "-o", "json"],
        check=False,
    )
    return json.loads(out.stdout) if out.returncode == 0 else None


def _replicas(kubeconfig: Path, namespace: str, region: str) -> int | None:
    found = _pod_set(kubeconfig, namespace, region)
    return None if found is None else int(found["spec"].get("replicas") or 0)


def _ready(kubeconfig: Path, namespace: str, region: str) -> int:
    found = _pod_set(kubeconfig, namespace, region)
    return 0 if found is None else int((found.get("status") or {}).get("readyReplicas") or 0)


def _clusters(kubeconfig: Path, namespace: str, status: str) -> dict[str, Any] | None:
    conditions = policy_status(kubeconfig, namespace).get("conditions") or []
    found = next((c for c in conditions if c["type"] == "Clusters"), None)
    return found if found is not None and found["status"] == status else None


def _scaled_in_at(kubeconfig: Path, namespace: str, region: str) -> list[tuple[float, str]]:
    """When and how the operator scaled `region` in (its Events in the hub)."""
    out = kubectl(kubeconfig, ["get", "events", "-n", namespace, "-o", "json"])
    times = []
    for event in json.loads(out.stdout)["items"]:
        if event.get("reason") == "ScaledIn" and f"{region}/" in event.get("message", ""):
            at = event.get("lastTimestamp") or event.get("eventTime")
            when = datetime.fromisoformat(at.replace("Z", "+00:00")).timestamp()
            times.append((when, str(event["message"])))
    return times


def bloom() -> dict[str, Any]:
    # θ 600 tokens/s an instance: the twin's 0.05× of the trace (a few hundred tokens/s)
    # fits one with room to spare, its 0.5× in us-east does not
    md = model_deployment([HOME, EU, AP], A100, gpus=8, theta=600, lo=1, hi=2, name=MODEL)
    md["metadata"]["annotations"] = {"sageserve.io/perf-profile": "bloom-176b"}
    md["spec"]["model"] = {"name": SERVED}
    # through a gateway too: each region's HTTPRoute carries the plan's shares as weights
    md["spec"]["gateway"] = {"route": {"parentRefs": [{"name": "inference-gateway"}]}}
    for region in md["spec"]["regions"]:
        region["initialInstances"] = 1
        if region["name"] == HOME:
            region["maxInstances"] = 1  # its excess must go elsewhere
    return md


@pytest.mark.usefixtures("restore_node_pools")
def test_one_fleet_over_three_control_planes(
    kubeconfig: Path,
    namespace: str,
    prometheus_url: str,
    prometheus_targets_dir: Path,
    tmp_path: Path,
    tmp_path_factory: pytest.TempPathFactory,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with ExitStack() as stack:
        members = {
            region: stack.enter_context(control_plane(tmp_path, tmp_path_factory, region))
            for region in (EU, AP)
        }
        for region, (_, admin) in members.items():
            secret = member_secret(f"{region}-kubeconfig", region, _member_role(admin, namespace))
            kubectl(kubeconfig, ["apply", "-n", namespace, "-f", "-"], stdin=yaml.safe_dump(secret))
        stack.enter_context(_gateway_crds(kubeconfig, *(a for _, a in members.values())))
        operator_env(monkeypatch, kubeconfig, namespace, prometheus_url, 0)
        monkeypatch.setenv("SAGESERVE_ENDPOINT_PICKER", "{pool}-epp:9002")
        monkeypatch.setenv("SAGESERVE_MEMBER_CLUSTERS", "on")
        monkeypatch.setenv("SAGESERVE_LEASE_NAMESPACE", namespace)
        monkeypatch.setenv("SAGESERVE_CLUSTER_NAME", "hub")
        trace = ("--trace", str(TRACE), "--scale", str(LOW))
        twins = {
            HOME: stack.enter_context(
                closing(TwinProcess(kubeconfig, namespace, prometheus_targets_dir, *trace))
            )
        }
        for region, (_, admin) in members.items():
            twins[region] = stack.enter_context(
                closing(
                    TwinProcess(
                        admin,
                        namespace,
                        prometheus_targets_dir,
                        *trace,
                        "--profile",
                        f"{MODEL}=bloom-176b",
                        name=f"twin-{region}",
                    )
                )
            )
        runner = stack.enter_context(KopfRunner(operator_args(namespace), timeout=900))
        policy = scaling_policy(
            "lt-immediate",
            forecast={
                "method": "persistence",
                "granularitySeconds": 30,
                "trainingWindowSeconds": 300,
            },
            intervals={"planSeconds": 60, "paceSeconds": 2, "cooldownSeconds": 2},
            forecastGap={"windowSeconds": 20},
            spot={"enabled": False},
        )
        applied = time.monotonic()
        apply(kubeconfig, namespace, policy, bloom())

        # 1. each member's pod set written there, without an owner it does not have
        for region, (_, admin) in members.items():
            eventually(
                lambda a=admin, r=region: _ready(a, namespace, r) >= 1, 120, f"{region} serving"
            )
            found = _pod_set(admin, namespace, region)
            assert found is not None and "ownerReferences" not in found["metadata"]
        eventually(lambda: _ready(kubeconfig, namespace, HOME) >= 1, 120, "us-east serving")
        serving = time.monotonic() - applied
        assert _pod_set(kubeconfig, namespace, EU) is None  # nothing of a member's in the hub
        read = eventually(lambda: _clusters(kubeconfig, namespace, "True"), 60, "Clusters=True")
        assert read["reason"] == "ClustersReachable"
        took = eventually(lambda: _members_took_theirs(kubeconfig, namespace), 60, "MemberClusters")
        assert took["reason"] == "PodSetsApplied"

        # 2. us-east's excess crosses to another cluster's router
        # the members' routers read the hub's catalogue with the chart's identity for them
        catalogue = _member_router_identity(kubeconfig, namespace, tmp_path / "hub-reader.yaml")
        peers = {
            region: stack.enter_context(
                closing(
                    RouterProcess(
                        admin,
                        namespace,
                        twins[region].url,
                        prometheus_url,
                        prometheus_targets_dir,
                        "--hub-kubeconfig",
                        str(catalogue),
                        name=f"router-{region}",
                    )
                )
            )
            for region, (_, admin) in members.items()
        }
        router = stack.enter_context(
            closing(
                RouterProcess(
                    kubeconfig,
                    namespace,
                    twins[HOME].url,
                    prometheus_url,
                    prometheus_targets_dir,
                    *(a for r, p in peers.items() for a in ("--peer", f"{r}={p.url}")),
                )
            )
        )
        ap_workdir, ap_admin = members[AP]
        home = {"x-sageserve-region": HOME}
        body = {"model": SERVED, "prompt": "Say hello.", "max_tokens": 4}
        status, answer = router.post("/v1/completions", body, home)
        assert status == 200, answer
        assert _served(router, EU) + _served(router, AP) == 0  # below 70 %: home
        # us-east's load outgrows its one instance: the plan (every 60 s, on the last
        # minutes' tokens/s) sends a share of it to the other clusters
        # (0.25×: past one instance, but a queue that grows slowly enough to be answered)
        twins[HOME].load(0.25 / LOW, f"{namespace}/{MODEL}/{HOME}")
        loaded = time.monotonic()
        eventually(lambda: _shares(kubeconfig, namespace), 240, "a planned spill-over")
        planned_s = time.monotonic() - loaded
        reader = PrometheusReader(prometheus_url)
        sent = 40

        def home_emu() -> float:
            loads = reader.pod_loads(namespace)
            return max((p.kv_usage for n, p in loads.items() if HOME in n), default=0.0)

        def burst() -> tuple[dict[str, float], dict[str, float]] | None:
            """40 requests at once from us-east while it is above 70 % KV, under one plan
            with a share away (the plan is made again every 60 s on a noisy load, and the
            share may come and go): (the shares in force, requests served per region)."""
            at, shares = _computed_at(kubeconfig, namespace), _shares(kubeconfig, namespace)
            if not shares or home_emu() <= 0.75:
                return None
            before = {r: _served(router, r) for r in (HOME, EU, AP)}
            with ThreadPoolExecutor(sent) as pool:  # at once: the home queue is long
                answers = list(
                    pool.map(lambda _: router.post("/v1/completions", body, home, 240), range(sent))
                )
            assert all(status == 200 for status, _ in answers), answers
            if _computed_at(kubeconfig, namespace) != at:
                return None  # another plan came in the middle: again
            return shares, {r: _served(router, r) - before[r] for r in (HOME, EU, AP)}

        shares, served = eventually(burst, 360, "a burst from us-east under one plan", 5)
        assert sum(served.values()) == sent, served
        assert served[EU] + served[AP] > 0, (served, shares)
        for region in (EU, AP):  # within the plan's share (one request over, at most)
            assert served[region] / sent <= shares.get(region, 0.0) + 1.5 / sent, (served, shares)
        served_there = {r: _served(p, r) for r, p in peers.items()}
        assert served_there[EU] >= served[EU] and served_there[AP] >= served[AP], served_there
        # the same shares reach a gateway: us-east's HTTPRoute in the hub weighs its own
        # pool against the members' pools imported (InferencePoolImport), within a resync
        home_pool, ap_pool = f"{MODEL}-{HOME}", f"{MODEL}-{AP}"

        def routed() -> dict[str, int] | None:
            plan = _shares(kubeconfig, namespace) or {}
            weights = _weights(kubeconfig, namespace, home_pool)
            expected = {
                f"InferencePoolImport/{MODEL}-{r}": round(1000 * v) for r, v in plan.items()
            }
            if weights is None or any(weights.get(k) != w for k, w in expected.items()):
                return None
            return weights

        weights = eventually(routed, 90, "us-east's HTTPRoute weighted by the plan")
        assert weights[f"InferencePool/{home_pool}"] == 1000 - sum(
            w for k, w in weights.items() if k.startswith("InferencePoolImport/")
        )
        pool = _custom(ap_admin, namespace, "inferencepools.inference.networking.k8s.io", ap_pool)
        assert pool is not None and "ownerReferences" not in pool["metadata"]
        assert pool["metadata"]["annotations"]["inference.networking.x-k8s.io/export"] == (
            "ClusterSet"
        )
        assert _weights(ap_admin, namespace, ap_pool) == {f"InferencePool/{ap_pool}": 1000}
        twins[HOME].load(1.0, f"{namespace}/{MODEL}/{HOME}")
        # pacing on the engines' signals from here (the strategy a policy may change to)
        apply(kubeconfig, namespace, scaling_policy("reactive", spot={"enabled": False}))
        eventually(
            lambda: all(_replicas(a, namespace, r) == 1 for r, (_, a) in members.items()),
            180,
            "the members back to one instance each on their idle engines",
        )

        # 3. ap-south at two instances, then its API server stops as its load falls
        eu_admin = members[EU][1]
        twins[AP].load(HIGH / LOW, f"{namespace}/{MODEL}/{AP}")
        eventually(lambda: _replicas(ap_admin, namespace, AP) == 2, 180, "ap-south scaled out")

        def ap_ready() -> bool:
            return kubectl(ap_admin, ["get", "--raw", "/readyz"], check=False).returncode == 0

        resume = threading.Event()  # set once eu-west was seen paced (300 s at most)
        stopped = threading.Thread(
            target=kwok_cluster.restart_component,
            args=(ap_workdir, "kube-apiserver", 300.0, ap_ready),
            # its scheduler and controller-manager come back too
            kwargs={"watch_s": 20.0, "resume": resume},
            daemon=True,
        )
        went, went_wall = time.monotonic(), time.time()
        stopped.start()
        twins[AP].load(1.0, f"{namespace}/{MODEL}/{AP}")  # idle there now: scale-in is due
        twins[EU].load(HIGH / LOW, f"{namespace}/{MODEL}/{EU}")
        held = eventually(lambda: _clusters(kubeconfig, namespace, "False"), 60, "ap-south named")
        named_s = time.monotonic() - went
        assert held["reason"] == "ClusterUnreachable" and f"{AP} (regions {AP}:" in held["message"]
        eventually(lambda: _replicas(eu_admin, namespace, EU) == 2, 120, "eu-west paced meanwhile")
        assert stopped.is_alive(), "the outage's 300 s bound passed before eu-west was paced"
        time.sleep(10)  # a few more pace passes (every 2 s) while ap-south's load is low
        resume.set()

        # back when its API server answers (the thread goes on minding its other components)
        eventually(lambda: not stopped.is_alive() or ap_ready(), 200, "ap-south's API server")
        back, back_wall = time.monotonic(), time.time()
        eventually(lambda: _clusters(kubeconfig, namespace, "True"), 60, "ap-south read again")
        read_again_s = time.monotonic() - back
        eventually(lambda: _replicas(ap_admin, namespace, AP) == 1, 180, "ap-south paced again")
        resumed_s = time.monotonic() - back
        scaled_in = _scaled_in_at(kubeconfig, namespace, AP)
        # nothing scaled in while it was silent, and never below its floor once back
        during = [(t, m) for t, m in scaled_in if went_wall + 1 < t < back_wall - 2]
        after = [(t, m) for t, m in scaled_in if t >= back_wall - 2]
        assert not during and after, (went_wall, back_wall, scaled_in)
        assert not [m for _, m in scaled_in if f"{AP}/a100=0" in m], scaled_in
        stopped.join(timeout=120)
    assert runner.exception is None, runner.output
    figure(
        "fleet of three control planes",
        f"pod sets serving in all three {serving:.0f} s after the ModelDeployment was applied; "
        f"a spill-over share of us-east planned {planned_s:.0f} s after its load rose "
        f"({', '.join(f'{r} {v:.2f}' for r, v in sorted(shares.items()))}), "
        f"{served[EU] + served[AP]:.0f} of {sent} requests then served in other clusters "
        f"({served[EU]:.0f} eu-west, {served[AP]:.0f} ap-south), and us-east's HTTPRoute "
        f"weighted {weights}; "
        f"a silent member named {named_s:.0f} s after its API server stopped, held at 2 "
        f"replicas while its load fell, read again {read_again_s:.1f} s and scaled in "
        f"{resumed_s:.1f} s after it was back",
    )


def _shares(kubeconfig: Path, namespace: str) -> dict[str, float] | None:
    """The plan's spill-over shares of us-east's load, by region (None: none planned)."""
    plan = policy_status(kubeconfig, namespace).get("plan") or {}
    out = {
        e["to"]: float(e["share"])
        for e in plan.get("spillover") or []
        if e.get("model") == MODEL and e.get("from") == HOME and float(e["share"]) > 0
    }
    return out or None


def _members_took_theirs(kubeconfig: Path, namespace: str) -> dict[str, Any] | None:
    """The ModelDeployment's `MemberClusters` condition once True."""
    md = _custom(kubeconfig, namespace, "modeldeployments.sageserve.io", MODEL) or {}
    conditions = (md.get("status") or {}).get("conditions") or []
    found = next((c for c in conditions if c["type"] == "MemberClusters"), None)
    return found if found is not None and found["status"] == "True" else None


def _computed_at(kubeconfig: Path, namespace: str) -> str:
    return str((policy_status(kubeconfig, namespace).get("plan") or {}).get("computedAt"))


def _served(router: RouterProcess, region: str) -> float:
    return router.metric(
        "sageserve_router_requests_total", model_deployment=MODEL, region=region, code="200"
    )
