"""Trace load on the pods that run, through the simulator's instance model."""

from __future__ import annotations

from pathlib import Path

import pytest

from sageserve.twin.load import Histogram, LoadControl, LoadShape, PerfResolver, TraceSource
from tests.twin.helpers import CATALOG, pending, pod, sim

REPO = Path(__file__).resolve().parents[2]
AZURE_CONV = REPO / "data/traces/azure-llm-2023/AzureLLMInferenceTrace_conv.csv.gz"


def test_running_pods_serve_and_pending_ones_get_nothing() -> None:
    s = sim()
    s.sync([pod("a"), pod("b", serving=False)])
    s.advance(300)
    [sample] = s.samples()
    assert sample.pod.name == "a"
    assert sample.counters.requests_finished > 250
    assert sample.counters.generation_tokens == 150 * sample.counters.requests_finished
    ep = s.endpoints[("llm", "bloom-176b", "us-east")]
    assert ep.rejected == 0 and ep.arrived == 300


def test_requests_spread_over_every_serving_pod_of_the_endpoint() -> None:
    s = sim(load=4)
    s.sync([pod("a"), pod("b")])
    s.advance(120)
    done = [x.counters.requests_finished for x in s.samples()]
    assert min(done) > 0.4 * sum(done)


def test_an_endpoint_without_serving_pods_rejects_its_requests() -> None:
    s = sim()
    s.sync([pod("a", serving=False)])
    s.advance(60)
    assert s.samples() == []
    ep = s.endpoints[("llm", "bloom-176b", "us-east")]
    assert ep.rejected == ep.arrived == 60


def test_a_pending_pod_starts_serving_once_it_runs() -> None:
    s = sim()
    a = pod("a")
    s.sync([pending(a)])
    s.advance(60)
    s.sync([a])
    s.advance(120)
    [sample] = s.samples()
    assert 50 <= sample.counters.requests_finished <= 60


def test_a_pod_that_goes_away_drops_its_instance_and_the_requests_in_it() -> None:
    s = sim(load=5)
    s.sync([pod("a"), pod("b")])
    s.advance(120)
    s.sync([pod("a")])
    assert [x.pod.name for x in s.samples()] == ["a"]
    ep = s.endpoints[("llm", "bloom-176b", "us-east")]
    assert ep.lost > 0  # the requests running and queued in b
    s.advance(180)
    assert ep.rejected == 0  # a takes everything from now on


def test_an_endpoint_without_any_pod_goes_away() -> None:
    s = sim()
    s.sync([pod("a"), pod("x", region="us-west")])
    s.advance(10)
    s.sync([pod("a")])
    assert set(s.endpoints) == {("llm", "bloom-176b", "us-east")}


def test_counters_only_grow() -> None:
    s = sim(load=3)
    s.sync([pod("a")])
    last = (0, 0, 0)
    for k in range(1, 40):
        s.advance(k * 15.0)
        c = s.samples()[0].counters
        now = (c.prompt_tokens, c.generation_tokens, c.requests_finished)
        assert all(n >= p for n, p in zip(now, last, strict=True))
        last = now
    assert last[0] > 0


def kv_usage(load: float) -> float:
    s = sim(load=load)
    s.sync([pod("a")])
    usage = []
    for k in range(1, 41):
        s.advance(k * 15.0)
        usage.append(s.samples()[0].kv_usage)
    return sum(usage[10:]) / len(usage[10:])


def test_kv_usage_rises_with_load() -> None:
    low, mid, high = kv_usage(0.2), kv_usage(1.0), kv_usage(5.0)
    assert 0 <= low < mid < high <= 1
    assert high > 0.7 > 0.3 > low  # the reactive thresholds see both sides


def test_waiting_requests_pile_up_only_beyond_capacity() -> None:
    calm, flooded = sim(load=0.2), sim(load=20)
    for s in (calm, flooded):
        s.sync([pod("a")])
        s.advance(600)
    assert calm.samples()[0].waiting == 0
    assert flooded.samples()[0].waiting > 100


