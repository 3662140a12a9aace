"""The operator's TTFT signal: each interactive tier's P95 over the last minute, as the
routers measured it on streamed answers, reaches the snapshot with the tier's SLO, so
`pace.pressure` scales out an endpoint that misses its TTFT SLO at an EMU that would not (as
the simulator does from its own minute histogram)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from sageserve.controller.observe import endpoint_snapshots, interactive_ttft_slo
from sageserve.core.snapshot import Snapshot
from sageserve.core.types import ActionKind, EndpointKey
from sageserve.metrics import queries
from sageserve.metrics.prometheus import PodLoad, PrometheusReader, TierTtft
from sageserve.pace import make_strategy
from sageserve.pace.step import StepState, decide
from tests.controller.test_deadlines import PrometheusStub, sample
from tests.controller.test_observe_projection import MD, ready_pod

ROOT = Path(__file__).resolve().parents[2]
KEY3 = ("llm", "llama", "us-east")
KEY = EndpointKey("llama", "us-east")
EP = {"namespace": "llm", "model_deployment": "llama", "region": "us-east"}


def tiers() -> list[dict[str, object]]:
    return [d for d in yaml.safe_load_all((ROOT / "policies/base/tiers.yaml").read_text()) if d]


def test_each_interactive_tiers_ttft_slo_is_read_from_its_workload_tier() -> None:
    broken = {"apiVersion": "sageserve.io/v1alpha1", "kind": "WorkloadTier", "metadata": {}}
    assert interactive_ttft_slo([*tiers(), broken]) == {"iw-f": 1.0, "iw-n": 60.0}


def _snapshot(ttft: dict[tuple[str, str, str], TierTtft]) -> Snapshot:
    pods = [ready_pod("a"), ready_pod("b")]
    sets = {"llama-us-east-a100": {"spec": {"replicas": 2}}}
    loads = {"a": PodLoad(0.45, 1000.0), "b": PodLoad(0.45, 1000.0)}  # EMU 45 %: no scale-out
    snaps = endpoint_snapshots(
        MD, "llm", sets, pods, loads, {}, ttft=ttft, ttft_slo_s=interactive_ttft_slo(tiers())
    )
    return Snapshot(0.0, snaps)


@pytest.mark.parametrize(
    ("ttft", "scales_out"),
    [
        ({}, False),  # the routers counted nothing: no TTFT signal
        ({KEY3: TierTtft({"iw-f": 0.4}, {"iw-f": 50})}, False),  # within its SLO
        ({KEY3: TierTtft({"iw-f": 2.5}, {"iw-f": 50})}, True),  # 2.5 × its 1 s SLO
        ({KEY3: TierTtft({"iw-f": 2.5}, {"iw-f": 2})}, False),  # too few first tokens
        ({KEY3: TierTtft({"iw-n": 30.0}, {"iw-n": 50})}, False),  # IW-N's SLO is 60 s
    ],
)
def test_a_tier_missing_its_ttft_slo_scales_its_endpoint_out(
    ttft: dict[tuple[str, str, str], TierTtft], scales_out: bool
) -> None:
    snap = _snapshot(ttft)
    ep = snap.endpoints[KEY]
    assert ep.ttft_slo_s == {"iw-f": 1.0, "iw-n": 60.0}
    assert ep.ttft_p95_s == (dict(ttft[KEY3].p95_s) if ttft else {})
    out = decide(0.0, snap, None, StepState(), make_strategy("reactive"))
    assert [d.kind for d in out.decisions] == ([ActionKind.SCALE_OUT] if scales_out else [])


class _Prometheus(PrometheusStub):
    """Prometheus answering the two TTFT queries with fixed vectors."""

    def answer(self, query: str) -> list[dict[str, Any]]:
        if query == queries.router_ttft_p95("llm"):
            return [sample(2.5, **EP, tier="iw-f"), sample(float("nan"), **EP, tier="iw-n")]
        if query == queries.router_ttft_count("llm"):
            return [sample(41.9, **EP, tier="iw-f"), sample(0.0, **EP, tier="iw-n")]
        return []


@pytest.fixture
def prometheus() -> Iterator[_Prometheus]:
    p = _Prometheus()
    threading.Thread(target=p.server.serve_forever, daemon=True).start()
    yield p
    p.server.shutdown()
    p.server.server_close()


def test_the_reader_takes_each_tiers_p95_and_count_from_the_routers_streamed_answers(
    prometheus: _Prometheus,
) -> None:
    got = PrometheusReader(prometheus.url).tier_ttft("llm")
    # a tier with no first token in the minute has no quantile (NaN): left out
    assert got == {KEY3: TierTtft({"iw-f": 2.5}, {"iw-f": 42, "iw-n": 0})}
    assert prometheus.queries == [queries.router_ttft_p95("llm"), queries.router_ttft_count("llm")]
    assert all('stream="true"' in q for q in prometheus.queries)
