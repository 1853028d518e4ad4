"""`kata-sizing validate`: a policy against every rule."""

from __future__ import annotations

import argparse
import json

from ..core.model import PolicyError
from .common import EXIT_INVALID, EXIT_OK, load_policies, print_problems

HELP = "check a policy against every rule"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("policy", metavar="POLICY.yaml")
    parser.add_argument("--strict", action="store_true", help="treat warnings as errors")
    parser.add_argument("-o", "--output", choices=("text", "json"), default="text",
                        help="json: every problem with its rule id and fix")


def run(args: argparse.Namespace) -> int:
    from ..core.sizing import size_policy

    if args.output == "json":
        return _validate_json(args, size_policy)
    policies = load_policies(args.policy)
    errors: list[str] = []
    warnings: list[str] = []
    for policy in policies:
        sizing = size_policy(policy)
        errors.extend(f"{policy.name}: {p}" for p in sizing.errors)
        warnings.extend(f"{policy.name}: {p}" for p in sizing.warnings)
    if args.strict:
        errors.extend(f"{w} (--strict)" for w in warnings)
        warnings = []
    print_problems(warnings, "warning")
    if errors:
        print_problems(errors)
        return EXIT_INVALID
    names = ", ".join(p.name for p in policies)
    print(f"valid: {names}")
    return EXIT_OK


def _validate_json(args: argparse.Namespace, size_policy) -> int:
    """Every problem with its severity, rule id, path, message and fix (docs/rules.md)."""
    from ..core.rules import Problem, Rule, Severity

    try:
        policies = load_policies(args.policy)
    except PolicyError as exc:
        problems = [Problem(Severity.ERROR, Rule.POLICY_SCHEMA, path, message) for _, path, message in exc.located]
        print(json.dumps({"valid": False, "policies": [], "problems": [p.as_dict() for p in problems]}, indent=2))
        return EXIT_INVALID
    report, failed = [], False
    for policy in policies:
        problems = size_policy(policy).problems
        failed = failed or any(p.severity == Severity.ERROR or args.strict for p in problems)
        report.append({"name": policy.name, "problems": [p.as_dict() for p in problems]})
    print(json.dumps({"valid": not failed, "policies": report}, indent=2))
    return EXIT_INVALID if failed else EXIT_OK
