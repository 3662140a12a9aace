"""Building blocks shared by the three CRDs: base model, metadata, conditions, CEL rules.

The pydantic models are the single source of truth: the CRD YAML in `crds/` is generated
from them (`sageserve crds`), and `sageserve validate` checks manifests against them
offline, including the very CEL rules that the API server evaluates.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

GROUP = "sageserve.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
CATEGORY = "sageserve"

#: RFC 1123 label: lowercase alphanumerics and '-', used for names that end up in object names.
DNS_LABEL = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
#: RFC 1123 subdomain, the rule for most Kubernetes object names.
DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
#: A Kubernetes label value (node labels such as the GPU product are matched against it).
LABEL_VALUE = r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"


class ApiModel(BaseModel):
    """Base of every CRD schema model.

    camelCase on the wire (Kubernetes convention), snake_case in Python; unknown fields are
    errors, because the API server's strict field validation refuses them too and a typo in
    a threshold must never be silently ignored.
    """

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        validate_default=True,
    )


def cel(*rules: tuple[str, str]) -> dict[str, Any]:
    """`json_schema_extra` holding CEL rules (`x-kubernetes-validations`) for a schema node.

    Each rule is `(expression, message)`. Messages name the fields involved and the fix,
    since they are what a user sees from `kubectl apply` and from `sageserve validate`.
    """
    return {"x-kubernetes-validations": [{"rule": r, "message": m} for r, m in rules]}


def sub_object(model: type[BaseModel]) -> Any:
    """A field holding an optional sub-object that defaults to all of its fields' defaults.

    The CRD gets the *complete* default object, not `{}`: the API server validates a
    default against the node's CEL rules without applying the nested defaults first, so
    `{}` would be refused (and structural defaulting only descends into objects that
    exist, so leaving the default out would lose the nested defaults).
    """
    wire = model().model_dump(mode="json", by_alias=True, exclude_none=True)
    return Field(default_factory=model, json_schema_extra={"default": wire})


def list_map(*keys: str) -> dict[str, Any]:
    """`json_schema_extra` declaring a list as a map keyed by `keys`.

    The API server then refuses duplicate keys and server-side apply merges entries by key.
    """
    return {"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": list(keys)}


def list_set() -> dict[str, Any]:
    """`json_schema_extra` declaring a list of scalars as a set (no duplicates)."""
    return {"x-kubernetes-list-type": "set"}


class ObjectMeta(BaseModel):
    """The part of `metadata` that manifests set; the rest (uid, managedFields) is ignored."""

    model_config = ConfigDict(extra="ignore")

    name: str = Field(min_length=1, max_length=253, pattern=DNS_SUBDOMAIN)
    namespace: str | None = Field(default=None, max_length=63, pattern=DNS_LABEL)
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)


class Condition(ApiModel):
    """A status condition with the shape of `metav1.Condition`."""

    type: str = Field(max_length=316, description="Ready, PlanReady or Degraded.")
    status: Literal["True", "False", "Unknown"]
    reason: str = Field(
        max_length=1024,
        pattern=r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$",
        description="CamelCase reason, e.g. PrometheusUnreachable, ForecastFallback.",
    )
    message: str = Field(default="", max_length=32768)
    last_transition_time: datetime
    observed_generation: int | None = Field(default=None, ge=0)


def conditions_field() -> Any:
    """The `status.conditions` list, keyed by type as `metav1.Condition` lists are."""
    return Field(
        default_factory=list,
        max_length=16,
        json_schema_extra=list_map("type"),
        description="Ready, PlanReady and Degraded, each with a reason.",
    )
