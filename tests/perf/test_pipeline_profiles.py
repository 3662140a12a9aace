"""Profiles per (model, GPU type, TP, PP): pipeline layouts derived from the TP tables (OServe
App. D), and the layout rules (TP divides the heads, TP inside a node).

Expected values are worked out by hand from the bundled llama-2-70b H100 TP4 table
(`perf/profiles/llama-2-70b.yaml`) and its architecture (80 layers, 64 heads, hidden 8192)."""

from __future__ import annotations

import pytest

from sageserve.perf.model import (
    LayoutError,
    ModelArchitecture,
    PerfCatalog,
    check_layout,
    load_catalog,
)

H100 = "NVIDIA-H100-80GB-HBM3"
M = "llama-2-70b"
HOP_BYTES_PER_TOKEN = 8192 * 2  # hidden × fp16


@pytest.fixture(scope="module")
def cat() -> PerfCatalog:
    return load_catalog()


def test_lookups_by_gpu_count_are_unchanged(cat: PerfCatalog) -> None:
    v = cat.get(M, H100, 8)
    assert (v.gpus, v.tensor_parallel, v.pipeline_parallel, v.derived) == (8, 8, 1, False)
    assert cat.layout(M, H100, 8) is v
    assert cat.layout(M, H100, 4, 1) is cat.get(M, H100, 4)
    assert set(cat.variants) == {k for k in cat.variants if len(k) == 3}


def test_tp4_pp2_is_derived_with_the_documented_formula(cat: PerfCatalog) -> None:
    v = cat.layout(M, H100, 4, 2)
    assert (v.gpus, v.tensor_parallel, v.pipeline_parallel, v.derived) == (8, 4, 2, True)
    assert "derived" in v.source and "OServe App. D" in v.source
    f = 40 / 80
    # one node (8 GPUs): NVLink 450 GB/s, 10 µs per hop
    hop_prefill = 10e-6 + 16384 * HOP_BYTES_PER_TOKEN / 450e9
    assert v.prefill(32768) == pytest.approx(2 * (f * 1.72605 + hop_prefill), rel=1e-9)
    hop_decode = 10e-6 + 512 * HOP_BYTES_PER_TOKEN / 450e9  # one micro-batch: 512 sequences
    assert v.decode(2 * 16384) == pytest.approx(2 * (f * 0.036885 + hop_decode), rel=1e-9)
    assert v.max_num_seqs == 2 * 512


def test_derived_kv_matches_the_memory_rule_of_the_measured_tables(cat: PerfCatalog) -> None:
    # TP4×PP2 and TP8 hold the same 8 GPUs of weights and memory: (8 × 80 GB × 0.9 − W) / kv
    assert cat.layout(M, H100, 4, 2).kv_capacity_tokens == pytest.approx(
        cat.get(M, H100, 8).kv_capacity_tokens, abs=2
    )
    # the TP4 table's KV is truncated to whole tokens; 1/f = 4 multiplies that by 4
    assert cat.layout(M, H100, 4, 4).kv_capacity_tokens == pytest.approx(
        (16 * 80e9 * 0.9 - 68.98e9 * 2) / 327680, abs=5
    )


def test_uneven_stages_are_bounded_by_the_largest(cat: PerfCatalog) -> None:
    v = cat.layout(M, H100, 4, 3)  # 80 layers over 3 stages: 27 + 27 + 26
    f = 27 / 80
    hop = 20e-6 + 8192 * HOP_BYTES_PER_TOKEN / 50e9  # 12 GPUs span two nodes: the NIC
    assert v.prefill(3 * 8192) == pytest.approx(3 * (f * 0.92495 + hop), rel=1e-9)
    w, kv_b = 68.98e9 * 2, 327680
    assert v.kv_capacity_tokens == int(457885 / f + w * (1 - f) / (f * kv_b))


def test_replicas_spanning_nodes_pay_the_network_hop(cat: PerfCatalog) -> None:
    inside = cat.layout(M, H100, 8, 2, node_gpus=16)
    across = cat.layout(M, H100, 8, 2, node_gpus=8)
    assert across.prefill(32768) > inside.prefill(32768)
    assert across.prefill(32768) - inside.prefill(32768) == pytest.approx(
        2 * ((20e-6 - 10e-6) + 16384 * HOP_BYTES_PER_TOKEN * (1 / 50e9 - 1 / 450e9)), rel=1e-6
    )


def test_tp_must_divide_the_heads(cat: PerfCatalog) -> None:
    with pytest.raises(LayoutError, match=r"tensorParallel=3 does not divide the 64 attention"):
        check_layout(cat.architecture(M), 3, 2)
    opt66 = ModelArchitecture("opt-66b", 66e9, 64, 72, 9216, 2 * 64 * 9216 * 2)
    check_layout(opt66, 3, 2)  # 72 heads: TP3 is fine (OServe Table 3 runs TP=3, PP=2)


def test_tp_group_stays_inside_a_node(cat: PerfCatalog) -> None:
    with pytest.raises(LayoutError, match=r"exceeds the 8 GPUs of one node.*pipelineParallel"):
        cat.layout(M, H100, 16, 1, node_gpus=8)
    with pytest.raises(LayoutError, match=r"pipelineParallel=81 exceeds the 80 layers"):
        check_layout(cat.architecture(M), 1, 81)


def test_unmeasured_tp_is_refused_not_invented(cat: PerfCatalog) -> None:
    with pytest.raises(KeyError, match=r"measured TP sizes: \[4, 8\]"):
        cat.layout(M, H100, 2, 2)


def test_layouts_lists_every_valid_shape(cat: PerfCatalog) -> None:
    shapes = [(v.tensor_parallel, v.pipeline_parallel) for v in cat.layouts(M, H100, 16)]
    assert shapes == [(4, 1), (4, 2), (8, 1), (4, 3), (4, 4), (8, 2)]


def test_profile_gpus_must_equal_tp_times_pp() -> None:
    cat = PerfCatalog()
    doc = {
        "model": "m",
        "variants": [
            {
                "gpu_type": H100,
                "gpus": 8,
                "tensor_parallel": 4,
                "pipeline_parallel": 1,
                "kv_capacity_tokens": 1000,
                "prefill": [[1, 0.1]],
                "decode": [[1, 0.01]],
            }
        ],
    }
    with pytest.raises(ValueError, match=r"gpus=8 must equal tensor_parallel × pipeline_parallel"):
        cat.add_profile(doc)
