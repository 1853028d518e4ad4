"""The API server's grammar for what a policy carries, stated here on its own (not imported from
kata_sizing), as the oracle of the property tests in tests/unit/test_properties.py and
tests/unit/test_fuzz.py; tests/api/test_real_inputs.py checks this statement against the real
kube-apiserver, one table.

Sources: k8s.io/apimachinery v0.37 pkg/api/validate/content (IsLabelKey, IsLabelValue,
IsDNS1123Label, IsDNS1123Subdomain); k8s.io/kubernetes v1.37 pkg/apis/core/validation
ValidateTolerations and pkg/apis/node/validation (a RuntimeClass's scheduling); go.yaml.in/yaml/v2
resolve.go and sigs.k8s.io/yaml (how kubectl reads a plain YAML scalar before sending JSON).

Values are drawn together with what they mean to Go (`Scalar`): the strategies write an integer
as hex or with underscores knowing the integer, a boolean as `y` knowing it is true; nothing here
parses YAML.
"""

from __future__ import annotations

import re
import string
from dataclasses import dataclass

from hypothesis import strategies as st

# --- names and labels ----------------------------------------------------------------------

_ALNUM = string.ascii_letters + string.digits
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_NAME_PART = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")


def dns_label_ok(text: str) -> bool:
    return len(text) <= 63 and _DNS_LABEL.fullmatch(text) is not None


def dns_subdomain_ok(text: str) -> bool:
    return len(text) <= 253 and all(_DNS_LABEL.fullmatch(part) for part in text.split("."))


def label_key_ok(text: str) -> bool:
    parts = text.split("/")
    if len(parts) > 2:
        return False
    if len(parts) == 2 and not (parts[0] and dns_subdomain_ok(parts[0])):
        return False
    name = parts[-1]
    return 0 < len(name) <= 63 and _NAME_PART.fullmatch(name) is not None


def label_value_ok(text: str) -> bool:
    return text == "" or (len(text) <= 63 and _NAME_PART.fullmatch(text) is not None)


def toleration_ok(toleration: dict) -> bool:
    """ValidateTolerations as a RuntimeClass applies it (no Lt/Gt), on one toleration whose
    fields are already of the right JSON types."""
    key, operator = toleration.get("key", ""), toleration.get("operator", "")
    value, effect = toleration.get("value", ""), toleration.get("effect", "")
    if key and not label_key_ok(key):
        return False
    if not key and operator != "Exists":
        return False
    if "tolerationSeconds" in toleration and effect != "NoExecute":
        return False
    if operator in ("", "Equal"):
        if not label_value_ok(value):
            return False
    elif operator == "Exists":
        if value:
            return False
    else:
        return False
    return effect in ("", "NoSchedule", "PreferNoSchedule", "NoExecute")


def tolerations_unique(tolerations: list[dict]) -> bool:
    seen = set()
    for t in tolerations:
        identity = (t.get("key", ""), t.get("operator", ""), t.get("value", ""), t.get("effect", ""))
        if identity in seen:
            return False
        seen.add(identity)
    return True


# --- plain YAML scalars as kubectl sends them ----------------------------------------------


@dataclass(frozen=True)
class Scalar:
    """A scalar as written in YAML (`text`), and the JSON value the API server receives."""

    text: str
    value: object

    @property
    def json_type(self) -> str:
        if isinstance(self.value, bool):
            return "boolean"
        if isinstance(self.value, int):
            return "integer"
        if isinstance(self.value, float):
            return "number"
        return "string" if isinstance(self.value, str) else "null"


# go-yaml v2's resolve table: these words, unquoted, are booleans.
GO_TRUE = ("y", "Y", "yes", "Yes", "YES", "true", "True", "TRUE", "on", "On", "ON")
GO_FALSE = ("n", "N", "no", "No", "NO", "false", "False", "FALSE", "off", "Off", "OFF")
INT64 = 2**63 - 1


def quoted(text: str) -> Scalar:
    return Scalar("'" + text.replace("'", "''") + "'", text)


booleans = st.sampled_from([Scalar(w, True) for w in GO_TRUE] + [Scalar(w, False) for w in GO_FALSE])


@st.composite
def integers(draw, low: int = 0, high: int = 10**6) -> Scalar:
    """An integer written as Go's strconv.ParseInt(.., 0, 64) reads it after go-yaml drops '_'."""
    n = draw(st.integers(low, high))
    form = draw(st.sampled_from(["dec", "hex", "oct", "oct0", "bin", "under", "plus"]))
    if n < 0 or form == "dec":
        return Scalar(str(n), n)
    text = {"hex": f"0x{n:x}", "oct": f"0o{n:o}", "oct0": f"0{n:o}", "bin": f"0b{n:b}", "plus": f"+{n}",
            "under": "_".join(str(n)) if n >= 10 else str(n)}[form]
    return Scalar(text, n)


@st.composite
def floats(draw) -> Scalar:
    """A decimal float go-yaml hands to ParseFloat; the API server receives an integer when Go's
    JSON prints it whole (below 1e21) and within int64, else a number."""
    mantissa = draw(st.integers(1, 999))
    exponent = draw(st.integers(-3, 3))
    point = draw(st.booleans())
    text = f"{mantissa}.0e{exponent}" if point else f"{mantissa}e{exponent}"
    value = float(text)
    return Scalar(text, int(value) if value == int(value) else value)


def plain_strings(alphabet: str = _ALNUM + "-_.", min_size: int = 1, max_size: int = 20) -> st.SearchStrategy:
    """Unquoted text go-yaml reads as a string: it starts with a letter that no word or number
    of the resolve table starts with."""
    first = "".join(c for c in alphabet if c.isalpha() and c not in "yYnNtTfFoO")
    return st.builds(lambda head, tail: Scalar(head + tail, head + tail), st.sampled_from(first),
                     st.text(alphabet, min_size=min_size - 1, max_size=max_size - 1))


