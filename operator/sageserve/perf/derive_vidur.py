"""Profiles derived from Vidur's operator-level profiling data (Agrawal et al., MLSys 2024).

Why: the bundled SageServe tables measure 3–176B models at TP4/TP8 only, which leaves out the
regimes PreServe (a 7B model on one GPU, memory-bound), Aegaeon (6–14B models on single GPUs)
and OServe (layouts whose per-type capacity crosses between TP sizes) are evaluated in. Vidur
publishes, per GPU (A40, A100, H100), model and TP degree, the median time of every linear
operator of one transformer layer at 1–4,096 tokens (`data/profiling/compute/<gpu>/<model>/
mlp.csv`), and NCCL all-reduce times by message size (`data/profiling/network/<node>/
all_reduce.csv`). Vidur's attention-kernel tables (`attention.csv`) are 4 MiB and more and
are not read here; attention is a roofline calibrated on the same rows (below).

Method (what the profiles' `source` says), for a model of L layers on t GPUs:

- one layer at x tokens = Σ of the row's operator medians (input norm, QKV projection, RoPE,
  output projection, post-attention norm, MLP up, activation, down, residual add), linear
  between the profiled token counts and, above 4,096, along the chord from 2,048 (`Curve`),
  plus two all-reduces of x × hidden × 2 bytes when t > 1 (after attention and after
  the MLP, as Vidur's `ExecutionTime` sums them), plus attention and the KV-cache write;
- the roofline of attention: an effective memory bandwidth B (bytes of the MLP up-projection's
  weight shard ÷ its time at 1 token: a memory-bound GEMV) and an effective FLOP rate F
  (FLOPs of the same GEMM ÷ its time at the largest token count: compute-bound), both read
  from the rows of that GPU, model and t. Decode attention reads the KV of every running
  token once: C × (2 · kv heads per GPU · head_dim · 2 B) / B per layer. Prefill attention of
  x tokens in prompts of P = min(x, `PREFILL_PROMPT_TOKENS`) tokens costs 2 · x · P · (heads
  / t) · head_dim FLOPs (QKᵀ and AV, causal half) / F. The KV write of x tokens costs its
  bytes / B. vLLM replicates KV heads when t exceeds them (kv heads per GPU ≥ 1);
- a step = embedding row at x + L × layer + the LM head as a roofline (its weight shard / B,
  or its FLOPs for the sequences sampled / F, whichever is larger);
- prefill(x): one step of x batched prompt tokens, sampling one token per prompt;
- decode(C): one iteration with C tokens of KV in the running batch, the batch being
  b = clamp(⌊C / `DECODE_CONTEXT_PER_SEQ`⌋, 1, max_num_seqs) sequences (the profile format's
  axis is context tokens only; the per-sequence context fixes the batch the linear rows see);
- both tables are made non-decreasing (`non_decreasing`: neighbouring rows differ by noise);
- both tables are made non-decreasing (`non_decreasing`: neighbouring rows differ by noise);
- KV capacity: vLLM's rule, t × GPU memory × 0.9 − FP16 weights, over the KV bytes of one
  token on one GPU times t (the rule of the other bundled profiles).

Left out, as in any operator sum: CPU scheduling and sampling overheads (Vidur profiles
them separately), kernel-launch gaps, CUDA graphs. The tables are derived, so every variant
is marked `derived: true`.
"""

from __future__ import annotations

import argparse
import csv
import io
import math
import subprocess
from bisect import bisect_right
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

#: The operator columns of Vidur's mlp.csv that make up one transformer layer.
LAYER_OPS = (
    "input_layernorm",
    "attn_pre_proj",
    "attn_rope",
    "attn_post_proj",
    "post_attention_layernorm",
    "mlp_up_proj",
    "mlp_act",
    "mlp_down_proj",
    "add",
)
#: Tokens per prompt in a prefill batch (the attention term's P); Azure 2023 code's median
#: prompt is about 2k tokens.
PREFILL_PROMPT_TOKENS = 2048
#: Context tokens per running sequence that fixes the decode batch size on the context axis.
DECODE_CONTEXT_PER_SEQ = 1024
#: vLLM's `gpu_memory_utilization` default.
GPU_MEMORY_UTILIZATION = 0.9
#: vLLM's default `max_num_seqs`.
MAX_NUM_SEQS = 256
PREFILL_POINTS = (128, 256, 512, 1024, 2048, 4096, 8192, 16384)


