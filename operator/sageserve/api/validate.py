"""Offline validation of sageserve manifests, as the API server would judge them.

Two passes, mirroring the server: the schema (types, bounds, enums, patterns, required and
unknown fields) through the pydantic models, then the CRDs' own CEL rules evaluated with
cel-python on the defaulted object. Evaluating the generated rules themselves, rather than
a Python re-implementation, keeps `sageserve validate` and `kubectl apply` from drifting.
Every problem names the file, the object, the field path and the fix.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, TypeVar

import celpy
import yaml
from celpy.adapter import json_to_cel
from celpy.evaluation import CELEvalError
from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from sageserve.api.common import API_VERSION, GROUP
from sageserve.api.crd import schema_of
from sageserve.api.model_deployment import ModelDeployment
from sageserve.api.model_pool import ModelPool
from sageserve.api.scaling_policy import ScalingPolicy
from sageserve.api.workload_tier import WorkloadTier

MANIFEST_SUFFIXES = (".yaml", ".yml")
Manifest = ModelDeployment | ModelPool | WorkloadTier | ScalingPolicy
_MODELS: dict[str, type[Manifest]] = {
    "ModelDeployment": ModelDeployment,
    "ModelPool": ModelPool,
    "WorkloadTier": WorkloadTier,
    "ScalingPolicy": ScalingPolicy,
}
M = TypeVar("M", bound=BaseModel)


@dataclass(frozen=True)
class Problem:
    """One reason a manifest would be refused."""

    file: str
    obj: str
    field: str
    message: str
    fix: str = ""

    def __str__(self) -> str:
        where = (
            f"{self.file}: {self.obj}: {self.field}" if self.field else f"{self.file}: {self.obj}"
        )
        text = f"{where}: {self.message}"
        return f"{text} — fix: {self.fix}" if self.fix else text


@dataclass(frozen=True)
class Checked:
    """A sageserve object found in a file, parsed when its schema is valid."""

    file: str
    label: str
    parsed: Manifest | None


@dataclass(frozen=True)
class Report:
    """Outcome of validating a set of files.

    `warnings` are references to objects not among the files checked: the API server
    accepts them, but the operator will report the referring object as not Ready.
    """

    problems: list[Problem]
    warnings: list[Problem]
    checked: int
    skipped: int
    files: int

    @property
    def ok(self) -> bool:
        return not self.problems


def field_path(loc: Iterable[str | int]) -> str:
    """`("spec", "regions", 0, "maxInstances")` → `spec.regions[0].maxInstances`."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else part
    return out


def _fix_for(error: ErrorDetails) -> str:
    """A one-line fix for a pydantic error, in the words of the manifest's author."""
    kind = error["type"]
    ctx = error.get("ctx", {})
    fixes = {
        "missing": "add this field",
        "extra_forbidden": "remove it or correct its spelling "
        "(`kubectl explain` or the CRD in crds/ lists the fields)",
        "greater_than_equal": f"use a value ≥ {ctx.get('ge')}",
        "greater_than": f"use a value > {ctx.get('gt')}",
        "less_than_equal": f"use a value ≤ {ctx.get('le')}",
        "less_than": f"use a value < {ctx.get('lt')}",
        "enum": f"use one of {ctx.get('expected')}",
        "literal_error": f"use {ctx.get('expected')}",
        "string_pattern_mismatch": "use lowercase letters, digits and '-', starting and "
        "ending with a letter or digit"
        if "a-z0-9" in str(ctx.get("pattern", "")) and "A-Z" not in str(ctx.get("pattern", ""))
        else f"match the pattern {ctx.get('pattern')}",
        "string_too_long": f"shorten it to at most {ctx.get('max_length')} characters",
        "string_too_short": f"use at least {ctx.get('min_length')} characters",
        "too_short": f"give at least {ctx.get('min_length')} item(s)",
        "too_long": f"give at most {ctx.get('max_length')} item(s)",
        "int_parsing": "use a whole number",
        "int_type": "use a whole number",
        "int_from_float": "use a whole number",
        "float_parsing": "use a number",
        "float_type": "use a number",
        "bool_parsing": "use true or false",
        "bool_type": "use true or false",
        "string_type": "use a string (quote it)",
        "list_type": "use a list",
        "dict_type": "use a mapping",
        "model_type": "use a mapping",
        "model_attributes_type": "use a mapping",
    }
    return fixes.get(kind, "")


