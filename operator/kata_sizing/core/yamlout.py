"""The one YAML writer: every YAML the project writes reads back as meant in Go.

kubectl, Helm and the API server read YAML through go-yaml, which resolves plain scalars by
YAML 1.1's rules and Go's number syntax (kustomize's kyaml by YAML 1.2's): a plain `y`, `n`,
`on`, `off`, `~`, `1e3`, `1e-3`, `0o17`, `0x1f`, `.inf`, `1_000`, `1:20` or `2024-01-02` is
a boolean, a null, a number or a timestamp there, so a label value `y` becomes `true` and a
policy named `n` makes every object unreadable ("cannot unmarshal bool into ... labels of type
string"). PyYAML's own resolver knows most of these but not `y`/`n`, Go's exponent without a
dot, or `0o`: this writer quotes every string that either would take for something else
(`reads_as_string_in_go`, on go-yaml's own resolution in `yamlgo`), and writes multi-line text as
a literal block. docs/outputs.md lists where the writer is used.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import yaml

from . import yamlgo

_Dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)  # libyaml's emitter: same text, 5x faster
_pyyaml = yaml.resolver.Resolver()


def reads_as_string_in_go(text: str) -> bool:
    """Whether a plain (unquoted) `text` reads back as this string in go-yaml v2 (yamlgo.resolve,
    the rule kubectl, Helm and the API server read by) and in PyYAML."""
    if yamlgo.resolve(text)[0] != yamlgo.STR_TAG:
        return False
    return _pyyaml.resolve(yaml.ScalarNode, text, (True, False)) == yamlgo.STR_TAG


class _ReadsAsNonString:
    """An implicit resolver pattern (PyYAML calls `.match(value)`): a string Go would not read
    as this string is resolved to a non-string tag here, so the emitter quotes it."""

    def match(self, value: str) -> bool:
        return not reads_as_string_in_go(value)


class _GoSafeDumper(_Dumper):  # type: ignore[misc, valid-type]  # the C or the Python dumper, chosen at import
    pass


# Consulted after PyYAML's own resolvers (which quote the empty string). go-yaml resolves a plain
# scalar to something else than a string only when it starts with one of these characters.
_GoSafeDumper.add_implicit_resolver("tag:yaml.org,2002:bool", _ReadsAsNonString(), list("yYnNtTfFoO~+-.0123456789<"))


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