@dataclass(frozen=True)
class Gpu:
    """A GPU of Vidur's data: its directory names and what the profile needs of it."""

    vidur_name: str  # data/profiling/compute/<vidur_name>
    network: str | None  # data/profiling/network/<network>/all_reduce.csv; None: TP1 only
    gpu_type: str  # the Kubernetes product label the profiles key on
    memory_bytes: float  # datasheet memory, 10⁹ bytes


GPUS = (
    Gpu("a40", None, "NVIDIA-A40", 48e9),
    Gpu("a100", "a100_dgx", "NVIDIA-A100-SXM4-80GB", 80e9),
    Gpu("h100", "h100_dgx", "NVIDIA-H100-80GB-HBM3", 80e9),
)


@dataclass(frozen=True)
class Arch:
    """The model's config.json figures the derivation needs (checked against the rows)."""

    name: str  # the profile's model name
    vidur_path: str  # <org>/<model> under data/profiling/compute/<gpu>/
    params: float
    layers: int
    heads: int
    kv_heads: int
    hidden: int
    intermediate: int
    vocab: int
    context_length: int
    source: str

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def kv_bytes_per_token(self) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * 2


MODELS = (
    Arch(
        "llama-2-7b",
        "meta-llama/Llama-2-7b-hf",
        6.74e9,
        32,
        32,
        32,
        4096,
        11008,
        32000,
        4096,
        "meta-llama/Llama-2-7b-hf config.json: 32 layers, 32 heads, 32 KV heads, hidden 4096, "
        "intermediate 11008, vocab 32000, max_position_embeddings 4096",
    ),
    Arch(
        "llama-3-8b",
        "meta-llama/Meta-Llama-3-8B",
        8.03e9,
        32,
        32,
        8,
        4096,
        14336,
        128256,
        8192,
        "meta-llama/Meta-Llama-3-8B config.json: 32 layers, 32 heads, 8 KV heads, hidden 4096, "
        "intermediate 14336, vocab 128256, max_position_embeddings 8192",
    ),
    Arch(
        "codellama-34b",
        "codellama/CodeLlama-34b-Instruct-hf",
        33.74e9,
        48,
        64,
        8,
        8192,
        22016,
        32000,
        16384,
        "codellama/CodeLlama-34b-Instruct-hf config.json: 48 layers, 64 heads, 8 KV heads, "
        "hidden 8192, intermediate 22016, vocab 32000, max_position_embeddings 16384",
    ),
)


class Curve:
    """y(x) linear between points; above the last point, the slope of the chord from the
    point at half its x (neighbouring rows differ by noise, so the last segment's own slope
    can even be negative); below the first, the first segment's slope."""

    def __init__(self, points: Iterable[tuple[float, float]]) -> None:
        pts = sorted(points)
        if len(pts) < 2:
            raise ValueError("a Vidur operator curve needs at least two token counts")
        self.xs = [p[0] for p in pts]
        self.ys = [p[1] for p in pts]

    def __call__(self, x: float) -> float:
        xs, ys = self.xs, self.ys
        if x > xs[-1]:
            j = max(bisect_right(xs, xs[-1] / 2) - 1, 0)
            j = min(j, len(xs) - 2)
            return ys[-1] + (ys[-1] - ys[j]) * (x - xs[-1]) / (xs[-1] - xs[j])
        i = min(max(bisect_right(xs, x), 1), len(xs) - 1)
        x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
        return y0 + (y1 - y0) * (x - x0) / (x1 - x0)


def non_decreasing(points: Sequence[tuple[int, float]]) -> list[list[float]]:
    """[x, y] rows with each y raised to the largest before it: a larger batch never runs
    faster (where it would, neighbouring rows differ by measurement noise)."""
    out: list[list[float]] = []
    top = 0.0
    for x, y in points:
        top = max(top, _round(y))
        out.append([x, top])
    return out