def parse_like_server(model: type[M], doc: dict[str, Any]) -> M:
    """Validate `doc` as the API server reads it: JSON types, no coercion of "1" to 1.

    Strict JSON-mode validation refuses a quoted number where a number belongs, as the
    server's schema does, while still accepting enum values and timestamps as strings.
    """
    return model.model_validate_json(json.dumps(doc, default=str), strict=True)


def schema_problems(
    file: str, obj: str, model: type[BaseModel], doc: dict[str, Any]
) -> list[Problem]:
    """Problems the schema (types, bounds, enums, patterns, fields) finds in `doc`."""
    try:
        parse_like_server(model, doc)
    except ValidationError as exc:
        return [
            Problem(file, obj, field_path(e["loc"]), e["msg"], _fix_for(e))
            for e in exc.errors(include_url=False)
        ]
    return []


@lru_cache(maxsize=256)
def cel_program(rule: str) -> Any:
    env = celpy.Environment()
    return env.program(env.compile(rule))


def walk_schema(
    schema: dict[str, Any], value: Any, path: str
) -> Iterator[tuple[str, dict[str, Any], Any]]:
    """(path, schema node, value) for every node of `value` that has a schema, depth first.

    Like the API server, rules of a schema node apply only where the object has a value.
    """
    yield path, schema, value
    if isinstance(value, dict):
        for name, sub in schema.get("properties", {}).items():
            if name in value:
                yield from walk_schema(sub, value[name], f"{path}.{name}" if path else name)
    elif isinstance(value, list) and "items" in schema:
        for i, item in enumerate(value):
            yield from walk_schema(schema["items"], item, f"{path}[{i}]")


def _duplicates(
    file: str, obj: str, path: str, schema: dict[str, Any], items: list[Any]
) -> list[Problem]:
    """Duplicate keys in a list the CRD declares as a map or a set."""
    list_type = schema.get("x-kubernetes-list-type")
    if list_type not in {"map", "set"}:
        return []
    keys = schema.get("x-kubernetes-list-map-keys", [])
    seen: set[str] = set()
    problems = []
    for i, item in enumerate(items):
        if list_type == "map" and isinstance(item, dict):
            key = ", ".join(f"{k}={item.get(k)}" for k in keys)
        else:
            key = repr(item)
        if key in seen:
            what = " and ".join(keys) if list_type == "map" else "value"
            problems.append(
                Problem(
                    file,
                    obj,
                    f"{path}[{i}]",
                    f"Duplicate value: {key}",
                    f"each {what} may appear only once in {path}; merge or remove the entries",
                )
            )
        seen.add(key)
    return problems


def structural_problems(file: str, obj: str, kind: str, defaulted: dict[str, Any]) -> list[Problem]:
    """Problems the CRD's list rules and CEL rules find in the defaulted object."""
    problems = []
    for path, schema, value in walk_schema(schema_of(kind), defaulted, ""):
        if isinstance(value, list):
            problems.extend(_duplicates(file, obj, path, schema, value))
        for rule in schema.get("x-kubernetes-validations", []):
            where = path or "(object)"
            try:
                ok = cel_program(rule["rule"]).evaluate({"self": json_to_cel(value)})
            except Exception as exc:  # a rule that cannot evaluate is refused by the server too
                problems.append(Problem(file, obj, where, f"rule {rule['rule']!r} failed: {exc}"))
                continue
            if isinstance(ok, CELEvalError) or not bool(ok):
                problems.append(Problem(file, obj, where, rule["message"]))
    return problems


def _object_label(doc: dict[str, Any], index: int) -> str:
    kind = doc.get("kind", "?")
    meta = doc.get("metadata")
    name = meta.get("name") if isinstance(meta, dict) else None
    return f"{kind}/{name}" if name else f"{kind} (document {index + 1})"


