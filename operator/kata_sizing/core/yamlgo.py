"""YAML read the way kubectl, Helm and the API server read it, so that a policy file means to
kata-sizing what it means to them (docs/inputs.md).

They read YAML 1.1 through go-yaml v2 (`sigs.k8s.io/yaml.YAMLToJSON`) and send the result as
JSON; the API server decodes that JSON keeping integers as int64. PyYAML reads YAML 1.1 too but
resolves plain scalars differently: `y`, `n`, `N` are booleans to Go and strings to PyYAML;
`1e3`, `0o17`, `0x1F`, `1_000` are numbers to Go; `1:20` is a number to PyYAML only. A policy
that says `enabled: n` is `false` on the server, and `cpu: 1e3` is the integer 1000. So plain
scalars are resolved here with go-yaml v2's own table and parsers (`resolve.go` of
go.yaml.in/yaml/v2 2.4), and the document is then converted as the JSON round trip converts it:

- map keys become strings as sigs.k8s.io/yaml makes them (`y` -> "true", `0x10` -> "16",
  `1e6` -> "1e+06"); a null key cannot be converted (kubectl: "unsupported map key");
- a float that Go's encoding/json prints without a fraction or exponent (whole, below 1e21)
  arrives as an integer, and as an integer only within int64: past that the server decodes a
  float. NaN and infinities cannot be written as JSON (kubectl: "json: unsupported value").

Quoted scalars are strings, as everywhere. Pure: nodes in, values out.
"""

from __future__ import annotations

import math
import re
import struct

INT64_MAX = 2**63 - 1
UINT64_MAX = 2**64 - 1

STR_TAG = "tag:yaml.org,2002:str"
INT_TAG = "tag:yaml.org,2002:int"
FLOAT_TAG = "tag:yaml.org,2002:float"
BOOL_TAG = "tag:yaml.org,2002:bool"
NULL_TAG = "tag:yaml.org,2002:null"
MERGE_TAG = "tag:yaml.org,2002:merge"

# go-yaml v2 resolve.go, resolveMapList.
_RESOLVE_MAP: dict[str, tuple[str, object]] = {}
for _value, _tag, _words in (
    (True, BOOL_TAG, ("y", "Y", "yes", "Yes", "YES", "true", "True", "TRUE", "on", "On", "ON")),
    (False, BOOL_TAG, ("n", "N", "no", "No", "NO", "false", "False", "FALSE", "off", "Off", "OFF")),
    (None, NULL_TAG, ("", "~", "null", "Null", "NULL")),
    (math.nan, FLOAT_TAG, (".nan", ".NaN", ".NAN")),
    (math.inf, FLOAT_TAG, (".inf", ".Inf", ".INF", "+.inf", "+.Inf", "+.INF")),
    (-math.inf, FLOAT_TAG, ("-.inf", "-.Inf", "-.INF")),
    ("<<", MERGE_TAG, ("<<",)),
):
    for _word in _words:
        _RESOLVE_MAP[_word] = (_tag, _value)

# go-yaml v2's yamlStyleFloat: the decimal floats it hands to strconv.ParseFloat.
_YAML_STYLE_FLOAT = re.compile(r"[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?", re.ASCII)
# strconv.ParseFloat's decimal syntax (for scalars starting with '.', which go-yaml passes as is).
_GO_DECIMAL_FLOAT = re.compile(r"[-+]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][-+]?[0-9]+)?", re.ASCII)
_GO_PREFIXED = {"0x": (16, "0123456789abcdefABCDEF"), "0o": (8, "01234567"), "0b": (2, "01")}


def _go_parse_int(text: str, signed: bool) -> int | None:
    """strconv.ParseInt(text, 0, 64) (signed) or ParseUint (unsigned); None where Go fails."""
    body = text
    negative = False
    if signed and body[:1] in ("+", "-"):
        negative, body = body[0] == "-", body[1:]
    if not body:
        return None
    prefix = body[:2].lower()
    if prefix in _GO_PREFIXED:
        base, digits = _GO_PREFIXED[prefix]
        body = body[2:]
    elif body[0] == "0" and len(body) > 1:
        base, digits = 8, "01234567"
        body = body[1:]
    else:
        base, digits = 10, "0123456789"
    if not body or any(c not in digits for c in body) or len(body.lstrip("0")) > 64:
        return None
    value = int(body, base)
    value = -value if negative else value
    if signed:
        return value if -(2**63) <= value <= INT64_MAX else None
    return value if value <= UINT64_MAX else None


