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


@dataclass
class PerfCatalog:
    """All variants by (model, gpu type, gpus)."""

    variants: dict[tuple[str, str, int], VariantPerf] = field(default_factory=dict)

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

    def context_length(self, model: str) -> int:
        """The model's context length from its profile (0 when no profile names one)."""
        return max(
            (v.context_length for (m, _, _), v in self.variants.items() if m == model), default=0
        )

    def models(self) -> list[str]:
        return sorted({m for m, _, _ in self.variants})

    def add(self, v: VariantPerf) -> None:
        self.variants[(v.model, v.gpu_type, v.gpus)] = v


def _variant(model: str, raw: Mapping[str, Any], context_length: int = 0) -> VariantPerf:
    return VariantPerf(
        model=model,
        gpu_type=str(raw["gpu_type"]),
        gpus=int(raw["gpus"]),
        tensor_parallel=int(raw.get("tensor_parallel", raw["gpus"])),
        kv_capacity_tokens=int(raw["kv_capacity_tokens"]),
        max_num_seqs=int(raw.get("max_num_seqs", 256)),
        prefill_curve=PiecewiseLinear.from_points(raw["prefill"]),
        decode_curve=PiecewiseLinear.from_points(raw["decode"]),
        source=str(raw.get("source", "")),
        derived=bool(raw.get("derived", False)),
        context_length=context_length,
    )


def parse_profile(doc: Mapping[str, Any]) -> list[VariantPerf]:
    """Variants of one profile document (the YAML format of `perf/profiles/*.yaml`)."""
    model = str(doc["model"])
    context = int(doc.get("context_length", 0) or 0)
    return [_variant(model, v, context) for v in doc.get("variants", [])]


def load_catalog(extra_dirs: Sequence[Path] = ()) -> PerfCatalog:
    """The bundled profiles, then any `*.yaml` in `extra_dirs` (later files win)."""
    cat = PerfCatalog()
    pkg = resources.files("sageserve.perf") / "profiles"
    for entry in sorted(pkg.iterdir(), key=lambda e: e.name):
        if entry.name.endswith(".yaml"):
            for v in parse_profile(yaml.safe_load(entry.read_text())):
                cat.add(v)
    for d in extra_dirs:
        for p in sorted(Path(d).glob("*.yaml")):
            for v in parse_profile(yaml.safe_load(p.read_text())):
                cat.add(v)
    return cat
