"""`kata-sizing`: the command-line shell over the pure core.

Exit codes: 0 ok, 1 the policy (or the audited install) breaks a rule, 2 the input cannot
be read. Every problem is one line on stderr; no traceback reaches the user. kopf and the
kubernetes client are imported only by the `operator` subcommand.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import ssl
import sys
from collections.abc import Sequence
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING

from . import __version__
from .core import bounded, yamlout
from .core.bounded import InputError
from .core.model import KataSizingPolicy, PolicyError, format_decimal_error, parse_policy, policy_set_problems
from .core.quantity import QuantityError, cpu_cores, memory_bytes

if TYPE_CHECKING:
    from .controller.operator_main import WebhookOptions

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
        raise _unreadable(path, exc) from None


def _unreadable(path: str, exc: OSError | ValueError) -> InputError:
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


def _print_problems(lines: Sequence[str], prefix: str = "error") -> None:
    for line in lines:
        print(f"{prefix}: {bounded.printable(line)}", file=sys.stderr)


# --- subcommands ------------------------------------------------------------------------


def cmd_render(args: argparse.Namespace) -> int:
    from .core.render import render_policy

    _flag("--node-name", args.node_name)
    if args.shared:
        return _render_shared(args)
    if args.policy is None:
        raise InputError("render: give POLICY.yaml (or --shared for the shared admission policies alone)")
    policies = load_policies(args.policy)
    if args.proposal:
        return _render_proposal(policies, args)
    if args.margin is not None or args.plot is not None:
        raise InputError("--margin and --plot go with --proposal SURVEY.csv")
    nodes = None
    if args.node_capacity:
        from .core.guidance import NodeFacts

        nodes = [NodeFacts(
            name=args.node_name,
            capacity_memory_bytes=_limit("--node-capacity", args.node_capacity, memory_bytes),
            capacity_cpu=_limit("--node-cpu", args.node_cpu, cpu_cores),
            infra_pod_memory_bytes=_limit("--infra-pod-memory", args.infra_pod_memory, memory_bytes),
            kubelet_version=_kubelet_version(args.kubelet_version),
        )]
    objects, errors, overlays = [], [], []  # overlays: (policy, its values as text and as data)
    shared: dict[str, None] = {}  # the shared admission policies the bindings name, in order
    for policy in policies:
        rendered = render_policy(policy, nodes=nodes)
        errors.extend(f"{policy.name}: {p}" for p in rendered.problems if p.severity == "error")
        _print_problems([f"{policy.name}: {p}" for p in rendered.problems if p.severity == "warning"], "warning")
        overlays.append((policy.name, rendered.values_yaml, rendered.values))
        if args.values_only:
            continue
        if not rendered.creates_runtime_classes:
            print(
                f"note: {policy.name}: runtimeClass.managedBy is KataDeploy; the kata-deploy chart "
                "creates the RuntimeClasses from the values overlay, so they are not printed",
                file=sys.stderr,
            )
        objects.extend(rendered.objects())
        shared.update(dict.fromkeys(o["metadata"]["name"] for o in rendered.shared))
    if errors:
        _print_problems(errors)
        return EXIT_INVALID
    if args.values_only:
        return _print_values_overlay(overlays, args.output)
    if shared:
        print(f"note: the bindings name the shared admission policies {', '.join(shared)}: "
              "the install creates them (the chart, manifests/), or `kata-sizing render --shared` prints them; "
              "without them the bindings judge no pod", file=sys.stderr)
    _print_objects(objects, args.output)
    return EXIT_OK


def _print_objects(objects: list[dict], output: str) -> None:
    if output == "json":
        body = objects[0] if len(objects) == 1 else {"apiVersion": "v1", "kind": "List", "items": objects}
        print(json.dumps(body, indent=2))
    else:
        sys.stdout.write(yamlout.dump_documents(objects))


def _render_shared(args: argparse.Namespace) -> int:
    """The admission policies every policy's bindings name, alone: for the one GitOps application
    (or the install) that owns them (docs/gitops.md). With POLICY.yaml, those its policies bind:
    no MutatingAdmissionPolicy when every one routes through the operator's webhook."""
    from .core.render import shared_admission_objects

    given = [name for name, value in (("--values-only", args.values_only), ("--node-capacity", args.node_capacity),
                                      ("--proposal", args.proposal)) if value]
    if given:
        raise InputError(f"render --shared prints the shared admission policies alone; drop {', '.join(given)}")
    routing = "Auto"
    if args.policy is not None:
        binding = [p for p in load_policies(args.policy) if p.spec.admission.enabled]
        if not binding:
            print(f"note: no policy of {args.policy} has spec.admission.enabled: no shared admission policy "
                  "is needed", file=sys.stderr)
            return EXIT_OK
        if all(p.spec.admission.routing == "Webhook" for p in binding):
            routing = "Webhook"
    _print_objects(shared_admission_objects(routing), args.output)
    return EXIT_OK


def _render_proposal(policies: list[KataSizingPolicy], args: argparse.Namespace) -> int:
    """The kata-deploy values overlay now and with the overhead refitted from a survey, as a
    unified diff for a GitOps change; the policy fields to set are printed above it."""
    import difflib

    from .core.calibrate import CalibrationError, parse_samples_csv
    from .core.proposal import propose
    from .core.render import render_policy

    if len(policies) != 1:
        raise InputError(f"--proposal refits one policy; {args.policy} holds {len(policies)}")
    if args.values_only or args.node_capacity or args.output != "yaml":
        raise InputError("--proposal prints a diff of the values overlay; drop --values-only, --node-capacity and -o")
    policy = policies[0]
    try:
        proposal = propose(policy, parse_samples_csv(read_text(args.proposal)), margin=_margin(args))
    except CalibrationError as exc:
        _print_problems([f"{args.proposal}: {p}" for p in exc.problems])
        return EXIT_INVALID
    now, proposed = render_policy(policy), render_policy(proposal.refitted)
    errors = [f"{policy.name}: {p}" for p in proposed.problems if p.severity == "error"]
    if errors:
        _print_problems(errors)
        return EXIT_INVALID
    name = f"{policy.name}-kata-deploy-values/values.yaml"
    print(f"# kata-sizing: policy {policy.name} refitted from {args.proposal} ({proposal.rows} row(s)).")
    print("# Set in the policy (spec.overhead):")
    for line in yamlout.dump(proposal.overhead).splitlines():
        print(f"#   {line}")
    for line in _proposal_lines(proposal):
        print(f"# {line}")
    sys.stdout.writelines(difflib.unified_diff(
        now.values_yaml.splitlines(keepends=True), proposed.values_yaml.splitlines(keepends=True),
        fromfile=f"{name} (now)", tofile=f"{name} (proposed)"))
    _plot_if_asked(args, proposal.fit, proposal)
    return _proposal_verdict(proposal)


