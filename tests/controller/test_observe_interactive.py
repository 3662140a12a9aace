"""The operator's view of Chiron's interactive backpressure: the routers' per-pod count of
interactive requests in flight reaches the snapshot, and the step decides on it as the
simulator's count would make it decide."""

from __future__ import annotations

from sageserve.controller.observe import endpoint_snapshots
from sageserve.core.snapshot import Snapshot
from sageserve.core.types import ActionKind, EndpointKey
from sageserve.metrics.prometheus import PodLoad, PrometheusReader
from sageserve.pace import make_strategy
from sageserve.pace.step import StepState, decide
from tests.controller.test_observe_projection import MD, ready_pod

KEY = EndpointKey("llama", "us-east")
SETS = {"llama-us-east-a100": {"spec": {"replicas": 3}}}
LOADS = {n: PodLoad(0.1, 1000.0) for n in "abc"}
PODS = [ready_pod(n) for n in "abc"]


def test_each_pods_interactive_count_reaches_its_instance_view() -> None:
    snap = endpoint_snapshots(MD, "llm", SETS, PODS, LOADS, {}, interactive_running={"a": 2})[KEY]
    assert {v.name: v.interactive_running for v in snap.instances} == {"a": 2, "b": 0, "c": 0}
    obs = snap.observation(0.0)
    assert (obs.interactive_busy, obs.interactive_reporting) == (1, 3)


def test_unobserved_counts_leave_chiron_holding() -> None:
    """Without the routers' count (another strategy's pass) nothing is known: Chiron holds,
    it does not read 'no interactive work' and scale in."""
    snap = endpoint_snapshots(MD, "llm", SETS, PODS, LOADS, {})[KEY]
    assert all(v.interactive_running is None for v in snap.instances)
    out = decide(0.0, Snapshot(0.0, {KEY: snap}), None, StepState(), make_strategy("chiron"))
    assert out.decisions == []


def test_chiron_scales_out_on_the_routers_counts() -> None:
    busy = {"a": 1, "b": 3}  # 2 of 3 pods run interactive work: 67 % > 60 %
    snap = endpoint_snapshots(MD, "llm", SETS, PODS, LOADS, {}, interactive_running=busy)[KEY]
    out = decide(0.0, Snapshot(0.0, {KEY: snap}), None, StepState(), make_strategy("chiron"))
    assert [d.kind for d in out.decisions] == [ActionKind.SCALE_OUT]


def test_the_reader_sums_the_routers_per_pod_gauges() -> None:
    reader = PrometheusReader("http://prometheus.invalid")
    samples = [({"pod": "a"}, 3.0), ({"pod": "b"}, float("nan")), ({}, 2.0)]
    reader.samples = lambda expr: samples  # type: ignore[method-assign]
    assert reader.pod_interactive_running("llm") == {"a": 3}


def test_the_router_counts_interactive_requests_per_pod_while_they_run() -> None:
    from sageserve.metrics.queries import POD_INTERACTIVE
    from sageserve.router.fleet import ModelRoute
    from sageserve.router.metrics import RouterMetrics

    metrics = RouterMetrics()
    route = ModelRoute("llm", "llama", "m", ("us-east",), ("iw-f", "niw"))
    labels = {"namespace": "llm", "model_deployment": "llama", "region": "us-east", "pod": "a"}

    def value() -> float | None:
        return metrics.registry.get_sample_value(POD_INTERACTIVE, labels)

    with metrics.interactive_on_pod(route, "us-east", "a", interactive=True):
        assert value() == 1.0
        with metrics.interactive_on_pod(route, "us-east", "a", interactive=False):
            assert value() == 1.0  # batch work is not Chiron's interactive backpressure
        with metrics.interactive_on_pod(route, "us-east", "a", interactive=True):
            assert value() == 2.0
        assert value() == 1.0
    # answered: the pod's series goes (a pod gone with a scale-in leaves none behind), which
    # the operator reads as no interactive request running on it
    assert value() is None
