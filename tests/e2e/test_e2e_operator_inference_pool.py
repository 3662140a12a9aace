"""The operator and the Gateway API Inference Extension on the real control plane.

The InferencePool and InferenceObjective CRDs come from the extension's Go module
(`e2e/gaie.py`, versions pinned in `e2e/versions.py`). Without them the operator serves as
before and says the pools are off; with them it owns one InferencePool per region whose
selector lists exactly the serving pods, one InferenceObjective per (pool, tier), names them
in the ModelDeployment's status, follows spec changes, and Kubernetes' garbage collector
removes them with the ModelDeployment. The CRDs are removed again at the end, so the other
modules see the cluster they expect.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from e2e_helpers import eventually, kubectl, refused
from kopf.testing import KopfRunner
from operator_kit import H100, model_deployment, operator_args

from e2e import gaie, versions
from sageserve.controller import inference_pool

REPO = Path(__file__).resolve().parents[2]
CRDS = (
    "inferencepools.inference.networking.k8s.io",
    "inferenceobjectives.inference.networking.x-k8s.io",
    "gatewayclasses.gateway.networking.k8s.io",
    "gateways.gateway.networking.k8s.io",
    "httproutes.gateway.networking.k8s.io",
)
POOLS = "inferencepools.inference.networking.k8s.io"
OBJECTIVES = "inferenceobjectives.inference.networking.x-k8s.io"


def _json(kubeconfig: Path, namespace: str, *what: str) -> dict[str, Any]:
    out = kubectl(kubeconfig, ["get", "-n", namespace, *what, "-o", "json"])
    return dict(json.loads(out.stdout))


def _apply(kubeconfig: Path, namespace: str, doc: dict[str, Any]) -> None:
    kubectl(kubeconfig, ["apply", "-n", namespace, "-f", "-"], stdin=yaml.safe_dump(doc))


def _condition(kubeconfig: Path, namespace: str, name: str, type_: str) -> dict[str, Any] | None:
    md = _json(kubeconfig, namespace, "modeldeployment", name)
    found = [c for c in (md.get("status") or {}).get("conditions", []) if c["type"] == type_]
    return found[0] if found else None


def _names(kubeconfig: Path, namespace: str, kind: str, owner: str) -> list[str]:
    items = _json(kubeconfig, namespace, kind, "-l", f"sageserve.io/model-deployment={owner}")
    return sorted(o["metadata"]["name"] for o in items["items"])


def _crds_absent(kubeconfig: Path) -> None:
    kubectl(kubeconfig, ["delete", "crd", *CRDS, "--ignore-not-found", "--wait=true"])
    eventually(
        lambda: (
            kubectl(
                kubeconfig,
                ["api-resources", "--api-group=inference.networking.k8s.io", "-o", "name"],
            ).stdout.strip()
            == ""
        ),
        60,
        "the InferencePool API to be gone",
    )
    inference_pool.forget_discovery()


@pytest.fixture
def operator_namespace(
    kubeconfig: Path, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> Iterator[str]:
    """The namespace with the fleet policy, and the in-process operator's environment."""
    kubectl(
        kubeconfig,
        ["apply", "-n", namespace, "-f", str(REPO / "policies/overlays/lt-ua/scalingpolicy.yaml")],
    )
    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    monkeypatch.setenv("SAGESERVE_NAMESPACES", namespace)
    monkeypatch.setenv("SAGESERVE_PROMETHEUS_URL", "http://127.0.0.1:1")  # nothing paces here
    yield namespace


@pytest.fixture
def gaie_crds(kubeconfig: Path) -> Iterator[list[Path]]:
    """The extension's CRDs and the Gateway API's, installed from their modules; removed
    afterwards."""
    paths = [*gaie.crd_paths(), *gaie.gateway_api_crds()]
    for path in paths:
        kubectl(kubeconfig, ["apply", "--server-side", "--force-conflicts", "-f", str(path)])
    kubectl(kubeconfig, ["wait", "--for=condition=Established", "crd", *CRDS, "--timeout=60s"])
    inference_pool.forget_discovery()
    yield paths
    _crds_absent(kubeconfig)


def _clean(output: str) -> None:
    """No handler failed, and no traceback passes through the InferencePool code (the
    loops' own complaints about the unreachable Prometheus are not this test's)."""
    assert "failed with an exception" not in output, output
    assert "inference_pool.py" not in output, output


