"""How long it takes an instance to switch to another model (Aegaeon §5, App. A.2).

Aegaeon's estimate of one switch after its optimisations (component reuse §5.1, explicit
memory management §5.2, fine-grained KV synchronisation §5.3) is weight loading alone:
Eq. 4, T_switch = model size / host-to-device bandwidth × β, with β = 0.625 profiled. Each
GPU of a tensor-parallel instance loads its own shard over its own link, so the size is the
per-GPU shard. Without those optimisations (request-level switching, ServerlessLLM-like) the
weights still cross the link, at the link's rate (β = 1).

A decoding batch's KV cache moves between host and GPU when its model is switched in
(§5.3: swap-out is decoupled and overlaps, swap-in precedes decoding) and when a request's
prompt KV goes from a prefill to a decode instance; both are bytes over the same link.

Origins of the numbers: model sizes and KV bytes per token from each profile's
``architecture`` (the model's config.json), link rates from the GPU datasheets; see
``perf/profiles/README.md``, "Model switching".
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

import yaml

#: Aegaeon App. A.2, Eq. 4: profiled factor on size / bandwidth for an optimised switch.
AEGAEON_BETA = 0.625

#: Host-to-device bandwidth per GPU in GB/s (10⁹ bytes), one direction of its PCIe x16 link:
#: H100 SXM5 PCIe 5.0 (datasheet: 128 GB/s both directions), A100 SXM4 PCIe 4.0 (64 GB/s both
#: directions). Aegaeon §4.1 uses 32 GB/s for PCIe 4.0 in the same way.
HOST_TO_DEVICE_GB_PER_S: dict[str, float] = {
    "NVIDIA-H100-80GB-HBM3": 64.0,
    "NVIDIA-A100-SXM4-80GB": 32.0,
}


@dataclass(frozen=True)
class ModelSize:
    """A model's weight bytes and KV bytes per token (from its profile's architecture)."""

    model: str
    weight_bytes: float
    kv_bytes_per_token: float


@cache
def model_size(model: str) -> ModelSize:
    """The bundled profile's architecture of ``model`` (params × dtype bytes, KV bytes)."""
    pkg = resources.files("sageserve.perf") / "profiles" / f"{model}.yaml"
    try:
        doc: dict[str, Any] = yaml.safe_load(pkg.read_text())
    except FileNotFoundError:
        raise KeyError(f"no bundled perf profile for model {model}") from None
    arch = doc.get("architecture") or {}
    try:
        params = float(arch["params"])
        dtype = float(arch.get("dtype_bytes", 2))
        kv = float(arch["kv_bytes_per_token"])
    except KeyError as e:
        raise KeyError(f"perf profile {model}: architecture.{e.args[0]} is missing") from None
    return ModelSize(model, params * dtype, kv)


def link_gb_per_s(gpu_type: str) -> float:
    try:
        return HOST_TO_DEVICE_GB_PER_S[gpu_type]
    except KeyError:
        raise KeyError(
            f"gpu_type: no host-to-device bandwidth known for {gpu_type}; have "
            f"{sorted(HOST_TO_DEVICE_GB_PER_S)}"
        ) from None


def switch_seconds(
    weight_bytes: float, gpus: int, gb_per_s: float, beta: float = AEGAEON_BETA
) -> float:
    """Aegaeon Eq. 4: the per-GPU shard over one link, times β."""
    if weight_bytes < 0:
        raise ValueError(f"weight_bytes: must be >= 0, got {weight_bytes}")
    if gpus < 1:
        raise ValueError(f"gpus: must be >= 1, got {gpus}")
    if not gb_per_s > 0:
        raise ValueError(f"gb_per_s: must be > 0, got {gb_per_s}")
    return weight_bytes / gpus / (gb_per_s * 1e9) * beta


def kv_transfer_seconds(
    tokens: float, kv_bytes_per_token: float, gpus: int, gb_per_s: float
) -> float:
    """Moving ``tokens`` of KV cache between host and an instance of ``gpus`` GPUs."""
    return tokens * kv_bytes_per_token / gpus / (gb_per_s * 1e9)


def sleep_mode_switch_seconds(profile: str, gpu_type: str, gpus: int) -> float:
    """One vLLM level-1 sleep or wake of a pooled engine: the model's weights over each
    GPU's host link at the link's rate (β = 1, no Aegaeon component reuse); what the twin's
    sleep mode takes and what the simulators charge a switch of the router's rule."""
    return switch_seconds(
        model_size(profile).weight_bytes, max(1, gpus), link_gb_per_s(gpu_type), beta=1.0
    )
