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


_NUMBER_TAGS = ("tag:yaml.org,2002:int", "tag:yaml.org,2002:float")
_resolver = yaml.resolver.Resolver()


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
            if (event.implicit[0] and len(event.value) > MAX_NUMBER_CHARS
                    and _resolver.resolve(yaml.ScalarNode, event.value, (True, False)) in _NUMBER_TAGS):
                raise InputError(f"{source}:{_where(event)} a number of {len(event.value)} characters; "
                                 f"numbers are at most {MAX_NUMBER_CHARS} (quote it if it is text)")
            if event.anchor is not None:
                anchors[event.anchor] = 1
            add(1, event)
        elif isinstance(event, yaml.AliasEvent):
            add(anchors.get(event.anchor, 1), event)


class _StrictLoader(_Loader):  # type: ignore[misc, valid-type]
    """Safe loading that refuses a key given twice in one mapping (YAML says keys are
    unique; PyYAML would keep the last one silently)."""

    def construct_mapping(self, node, deep=False):  # noqa: ANN001 - PyYAML's signature
        if isinstance(node, yaml.MappingNode):
            seen: dict[tuple[str, str], yaml.Node] = {}
            for key_node, _ in node.value:
                if not isinstance(key_node, yaml.ScalarNode) or key_node.value == "<<":
                    continue
                key = (key_node.tag, key_node.value)
                if key in seen:
                    first = seen[key].start_mark
                    raise yaml.constructor.ConstructorError(
                        None, None,
                        f"key {key_node.value!r} is given twice in one mapping (first at line {first.line + 1})",
                        key_node.start_mark)
                seen[key] = key_node
        return super().construct_mapping(node, deep=deep)


def load_yaml_documents(text: str, source: str) -> list[object]:
    """The non-empty documents of a YAML stream, bounded; `InputError` names the line."""
    check_size(text, source)
    try:
        _scan(text, source)
        return [doc for doc in yaml.load_all(text, Loader=_StrictLoader) if doc is not None]
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


_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f\x80-\x9f\u2028\u2029]")


def check_flag(option: str, text: str) -> str:
    """A CLI flag value: bounded and printable (a control character would forge output lines)."""
    if len(text) > MAX_FLAG_CHARS:
        raise InputError(f"{option}: {len(text)} characters; at most {MAX_FLAG_CHARS}")
    if _CONTROL.search(text) or "\n" in text or "\r" in text or "\t" in text:
        raise InputError(f"{option}: {text[:40]!r} holds control characters")
    return text
