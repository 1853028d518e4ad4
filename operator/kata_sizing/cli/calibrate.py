"""`kata-sizing calibrate`: the overhead function fitted from survey rows."""

from __future__ import annotations

import argparse
import json
import sys
from decimal import Decimal

from ..core import yamlout
from ..core.bounded import InputError
from ..core.quantity import memory_bytes
from .common import EXIT_INVALID, EXIT_OK, chosen_policy, print_problems, quantity_flag, read_text
from .proposals import margin_flag, part_lines, plot_if_asked, proposal_lines, proposal_verdict, set_block

HELP = "fit the overhead function from survey rows"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("samples", metavar="SAMPLES.csv")
    parser.add_argument("--margin", help="safety margin on the guest budget and the host side (default: the "
                        "policy's overhead.margin with --policy, else 0.10)")
    parser.add_argument("--policy-name", help="which policy, when --policy holds several")
    parser.add_argument("--plot", metavar="FILE.svg",
                        help="draw the fit (samples, line, classes) to an SVG or PNG; needs the plot extra "
                             "(pip install 'kata-sizing[plot]')")
    parser.add_argument("--policy", metavar="POLICY.yaml",
                        help="refit this policy: the classes' podFixed, each checked against the measured pods")
    parser.add_argument("--host-memory", metavar="QUANTITY",
                        help="without --policy: the host side to assume for rows from the kubelet when no VM "
                             "was fully resident (default: none, such rows are refused)")
    parser.add_argument("-o", "--output", choices=("text", "json"), default="text")


def run(args: argparse.Namespace) -> int:
    from ..core.calibrate import CalibrationError, checked_overhead_block, fit_overhead, parse_samples_csv

    margin = margin_flag(args)
    host_memory = None
    if args.host_memory is not None:
        if args.policy:
            raise InputError("--host-memory is for a fit without --policy (the policy's hostMemory is used)")
        host_bytes = quantity_flag("--host-memory", args.host_memory, memory_bytes)
        host_memory = None if host_bytes is None else -(-host_bytes // (1024 * 1024))
    text = read_text(args.samples)
    proposal = None
    try:
        samples = parse_samples_csv(text)
        if args.policy:
            from ..core.proposal import propose

            proposal = propose(chosen_policy(args, args.policy), samples, margin=margin)
            fit, block = proposal.fit, proposal.overhead
        else:
            from ..core.defaults import DEFAULT_MARGIN

            fit = fit_overhead(samples, margin=DEFAULT_MARGIN if margin is None else margin,
                               assumed_host_mib=host_memory)
            block = checked_overhead_block(fit.overhead_block())
    except CalibrationError as exc:
        print_problems([f"{args.samples}: {p}" for p in exc.problems])
        return EXIT_INVALID
    residuals = [format(r.normalize(), "f") for r in fit.residuals_mib]
    report: dict[str, object] = {"overhead": block, "residualsMiB": residuals}
    if fit.max_guest_daemons_mib is not None:
        report["maxGuestDaemonsMiB"] = format(Decimal(fit.max_guest_daemons_mib).normalize(), "f")
    host_side = fit.host_basis or "not measured by any row: hostMemory is not fitted (the policy's stays)"
    if proposal is not None:
        report.update({k: v for k, v in proposal.as_dict().items() if k != "overhead"})
    else:
        report["largestSurveyedVmMiB"] = format(fit.largest_vm_mib.normalize(), "f")
        report["hostSide"] = host_side
        report["parts"] = [p.as_dict() for p in fit.parts]
        if fit.notes:
            report["notes"] = list(fit.notes)
    plot_if_asked(args, fit, proposal)
    if args.output == "json":
        print(json.dumps(report, indent=2))
        return EXIT_OK if proposal is None else proposal_verdict(proposal)
    print("# Fitted overhead function (upper envelope: every sample covered).")
    if proposal is not None and proposal.classes_block() is not None:
        print("# Paste under spec: in a KataSizingPolicy (classes too: a kept class keeps its values there).")
    else:
        print("# Paste under spec: in a KataSizingPolicy.")
    sys.stdout.write(yamlout.dump(set_block(proposal) if proposal is not None else {"overhead": block}))
    print("# Residuals per sample (line above measurement, MiB): " + ", ".join(residuals))
    if proposal is None:
        for line in part_lines(fit, host_side):
            print(f"# {line}")
        for note in fit.notes:
            print(f"# note: {note}")
        return EXIT_OK
    for line in proposal_lines(proposal):
        print(f"# {line}")
    return proposal_verdict(proposal)