# Label keys and values near the grammar's edges: prefixes (empty, subdomain, bad), '/' counts,
# lengths around 63, characters around the allowed set.
_LABEL_CHARS = _ALNUM + "-_./"


@st.composite
def label_keys(draw) -> str:
    shape = draw(st.sampled_from(["name", "prefixed", "empty-prefix", "two-slashes", "long", "free"]))
    name = draw(st.text(_ALNUM + "-_.", min_size=0, max_size=8))
    if shape == "name":
        return name
    if shape == "prefixed":
        parts = draw(st.lists(st.text(string.ascii_lowercase + string.digits + "-", min_size=1, max_size=6),
                              min_size=1, max_size=3))
        return ".".join(parts) + "/" + name
    if shape == "empty-prefix":
        return "/" + name
    if shape == "two-slashes":
        return f"a/{name}/b"
    if shape == "long":
        return "k" * draw(st.integers(60, 66))
    return draw(st.text(_LABEL_CHARS + " :\n", max_size=12))


@st.composite
def label_values(draw) -> str:
    shape = draw(st.sampled_from(["value", "empty", "long", "free"]))
    if shape == "empty":
        return ""
    if shape == "long":
        return "v" * draw(st.integers(60, 66))
    alphabet = _ALNUM + "-_." if shape == "value" else _LABEL_CHARS + " :"
    return draw(st.text(alphabet, min_size=1, max_size=10))


@st.composite
def tolerations(draw) -> dict:
    toleration: dict = {}
    if draw(st.booleans()):
        toleration["key"] = draw(st.sampled_from(["kata", "example.com/kata", "", "/team", "a b"]))
    if draw(st.booleans()):
        toleration["operator"] = draw(st.sampled_from(["Exists", "Equal"]))
    if draw(st.booleans()):
        toleration["value"] = draw(st.sampled_from(["", "true", "x", "bad value", "v" * 64]))
    if draw(st.booleans()):
        toleration["effect"] = draw(st.sampled_from(["NoSchedule", "PreferNoSchedule", "NoExecute"]))
    if draw(st.booleans()):
        toleration["tolerationSeconds"] = draw(st.integers(-5, 3600))
    return toleration


# --- what the CRD's structural schema takes ----------------------------------------------------

# The CRD's pattern for a quantity written as a string (crds/, from the API server's grammar);
# Go's `$` is the end of the text.
_QUANTITY_PATTERN = re.compile(r"([+-]?)([0-9]+(?:\.[0-9]*)?|\.[0-9]+)(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?[0-9]+)?")


def schema_accepts(kind: str, scalar: Scalar) -> bool:
    """Whether the API server stores `scalar` in a field of this kind: boolean, integer (with
    minimum 1: 'positive'), string, a label value, or an int-or-string quantity."""
    if kind == "boolean":
        return scalar.json_type == "boolean"
    if kind == "integer":
        return scalar.json_type == "integer"
    value = scalar.value
    if kind == "positive":
        return scalar.json_type == "integer" and isinstance(value, int) and value >= 1
    if kind == "string":
        return scalar.json_type == "string"
    if kind == "label-value":  # a string the CRD takes and a RuntimeClass's nodeSelector too
        return isinstance(value, str) and label_value_ok(value)
    if kind == "quantity":
        return scalar.json_type == "integer" or (
            isinstance(value, str) and _QUANTITY_PATTERN.fullmatch(value) is not None)
    raise ValueError(kind)


quantity_texts = st.sampled_from(["1Gi", "512Mi", "1.5Gi", "-1Gi", "1e3", "1E3", ".5", "5.", "+1k", "0x10", "lots",
                                  "1 Gi", "1Gi\n", "", "0", "1e", "Gi", "1.5.5", "١Gi", "2Ei"])


# --- what a kubelet and the API server send back (survey inputs) --------------------------------------

UINT64_MAX = 2**64 - 1  # k8s.io/kubelet/pkg/apis/stats/v1alpha1: every byte figure is a *uint64

# Names as the API server stores them (IsDNS1123Label / IsDNS1123Subdomain), and text that is not:
# the characters issue 26 found reaching a CSV (=, a comma, quotes, CR, LF), upper case, dots, dashes.
dns_labels = st.from_regex(r"\A[a-z0-9]([a-z0-9-]{0,20}[a-z0-9])?\Z")
dns_subdomains = st.from_regex(r"\A[a-z0-9]([a-z0-9-]{0,10}[a-z0-9])?(\.[a-z0-9]([a-z0-9-]{0,10}[a-z0-9])?){0,2}\Z")
name_texts = st.one_of(
    dns_labels, dns_subdomains,
    st.text(alphabet="az09-.=,\"'\r\n/ Z_\u00e9", min_size=0, max_size=12),
    st.sampled_from(["=team", "web,1", 'a"b', "a\rb", "a\nb", "-a", "a-", "a" * 64, "a." * 127 + "a", "A"]),
)

# A Summary's byte figure as a kubelet might (not) write it: in and past the uint64 range, and what
# JSON could carry instead (a float, a string, a boolean, null).
summary_figures = st.one_of(
    st.integers(0, 2**40), st.integers(UINT64_MAX - 4, UINT64_MAX + 4), st.integers(-(2**70), 2**70),
    st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=5), st.booleans(), st.none(),
)


def uint64_ok(value: object) -> bool:
    return type(value) is int and 0 <= value <= UINT64_MAX
