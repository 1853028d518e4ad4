"""YAML read as kubectl reads it (core/yamlgo.py through bounded.load_yaml_documents), against
what go-yaml itself gives: each expected value below is the JSON `sigs.k8s.io/yaml.YAMLToJSON`
1.6.0 (go.yaml.in/yaml/v2 2.4.4) printed for the document, recorded 2026-12-03; where the API
server then holds something else (integer text past int64 becomes a float there, as
tests/api/test_real_inputs.py shows), the server's value is expected, and the comment says so.
docs/inputs.md has the larger differential check."""

from __future__ import annotations

import math

import pytest

from kata_sizing.core import bounded, yamlgo

VALUES = [
    ("y", True), ("N", False), ("yes", True), ("On", True), ("off", False), ("~", None), ("null", None), ("", None),
    ("1e3", 1000), ("1e-3", 0.001), ("1.5e3", 1500), ("0o17", 15), ("0x1F", 31), ("0b101", 5), ("-0b101", -5),
    ("1_000", 1000), ("017", 15), ("09", 9), ("+5", 5), ("-0", 0), ("1.", 1), ("+.5", 0.5), (".5", 0.5),
    (".5_0", 0.5), ("1:20", "1:20"), ("2024-01-02", "2024-01-02"), ("1e400", "1e400"), ("1e-400", 0),
    ("9223372036854775807", 9223372036854775807),
    ("9223372036854775808", 9.223372036854775808e18),  # go-yaml: 9223372036854775808; the server: a float
    ("1e21", 1e21), ("1e20", 1e20),  # go-yaml prints 100000000000000000000; past int64 the server holds a float
    ("0.1", 0.1), ("0x", "0x"), ("1__0", 10), ("0_1", 1), ("x1", "x1"), ("<<", "<<"),
]
KEYS = [
    ("y", "true"), ("N", "false"), ("yes", "true"), ("On", "true"), ("off", "false"), ("1e3", "1000"),
    ("1e-3", "0.001"), ("1.5e3", "1500"), ("0o17", "15"), ("0x1F", "31"), ("0b101", "5"), ("-0b101", "-5"),
    ("1_000", "1000"), ("017", "15"), ("09", "9"), ("+5", "5"), ("-0", "0"), ("1.", "1"), ("+.5", "0.5"),
    (".5", "0.5"), (".5_0", "0.5"), ("1:20", "1:20"), ("2024-01-02", "2024-01-02"), ("1e400", "1e400"),
    ("1e-400", "0"), ("9223372036854775807", "9223372036854775807"), ("1e21", "1e+21"), ("1e20", "1e+20"),
    ("0.1", "0.1"), ("-.inf", "-.inf"), (".nan", ".nan"), ("0x", "0x"), ("1__0", "10"), ("0_1", "1"),
    ("x1", "x1"), ("1e6", "1e+06"), ("123456789.0", "1.2345679e+08"), ("0.000001", "1e-06"),
]


@pytest.mark.parametrize("text, expected", VALUES, ids=[t or "empty" for t, _ in VALUES])
def test_a_plain_value_is_what_go_yaml_and_the_api_server_make_of_it(text, expected):
    [document] = bounded.load_yaml_documents(f"v: {text}\n", "doc.yaml")
    assert document == {"v": expected} and type(document["v"]) is type(expected)


@pytest.mark.parametrize("text, expected", KEYS, ids=[t for t, _ in KEYS])
def test_a_plain_key_is_the_text_kubectl_sends(text, expected):
    assert bounded.load_yaml_documents(f"{text}: x\n", "doc.yaml") == [{expected: "x"}]


@pytest.mark.parametrize("text, problem", [
    ("v: .nan\n", "v: nan cannot be sent as JSON"),
    ("v: -.inf\n", "v: -inf cannot be sent as JSON"),
    ("9223372036854775808: x\n", "unsupported map key of type uint64"),  # go-yaml's words
    ("~: x\n", "unsupported map key null"),
    ("a: &x [1, *x]\n", "the alias *x is inside the collection it names"),
    ("a: !!int y\n", "cannot read 'y' as int"),
    ("y: 1\ntrue: 2\n", "key 'true' is given twice in one mapping (first at line 1)"),
])
def test_what_kubectl_cannot_send_is_unreadable(text, problem):
    with pytest.raises(bounded.InputError) as error:
        bounded.load_yaml_documents(text, "doc.yaml")
    assert problem in str(error.value)


def test_quoted_scalars_stay_text_and_merges_let_the_mapping_win():
    assert bounded.load_yaml_documents("a: 'y'\nb: \"1e3\"\nc: &m {y: 1, z: 2}\nd:\n  <<: *m\n  y: 3\n", "d") == [
        {"a": "y", "b": "1e3", "c": {"true": 1, "z": 2}, "d": {"true": 3, "z": 2}}]


def test_the_json_round_trip_of_numbers():
    assert yamlgo.json_number(2.0) == 2 and type(yamlgo.json_number(2.0)) is int
    assert yamlgo.json_number(1.5) == 1.5
    assert yamlgo.json_number(2**63) == float(2**63)
    with pytest.raises(ValueError):
        yamlgo.json_number(math.nan)