@pytest.mark.usefixtures("restore_node_pools")
def test_without_the_crds_the_operator_serves_and_says_the_pools_are_off(
    kubeconfig: Path, operator_namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    ns = operator_namespace
    monkeypatch.delenv("SAGESERVE_INFERENCE_POOLS", raising=False)  # on: the default
    _crds_absent(kubeconfig)
    with KopfRunner(operator_args(ns), timeout=120) as runner:
        _apply(kubeconfig, ns, model_deployment(["us-central"], H100, gpus=4, name="plain"))
        off = eventually(
            lambda: _condition(kubeconfig, ns, "plain", "InferencePools"),
            60,
            "an InferencePools condition on plain",
        )
        assert (off["status"], off["reason"]) == ("False", "InferencePoolApiAbsent")
        assert "install the Gateway API Inference Extension CRDs" in off["message"]
        ready = eventually(
            lambda: (c := _condition(kubeconfig, ns, "plain", "Ready")) and c["status"] == "True",
            60,
            "Ready=True on plain",
        )
        assert ready
        status = _json(kubeconfig, ns, "modeldeployment", "plain")["status"]
        assert status["gateway"] == {
            "inferencePools": [],
            "inferenceObjectives": [],
            "routes": [],
        }
    assert runner.exception is None, runner.output
    _clean(runner.output)


def _selector(pool: dict[str, Any]) -> str:
    labels = pool["spec"]["selector"]["matchLabels"]
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items()))


def _live(pods: list[dict[str, Any]]) -> list[str]:
    return sorted(p["metadata"]["name"] for p in pods if not p["metadata"].get("deletionTimestamp"))