def _underscores_ok(text: str) -> bool:
    """strconv's underscoreOK: an underscore only between digits (or after a base prefix)."""
    body = text[1:] if text[:1] in ("+", "-") else text
    saw = "^"
    for char in body:
        if char.isdigit():
            saw = "0"
        elif char == "_":
            if saw != "0":
                return False
            saw = "_"
        elif saw == "_":
            return False
        else:
            saw = "!"
    return saw != "_"


def _go_parse_float(text: str) -> float | None:
    """strconv.ParseFloat(text, 64) for decimal text (underscores between digits allowed, as
    in Go literals); None where Go fails: bad syntax, or a value past the largest float64
    (Go answers ErrRange, and go-yaml keeps the string)."""
    if "_" in text:
        if not _underscores_ok(text):
            return None
        text = text.replace("_", "")
    if not _GO_DECIMAL_FLOAT.fullmatch(text):
        return None
    value = float(text)
    return None if math.isinf(value) else value


def resolve(text: str) -> tuple[str, object]:
    """The tag and value go-yaml v2 gives a plain (unquoted, untagged) scalar."""
    if text in _RESOLVE_MAP:
        return _RESOLVE_MAP[text]
    hint = text[0]
    if hint == ".":
        value = _go_parse_float(text)
        if value is not None:
            return FLOAT_TAG, value
    elif hint in "+-0123456789":
        plain = text.replace("_", "")
        for signed in (True, False):
            number = _go_parse_int(plain, signed)
            if number is not None:
                return INT_TAG, number
        if _YAML_STYLE_FLOAT.fullmatch(plain):
            value = _go_parse_float(plain)
            if value is not None:
                return FLOAT_TAG, value
        # 0b/-0b were tried by ParseInt's base prefix already.
    return STR_TAG, text


def json_number(value: int | float) -> int | float:
    """A number as the API server holds it after the JSON round trip: encoding/json prints a
    whole float below 1e21 without fraction or exponent, and the server decodes integer text
    as int64 when it fits, else as float64. Raises ValueError for NaN and infinities."""
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"{value!r} cannot be written as JSON")
        if value == int(value) and abs(value) < 1e21:
            value = int(value)
        else:
            return value
    return value if -(2**63) <= value <= INT64_MAX else float(value)


def _go_float32_g(value: float) -> str:
    """strconv.FormatFloat(value, 'g', -1, 32): how sigs.k8s.io/yaml names a float map key
    (then "+Inf", "-Inf", "NaN" become ".inf", "-.inf", ".nan")."""
    if math.isnan(value):
        return ".nan"
    try:
        single = struct.unpack("<f", struct.pack("<f", value))[0]
    except OverflowError:  # float32(value) is infinite
        single = math.copysign(math.inf, value)
    if math.isinf(single):
        return ".inf" if single > 0 else "-.inf"
    if single == 0:
        return "-0" if math.copysign(1, single) < 0 else "0"
    for precision in range(1, 10):  # the shortest digits that read back as the same float32
        text = f"{single:.{precision - 1}e}"
        if struct.unpack("<f", struct.pack("<f", float(text)))[0] == single:
            break
    mantissa, exponent_text = text.split("e")
    sign = "-" if mantissa.startswith("-") else ""
    figures = mantissa.lstrip("-").replace(".", "").rstrip("0") or "0"
    exponent = int(exponent_text)
    # strconv's %g with the shortest digits: %e when the exponent is below -4 or at least 6.
    if exponent < -4 or exponent >= 6:
        fraction = f".{figures[1:]}" if len(figures) > 1 else ""
        return f"{sign}{figures[0]}{fraction}e{'-' if exponent < 0 else '+'}{abs(exponent):02d}"
    if exponent < 0:
        return f"{sign}0.{'0' * (-exponent - 1)}{figures}"
    whole = figures[: exponent + 1].ljust(exponent + 1, "0")
    fraction = figures[exponent + 1:]
    return f"{sign}{whole}" + (f".{fraction}" if fraction else "")


def key_text(key: object) -> str:
    """A map key as sigs.k8s.io/yaml converts it to a JSON key; ValueError where it cannot."""
    if isinstance(key, str):
        return key
    if isinstance(key, bool):
        return "true" if key else "false"
    if isinstance(key, int):
        if key > INT64_MAX:
            raise ValueError(f"unsupported map key of type uint64 ({key})")
        return str(key)
    if isinstance(key, float):
        return _go_float32_g(key)
    raise ValueError(f"unsupported map key {'null' if key is None else type(key).__name__}")