def test_a_load_multiplier_scales_the_request_rate() -> None:
    counts = []
    for m in (0.5, 1.0, 2.5):
        s = sim(load=m)
        s.sync([pod("a", serving=False)])
        s.advance(2000)
        counts.append(s.endpoints[("llm", "bloom-176b", "us-east")].arrived)
    assert counts[0] == pytest.approx(1000, rel=0.1)
    assert counts[1] == 2000
    assert counts[2] == pytest.approx(5000, rel=0.1)


def test_the_runtime_override_changes_the_load_of_matching_endpoints_only() -> None:
    s = sim()
    s.sync([pod("a", serving=False), pod("b", serving=False, region="us-west")])
    s.load.set(3, "*/us-west")
    s.advance(1000)
    east = s.endpoints[("llm", "bloom-176b", "us-east")].arrived
    west = s.endpoints[("llm", "bloom-176b", "us-west")].arrived
    assert east == 1000
    assert west == pytest.approx(3000, rel=0.1)
    s.load.set(0)  # "*" replaces every override
    s.advance(2000)
    assert s.endpoints[("llm", "bloom-176b", "us-east")].arrived == east


def test_load_shape_interpolates_between_points_and_holds_after_the_last() -> None:
    shape = LoadShape.parse("0:1, 30m:3, 1h:0.5")
    assert shape(0) == 1
    assert shape(900) == 2
    assert shape(1800) == 3
    assert shape(2700) == pytest.approx(1.75)
    assert shape(99999) == 0.5
    control = LoadControl(scale=2, shape=shape, factors={"*/us-west": 0.5})
    assert control.multiplier(("ns", "m", "us-west"), 1800) == 3
    assert control.multiplier(("ns", "m", "us-east"), 1800) == 6


@pytest.mark.parametrize("bad", ["", "10m", "0:-1", "x:1"])
def test_a_bad_load_profile_is_refused_with_the_expected_form(bad: str) -> None:
    with pytest.raises(ValueError):
        LoadShape.parse(bad)


def test_perf_profile_from_mapping_annotation_name_or_default() -> None:
    r = PerfResolver(CATALOG, profiles={"chat": "llama-2-70b"}, default="llama-3-1-8b")
    assert r.resolve(pod("a", md="chat")).model == "llama-2-70b"
    assert r.resolve(pod("a", md="bloom-176b")).model == "bloom-176b"
    r.annotations[("llm", "bloom-176b")] = "llama-3-2-3b"
    assert r.resolve(pod("a", md="bloom-176b")).model == "llama-3-2-3b"
    assert r.resolve(pod("a", md="mystery")).model == "llama-3-1-8b"
    v = r.resolve(pod("a", md="chat"))
    assert (v.gpu_type, v.gpus) == ("NVIDIA-A100-SXM4-80GB", 8)
    with pytest.raises(KeyError, match="--profile mystery=PROFILE"):
        PerfResolver(CATALOG).resolve(pod("a", md="mystery"))


def test_histogram_counts_cumulatively_up_to_inf() -> None:
    h = Histogram((0.5, 1.0))
    for v in (0.1, 0.7, 0.7, 3.0):
        h.observe(v)
    assert h.cumulative() == [("0.5", 1), ("1.0", 3), ("+Inf", 4)]
    assert h.total == pytest.approx(4.5)


def test_an_azure_trace_repeats_without_end_and_drives_the_instances() -> None:
    trace = TraceSource(AZURE_CONV)
    rows = trace(3500, 1)
    first = [next(rows).t for _ in range(3)]
    assert all(t >= 3500 for t in first)
    later = [r.t for _, r in zip(range(40000), rows, strict=False)]
    assert later[-1] > 7200  # past the end of the one-hour trace
    s = sim()
    s.rows = trace
    s.sync([pod("a")])
    s.advance(600)
    assert s.samples()[0].counters.requests_finished > 100