@pytest.mark.usefixtures("restore_node_pools")
def test_inference_pools_follow_the_model_deployment_and_go_with_it(
    kubeconfig: Path,
    operator_namespace: str,
    gaie_crds: list[Path],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ns = operator_namespace
    monkeypatch.delenv("SAGESERVE_INFERENCE_POOLS", raising=False)  # on: the default
    monkeypatch.setenv("SAGESERVE_ENDPOINT_PICKER", "{pool}-epp:9002:FailOpen")
    # the documented examples are valid against the installed CRDs (server-side dry run,
    # CEL rules included); the objective's spec is the same in both groups
    examples = REPO / "docs/examples/gateway"
    for name in ("modeldeployment", "inferencepool", "istio", "agentgateway"):
        path = examples / f"{name}.yaml"
        kubectl(kubeconfig, ["apply", "-n", ns, "--dry-run=server", "-f", str(path)])
    objective = (examples / "inferenceobjective.yaml").read_text()
    objective = objective.replace("llm-d.ai/v1alpha2", "inference.networking.x-k8s.io/v1alpha2")
    kubectl(kubeconfig, ["apply", "-n", ns, "--dry-run=server", "-f", "-"], stdin=objective)

    with KopfRunner(operator_args(ns), timeout=240) as runner:
        _apply(kubeconfig, ns, model_deployment(["us-east", "us-west"], H100, gpus=4))
        # another model in the same region: its pods must stay out of llama8b's pools
        _apply(kubeconfig, ns, model_deployment(["us-east"], H100, gpus=4, name="other"))
        pools = ["llama8b-us-east", "llama8b-us-west"]
        eventually(lambda: _names(kubeconfig, ns, POOLS, "llama8b") == pools, 60, "two pools")

        def running(selector: str) -> list[str] | None:
            pods = _json(kubeconfig, ns, "pods", "-l", selector)["items"]
            up = [p for p in pods if p["status"].get("phase") == "Running"]
            return _live(up) if up and len(up) == len(_live(pods)) else None

        for region in ("us-east", "us-west"):
            pool = _json(kubeconfig, ns, POOLS, f"llama8b-{region}")
            assert pool["spec"]["targetPorts"] == [{"number": 8000}]
            assert pool["spec"]["endpointPickerRef"] == {
                "group": "",
                "kind": "Service",
                "name": f"llama8b-{region}-epp",
                "port": {"number": 9002},
                "failureMode": "FailOpen",
            }
            owner = pool["metadata"]["ownerReferences"][0]
            assert (owner["kind"], owner["name"], owner["controller"]) == (
                "ModelDeployment",
                "llama8b",
                True,
            )
            serving = eventually(
                lambda r=region: running(
                    f"sageserve.io/model-deployment=llama8b,sageserve.io/region={r}"
                ),
                90,
                f"llama8b's Running pods in {region}",
            )
            selected = eventually(
                lambda p=pool: running(_selector(p)), 30, f"pods selected by the {region} pool"
            )
            assert selected == serving
        assert eventually(
            lambda: running("sageserve.io/model-deployment=other"), 90, "other's Running pod"
        )

        objectives = _json(
            kubeconfig, ns, OBJECTIVES, "-l", "sageserve.io/model-deployment=llama8b"
        )
        got = sorted(
            (o["metadata"]["name"], o["spec"]["poolRef"]["name"], o["spec"]["priority"])
            for o in objectives["items"]
        )
        assert got == sorted(
            (f"{pool}-{tier}", pool, priority)
            for pool in pools
            for tier, priority in (("iw-f", 1000), ("iw-n", 999), ("niw", -3))
        )

        def status() -> dict[str, Any] | None:
            md = _json(kubeconfig, ns, "modeldeployment", "llama8b")
            gateway = (md.get("status") or {}).get("gateway") or {}
            return md["status"] if gateway.get("inferencePools") == pools else None

        named = eventually(status, 60, "status.gateway naming the pools")
        assert named["gateway"]["inferenceObjectives"] == [g[0] for g in got]
        assert named["gateway"]["objectiveApi"] == "inference.networking.x-k8s.io/v1alpha2"
        cond = _condition(kubeconfig, ns, "llama8b", "InferencePools")
        assert cond is not None and (cond["status"], cond["reason"]) == ("True", "PoolsApplied")

        # a region leaves and the engine port moves: its pool and objectives go, the
        # other pool follows the port
        patch = {
            "spec": {
                "regions": [{"name": "us-east", "minInstances": 1, "maxInstances": 2}],
                "engine": {"port": 8081},
            }
        }
        kubectl(
            kubeconfig,
            [
                "patch",
                "modeldeployment",
                "llama8b",
                "-n",
                ns,
                "--type=merge",
                "-p",
                json.dumps(patch),
            ],
        )
        eventually(
            lambda: _names(kubeconfig, ns, POOLS, "llama8b") == ["llama8b-us-east"],
            60,
            "the us-west pool to go",
        )
        eventually(
            lambda: (
                _json(kubeconfig, ns, POOLS, "llama8b-us-east")["spec"]["targetPorts"]
                == [{"number": 8081}]
            ),
            60,
            "targetPorts to follow the engine port",
        )
        assert _names(kubeconfig, ns, OBJECTIVES, "llama8b") == [
            f"llama8b-us-east-{t}" for t in ("iw-f", "iw-n", "niw")
        ]

        # pools per variant: the pod set's name, selecting that variant's pods only
        patch = {"spec": {"gateway": {"poolScope": "Variant"}}}
        kubectl(
            kubeconfig,
            [
                "patch",
                "modeldeployment",
                "llama8b",
                "-n",
                ns,
                "--type=merge",
                "-p",
                json.dumps(patch),
            ],
        )
        eventually(
            lambda: _names(kubeconfig, ns, POOLS, "llama8b") == ["llama8b-us-east-h100"],
            60,
            "one pool per (region, variant)",
        )
        pool = _json(kubeconfig, ns, POOLS, "llama8b-us-east-h100")
        assert pool["spec"]["selector"]["matchLabels"]["sageserve.io/variant"] == "h100"

        # the ModelDeployment goes: the garbage collector removes what it owned
        kubectl(kubeconfig, ["delete", "modeldeployment", "llama8b", "-n", ns])
        eventually(
            lambda: (
                _names(kubeconfig, ns, POOLS, "llama8b") == []
                and _names(kubeconfig, ns, OBJECTIVES, "llama8b") == []
            ),
            90,
            "the garbage collector to remove llama8b's pools and objectives",
        )
        assert _names(kubeconfig, ns, POOLS, "other") == ["other-us-east"]
    assert runner.exception is None, runner.output
    _clean(runner.output)


GW_RELEASE = "sageserve-gw"  # its own release and namespace: other modules install "sageserve"


def _helm(kubeconfig: Path, *args: str, check: bool = True) -> None:
    import subprocess

    result = subprocess.run(
        [str(versions.bin_dir() / "helm"), f"--kubeconfig={kubeconfig}", *args],
        capture_output=True,
        text=True,
        check=False,
    )
    assert not check or result.returncode == 0, result.stdout + result.stderr


def _as_service_account(admin: Path, tmp_path: Path, account: str, namespace: str) -> Path:
    """A kubeconfig that authenticates as the chart's operator ServiceAccount."""
    token = kubectl(
        admin, ["create", "token", account, "-n", namespace, "--duration=1h"]
    ).stdout.strip()
    config = yaml.safe_load(admin.read_text())
    config["users"] = [{"name": account, "user": {"token": token}}]
    for context in config["contexts"]:
        context["context"]["user"] = account
    path = tmp_path / f"{account}-kubeconfig.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.mark.usefixtures("restore_node_pools")
def test_the_charts_rbac_is_enough_for_pools_and_only_when_enabled(
    kubeconfig: Path,
    operator_namespace: str,
    gaie_crds: list[Path],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    """helm install with gateway.inferencePool.enabled, then the operator runs with the
    chart's ServiceAccount token (not as admin) and makes pools and objectives without a
    403; `helm upgrade` with it off takes the permission away again."""
    ns = operator_namespace
    sa = f"system:serviceaccount:{GW_RELEASE}:{GW_RELEASE}"
    chart = str(REPO / "charts" / "sageserve")
    common = ["-n", GW_RELEASE, "--set", "prometheus.url=http://127.0.0.1:9090"]
    common += ["--set", "networkPolicy.enabled=false", "--wait", "--timeout", "120s"]

    def may(verb: str, resource: str) -> bool:
        args = ["auth", "can-i", verb, resource, f"--as={sa}", "-n", ns]
        return kubectl(kubeconfig, args, check=False).stdout.strip() == "yes"

    try:
        _helm(
            kubeconfig, "upgrade", "--install", GW_RELEASE, chart, "--create-namespace",
            "--set", "gateway.inferencePool.enabled=true", *common,
        )  # fmt: skip
        for verb in ("list", "create", "patch", "delete"):
            assert may(verb, POOLS) and may(verb, OBJECTIVES), verb
        assert not may("get", POOLS) and not may("watch", OBJECTIVES)

        monkeypatch.setenv(
            "KUBECONFIG", str(_as_service_account(kubeconfig, tmp_path, GW_RELEASE, GW_RELEASE))
        )
        monkeypatch.setenv("SAGESERVE_LEASE_NAMESPACE", GW_RELEASE)
        monkeypatch.setenv("SAGESERVE_METRICS_PORT", "0")
        monkeypatch.delenv("SAGESERVE_INFERENCE_POOLS", raising=False)
        monkeypatch.setenv("SAGESERVE_ENDPOINT_PICKER", "{pool}-epp:9002")
        with KopfRunner(operator_args(ns), timeout=180) as runner:
            _apply(kubeconfig, ns, model_deployment(["us-west"], H100, gpus=4, name="rbac"))
            eventually(
                lambda: (
                    _names(kubeconfig, ns, POOLS, "rbac") == ["rbac-us-west"]
                    and len(_names(kubeconfig, ns, OBJECTIVES, "rbac")) == 3
                ),
                60,
                "the pool and its three objectives, made with the chart's permissions",
            )
            cond = eventually(
                lambda: _condition(kubeconfig, ns, "rbac", "InferencePools"), 60, "the condition"
            )
            assert (cond["status"], cond["reason"]) == ("True", "PoolsApplied"), cond
        assert runner.exception is None, runner.output
        assert not refused(runner.output), runner.output
        _clean(runner.output)

        _helm(kubeconfig, "upgrade", GW_RELEASE, chart, *common)  # the chart's default: off
        assert not may("list", POOLS) and not may("create", OBJECTIVES)
    finally:
        kubectl(
            kubeconfig,
            ["delete", "modeldeployment", "rbac", "-n", ns, "--ignore-not-found"],
            check=False,
        )
        _helm(kubeconfig, "uninstall", GW_RELEASE, "-n", GW_RELEASE, check=False)
        kubectl(kubeconfig, ["delete", "namespace", GW_RELEASE, "--wait=false"], check=False)
