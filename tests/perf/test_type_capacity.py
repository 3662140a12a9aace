"""Per-type capacity n of a layout (perf/capacity.py), on a flat profile worked by hand."""

from __future__ import annotations

import pytest

from sageserve.perf.capacity import type_capacity
from sageserve.perf.model import PiecewiseLinear, VariantPerf


def flat(kv: int = 100_000, seqs: int = 512, context: int = 0) -> VariantPerf:
    return VariantPerf(
        model="m",
        gpu_type="g",
        gpus=4,
        tensor_parallel=4,
        kv_capacity_tokens=kv,
        max_num_seqs=seqs,
        prefill_curve=PiecewiseLinear((1.0,), (0.1,)),
        decode_curve=PiecewiseLinear((1.0,), (0.01,)),
        context_length=context,
    )


def test_memory_bound_batch() -> None:
    # c̄ = 1000 + 101/2 = 1050.5 → B = ⌊100000 / 1050.5⌋ = 95 < 512
    n = type_capacity(flat(), 1000, 101)
    assert n == pytest.approx(1 / (1000 * 0.1 / 16384 + 100 * 0.01 / 95))


def test_sequence_bound_batch() -> None:
    # c̄ = 10 + 5 = 15 → B = min(512, 6666) = 512
    n = type_capacity(flat(), 10, 10)
    assert n == pytest.approx(1 / (10 * 0.1 / 16384 + 9 * 0.01 / 512))


def test_more_kv_helps_only_memory_bound_types() -> None:
    assert type_capacity(flat(kv=400_000), 1000, 101) > type_capacity(flat(), 1000, 101)
    assert type_capacity(flat(kv=400_000), 10, 10) == type_capacity(flat(), 10, 10)


def test_requests_that_cannot_run_have_no_capacity() -> None:
    assert type_capacity(flat(kv=1000), 900, 200) == 0.0
    assert type_capacity(flat(context=512), 400, 200) == 0.0
