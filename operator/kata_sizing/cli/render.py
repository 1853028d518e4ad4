"""`kata-sizing render`: the objects the operator applies for a policy (or `--shared`,
`--values-only`, `--proposal`)."""

from __future__ import annotations

import argparse
import json
import sys

from ..core import yamlout
from ..core.bounded import InputError
from ..core.model import KataSizingPolicy
from ..core.quantity import cpu_cores, memory_bytes
from .common import (
    EXIT_INVALID,
    EXIT_OK,
    checked_flag,
    kubelet_version_flag,
    load_policies,
    print_problems,
    quantity_flag,
    read_text,
)
from .proposals import margin_flag, plot_if_asked, proposal_lines, proposal_verdict

HELP = "print the objects the operator applies for a policy"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("policy", metavar="POLICY.yaml", nargs="?", help="policy file ('-' for stdin)")
    parser.add_argument("--shared", action="store_true",
                        help="print only the admission policies every policy's bindings name (the install's; "
                             "for the one GitOps application that owns them), not the policy's objects")
    parser.add_argument("-o", "--output", choices=("yaml", "json"), default="yaml")
    parser.add_argument("--node-capacity", metavar="QUANTITY", help="add node guidance for this memory capacity")
    parser.add_argument("--node-cpu", metavar="QUANTITY", help="the node's CPU capacity, for VMs-per-class")
    parser.add_argument("--infra-pod-memory", metavar="QUANTITY",
                        help="memory requests of the node's non-Kata pods (default: none)")
    parser.add_argument("--kubelet-version", metavar="VERSION",
                        help="the nodes' kubelet (v1.37.2): the feature gates their configuration needs")
    parser.add_argument("--values-only", action="store_true",
                        help="print only the kata-deploy values overlay (for helm -f, or to commit for GitOps)")
    parser.add_argument("--proposal", metavar="SURVEY.csv",
                        help="print the values overlay's diff with the overhead refitted from a survey "
                             "(kata-sizing survey), for a GitOps change")
    parser.add_argument("--margin", help="with --proposal: the margin of the refit (default: the policy's overhead.margin)")
    parser.add_argument("--plot", metavar="FILE.svg", help="with --proposal: draw the fit (see calibrate --plot)")
    parser.add_argument("--node-name", default="node", help=argparse.SUPPRESS)


def run(args: argparse.Namespace) -> int:
    from ..core.render import render_policy

    checked_flag("--node-name", args.node_name)
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
        from ..core.guidance import NodeFacts

        capacity = quantity_flag("--node-capacity", args.node_capacity, memory_bytes)
        assert capacity is not None  # args.node_capacity is set
        nodes = [NodeFacts(
            name=args.node_name,
            capacity_memory_bytes=capacity,
            capacity_cpu=quantity_flag("--node-cpu", args.node_cpu, cpu_cores),
            infra_pod_memory_bytes=quantity_flag("--infra-pod-memory", args.infra_pod_memory, memory_bytes),
            kubelet_version=kubelet_version_flag(args.kubelet_version),
        )]
    objects: list[dict] = []
    errors: list[str] = []
    overlays: list[tuple[str, str, dict]] = []  # (policy, its values as text and as data)
    shared: dict[str, None] = {}  # the shared admission policies the bindings name, in order
    for policy in policies:
        rendered = render_policy(policy, nodes=nodes)
        errors.extend(f"{policy.name}: {p}" for p in rendered.problems if p.severity == "error")
        print_problems([f"{policy.name}: {p}" for p in rendered.problems if p.severity == "warning"], "warning")
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
        shared.update(dict.fromkeys(o["spec"]["policyName"] for o in rendered.admission))
    if errors:
        print_problems(errors)
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
    from ..core.render import shared_admission_objects

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

    from ..core.calibrate import CalibrationError, parse_samples_csv
    from ..core.proposal import propose
    from ..core.render import render_policy

    if len(policies) != 1:
        raise InputError(f"--proposal refits one policy; {args.policy} holds {len(policies)}")
    if args.values_only or args.node_capacity or args.output != "yaml":
        raise InputError("--proposal prints a diff of the values overlay; drop --values-only, --node-capacity and -o")
    policy = policies[0]
    try:
        proposal = propose(policy, parse_samples_csv(read_text(args.proposal)), margin=margin_flag(args))
    except CalibrationError as exc:
        print_problems([f"{args.proposal}: {p}" for p in exc.problems])
        return EXIT_INVALID
    assert proposal.refitted is not None  # propose() refits or raises
    now, proposed = render_policy(policy), render_policy(proposal.refitted)
    errors = [f"{policy.name}: {p}" for p in proposed.problems if p.severity == "error"]
    if errors:
        print_problems(errors)
        return EXIT_INVALID
    name = f"{policy.name}-kata-deploy-values/values.yaml"
    print(f"# kata-sizing: policy {policy.name} refitted from {args.proposal} ({proposal.rows} row(s)).")
    print("# Set in the policy (spec.overhead):")
    for line in yamlout.dump(proposal.overhead).splitlines():
        print(f"#   {line}")
    if proposal.classes_block() is not None:
        print("# and (spec.classes: a kept class keeps its values):")
        for line in yamlout.dump(proposal.classes_block()).splitlines():
            print(f"#   {line}")
    for line in proposal_lines(proposal):
        print(f"# {line}")
    sys.stdout.writelines(difflib.unified_diff(
        now.values_yaml.splitlines(keepends=True), proposed.values_yaml.splitlines(keepends=True),
        fromfile=f"{name} (now)", tofile=f"{name} (proposed)"))
    plot_if_asked(args, proposal.fit, proposal)
    return proposal_verdict(proposal)


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
