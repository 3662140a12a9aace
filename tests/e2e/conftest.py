"""Session fixtures: one real control plane (kwokctl, binary runtime) with KWOK GPU
nodes and one real Prometheus for the whole pytest session.

Why a private state dir per session: several people and CI jobs share machines, and
``down`` at the end must only stop what this session started. Set
``SAGESERVE_E2E_REUSE=1`` to use (and keep) the cluster of ``python -m e2e.cluster up``
instead, which makes iterating on a test fast.

Never skipped: a missing binary is built; if the build fails, every e2e test fails
with the build error.
"""

from __future__ import annotations

import fcntl
import os
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from e2e import gobuild, lifecycle, state, versions  # noqa: E402
from e2e import keda as keda_kit  # noqa: E402


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test under tests/e2e is an e2e test. Under pytest-xdist (`-n 3 --dist
    loadgroup`, as `scripts/test` runs) each e2e module is one group: its tests run in
    order on one worker, and each worker starts the control plane once, when its first
    e2e test needs it. With `SAGESERVE_E2E_REUSE=1` every worker would share the one
    cluster, so all e2e tests form one group."""
    here = Path(__file__).parent
    reuse = os.environ.get("SAGESERVE_E2E_REUSE") == "1"
    for item in items:
        path = Path(str(item.fspath))
        if here in path.parents:
            item.add_marker(pytest.mark.e2e)
            item.add_marker(pytest.mark.xdist_group("e2e" if reuse else f"e2e-{path.stem}"))


def _ensure_binaries(needed: tuple[str, ...] = lifecycle.REQUIRED_FOR_KWOK) -> None:
    missing = [c for c in gobuild.missing_components() if c in needed]
    if not missing:
        return
    failure = ""
    try:
        gobuild.build_all(only=missing)
    except gobuild.BuildError as err:
        failure = str(err)
    if failure:
        pytest.fail(
            f"e2e binaries could not be built ({', '.join(missing)} into {versions.bin_dir()}); "
            f"run `python -m e2e.cluster build` to see why.\n{failure}",
            pytrace=False,
        )


@contextmanager
def one_start_at_a_time(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Hold a lock shared by this run's pytest-xdist workers while a control plane starts:
    kwokctl picks each component's port as free when it looks, so two clusters started
    at once can pick the same one, and one of them never becomes ready."""
    lock = tmp_path_factory.getbasetemp().parent / "e2e-cluster-start.lock"
    with lock.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@pytest.fixture(scope="session")
def e2e_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[state.ClusterState]:
    """A ready cluster (GPU nodes Ready) and Prometheus; torn down after the session."""
    reuse = os.environ.get("SAGESERVE_E2E_REUSE") == "1"
    saved = os.environ.get("SAGESERVE_E2E_STATE")
    if not reuse:
        os.environ["SAGESERVE_E2E_STATE"] = str(tmp_path_factory.mktemp("e2e-state"))
    try:
        _ensure_binaries()
        started, failure = None, ""
        try:
            with one_start_at_a_time(tmp_path_factory):
                started = lifecycle.up()
        except Exception as err:  # any failure to start is a test failure, never a skip
            failure = f"{type(err).__name__}: {err}"
        if started is None:
            pytest.fail(f"could not start the e2e cluster: {failure}", pytrace=False)
        yield started
    finally:
        if not reuse:
            lifecycle.down()
            if saved is None:
                os.environ.pop("SAGESERVE_E2E_STATE", None)
            else:
                os.environ["SAGESERVE_E2E_STATE"] = saved


@pytest.fixture(scope="session")
def keda(e2e_cluster: state.ClusterState) -> Iterator[keda_kit.KedaState]:
    """A real KEDA (operator + metrics adapter at `versions.KEDA_VERSION`) on the session's cluster:
    its CRDs applied, ``external.metrics.k8s.io`` served through the API server, every
    namespace watched. Yields `e2e.keda.KedaState`: `namespace` (KEDA's own), `scaler_host`
    (where a scaler on this machine listens to be reachable from the operator),
    `host_ip`, the processes' logs. Built when missing (a failed build fails the test);
    stopped at the end of the session (kept with ``SAGESERVE_E2E_REUSE=1``)."""
    reuse = os.environ.get("SAGESERVE_E2E_REUSE") == "1"
    _ensure_binaries(("keda",))
    kubeconfig = Path(e2e_cluster.kubeconfig)
    try:
        started = keda_kit.start(kubeconfig)
    except Exception as err:  # any failure to start is a test failure, never a skip
        pytest.fail(f"could not start KEDA: {type(err).__name__}: {err}", pytrace=False)
    try:
        yield started
    finally:
        if not reuse:
            keda_kit.stop(kubeconfig)


@pytest.fixture(scope="session")
def kubeconfig(e2e_cluster: state.ClusterState) -> Path:
    """Path of the test cluster's own kubeconfig (never ~/.kube/config)."""
    return Path(e2e_cluster.kubeconfig)


