"""Batch in the troughs on the real control plane: the OpenAI Batch API on `sageserve
router`, its durable queue (SQLite, or a real PostgreSQL server on loopback), released by
SageServe's Queue Manager (§6.2) to the twin's pods as their KV usage falls.

What a platform team relies on is checked: a batch submitted at the interactive peak waits
while the region is busy and finishes in the trough, before its deadline, without costing
interactive requests their SLO; a router killed mid-batch and restarted loses nothing and
duplicates nothing; two replicas on one PostgreSQL queue share the work and never run a
request twice.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import requests
from e2e_helpers import eventually
from kopf.testing import KopfRunner
from operator_kit import (
    RouterProcess,
    TwinProcess,
    apply,
    operator_args,
    operator_env,
    scaling_policy,
)
from test_e2e_router import HIGH, LOW, MODEL, SERVED, TRACE, bloom, request

from e2e import postgres
from sageserve.metrics.prometheus import PrometheusReader

#: the tier policies/base/tiers.yaml gives batch work
BATCH_TIER = "niw"
#: requests in the batch submitted at the peak
N_PEAK = 40
#: IW-F's SLO: time to first token under 1 s (policies/base/tiers.yaml)
TTFT_SLO_S = 1.0


@contextmanager
def queue_url(backend: str, tmp_path: Path) -> Iterator[str]:
    """A queue for the routers: a SQLite file, or a database on a throwaway PostgreSQL
    (Debian's server, started on loopback)."""
    if backend == "sqlite":
        yield f"sqlite:///{tmp_path}/queue.db"
        return
    with postgres.running(durable=True) as server:
        yield server.create_database("queue")


def batch_lines(n: int, max_tokens: int = 16, prefix: str = "req") -> bytes:
    rows = [
        {
            "custom_id": f"{prefix}-{i}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {
                "model": SERVED,
                "messages": [{"role": "user", "content": f"question {i}"}],
                "max_tokens": max_tokens,
            },
        }
        for i in range(n)
    ]
    return ("\n".join(json.dumps(r) for r in rows) + "\n").encode()


def submit(router: RouterProcess, content: bytes, window: str = "24h") -> dict[str, Any]:
    """Upload the input file and create the batch, as an OpenAI client does."""
    files = {"file": ("input.jsonl", content, "application/jsonl")}
    r = requests.post(f"{router.url}/v1/files", data={"purpose": "batch"}, files=files, timeout=30)
    assert r.status_code == 200, r.text
    body = {
        "input_file_id": r.json()["id"],
        "endpoint": "/v1/chat/completions",
        "completion_window": window,
    }
    r = requests.post(f"{router.url}/v1/batches", json=body, timeout=30)
    assert r.status_code == 200, r.text
    batch: dict[str, Any] = r.json()
    return batch


def batch_of(router: RouterProcess, batch_id: str) -> dict[str, Any]:
    r = requests.get(f"{router.url}/v1/batches/{batch_id}", timeout=30)
    assert r.status_code == 200, r.text
    batch: dict[str, Any] = r.json()
    return batch


def file_lines(router: RouterProcess, file_id: str | None) -> list[dict[str, Any]]:
    if not file_id:
        return []
    r = requests.get(f"{router.url}/v1/files/{file_id}/content", timeout=30)
    assert r.status_code == 200, r.text
    return [json.loads(x) for x in r.text.splitlines() if x.strip()]


def finished(router: RouterProcess, batch_id: str, seconds: float) -> dict[str, Any]:
    """The batch once closed (completed, expired, ...), waiting up to `seconds`."""
    closed: dict[str, Any] = {}

    def done() -> bool:
        closed.update(batch_of(router, batch_id))
        return closed["status"] in ("completed", "failed", "expired", "cancelled")

    eventually(done, seconds, f"batch {batch_id} closed")
    return closed


def ran(router: RouterProcess) -> float:
    """Batch requests this replica answered."""
    return router.metric(
        "sageserve_router_requests_total", model_deployment=MODEL, tier=BATCH_TIER, code="200"
    )


def router_emu(router: RouterProcess) -> float:
    """The router's EMU estimate of us-east, on which its Queue Manager releases."""
    return router.metric("sageserve_router_endpoint_emu", model_deployment=MODEL, region="us-east")