def _median_ms(row: Mapping[str, str], op: str) -> float:
    key = f"time_stats.{op}.median"
    try:
        return float(row[key])
    except KeyError:
        raise KeyError(f"Vidur mlp.csv: column {key} is missing") from None


def layer_curves(rows: Sequence[Mapping[str, str]], tp: int) -> tuple[Curve, Curve]:
    """(one layer's linear operators in seconds, embedding in seconds) by tokens at TP `tp`,
    from the median of each operator (repeats of a token count: their median's mean)."""
    by_tokens: dict[int, list[tuple[float, float]]] = {}
    for r in rows:
        if int(r["num_tensor_parallel_workers"]) != tp:
            continue
        layer = sum(_median_ms(r, op) for op in LAYER_OPS) / 1e3
        emb = _median_ms(r, "emb") / 1e3
        by_tokens.setdefault(int(r["num_tokens"]), []).append((layer, emb))
    if not by_tokens:
        raise ValueError(f"Vidur mlp.csv: no rows with num_tensor_parallel_workers={tp}")
    pts = sorted(by_tokens.items())
    layer_curve = Curve((x, sum(v[0] for v in vs) / len(vs)) for x, vs in pts)
    emb_curve = Curve((x, sum(v[1] for v in vs) / len(vs)) for x, vs in pts)
    return layer_curve, emb_curve


def roofline(rows: Sequence[Mapping[str, str]], arch: Arch, tp: int) -> tuple[float, float]:
    """(effective bytes/s, effective FLOP/s) of this GPU at TP `tp`, from the MLP
    up-projection (gate and up, hidden × 2·intermediate / t weights) at the fewest and at
    the most tokens profiled."""
    up = sorted(
        (int(r["num_tokens"]), _median_ms(r, "mlp_up_proj") / 1e3)
        for r in rows
        if int(r["num_tensor_parallel_workers"]) == tp
    )
    if not up:
        raise ValueError(f"Vidur mlp.csv: no rows with num_tensor_parallel_workers={tp}")
    weights = arch.hidden * 2 * arch.intermediate / tp
    (_, t_lo), (x_hi, t_hi) = up[0], up[-1]
    bandwidth = weights * 2 / t_lo  # FP16 weight bytes read once
    flops = 2 * x_hi * weights / t_hi
    return bandwidth, flops


