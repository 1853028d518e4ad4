"""The one YAML writer: every YAML the project writes reads back as meant in Go.

kubectl, Helm and the API server read YAML through go-yaml, which resolves plain scalars by
YAML 1.1's rules and Go's number syntax (kustomize's kyaml by YAML 1.2's): a plain `y`, `n`,
`on`, `off`, `~`, `1e3`, `1e-3`, `0o17`, `0x1f`, `.inf`, `1_000`, `1:20` or `2024-01-02` is
a boolean, a null, a number or a timestamp there, so a label value `y` becomes `true` and a
policy named `n` makes every object unreadable ("cannot unmarshal bool into ... labels of type
string"). PyYAML's own resolver knows most of these but not `y`/`n`, Go's exponent without a
dot, or `0o`: this writer quotes every string that any of those readers would take for
something else (`reads_as_string_in_go` is the rule), and writes multi-line text as a literal
block. docs/outputs.md lists where the writer is used.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

import yaml

_Dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)  # libyaml's emitter: same text, 5x faster

# go-yaml v2 (gopkg.in/yaml.v2 resolve.go, as sigs.k8s.io/yaml vendors it) reads these plain
# scalars as booleans, nulls and the special floats; YAML 1.2 readers as well for the ones
# they know.
_GO_WORDS = frozenset({
    "y", "Y", "yes", "Yes", "YES", "n", "N", "no", "No", "NO",
    "true", "True", "TRUE", "false", "False", "FALSE", "on", "On", "ON", "off", "Off", "OFF",
    "~", "null", "Null", "NULL", "",
    ".inf", ".Inf", ".INF", "+.inf", "+.Inf", "+.INF", "-.inf", "-.Inf", "-.INF", ".nan", ".NaN", ".NAN",
})
# A plain scalar starting with one of these goes through go-yaml's number parsing: with every
# "_" removed, strconv.ParseInt/ParseUint in base 0 (0x, 0o, 0b and leading-0 octal included)
# or, matching go-yaml's float pattern, strconv.ParseFloat.
_NUMBER_START = frozenset("+-.0123456789")
_GO_INTEGER = re.compile(r"[-+]?(?:0[xX][0-9a-fA-F]+|0[oO][0-7]+|0[bB][01]+|[0-9]+)")
_GO_FLOAT = re.compile(r"[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?")
# YAML 1.1's sexagesimal numbers and timestamps (PyYAML's resolver and go-yaml's parseTimestamp).
_SEXAGESIMAL = re.compile(r"[-+]?[0-9][0-9_]*(?::[0-5]?[0-9])+(?:\.[0-9_]*)?")
_TIMESTAMP = re.compile(r"[0-9]{4}-[0-9]{1,2}-[0-9]{1,2}(?:[Tt \t].*)?")


def reads_as_string_in_go(text: str) -> bool:
    """Whether a plain (unquoted) `text` reads back as this string in go-yaml, kyaml and PyYAML."""
    if text in _GO_WORDS:
        return False
    if text[0] not in _NUMBER_START:
        return True
    plain = text.replace("_", "")
    return not (_GO_INTEGER.fullmatch(plain) or _GO_FLOAT.fullmatch(plain)
                or _SEXAGESIMAL.fullmatch(text) or _TIMESTAMP.fullmatch(text))


class _ReadsAsNonString:
    """An implicit resolver pattern (PyYAML calls `.match(value)`): a string Go would not read
    as this string is resolved to a non-string tag here, so the emitter quotes it."""

    def match(self, value: str) -> bool:
        return not reads_as_string_in_go(value)


class _GoSafeDumper(_Dumper):
    pass


# Consulted after PyYAML's own resolvers (which quote the rest, the empty string included).
_GoSafeDumper.add_implicit_resolver(
    "tag:yaml.org,2002:bool", _ReadsAsNonString(), sorted({w[0] for w in _GO_WORDS if w} | _NUMBER_START))


def _literal_block_allowed(text: str) -> bool:
    return "\n" in text and all(line == line.rstrip() for line in text.split("\n"))


def _represent_str(dumper: yaml.SafeDumper, text: str) -> yaml.Node:
    if _literal_block_allowed(text):
        return dumper.represent_scalar("tag:yaml.org,2002:str", text, style="|")
    return dumper.represent_scalar("tag:yaml.org,2002:str", text)


_GoSafeDumper.add_representer(str, _represent_str)


def _comment_lines(comments: Sequence[str]) -> str:
    return "".join(f"# {line}\n" if line else "#\n" for line in comments)


def dump(value: object, comments: Sequence[str] = (), width: int | None = None) -> str:
    """One YAML document, after `comments` (each a `# ` line)."""
    text = yaml.dump(value, Dumper=_GoSafeDumper, sort_keys=False, width=width)
    return _comment_lines(comments) + text


def dump_documents(objects: Iterable[object]) -> str:
    """Several documents, each starting with `---` (what `kubectl apply -f` takes)."""
    return yaml.dump_all(list(objects), Dumper=_GoSafeDumper, sort_keys=False, explicit_start=True)
