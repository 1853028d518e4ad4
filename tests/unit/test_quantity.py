"""Kubernetes quantities: exact parsing, canonical printing, clear errors."""

from __future__ import annotations

from decimal import Decimal

import pytest

from kata_sizing.core.quantity import (
    MIB,
    QuantityError,
    cpu_cores,
    format_cpu,
    format_memory,
    format_mib,
    format_vcpus,
    memory_bytes,
    parse_quantity,
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("512Mi", 512 * 2**20),
        ("2Gi", 2 * 2**30),
        ("0.5Gi", 2**29),
        ("1.5Gi", 1610612736),
        ("100k", 100_000),
        ("1e3", 1000),
        ("1E3", 1000),
        ("1.5e3", 1500),
        ("128974848", 128974848),
        ("129M", 129_000_000),
        ("123Mi", 128974848),
        ("1Ki", 1024),
        ("1Ti", 2**40),
        (".5Ki", 512),
        (100, 100),
    ],
)
def test_memory_is_parsed_to_exact_bytes(text, expected):
    assert memory_bytes(text) == expected
    assert isinstance(memory_bytes(text), int)


def test_fractional_bytes_round_up_as_kubernetes_does():
    # 1.5 bytes is not representable; Kubernetes rounds quantities up, never down.
    assert memory_bytes("1.5") == 2
    assert memory_bytes("0.1Ki") == 103


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("600m", Decimal("0.6")),
        ("1.5", Decimal("1.5")),
        ("2", Decimal(2)),
        ("250m", Decimal("0.25")),
        ("1e3", Decimal(1000)),
        ("100k", Decimal(100_000)),
        ("0.0001", Decimal("0.001")),  # Kubernetes' CPU resolution is one millicore
        (1.5, Decimal("1.5")),
        (2, Decimal(2)),
    ],
)
def test_cpu_is_parsed_exactly_to_the_millicore(text, expected):
    assert cpu_cores(text) == expected


def test_parse_quantity_keeps_float_free_decimals():
    # 0.1 + 0.2 in binary floating point is not 0.3; the parser must not go through float.
    assert parse_quantity("0.1") + parse_quantity("0.2") == Decimal("0.3")
    assert parse_quantity("600m") == Decimal("0.600")


@pytest.mark.parametrize(
    ("size_bytes", "expected"),
    [
        (0, "0"),
        (512 * MIB, "512Mi"),
        (1024 * MIB, "1Gi"),
        (2**29, "512Mi"),
        (1536 * MIB, "1536Mi"),
        (248 * 2**30, "248Gi"),
        (1024, "1Ki"),
        (1000, "1000"),
        (2**40, "1Ti"),
    ],
)
def test_memory_prints_with_the_largest_binary_suffix_that_divides(size_bytes, expected):
    assert format_memory(size_bytes) == expected
    assert memory_bytes(expected) == size_bytes


def test_format_mib():
    assert format_mib(760) == "760Mi"
    assert format_mib(2048) == "2Gi"


@pytest.mark.parametrize(
    ("cores", "expected"),
    [
        (Decimal("2.1"), "2100m"),
        (Decimal("0.6"), "600m"),
        (Decimal("0.25"), "250m"),
        (Decimal(2), "2"),
        (Decimal("2.000"), "2"),
        (Decimal("0.0001"), "1m"),
    ],
)
def test_cpu_prints_as_kubernetes_would(cores, expected):
    assert format_cpu(cores) == expected


@pytest.mark.parametrize(
    ("cores", "expected"),
    [(Decimal("0.2"), "0.2"), (Decimal("0.50"), "0.5"), (Decimal(1), "1"), (Decimal("1.5"), "1.5"),
     (Decimal("10"), "10"), (Decimal("0"), "0")],
)
def test_vcpus_print_as_kata_toml_takes_them(cores, expected):
    assert format_vcpus(cores) == expected


@pytest.mark.parametrize("junk", ["5Zi", "", "1.2.3", "Mi", "1 Gi", "1GiB", "1g", "abc", "1e", "--1", "0x10", "∞"])
def test_junk_is_refused_with_examples_of_what_works(junk):
    with pytest.raises(QuantityError) as info:
        parse_quantity(junk)
    assert repr(junk) in str(info.value)
    assert "512Mi" in str(info.value)


@pytest.mark.parametrize("junk", [
    # The API server's grammar exactly: no whitespace, no other digits, no trailing newline.
    " 64Mi ", "64Mi\n", "\t1", "１Gi", "٣Mi", "1_000", "1e" + "9" * 5000, "1" * 70,
])
def test_what_the_api_server_refuses_is_refused(junk):
    with pytest.raises(QuantityError):
        parse_quantity(junk)


@pytest.mark.parametrize("junk", [None, True, [1], {"a": 1}, float("nan"), float("inf")])
def test_non_quantities_of_other_types_are_refused(junk):
    with pytest.raises(QuantityError):
        parse_quantity(junk)


def test_negative_memory_is_refused_but_parses_as_a_quantity():
    assert parse_quantity("-1Gi") == -(2**30)
    with pytest.raises(QuantityError, match="negative; memory must be zero or more"):
        memory_bytes("-1Gi")
    with pytest.raises(QuantityError, match="negative; CPU must be zero or more"):
        cpu_cores("-100m")


@pytest.mark.parametrize("huge", ["1e1000000", "1e5000", "9Ei", "99999999999999999999"])
def test_quantities_beyond_kubernetes_range_are_refused_not_crashed(huge):
    with pytest.raises(QuantityError, match="out of range"):
        memory_bytes(huge)
    with pytest.raises(QuantityError, match="out of range"):
        cpu_cores(huge)


def test_largest_kubernetes_quantity_is_accepted():
    assert memory_bytes(str(2**63 - 1)) == 2**63 - 1
