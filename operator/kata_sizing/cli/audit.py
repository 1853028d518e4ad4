"""`kata-sizing audit`: an existing kata-deploy install, or pods, against the rules."""

from __future__ import annotations

import argparse
import json
import sys

from ..core.bounded import InputError
from .common import EXIT_INVALID, EXIT_OK, load_policy_files, load_yaml_documents, print_problems

HELP = "check an existing kata-deploy install's values and RuntimeClasses"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("values", metavar="VALUES.yaml", nargs="?", help="kata-deploy Helm values ('-' for stdin)")
    parser.add_argument("--pods", metavar="PODS.yaml",
                        help="audit pods instead (kubectl get pods -A -o yaml) against --policy: the ones outside "
                             "their class's envelope or without a memory limit, with counts per class")
    parser.add_argument("--namespaces", metavar="NAMESPACES.yaml",
                        help="with --pods: the namespaces' labels (kubectl get namespaces -o yaml), for a "
                             "spec.admission.namespaces selector")
    parser.add_argument("runtime_classes", metavar="RUNTIMECLASSES.yaml", nargs="*",
                        help="live RuntimeClasses (kubectl get runtimeclass -o yaml); they win over the values")
    parser.add_argument("-o", "--output", choices=("text", "json"), default="text")
    parser.add_argument("--strict", action="store_true", help="exit 1 on warnings too")
    parser.add_argument("--policy", metavar="POLICY.yaml", action="append", default=[],
                        help="the policy that rendered (part of) the install: its classes are checked with "
                             "its own host overhead (repeatable)")


def run(args: argparse.Namespace) -> int:
    from ..core.audit import AuditError, audit_values, format_text, runtime_classes_from_documents

    if args.pods:
        return _audit_pods(args)
    if args.namespaces:
        raise InputError("--namespaces goes with --pods")
    if args.values is None:
        raise InputError("audit needs VALUES.yaml (a kata-deploy install) or --pods PODS.yaml --policy POLICY.yaml")
    documents = load_yaml_documents(args.values)
    if len(documents) != 1 or not isinstance(documents[0], dict):
        raise InputError(f"{args.values}: not a kata-deploy values file (one YAML mapping)")
    runtime_classes = []
    for path in args.runtime_classes:
        try:
            runtime_classes.extend(runtime_classes_from_documents(load_yaml_documents(path)))
        except AuditError as exc:
            raise InputError(f"{path}: {exc}") from None
    policies = load_policy_files(args.policy)
    report = audit_values(documents[0], runtime_classes, policies)
    if args.output == "json":
        print(json.dumps(report.as_dict(), indent=2))
    else:
        print_problems(report.notes, "note")
        sys.stdout.write(format_text(report))
    if report.errors or (args.strict and report.findings):
        return EXIT_INVALID
    return EXIT_OK


def _audit_pods(args: argparse.Namespace) -> int:
    """audit --pods: stored pods against their class (podfit, the admission policies' rule)."""
    from ..core.audit import AuditError
    from ..core.podaudit import audit_pods, format_pods_text, namespace_labels_from_documents, pods_from_documents

    if args.values is not None or args.runtime_classes:
        raise InputError("--pods audits pods against policies; give VALUES.yaml/RUNTIMECLASSES.yaml in a separate run")
    if not args.policy:
        raise InputError("--pods needs --policy POLICY.yaml (the classes the pods are held to)")
    policies = load_policy_files(args.policy)
    try:
        pods = pods_from_documents(load_yaml_documents(args.pods), args.pods)
        namespaces = (namespace_labels_from_documents(load_yaml_documents(args.namespaces), args.namespaces)
                      if args.namespaces else None)
        report = audit_pods(pods, policies, namespaces)
    except AuditError as exc:
        raise InputError(str(exc)) from None
    if args.output == "json":
        print(json.dumps(report.as_dict(), indent=2))
    else:
        sys.stdout.write(format_pods_text(report))
    if report.errors or (args.strict and report.findings):
        return EXIT_INVALID
    return EXIT_OK
