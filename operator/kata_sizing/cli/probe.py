"""`kata-sizing probe`: the guest side measured by booting the node's VMM at each class's VM sizes.

Exit codes (docs/probe.md): 0 every VM measured; 1 the policy is invalid; 2 refused before any
boot (a flag, a path, the node's Kata configuration, a VM that does not fit this host); 3 some
VMs failed (a `#` line of the CSV names each, the rows written are good); 4 the CSV could not be
written (stdout full or closed); 130 stopped by SIGTERM or Ctrl-C (the rows written are kept).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path
from typing import IO, TYPE_CHECKING

from ..core.bounded import InputError
from .common import EXIT_OK, EXIT_UNREADABLE, read_text, sized_policy

if TYPE_CHECKING:
    from ..core.probe import VmmPaths
    from ..core.probehost import ProbePlan
    from ..core.sizing import PolicySizing
    from ..vm import VmCgroups

HELP = ("boot the node's VMM and guest kernel at each class's VM sizes and "
        "measure the guest side, as calibrate's CSV")

EXIT_SOME_FAILED = 3
EXIT_OUTPUT = 4
EXIT_INTERRUPTED = 130


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("policy", metavar="POLICY.yaml")
    parser.add_argument("--policy-name", help="which policy, when the file holds several")
    parser.add_argument("--config", metavar="KATA.toml",
                        help="the node's Kata configuration for the policy's shim (default: found under --kata-root)")
    parser.add_argument("--kata-root", metavar="DIR", help="where kata-deploy installs (default /opt/kata)")
    parser.add_argument("--vmm", metavar="PATH", help="the VMM binary (overrides the configuration's path)")
    parser.add_argument("--kernel", metavar="PATH", help="the guest kernel (overrides the configuration's kernel)")
    parser.add_argument("--init", metavar="PATH",
                        help="the probe's init binary (default: $KATA_SIZING_PROBE_INIT or the image's)")
    parser.add_argument("--points", type=int, default=3, metavar="N", help="VM sizes per class (default 3, at most 10)")
    parser.add_argument("--classes", metavar="S,M", help="probe only these classes of the policy")
    parser.add_argument("--max-vm-memory", metavar="QUANTITY",
                        help="leave out VMs larger than this (e.g. 6Gi): what the host or a Job's limit can hold")
    parser.add_argument("--plan", action="store_true",
                        help="print the plan (VMs per class, memory, time, whether each fits this host) and boot nothing")
    parser.add_argument("--accel", choices=("auto", "kvm", "tcg"), default="auto",
                        help="auto: KVM when a guest runs under it, else TCG")
    parser.add_argument("--memory-dir", default="/dev/shm", metavar="DIR",
                        help="where guest memory files go, as Kata's QEMU puts them (default /dev/shm)")
    parser.add_argument("--node", metavar="NAME", help="the node's name, for the rows")
    parser.add_argument("--timeout", type=float, default=300.0, metavar="S", help="per VM (default 300)")


class OutputError(Exception):
    """The CSV could not be written; the message is one line."""


class CsvOut:
    """The CSV on stdout, each line flushed as it is written: the rows of the VMs measured so far
    survive whatever stops the probe next."""

    def __init__(self, stream: IO[str]) -> None:
        self.stream, self.rows = stream, 0

    def write(self, text: str, row: bool = False) -> None:
        try:
            self.stream.write(text)
            self.stream.flush()
        except OSError as exc:
            why = "closed (a pipe whose reader ended)" if isinstance(exc, BrokenPipeError) else (exc.strerror or str(exc))
            # What is still buffered can go nowhere: the interpreter's own flush at exit must not fail again.
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, self.stream.fileno())
            os.close(devnull)
            raise OutputError(f"stdout: cannot write the CSV: {why}; {self.rows} row(s) were written before "
                              "it, the VMs are stopped") from None
        self.rows += row


def _checked_flags(args: argparse.Namespace) -> tuple[list[str] | None, int | None]:
    """Every flag the probe passes on or writes, held to its grammar; (--classes, --max-vm-memory in MiB)."""
    from ..core.kubegrammar import dns_subdomain_problem
    from ..core.probe import path_problem
    from ..core.quantity import MIB, QuantityError, memory_bytes

    for option, value in (("POLICY.yaml", args.policy), ("--config", args.config), ("--kata-root", args.kata_root),
                          ("--vmm", args.vmm), ("--kernel", args.kernel), ("--init", args.init),
                          ("--memory-dir", args.memory_dir)):
        problem = None if value is None else path_problem(value)
        if problem:
            raise InputError(f"{option}: {problem}")
    if args.node is not None:
        problem = dns_subdomain_problem(args.node)
        if problem:
            raise InputError(f"--node: {problem}: a node's name as Kubernetes holds it")
    classes = None
    if args.classes is not None:
        classes = [name.strip() for name in args.classes.split(",")]
        if not all(classes):
            raise InputError(f"--classes: {args.classes[:80]!r} is not a list of class names separated by commas")
    max_vm_mib = None
    if args.max_vm_memory is not None:
        try:
            max_vm_mib = memory_bytes(args.max_vm_memory) // MIB
        except QuantityError as exc:
            raise InputError(f"--max-vm-memory: {exc}") from None
        if max_vm_mib < 1:
            raise InputError(f"--max-vm-memory: {args.max_vm_memory!r} is less than 1 MiB")
    return classes, max_vm_mib


def _vmm_paths(args: argparse.Namespace, shim: str, sizing: PolicySizing) -> VmmPaths:
    from ..core.probe import KATA_ROOT, ProbeError, VmmPaths, config_candidates, vm_paths_problem, vmm_paths

    problem = None if args.vmm else vm_paths_problem(sizing.hypervisor)
    if problem:
        raise ProbeError(problem)
    if args.config:
        paths = vmm_paths(read_text(args.config), args.config, sizing.hypervisor)
    elif args.vmm and args.kernel:
        paths = VmmPaths(args.vmm, args.kernel, sizing.hypervisor, "--vmm/--kernel")
    else:
        candidates = config_candidates(shim, sizing.runtime, args.kata_root or KATA_ROOT)
        found = next((c for c in candidates if Path(c).is_file()), None)
        if found is None:
            raise ProbeError(f"no Kata configuration for shim {shim} under {args.kata_root or KATA_ROOT} "
                             f"(looked at {', '.join(candidates)}); give --config KATA.toml, or --vmm and --kernel")
        paths = vmm_paths(read_text(found), found, sizing.hypervisor)
    if args.vmm or args.kernel:
        paths = VmmPaths(args.vmm or paths.vmm, args.kernel or paths.kernel, paths.hypervisor, paths.source,
                         paths.guest_image)
    return paths


def run(args: argparse.Namespace) -> int:
    """Boot the node's VMM and guest kernel at each class's VM sizes and measure the guest side
    (docs/probe.md), as calibrate's CSV with the guest's columns filled, a row written as each VM
    finishes; a plan first, and nothing booted that cannot fit."""
    from .. import vm
    from ..core.probe import ProbeError, probe_points, select_points
    from ..core.probehost import ProbePlan, fit_problem
    from .common import print_problems

    classes, max_vm_mib = _checked_flags(args)
    policy, sizing = sized_policy(args, most_timeout_s=3600)
    try:
        points = probe_points(sizing, args.points)
        kept, left_out = select_points(points, [c.name for c in sizing.classes], classes=classes,
                                       max_vm_memory_mib=max_vm_mib)
        if not kept:
            raise ProbeError(f"nothing to probe: every VM of the policy is left out ({left_out[0][1]}; the smallest is "
                             f"{min(p.vm.memory_mib for p, _ in left_out)} MiB)")
        paths = init = None
        if not args.plan:
            paths = _vmm_paths(args, policy.spec.shim, sizing)
            vm.check_paths(paths)
        if not Path(args.memory_dir).is_dir():
            raise ProbeError(f"--memory-dir {args.memory_dir}: not a directory (Kata's QEMU puts guest memory on /dev/shm)")
        if not args.plan:
            init = vm.find_init(args.init)
    except ProbeError as exc:
        raise InputError(str(exc)) from None
    plan = ProbePlan(tuple(kept), tuple(left_out))
    cgroups = vm.VmCgroups.here()
    room = vm.host_room(args.memory_dir, cgroups)
    if args.accel != "auto":
        accelerator, why = args.accel, "--accel"
    else:
        why_not = vm.kvm_problem()
        accelerator, why = ("tcg", why_not) if why_not else (
            "tcg", "KVM instead if a guest reaches its init under it, checked first with a 128 MiB VM")
    for line in plan.lines(policy.name, accelerator, why, room):
        print(line, file=sys.stderr)
    refusals = [problem for problem in (fit_problem(point, room) for point in kept) if problem]
    if refusals:
        print_problems([f"{problem}; nothing booted (probe less: --classes, --max-vm-memory)"
                        for problem in refusals])
        return EXIT_UNREADABLE
    if args.plan:
        return EXIT_OK
    assert paths is not None and init is not None
    try:
        return _probe(args, policy.name, plan, paths, init, cgroups)
    except OutputError as exc:
        print_problems([str(exc)])
        return EXIT_OUTPUT
    except ProbeError as exc:
        raise InputError(str(exc)) from None


def _probe(args: argparse.Namespace, policy_name: str, plan: ProbePlan, paths: VmmPaths, init: Path,
           cgroups: VmCgroups) -> int:
    import tempfile

    from .. import vm
    from ..core.calibrate import PROBE_COLUMNS, CalibrationError
    from ..core.probe import TCG_TB_SIZE_MIB, describe_row, initramfs, kernel_command_line, probe_row, report_problem
    from ..core.probehost import failure, fit_problem
    from ..core.survey import COLUMNS, comment_line, csv_line, row_line

    columns = (*COLUMNS, *PROBE_COLUMNS)
    out = CsvOut(sys.stdout)
    failed: list[str] = []
    said = len(cgroups.notes)  # in the plan already
    with vm.StopRequest() as stop, cgroups, tempfile.TemporaryDirectory(prefix="kata-sizing-probe-") as scratch:
        for note in cgroups.notes[said:]:
            print(f"note: {note}", file=sys.stderr)
        workdir = Path(scratch)
        image = workdir / "initramfs.cpio"
        image.write_bytes(initramfs(init.read_bytes()))
        if args.accel == "auto":
            accelerator, why = vm.detect_accelerator(paths, image, workdir, args.memory_dir, cgroups, stop)
        else:
            accelerator, why = args.accel, "--accel"
        if stop():
            return EXIT_INTERRUPTED
        print(f"note: booting {paths.vmm} with {paths.kernel} ({paths.source}) under {accelerator}: {why}",
              file=sys.stderr)
        comments = [
            f"kata-sizing probe of policy {policy_name}: {len(plan.points)} VM(s) of {paths.vmm} with {paths.kernel} "
            f"under {accelerator} ({why}).",
            *([f"Left out as asked: {', '.join(f'{p.vm.memory_mib} MiB of class {p.class_name}' for p, _ in plan.left_out)}."]
              if plan.left_out else []),
            "Guest side: MemTotal and used as `free` gives them at boot, workload_allocated_mib what a process could "
            "allocate and touch before the guest refused it; host side: the VMM's cgroup peak "
            "(pod_cgroup_memory_current_bytes, once the VM was fully resident) and peak resident memory.",
            *([f"Under TCG the host side holds QEMU's translation cache (tb-size={TCG_TB_SIZE_MIB} MiB), which KVM "
               "does not have; the rows say so (accelerator, tcg_tb_size_mib) and calibrate takes it into account."]
              if accelerator == "tcg" else []),
            "The guest is the node's kernel with the probe's init (guest kernel-only: no Kata agent) and the host "
            "side QEMU's alone (host_processes vmm): calibrate says which parts of a pod these rows cannot see and "
            "where it takes them from.",
            "A VM that gave no row is a `#` line naming its class, size and why.",
            f"Fit with: kata-sizing calibrate THIS.csv --policy {args.policy}",
        ]
        out.write("".join(map(comment_line, comments)) + csv_line(columns))
        for number, point in enumerate(plan.points):
            what = f"class {point.class_name}: the VM of {point.vm.memory_mib} MiB ({point.vm.vcpus} vCPU)"
            if stop():
                break
            problem = fit_problem(point, vm.host_room(args.memory_dir, cgroups))
            if problem:
                failed.append(problem)
                out.write(comment_line(f"{problem}: not booted"))
                print(f"note: {problem}: not booted", file=sys.stderr)
                continue
            result = vm.boot(paths, point.vm, accelerator=accelerator, initramfs_path=image,
                             memory_dir=args.memory_dir, workdir=workdir, command_line=kernel_command_line(0),
                             timeout_s=args.timeout, name=f"vm{number}", cgroups=cgroups, interrupted=stop)
            for note in result.notes:
                print(f"note: {what}: {note}", file=sys.stderr)
            if stop() and result.exit_code is None:
                out.write(comment_line(f"{what}: stopped by {signal.Signals(stop.signal or 2).name} before it "
                                       "finished: not measured"))
                break
            why_not = failure(point, args.memory_dir, result.end, report_problem(result.report, point.vm))
            row = None
            if why_not is None:
                try:
                    row = probe_row(point, result.report, result.host, args.node, accelerator)
                except CalibrationError as exc:
                    why_not = f"the guest's report gives no valid row: {'; '.join(exc.problems)}"
            if row is None:
                failed.append(why_not or "")
                out.write(comment_line(f"{what} failed: {why_not}"))
                print(f"note: {what} failed: {why_not}", file=sys.stderr)
                continue
            out.write(row_line(row, columns), row=True)
            for note in result.notes:
                out.write(comment_line(f"{what}: {note}"))
            print(f"note: {describe_row(point, result.report, result.host, accelerator)}", file=sys.stderr)
        if stop():
            out.write(comment_line(f"Stopped by {signal.Signals(stop.signal or 2).name}: {out.rows} of "
                                   f"{len(plan.points)} VM(s) measured."))
            return EXIT_INTERRUPTED
        summary = f"{out.rows} of {len(plan.points)} VM(s) measured"
        out.write(comment_line(f"{summary}; {len(failed)} failed (the lines above say why)." if failed else f"{summary}."))
    if failed:
        print(f"note: {summary}; {len(failed)} failed: exit {EXIT_SOME_FAILED}", file=sys.stderr)
        return EXIT_SOME_FAILED
    return EXIT_OK
