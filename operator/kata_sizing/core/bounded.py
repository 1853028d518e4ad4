"""Bounds on everything that enters from outside: files, stdin, CR bodies, AdmissionReviews,
values files, RuntimeClass lists and CLI flags (docs/inputs.md; the survey CSV's own row and
cell bounds are in calibrate.py).

A policy is a few kilobytes; these bounds are far above any real input and far below what
would exhaust memory or time. YAML is scanned event by event before any object is built,
so an alias bomb ("billion laughs") or a deep nest is refused while it is still text.
Pure: text in, objects or an `InputError` out.
"""

from __future__ import annotations

import json
import re

import yaml

from . import yamlgo

_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

# A kata-deploy values file with every shim is ~40 KiB, `kubectl get runtimeclass -o yaml`
# of a hundred classes ~300 KiB; 4 MiB leaves room and still parses in about a second.
MAX_INPUT_BYTES = 4 * 1024 * 1024
MAX_DEPTH = 64
# Nodes after alias expansion: what a consumer walking the document would visit.
MAX_NODES = 200_000
MAX_STRING_CHARS = 256 * 1024
# Digits of a number written without quotes; 2^63-1 has 19.
MAX_NUMBER_CHARS = 40
MAX_FLAG_CHARS = 256


class InputError(Exception):
    """Input that cannot be read at all: too large, too deep, not the format."""


def check_size(text: str | bytes, source: str) -> None:
    size = len(text.encode("utf-8", "surrogatepass") if isinstance(text, str) else text)
    if size > MAX_INPUT_BYTES:
        raise InputError(f"{source}: {size} bytes is larger than the {MAX_INPUT_BYTES // (1024 * 1024)} MiB "
                         "kata-sizing reads")


# What go-yaml tries to read as a number (yamlgo.resolve), whatever its range: a plain scalar
# this long is refused before any parser sees its digits.
# (One way to match each text: no nested or adjacent quantifiers that backtrack on 4 MiB.)
_NUMERIC = re.compile(r"[-+]?(?:(?:[0-9_]+(?:\.[0-9_]*)?|\.[0-9_]+)(?:[eE][-+]?[0-9_]+)?|0[xXoObB][0-9a-fA-F_]*)",
                      re.ASCII)


def _where(event: yaml.Event) -> str:
    mark = event.start_mark
    return f" line {mark.line + 1}, column {mark.column + 1}:" if mark else ""


def _scan(text: str, source: str) -> None:
    """Depth, expanded size, string and number lengths, from the parser's events."""
    anchors: dict[str, int] = {}
    stack: list[list] = []  # [anchor, nodes so far]
    total = 0

    def add(count: int, event: yaml.Event) -> None:
        nonlocal total
        total += count
        if stack:
            stack[-1][1] += count
        if total > MAX_NODES:
            raise InputError(f"{source}:{_where(event)} expands to more than {MAX_NODES} YAML nodes "
                             "(aliases included); kata-sizing does not read documents this large")

    for event in yaml.parse(text, Loader=_Loader):
        if isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
            stack.append([event.anchor, 0])
            if len(stack) > MAX_DEPTH:
                raise InputError(f"{source}:{_where(event)} nests deeper than {MAX_DEPTH} levels")
        elif isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
            anchor, count = stack.pop()
            if anchor is not None:
                anchors[anchor] = count + 1
            # The collection's own node; its children were counted as they came.
            add(1, event)
            if stack:
                stack[-1][1] += count
        elif isinstance(event, yaml.ScalarEvent):
            if len(event.value) > MAX_STRING_CHARS:
                raise InputError(f"{source}:{_where(event)} a string of {len(event.value)} characters is "
                                 f"longer than the {MAX_STRING_CHARS} kata-sizing reads")
            if event.implicit[0] and len(event.value) > MAX_NUMBER_CHARS and _NUMERIC.fullmatch(event.value):
                raise InputError(f"{source}:{_where(event)} a number of {len(event.value)} characters; "
                                 f"numbers are at most {MAX_NUMBER_CHARS} (quote it if it is text)")
            if event.anchor is not None:
                anchors[event.anchor] = 1
            add(1, event)
        elif isinstance(event, yaml.AliasEvent):
            if any(anchor == event.anchor for anchor, _ in stack):
                # go-yaml (kubectl) refuses a collection that contains itself.
                raise InputError(f"{source}:{_where(event)} the alias *{event.anchor} is inside the collection it "
                                 "names (a document that contains itself)")
            add(anchors.get(event.anchor, 1) if event.anchor is not None else 1, event)


