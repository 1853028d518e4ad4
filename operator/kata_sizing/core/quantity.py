"""Kubernetes resource quantities, parsed exactly.

Memory is kept as a whole number of bytes and CPU as a `Decimal` of cores, so `512Mi`,
`0.5Gi`, `600m` and `"1.5"` round-trip without float drift. The grammar follows
k8s.io/apimachinery/pkg/api/resource (binary suffixes Ki..Ei, decimal suffixes n..E,
and decimal exponents such as `1e3`).
"""

from __future__ import annotations

import math
import re
import reprlib
from decimal import Decimal, InvalidOperation, localcontext

MIB = 1024 * 1024
# k8s.io/apimachinery resource.Quantity: "no quantity may represent a number greater than
# 2^63-1 in magnitude". Past it, Decimal overflows and ints grow too long to print.
MAX_QUANTITY = Decimal(2**63 - 1)

_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "": Decimal(1),
    "k": Decimal("1e3"),
    "M": Decimal("1e6"),
    "G": Decimal("1e9"),
    "T": Decimal("1e12"),
    "P": Decimal("1e15"),
    "E": Decimal("1e18"),
}
_QUANTITY = re.compile(
    r"^(?P<sign>[+-]?)(?P<number>[0-9]+(?:\.[0-9]*)?|\.[0-9]+)"
    r"(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?[0-9]+)?$",
    re.ASCII,
)
# A bound, not grammar: 2^63-1 has 19 digits; anything this long is not a size anyone means.
MAX_QUANTITY_CHARS = 64


# Decimal precision that keeps sums and products of bounded inputs exact.
_EXACT_DIGITS = 200

_SHOWN = reprlib.Repr()  # attributes, not keywords: Python 3.11's Repr takes none
_SHOWN.maxlevel, _SHOWN.maxlist, _SHOWN.maxdict, _SHOWN.maxstring, _SHOWN.maxother = 2, 4, 4, 60, 60


def shown(value: object) -> str:
    """A value quoted in a message, bounded: a list built from YAML aliases can be huge."""
    return _SHOWN.repr(value)


class QuantityError(ValueError):
    """A string that is not a Kubernetes quantity, or not a valid one for its use."""


def parse_quantity(text: object) -> Decimal:
    """The exact value of a Kubernetes quantity in its base unit (bytes or cores): a string, an
    int, a finite float or a Decimal; anything else raises QuantityError."""
    if isinstance(text, bool):
        raise QuantityError(f"{text!r} is not a quantity")
    if isinstance(text, float) and not math.isfinite(text):
        raise QuantityError(f"{text!r} is not a quantity")
    if not isinstance(text, (str, int, float, Decimal)):
        raise QuantityError(f"{shown(text)} is not a quantity")
    try:
        with localcontext() as context:
            context.prec = _EXACT_DIGITS  # 64 characters of digits times a suffix, exactly
            if isinstance(text, str):
                value = _parse_text(text)
            else:
                value = Decimal(repr(text)) if isinstance(text, float) else Decimal(text)
    except ArithmeticError:
        value = None
    if value is None or not value.is_finite() or abs(value) > MAX_QUANTITY:
        raise QuantityError(f"{shown(text)} is out of range: a Kubernetes quantity is at most 2^63-1")
    return value


def _parse_text(text: str) -> Decimal:
    # Exactly the API server's grammar: no surrounding whitespace, ASCII digits only
    # (re.ASCII and fullmatch: `$` alone would accept a trailing newline).
    if len(text) > MAX_QUANTITY_CHARS:
        raise QuantityError(
            f"{text[:24]!r}... is {len(text)} characters; a quantity is at most {MAX_QUANTITY_CHARS}")
    match = _QUANTITY.fullmatch(text)
    if not match:
        raise QuantityError(
            f"{text!r} is not a Kubernetes quantity (examples: 512Mi, 2Gi, 600m, 1.5)"
        )
    try:
        number = Decimal(match["number"])
    except InvalidOperation as exc:  # pragma: no cover - the regex admits only digits
        raise QuantityError(f"{text!r} is not a Kubernetes quantity") from exc
    if match["sign"] == "-":
        number = -number
    suffix = match["suffix"] or ""
    if suffix in _BINARY:
        return number * _BINARY[suffix]
    if suffix in _DECIMAL:
        return number * _DECIMAL[suffix]
    return number * (Decimal(10) ** int(suffix[1:]))


def memory_bytes(text: object) -> int:
    """Memory in whole bytes; a fractional byte count is rounded up, as Kubernetes does."""
    value = parse_quantity(text)
    if value < 0:
        raise QuantityError(f"{text!r} is negative; memory must be zero or more")
    return int(value.to_integral_value(rounding="ROUND_CEILING"))


def cpu_cores(text: object) -> Decimal:
    """CPU in cores, exact to the millicore (Kubernetes' own resolution)."""
    value = parse_quantity(text)
    if value < 0:
        raise QuantityError(f"{text!r} is negative; CPU must be zero or more")
    with localcontext() as context:
        context.prec = _EXACT_DIGITS
        millicores = (value * 1000).to_integral_value(rounding="ROUND_CEILING")
        return millicores / 1000


def mib_ceil(size_bytes: int) -> int:
    return -(-size_bytes // MIB)


def format_memory(size_bytes: int) -> str:
    """The canonical form Kubernetes would print: the largest binary suffix that divides."""
    if size_bytes == 0:
        return "0"
    for suffix, factor in reversed(list(_BINARY.items())):
        if size_bytes % factor == 0:
            return f"{size_bytes // factor}{suffix}"
    return str(size_bytes)


def format_mib(size_mib: int) -> str:
    return format_memory(size_mib * MIB)


def format_cpu(cores: Decimal) -> str:
    """`250m` below a whole core or for fractions, `2` for whole cores."""
    with localcontext() as context:
        # Exact for every value a field can hold (40 characters of digits and more): the
        # default 28 digits would round the product and fail the remainder.
        context.prec = _EXACT_DIGITS
        millicores = int((Decimal(cores) * 1000).to_integral_value(rounding="ROUND_CEILING"))
    if millicores % 1000 == 0:
        return str(millicores // 1000)
    return f"{millicores}m"


def format_vcpus(cores: Decimal) -> str:
    """A vCPU count as Kata's TOML takes it: `0.2`, `1`, `1.5` (no trailing zeros)."""
    # Exact: Decimal.normalize() would round to the context's 28 digits, and the drop-in
    # must say what the policy said (Kata's reader then decides what it becomes).
    text = format(Decimal(cores), "f")
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return text or "0"
