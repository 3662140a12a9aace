"""Profiles derived from Vidur's operator rows (`perf/derive_vidur.py`) and the regimes they
open: what a user sees is the step times of the bundled small-model profiles, so a wrong sum
or a lost all-reduce shows up as a wrong table."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from sageserve.perf.capacity import type_capacity
from sageserve.perf.derive_vidur import (
    GPUS,
    LAYER_OPS,
    Arch,
    StepModel,
    VidurData,
    derive_variant,
    kv_capacity_tokens,
    layer_curves,
    roofline,
)
from sageserve.perf.model import load_catalog

TINY = Arch("tiny", "org/tiny", 1e9, 2, 4, 4, 64, 128, 100, 64, "fixture")
A100 = GPUS[1]


def _row(tokens: int, tp: int, op_ms: float, up_ms: float) -> dict[str, str]:
    r = {f"time_stats.{op}.median": str(op_ms) for op in LAYER_OPS}
    r["time_stats.mlp_up_proj.median"] = str(up_ms)
    r["time_stats.emb.median"] = "0.5"
    r.update(
        n_head="4",
        n_kv_head="4",
        n_embd="64",
        n_expanded_embd="128",
        num_tokens=str(tokens),
        num_tensor_parallel_workers=str(tp),
    )
    return r


ROWS = [_row(1, 1, 1.0, 2.0), _row(1024, 1, 2.0, 4.0), _row(4096, 1, 5.0, 10.0)]


def test_a_layer_is_the_sum_of_its_operator_medians_interpolated_on_tokens() -> None:
    layer, emb = layer_curves(ROWS, 1)
    # 8 operators at 1 ms + the up-projection at 2 ms = 10 ms at 1 token
    assert layer(1) == pytest.approx(0.010)
    assert layer(1024) == pytest.approx(8 * 0.002 + 0.004)
    assert layer(2560) == pytest.approx((0.020 + 8 * 0.005 + 0.010) / 2)
    assert emb(4096) == pytest.approx(0.0005)


def test_above_the_last_row_the_curve_follows_the_chord_from_half_of_it() -> None:
    layer, _ = layer_curves(ROWS, 1)
    slope = (layer(4096) - layer(1024)) / (4096 - 1024)  # the row at or below 2,048
    assert layer(8192) == pytest.approx(layer(4096) + slope * 4096)


def test_the_roofline_reads_bandwidth_at_one_token_and_flops_at_the_most() -> None:
    bandwidth, flops = roofline(ROWS, TINY, 1)
    weights = 64 * 2 * 128
    assert bandwidth == pytest.approx(weights * 2 / 0.002)
    assert flops == pytest.approx(2 * 4096 * weights / 0.010)


def test_a_prefill_step_is_embedding_plus_layers_plus_attention_plus_lm_head() -> None:
    layer, emb = layer_curves(ROWS, 1)
    bandwidth, flops = roofline(ROWS, TINY, 1)
    m = StepModel(TINY, 1, layer, emb, bandwidth, flops, None)
    attention = 2 * 1024 * 1024 * 4 * 16 / flops
    kv_write = 1024 * 2 * 4 * 16 * 2 / bandwidth
    lm_head = max(64 * 100 * 2 / bandwidth, 2 * 64 * 100 / flops)
    want = 0.0005 + 2 * (layer(1024) + attention + kv_write) + lm_head
    assert m.prefill(1024) == pytest.approx(want)


def test_decode_grows_with_the_context_it_reads() -> None:
    layer, emb = layer_curves(ROWS, 1)
    bandwidth, flops = roofline(ROWS, TINY, 1)
    m = StepModel(TINY, 1, layer, emb, bandwidth, flops, None)
    assert m.decode(64_000) > m.decode(8_000) > m.decode(128)


def test_kv_capacity_is_memory_minus_weights_over_kv_bytes() -> None:
    # 0.9 × 80 GB − 2 GB of weights over 2 layers × 2 × 4 heads × 16 × 2 B per token
    assert kv_capacity_tokens(TINY, A100, 1) == int((72e9 - 2e9) // 512)


def test_a_variant_without_all_reduce_rows_is_not_derived_beyond_one_gpu() -> None:
    rows2 = ROWS + [_row(t, 2, 1.0, 1.0) for t in (1, 4096)]
    assert derive_variant(rows2, TINY, A100, 2, None, "fixture") is None
    one = derive_variant(ROWS, TINY, A100, 1, None, "fixture")
    assert one is not None and one["derived"] is True
    assert [p[1] for p in one["prefill"]] == sorted(p[1] for p in one["prefill"])


def test_the_reader_takes_a_checkout_directory(tmp_path: Path) -> None:
    p = tmp_path / "data/profiling/compute/a100/org/tiny/mlp.csv"
    p.parent.mkdir(parents=True)
    with p.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(ROWS[0]))
        w.writeheader()
        w.writerows(ROWS)
    got = VidurData(tmp_path).rows("data/profiling/compute/a100/org/tiny/mlp.csv")
    assert got is not None and len(got) == 3
    assert VidurData(tmp_path).rows("data/profiling/compute/h100/org/tiny/mlp.csv") is None


def test_llama_2_7b_on_one_a40_is_memory_bound_where_70b_on_4_h100_is_not() -> None:
    """PreServe's setting: a conversation request (1,000 prompt, 250 output tokens) fills a
    7B/A40's KV with ~50 sequences; the 70B/TP4 instance holds 8x more."""
    cat = load_catalog()
    small = cat.get("llama-2-7b", "NVIDIA-A40", 1)
    big = cat.get("llama-2-70b", "NVIDIA-H100-80GB-HBM3", 4)
    assert small.kv_capacity_tokens // 1125 < 64 < small.max_num_seqs
    assert big.kv_capacity_tokens > 8 * small.kv_capacity_tokens


def test_the_best_tensor_parallel_size_per_gpu_differs_by_request_type() -> None:
    """OServe's crossing with the derived CodeLlama-34B on H100: short requests serve best
    per GPU on TP1, long-output ones on TP2 (TP1's KV holds too few sequences)."""
    cat = load_catalog()

    def best(prompt: float, output: float) -> int:
        per_gpu = {
            tp: type_capacity(cat.get("codellama-34b", "NVIDIA-H100-80GB-HBM3", tp), prompt, output)
            / tp
            for tp in (1, 2, 4, 8)
        }
        return max(per_gpu, key=lambda t: per_gpu[t])

    assert best(164, 13) == 1
    assert best(1245, 313) == 2
