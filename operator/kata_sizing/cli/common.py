"""What several commands share: reading input files (bounded), the policies in them, checked
flag values, exit codes."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from typing import TypeVar, overload

from ..core import bounded
from ..core.bounded import InputError
from ..core.model import KataSizingPolicy, PolicyError, parse_policy, policy_set_problems
from ..core.quantity import QuantityError

T = TypeVar("T")

# Exit codes: 0 ok, 1 the policy (or the audited install) breaks a rule, 2 the input cannot be read.
EXIT_OK = 0
EXIT_INVALID = 1
EXIT_UNREADABLE = 2


def read_text(path: str) -> str:
    """A whole input file (or stdin for '-'), refused past bounded.MAX_INPUT_BYTES."""
    limit = bounded.MAX_INPUT_BYTES
    try:
        if path == "-":
            data = sys.stdin.buffer.read(limit + 1) if hasattr(sys.stdin, "buffer") else \
                sys.stdin.read(limit + 1).encode("utf-8", "surrogatepass")
        else:
            with open(path, "rb") as handle:
                data = handle.read(limit + 1)
        bounded.check_size(data, path)
        return data.decode("utf-8")
    except (OSError, ValueError) as exc:
        raise unreadable(path, exc) from None


def unreadable(path: str, exc: OSError | ValueError) -> InputError:
    """One line for a file that cannot be read, whatever the reason."""
    if isinstance(exc, FileNotFoundError):
        return InputError(f"{path}: no such file")
    if isinstance(exc, IsADirectoryError):
        return InputError(f"{path}: is a directory, not a file")
    if isinstance(exc, PermissionError):
        return InputError(f"{path}: permission denied")
    if isinstance(exc, UnicodeDecodeError):
        return InputError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})")
    return InputError(f"{path}: cannot read ({getattr(exc, 'strerror', None) or exc})")


def load_yaml_documents(path: str) -> list[object]:
    documents = bounded.load_yaml_documents(read_text(path), path)
    if not documents:
        raise InputError(f"{path}: holds no YAML document")
    return documents


def load_policies(path: str) -> list[KataSizingPolicy]:
    """Every KataSizingPolicy in a file; all problems of all documents in one PolicyError."""
    return load_policy_files([path])


def load_policy_files(paths: Sequence[str]) -> list[KataSizingPolicy]:
    """The policies of several files, applied together: each document parsed, then the set
    checked (model.policy_set_problems); one file given twice counts once."""
    loaded: list[tuple[str, KataSizingPolicy]] = []
    located: list[tuple[str, str, str]] = []
    for path in dict.fromkeys(paths):
        documents = load_yaml_documents(path)
        for index, document in enumerate(documents):
            where = f"{path}" + (f" (document {index + 1})" if len(documents) > 1 else "")
            if isinstance(document, dict) and document.get("kind") not in (None, "KataSizingPolicy"):
                located.append((where, "kind", f"{document.get('kind')!r} is not KataSizingPolicy"))
                continue
            try:
                loaded.append((where, parse_policy(document)))
            except PolicyError as exc:
                located.extend((where, *entry[1:]) for entry in exc.located)
    located.extend(policy_set_problems(loaded))
    if located:
        raise PolicyError.at(located)
    return [policy for _, policy in loaded]


def print_problems(lines: Sequence[str], prefix: str = "error") -> None:
    for line in lines:
        print(f"{prefix}: {bounded.printable(line)}", file=sys.stderr)


def checked_flag(option: str, text: str | None) -> str | None:
    """A flag's value, bounded in length and free of control characters."""
    if text is None:
        return None
    try:
        return bounded.check_flag(option, text)
    except InputError as exc:
        raise PolicyError([str(exc)]) from None


@overload
def quantity_flag(option: str, text: str, parse: Callable[[str], T]) -> T: ...
@overload
def quantity_flag(option: str, text: str | None, parse: Callable[[str], T]) -> T | None: ...
def quantity_flag(option: str, text: str | None, parse: Callable[[str], T]) -> T | None:
    checked = None if text is None else checked_flag(option, text)
    if checked is None:
        return None
    try:
        return parse(checked)
    except QuantityError as exc:
        raise PolicyError([f"{option}: {exc}"]) from None


def kubelet_version_flag(text: str | None) -> str | None:
    from ..core.guidance import kubelet_minor

    if checked_flag("--kubelet-version", text) is not None and kubelet_minor(text) is None:
        raise PolicyError([f"--kubelet-version: {text!r} is not a Kubernetes version (examples: v1.37.2, 1.36.4)"])
    return text


def policy_path(args: argparse.Namespace) -> str:
    """POLICY.yaml, given as the positional argument or with --policy."""
    given = [p for p in (args.policy, args.policy_file) if p]
    if len(given) != 1:
        raise InputError("give the policy file once: POLICY.yaml or --policy POLICY.yaml")
    return given[0]


def chosen_policy(args: argparse.Namespace, path: str) -> KataSizingPolicy:
    policies = load_policies(path)
    if len(policies) > 1 and not args.policy_name:
        names = ", ".join(p.name for p in policies)
        raise PolicyError([f"{path} holds several policies ({names}); pick one with --policy-name"])
    if args.policy_name:
        chosen = [p for p in policies if p.name == args.policy_name]
        if not chosen:
            raise PolicyError([f"--policy-name: no policy {args.policy_name!r} in {path}"])
        return chosen[0]
    return policies[0]


def sized_policy(args: argparse.Namespace, most_timeout_s: float):
    """The policy `survey` and `probe` measure, sized (an invalid one refused), after their --timeout."""
    from ..core.sizing import size_policy

    if not 0 < args.timeout <= most_timeout_s:
        raise InputError(f"--timeout: {args.timeout:g} is not a number of seconds above 0 and at most {most_timeout_s:g}")
    policy = chosen_policy(args, args.policy)
    sizing = size_policy(policy)
    if sizing.errors:
        raise PolicyError([str(p) for p in sizing.errors])
    return policy, sizing