def test_a_pod_without_a_perf_profile_gets_no_load_and_says_why() -> None:
    s = sim()
    s.sync([pod("a"), pod("m", md="mystery")])
    assert [x.pod.name for x in s.samples()] == ["a"]
    assert "--profile mystery=PROFILE" in s.problems["m"]
    s.sync([pod("a")])
    assert s.problems == {}


def test_trace_requests_beyond_the_context_are_refused_at_arrival() -> None:
    """Bloom-176B holds 2,048 tokens: a trace of 2,000 + 150 is refused, never queued."""
    from sageserve.twin.load import TwinSim
    from tests.twin.helpers import steady

    s = TwinSim(steady(1.0, prompt=2000, output=150), PerfResolver(CATALOG).resolve)
    s.sync([pod("a")])
    s.advance(60)
    ep = s.endpoints[("llm", "bloom-176b", "us-east")]
    assert ep.arrived == ep.refused == 60
    [sample] = s.samples()
    assert sample.waiting == sample.running == 0 and sample.counters.requests_finished == 0


def test_max_model_len_of_the_pod_overrides_the_profile() -> None:
    """`--max-model-len` (spec.model.contextLength) is the pod's limit, not the profile's."""
    from dataclasses import replace

    from sageserve.twin.load import ContextLengthExceeded

    s = sim()
    s.sync([replace(pod("a"), max_model_len=1000)])
    with pytest.raises(ContextLengthExceeded) as err:
        s.submit("llm", "a", 900, 200)
    assert err.value.limit == 1000
    assert s.submit("llm", "a", 800, 200) is not None


H100 = "NVIDIA-H100-80GB-HBM3"


def test_the_profile_follows_the_pods_tensor_and_pipeline_parallel_sizes() -> None:
    """A TP4×PP2 pod gets the TP4×PP2 layout (derived from the TP4 profile, OServe App. D),
    not the TP8 profile of the same 8 GPUs; TP8 (or no sizes at all) stays the TP8 table."""
    from dataclasses import replace

    r = PerfResolver(CATALOG)
    base = replace(pod("a", md="llama-2-70b"), gpu_type=H100, gpus=8)
    tp8 = CATALOG.get("llama-2-70b", H100, 8)
    assert r.resolve(base) is tp8
    assert r.resolve(replace(base, tensor_parallel=8, pipeline_parallel=1)) is tp8
    pipe = r.resolve(replace(base, tensor_parallel=4, pipeline_parallel=2))
    assert (pipe.tensor_parallel, pipe.pipeline_parallel, pipe.gpus) == (4, 2, 8)
    assert pipe.derived and pipe is CATALOG.layout("llama-2-70b", H100, 4, 2)
    assert pipe.prefill(16384) != tp8.prefill(16384)
    # only the pipeline size given: TP is the rest of the pod's GPUs
    assert r.resolve(replace(base, pipeline_parallel=2)) is pipe


def test_a_layout_without_a_profile_to_derive_from_falls_back_to_the_gpu_count() -> None:
    from dataclasses import replace

    r = PerfResolver(CATALOG)
    base = replace(pod("a", md="llama-2-70b"), gpu_type=H100, gpus=8)
    tp8 = CATALOG.get("llama-2-70b", H100, 8)
    # no measured TP2 profile of llama-2-70b: nothing to derive TP2×PP4 from
    assert r.resolve(replace(base, tensor_parallel=2, pipeline_parallel=4)) is tp8
    # TP × PP is not the pod's GPUs (a pooled pod's engines share them): GPU count
    assert r.resolve(replace(base, tensor_parallel=4, pipeline_parallel=1)) is tp8


def test_a_layout_vllm_refuses_is_the_pods_problem() -> None:
    from dataclasses import replace

    s = sim()
    bad = replace(pod("b", md="llama-2-70b"), gpu_type=H100, gpus=6, tensor_parallel=3)
    bad = replace(bad, pipeline_parallel=2)
    s.sync([pod("a"), bad])
    assert [x.pod.name for x in s.samples()] == ["a"]
    assert "spec.variants[].tensorParallel=3 does not divide the 64" in s.problems["b"]
