"""The perf model interpolates the published tables and gives plausible throughput."""

from __future__ import annotations

import pytest

from sageserve.perf.model import PiecewiseLinear, load_catalog

H100 = "NVIDIA-H100-80GB-HBM3"
A100 = "NVIDIA-A100-SXM4-80GB"
MODELS = ("llama-2-70b", "bloom-176b", "llama-3-1-8b", "llama-3-2-3b")


def test_interpolates_between_points_and_extrapolates_the_last_slope() -> None:
    f = PiecewiseLinear.from_points([[100, 1.0], [200, 2.0], [400, 3.0]])
    assert f(150) == pytest.approx(1.5)
    assert f(50) == 1.0  # held below the first point
    assert f(600) == pytest.approx(4.0)  # last slope 1/200 per token


def test_rejects_unsorted_duplicate_x() -> None:
    with pytest.raises(ValueError):
        PiecewiseLinear((1.0, 1.0), (0.0, 1.0))


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("gpu", (H100, A100))
def test_every_model_has_a_profile_on_both_gpu_types_with_a_source(model: str, gpu: str) -> None:
    v = load_catalog().get(model, gpu)
    assert v.kv_capacity_tokens > 0
    assert v.source
    # more tokens never take less time
    assert v.prefill(8192) >= v.prefill(512)
    assert v.decode(32768) >= v.decode(512)


def test_h100_is_faster_than_a100_for_llama_2_70b() -> None:
    cat = load_catalog()
    h, a = cat.get("llama-2-70b", H100, 8), cat.get("llama-2-70b", A100, 8)
    assert h.prefill(4096) < a.prefill(4096)
    assert h.decode(16384) < a.decode(16384)


def test_llama_2_70b_throughput_is_of_the_order_the_paper_measured() -> None:
    # SageServe §2.1: 95-522 tokens/s (Q1-Q3) per 8xH100 instance in production, i.e. under
    # partial load. A single sequence must be within that order, a large batch above it.
    v = load_catalog().get("llama-2-70b", H100, 8)
    single = v.decode_tokens_per_s(1, 1500)
    assert 10 < single < 522
    assert v.decode_tokens_per_s(64, 1500) > 522


def test_kv_capacity_follows_the_vllm_rule() -> None:
    v = load_catalog().get("llama-2-70b", H100, 8)
    per_token = 2 * 80 * 8 * 128 * 2  # K and V, 80 layers, 8 KV heads, head dim 128, fp16
    expected = (8 * 80e9 * 0.9 - 68.98e9 * 2) // per_token
    assert v.kv_capacity_tokens == expected