def validate_document(file: str, index: int, doc: Any) -> tuple[list[Problem], Checked | None]:
    """Problems of one YAML document, and the object if it is a sageserve one."""
    if doc is None:
        return [], None
    if not isinstance(doc, dict):
        return [Problem(file, f"document {index + 1}", "", "is not a mapping")], None
    api_version = str(doc.get("apiVersion", ""))
    if not api_version.startswith(f"{GROUP}/"):
        return [], None
    obj = _object_label(doc, index)
    unparsed = Checked(file, obj, None)
    if api_version != API_VERSION:
        fix = f"use {API_VERSION}"
        return [Problem(file, obj, "apiVersion", f"unknown version {api_version!r}", fix)], unparsed
    kind = doc.get("kind")
    model = _MODELS.get(str(kind))
    if model is None:
        fix = f"use one of {', '.join(sorted(_MODELS))}"
        return [Problem(file, obj, "kind", f"unknown kind {kind!r}", fix)], unparsed
    problems = schema_problems(file, obj, model, doc)
    if problems:
        return problems, unparsed
    parsed = parse_like_server(model, doc)
    defaulted = parsed.model_dump(by_alias=True, exclude_none=True, mode="json")
    return structural_problems(file, obj, str(kind), defaulted), Checked(file, obj, parsed)


def reference_warnings(objects: Iterable[Checked]) -> list[Problem]:
    """ModelDeployment references (policy, tiers) that no object among `objects` satisfies."""
    objects = list(objects)

    def names(kind: type[BaseModel]) -> set[tuple[str | None, str]]:
        return {
            (o.parsed.metadata.namespace, o.parsed.metadata.name)
            for o in objects
            if isinstance(o.parsed, kind)
        }

    policies, tiers = names(ScalingPolicy), names(WorkloadTier)
    warnings = []
    for o in objects:
        if not isinstance(o.parsed, ModelDeployment | ModelPool):
            continue
        ns, spec = o.parsed.metadata.namespace, o.parsed.spec
        if (ns, spec.policy_ref.name) not in policies:
            warnings.append(
                Problem(
                    o.file,
                    o.label,
                    "spec.policyRef.name",
                    f"ScalingPolicy {spec.policy_ref.name!r} is not among the files checked",
                    "make sure it exists in the same namespace",
                )
            )
        for i, tier in enumerate(spec.tiers):
            if (ns, tier) not in tiers:
                warnings.append(
                    Problem(
                        o.file,
                        o.label,
                        f"spec.tiers[{i}]",
                        f"WorkloadTier {tier!r} is not among the files checked",
                        "make sure it exists in the same namespace",
                    )
                )
    return warnings


def manifest_files(paths: Iterable[Path]) -> list[Path]:
    """YAML files named by `paths`; directories are searched recursively, in sorted order."""
    out: list[Path] = []
    for path in paths:
        if path.is_dir():
            out.extend(sorted(p for p in path.rglob("*") if p.suffix in MANIFEST_SUFFIXES))
        else:
            out.append(path)
    return out


def validate_file(path: Path) -> tuple[list[Problem], list[Checked], int]:
    """(problems, sageserve objects found, other documents skipped) of one file."""
    name = str(path)
    try:
        docs = list(yaml.safe_load_all(path.read_text(encoding="utf-8")))
    except OSError as exc:
        return [Problem(name, "file", "", f"cannot be read: {exc.strerror}")], [], 0
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "YAML"
        message = f"is not valid YAML: {getattr(exc, 'problem', exc)}"
        return [Problem(name, where, "", message)], [], 0
    problems: list[Problem] = []
    objects: list[Checked] = []
    skipped = 0
    for index, doc in enumerate(docs):
        found, ours = validate_document(name, index, doc)
        problems.extend(found)
        if ours is not None:
            objects.append(ours)
        elif doc is not None:
            skipped += 1
    return problems, objects, skipped


def validate_paths(paths: Iterable[Path]) -> Report:
    """Validate every manifest under `paths`, then the references between them."""
    files = manifest_files(paths)
    problems: list[Problem] = []
    objects: list[Checked] = []
    skipped = 0
    for path in files:
        found, ours, s = validate_file(path)
        problems.extend(found)
        objects.extend(ours)
        skipped += s
    return Report(
        problems=problems,
        warnings=reference_warnings(objects),
        checked=len(objects),
        skipped=skipped,
        files=len(files),
    )
