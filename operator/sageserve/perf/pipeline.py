"""Pipeline-parallel layouts derived from a measured tensor-parallel profile (OServe App. D).

Why derived: the bundled tables measure pure tensor parallelism only (TP4, TP8), yet OServe's
best layouts mix TP and PP (§6, Table 3: (TP=4,PP=2), (TP=3,PP=2), (PP=4), ...). OServe
profiles one transformer layer per TP degree plus the pipeline's inter-GPU transfer, and
builds any (TP, PP) from them: "combining each layer's TP costs (both computation and
communication) with the pipeline-parallelism (PP) communication cost" (App. D). We do the
same with the whole-model TP profile standing in for L × one layer.

The formula, for a TP profile T_tp(x) (prefill: x batched prompt tokens; decode: x tokens of
KV in the running batch) and PP = p stages of a model with L layers:

- stage share      f = ⌈L / p⌉ / L   (vLLM splits layers as evenly as it can; the largest
  stage bounds the pipeline);
- one stage        s(x) = f · T_tp(x) + h(m),  h(m) = α + m · hidden · dtype_bytes / B,
  the activation of m tokens sent to the next stage over a link of bandwidth B with latency
  α (NVLink inside a node, the node's NIC when the replica spans nodes: the slowest hop
  bounds every stage);
- micro-batching   vLLM runs p micro-batches (its virtual engines) in flight, one per stage,
  so in steady state every stage is busy and one micro-batch of x/p tokens leaves the
  pipeline every s(x/p). The batch of x tokens as a whole advances one step every

      prefill_pp(x) = p · s(x/p)   with m = x/p tokens per hop,
      decode_pp(x)  = p · s(x/p)   with m = max_num_seqs of one micro-batch (one token per
                                    sequence; the upper bound, which errs slow).

  The paper states no micro-batching rule (App. D is silent); this is vLLM's pipeline
  execution, without which PP would add latency and never throughput.
- KV capacity: each GPU holds f·W/t of weights (W bytes on t-way TP), so the stage with
  ⌈L/p⌉ layers holds (t·M·u − f·W) / (f · kv_bytes_per_token) tokens, where t·M·u (GPU memory
  × vLLM's gpu_memory_utilization) is recovered from the TP profile itself:
  t·M·u = kv_tp · kv_bytes_per_token + W. Hence kv_pp = kv_tp / f + W (1 − f) / (f · kv_b).
- max_num_seqs: p × the TP profile's (each virtual engine schedules its own batch).

The result is marked `derived: true` and its `source` spells the formula out. At p = 1 every
term reduces to the TP profile itself (f = 1, one stage, no hop). What this leaves out (a
[GAP] in App. D as well): pipeline bubbles when fewer than p micro-batches are ready, and
latency: one request's prefill takes (2p − 1)·s(x/p) alone, not p·s(x/p).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from sageserve.perf.model import (
    DEFAULT_NODE_GPUS,
    ModelArchitecture,
    PiecewiseLinear,
    VariantPerf,
)


@dataclass(frozen=True)
class Link:
    """One pipeline hop: bandwidth in GB/s (10⁹ bytes, one direction) and latency in s."""

    gb_per_s: float
    latency_s: float


#: Per-GPU link rates, one direction. Inside a node: NVLink (H100 SXM5: NVLink 4, 900 GB/s
#: both directions; A100 SXM4: NVLink 3, 600 GB/s; NVIDIA datasheets). Between nodes: one NIC
#: per GPU as in HGX/DGX systems (H100: ConnectX-7 400 Gb/s = 50 GB/s; A100: ConnectX-6 HDR
#: 200 Gb/s = 25 GB/s). Latencies are typical NCCL point-to-point figures for small messages
#: (an assumption, not a measurement; at these sizes the hop is < 1 % of a step anyway).
#: OServe's testbed (§6.1): NVLink 400 GB/s inside a server, InfiniBand 200 GB/s between.
INTRA_NODE: dict[str, Link] = {
    "NVIDIA-H100-80GB-HBM3": Link(450.0, 10e-6),
    "NVIDIA-A100-SXM4-80GB": Link(300.0, 10e-6),
}
INTER_NODE: dict[str, Link] = {
    "NVIDIA-H100-80GB-HBM3": Link(50.0, 20e-6),
    "NVIDIA-A100-SXM4-80GB": Link(25.0, 20e-6),
}
#: For GPU types not in the tables: the slower (A100-class) links, which err slow.
_FALLBACK_INTRA = Link(300.0, 10e-6)
_FALLBACK_INTER = Link(25.0, 20e-6)


def hop_link(gpu_type: str, gpus: int, node_gpus: int = DEFAULT_NODE_GPUS) -> Link:
    """The slowest hop of a replica of `gpus` GPUs: NVLink when it fits one node, else the
    NIC (its stages are spread over nodes, at least one hop crosses them)."""
    if gpus <= node_gpus:
        return INTRA_NODE.get(gpu_type, _FALLBACK_INTRA)
    return INTER_NODE.get(gpu_type, _FALLBACK_INTER)


def stage_share(layers: int, pipeline_parallel: int) -> float:
    """f = ⌈L/p⌉ / L: the largest stage's share of the layers."""
    return math.ceil(layers / pipeline_parallel) / layers


