"""A refit proposal as `calibrate --policy` and `render --proposal` print it, and `--plot`."""

from __future__ import annotations

import argparse
from decimal import Decimal

from ..core.bounded import InputError
from ..core.model import PolicyError, format_decimal_error
from .common import EXIT_INVALID, EXIT_OK, checked_flag, print_problems


def margin_flag(args: argparse.Namespace) -> Decimal | None:
    """--margin when given (checked as the policy's field is), else None: the policy's own."""
    if args.margin is None:
        return None
    problem = format_decimal_error(checked_flag("--margin", args.margin) or "", at_most=1)
    if problem:
        raise PolicyError([f"--margin: {problem}"])
    return Decimal(args.margin)


def part_lines(fit, host_side: str) -> list[str]:
    """Where each part of a pod's memory comes from (calibrate.Fit.parts), one line each, and the host
    side: what `calibrate` prints with or without a policy."""
    width = max(len(p.part.value) for p in fit.parts) + 1
    lines = ["what each part of a pod's memory comes from (docs/sizing-model.md#what-each-row-saw):"]
    lines += [f"  {(p.part.value + ':').ljust(width)} {p.describe()}" for p in fit.parts]
    lines.append(f"  {'host side:'.ljust(width)} {host_side}")
    return lines


def proposal_lines(proposal) -> list[str]:
    """What a proposal says per class, one line each, for calibrate --policy and render --proposal."""
    lines = part_lines(proposal.fit, proposal.host_side)
    lines += [f"note: {note}" for note in proposal.notes]
    lines.append(f"margin {proposal.margin}; headroom warning {proposal.threshold.describe()}; the survey's VMs reach "
                 f"{format(proposal.surveyed_vm_mib.normalize(), 'f')} MiB")
    for c in proposal.classes:
        line = (f"class {c.name}: {'kept: ' if c.kept else ''}guest budget {c.guest_budget_mib} MiB (now "
                f"{c.guest_budget_before_mib}), podFixed {c.pod_fixed['cpu']}/{c.pod_fixed['memory']} (now "
                f"{c.pod_fixed_before['cpu']}/{c.pod_fixed_before['memory']}), largest VM {c.largest_vm_mib} MiB")
        if c.extrapolated:
            line += " (extrapolated: beyond the largest surveyed VM)"
        if c.min_headroom_bytes is not None:
            line += (f"; {c.pods} measured pod(s), least headroom in the proposed VM {_mib_text(c.min_headroom_bytes)} "
                     f"({c.min_headroom_pod}), warning line {_mib_text(c.warning_line_bytes)}")
        lines.append(line)
        lines += [f"  kept because {reason}" for reason in c.kept]
    return lines


def set_block(proposal) -> dict:
    """What to set in the policy's spec: the overhead fields, and the classes when one is kept."""
    block: dict = {"overhead": proposal.overhead}
    classes = proposal.classes_block()
    if classes is not None:
        block["classes"] = classes
    return block


def proposal_verdict(proposal) -> int:
    """Exit 1, with a line per class, when a measured pod would be under its warning line or the
    survey refutes an explicit value."""
    problems = [f"class {c.name}: pod {c.min_headroom_pod} would have {_mib_text(c.min_headroom_bytes)} of headroom, "
                f"under its warning line {_mib_text(c.warning_line_bytes)}" for c in proposal.uncovered]
    problems += [f"class {c.name}: {reason}" for c in proposal.refuted for reason in c.refuted]
    print_problems(problems)
    return EXIT_INVALID if problems else EXIT_OK


def plot_if_asked(args: argparse.Namespace, fit, proposal) -> None:
    """--plot FILE: the fit drawn (core-free: matplotlib is imported here only, when asked)."""
    if getattr(args, "plot", None) is None:
        return
    from ..plot import PlotUnavailable, plot_fit

    checked_flag("--plot", args.plot)
    try:
        plot_fit(fit, proposal, args.plot)
    except PlotUnavailable as exc:
        raise InputError(str(exc)) from None
    except OSError as exc:
        raise InputError(f"--plot: {args.plot}: cannot write ({exc.strerror or exc})") from None


def _mib_text(size_bytes: int) -> str:
    from ..core.headroom import mib_text

    return mib_text(size_bytes)