def _margin(args: argparse.Namespace) -> Decimal | None:
    """--margin when given (checked as the policy's field is), else None: the policy's own."""
    if args.margin is None:
        return None
    problem = format_decimal_error(_flag("--margin", args.margin), at_most=1)
    if problem:
        raise PolicyError([f"--margin: {problem}"])
    return Decimal(args.margin)


def _proposal_lines(proposal) -> list[str]:
    """What a proposal says per class, one line each, for calibrate --policy and render --proposal."""
    lines = [f"note: {note}" for note in proposal.notes]
    lines.append(f"margin {proposal.margin}; headroom warning {proposal.threshold.describe()}; the survey's VMs reach "
                 f"{format(proposal.surveyed_vm_mib.normalize(), 'f')} MiB")
    for c in proposal.classes:
        line = (f"class {c.name}: guest budget {c.guest_budget_mib} MiB, podFixed {c.pod_fixed['cpu']}/"
                f"{c.pod_fixed['memory']} (now {c.pod_fixed_before['cpu']}/{c.pod_fixed_before['memory']}), largest VM "
                f"{c.largest_vm_mib} MiB")
        if c.extrapolated:
            line += " (extrapolated: beyond the largest surveyed VM)"
        if c.min_headroom_bytes is not None:
            line += (f"; {c.pods} measured pod(s), least headroom in the proposed VM {_mib_text(c.min_headroom_bytes)} "
                     f"({c.min_headroom_pod}), warning line {_mib_text(c.warning_line_bytes)}")
        lines.append(line)
    return lines


def _proposal_verdict(proposal) -> int:
    """Exit 1, with a line per class, when a measured pod would be under its warning line or the
    survey refutes an explicit value."""
    problems = [f"class {c.name}: pod {c.min_headroom_pod} would have {_mib_text(c.min_headroom_bytes)} of headroom, "
                f"under its warning line {_mib_text(c.warning_line_bytes)}" for c in proposal.uncovered]
    problems += [f"class {c.name}: {reason}" for c in proposal.refuted for reason in c.refuted]
    _print_problems(problems)
    return EXIT_INVALID if problems else EXIT_OK


def _print_values_overlay(overlays: list[tuple[str, str, dict]], output: str) -> int:
    """The kata-deploy values overlay alone, for a pipeline that commits it next to the
    HelmRelease (or passes it to `helm upgrade -f`). Several policies give one overlay with
    every policy's custom runtimes."""
    if len(overlays) == 1 and output == "yaml":
        sys.stdout.write(overlays[0][1])  # as rendered, with its comments
        return EXIT_OK
    runtimes: dict[str, object] = {}
    for _, _, values in overlays:
        # Custom runtimes are named after the RuntimeClasses, which load_policies keeps apart.
        runtimes.update(values["customRuntimes"]["runtimes"])
    merged = {"customRuntimes": {"enabled": True, "runtimes": runtimes}}
    if output == "json":
        print(json.dumps(merged, indent=2))
    else:
        sys.stdout.write(yamlout.dump(merged, comments=[
            "kata-deploy values overlay rendered by kata-sizing from KataSizingPolicies "
            f"{', '.join(name for name, _, _ in overlays)}."]))
    return EXIT_OK


def cmd_validate(args: argparse.Namespace) -> int:
    from .core.sizing import size_policy

    if args.output == "json":
        return _validate_json(args, size_policy)
    policies = load_policies(args.policy)
    errors, warnings = [], []
    for policy in policies:
        sizing = size_policy(policy)
        errors.extend(f"{policy.name}: {p}" for p in sizing.errors)
        warnings.extend(f"{policy.name}: {p}" for p in sizing.warnings)
    if args.strict:
        errors.extend(f"{w} (--strict)" for w in warnings)
        warnings = []
    _print_problems(warnings, "warning")
    if errors:
        _print_problems(errors)
        return EXIT_INVALID
    names = ", ".join(p.name for p in policies)
    print(f"valid: {names}")
    return EXIT_OK


def _validate_json(args: argparse.Namespace, size_policy) -> int:
    """Every problem with its severity, rule id, path, message and fix (docs/rules.md)."""
    from .core.rules import Problem, Rule, Severity

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


def _flag(option: str, text: str | None) -> str | None:
    """A flag's value, bounded in length and free of control characters."""
    if text is None:
        return None
    try:
        return bounded.check_flag(option, text)
    except InputError as exc:
        raise PolicyError([str(exc)]) from None


def _limit(option: str, text: str | None, parse) -> object:
    if _flag(option, text) is None:
        return None
    try:
        return parse(text)
    except QuantityError as exc:
        raise PolicyError([f"{option}: {exc}"]) from None


def _kubelet_version(text: str | None) -> str | None:
    from .core.guidance import kubelet_minor

    if _flag("--kubelet-version", text) is not None and kubelet_minor(text) is None:
        raise PolicyError([f"--kubelet-version: {text!r} is not a Kubernetes version (examples: v1.37.2, 1.36.4)"])
    return text


def _policy_path(args: argparse.Namespace) -> str:
    """POLICY.yaml, given as the positional argument or with --policy."""
    given = [p for p in (args.policy, args.policy_file) if p]
    if len(given) != 1:
        raise InputError("give the policy file once: POLICY.yaml or --policy POLICY.yaml")
    return given[0]