class _GoLoader(_Loader):  # type: ignore[misc, valid-type]
    """Safe loading that reads plain scalars as go-yaml v2 does and converts keys as kubectl
    does (yamlgo), and refuses a key given twice in one mapping (YAML says keys are unique;
    PyYAML and go-yaml would keep the last one silently)."""

    def resolve(self, kind, value, implicit):  # noqa: ANN001 - PyYAML's signature
        if kind is yaml.ScalarNode and implicit[0]:
            return yamlgo.resolve(value)[0]
        return super().resolve(kind, value, implicit)

    def construct_go_scalar(self, node: yaml.ScalarNode) -> object:
        text = self.construct_scalar(node)
        tag, value = yamlgo.resolve(text)
        if tag == node.tag:
            return value
        if node.tag == yamlgo.FLOAT_TAG and tag == yamlgo.INT_TAG:
            assert isinstance(value, int)  # yamlgo resolves INT_TAG to an int
            return float(value)
        # An explicit tag the text does not fit (go-yaml: "cannot decode !!str `x` as a !!int").
        raise yaml.constructor.ConstructorError(
            None, None, f"cannot read {text[:40]!r} as {node.tag.rsplit(':', 1)[-1]}", node.start_mark)

    def _key(self, key_node: yaml.Node) -> str:
        try:
            return yamlgo.key_text(self.construct_object(key_node, deep=True))
        except (ValueError, TypeError) as exc:
            raise yaml.constructor.ConstructorError(None, None, str(exc), key_node.start_mark) from None

    def construct_mapping(self, node, deep=False):  # noqa: ANN001 - PyYAML's signature
        if not isinstance(node, yaml.MappingNode):
            return super().construct_mapping(node, deep=deep)
        seen: dict[str, yaml.Node] = {}
        for key_node, _ in node.value:
            if key_node.tag == yamlgo.MERGE_TAG:
                continue
            key = self._key(key_node)
            if key in seen:
                first = seen[key].start_mark
                raise yaml.constructor.ConstructorError(
                    None, None, f"key {key!r} is given twice in one mapping (first at line {first.line + 1})",
                    key_node.start_mark)
            seen[key] = key_node
        self.flatten_mapping(node)  # merged keys first, so the mapping's own keys win, as in Go
        return {self._key(key_node): self.construct_object(value_node, deep=deep)
                for key_node, value_node in node.value}


for _tag in (yamlgo.BOOL_TAG, yamlgo.INT_TAG, yamlgo.FLOAT_TAG, yamlgo.NULL_TAG):
    _GoLoader.add_constructor(_tag, _GoLoader.construct_go_scalar)
# `<<` as a value (not a key) is the text "<<" to go-yaml.
_GoLoader.add_constructor(yamlgo.MERGE_TAG, _GoLoader.construct_scalar)


def _as_sent(document: object, source: str) -> object:
    """Numbers as the API server holds them after kubectl's JSON round trip (yamlgo.json_number);
    NaN and infinities, which JSON cannot carry, are refused with their path."""

    def number(value: int | float, path: str) -> int | float:
        try:
            return yamlgo.json_number(value)
        except ValueError:
            raise InputError(f"{source}: {path or '(document)'}: {value!r} cannot be sent as JSON (kubectl: "
                             "\"json: unsupported value\"); quote it if it is text") from None

    if not isinstance(document, (dict, list)):
        if isinstance(document, (int, float)) and not isinstance(document, bool):
            return number(document, "")
        return document
    pending: list[tuple[dict | list, str]] = [(document, "")]
    seen: set[int] = set()  # an alias shares its collection: each is converted once
    while pending:
        value, path = pending.pop()
        if id(value) in seen:
            continue
        seen.add(id(value))
        items = list(value.items()) if isinstance(value, dict) else list(enumerate(value))
        for key, item in items:
            where = f"{path}[{key}]" if isinstance(key, int) else f"{path}.{key}" if path else str(key)
            if isinstance(item, (dict, list)):
                pending.append((item, where))
            elif isinstance(item, (int, float)) and not isinstance(item, bool):
                value[key] = number(item, where)
    return document


