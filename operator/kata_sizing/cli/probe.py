"""`kata-sizing probe`: the guest side measured by booting the node's VMM at each class's VM sizes."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..core.bounded import InputError
from .common import EXIT_OK, read_text, sized_policy

HELP = ("boot the node's VMM and guest kernel at each class's VM sizes and "
        "measure the guest side, as calibrate's CSV")


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
    parser.add_argument("--points", type=int, default=3, metavar="N", help="VM sizes per class (default 3)")
    parser.add_argument("--accel", choices=("auto", "kvm", "tcg"), default="auto",
                        help="auto: KVM when a guest runs under it, else TCG")
    parser.add_argument("--memory-dir", default="/dev/shm", metavar="DIR",
                        help="where guest memory files go, as Kata's QEMU puts them (default /dev/shm)")
    parser.add_argument("--node", metavar="NAME", help="the node's name, for the rows")
    parser.add_argument("--timeout", type=float, default=300.0, metavar="S", help="per VM (default 300)")


def run(args: argparse.Namespace) -> int:
    """Boot the node's VMM and guest kernel at each class's VM sizes and measure the guest side
    (docs/probe.md), as calibrate's CSV with the guest's columns filled."""
    import tempfile

    from .. import vm
    from ..core.calibrate import PROBE_COLUMNS
    from ..core.probe import (
        KATA_ROOT,
        TCG_TB_SIZE_MIB,
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
    from ..core.survey import COLUMNS, to_csv

    policy, sizing = sized_policy(args, most_timeout_s=3600)
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
                rows.append(probe_row(point, result.report, result.host, args.node, accelerator))
                print(f"note: {describe_row(point, result.report, result.host, accelerator)}", file=sys.stderr)
    except ProbeError as exc:
        raise InputError(str(exc)) from None
    sys.stdout.write(to_csv(rows, [
        f"kata-sizing probe of policy {policy.name}: {len(rows)} VM(s) of {paths.vmm} with {paths.kernel} "
        f"under {accelerator} ({why}).",
        "Guest side: MemTotal and used as `free` gives them at boot, workload_allocated_mib what a process could "
        "allocate and touch before the guest refused it; host side: the VMM's cgroup peak "
        "(pod_cgroup_memory_current_bytes, once the VM was fully resident) and peak resident memory.",
        *([f"Under TCG the host side holds QEMU's translation cache (tb-size={TCG_TB_SIZE_MIB} MiB), which KVM does "
           "not have; the rows say so (accelerator, tcg_tb_size_mib) and calibrate takes it into account."]
          if accelerator == "tcg" else []),
        "The guest is the node's kernel with the probe's init (guest kernel-only: no Kata agent) and the host side "
        "QEMU's alone (host_processes vmm): calibrate says which parts of a pod these rows cannot see and where it "
        "takes them from.",
        f"Fit with: kata-sizing calibrate THIS.csv --policy {args.policy}",
    ], columns=(*COLUMNS, *PROBE_COLUMNS)))
    return EXIT_OK