def _chosen_policy(args: argparse.Namespace, path: str) -> KataSizingPolicy:
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


def _namespace_labels(args: argparse.Namespace) -> dict[str, str] | None:
    from .core.kubegrammar import label_key_problem, label_value_problem

    if not args.namespace_label:
        return None
    labels = {}
    for text in args.namespace_label:
        _flag("--namespace-label", text)
        key, sep, value = text.partition("=")
        problem = (None if sep else f"{text!r} is not KEY=VALUE") or label_key_problem(key) or label_value_problem(value)
        if problem:
            raise PolicyError([f"--namespace-label: {problem}"])
        labels[key] = value
    return labels


def cmd_explain(args: argparse.Namespace) -> int:
    from .core.sizing import SandboxRefused, explain_pod, size_policy

    _flag("--class", args.class_name)
    _flag("--policy-name", args.policy_name)
    if args.pod:
        return _explain_pods(args)
    if args.class_name is None:
        raise InputError("explain needs --class (with --cpu/--memory) or --pod POD.yaml")
    args.policy = _policy_path(args)
    policy = _chosen_policy(args, args.policy)
    sizing = size_policy(policy)
    if sizing.errors:
        raise PolicyError([str(p) for p in sizing.errors])
    cpu = _limit("--cpu", args.cpu, cpu_cores)
    memory = _limit("--memory", args.memory, memory_bytes)
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
    from .core import podfit
    from .core.sizing import SandboxRefused, explain_pod, size_policy

    if args.class_name or args.cpu or args.memory:
        raise InputError("--pod takes the class and limits from the pod; drop --class/--cpu/--memory")
    path = _policy_path(args)
    policy = _chosen_policy(args, path)
    sizing = size_policy(policy)
    if sizing.errors:
        raise PolicyError([str(p) for p in sizing.errors])
    namespace_labels = _namespace_labels(args)
    documents = [d for d in load_yaml_documents(args.pod) if d is not None]
    reports, refused = [], False
    for index, document in enumerate(documents):
        where = args.pod + (f" (document {index + 1})" if len(documents) > 1 else "")
        try:
            spec = podfit.pod_spec_of(document)
            limits = podfit.pod_limits(spec)
            metadata = podfit.pod_metadata_of(document)
        except podfit.PodInputError as exc:
            raise InputError(f"{where}: {exc}") from None
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