def load_yaml_documents(text: str, source: str) -> list[object]:
    """The non-empty documents of a YAML stream, bounded and read as kubectl reads them
    (yamlgo); `InputError` names the line."""
    check_size(text, source)
    try:
        _scan(text, source)
        return [_as_sent(doc, source) for doc in yaml.load_all(text, Loader=_GoLoader) if doc is not None]
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}, column {mark.column + 1}:" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise InputError(f"{source}:{where} not valid YAML: {problem}") from None
    except (ValueError, RecursionError, OverflowError) as exc:
        # PyYAML's int() of a long sexagesimal, a date out of range, ...
        raise InputError(f"{source}: not readable YAML: {str(exc).splitlines()[0][:200]}") from None


def load_json(text: str | bytes, source: str, walk: bool = True) -> object:
    """JSON, bounded like YAML (JSON is YAML, but json is faster and exact for numbers).

    `walk=False` skips check_structure, for documents read over and over whose size bound is
    enough (kubelet Summaries, a few hundred KiB each): json itself refuses nesting past the
    interpreter's recursion limit and integers past its digit limit, and no string or node
    count can exceed MAX_INPUT_BYTES."""
    check_size(text, source)
    try:
        document = json.loads(text, parse_constant=_refuse_constant)
    except (ValueError, RecursionError) as exc:
        # ValueError covers JSONDecodeError and an integer past Python's digit limit.
        raise InputError(f"{source}: not valid JSON: {str(exc).splitlines()[0][:200]}") from None
    if walk:
        check_structure(document, source)
    return document


def _refuse_constant(name: str) -> float:
    raise ValueError(f"{name} is not JSON")


def check_structure(document: object, source: str) -> None:
    """Depth, size, string length and integer digits of an already-parsed document (a CR
    body from the API server, a review): the same bounds as YAML text gets."""
    nodes = 0
    pending: list[tuple[object, int]] = [(document, 1)]
    while pending:
        value, depth = pending.pop()
        nodes += 1
        if nodes > MAX_NODES:
            raise InputError(f"{source}: more than {MAX_NODES} nodes")
        if depth > MAX_DEPTH:
            raise InputError(f"{source}: nests deeper than {MAX_DEPTH} levels")
        if isinstance(value, dict):
            for key, item in value.items():
                if isinstance(key, str) and len(key) > MAX_STRING_CHARS:
                    raise InputError(f"{source}: a key of {len(key)} characters")
                pending.append((item, depth + 1))
        elif isinstance(value, list):
            pending.extend((item, depth + 1) for item in value)
        elif isinstance(value, str) and len(value) > MAX_STRING_CHARS:
            raise InputError(f"{source}: a string of {len(value)} characters is longer than {MAX_STRING_CHARS}")
        elif isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 128:
            raise InputError(f"{source}: an integer of {value.bit_length()} bits; numbers are at most 128 bits")


def printable(text: str) -> str:
    """Text for a line of a text report: every character that does not print (control
    characters, terminal escapes, line separators, bidi overrides) as its escape, so a pod
    named "a\\nerror: ..." cannot forge a line of the report."""
    if text.isprintable():
        return text
    return "".join(char if char.isprintable() else repr(char)[1:-1] for char in text)


_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f\x80-\x9f\u2028\u2029]")


def check_flag(option: str, text: str) -> str:
    """A CLI flag value: bounded and printable (a control character would forge output lines)."""
    if len(text) > MAX_FLAG_CHARS:
        raise InputError(f"{option}: {len(text)} characters; at most {MAX_FLAG_CHARS}")
    if _CONTROL.search(text) or "\n" in text or "\r" in text or "\t" in text:
        raise InputError(f"{option}: {text[:40]!r} holds control characters")
    return text
