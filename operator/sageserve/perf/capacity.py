"""Per-type capacity n_{k,j} of one layout: the most requests/s of one request type it sustains.

Why analytical: OServe's flow network needs n_{k,j} for every (replica layout, request type)
pair (§4.2; App. D builds them from per-layer profiles). The paper gives no formula from
latencies to n ([GAP], App. D: prefill is "compute-bound, with batched processing capacity
determined by the sum of individual layer latencies", decode "memory-bound, with batched
processing capacity defined by a single latency value"). This module settles it with the
same two phases, on the simulator's instance model (`sim/instance.py`: prefill steps of up to
`max_batched_tokens`, decode iterations over the running batch, decode pausing during
prefill):

- a request of type j has I prompt tokens and O output tokens; over its life it holds on
  average c̄ = I + O/2 tokens of KV;
- the running batch is B = min(max_num_seqs, ⌊KV / c̄⌋) sequences (memory-bound: long outputs
  fill the KV cache before the sequence cap);
- at saturation, each second the layout prefills n·I prompt tokens in full batches, at
  t_p = prefill(b)/b seconds per token with b = max_batched_tokens, and decodes n·(O − 1)
  tokens (the first comes with the prefill) at B tokens per iteration of
  t_d = decode(B · c̄) seconds. Both fit in one second:

      n · I · t_p + n · (O − 1) · t_d / B = 1   ⇒   n = 1 / (I · t_p + (O − 1) · t_d / B)

A request longer than the context length or than the KV cache can hold gets n = 0 (vLLM
refuses it). What is not in n: any latency SLO (the paper's n is the maximum throughput, not
throughput at an SLO) and queueing. `sageserve calibrate --by-type` (`sim/type_capacity.py`)
measures n on the simulator at an SLO instead; `bench oserve --capacity` chooses between them.
"""

from __future__ import annotations

import math

from sageserve.perf.model import VariantPerf

#: The simulator's and vLLM V1's default `max_num_batched_tokens` for prefill batches
#: (`sim/instance.py`).
DEFAULT_MAX_BATCHED_TOKENS = 16384


def type_capacity(
    perf: VariantPerf,
    input_tokens: float,
    output_tokens: float,
    max_batched_tokens: int = DEFAULT_MAX_BATCHED_TOKENS,
) -> float:
    """n: requests/s of one type (I prompt, O output tokens) the layout sustains (see above)."""
    i = max(1.0, float(input_tokens))
    o = max(1.0, float(output_tokens))
    if perf.context_length and i + o > perf.context_length:
        return 0.0
    if i + o > perf.kv_capacity_tokens:
        return 0.0
    mean_context = i + o / 2.0
    batch = min(perf.max_num_seqs, math.floor(perf.kv_capacity_tokens / mean_context))
    if batch < 1:
        return 0.0
    b = float(max_batched_tokens)
    per_prompt_token = perf.prefill(b) / b
    per_iteration = perf.decode(batch * mean_context)
    seconds = i * per_prompt_token + (o - 1.0) * per_iteration / batch
    return 1.0 / seconds if seconds > 0 else math.inf
