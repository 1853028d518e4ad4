"""Label and field selectors with the grammar and semantics of the Kubernetes API server."""
import re
from collections.abc import Callable, Mapping
from typing import Any

Matcher = Callable[[Mapping[str, Any]], bool]


class SelectorError(ValueError):
    """A selector the real API server would reject with 400 BadRequest."""


_SET_REQUIREMENT = re.compile(r'^\s*([^\s!=(),]+)\s+(in|notin)\s+\(([^)]*)\)\s*$')
_EQUALITY_REQUIREMENT = re.compile(r'^\s*([^\s!=(),]+)\s*(==|=|!=)\s*([^\s!=(),]*)\s*$')
_EXISTENCE_REQUIREMENT = re.compile(r'^\s*(!?)\s*([^\s!=(),]+)\s*$')


def _split_requirements(selector: str) -> list[str]:
    """Split on the commas that separate requirements, not on those inside ``in (a,b)``."""
    parts: list[str] = []
    depth = 0
    current = ''
    for char in selector:
        if char == '(':
            depth += 1
        elif char == ')':
            depth -= 1
        if char == ',' and depth == 0:
            parts.append(current)
            current = ''
        else:
            current += char
    parts.append(current)
    if depth != 0:
        raise SelectorError(f"unbalanced parentheses in selector {selector!r}")
    return [part for part in parts if part.strip()]


def _label_requirement(text: str) -> Callable[[Mapping[str, str]], bool]:
    if match := _SET_REQUIREMENT.match(text):
        key, operator, raw_values = match.groups()
        values = {value.strip() for value in raw_values.split(',') if value.strip()}
        if operator == 'in':
            return lambda labels: labels.get(key) in values
        return lambda labels: labels.get(key) not in values
    if match := _EQUALITY_REQUIREMENT.match(text):
        key, operator, value = match.groups()
        if operator == '!=':
            return lambda labels: labels.get(key) != value
        return lambda labels: key in labels and labels[key] == value
    if match := _EXISTENCE_REQUIREMENT.match(text):
        negated, key = match.groups()
        if negated:
            return lambda labels: key not in labels
        return lambda labels: key in labels
    raise SelectorError(f"unable to parse requirement: {text!r}")


def parse_label_selector(selector: str | None) -> Matcher:
    """Compile ``a=b,c!=d,e,!f,g in (x,y),h notin (z)`` into a predicate over objects."""
    if not selector:
        return lambda obj: True
    requirements = [_label_requirement(part) for part in _split_requirements(selector)]

    def matches(obj: Mapping[str, Any]) -> bool:
        labels = (obj.get('metadata') or {}).get('labels') or {}
        return all(requirement(labels) for requirement in requirements)
    return matches


def _field_value(obj: Mapping[str, Any], dotted_path: str) -> str | None:
    value: Any = obj
    for key in dotted_path.split('.'):
        if not isinstance(value, Mapping) or key not in value:
            return None
        value = value[key]
    return value if isinstance(value, str) else None if value is None else str(value)


def _field_requirement(path: str, equal: bool, expected: str) -> Matcher:
    return lambda obj: ((_field_value(obj, path) or '') == expected) == equal


def parse_field_selector(selector: str | None) -> Matcher:
    """Compile ``metadata.name=x,metadata.namespace!=y`` (any dotted path) into a predicate."""
    if not selector:
        return lambda obj: True
    requirements: list[Matcher] = []
    for part in _split_requirements(selector):
        match = _EQUALITY_REQUIREMENT.match(part)
        if not match:
            raise SelectorError(f"invalid field selector: {part!r}")
        path, operator, expected = match.groups()
        requirements.append(_field_requirement(path, operator != '!=', expected))
    return lambda obj: all(requirement(obj) for requirement in requirements)