@pytest.fixture(scope="session")
def prometheus_url(e2e_cluster: state.ClusterState) -> str:
    """Base URL of the session's Prometheus, e.g. http://127.0.0.1:41234."""
    return e2e_cluster.prometheus_url


@pytest.fixture(scope="session")
def prometheus_targets_dir(e2e_cluster: state.ClusterState) -> Path:
    """Drop ``*.json`` file_sd target files here and Prometheus scrapes them (job sageserve-e2e)."""
    return Path(e2e_cluster.prometheus_dir) / "targets"


@pytest.fixture(scope="session")
def api_client(kubeconfig: Path):  # type: ignore[no-untyped-def]
    """A kubernetes.client.ApiClient bound to the test cluster."""
    from kubernetes import config

    client = config.new_client_from_config(config_file=str(kubeconfig))
    yield client
    client.close()


POOL_LABEL = "sageserve.io/pool"
POOL_ANNOTATIONS = (
    "sageserve.io/last-model",
    "sageserve.io/donated-at",
    "sageserve.io/reclaimed-at",
    "sageserve.io/reclaim-blocked-at",
    "sageserve.io/reclaim-blocked-by",
)


def holds_gpus(pod) -> bool:  # type: ignore[no-untyped-def]
    return any(
        "nvidia.com/gpu" in ((c.resources and c.resources.requests) or {})
        or "nvidia.com/gpu" in ((c.resources and c.resources.limits) or {})
        for c in pod.spec.containers
    )


def pods_left_on_gpu_nodes(core) -> list[str]:  # type: ignore[no-untyped-def]
    """Pods of earlier tests still holding GPUs: a namespace is deleted without waiting,
    and its pods keep their GPUs while they terminate, which would push this test's pods
    onto other nodes."""
    return [
        f"{p.metadata.namespace}/{p.metadata.name}"
        for p in core.list_pod_for_all_namespaces().items
        if p.spec.node_name and p.status.phase not in ("Succeeded", "Failed") and holds_gpus(p)
    ]


@pytest.fixture
def restore_node_pools(api_client):  # type: ignore[no-untyped-def]
    """Start once the GPU nodes are free of earlier tests' pods; afterwards put every node
    back in the pool it was in (and drop donation annotations), so later tests see the
    inventory."""
    from kubernetes import client

    core = client.CoreV1Api(api_client)
    deadline = time.monotonic() + 180
    while left := pods_left_on_gpu_nodes(core):
        if time.monotonic() > deadline:
            pytest.fail(f"earlier tests' pods still on the GPU nodes after 180 s: {left}")
        time.sleep(1.0)
    before = {
        n.metadata.name: (n.metadata.labels or {}).get(POOL_LABEL) for n in core.list_node().items
    }
    yield
    for name, pool in before.items():
        if pool is not None:
            patch = {
                "metadata": {
                    "labels": {POOL_LABEL: pool},
                    "annotations": dict.fromkeys(POOL_ANNOTATIONS),
                }
            }
            core.patch_node(name, patch)


@pytest.fixture
def namespace(kubeconfig: Path, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh namespace with the CRDs and the tiers, named after the test module; deleted
    (without waiting) afterwards."""
    import uuid

    from e2e_helpers import kubectl
    from operator_kit import prepare_namespace

    module = request.module.__name__.removeprefix("test_e2e_operator_").removeprefix("test_e2e_")
    name = f"{module.replace('_', '-')[:20]}-{uuid.uuid4().hex[:6]}"
    prepare_namespace(kubeconfig, name)
    yield name
    kubectl(kubeconfig, ["delete", "namespace", name, "--wait=false"], check=False)


# --- the endpoint picker (e2e/epp.py) ---------------------------------------------------


@pytest.fixture(scope="session")
def epp_binary() -> Path:
    """The endpoint picker of the pinned GAIE release, built now if missing (a cold build
    takes minutes); a build failure fails the test with the build error."""
    from e2e import epp

    failure = ""
    try:
        return epp.ensure_built()
    except gobuild.BuildError as err:
        failure = str(err)
    pytest.fail(
        f"the endpoint picker could not be built (GAIE v{versions.GAIE_VERSION} into "
        f"{versions.bin_dir()}); run `python -m e2e.cluster build --only epp` to see why.\n"
        f"{failure}",
        pytrace=False,
    )


@pytest.fixture
def start_epp(
    epp_binary: Path, kubeconfig: Path, prometheus_targets_dir: Path
) -> Iterator[Callable[..., Any]]:
    """`start_epp(pool_name, pool_namespace, *extra_flags)` starts an endpoint picker for
    that InferencePool against the test cluster, its metrics registered with Prometheus;
    every picker started is stopped (and its target withdrawn) after the test."""
    from e2e import epp

    epp.install_crds(kubeconfig)
    started: list[epp.EppProcess] = []

    def start(pool_name: str, pool_namespace: str, *extra: str) -> epp.EppProcess:
        process = epp.start(
            kubeconfig, pool_name, pool_namespace, prometheus_targets_dir, list(extra)
        )
        started.append(process)
        return process

    yield start
    for process in started:
        process.stop()
