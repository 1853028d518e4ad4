"""`kata-sizing explain`: the VM Kata boots for a pod, and what Kubernetes accounts."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping
from decimal import Decimal

from ..core import bounded
from ..core.bounded import InputError
from ..core.model import PolicyError
from ..core.quantity import cpu_cores, memory_bytes
from .common import EXIT_INVALID, EXIT_OK, checked_flag, chosen_policy, load_yaml_documents, policy_path, quantity_flag

HELP = "the VM Kata boots for a pod, and what Kubernetes accounts"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("policy", metavar="POLICY.yaml", nargs="?")
    parser.add_argument("--policy", dest="policy_file", metavar="POLICY.yaml", help="the policy (instead of POLICY.yaml)")
    parser.add_argument("--class", dest="class_name")
    parser.add_argument("--pod", metavar="POD.yaml",
                        help="a Pod or workload (Deployment, StatefulSet, DaemonSet, Job, CronJob...): the class it "
                             "lands in, its VM, what Kubernetes accounts and what admission says")
    parser.add_argument("--namespace-label", action="append", default=[], metavar="KEY=VALUE",
                        help="a label of the pod's namespace (for spec.admission.namespaces and routing)")
    parser.add_argument("--cpu", help="the pod's CPU limit, e.g. 1.5 or 1500m")
    parser.add_argument("--memory", help="the pod's memory limit, e.g. 600Mi")
    parser.add_argument("--policy-name", help="which policy, when the file holds several")
    parser.add_argument("-o", "--output", choices=("text", "json"), default="text")


def _namespace_labels(args: argparse.Namespace) -> dict[str, str] | None:
    from ..core.kubegrammar import label_key_problem, label_value_problem

    if not args.namespace_label:
        return None
    labels = {}
    for text in args.namespace_label:
        checked_flag("--namespace-label", text)
        key, sep, value = text.partition("=")
        problem = (None if sep else f"{text!r} is not KEY=VALUE") or label_key_problem(key) or label_value_problem(value)
        if problem:
            raise PolicyError([f"--namespace-label: {problem}"])
        labels[key] = value
    return labels


def run(args: argparse.Namespace) -> int:
    from ..core.sizing import SandboxRefused, explain_pod, size_policy

    checked_flag("--class", args.class_name)
    checked_flag("--policy-name", args.policy_name)
    if args.pod:
        return _explain_pods(args)
    if args.class_name is None:
        raise InputError("explain needs --class (with --cpu/--memory) or --pod POD.yaml")
    args.policy = policy_path(args)
    policy = chosen_policy(args, args.policy)
    sizing = size_policy(policy)
    if sizing.errors:
        raise PolicyError([str(p) for p in sizing.errors])
    cpu = quantity_flag("--cpu", args.cpu, cpu_cores)
    memory = quantity_flag("--memory", args.memory, memory_bytes)
    try:
        explanation = explain_pod(sizing, args.class_name, cpu, memory)
    except KeyError as exc:
        raise PolicyError([f"--class: {exc.args[0]}"]) from None
    except SandboxRefused as exc:
        print(f"error: Kata refuses this pod: {exc}", file=sys.stderr)
        return EXIT_INVALID
    if args.output == "json":
        print(json.dumps(explanation.as_dict(), indent=2))
        return EXIT_OK
    sized = sizing.class_named(args.class_name)
    data = explanation.as_dict()
    limits = ", ".join(filter(None, [
        f"cpu {args.cpu}" if args.cpu else None, f"memory {args.memory}" if args.memory else None,
    ])) or "no limits"
    print(f"pod with {limits} on RuntimeClass {sized.runtime_class} ({sizing.runtime.value} runtime)")
    print(f"  VM Kata boots:        {data['vm']['vcpus']} vCPUs, {data['vm']['memoryMiB']} MiB")
    print(f"  Kubernetes accounts:  cpu {data['accounted']['cpu']}, memory {data['accounted']['memory']}"
          f" (limits + podFixed {sized.pod_fixed['cpu']}/{sized.pod_fixed['memory']})")
    for warning in data["warnings"]:
        print(f"  warning: {warning}")
    return EXIT_OK


def _explain_pods(args: argparse.Namespace) -> int:
    """explain --pod: the class each pod lands in, its VM, what Kubernetes accounts and what the
    admission policies say (podfit, the rule the API server runs as CEL)."""
    from ..core import podfit, podread
    from ..core.sizing import SandboxRefused, explain_pod, size_policy

    if args.class_name or args.cpu or args.memory:
        raise InputError("--pod takes the class and limits from the pod; drop --class/--cpu/--memory")
    path = policy_path(args)
    policy = chosen_policy(args, path)
    sizing = size_policy(policy)
    if sizing.errors:
        raise PolicyError([str(p) for p in sizing.errors])
    namespace_labels = _namespace_labels(args)
    documents = [d for d in load_yaml_documents(args.pod) if d is not None]
    reports, refused = [], False
    for index, document in enumerate(documents):
        where = args.pod + (f" (document {index + 1})" if len(documents) > 1 else "")
        try:
            spec = podread.pod_spec_of(document)
            limits = podread.pod_limits(spec)
            metadata = podread.pod_metadata_of(document)
        except podread.PodInputError as exc:
            raise InputError(f"{where}: {exc}") from None
        assert isinstance(document, Mapping)  # pod_spec_of refuses anything else
        namespace = str(metadata.get("namespace") or "default")
        name = str(metadata.get("name") or metadata.get("generateName") or "")
        runtime_class = spec.get("runtimeClassName") or ""
        routed = False
        scoped = policy.spec.admission.enabled and podfit.in_scope(policy, namespace, namespace_labels)
        if not runtime_class and scoped and podfit.opted_in(metadata, policy.name, namespace_labels):
            fit = podfit.route(limits, sizing)
            if fit is not None:
                runtime_class, routed = fit.runtime_class, True
        findings = podfit.check_pod(document, sizing, namespace_labels, routed=True)
        denied = [f for f in findings if f.action == "Deny"]
        sized = next((c for c in sizing.classes if c.runtime_class == runtime_class), None)
        report = {
            "pod": {"kind": document.get("kind") or "Pod", "namespace": namespace, "name": name},
            "policy": policy.name,
            "limits": limits.as_dict(),
            "runtimeClass": runtime_class or None,
            "routed": routed,
            "class": sized.name if sized else None,
            "smallestFit": (lambda fit: fit.runtime_class if fit else None)(podfit.route(limits, sizing)),
            "admission": {"allowed": not denied, "inScope": bool(scoped),
                          "findings": [f.as_dict() for f in findings]},
        }
        if sized is not None:
            cpu = Decimal(limits.cpu_millis) / 1000 if limits.cpu_millis is not None else None
            try:
                explanation = explain_pod(sizing, sized.name, cpu, limits.memory_bytes).as_dict()
                report.update(vm=explanation["vm"], accounted=explanation["accounted"],
                              warnings=explanation["warnings"], podFixed=sized.pod_fixed)
            except SandboxRefused as exc:
                report.update(vm=None, kataRefuses=str(exc))
                refused = True
        refused = refused or bool(denied)
        reports.append(report)
    if args.output == "json":
        print(json.dumps(reports[0] if len(reports) == 1 else reports, indent=2))
    else:
        for report in reports:
            _print_pod_explanation(report)
    return EXIT_INVALID if refused else EXIT_OK


def _print_pod_explanation(report: dict) -> None:
    def line(text: str) -> None:  # names, kinds and messages come from the file: one printable line each
        sys.stdout.write(bounded.printable(text) + "\n")

    pod = report["pod"]
    limits = report["limits"]
    line(f"{pod['kind']} {pod['namespace']}/{pod['name']} (policy {report['policy']})")
    line(f"  limits (as Kubernetes computes them): cpu {limits['cpu']}, memory {limits['memory']}"
         + (" (no memory limit on some container)" if limits["memoryLimitMissing"] else ""))
    if report["runtimeClass"] is None:
        line("  class:                no runtimeClassName and not routed by this policy"
             + (f" (the smallest class that fits is {report['smallestFit']})" if report["smallestFit"] else ""))
    elif report["class"] is None:
        line(f"  class:                RuntimeClass {report['runtimeClass']} is not a class of this policy")
    else:
        how = ("routed (label katasizing.dev/policy): the smallest class that covers it" if report["routed"]
               else "its runtimeClassName")
        line(f"  class:                {report['runtimeClass']} (class {report['class']}; {how})")
    if report.get("kataRefuses"):
        line(f"  VM Kata boots:        none: Kata refuses this pod: {report['kataRefuses']}")
    elif report.get("vm"):
        line(f"  VM Kata boots:        {report['vm']['vcpus']} vCPUs, {report['vm']['memoryMiB']} MiB")
        line(f"  Kubernetes accounts:  cpu {report['accounted']['cpu']}, memory {report['accounted']['memory']}"
             f" (limits + podFixed {report['podFixed']['cpu']}/{report['podFixed']['memory']})")
    admission = report["admission"]
    if not admission["inScope"]:
        line("  admission:            not checked (the namespace is outside spec.admission.namespaces)")
    elif not admission["findings"]:
        line("  admission:            admitted")
    for finding in admission["findings"]:
        verdict = {"Deny": "refused", "Warn": "admitted with a warning", "Audit": "admitted (audit log)"}[
            finding["action"]]
        line(f"  admission:            {verdict} [{finding['rule']}]: {finding['message']}")
    for warning in report.get("warnings", []):
        line(f"  warning: {warning}")
