"""A core/v1 ``Affinity`` checked as the API server checks it, before the operator renders it.

``placement.affinity`` is passed through to the pods unchanged (the CRD keeps it free-form). These
models repeat the Deployment validation's rules (k8s.io/kubernetes/pkg/apis/core/validation) that a
user can get wrong - unknown fields, operators and their values, weights, topology keys, label keys
and values - so that a bad affinity is ``ConfigValid=False`` before anything is applied. What they
miss is still caught by the operator's server-side dry run (``ChildRejected``). Pure.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic.alias_generators import to_camel

__all__ = ["check_affinity"]

_DNS_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_LABEL_KEY = re.compile(rf"(({_DNS_LABEL}(\.{_DNS_LABEL})*)/)?[A-Za-z0-9]([-A-Za-z0-9_.]{{0,61}}[A-Za-z0-9])?")
_LABEL_VALUE = re.compile(r"(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?")


def _key(v: str) -> str:
    prefix, _, name = v.rpartition("/")
    if len(prefix) > 253 or len(name) > 63 or not _LABEL_KEY.fullmatch(v):
        raise ValueError(f"{v!r} is not a valid label key")
    return v


def _value(v: str) -> str:
    if len(v) > 63 or not _LABEL_VALUE.fullmatch(v):
        raise ValueError(f"{v!r} is not a valid label value")
    return v


class _M(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True)


class NodeSelectorRequirement(_M):
    key: str
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"]
    values: list[str] = Field(default_factory=list)

    @model_validator(mode="after")
    def _rules(self) -> NodeSelectorRequirement:
        _key(self.key)
        if self.operator in ("In", "NotIn") and not self.values:
            raise ValueError(f"operator {self.operator} needs values")
        if self.operator in ("Exists", "DoesNotExist") and self.values:
            raise ValueError(f"operator {self.operator} takes no values")
        if self.operator in ("Gt", "Lt") and (
            len(self.values) != 1 or not re.fullmatch(r"-?[0-9]{1,18}", self.values[0])
        ):
            raise ValueError(f"operator {self.operator} needs exactly one integer value")
        for v in self.values:
            _value(v)
        return self


class NodeFieldRequirement(_M):
    key: Literal["metadata.name"]
    operator: Literal["In", "NotIn"]
    values: list[str] = Field(min_length=1, max_length=1)


class NodeSelectorTerm(_M):
    match_expressions: list[NodeSelectorRequirement] = Field(default_factory=list)
    match_fields: list[NodeFieldRequirement] = Field(default_factory=list)


class NodeSelector(_M):
    node_selector_terms: list[NodeSelectorTerm] = Field(min_length=1)


class PreferredSchedulingTerm(_M):
    weight: int = Field(ge=1, le=100)
    preference: NodeSelectorTerm


class NodeAffinity(_M):
    required_during_scheduling_ignored_during_execution: NodeSelector | None = None
    preferred_during_scheduling_ignored_during_execution: list[PreferredSchedulingTerm] = Field(default_factory=list)


class LabelSelectorRequirement(_M):
    key: str
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"]
    values: list[str] = Field(default_factory=list)

    @model_validator(mode="after")
    def _rules(self) -> LabelSelectorRequirement:
        _key(self.key)
        if self.operator in ("In", "NotIn") and not self.values:
            raise ValueError(f"operator {self.operator} needs values")
        if self.operator in ("Exists", "DoesNotExist") and self.values:
            raise ValueError(f"operator {self.operator} takes no values")
        for v in self.values:
            _value(v)
        return self


class LabelSelector(_M):
    match_labels: dict[str, str] = Field(default_factory=dict)
    match_expressions: list[LabelSelectorRequirement] = Field(default_factory=list)

    @model_validator(mode="after")
    def _labels(self) -> LabelSelector:
        for k, v in self.match_labels.items():
            _key(k)
            _value(v)
        return self


class PodAffinityTerm(_M):
    label_selector: LabelSelector | None = None
    namespace_selector: LabelSelector | None = None
    namespaces: list[str] = Field(default_factory=list)
    topology_key: str = Field(min_length=1)

    @model_validator(mode="after")
    def _rules(self) -> PodAffinityTerm:
        _key(self.topology_key)
        for ns in self.namespaces:
            if len(ns) > 63 or not re.fullmatch(_DNS_LABEL, ns):
                raise ValueError(f"{ns!r} is not a namespace name")
        return self


class WeightedPodAffinityTerm(_M):
    weight: int = Field(ge=1, le=100)
    pod_affinity_term: PodAffinityTerm


class PodAffinity(_M):
    required_during_scheduling_ignored_during_execution: list[PodAffinityTerm] = Field(default_factory=list)
    preferred_during_scheduling_ignored_during_execution: list[WeightedPodAffinityTerm] = Field(default_factory=list)


class Affinity(_M):
    node_affinity: NodeAffinity | None = None
    pod_affinity: PodAffinity | None = None
    pod_anti_affinity: PodAffinity | None = None


def check_affinity(value: dict[str, Any]) -> dict[str, Any]:
    """Return ``value`` unchanged if the API server would accept it; else raise ValueError."""
    try:
        Affinity.model_validate(value, strict=True)
    except ValidationError as err:
        parts = []
        for e in err.errors():
            loc = ".".join(str(p) for p in e["loc"])
            msg = str(e["msg"]).removeprefix("Value error, ")
            parts.append(f"{loc}: {msg}" if loc else msg)
        raise ValueError("affinity is not a valid core/v1 Affinity: " + "; ".join(parts)) from None
    return value
