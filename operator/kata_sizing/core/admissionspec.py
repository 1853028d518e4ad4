"""spec.admission of a KataSizingPolicy, as pydantic v2 models: which pods the admission
policies judge (the namespaces, as names or a metav1.LabelSelector), what they do with a pod
outside its class, and how opted-in pods are routed to one (docs/admission.md).

Part of the CRD's schema with `model`, which holds the rest of the spec and imports these.
"""

# No `from __future__ import annotations`: pydantic would compile and evaluate every field's
# annotation from its string when the models are built, on each CLI start.
from typing import Literal

from pydantic import Field, field_validator, model_validator

from .kubegrammar import DNS_LABEL, label_key_problem, label_value_problem
from .modelbase import ApiModel, check_labels


class LabelSelectorRequirement(ApiModel):
    """A metav1.LabelSelectorRequirement."""

    key: str = Field(description="The label key.")
    operator: Literal["In", "NotIn", "Exists", "DoesNotExist"] = Field(description="In, NotIn, Exists or DoesNotExist.")
    values: list[str] | None = Field(default=None, description="For In and NotIn: the values.")

    @field_validator("key")
    @classmethod
    def _label_key(cls, value: str) -> str:
        problem = label_key_problem(value)
        if problem:
            raise ValueError(problem)
        return value

    @field_validator("values")
    @classmethod
    def _label_values(cls, value: list[str] | None) -> list[str] | None:
        for item in value or []:
            problem = label_value_problem(item)
            if problem:
                raise ValueError(problem)
        return value

    @model_validator(mode="after")
    def _values_fit_operator(self) -> "LabelSelectorRequirement":
        if self.operator in ("In", "NotIn") and not self.values:
            raise ValueError(f"operator {self.operator} needs at least one value")
        if self.operator in ("Exists", "DoesNotExist") and self.values:
            raise ValueError(f"operator {self.operator} takes no values")
        return self


class LabelSelector(ApiModel):
    """A metav1.LabelSelector: every matchLabels pair and every expression must hold."""

    match_labels: dict[str, str] = Field(default_factory=dict, description="Labels the namespace must carry.")
    match_expressions: list[LabelSelectorRequirement] = Field(
        default_factory=list, description="Requirements on the namespace's labels.")

    _match_labels = field_validator("match_labels")(check_labels)


class AdmissionNamespaces(ApiModel):
    """Where the admission policies apply; both given: a namespace must match both."""

    names: list[str] | None = Field(
        default=None, description="Namespace names (matched through the label kubernetes.io/metadata.name).")
    selector: LabelSelector | None = Field(default=None, description="A namespaceSelector.")

    @field_validator("names")
    @classmethod
    def _namespace_names(cls, value: list[str] | None) -> list[str] | None:
        for name in value or []:
            if not DNS_LABEL.fullmatch(name) or len(name) > 63:
                raise ValueError(f"{name!r} is not a valid namespace name (a DNS label)")
        return value


AdmissionAction = Literal["Deny", "Warn", "Audit"]


class Admission(ApiModel):
    """Pods and their class (docs/admission.md): ValidatingAdmissionPolicies that hold Kata pods
    to their class's envelope and a memory limit, and a MutatingAdmissionPolicy that routes pods
    labelled katasizing.dev/policy=<this policy> without a runtimeClassName to the smallest
    class that covers them."""

    enabled: bool = Field(default=True, description="false: no admission policies for this policy's pods.")
    memory_limit_missing: AdmissionAction = Field(
        default="Warn",
        description="A pod of a class without a memory limit: Deny, Warn (the default) or Audit.",
    )
    envelope_exceeded: AdmissionAction = Field(
        default="Deny",
        description="A pod whose limits exceed its class's cpu or memory, or an opted-in pod that "
        "fits no class: Deny (the default), Warn or Audit.",
    )
    namespaces: AdmissionNamespaces = Field(
        default_factory=AdmissionNamespaces, description="Where the rules and the routing apply. Default: everywhere.")
    routing: Literal["Auto", "MutatingAdmissionPolicy", "Webhook"] = Field(
        default="Auto",
        description="How opted-in pods get their class. Auto: a MutatingAdmissionPolicy where the "
        "API server serves one, else the operator's webhook; MutatingAdmissionPolicy; Webhook.",
    )