def interactive_attainment(router: RouterProcess, n: int) -> float:
    """Share of `n` streamed IW-F requests whose first token came within the SLO (a request
    not answered within 30 s counts as a miss)."""
    met = 0
    headers = {"x-sageserve-region": "us-east", "x-sageserve-tier": "iw-f"}
    for _ in range(n):
        started = time.monotonic()
        try:
            with requests.post(
                f"{router.url}/v1/completions",
                json=request(stream=True),
                headers=headers,
                stream=True,
                timeout=30,
            ) as r:
                first = next(r.iter_lines(), b"")
                ttft = time.monotonic() - started
                for _ in r.iter_lines():
                    pass
        except requests.RequestException:
            continue
        met += int(r.status_code == 200 and bool(first) and ttft <= TTFT_SLO_S)
    return met / n


@contextmanager
def reactive_fleet(
    md: dict[str, Any],
    kubeconfig: Path,
    namespace: str,
    prometheus_url: str,
    prometheus_targets_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[TwinProcess]:
    """The operator pacing `md` with the reactive strategy, the twin answering for its
    pods at a low interactive load."""
    operator_env(monkeypatch, kubeconfig, namespace, prometheus_url)
    twin = TwinProcess(
        kubeconfig, namespace, prometheus_targets_dir, "--trace", str(TRACE), "--scale", str(LOW)
    )
    try:
        with KopfRunner(operator_args(namespace), timeout=600):
            apply(kubeconfig, namespace, scaling_policy("reactive"), md)
            yield twin
    finally:
        twin.close()


@pytest.fixture
def bloom_fleet(
    kubeconfig: Path,
    namespace: str,
    prometheus_url: str,
    prometheus_targets_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[TwinProcess]:
    """One bloom instance in us-east (never more or fewer), the twin answering for it at
    a low interactive load."""
    md = bloom(["us-east"], 1, 1)
    with reactive_fleet(
        md, kubeconfig, namespace, prometheus_url, prometheus_targets_dir, monkeypatch
    ) as twin:
        yield twin


def ready(router: RouterProcess) -> None:
    """The router has discovered the pod: an interactive request is answered."""
    eventually(
        lambda: (
            router.post("/v1/completions", request(), {"x-sageserve-region": "us-east"})[0] == 200
        ),
        90,
        "the router serving bloom",
    )


@pytest.mark.usefixtures("restore_node_pools")
def test_a_batch_submitted_at_the_peak_runs_in_the_trough_before_its_deadline(
    kubeconfig: Path,
    namespace: str,
    prometheus_url: str,
    prometheus_targets_dir: Path,
    bloom_fleet: TwinProcess,
) -> None:
    twin = bloom_fleet
    router = RouterProcess(kubeconfig, namespace, twin.url, prometheus_url, prometheus_targets_dir)
    try:
        ready(router)
        alone = interactive_attainment(router, 10)  # the trough, no batch anywhere
        # the interactive peak: the instance's KV cache far above the Queue Manager's 60 %
        twin.load(HIGH / LOW, f"{namespace}/{MODEL}/us-east")
        reader = PrometheusReader(prometheus_url)

        def kv() -> float:
            return max((p.kv_usage for p in reader.pod_loads(namespace).values()), default=0.0)

        eventually(lambda: kv() > 0.75, 120, "us-east above 75 % KV usage")
        # the router reads Prometheus every second or two: submit once it sees the peak too
        eventually(lambda: router_emu(router) > 0.75, 30, "the router seeing the peak")
        submitted = submit(router, batch_lines(N_PEAK, max_tokens=64))
        time.sleep(10)  # ten signals at the peak
        assert ran(router) == 0  # nothing released while the region is busy
        assert batch_of(router, submitted["id"])["status"] == "in_progress"
        queued = router.metric(
            "sageserve_batch_queued_requests", model_deployment=MODEL, tier=BATCH_TIER
        )
        assert queued == N_PEAK
        # the peak passes: as KV usage falls, the queue is released, a few at a time
        twin.load(1.0, f"{namespace}/{MODEL}/us-east")
        fell = time.monotonic()
        eventually(lambda: ran(router) > 0, 300, "the first batch request released")
        released_after = time.monotonic() - fell
        during = interactive_attainment(router, 10)  # interactive work next to the batch
        still_running = batch_of(router, submitted["id"])["status"] == "in_progress"
        closed = finished(router, submitted["id"], 300)
        assert closed["status"] == "completed", closed
        counts = {"total": N_PEAK, "completed": N_PEAK, "failed": 0}
        assert closed["request_counts"] == counts
        assert closed["completed_at"] <= closed["expires_at"]  # before its deadline
        output = file_lines(router, closed["output_file_id"])
        expected = sorted(f"req-{i}" for i in range(N_PEAK))
        assert sorted(o["custom_id"] for o in output) == expected
        assert all(o["response"]["status_code"] == 200 for o in output)
        # interactive requests keep their SLO while the batch fills the trough
        assert during >= alone - 0.1, (alone, during)
        sys.__stderr__.write(
            f"batch at the peak: first release {released_after:.1f} s after the load fell; "
            f"IW-F TTFT≤1s {alone:.0%} alone, {during:.0%} next to the batch "
            f"(batch still running at the end of the measurement: {still_running}); "
            f"done {closed['completed_at'] - closed['created_at']} s after submission\n"
        )
    finally:
        router.close()


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
@pytest.mark.usefixtures("restore_node_pools")
def test_a_router_killed_mid_batch_loses_nothing_and_duplicates_nothing(
    kubeconfig: Path,
    namespace: str,
    prometheus_url: str,
    prometheus_targets_dir: Path,
    bloom_fleet: TwinProcess,
    tmp_path: Path,
    backend: str,
) -> None:
    twin = bloom_fleet
    with queue_url(backend, tmp_path) as url:
        args = ("--batch-lease-seconds", "5")
        first = RouterProcess(
            kubeconfig,
            namespace,
            twin.url,
            prometheus_url,
            prometheus_targets_dir,
            *args,
            batch_db=url,
        )
        try:
            ready(first)
            submitted = submit(first, batch_lines(30, max_tokens=64))
            eventually(
                lambda: batch_of(first, submitted["id"])["request_counts"]["completed"] >= 3,
                120,
                "a few requests of the batch done",
            )
            at_kill = batch_of(first, submitted["id"])["request_counts"]["completed"]
            in_flight = first.metric("sageserve_router_in_flight_requests", tier=BATCH_TIER)
        finally:
            first.kill()  # mid-batch: requests in flight, leases held
        assert at_kill < 30, "the batch finished before the kill: nothing was tested"
        second = RouterProcess(
            kubeconfig,
            namespace,
            twin.url,
            prometheus_url,
            prometheus_targets_dir,
            *args,
            batch_db=url,
        )
        try:
            closed = finished(second, submitted["id"], 300)
            assert closed["status"] == "completed", closed
            assert closed["request_counts"] == {"total": 30, "completed": 30, "failed": 0}
            output = file_lines(second, closed["output_file_id"])
            ids = [o["custom_id"] for o in output]
            assert sorted(ids) == sorted(f"req-{i}" for i in range(30))  # each exactly once
            assert file_lines(second, closed.get("error_file_id")) == []
            sys.__stderr__.write(
                f"{backend}: killed with {at_kill}/30 done and {in_flight:.0f} in flight; "
                "the restarted router finished the batch\n"
            )
        finally:
            second.close()


@pytest.mark.usefixtures("restore_node_pools")
def test_two_replicas_on_postgresql_share_one_queue_and_never_run_a_request_twice(
    kubeconfig: Path,
    namespace: str,
    prometheus_url: str,
    prometheus_targets_dir: Path,
    bloom_fleet: TwinProcess,
    tmp_path: Path,
) -> None:
    twin = bloom_fleet
    with queue_url("postgresql", tmp_path) as url:
        replicas = [
            RouterProcess(
                kubeconfig,
                namespace,
                twin.url,
                prometheus_url,
                prometheus_targets_dir,
                batch_db=url,
            )
            for _ in range(2)
        ]
        try:
            for r in replicas:
                ready(r)
            submitted = submit(replicas[0], batch_lines(30))
            closed = finished(replicas[1], submitted["id"], 300)  # one queue: either answers
            assert closed["status"] == "completed", closed
            runs = [ran(r) for r in replicas]
            assert sum(runs) == 30, runs  # every request ran once, on one replica or the other
            output = file_lines(replicas[1], closed["output_file_id"])
            assert sorted(o["custom_id"] for o in output) == sorted(f"req-{i}" for i in range(30))
            sys.__stderr__.write(f"two replicas on PostgreSQL ran {runs[0]:.0f} + {runs[1]:.0f}\n")
        finally:
            for r in replicas:
                r.close()