def derived_kv_tokens(tp_kv_tokens: int, arch: ModelArchitecture, pipeline_parallel: int) -> int:
    """kv_pp = kv_tp / f + W (1 − f) / (f · kv_bytes_per_token) (see the module docstring)."""
    f = stage_share(arch.layers, pipeline_parallel)
    extra = arch.weight_bytes * (1.0 - f) / (f * arch.kv_bytes_per_token)
    return int(tp_kv_tokens / f + extra)


def derive_pipeline(
    base: VariantPerf,
    pipeline_parallel: int,
    arch: ModelArchitecture,
    node_gpus: int = DEFAULT_NODE_GPUS,
) -> VariantPerf:
    """The (TP, PP) layout of `base` (a TP profile, PP = 1) with `pipeline_parallel` stages."""
    p = pipeline_parallel
    if base.pipeline_parallel != 1:
        raise ValueError(f"base: derive from a PP = 1 profile, got PP={base.pipeline_parallel}")
    if p < 1:
        raise ValueError(f"pipeline_parallel: must be >= 1, got {p}")
    if p == 1:
        return base
    gpus = base.tensor_parallel * p
    f = stage_share(arch.layers, p)
    link = hop_link(base.gpu_type, gpus, node_gpus)
    bytes_per_token = arch.hidden_size * arch.dtype_bytes

    def hop(tokens: float) -> float:
        return link.latency_s + tokens * bytes_per_token / (link.gb_per_s * 1e9)

    pre = base.prefill_curve
    prefill = PiecewiseLinear(
        tuple(p * x for x in pre.xs),
        tuple(p * (f * y + hop(x)) for x, y in zip(pre.xs, pre.ys, strict=True)),
    )
    dec = base.decode_curve
    decode_hop = hop(base.max_num_seqs)
    decode = PiecewiseLinear(
        tuple(p * x for x in dec.xs), tuple(p * (f * y + decode_hop) for y in dec.ys)
    )
    source = (
        f"derived (OServe App. D) from the TP{base.tensor_parallel} profile: stage share "
        f"f = ceil({arch.layers}/{p})/{arch.layers} = {f:.4f}; step(x) = {p} × (f × "
        f"T_tp{base.tensor_parallel}(x/{p}) + hop), hop = {link.latency_s * 1e6:.0f} us + "
        f"tokens × {bytes_per_token:.0f} B / {link.gb_per_s:.0f} GB/s; kv = kv_tp / f + "
        f"W (1 - f) / (f × kv_bytes); max_num_seqs × {p}. Base: {base.source}"
    )
    return replace(
        base,
        gpus=gpus,
        pipeline_parallel=p,
        kv_capacity_tokens=derived_kv_tokens(base.kv_capacity_tokens, arch, p),
        max_num_seqs=base.max_num_seqs * p,
        prefill_curve=prefill,
        decode_curve=decode,
        source=source,
        derived=True,
    )
