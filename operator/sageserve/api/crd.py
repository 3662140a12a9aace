"""Generate the CustomResourceDefinitions from the pydantic models.

Pydantic emits JSON Schema (draft 2020-12 with `$ref`s); Kubernetes wants a *structural*
OpenAPI v3 schema: everything inlined, no `anyOf` for optionals, boolean
`exclusiveMinimum`, object defaults so nested defaults apply. The translation is pure and
deterministic, so `crds/` can be checked to regenerate byte for byte.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel

from sageserve.api.common import CATEGORY, GROUP, VERSION
from sageserve.api.model_deployment import ModelDeployment
from sageserve.api.model_pool import ModelPool
from sageserve.api.scaling_policy import ScalingPolicy
from sageserve.api.workload_tier import WorkloadTier

_DROP_KEYS = {"title"}


@dataclass(frozen=True)
class Kind:
    """What the CRD needs beyond the schema: names, printer columns."""

    model: type[BaseModel]
    kind: str
    plural: str
    singular: str
    short_names: tuple[str, ...]
    columns: tuple[dict[str, Any], ...]

    @property
    def crd_name(self) -> str:
        return f"{self.plural}.{GROUP}"

    @property
    def file_name(self) -> str:
        return f"{GROUP}_{self.plural}.yaml"


def _ready_column() -> dict[str, Any]:
    return {
        "name": "Ready",
        "type": "string",
        "jsonPath": '.status.conditions[?(@.type=="Ready")].status',
    }


_AGE = {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}

KINDS: tuple[Kind, ...] = (
    Kind(
        model=ModelDeployment,
        kind="ModelDeployment",
        plural="modeldeployments",
        singular="modeldeployment",
        short_names=("mdep",),
        columns=(
            {"name": "Model", "type": "string", "jsonPath": ".spec.model.name"},
            {"name": "Policy", "type": "string", "jsonPath": ".spec.policyRef.name"},
            {"name": "Instances", "type": "integer", "jsonPath": ".status.instances"},
            {"name": "Target", "type": "integer", "jsonPath": ".status.targetInstances"},
            _ready_column(),
            _AGE,
        ),
    ),
    Kind(
        model=ModelPool,
        kind="ModelPool",
        plural="modelpools",
        singular="modelpool",
        short_names=("mpool",),
        columns=(
            {"name": "Awake", "type": "integer", "jsonPath": ".spec.awakePerInstance"},
            {"name": "Policy", "type": "string", "jsonPath": ".spec.policyRef.name"},
            {"name": "Instances", "type": "integer", "jsonPath": ".status.instances"},
            {"name": "Target", "type": "integer", "jsonPath": ".status.targetInstances"},
            _ready_column(),
            _AGE,
        ),
    ),
    Kind(
        model=WorkloadTier,
        kind="WorkloadTier",
        plural="workloadtiers",
        singular="workloadtier",
        short_names=("wtier",),
        columns=(
            {"name": "Type", "type": "string", "jsonPath": ".spec.type"},
            {"name": "Priority", "type": "integer", "jsonPath": ".spec.priority"},
            {"name": "TTFT-P95", "type": "number", "jsonPath": ".spec.slo.ttftP95Seconds"},
            {"name": "Deadline", "type": "integer", "jsonPath": ".spec.batch.deadlineSeconds"},
            _AGE,
        ),
    ),
    Kind(
        model=ScalingPolicy,
        kind="ScalingPolicy",
        plural="scalingpolicies",
        singular="scalingpolicy",
        short_names=("spol",),
        columns=(
            {"name": "Strategy", "type": "string", "jsonPath": ".spec.strategy"},
            {"name": "DryRun", "type": "boolean", "jsonPath": ".spec.dryRun"},
            {"name": "Solver", "type": "string", "jsonPath": ".status.plan.solverStatus"},
            {"name": "Planned", "type": "date", "jsonPath": ".status.plan.computedAt"},
            _ready_column(),
            _AGE,
        ),
    ),
)


def _is_null(schema: dict[str, Any]) -> bool:
    return schema.get("type") == "null"


def _structural(node: Any, defs: dict[str, Any]) -> Any:
    """Translate one pydantic JSON Schema node into a structural OpenAPI v3 node."""
    if isinstance(node, list):
        return [_structural(n, defs) for n in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        target = defs[node["$ref"].rsplit("/", 1)[-1]]
        merged = {**target, **{k: v for k, v in node.items() if k != "$ref"}}
        return _structural(merged, defs)
    if "anyOf" in node:
        return _structural(_optional(node), defs)
    return _ordered(_structural_keys(node, defs))


def _optional(node: dict[str, Any]) -> dict[str, Any]:
    """`X | None` (an optional field): keep X, the field is simply not required."""
    options = [o for o in node["anyOf"] if not _is_null(o)]
    if len(options) != 1:
        raise ValueError(f"unions other than `X | None` have no structural form: {node}")
    rest = {k: v for k, v in node.items() if k not in {"anyOf", "default"}}
    if node.get("default") is not None:
        rest["default"] = node["default"]
    return {**options[0], **rest}


def _structural_keys(node: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    """The keys of a node without `$ref` or `anyOf`, each in its structural form."""
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in _DROP_KEYS or key == "$defs":
            continue
        if key == "properties":
            out[key] = {name: _structural(sub, defs) for name, sub in value.items()}
        elif key in {"exclusiveMinimum", "exclusiveMaximum"}:
            bound = "minimum" if key == "exclusiveMinimum" else "maximum"
            out[bound] = value
            out[key] = True
        elif key in {"items", "additionalProperties"}:
            out[key] = _structural(value, defs)
        elif key == "x-kubernetes-validations":
            out[key] = [{"rule": v["rule"], "message": v["message"]} for v in value]
        elif key == "default" and value is None:
            continue
        else:
            out[key] = value
    if "enum" in out and "type" not in out:
        out["type"] = "string"
    if "properties" in out:
        # `extra="forbid"` becomes `additionalProperties: false`, which structural schemas
        # refuse; the API server prunes or (with strict field validation) refuses unknown
        # fields on its own.
        out.pop("additionalProperties", None)
    return out


_KEY_ORDER = (
    "description",
    "type",
    "format",
    "enum",
    "default",
    "minimum",
    "exclusiveMinimum",
    "maximum",
    "exclusiveMaximum",
    "minLength",
    "maxLength",
    "pattern",
    "minItems",
    "maxItems",
    "items",
    "required",
    "properties",
    "additionalProperties",
    "x-kubernetes-list-type",
    "x-kubernetes-list-map-keys",
    "x-kubernetes-validations",
)


def _ordered(node: dict[str, Any]) -> dict[str, Any]:
    """Fixed key order, so the YAML reads the same way in every schema node."""
    known = [k for k in _KEY_ORDER if k in node]
    other = sorted(k for k in node if k not in _KEY_ORDER)
    return {k: node[k] for k in known + other}


def openapi_schema(model: type[BaseModel]) -> dict[str, Any]:
    """The structural `openAPIV3Schema` of a CRD model."""
    raw = model.model_json_schema(by_alias=True, mode="validation")
    defs = raw.get("$defs", {})
    schema = _structural(raw, defs)
    props = schema["properties"]
    # The API server owns metadata's schema; apiVersion and kind are free-form strings there.
    props["apiVersion"] = {"type": "string"}
    props["kind"] = {"type": "string"}
    props["metadata"] = {"type": "object"}
    schema["required"] = [r for r in schema.get("required", []) if r == "spec"]
    if not schema["required"]:
        schema.pop("required")
    return _ordered(schema)


def crd(kind: Kind) -> dict[str, Any]:
    """The full CustomResourceDefinition object for one kind."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": kind.crd_name,
            "labels": {"app.kubernetes.io/part-of": "sageserve"},
        },
        "spec": {
            "group": GROUP,
            "names": {
                "kind": kind.kind,
                "listKind": f"{kind.kind}List",
                "plural": kind.plural,
                "singular": kind.singular,
                "shortNames": list(kind.short_names),
                "categories": [CATEGORY],
            },
            "scope": "Namespaced",
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": openapi_schema(kind.model)},
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": list(kind.columns),
                }
            ],
        },
    }