def cmd_calibrate(args: argparse.Namespace) -> int:
    from .core.calibrate import CalibrationError, checked_overhead_block, fit_overhead, parse_samples_csv

    margin = _margin(args)
    host_memory = None
    if args.host_memory is not None:
        if args.policy:
            raise InputError("--host-memory is for a fit without --policy (the policy's hostMemory is used)")
        host_memory = -(-_limit("--host-memory", args.host_memory, memory_bytes) // (1024 * 1024))
    text = read_text(args.samples)
    proposal = None
    try:
        samples = parse_samples_csv(text)
        if args.policy:
            from .core.proposal import propose

            proposal = propose(_chosen_policy(args, args.policy), samples, margin=margin)
            fit, block = proposal.fit, proposal.overhead
        else:
            from .core.defaults import DEFAULT_MARGIN

            fit = fit_overhead(samples, margin=DEFAULT_MARGIN if margin is None else margin,
                               assumed_host_mib=host_memory)
            block = checked_overhead_block(fit.overhead_block())
    except CalibrationError as exc:
        _print_problems([f"{args.samples}: {p}" for p in exc.problems])
        return EXIT_INVALID
    report = {"overhead": block, "residualsMiB": [format(r.normalize(), "f") for r in fit.residuals_mib]}
    if fit.max_guest_daemons_mib is not None:
        report["maxGuestDaemonsMiB"] = format(Decimal(fit.max_guest_daemons_mib).normalize(), "f")
    if proposal is not None:
        report.update({k: v for k, v in proposal.as_dict().items() if k != "overhead"})
    else:
        report["largestSurveyedVmMiB"] = format(fit.largest_vm_mib.normalize(), "f")
        if fit.notes:
            report["notes"] = list(fit.notes)
    _plot_if_asked(args, fit, proposal)
    if args.output == "json":
        print(json.dumps(report, indent=2))
        return EXIT_OK if proposal is None else _proposal_verdict(proposal)
    print("# Fitted overhead function (upper envelope: every sample covered).")
    print("# Paste under spec: in a KataSizingPolicy.")
    sys.stdout.write(yamlout.dump({"overhead": report["overhead"]}))
    print("# Residuals per sample (line above measurement, MiB): " + ", ".join(report["residualsMiB"]))
    if proposal is None:
        for note in fit.notes:
            print(f"# note: {note}")
        return EXIT_OK
    for line in _proposal_lines(proposal):
        print(f"# {line}")
    return _proposal_verdict(proposal)


def _plot_if_asked(args: argparse.Namespace, fit, proposal) -> None:
    """--plot FILE: the fit drawn (core-free: matplotlib is imported here only, when asked)."""
    if getattr(args, "plot", None) is None:
        return
    from .plot import PlotUnavailable, plot_fit

    _flag("--plot", args.plot)
    try:
        plot_fit(fit, proposal, args.plot)
    except PlotUnavailable as exc:
        raise InputError(str(exc)) from None
    except OSError as exc:
        raise InputError(f"--plot: {args.plot}: cannot write ({exc.strerror or exc})") from None


def _mib_text(size_bytes: int) -> str:
    from .core.headroom import mib_text

    return mib_text(size_bytes)


def _sized_policy(args: argparse.Namespace, most_timeout_s: float):
    """The policy `survey` and `probe` measure, sized (an invalid one refused), after their --timeout."""
    from .core.sizing import size_policy

    if not 0 < args.timeout <= most_timeout_s:
        raise InputError(f"--timeout: {args.timeout:g} is not a number of seconds above 0 and at most {most_timeout_s:g}")
    policy = _chosen_policy(args, args.policy)
    sizing = size_policy(policy)
    if sizing.errors:
        raise PolicyError([str(p) for p in sizing.errors])
    return policy, sizing


def cmd_survey(args: argparse.Namespace) -> int:
    """One measurement of every Kata pod of a policy (docs/measurement.md), as calibrate's CSV."""
    from .core.survey import PodIndex, SurveyInputError, readings_from, survey_rows, to_csv

    policy, sizing = _sized_policy(args, most_timeout_s=600)
    index = PodIndex({c.runtime_class for c in sizing.classes})
    try:
        if args.summary:
            if not args.pods:
                raise InputError("--summary needs --pods PODS.yaml (kubectl get pods -A -o yaml): the pods' limits "
                                 "and classes are in their specs, not in the Summary")
            for path in dict.fromkeys(args.pods):
                _saved_pods(path, index)
            summaries, source = _saved_summaries(args), "saved Summaries"
        else:
            if args.pods:
                raise InputError("--pods goes with --summary; without them the cluster is read")
            summaries, fetch_notes = _cluster_summaries(index, args.timeout)
            _print_problems(fetch_notes, "note")
            source = "the cluster (kubelet Summaries through the API server)"
        readings, notes = readings_from(summaries, index)
    except SurveyInputError as exc:
        raise InputError(str(exc)) from None
    rows, row_notes = survey_rows(readings, sizing)
    _print_problems(notes + index.notes() + row_notes, "note")
    if not rows:
        print(f"error: no pod of policy {policy.name}'s classes ({', '.join(sorted(index.runtime_classes))}) was "
              f"measured in {source}", file=sys.stderr)
        return EXIT_INVALID
    nodes = len({row.node for row in rows})
    sys.stdout.write(to_csv(rows, [
        f"kata-sizing survey of policy {policy.name}: {len(rows)} pod(s) on {nodes} node(s), from {source}.",
        "Host side only (the kubelet's Summary); free_total_mib/free_used_mib need `free -m` in the guest.",
        f"Refit with: kata-sizing calibrate THIS.csv --policy {args.policy}",
    ]))
    return EXIT_OK


def cmd_probe(args: argparse.Namespace) -> int:
    """Boot the node's VMM and guest kernel at each class's VM sizes and measure the guest side
    (docs/probe.md), as calibrate's CSV with the guest's columns filled."""
    import tempfile

    from . import vm
    from .core.calibrate import PROBE_COLUMNS
    from .core.probe import (
        KATA_ROOT,
        ProbeError,
        VmmPaths,
        config_candidates,
        describe_row,
        initramfs,
        kernel_command_line,
        probe_points,
        probe_row,
        report_problem,
        vm_paths_problem,
        vmm_paths,
    )
    from .core.survey import COLUMNS, to_csv

    policy, sizing = _sized_policy(args, most_timeout_s=3600)
    try:
        problem = None if args.vmm else vm_paths_problem(sizing.hypervisor)
        if problem:
            raise ProbeError(problem)
        if args.config:
            paths = vmm_paths(read_text(args.config), args.config, sizing.hypervisor)
        elif args.vmm and args.kernel:
            paths = VmmPaths(args.vmm, args.kernel, sizing.hypervisor, "--vmm/--kernel")
        else:
            candidates = config_candidates(policy.spec.shim, sizing.runtime, args.kata_root or KATA_ROOT)
            found = next((c for c in candidates if Path(c).is_file()), None)
            if found is None:
                raise ProbeError(f"no Kata configuration for shim {policy.spec.shim} under {args.kata_root or KATA_ROOT} "
                                 f"(looked at {', '.join(candidates)}); give --config KATA.toml, or --vmm and --kernel")
            paths = vmm_paths(read_text(found), found, sizing.hypervisor)
        if args.vmm or args.kernel:
            paths = VmmPaths(args.vmm or paths.vmm, args.kernel or paths.kernel, paths.hypervisor,
                             paths.source, paths.guest_image)
        vm.check_paths(paths)
        if not Path(args.memory_dir).is_dir():
            raise ProbeError(f"--memory-dir {args.memory_dir}: not a directory (Kata's QEMU puts guest memory on /dev/shm)")
        points = probe_points(sizing, args.points)
        init = vm.find_init(args.init)
        rows = []
        with vm.stopped_on_signals(), tempfile.TemporaryDirectory(prefix="kata-sizing-probe-") as scratch:
            workdir = Path(scratch)
            image = workdir / "initramfs.cpio"
            image.write_bytes(initramfs(init.read_bytes()))
            if args.accel == "auto":
                accelerator, why = vm.detect_accelerator(paths, image, workdir, args.memory_dir)
            else:
                accelerator, why = args.accel, "--accel"
            print(f"note: booting {paths.vmm} with {paths.kernel} ({paths.source}) under {accelerator}: {why}",
                  file=sys.stderr)
            for number, point in enumerate(points):
                result = vm.boot(paths, point.vm, accelerator=accelerator, initramfs_path=image,
                                 memory_dir=args.memory_dir, workdir=workdir, command_line=kernel_command_line(0),
                                 timeout_s=args.timeout, name=f"vm{number}")
                problem = report_problem(result.report)
                if problem:
                    raise ProbeError(f"VM of {point.vm.memory_mib} MiB (class {point.class_name}): {problem}"
                                     + (f" within {args.timeout:g} s" if result.exit_code is None else ""))
                rows.append(probe_row(point, result.report, result.host, args.node))
                print(f"note: {describe_row(point, result.report, result.host, accelerator)}", file=sys.stderr)
    except ProbeError as exc:
        raise InputError(str(exc)) from None
    sys.stdout.write(to_csv(rows, [
        f"kata-sizing probe of policy {policy.name}: {len(rows)} VM(s) of {paths.vmm} with {paths.kernel} "
        f"under {accelerator} ({why}).",
        "Guest side: MemTotal and used as `free` gives them at boot, workload_allocated_mib what a process could "
        "allocate and touch before the guest refused it; host side: the VMM's cgroup peak "
        "(pod_cgroup_memory_current_bytes, once the VM was fully resident) and peak resident memory.",
        *(["Under TCG the host side holds QEMU's translation cache (tb-size=64 MiB), which KVM does not have."]
          if accelerator == "tcg" else []),
        f"Fit with: kata-sizing calibrate THIS.csv --policy {args.policy}",
    ], columns=(*COLUMNS, *PROBE_COLUMNS)))
    return EXIT_OK


def _saved_summaries(args: argparse.Namespace) -> list[tuple[str, object]]:
    """The Summaries, one per node: a file given twice is read once (said), two files of one node
    are refused (which one is the node's?)."""
    found, paths_of = [], {}
    for path in args.summary:
        if path in paths_of.values():
            print(f"note: {bounded.printable(path)} is given twice; it is read once", file=sys.stderr)
            continue
        document = bounded.load_json(read_text(path), path)
        node = ((document.get("node") or {}) if isinstance(document, dict) else {}).get("nodeName")
        if not isinstance(node, str) or not node:
            raise InputError(f"{path}: not a kubelet Summary (no node.nodeName); save one with "
                             "kubectl get --raw /api/v1/nodes/NODE/proxy/stats/summary")
        from .core.kubegrammar import dns_subdomain_problem

        problem = dns_subdomain_problem(node)
        if problem:
            raise InputError(f"{path}: node.nodeName: {problem}")
        if node in paths_of:
            raise InputError(f"{paths_of[node]} and {path} are both Summaries of node {node}: give one per node")
        paths_of[node] = path
        found.append((node, document))
    return found


def _lines(path: str):
    """The lines of a file, read as they are needed (a pod list may be far larger than other inputs)."""
    try:
        handle = open(path, encoding="utf-8", newline="")
    except OSError as exc:
        raise _unreadable(path, exc) from None
    with handle:
        try:
            yield from handle
        except (OSError, ValueError) as exc:
            raise _unreadable(path, exc) from None


def _saved_pods(path: str, index) -> None:
    """`kubectl get pods -A -o yaml` into `index`, a pod at a time (core/podlist.py); text laid out
    otherwise (JSON, several documents) is read whole, within the 4 MiB of any input."""
    from .core.audit import AuditError, pods_from_documents
    from .core.podlist import SPLIT, NotStreamable, read_pod_list

    def wanted(text: str) -> bool:
        # Only a pod with a runtimeClassName can be a Kata pod (an escape could hide the key's text).
        return "runtimeClassName" in text or "\\" in text

    if path != "-":
        try:
            for where, pod in read_pod_list(_lines(path), path, wanted):
                index.add(pod, where)
            return
        except NotStreamable:
            pass
    try:
        text = read_text(path)
    except InputError as exc:
        raise InputError(f"{exc}; a pod list larger than that must be a List as kubectl writes it (-o yaml), or "
                         f"{SPLIT}") from None
    try:
        pods = pods_from_documents(bounded.load_yaml_documents(text, path), path)
    except AuditError as exc:
        raise InputError(str(exc)) from None
    for where, pod in pods:
        if isinstance(pod, dict) and pod.get("kind") not in (None, "Pod"):
            raise InputError(f"{where}: kind {str(pod.get('kind'))[:40]!r} is not a Pod or a List of Pods; save the "
                             "pods with kubectl get pods -A -o yaml")
        index.add(pod, where)
    if not index.pods:
        raise InputError(f"{path}: holds no Pod; save the pods with kubectl get pods -A -o yaml")


def _cluster_summaries(index, timeout_s: float) -> tuple[list, list[str]]:
    """The pods from the API server (a page at a time, into `index`), and the Summary of each node
    running one of them (through the API server's node proxy, as `kubectl get --raw` reads it: the
    CLI runs where kubectl does, not necessarily where the kubelets are reachable)."""
    import asyncio

    from .controller.kube import ApiError, KubeApi  # the kubernetes client loads only here

    async def read() -> tuple[list, list[str]]:
        try:
            api = await KubeApi.connect()
        except Exception as exc:  # noqa: BLE001 - the client's config errors have no common type
            raise InputError(f"cannot connect to the cluster: {exc}") from None
        try:
            continue_token, number = None, 0
            while True:
                page, _, continue_token = await api.list_page("Pod", 500, continue_token)
                for pod in page:
                    index.add(pod, f"pods[{number}]")
                    number += 1
                if not continue_token:
                    break
            limit = asyncio.Semaphore(8)
            notes: list[str] = []

            async def one(node: str):
                async with limit:
                    try:
                        return node, await api.read_node_summary(node, timeout_s)
                    except ApiError as exc:
                        notes.append(f"node {node} skipped: {exc}")
                        return None

            found = await asyncio.gather(*(one(node) for node in sorted(index.by_node)))
            return [f for f in found if f is not None], notes
        except ApiError as exc:
            raise InputError(f"cannot read the pods: {exc}") from None
        finally:
            await api.close()

    return asyncio.run(read())


def cmd_audit(args: argparse.Namespace) -> int:
    from .core.audit import AuditError, audit_values, format_text, runtime_classes_from_documents

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
        _print_problems(report.notes, "note")
        sys.stdout.write(format_text(report))
    if report.errors or (args.strict and report.findings):
        return EXIT_INVALID
    return EXIT_OK


def _audit_pods(args: argparse.Namespace) -> int:
    """audit --pods: stored pods against their class (podfit, the admission policies' rule)."""
    from .core.audit import (
        AuditError,
        audit_pods,
        format_pods_text,
        namespace_labels_from_documents,
        pods_from_documents,
    )

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


def _webhook_options(args: argparse.Namespace) -> WebhookOptions | None:
    """The webhook flags, or None when --webhook-port is not given."""
    from .controller.operator_main import WebhookOptions

    if args.webhook_port is None:
        given = [flag for flag, value in (
            ("--webhook-cert", args.webhook_cert), ("--webhook-key", args.webhook_key),
            ("--webhook-addr", args.webhook_addr), ("--webhook-insecure", args.webhook_insecure),
        ) if value]
        if given:
            raise InputError(f"{', '.join(given)} need --webhook-port")
        return None
    if args.webhook_insecure:
        if args.webhook_cert or args.webhook_key:
            raise InputError("--webhook-insecure serves plain HTTP; drop --webhook-cert and --webhook-key")
    elif not (args.webhook_cert and args.webhook_key):
        # The API server calls admission webhooks over HTTPS only.
        raise InputError("--webhook-port needs --webhook-cert and --webhook-key")
    for path in filter(None, (args.webhook_cert, args.webhook_key)):
        read_text(path)  # a missing Secret mount is one line here, not a crash inside kopf
    _tls_pair(args.webhook_cert, args.webhook_key)
    return WebhookOptions(
        port=args.webhook_port, certfile=args.webhook_cert, pkeyfile=args.webhook_key,
        addr=args.webhook_addr, insecure=args.webhook_insecure,
    )


# Where a pod's service account token is mounted (what KubeApi.connect and kopf look for).
SERVICE_ACCOUNT_TOKEN = "/var/run/secrets/kubernetes.io/serviceaccount/token"


def _cluster_problem() -> str | None:
    """Why the operator could not connect the way kubectl does (a pod's service account, else
    KUBECONFIG or ~/.kube/config with a current context that names a cluster), or None. Checked
    before kopf starts: kopf would log a traceback and retry forever."""
    if os.environ.get("KUBERNETES_SERVICE_HOST") and Path(SERVICE_ACCOUNT_TOKEN).exists():
        return None
    given = os.environ.get("KUBECONFIG")
    paths = [p for p in (given or "").split(os.pathsep) if p] or [str(Path.home() / ".kube" / "config")]
    where = "KUBECONFIG" if given else "~/.kube/config"
    found = [p for p in paths if Path(p).is_file()]
    if not found:
        return (f"no cluster to connect to: not in a pod (no service account token at {SERVICE_ACCOUNT_TOKEN}) "
                f"and no kubeconfig ({where}: {', '.join(paths)} does not exist)")
    configs = []
    for path in found:
        try:
            documents = bounded.load_yaml_documents(read_text(path), path)
        except InputError as exc:
            return f"the kubeconfig cannot be read: {exc}"
        if len(documents) != 1 or not isinstance(documents[0], dict):
            return f"the kubeconfig {path} is not a kubeconfig (one YAML mapping)"
        configs.append(documents[0])
    # As kubectl merges several files: the first current-context set wins, entries by name.
    current = next((c.get("current-context") for c in configs if c.get("current-context")), None)
    if not current:
        return f"the kubeconfig ({', '.join(found)}) sets no current-context"
    contexts = {e.get("name"): e.get("context") for c in configs for e in (c.get("contexts") or [])
                if isinstance(e, dict)}
    context = contexts.get(current)
    if not isinstance(context, dict):
        return f"the kubeconfig's current-context {current!r} names no context"
    clusters = {e.get("name"): e.get("cluster") for c in configs for e in (c.get("clusters") or [])
                if isinstance(e, dict)}
    cluster = clusters.get(context.get("cluster"))
    if not isinstance(cluster, dict) or not cluster.get("server"):
        return f"the kubeconfig's context {current!r} names no cluster with a server"
    return None


def _listening_port(option: str, port: int | None, addr: str | None) -> None:
    """A port the operator can listen on, or one line saying why not (before kopf starts)."""
    if port is None:
        return
    if not 1 <= port <= 65535:
        raise InputError(f"{option}: {port} is not a TCP port (1 to 65535)")
    try:
        family, kind, proto, _, address = socket.getaddrinfo(addr or None, port, type=socket.SOCK_STREAM,
                                                             flags=socket.AI_PASSIVE)[0]
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind(address)
    except OSError as exc:
        raise InputError(f"{option}: cannot listen on {addr or '*'}:{port}: {exc.strerror or exc}") from None


def _tls_pair(cert: str | None, key: str | None) -> None:
    if cert is None or key is None:
        return
    try:
        ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(cert, key)
    except (ssl.SSLError, OSError, ValueError) as exc:
        raise InputError(f"--webhook-cert/--webhook-key: {cert} and {key} are not a PEM certificate and its private "
                         f"key ({getattr(exc, 'reason', None) or exc})") from None


def cmd_operator(args: argparse.Namespace) -> int:
    import gc

    _listening_port("--webhook-port", args.webhook_port, args.webhook_addr)
    _listening_port("--metrics-port", args.metrics_port, args.metrics_addr)
    webhook = _webhook_options(args)
    problem = _cluster_problem()
    if problem:
        raise InputError(problem)

    from .controller.operator_main import MetricsOptions, run_operator  # kopf and kubernetes load only here

    gc.enable()  # the console script starts with it off (__main__); a long-lived process needs it

    metrics = None
    if args.metrics_port is not None:
        metrics = MetricsOptions(port=args.metrics_port, addr=args.metrics_addr)
    return run_operator(liveness=args.liveness, standalone=args.standalone, namespace=args.namespace,
                        webhook=webhook, metrics=metrics, log_format=args.log_format,
                        lease=_lease_options(args), kubelet=_kubelet_options(args))


def _kubelet_options(args: argparse.Namespace):
    """How the measurement reads kubelet Summaries (controller/kubelet.py)."""
    from .controller.kubelet import KubeletOptions

    if args.kubelet_access == "apiserver" and (args.kubelet_ca or args.kubelet_insecure_skip_tls_verify):
        raise InputError("--kubelet-ca and --kubelet-insecure-skip-tls-verify are for --kubelet-access direct")
    if args.kubelet_ca and args.kubelet_insecure_skip_tls_verify:
        raise InputError("--kubelet-ca verifies kubelets; --kubelet-insecure-skip-tls-verify does not: give one")
    if args.kubelet_ca:
        read_text(args.kubelet_ca)  # a missing mount is one line here, not a failure per node later
    return KubeletOptions(access=args.kubelet_access, ca_file=args.kubelet_ca,
                          insecure_skip_tls_verify=args.kubelet_insecure_skip_tls_verify)


def _lease_options(args: argparse.Namespace):
    """The leader-election flags, or None without --leader-elect."""
    if not args.leader_elect:
        return None
    from .controller.leader import LeaseOptions, default_identity

    try:
        return LeaseOptions(
            namespace=args.leader_elect_namespace, identity=default_identity(),
            lease_duration_s=args.lease_duration, renew_deadline_s=args.renew_deadline,
            retry_period_s=args.retry_period,
        )
    except ValueError as exc:
        raise InputError(f"--lease-duration/--renew-deadline/--retry-period: {exc}") from None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kata-sizing",
        description="Size Kata Containers runtime classes from a KataSizingPolicy.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    render = sub.add_parser("render", help="print the objects the operator applies for a policy")
    render.add_argument("policy", metavar="POLICY.yaml", nargs="?", help="policy file ('-' for stdin)")
    render.add_argument("--shared", action="store_true",
                        help="print only the admission policies every policy's bindings name (the install's; "
                             "for the one GitOps application that owns them), not the policy's objects")
    render.add_argument("-o", "--output", choices=("yaml", "json"), default="yaml")
    render.add_argument("--node-capacity", metavar="QUANTITY", help="add node guidance for this memory capacity")
    render.add_argument("--node-cpu", metavar="QUANTITY", help="the node's CPU capacity, for VMs-per-class")
    render.add_argument("--infra-pod-memory", metavar="QUANTITY",
                        help="memory requests of the node's non-Kata pods (default: none)")
    render.add_argument("--kubelet-version", metavar="VERSION",
                        help="the nodes' kubelet (v1.37.2): the feature gates their configuration needs")
    render.add_argument("--values-only", action="store_true",
                        help="print only the kata-deploy values overlay (for helm -f, or to commit for GitOps)")
    render.add_argument("--proposal", metavar="SURVEY.csv",
                        help="print the values overlay's diff with the overhead refitted from a survey "
                             "(kata-sizing survey), for a GitOps change")
    render.add_argument("--margin", help="with --proposal: the margin of the refit (default: the policy's overhead.margin)")
    render.add_argument("--plot", metavar="FILE.svg", help="with --proposal: draw the fit (see calibrate --plot)")
    render.add_argument("--node-name", default="node", help=argparse.SUPPRESS)
    render.set_defaults(func=cmd_render)

    explain = sub.add_parser("explain", help="the VM Kata boots for a pod, and what Kubernetes accounts")
    explain.add_argument("policy", metavar="POLICY.yaml", nargs="?")
    explain.add_argument("--policy", dest="policy_file", metavar="POLICY.yaml", help="the policy (instead of POLICY.yaml)")
    explain.add_argument("--class", dest="class_name")
    explain.add_argument("--pod", metavar="POD.yaml",
                         help="a Pod or workload (Deployment, StatefulSet, DaemonSet, Job, CronJob...): the class it "
                              "lands in, its VM, what Kubernetes accounts and what admission says")
    explain.add_argument("--namespace-label", action="append", default=[], metavar="KEY=VALUE",
                         help="a label of the pod's namespace (for spec.admission.namespaces and routing)")
    explain.add_argument("--cpu", help="the pod's CPU limit, e.g. 1.5 or 1500m")
    explain.add_argument("--memory", help="the pod's memory limit, e.g. 600Mi")
    explain.add_argument("--policy-name", help="which policy, when the file holds several")
    explain.add_argument("-o", "--output", choices=("text", "json"), default="text")
    explain.set_defaults(func=cmd_explain)

    validate = sub.add_parser("validate", help="check a policy against every rule")
    validate.add_argument("policy", metavar="POLICY.yaml")
    validate.add_argument("--strict", action="store_true", help="treat warnings as errors")
    validate.add_argument("-o", "--output", choices=("text", "json"), default="text",
                          help="json: every problem with its rule id and fix")
    validate.set_defaults(func=cmd_validate)

    calibrate = sub.add_parser("calibrate", help="fit the overhead function from survey rows")
    calibrate.add_argument("samples", metavar="SAMPLES.csv")
    calibrate.add_argument("--margin", help="safety margin on the guest budget and the host side (default: the "
                           "policy's overhead.margin with --policy, else 0.10)")
    calibrate.add_argument("--policy-name", help="which policy, when --policy holds several")
    calibrate.add_argument("--plot", metavar="FILE.svg",
                           help="draw the fit (samples, line, classes) to an SVG or PNG; needs the plot extra "
                                "(pip install 'kata-sizing[plot]')")
    calibrate.add_argument("--policy", metavar="POLICY.yaml",
                           help="refit this policy: the classes' podFixed, each checked against the measured pods")
    calibrate.add_argument("--host-memory", metavar="QUANTITY",
                           help="without --policy: the host side to assume for rows from the kubelet when no VM "
                                "was fully resident (default: none, such rows are refused)")
    calibrate.add_argument("-o", "--output", choices=("text", "json"), default="text")
    calibrate.set_defaults(func=cmd_calibrate)

    survey = sub.add_parser("survey", help="measure a policy's Kata pods once (kubelet Summaries) as calibrate's CSV")
    survey.add_argument("policy", metavar="POLICY.yaml")
    survey.add_argument("--summary", metavar="SUMMARY.json", action="append", default=[],
                        help="a saved Summary (kubectl get --raw /api/v1/nodes/NODE/proxy/stats/summary), "
                             "repeatable; without it the cluster of KUBECONFIG is read")
    survey.add_argument("--pods", metavar="PODS.yaml", action="append", default=[],
                        help="with --summary: kubectl get pods -A -o yaml (repeatable: a list split by namespace "
                             "or node)")
    survey.add_argument("--policy-name", help="which policy, when the file holds several")
    survey.add_argument("--timeout", type=float, default=10.0, metavar="S", help="per Summary read (default 10)")
    survey.set_defaults(func=cmd_survey)

    probe = sub.add_parser("probe", help="boot the node's VMM and guest kernel at each class's VM sizes and "
                                         "measure the guest side, as calibrate's CSV")
    probe.add_argument("policy", metavar="POLICY.yaml")
    probe.add_argument("--policy-name", help="which policy, when the file holds several")
    probe.add_argument("--config", metavar="KATA.toml",
                       help="the node's Kata configuration for the policy's shim (default: found under --kata-root)")
    probe.add_argument("--kata-root", metavar="DIR", help="where kata-deploy installs (default /opt/kata)")
    probe.add_argument("--vmm", metavar="PATH", help="the VMM binary (overrides the configuration's path)")
    probe.add_argument("--kernel", metavar="PATH", help="the guest kernel (overrides the configuration's kernel)")
    probe.add_argument("--init", metavar="PATH", help="the probe's init binary (default: $KATA_SIZING_PROBE_INIT or the image's)")
    probe.add_argument("--points", type=int, default=3, metavar="N", help="VM sizes per class (default 3)")
    probe.add_argument("--accel", choices=("auto", "kvm", "tcg"), default="auto",
                       help="auto: KVM when a guest runs under it, else TCG")
    probe.add_argument("--memory-dir", default="/dev/shm", metavar="DIR",
                       help="where guest memory files go, as Kata's QEMU puts them (default /dev/shm)")
    probe.add_argument("--node", metavar="NAME", help="the node's name, for the rows")
    probe.add_argument("--timeout", type=float, default=300.0, metavar="S", help="per VM (default 300)")
    probe.set_defaults(func=cmd_probe)

    audit = sub.add_parser("audit", help="check an existing kata-deploy install's values and RuntimeClasses")
    audit.add_argument("values", metavar="VALUES.yaml", nargs="?", help="kata-deploy Helm values ('-' for stdin)")
    audit.add_argument("--pods", metavar="PODS.yaml",
                       help="audit pods instead (kubectl get pods -A -o yaml) against --policy: the ones outside "
                            "their class's envelope or without a memory limit, with counts per class")
    audit.add_argument("--namespaces", metavar="NAMESPACES.yaml",
                       help="with --pods: the namespaces' labels (kubectl get namespaces -o yaml), for a "
                            "spec.admission.namespaces selector")
    audit.add_argument("runtime_classes", metavar="RUNTIMECLASSES.yaml", nargs="*",
                       help="live RuntimeClasses (kubectl get runtimeclass -o yaml); they win over the values")
    audit.add_argument("-o", "--output", choices=("text", "json"), default="text")
    audit.add_argument("--strict", action="store_true", help="exit 1 on warnings too")
    audit.add_argument("--policy", metavar="POLICY.yaml", action="append", default=[],
                       help="the policy that rendered (part of) the install: its classes are checked with "
                            "its own host overhead (repeatable)")
    audit.set_defaults(func=cmd_audit)

    operator = sub.add_parser("operator", help="run the operator (kopf)")
    operator.add_argument("--liveness", metavar="URL", help="serve kopf's health endpoint here")
    operator.add_argument("--standalone", action="store_true", help="no peering (one replica)")
    operator.add_argument("--namespace", help=argparse.SUPPRESS)
    operator.add_argument("--webhook-port", type=int, metavar="PORT",
                          help="serve the validating admission webhook on this port (overlays/webhook/)")
    operator.add_argument("--webhook-cert", metavar="FILE", help="the webhook's TLS certificate (PEM)")
    operator.add_argument("--webhook-key", metavar="FILE", help="the webhook's TLS private key (PEM)")
    operator.add_argument("--webhook-addr", metavar="ADDRESS",
                          help="listen on this address only (default: every interface)")
    operator.add_argument("--webhook-insecure", action="store_true", help=argparse.SUPPRESS)
    operator.add_argument("--metrics-port", type=int, metavar="PORT",
                          help="serve Prometheus /metrics and the readiness check /readyz on this port")
    operator.add_argument("--metrics-addr", default="0.0.0.0", metavar="ADDRESS",
                          help="listen on this address (default: every interface)")
    operator.add_argument("--log-format", choices=("text", "json"), default="text",
                          help="json: one JSON object per line, one line per reconcile with "
                          "policy, trigger, result, writes and duration")
    operator.add_argument("--leader-elect", action="store_true",
                          help="run as one of several replicas: only the holder of a Lease reconciles")
    operator.add_argument("--leader-elect-namespace", metavar="NS",
                          default=os.environ.get("POD_NAMESPACE") or "kata-sizing",
                          help="where the Lease lives (default: $POD_NAMESPACE, else kata-sizing)")
    operator.add_argument("--kubelet-access", choices=("direct", "apiserver"), default="direct",
                          help="how the measurement reads kubelet Summaries: direct (each kubelet's port, needs "
                               "nodes/stats) or apiserver (the API server's node proxy, needs nodes/proxy); "
                               "see docs/measurement.md")
    operator.add_argument("--kubelet-ca", metavar="FILE",
                          help="direct: the CA of the kubelets' serving certificates (default: the API server's CA)")
    operator.add_argument("--kubelet-insecure-skip-tls-verify", action="store_true",
                          help="direct: do not verify the kubelets' serving certificates (self-signed ones)")
    operator.add_argument("--lease-duration", type=float, default=15.0, metavar="S", help=argparse.SUPPRESS)
    operator.add_argument("--renew-deadline", type=float, default=10.0, metavar="S", help=argparse.SUPPRESS)
    operator.add_argument("--retry-period", type=float, default=2.0, metavar="S", help=argparse.SUPPRESS)
    operator.set_defaults(func=cmd_operator)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except InputError as exc:
        print(f"error: {bounded.printable(str(exc))}", file=sys.stderr)
        return EXIT_UNREADABLE
    except PolicyError as exc:
        _print_problems(exc.problems)
        return EXIT_INVALID
    except QuantityError as exc:
        print(f"error: {bounded.printable(str(exc))}", file=sys.stderr)
        return EXIT_INVALID
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
