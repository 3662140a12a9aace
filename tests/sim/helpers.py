"""Small builders for simulator tests."""

from __future__ import annotations

import random
from collections.abc import Iterator

from sageserve.core.types import Request, Tier
from sageserve.perf.model import PiecewiseLinear, VariantPerf
from sageserve.sim.cluster import Node
from sageserve.sim.engine import ModelSetup, RegionPlacement, SimConfig

H100 = "NVIDIA-H100-80GB-HBM3"


def flat_perf(
    prefill_s: float = 0.1,
    decode_s: float = 0.01,
    kv: int = 100_000,
    gpus: int = 8,
    max_seqs: int = 512,
) -> VariantPerf:
    """A perf model with constant step times, so expected latencies are easy to compute."""
    return VariantPerf(
        model="m",
        gpu_type=H100,
        gpus=gpus,
        tensor_parallel=gpus,
        kv_capacity_tokens=kv,
        max_num_seqs=max_seqs,
        prefill_curve=PiecewiseLinear((1.0,), (prefill_s,)),
        decode_curve=PiecewiseLinear((1.0,), (decode_s,)),
    )


def nodes(regions: tuple[str, ...] = ("r1",), serving: int = 4, spot: int = 2) -> tuple[Node, ...]:
    out = []
    for r in regions:
        for i in range(serving):
            out.append(Node(f"{r}-s{i}", r, H100, "serving", 8))
        for i in range(spot):
            out.append(Node(f"{r}-p{i}", r, H100, "spot", 8))
    return tuple(out)


def config(
    perf: VariantPerf,
    regions: tuple[str, ...] = ("r1",),
    initial: int = 2,
    lo: int = 1,
    hi: int = 6,
    end_s: float = 3600.0,
    **kw: object,
) -> SimConfig:
    placements = tuple(RegionPlacement(r, lo, hi, initial) for r in regions)
    return SimConfig(
        models=(ModelSetup("m", (("v", perf),), placements),),
        nodes=nodes(regions),
        start_s=0.0,
        end_s=end_s,
        region_order=regions,
        **kw,  # type: ignore[arg-type]
    )


def poisson(
    rate: float,
    end_s: float,
    tiers: list[Tier],
    regions: tuple[str, ...] = ("r1",),
    seed: int = 1,
    prompt: int = 500,
    output: int = 50,
) -> Iterator[Request]:
    rng = random.Random(seed)
    t = 0.0
    i = 0
    while True:
        t += rng.expovariate(rate)
        if t >= end_s:
            return
        p = max(1, int(rng.expovariate(1 / prompt)))
        o = max(1, int(rng.expovariate(1 / output)))
        yield Request(i, t, "m", rng.choice(tiers), rng.choice(regions), p, o)
        i += 1