def all_reduce_curve(rows: Sequence[Mapping[str, str]], tp: int) -> Curve:
    """Seconds of one all-reduce by message bytes over `tp` GPUs of one node (Vidur's
    `devices_per_node == num_workers` rows, the tensor-parallel case)."""
    by_size: dict[int, list[float]] = {}
    for r in rows:
        if r.get("collective", "all_reduce") != "all_reduce":
            continue
        if int(r["num_workers"]) != tp or int(r["devices_per_node"]) != tp:
            continue
        by_size.setdefault(int(r["size"]), []).append(
            float(r["time_stats.all_reduce.median"]) / 1e3
        )
    if not by_size:
        raise ValueError(f"Vidur all_reduce.csv: no rows for {tp} workers on one node")
    return Curve((s, sorted(v)[len(v) // 2]) for s, v in sorted(by_size.items()))


@dataclass(frozen=True)
class StepModel:
    """Step times of one (model, GPU, TP) from Vidur's rows (the module docstring's method)."""

    arch: Arch
    tp: int
    layer: Curve
    emb: Curve
    bandwidth: float
    flops: float
    all_reduce: Curve | None

    @property
    def kv_heads_per_gpu(self) -> float:
        return max(1.0, self.arch.kv_heads / self.tp)

    def _kv_bytes_per_layer(self, tokens: float) -> float:
        return tokens * 2 * self.kv_heads_per_gpu * self.arch.head_dim * 2

    def _lm_head(self, sequences: float) -> float:
        weights = self.arch.hidden * self.arch.vocab / self.tp
        return max(weights * 2 / self.bandwidth, 2 * sequences * weights / self.flops)

    def _comm(self, tokens: float) -> float:
        if self.tp == 1 or self.all_reduce is None:
            return 0.0
        return 2 * self.all_reduce(tokens * self.arch.hidden * 2)

    def prefill(self, tokens: float) -> float:
        """Seconds of one prefill step of `tokens` batched prompt tokens."""
        prompt = min(tokens, PREFILL_PROMPT_TOKENS)
        heads = self.arch.heads / self.tp
        attention = 2 * tokens * prompt * heads * self.arch.head_dim / self.flops
        kv_write = self._kv_bytes_per_layer(tokens) / self.bandwidth
        per_layer = self.layer(tokens) + attention + kv_write + self._comm(tokens)
        prompts = math.ceil(tokens / PREFILL_PROMPT_TOKENS)
        return self.emb(tokens) + self.arch.layers * per_layer + self._lm_head(prompts)

    def decode(self, context_tokens: float, max_num_seqs: int = MAX_NUM_SEQS) -> float:
        """Seconds of one decode iteration with `context_tokens` of KV in the running batch."""
        batch = min(max(int(context_tokens // DECODE_CONTEXT_PER_SEQ), 1), max_num_seqs)
        attention = self._kv_bytes_per_layer(context_tokens) / self.bandwidth
        kv_write = self._kv_bytes_per_layer(batch) / self.bandwidth
        per_layer = self.layer(batch) + attention + kv_write + self._comm(batch)
        return self.emb(batch) + self.arch.layers * per_layer + self._lm_head(batch)


def kv_capacity_tokens(arch: Arch, gpu: Gpu, tp: int) -> int:
    """vLLM's rule: t × memory × 0.9 − weights, over the KV bytes of a token on t GPUs."""
    free = tp * gpu.memory_bytes * GPU_MEMORY_UTILIZATION - arch.params * 2
    per_token = arch.layers * 2 * max(1.0, arch.kv_heads / tp) * arch.head_dim * 2 * tp
    return max(0, int(free // per_token))


def check_rows(rows: Sequence[Mapping[str, str]], arch: Arch) -> None:
    """Refuse rows profiled for another architecture than the config.json figures."""
    r = rows[0]
    got = (int(r["n_head"]), int(r["n_kv_head"]), int(r["n_embd"]), int(r["n_expanded_embd"]))
    want = (arch.heads, arch.kv_heads, arch.hidden, arch.intermediate)
    if got != want:
        raise ValueError(
            f"Vidur rows of {arch.vidur_path}: (heads, kv heads, hidden, intermediate) = {got}, "
            f"config.json says {want}; fix MODELS in perf/derive_vidur.py"
        )


def _round(x: float) -> float:
    return float(f"{x:.4g}")


def derive_variant(
    rows: Sequence[Mapping[str, str]],
    arch: Arch,
    gpu: Gpu,
    tp: int,
    all_reduce_rows: Sequence[Mapping[str, str]] | None,
    origin: str,
) -> dict[str, Any] | None:
    """One profile variant, or None when the weights leave no room for one whole context."""
    kv = kv_capacity_tokens(arch, gpu, tp)
    if kv < arch.context_length:
        return None
    layer, emb = layer_curves(rows, tp)
    bandwidth, flops = roofline(rows, arch, tp)
    ar = all_reduce_curve(all_reduce_rows, tp) if tp > 1 and all_reduce_rows else None
    if tp > 1 and ar is None:
        return None
    m = StepModel(arch, tp, layer, emb, bandwidth, flops, ar)
    decode_points = [128, 256, 512] + [1024 * 2**k for k in range(12) if 1024 * 2**k < kv] + [kv]
    return {
        "gpu_type": gpu.gpu_type,
        "gpus": tp,
        "tensor_parallel": tp,
        "max_num_seqs": MAX_NUM_SEQS,
        "kv_capacity_tokens": kv,
        "derived": True,
        "source": (
            f"{origin} data/profiling/compute/{gpu.vidur_name}/{arch.vidur_path}/mlp.csv rows "
            f"num_tensor_parallel_workers={tp}"
            + (f", network/{gpu.network}/all_reduce.csv" if tp > 1 else "")
            + ": Σ operator medians × layers + 2 all-reduces/layer + attention roofline "
            f"(B={bandwidth / 1e9:.0f} GB/s, F={flops / 1e12:.0f} TFLOP/s from mlp_up_proj); "
            "perf/derive_vidur.py"
        ),
        "kv_capacity_source": (
            f"vLLM-style: ({tp} x {gpu.memory_bytes / 1e9:.0f} GB x 0.9 - params x 2 B) / "
            "kv bytes per token"
        ),
        "prefill": non_decreasing([(x, m.prefill(x)) for x in PREFILL_POINTS]),
        "decode": non_decreasing([(c, m.decode(c)) for c in decode_points]),
    }


def profile_doc(arch: Arch, variants: Sequence[dict[str, Any]]) -> dict[str, Any]:
    return {
        "model": arch.name,
        "context_length": arch.context_length,
        "context_length_source": arch.source.split(": ")[0]
        + " config.json max_position_embeddings",
        "architecture": {
            "params": arch.params,
            "layers": arch.layers,
            "attention_heads": arch.heads,
            "hidden_size": arch.hidden,
            "kv_heads": arch.kv_heads,
            "head_dim": arch.head_dim,
            "dtype_bytes": 2,
            "kv_bytes_per_token": arch.kv_bytes_per_token,
            "source": arch.source,
        },
        "variants": list(variants),
    }


class VidurData:
    """Reads Vidur's CSVs from a checkout directory or a bare git directory (at `rev`)."""

    def __init__(self, path: Path, rev: str = "HEAD") -> None:
        self.path = path
        self.bare = (path / "objects").is_dir() and (path / "HEAD").is_file()
        self.rev = rev

    def commit(self) -> str:
        if not self.bare:
            return "working tree"
        return subprocess.run(
            ["git", f"--git-dir={self.path}", "rev-parse", self.rev],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()

    def rows(self, rel: str) -> list[dict[str, str]] | None:
        if self.bare:
            out = subprocess.run(
                ["git", f"--git-dir={self.path}", "show", f"{self.rev}:{rel}"],
                capture_output=True,
                text=True,
            )
            if out.returncode != 0:
                return None
            text = out.stdout
        else:
            p = self.path / rel
            if not p.is_file():
                return None
            text = p.read_text()
        return list(csv.DictReader(io.StringIO(text)))


HEADER = (
    "# Performance profile of {model}: prefill seconds vs batched prompt tokens, decode\n"
    "# seconds per iteration vs batched context tokens (KV in use), KV-cache capacity in\n"
    "# tokens.\n"
    "# Derived from Vidur's operator profiles by `python -m sageserve.perf.derive_vidur`; see\n"
    "# README.md. Do not edit by hand: re-run the script.\n"
)


def derive_all(data: VidurData, out_dir: Path) -> list[Path]:
    commit = data.commit()
    origin = f"Vidur (github.com/microsoft/vidur, commit {commit[:7]}, MIT)"
    written = []
    for arch in MODELS:
        variants = []
        for gpu in GPUS:
            rows = data.rows(f"data/profiling/compute/{gpu.vidur_name}/{arch.vidur_path}/mlp.csv")
            if not rows:
                continue
            check_rows(rows, arch)
            net = (
                data.rows(f"data/profiling/network/{gpu.network}/all_reduce.csv")
                if gpu.network
                else None
            )
            for tp in (1, 2, 4, 8):
                v = derive_variant(rows, arch, gpu, tp, net, origin)
                if v is not None:
                    variants.append(v)
        if not variants:
            continue
        path = out_dir / f"{arch.name}.yaml"
        body = yaml.safe_dump(profile_doc(arch, variants), sort_keys=False, width=100)
        path.write_text(HEADER.format(model=arch.name) + body)
        written.append(path)
    return written


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("vidur", type=Path, help="Vidur checkout, or its bare git directory")
    ap.add_argument("--rev", default="HEAD", help="Commit to read from a git directory")
    ap.add_argument(
        "--out",
        type=Path,
        default=Path(__file__).parent / "profiles",
        help="Directory the profiles are written to",
    )
    args = ap.parse_args(argv)
    for p in derive_all(VidurData(args.vidur, args.rev), args.out):
        print(p)


if __name__ == "__main__":
    main()