class _Dumper(yaml.SafeDumper):
    """Block-style YAML with long strings kept on one line (stable diffs)."""


def _str_presenter(dumper: yaml.SafeDumper, data: str) -> yaml.ScalarNode:
    return dumper.represent_scalar("tag:yaml.org,2002:str", data)


_Dumper.add_representer(str, _str_presenter)

HEADER = (
    "# Generated by `sageserve crds --output-dir crds/` from operator/sageserve/api. Do not edit.\n"
)


def render(kind: Kind) -> str:
    """The CRD of `kind` as the YAML text written to `crds/`."""
    body = yaml.dump(
        crd(kind), Dumper=_Dumper, sort_keys=False, width=1_000_000, allow_unicode=True
    )
    return HEADER + body


def render_all() -> dict[str, str]:
    """File name → YAML text, for every CRD."""
    return {kind.file_name: render(kind) for kind in KINDS}


def write_all(directory: Path) -> list[Path]:
    """Write every CRD into `directory`; returns the paths written."""
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for name, text in render_all().items():
        path = directory / name
        path.write_text(text, encoding="utf-8")
        written.append(path)
    return written


def schema_of(kind_name: str) -> dict[str, Any]:
    """The openAPIV3Schema of the CRD for `kind_name` (used by offline validation)."""
    for kind in KINDS:
        if kind.kind == kind_name:
            return openapi_schema(kind.model)
    raise KeyError(kind_name)
