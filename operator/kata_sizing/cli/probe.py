"""`kata-sizing probe`: the guest side measured by booting the node's VMM at each class's VM sizes.

Exit codes (docs/probe.md): 0 every VM measured; 1 the policy is invalid; 2 refused before any
boot (a flag, a path, the node's Kata configuration, a VM that does not fit this host); 3 some
VMs failed (a `#` line of the CSV names each, the rows written are good); 4 the CSV could not be
written (stdout full or closed); 130 stopped by SIGTERM or Ctrl-C (the rows written are kept).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import signal
import sys
from pathlib import Path
from typing import IO, TYPE_CHECKING

from ..core.bounded import InputError
from .common import EXIT_OK, EXIT_UNREADABLE, read_text, sized_policy

if TYPE_CHECKING:
    from ..core.kataguest import GuestBoot, KernelModule
    from ..core.model import Runtime
    from ..core.probe import VmmPaths
    from ..core.probehost import ProbePlan
    from ..core.sizing import PolicySizing
    from ..vm import VmCgroups

HELP = ("boot the node's VMM and guest kernel at each class's VM sizes and "
        "measure the guest side, as calibrate's CSV")

EXIT_SOME_FAILED = 3
EXIT_OUTPUT = 4
EXIT_INTERRUPTED = 130
# What the workload may read through virtio-fs (--share-read): the probe writes it once, on its own disk.
MAX_SHARE_READ_BYTES = 1024 * 1024 * 1024
# Kata's initrd is read whole, to put the probe's init after it (Kata's are tens of MiB).
MAX_KATA_INITRD_BYTES = 1024 * 1024 * 1024


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
    parser.add_argument("--virtiofsd", metavar="PATH",
                        help="the virtio-fs daemon to start beside each VM (overrides the configuration's "
                             "virtio_fs_daemon)")
    parser.add_argument("--guest-modules", metavar="DIR",
                        help="kernel modules (*.ko) the guest kernel needs for Kata's devices, loaded by the init "
                             "(a distribution kernel; Kata's own builds them in)")
    parser.add_argument("--share-read", metavar="QUANTITY", default="16Mi",
                        help="what the workload reads through virtio-fs before it allocates, as a container reads "
                             "its files (default 16Mi)")
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
                          ("--memory-dir", args.memory_dir), ("--virtiofsd", args.virtiofsd),
                          ("--guest-modules", args.guest_modules)):
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
    try:
        args.share_read_bytes = memory_bytes(args.share_read)
    except QuantityError as exc:
        raise InputError(f"--share-read: {exc}") from None
    if args.share_read_bytes > MAX_SHARE_READ_BYTES:
        raise InputError(f"--share-read: {args.share_read!r} is more than {MAX_SHARE_READ_BYTES // MIB} MiB")
    return classes, max_vm_mib


def _vmm_paths(args: argparse.Namespace, shim: str, sizing: PolicySizing) -> VmmPaths:
    from ..core.probe import KATA_ROOT, ProbeError, VmmPaths, config_candidates, vm_paths_problem, vmm_paths

    problem = None if args.vmm else vm_paths_problem(sizing.hypervisor)
    if problem:
        raise ProbeError(problem)
    if args.config:
        paths = vmm_paths(read_text(args.config), args.config, sizing.hypervisor, sizing.runtime)
    elif args.vmm and args.kernel:
        paths = VmmPaths(args.vmm, args.kernel, sizing.hypervisor, "--vmm/--kernel")
    else:
        candidates = config_candidates(shim, sizing.runtime, args.kata_root or KATA_ROOT)
        found = next((c for c in candidates if Path(c).is_file()), None)
        if found is None:
            raise ProbeError(f"no Kata configuration for shim {shim} under {args.kata_root or KATA_ROOT} "
                             f"(looked at {', '.join(candidates)}); give --config KATA.toml, or --vmm and --kernel")
        paths = vmm_paths(read_text(found), found, sizing.hypervisor, sizing.runtime)
    kata = paths.kata
    if args.virtiofsd:
        kata = dataclasses.replace(kata, virtio_fs_daemon=args.virtiofsd)
    return dataclasses.replace(paths, vmm=args.vmm or paths.vmm, kernel=args.kernel or paths.kernel, kata=kata)


def run(args: argparse.Namespace) -> int:
    """Boot the node's VMM and guest kernel at each class's VM sizes and measure the guest side
    (docs/probe.md), as calibrate's CSV with the guest's columns filled, a row written as each VM
    finishes; a plan first, and nothing booted that cannot fit."""
    from .. import vm
    from ..core.kataguest import load_order
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
        modules: list[KernelModule] = []
        if not args.plan:
            paths = _vmm_paths(args, policy.spec.shim, sizing)
            vm.check_paths(paths)
            if args.guest_modules:
                modules = load_order(vm.read_modules(Path(args.guest_modules)))
        if not Path(args.memory_dir).is_dir():
            raise ProbeError(f"--memory-dir {args.memory_dir}: not a directory (Kata's QEMU puts guest memory on /dev/shm)")
        if not args.plan:
            init = vm.find_init(args.init)
    except ProbeError as exc:
        raise InputError(str(exc)) from None
    plan = ProbePlan(tuple(kept), tuple(left_out), -(-args.share_read_bytes // (1024 * 1024)))
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
    refusals = [problem for problem in (fit_problem(point, room, plan.read_mib) for point in kept) if problem]
    if refusals:
        print_problems([f"{problem}; nothing booted (probe less: --classes, --max-vm-memory)"
                        for problem in refusals])
        return EXIT_UNREADABLE
    if args.plan:
        return EXIT_OK
    assert paths is not None and init is not None
    try:
        return _probe(args, policy.name, plan, paths, init, cgroups, sizing.runtime, modules)
    except OutputError as exc:
        print_problems([str(exc)])
        return EXIT_OUTPUT
    except ProbeError as exc:
        raise InputError(str(exc)) from None


def _probe(args: argparse.Namespace, policy_name: str, plan: ProbePlan, paths: VmmPaths, init: Path,
           cgroups: VmCgroups, runtime: Runtime, modules: list[KernelModule]) -> int:
    import tempfile

    from .. import vm
    from ..core.calibrate import PROBE_COLUMNS, CalibrationError
    from ..core.kataguest import GuestBoot, initramfs, virtiofsd_command
    from ..core.probe import TCG_TB_SIZE_MIB, describe_row, kernel_command_line, probe_row, report_problem, row_kinds
    from ..core.probehost import failure, fit_problem
    from ..core.survey import COLUMNS, comment_line, csv_line, row_line

    columns = (*COLUMNS, *PROBE_COLUMNS)
    out = CsvOut(sys.stdout)
    failed: list[str] = []
    said = len(cgroups.notes)  # in the plan already
    kata = paths.kata
    with vm.StopRequest() as stop, cgroups, tempfile.TemporaryDirectory(prefix="kata-sizing-probe-") as scratch:
        for note in cgroups.notes[said:]:
            print(f"note: {note}", file=sys.stderr)
        workdir = Path(scratch)
        image = workdir / "initramfs.cpio"
        guest = _GuestFiles(args, paths, init, workdir, modules)
        if args.accel == "auto":  # the probe's init alone: whether KVM runs a guest, whatever Kata's initrd holds
            check = workdir / "kvm-check.cpio"
            check.write_bytes(initramfs(init.read_bytes()))
            accelerator, why = vm.detect_accelerator(paths, check, workdir, args.memory_dir, cgroups, stop)
        else:
            accelerator, why = args.accel, "--accel"
        if stop():
            return EXIT_INTERRUPTED
        image.write_bytes(initramfs(init.read_bytes(), [(m.name, m.data) for m in modules], guest.kata_initrd()))
        host_mib, vsock = vm.host_memory_mib(), vm.vsock_available()
        # What every VM has (each its own socket and CID, below): for the notes and the CSV's comments.
        sample_boot = GuestBoot(kata, runtime, host_mib, guest.image_bytes,
                                str(workdir / "virtiofsd.sock") if kata.virtio_fs else None, 3 if vsock else None)
        kinds = row_kinds(sample_boot)
        for note in guest.notes(sample_boot, vsock):
            print(f"note: {note}", file=sys.stderr)
        print(f"note: booting {paths.vmm} with {paths.kernel} ({paths.source}) under {accelerator}: {why}",
              file=sys.stderr)
        comments = [
            f"kata-sizing probe of policy {policy_name}: {len(plan.points)} VM(s) of {paths.vmm} with {paths.kernel} "
            f"under {accelerator} ({why}).",
            *([f"Left out as asked: {', '.join(f'{p.vm.memory_mib} MiB of class {p.class_name}' for p, _ in plan.left_out)}."]
              if plan.left_out else []),
            "Guest side: MemTotal and used as `free` gives them at boot, workload_allocated_mib what a process could "
            "allocate and touch before the guest refused it; host side: the VM's cgroup peak "
            "(pod_cgroup_memory_current_bytes, once the VM was fully resident) and the VMM's peak resident memory.",
            *([f"Under TCG the host side holds QEMU's translation cache (tb-size={TCG_TB_SIZE_MIB} MiB), which KVM "
               "does not have: tcg_cache_resident_bytes is what of it was resident at the cgroup's peak, and calibrate "
               "takes it off."] if accelerator == "tcg" else []),
            f"The guest: {guest.describe(sample_boot)} (guest {kinds[0]}); the host side: "
            f"{'QEMU and virtiofsd' if kinds[1] == 'vmm+virtiofsd' else 'QEMU alone'} in the VM's cgroup "
            f"(host_processes {kinds[1]}, no shim); devices {kinds[2]}. calibrate says which parts of a pod these rows "
            "cannot see and where it takes them from.",
            "A VM that gave no row is a `#` line naming its class, size and why.",
            f"Fit with: kata-sizing calibrate THIS.csv --policy {args.policy}",
        ]
        out.write("".join(map(comment_line, comments)) + csv_line(columns))
        for number, point in enumerate(plan.points):
            what = f"class {point.class_name}: the VM of {point.vm.memory_mib} MiB ({point.vm.vcpus} vCPU)"
            if stop():
                break
            problem = fit_problem(point, vm.host_room(args.memory_dir, cgroups), plan.read_mib)
            if problem:
                failed.append(problem)
                out.write(comment_line(f"{problem}: not booted"))
                print(f"note: {problem}: not booted", file=sys.stderr)
                continue
            socket = workdir / f"vm{number}.virtiofsd.sock"
            boot = dataclasses.replace(sample_boot, virtio_fs_socket=str(socket) if kata.virtio_fs else None,
                                       vsock_cid=_vsock_cid() if vsock else None)
            guest.drop_cached(image)
            result = vm.boot(paths, point.vm, accelerator=accelerator, initramfs_path=image,
                             memory_dir=args.memory_dir, workdir=workdir, command_line=kernel_command_line(0),
                             timeout_s=args.timeout, name=f"vm{number}", cgroups=cgroups, interrupted=stop, guest=boot,
                             virtiofsd=virtiofsd_command(kata, str(socket), str(guest.share)) if kata.virtio_fs else None)
            for note in (*result.notes, *(f"the guest said: {n}" for n in result.report.notes)):
                print(f"note: {what}: {note}", file=sys.stderr)
            if stop() and result.exit_code is None:
                out.write(comment_line(f"{what}: stopped by {signal.Signals(stop.signal or 2).name} before it "
                                       "finished: not measured"))
                break
            why_not = failure(point, args.memory_dir, result.end, report_problem(result.report, point.vm, boot),
                              plan.read_mib)
            row = None
            if why_not is None:
                try:
                    row = probe_row(point, result.report, result.host, args.node, accelerator, boot)
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
            out.write(comment_line(f"the row above: {describe_row(point, result.report, result.host, accelerator)}"))
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


def _vsock_cid() -> int:
    """A guest CID for a VM's vsock: Kata picks a free one; a random one is taken by another VM once in
    about four billion (QEMU then refuses it, and the VM fails saying so)."""
    import secrets

    return 3 + secrets.randbelow(2**32 - 4)


class _GuestFiles:
    """What a probe's VMs read from the host besides the VMM and kernel: Kata's initrd or image, and the
    virtio-fs share (the workload's binary and the file it reads), each out of the page cache before a VM
    boots, so each VM is charged for what it reads as the first Kata pod on a node is."""

    def __init__(self, args: argparse.Namespace, paths: VmmPaths, init: Path, workdir: Path,
                 modules: list[KernelModule]) -> None:
        from .. import vm
        from ..core.kataguest import SHARE_DATA, SHARE_WORKLOAD

        self.kata, self.modules = paths.kata, modules
        self.share = workdir / "share"
        self.share_read_bytes = args.share_read_bytes
        self.image_bytes = Path(self.kata.image).stat().st_size if self.kata.image else None
        self.filesystem = vm.filesystem_type(workdir)
        self.dropping_failed = False
        # (file, whether the probe wrote it): Kata's image is the node's, read only.
        self.files: list[tuple[Path, bool]] = [(Path(self.kata.image), False)] if self.kata.image else []
        if self.kata.virtio_fs:
            self.share.mkdir()
            workload = self.share / SHARE_WORKLOAD
            workload.write_bytes(init.read_bytes())
            workload.chmod(0o755)
            data = self.share / SHARE_DATA
            with open(data, "wb") as handle:
                chunk = b"kata-sizing: a container's files, read through virtio-fs\n" * 16384
                left = self.share_read_bytes
                while left > 0:
                    left -= handle.write(chunk[:left])
            self.files += [(workload, True), (data, True)]

    def kata_initrd(self) -> bytes | None:
        from ..core.probe import ProbeError

        if not self.kata.initrd:
            return None
        path = Path(self.kata.initrd)
        if path.stat().st_size > MAX_KATA_INITRD_BYTES:
            raise ProbeError(f"the initrd {self.kata.initrd} is larger than {MAX_KATA_INITRD_BYTES // 2**20} MiB")
        return path.read_bytes()

    def drop_cached(self, initramfs_path: Path) -> None:
        from .. import vm

        for path, written in (*self.files, (initramfs_path, True)):
            problem = vm.drop_cached(path, written)
            if problem and not self.dropping_failed:  # said once: the same holds for every VM
                self.dropping_failed = True
                print(f"note: {problem}: a VM may find its pages cached and not be charged for them", file=sys.stderr)

    def describe(self, boot: GuestBoot) -> str:
        from ..core.kataguest import KATA_AGENT_PATH as KATA_AGENT

        kata, said = self.kata, []
        if kata.image:
            said.append(f"the node's kernel with Kata's image {kata.image} on "
                        f"{'an nvdimm (DAX)' if boot.nvdimm else 'virtio-blk'}, its agent {KATA_AGENT} started by the "
                        "probe's init before the workload")
        elif kata.initrd:
            said.append(f"the node's kernel with Kata's initrd {kata.initrd} and the probe's init appended, which "
                        f"starts its agent {KATA_AGENT} before the workload")
        else:
            said.append("the node's kernel with the probe's init alone (no Kata agent)")
        if self.modules:
            said.append(f"{len(self.modules)} kernel module(s) loaded for Kata's devices")
        if boot.virtio_fs_socket is not None:
            said.append(f"its workload started from a virtio-fs share ({kata.virtio_fs_daemon}, cache {kata.virtio_fs_cache}) "
                        f"and reading {self.share_read_bytes // 2**20} MiB through it first")
        return "; ".join(said)

    def notes(self, boot: GuestBoot, vsock: bool) -> list[str]:
        found = []
        if not vsock:
            found.append("this host has no /dev/vhost-vsock: the VMs go without Kata's vsock device (Kata's own agent "
                         "needs it and ends without it; the rows' devices say so)")
        if self.kata.shared_fs == "virtio-fs" and self.kata.virtio_fs_daemon is None:
            found.append("no virtio-fs daemon (the configuration's virtio_fs_daemon, or --virtiofsd): the VMs go without "
                         "virtio-fs, and the rows' host side counts the VMM alone")
        elif self.kata.shared_fs != "virtio-fs":
            found.append(f"shared_fs {self.kata.shared_fs}: the probe starts a daemon for virtio-fs only; the rows' host "
                         "side counts the VMM alone")
        if boot.virtio_fs_socket is not None and self.filesystem in ("tmpfs", "ramfs"):
            found.append(f"the share is on {self.filesystem} (TMPDIR): its pages stay charged to the probe, and the rows' "
                         "host side lacks the page cache of what the guest reads")
        return found
