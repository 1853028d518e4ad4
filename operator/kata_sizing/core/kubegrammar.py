"""Kubernetes' own grammar for the names and scheduling fields a policy copies into objects:
the API server refuses those objects otherwise, so the policy is refused first, with the field
named (docs/inputs.md). One home: the model, the CLI's flags and the webhook call these.

Written from k8s.io/apimachinery v0.37 (pkg/api/validate/content: IsDNS1123Label,
IsDNS1123Subdomain, IsLabelKey, IsLabelValue) and k8s.io/kubernetes v1.37
(pkg/apis/core/validation ValidateTolerations, as pkg/apis/node/validation applies it to a
RuntimeClass's scheduling: no Lt/Gt operators, no two tolerations alike). Go's `^...$` matches
the whole text, so these use fullmatch (Python's `$` would also match before a final newline).
Pure.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DNS_LABEL_MAX_LENGTH = 63
DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
DNS_SUBDOMAIN_MAX_LENGTH = 253
# k8s.io/apimachinery validation IsConfigMapKey (at most 253 characters, not "." nor "..").
CONFIG_MAP_KEY = re.compile(r"[-._a-zA-Z0-9]+", re.ASCII)
# A label key's name part and a non-empty label value.
LABEL_NAME = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]", re.ASCII)
LABEL_NAME_MAX_LENGTH = 63
LABEL_VALUE_MAX_LENGTH = 63

TOLERATION_OPERATORS = ("Exists", "Equal")
TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")


def _quoted(text: str) -> str:
    return repr(text[:80] + ("..." if len(text) > 80 else ""))


def is_dns_label(text: str) -> bool:
    return len(text) <= DNS_LABEL_MAX_LENGTH and bool(DNS_LABEL.fullmatch(text))


def label_key_problem(key: str) -> str | None:
    """Why `key` is not a label key (IsLabelKey: an optional DNS-subdomain prefix, '/', and a
    name), or None."""
    parts = key.split("/")
    if len(parts) > 2:
        return f"{_quoted(key)} is not a label key: at most one '/' (prefix/name)"
    if len(parts) == 2:
        prefix, name = parts
        if not prefix:
            return f"{_quoted(key)} is not a label key: the prefix before '/' is empty"
        if len(prefix) > DNS_SUBDOMAIN_MAX_LENGTH or not DNS_SUBDOMAIN.fullmatch(prefix):
            return (f"{_quoted(key)} is not a label key: the prefix must be a DNS subdomain of at most "
                    f"{DNS_SUBDOMAIN_MAX_LENGTH} characters (lower-case letters, digits, '-' and '.')")
    else:
        name = key
    if not name:
        return f"{_quoted(key)} is not a label key: the name is empty"
    if len(name) > LABEL_NAME_MAX_LENGTH or not LABEL_NAME.fullmatch(name):
        return (f"{_quoted(key)} is not a label key: the name must be at most {LABEL_NAME_MAX_LENGTH} letters, "
                "digits, '-', '_' or '.', starting and ending with a letter or digit")
    return None


def label_value_problem(value: str) -> str | None:
    """Why `value` is not a label value (IsLabelValue: empty, or a name of at most 63), or None."""
    if value and (len(value) > LABEL_VALUE_MAX_LENGTH or not LABEL_NAME.fullmatch(value)):
        return (f"{_quoted(value)} is not a label value: at most {LABEL_VALUE_MAX_LENGTH} letters, digits, '-', "
                "'_' or '.', starting and ending with a letter or digit (or empty)")
    return None


def labels_problems(labels: Mapping[str, str]) -> list[str]:
    """ValidateLabels: every key and every value."""
    problems = []
    for key, value in labels.items():
        problem = label_key_problem(key) or label_value_problem(value)
        if problem:
            problems.append(problem)
    return problems


def toleration_problems(toleration: Mapping[str, object]) -> list[str]:
    """ValidateTolerations on one toleration, given as its fields (absent or None: empty)."""
    key = str(toleration.get("key") or "")
    operator = str(toleration.get("operator") or "")
    value = str(toleration.get("value") or "")
    effect = str(toleration.get("effect") or "")
    problems = []
    if key:
        problem = label_key_problem(key)
        if problem:
            problems.append(f"key: {problem}")
    elif operator != "Exists":
        problems.append("operator must be Exists when key is empty (an empty key with Exists matches every taint)")
    if toleration.get("tolerationSeconds") is not None and effect != "NoExecute":
        problems.append("tolerationSeconds needs effect NoExecute (it is how long a pod stays after a NoExecute "
                        "taint appears)")
    if operator in ("", "Equal"):
        problem = label_value_problem(value)
        if problem:
            problems.append(f"value: {problem}")
    elif operator == "Exists":
        if value:
            problems.append(f"value must be empty when operator is Exists (got {_quoted(value)})")
    else:
        problems.append(f"operator {_quoted(operator)} is not one of {', '.join(TOLERATION_OPERATORS)}")
    if effect and effect not in TAINT_EFFECTS:
        problems.append(f"effect {_quoted(effect)} is not one of {', '.join(TAINT_EFFECTS)}")
    return problems


def duplicate_tolerations(tolerations: Sequence[Mapping[str, object]]) -> list[tuple[int, int]]:
    """(first, again) index pairs of tolerations a RuntimeClass may not hold twice: the same key,
    operator, value and effect as written (an absent operator is not Equal here)."""
    seen: dict[tuple[str, str, str, str], int] = {}
    pairs = []
    for index, toleration in enumerate(tolerations):
        key, operator, value, effect = (str(toleration.get(k) or "") for k in ("key", "operator", "value", "effect"))
        identity = (key, operator, value, effect)
        if identity in seen:
            pairs.append((seen[identity], index))
        else:
            seen[identity] = index
    return pairs


# --- what the API server and a kubelet send back ---------------------------------------------------

# The kubelet's Summary (k8s.io/kubelet/pkg/apis/stats/v1alpha1) carries every byte figure as a
# *uint64: nothing above this comes from a kubelet.
UINT64_MAX = 2**64 - 1


def dns_subdomain_problem(text: object) -> str | None:
    """Why `text` is not a DNS-1123 subdomain (IsDNS1123Subdomain: node, pod and RuntimeClass names), or None."""
    if not isinstance(text, str):
        return f"{_described(text)} is not a name (a string)"
    if not text or len(text) > DNS_SUBDOMAIN_MAX_LENGTH or not DNS_SUBDOMAIN.fullmatch(text):
        return (f"{_quoted(text)} is not a DNS subdomain (at most {DNS_SUBDOMAIN_MAX_LENGTH} lower-case letters, "
                "digits, '-' and '.', starting and ending with a letter or digit)")
    return None


def dns_label_problem(text: object) -> str | None:
    """Why `text` is not a DNS-1123 label (IsDNS1123Label: namespaces, class names), or None."""
    if not isinstance(text, str):
        return f"{_described(text)} is not a name (a string)"
    if not is_dns_label(text):
        return (f"{_quoted(text)} is not a DNS label (at most {DNS_LABEL_MAX_LENGTH} lower-case letters, digits "
                "and '-', starting and ending with a letter or digit)")
    return None


def name_problem(kind: str, text: object) -> str | None:
    """Why `text` is not a name of this kind as the API server stores it, or None: `node` (a DNS
    subdomain), `pod` (namespace/name: a DNS label, '/', a DNS subdomain), `class` (a DNS label)."""
    if kind == "pod":
        if not isinstance(text, str) or text.count("/") != 1:
            return f"{_quoted(str(text))} is not a pod (namespace/name)"
        namespace, name = text.split("/")
        problem = dns_label_problem(namespace) or dns_subdomain_problem(name)
        return f"{_quoted(text)} is not a pod (namespace/name): {problem}" if problem else None
    return dns_subdomain_problem(text) if kind == "node" else dns_label_problem(text)


def _described(value: object) -> str:
    if isinstance(value, (list, tuple)):
        return "a list"
    if isinstance(value, dict):
        return "a mapping"
    return f"the {type(value).__name__} {str(value)[:40]!r}"
