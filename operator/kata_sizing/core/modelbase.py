"""The building blocks of kata-sizing's API models: the group and kind, the quantity and
decimal string types with their checks, the base model every policy and status model shares
(`ApiModel`: camelCase aliases, frozen, strict) and the cpu/memory pair. The policy's spec is in
`model`, the operator's status in `statusmodel`; together they are the CRD's schema (`crdgen`).
"""

# No `from __future__ import annotations`: pydantic would compile and evaluate every field's
# annotation from its string when the models are built, on each CLI start.
import re
from decimal import Decimal
from typing import Annotated, Final

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    WithJsonSchema,
)
from pydantic.alias_generators import to_camel

from .kubegrammar import labels_problems
from .quantity import QuantityError, cpu_cores, memory_bytes

GROUP = "katasizing.dev"
VERSION = "v1alpha1"
API_VERSION: Final = "katasizing.dev/v1alpha1"  # a literal, for the model's Literal type
assert API_VERSION == f"{GROUP}/{VERSION}"
KIND: Final = "KataSizingPolicy"
PLURAL = "katasizingpolicies"
SHORT_NAME = "ksp"

# RuntimeClass.handler must be a DNS label (k8s.io/api/node/v1), so the whole name is one.
MAX_HANDLER_LENGTH = 63

INT_OR_STRING = {"anyOf": [{"type": "integer"}, {"type": "string"}], "x-kubernetes-int-or-string": True}


INT64_MAX = 2**63 - 1


def as_quantity_text(value: object) -> object:
    """An int-or-string quantity field: the API server takes an integer or a string there and
    refuses a boolean or a number with a fraction (docs/inputs.md)."""
    if isinstance(value, bool):
        raise ValueError(f"{described(value)} is not a quantity; the API server takes an integer or a string "
                         "here (x-kubernetes-int-or-string)" + yaml_boolean_hint(value))
    if isinstance(value, int):
        return str(value)
    if isinstance(value, Decimal):  # Python callers (calibrate); never from YAML or JSON
        return format(value, "f")
    if isinstance(value, float):
        raise ValueError(f"{described(value)} is not an integer, and the API server takes only an integer or a "
                         f"string here (x-kubernetes-int-or-string): write \"{number_text(value)}\" in quotes")
    return value


def number_text(value: float) -> str:
    return format(Decimal(repr(value)), "f") if abs(value) < 1e21 else repr(value)


def described(value: object) -> str:
    """A value as a message names it, with its type, bounded and on one line."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"the boolean {'true' if value else 'false'}"
    if isinstance(value, int):
        return f"the integer {value}"
    if isinstance(value, float):
        return f"the number {value!r}"
    if isinstance(value, str):
        return f"the string {value[:60]!r}"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "a mapping"
    return f"a {type(value).__name__}"


def yaml_boolean_hint(value: object) -> str:
    # go-yaml (kubectl, Helm, the API server) reads YAML 1.1: these words unquoted are booleans.
    if isinstance(value, bool):
        return "; YAML reads an unquoted y, n, yes, no, on, off, true or false as a boolean: quote it"
    return ""


def check_memory(text: str) -> str:
    try:
        memory_bytes(text)
    except QuantityError as exc:
        raise ValueError(str(exc)) from None
    return text


def check_labels(labels: dict[str, str]) -> dict[str, str]:
    # Copied into RuntimeClass scheduling, node and namespace selectors: ValidateLabels.
    problems = labels_problems(labels)
    if problems:
        raise ValueError(problems[0])
    return labels


def check_cpu(text: str) -> str:
    try:
        cpu_cores(text)
    except QuantityError as exc:
        raise ValueError(str(exc)) from None
    return text


# The CRD's pattern for these fields; Decimal() alone would also take " 0.5", "0_5", "1e3",
# "Infinity" and non-ASCII digits, which the API server refuses.
DECIMAL_PATTERN = r"^[0-9]+(\.[0-9]+)?$"
_DECIMAL = re.compile(DECIMAL_PATTERN, re.ASCII)
# Digits a person writes for a fraction; enough for 0.49999999999999999999999999999.
MAX_DECIMAL_CHARS = 40


def format_decimal_error(text: str, at_most: int | None = None) -> str | None:
    """Why `text` is not a decimal fraction field (ratio, margin, overheadVcpus), or None."""
    if text.startswith("-") and _DECIMAL.fullmatch(text[1:]):
        return f"{text!r} must be a finite number >= 0"
    if len(text) > MAX_DECIMAL_CHARS or not _DECIMAL.fullmatch(text):
        return (f"{text[:MAX_DECIMAL_CHARS]!r} is not a decimal number of at most "
                f"{MAX_DECIMAL_CHARS} characters (example: \"0.14\")")
    if at_most is not None and Decimal(text) > at_most:
        return f"{text} is above {at_most}; use a fraction such as 0.10"
    return None


def check_fraction(text: str) -> str:
    problem = format_decimal_error(text)
    if problem:
        raise ValueError(problem)
    return text


MemoryQuantity = Annotated[
    str, BeforeValidator(as_quantity_text), AfterValidator(check_memory), WithJsonSchema(INT_OR_STRING)
]
CpuQuantity = Annotated[
    str, BeforeValidator(as_quantity_text), AfterValidator(check_cpu), WithJsonSchema(INT_OR_STRING)
]
# The CRD types these as strings (a fraction must not pass through a binary float), so a YAML
# number is refused, as the API server refuses it.
DecimalString = Annotated[
    str,
    AfterValidator(check_fraction),
    WithJsonSchema({"type": "string", "pattern": DECIMAL_PATTERN, "maxLength": MAX_DECIMAL_CHARS}),
]


class ApiModel(BaseModel):
    # strict: a field gets exactly the JSON type the CRD's structural schema gives it, as the
    # API server holds it; no "false" for false, no "2" for 2 (docs/inputs.md).
    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True, strict=True
    )


class Resources(ApiModel):
    """A cpu/memory pair, as in RuntimeClass.overhead.podFixed."""

    cpu: CpuQuantity = Field(description="CPU, as a Kubernetes quantity (600m, 1).")
    memory: MemoryQuantity = Field(description="Memory, as a Kubernetes quantity (160Mi, 1Gi).")
