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

import re
from collections.abc import Iterable, Sequence
from functools import lru_cache

import yaml

from . import yamlgo

_Dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)  # libyaml's emitter: same text, 5x faster
_pyyaml = yaml.resolver.Resolver()


@lru_cache(maxsize=4096)  # the same label values, names and keys are written again and again
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
    text = _simple_document(value) if width is None else None
    if text is None:
        text = yaml.dump(value, Dumper=_GoSafeDumper, sort_keys=False, width=width)
    return _comment_lines(comments) + text


def dump_documents(objects: Iterable[object]) -> str:
    """Several documents, each starting with `---` (what `kubectl apply -f` takes)."""
    objects = list(objects)
    texts = [_simple_document(o) for o in objects]
    if objects and all(t is not None for t in texts):
        return "".join(f"---\n{t}" for t in texts)
    return yaml.dump_all(objects, Dumper=_GoSafeDumper, sort_keys=False, explicit_start=True)


# --- the same text, written directly --------------------------------------------------------------
#
# Most of what the operator writes (its objects' texts, the values overlay with its drop-ins) is
# mappings and lists of names, numbers and multi-line text; PyYAML's representer, resolver and
# emitter were two thirds of rendering a policy (docs/performance.md). `_simple_document` writes
# such a document as PyYAML writes it, character for character, and gives up (None: PyYAML writes
# it) at anything else: a string that would be quoted, folded or written with a block indicator,
# a float, a key PyYAML would write as a complex key. tests/unit/test_yamlout.py holds the two to
# the same text on generated documents.

_BEST_WIDTH = 80  # PyYAML's: a plain scalar longer than this is folded at a space
_PLAIN = re.compile(r"[A-Za-z0-9_./][A-Za-z0-9_./=+@-]*(?: [A-Za-z0-9_./=+@-]+)*\Z")
_LITERAL = re.compile(r"[\x21-\x7e][\x20-\x7e\n]*\Z")  # printable ASCII, not starting with a space


class _NotSimple(Exception):
    """PyYAML would write something this writer does not: it writes the document."""


def _simple_document(value: object) -> str | None:
    out: list[str] = []
    try:
        if type(value) is dict and value:
            _mapping(value, 0, out)
        elif type(value) is list and value:
            _sequence(value, 0, out)
        else:
            return None
    except _NotSimple:
        return None
    return "".join(out)


def _plain(text: str, column: int) -> str:
    """A name or words as PyYAML writes them at `column`: plain, or in single quotes when plain it
    would read as something else (`reads_as_string_in_go`) or start a document end marker."""
    if not text:
        return "''"
    if not _PLAIN.match(text) or " " in text and column + len(text) + 2 > _BEST_WIDTH:
        raise _NotSimple
    if text.startswith("...") or not reads_as_string_in_go(text):
        return f"'{text}'"
    return text


def _scalar(value: object, column: int) -> str:
    kind = type(value)
    if kind is str:
        return _plain(value, column)  # type: ignore[arg-type]
    if kind is bool:
        return "true" if value else "false"
    if kind is int:
        return str(value)
    if value is None:
        return "null"
    raise _NotSimple


def _literal(text: str, indent: int) -> str:
    """A multi-line text as a literal block (`_represent_str`), its lines at `indent`."""
    if not _LITERAL.match(text) or text.endswith("\n\n") or not _literal_block_allowed(text):
        raise _NotSimple
    header, body = ("|", text[:-1]) if text.endswith("\n") else ("|-", text)
    pad = " " * indent
    return header + "\n" + "".join(f"{pad}{line}\n" if line else "\n" for line in body.split("\n"))


def _mapping(mapping: dict, indent: int, out: list[str]) -> None:
    pad = " " * indent
    for key, value in mapping.items():
        if type(key) is not str or len(key) > 120 or " " in key:
            raise _NotSimple
        head = f"{pad}{_plain(key, indent)}:"
        kind = type(value)
        if kind is dict:
            if value:
                out.append(head + "\n")
                _mapping(value, indent + 2, out)
            else:
                out.append(head + " {}\n")
        elif kind is list:
            if value:
                out.append(head + "\n")
                _sequence(value, indent, out)  # PyYAML's lists in a mapping are not indented
            else:
                out.append(head + " []\n")
        elif kind is str and "\n" in value:
            out.append(head + " " + _literal(value, indent + 2))
        else:
            out.append(f"{head} {_scalar(value, len(head) + 1)}\n")


def _sequence(items: list, indent: int, out: list[str]) -> None:
    pad = " " * indent
    for item in items:
        kind = type(item)
        if kind is dict and item:
            start = len(out)
            _mapping(item, indent + 2, out)
            out[start] = f"{pad}- {out[start][indent + 2:]}"
        elif kind is dict:
            out.append(f"{pad}- {{}}\n")
        elif kind is list:
            if item:
                raise _NotSimple
            out.append(f"{pad}- []\n")
        elif kind is str and "\n" in item:
            raise _NotSimple
        else:
            out.append(f"{pad}- {_scalar(item, indent + 2)}\n")
