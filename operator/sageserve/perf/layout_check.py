"""The layout rules of `perf/model.check_layout` applied to a ModelDeployment's variants.

Why one function for the operator and the simulator: a variant whose tensor-parallel size
does not divide the model's attention heads, or whose TP group is larger than a node, makes
vLLM refuse to start (or never schedules), and the schema cannot see either (the heads are
in the model's config.json, the node sizes in the cluster). The operator reports it as
`Ready=False` (`controller/semantics.py`), the simulator refuses the scenario at load
(`sim/scenario.py`), both with the same message: the field, the value and the fix. These
are the Kubernetes filters of the layout search (OServe §4.3 has none; digest A4).

Which model: the perf profile named by the `sageserve.io/perf-profile` annotation, else
the one named like the ModelDeployment (the simulator's and the twin's convention), else
the one named like the last part of `spec.model.name` in lower case with dots as dashes
(`meta-llama/Llama-3.1-8B` → `llama-3-1-8b`; a trailing `-hf` dropped). With no profile,
the head count is unknown and only the node rule applies.
"""

from __future__ import annotations

from collections.abc import Mapping

from sageserve.api.model_deployment import ModelDeployment, Variant
from sageserve.perf.model import (
    DEFAULT_NODE_GPUS,
    LayoutError,
    ModelArchitecture,
    PerfCatalog,
    check_layout,
    check_tensor_group,
)

#: ModelDeployment annotation naming the perf profile (the simulator's convention).
PERF_PROFILE_ANNOTATION = "sageserve.io/perf-profile"


def profile_names(md: ModelDeployment) -> list[str]:
    """Perf profile names that may describe `md`'s model, in the order they are tried."""
    names = []
    annotated = md.metadata.annotations.get(PERF_PROFILE_ANNOTATION)
    if annotated:
        names.append(annotated)
    names.append(md.metadata.name)
    base = md.spec.model.name.rstrip("/").rsplit("/", 1)[-1].lower().replace(".", "-")
    names.append(base)
    if base.endswith("-hf"):
        names.append(base[: -len("-hf")])
    return list(dict.fromkeys(names))


def model_architecture(catalog: PerfCatalog, md: ModelDeployment) -> ModelArchitecture | None:
    """The architecture (heads, layers) of `md`'s model from its perf profile, if any."""
    for name in profile_names(md):
        arch = catalog.architectures.get(name)
        if arch is not None:
            return arch
    return None


def variant_parallelism(v: Variant) -> tuple[int, int]:
    """(TP, PP) the pod set renders for `v` (`controller/podset.server_args`)."""
    return v.tensor_parallel or v.gpus_per_instance // v.pipeline_parallel, v.pipeline_parallel


def variant_layout_problems(
    md: ModelDeployment, catalog: PerfCatalog, node_gpus: Mapping[str, int]
) -> list[tuple[str, str]]:
    """(variant name, message) for every variant of `md` vLLM or the nodes cannot run.

    `node_gpus[gpu_type]`: GPUs of the largest node of that type; a type without nodes is
    not checked against a node size (no node offers it at all, which is reported apart)."""
    arch = model_architecture(catalog, md)
    out: list[tuple[str, str]] = []
    for v in md.spec.variants:
        tp, pp = variant_parallelism(v)
        node = node_gpus.get(v.gpu_type) or max(DEFAULT_NODE_GPUS, tp)
        try:
            if arch is not None:
                check_layout(arch, tp, pp, node)
            else:
                check_tensor_group(md.spec.model.name, tp, node)
        except LayoutError as exc:
            out.append((v.name, str(exc).replace("spec.variants[]", f"spec.variants[{v.name}]")))
    return out
