"""Piecewise-linear performance model per (model, GPU type, GPUs per instance).

Why piecewise-linear on batched tokens: it is the model the SageServe/Splitwise simulators
validated against real instances (R² 0.99 prefill, 0.83 decode; SageServe §7.1, Fig. 9), and
it needs nothing but the published profile points. Beyond the last point we extrapolate with
the last segment's slope, as `scipy.interpolate.interp1d(fill_value="extrapolate")` does in the
SageServe repository; below the first point we hold the first value (a floor: an iteration
never gets cheaper than the smallest one measured).
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from importlib import resources
from pathlib import Path
from typing import Any

import yaml


@dataclass(frozen=True)
class PiecewiseLinear:
    """y(x) through sorted points; clamps below, extrapolates the last slope above."""

    xs: tuple[float, ...]
    ys: tuple[float, ...]

    def __post_init__(self) -> None:
        if len(self.xs) != len(self.ys) or not self.xs:
            raise ValueError("need at least one (x, y) point and equal lengths")
        if any(b <= a for a, b in zip(self.xs, self.xs[1:], strict=False)):
            raise ValueError("x values must be strictly increasing")

    @classmethod
    def from_points(cls, points: Iterable[Sequence[float]]) -> PiecewiseLinear:
        pts = sorted((float(p[0]), float(p[1])) for p in points)
        return cls(tuple(p[0] for p in pts), tuple(p[1] for p in pts))

    def __call__(self, x: float) -> float:
        xs, ys = self.xs, self.ys
        if x <= xs[0] or len(xs) == 1:
            return ys[0]
        i = bisect_right(xs, x)
        if i >= len(xs):
            i = len(xs) - 1
        x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
        return y0 + (y1 - y0) * (x - x0) / (x1 - x0)


@dataclass(frozen=True)
class VariantPerf:
    """One deployable variant: a model on `gpus` GPUs of `gpu_type`.

    prefill(tokens): seconds for one prefill step over `tokens` batched prompt tokens.
    decode(context_tokens): seconds for one decode iteration when the running batch holds
    `context_tokens` tokens of KV (the repository's "batch tokens" axis).
    """

    model: str
    gpu_type: str
    gpus: int
    tensor_parallel: int
    kv_capacity_tokens: int
    max_num_seqs: int
    prefill_curve: PiecewiseLinear
    decode_curve: PiecewiseLinear
    source: str = ""
    derived: bool = False
    #: Longest prompt + output one request may ask for (vLLM's `max_model_len`), from the
    #: model's config.json (the profile's `context_length`); 0 when the profile names none.
    context_length: int = 0
    #: Pipeline stages; `gpus` = tensor_parallel × pipeline_parallel. Measured profiles are
    #: PP = 1; PP > 1 layouts are derived from them (`perf/pipeline.py`, OServe App. D).
    pipeline_parallel: int = 1

    #: token step of the decode lookup table (its error is ≤ one step's worth of slope)
    LUT_STEP = 128

    @cached_property
    def decode_lut(self) -> list[float]:
        """decode(k × LUT_STEP) for k up to the KV capacity: the simulator's O(1) lookup.

        Why: the decode time is needed at every instance event; a list index is ~10x cheaper
        than a bisect in Python. Values are the curve's own at each grid point.
        """
        n = self.kv_capacity_tokens // self.LUT_STEP + 2
        return [self.decode_curve(k * self.LUT_STEP) for k in range(n)]

    def prefill(self, tokens: float) -> float:
        return self.prefill_curve(tokens)

    def decode(self, context_tokens: float) -> float:
        return self.decode_curve(context_tokens)

    def prefill_tokens_per_s(self, tokens: float) -> float:
        """Prompt throughput of one prefill step of `tokens` tokens."""
        return tokens / self.prefill(tokens)

    def decode_tokens_per_s(self, batch: int, context_per_seq: float) -> float:
        """Output tokens/s with `batch` sequences of `context_per_seq` tokens each."""
        return batch / self.decode(batch * context_per_seq)


#: GPUs per node when the inventory does not say: the 8-GPU HGX/DGX nodes of SageServe's and
#: OServe's testbeds (OServe §6.1: 4 servers × 8 H100) and of the bundled node inventories.
DEFAULT_NODE_GPUS = 8


class LayoutError(ValueError):
    """A (tensor, pipeline) layout the model or the nodes cannot run; the message names the
    ModelDeployment field (`spec.variants[].tensorParallel` / `pipelineParallel`) and the fix."""


@dataclass(frozen=True)
class ModelArchitecture:
    """What the layout rules and the pipeline derivation need from a model's config.json
    (the profile's `architecture`)."""

    model: str
    params: float
    layers: int
    attention_heads: int
    hidden_size: int
    kv_bytes_per_token: float
    dtype_bytes: float = 2.0

    @property
    def weight_bytes(self) -> float:
        return self.params * self.dtype_bytes

    def tensor_parallel_sizes(self, node_gpus: int = DEFAULT_NODE_GPUS) -> list[int]:
        """TP sizes vLLM accepts for this model inside one node of `node_gpus` GPUs."""
        return [t for t in range(1, node_gpus + 1) if self.attention_heads % t == 0]


def _architecture(model: str, raw: Mapping[str, Any] | None) -> ModelArchitecture | None:
    if not raw:
        return None
    try:
        return ModelArchitecture(
            model=model,
            params=float(raw["params"]),
            layers=int(raw["layers"]),
            attention_heads=int(raw["attention_heads"]),
            hidden_size=int(raw["hidden_size"]),
            kv_bytes_per_token=float(raw["kv_bytes_per_token"]),
            dtype_bytes=float(raw.get("dtype_bytes", 2)),
        )
    except KeyError as e:
        raise KeyError(f"perf profile {model}: architecture.{e.args[0]} is missing") from None


def check_layout(
    arch: ModelArchitecture,
    tensor_parallel: int,
    pipeline_parallel: int = 1,
    node_gpus: int = DEFAULT_NODE_GPUS,
) -> None:
    """Refuse a layout vLLM or the nodes cannot run (OServe §4.3 has no such filters; they are
    the Kubernetes additions of the layout search).

    - TP must divide the attention-head count: vLLM shards the heads evenly over the TP group
      and refuses to start otherwise (`total_num_attention_heads % tensor_parallel_size`).
    - A TP group must stay inside one node: it all-reduces twice per layer, which only NVLink
      makes affordable; pipeline stages exchange one activation per micro-batch and may cross
      nodes.
    - PP cannot exceed the layer count: every stage needs at least one layer.
    """
    where = f"{arch.model}"
    if tensor_parallel < 1 or pipeline_parallel < 1:
        raise LayoutError(
            f"spec.variants[].tensorParallel and pipelineParallel must be >= 1 for {where}, "
            f"got {tensor_parallel} and {pipeline_parallel}"
        )
    if arch.attention_heads % tensor_parallel:
        ok = arch.tensor_parallel_sizes(node_gpus)
        raise LayoutError(
            f"spec.variants[].tensorParallel={tensor_parallel} does not divide the "
            f"{arch.attention_heads} attention heads of {where}: vLLM splits heads evenly over "
            f"the tensor-parallel group; use one of {ok} and put the other GPUs in "
            "pipelineParallel"
        )
    check_tensor_group(arch.model, tensor_parallel, node_gpus)
    if pipeline_parallel > arch.layers:
        raise LayoutError(
            f"spec.variants[].pipelineParallel={pipeline_parallel} exceeds the {arch.layers} "
            f"layers of {where}: every stage needs a layer; use pipelineParallel <= "
            f"{arch.layers}"
        )


def check_tensor_group(model: str, tensor_parallel: int, node_gpus: int) -> None:
    """Refuse a tensor-parallel group larger than one node: it all-reduces twice per layer,
    which only NVLink makes affordable (`check_layout`'s node rule; it needs no profile)."""
    if tensor_parallel > node_gpus:
        raise LayoutError(
            f"spec.variants[].tensorParallel={tensor_parallel} exceeds the {node_gpus} GPUs of "
            f"one node for {model}: a tensor-parallel group all-reduces every layer and must "
            f"stay on one node's NVLink; use tensorParallel <= {node_gpus} and raise "
            "pipelineParallel (stages may cross nodes)"
        )


@dataclass
class PerfCatalog:
    """All variants by (model, gpu type, gpus), and layouts by (model, gpu type, TP, PP).

    `variants` keeps the pure tensor-parallel profiles keyed by GPU count (TP = GPUs, PP = 1),
    as every lookup before OServe used them; `layouts_by_key` holds every profile the files
    give, by (model, gpu type, TP, PP); `layout()` adds pipeline layouts derived from the TP
    profile of the same TP size (`perf/pipeline.py`, OServe App. D), cached per node size
    (whether a stage hop crosses nodes depends on it).
    """

    variants: dict[tuple[str, str, int], VariantPerf] = field(default_factory=dict)
    architectures: dict[str, ModelArchitecture] = field(default_factory=dict)
    #: every layout by (model, gpu type, TP, PP): measured ones at load, derived ones on use
    layouts_by_key: dict[tuple[str, str, int, int], VariantPerf] = field(default_factory=dict)
    #: derived pipeline layouts by (model, gpu type, TP, PP, GPUs per node)
    _derived: dict[tuple[str, str, int, int, int], VariantPerf] = field(
        default_factory=dict, repr=False
    )

    def get(self, model: str, gpu_type: str, gpus: int | None = None) -> VariantPerf:
        """The variant for (model, gpu_type, gpus); with gpus=None, the largest one."""
        if gpus is not None:
            try:
                return self.variants[(model, gpu_type, gpus)]
            except KeyError:
                raise KeyError(
                    f"no perf profile for {model} on {gpus}x {gpu_type}; have "
                    f"{sorted(self.variants)}"
                ) from None
        found = [v for (m, g, _), v in self.variants.items() if m == model and g == gpu_type]
        if not found:
            raise KeyError(f"no perf profile for {model} on {gpu_type}")
        return max(found, key=lambda v: v.gpus)

    def architecture(self, model: str) -> ModelArchitecture:
        try:
            return self.architectures[model]
        except KeyError:
            raise KeyError(
                f"perf profile {model}: no architecture (attention_heads, hidden_size, layers); "
                "add it from the model's config.json"
            ) from None

    def layout(
        self,
        model: str,
        gpu_type: str,
        tensor_parallel: int,
        pipeline_parallel: int = 1,
        node_gpus: int = DEFAULT_NODE_GPUS,
    ) -> VariantPerf:
        """The profile of `model` on `gpu_type` with TP × PP GPUs, checked by `check_layout`.

        A measured (TP, PP) profile wins; otherwise PP > 1 is derived from the measured TP
        profile (marked `derived`). TP sizes without a measured profile are refused: scaling
        a TP profile to another TP size is not what OServe App. D derives."""
        from sageserve.perf.pipeline import derive_pipeline

        arch = self.architectures.get(model)
        if arch is not None:
            check_layout(arch, tensor_parallel, pipeline_parallel, node_gpus)
        found = self.layouts_by_key.get((model, gpu_type, tensor_parallel, pipeline_parallel))
        if found is not None:
            return found
        base = self.layouts_by_key.get((model, gpu_type, tensor_parallel, 1))
        if base is None:
            have = sorted(
                t for (m, g, t, p) in self.layouts_by_key if (m, g, p) == (model, gpu_type, 1)
            )
            raise KeyError(
                f"no tensor-parallel profile for {model} on {tensor_parallel}x {gpu_type} to "
                f"derive PP={pipeline_parallel} from; measured TP sizes: {have}"
            )
        key = (model, gpu_type, tensor_parallel, pipeline_parallel, node_gpus)
        derived = self._derived.get(key)
        if derived is None:
            arch = self.architecture(model)
            derived = derive_pipeline(base, pipeline_parallel, arch, node_gpus)
            self._derived[key] = derived
        return derived

    def layouts(
        self, model: str, gpu_type: str, max_gpus: int, node_gpus: int = DEFAULT_NODE_GPUS
    ) -> list[VariantPerf]:
        """Every layout of at most `max_gpus` GPUs that passes `check_layout` and holds one
        whole context in its KV cache (vLLM refuses to start otherwise), by (GPUs, TP)."""
        arch = self.architecture(model)
        tps = sorted(
            {t for (m, g, t, p) in self.layouts_by_key if (m, g, p) == (model, gpu_type, 1)}
        )
        out: list[VariantPerf] = []
        for tp in tps:
            for pp in range(1, max_gpus // tp + 1):
                try:
                    check_layout(arch, tp, pp, node_gpus)
                except LayoutError:
                    continue
                v = self.layout(model, gpu_type, tp, pp, node_gpus)
                if v.kv_capacity_tokens >= max(1, v.context_length):
                    out.append(v)
        return sorted(out, key=lambda v: (v.gpus, v.tensor_parallel))

    def context_length(self, model: str) -> int:
        """The model's context length from its profile (0 when no profile names one)."""
        return max(
            (v.context_length for (m, _, _), v in self.variants.items() if m == model), default=0
        )

    def models(self) -> list[str]:
        return sorted({m for m, _, _ in self.variants})

    def add(self, v: VariantPerf) -> None:
        if v.tensor_parallel * v.pipeline_parallel != v.gpus:
            raise ValueError(
                f"perf profile {v.model} on {v.gpu_type}: gpus={v.gpus} must equal "
                f"tensor_parallel × pipeline_parallel = {v.tensor_parallel} × "
                f"{v.pipeline_parallel}; fix the profile's gpus or its parallelism"
            )
        arch = self.architectures.get(v.model)
        if arch is not None:
            check_layout(arch, v.tensor_parallel, v.pipeline_parallel, max(v.tensor_parallel, 1))
        self.layouts_by_key[(v.model, v.gpu_type, v.tensor_parallel, v.pipeline_parallel)] = v
        if v.pipeline_parallel == 1:
            self.variants[(v.model, v.gpu_type, v.gpus)] = v

    def add_profile(self, doc: Mapping[str, Any]) -> None:
        """One profile document: its architecture first (so its variants are checked)."""
        model = str(doc["model"])
        arch = _architecture(model, doc.get("architecture"))
        if arch is not None:
            self.architectures[model] = arch
        for v in parse_profile(doc):
            self.add(v)


def _variant(model: str, raw: Mapping[str, Any], context_length: int = 0) -> VariantPerf:
    pp = int(raw.get("pipeline_parallel", 1))
    return VariantPerf(
        model=model,
        gpu_type=str(raw["gpu_type"]),
        gpus=int(raw["gpus"]),
        tensor_parallel=int(raw.get("tensor_parallel", int(raw["gpus"]) // max(pp, 1))),
        kv_capacity_tokens=int(raw["kv_capacity_tokens"]),
        max_num_seqs=int(raw.get("max_num_seqs", 256)),
        prefill_curve=PiecewiseLinear.from_points(raw["prefill"]),
        decode_curve=PiecewiseLinear.from_points(raw["decode"]),
        source=str(raw.get("source", "")),
        derived=bool(raw.get("derived", False)),
        context_length=context_length,
        pipeline_parallel=pp,
    )


def parse_profile(doc: Mapping[str, Any]) -> list[VariantPerf]:
    """Variants of one profile document (the YAML format of `perf/profiles/*.yaml`)."""
    model = str(doc["model"])
    context = int(doc.get("context_length", 0) or 0)
    return [_variant(model, v, context) for v in doc.get("variants", [])]


def request_decode_tps(variants: Iterable[VariantPerf]) -> float:
    """Tokens/s one request decodes at on a full instance (one token per decode iteration
    with the KV cache full), the slowest of `variants`; 0 with none. The batch Queue
    Manager's estimate of a request's service time (tokens ÷ this), which its promotion by
    slack keeps ahead of the deadline (SageServe §6.2, §6.3), in the simulator and the
    router alike. Conservative: prompt tokens prefill far faster."""
    rates = [1.0 / step for perf in variants if (step := perf.decode(perf.kv_capacity_tokens)) > 0]
    return min(rates, default=0.0)


def load_catalog(extra_dirs: Sequence[Path] = ()) -> PerfCatalog:
    """The bundled profiles, then any `*.yaml` in `extra_dirs` (later files win)."""
    cat = PerfCatalog()
    pkg = resources.files("sageserve.perf") / "profiles"
    for entry in sorted(pkg.iterdir(), key=lambda e: e.name):
        if entry.name.endswith(".yaml"):
            cat.add_profile(yaml.safe_load(entry.read_text()))
    for d in extra_dirs:
        for p in sorted(Path(d).glob("*.yaml")):
            cat.add_profile(yaml.safe_load(p.read_text()))
    return cat
