"""`kata-sizing probe`'s pure part (core/probe.py) and its command's answers to bad input; the VMs
themselves boot in tests/vm/test_probe_vms.py (the probe's own run: a row, SIGBUS, an OOM kill) and
tests/vm/test_node_vms.py (`probe` end to end beside the node's VMs)."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path

import pytest
import yaml

from kata_sizing.cli import main
from kata_sizing.core.calibrate import PROBE_COLUMNS, parse_samples_csv
from kata_sizing.core.kataguest import GuestBoot, KataGuest, ModuleError, initramfs
from kata_sizing.core.model import Runtime, parse_policy
from kata_sizing.core.probe import (
    HostFigures,
    ProbeError,
    ProbePoint,
    config_candidates,
    kernel_command_line,
    parse_console,
    probe_points,
    probe_row,
    report_problem,
    vm_command,
    vmm_paths,
)
from kata_sizing.core.probehost import CgroupLevel, HostRoom, VmEnd, failure, fit_problem
from kata_sizing.core.quantity import MIB
from kata_sizing.core.sizing import Vm, explain_pod, size_policy
from kata_sizing.core.survey import COLUMNS, to_csv

POLICY = {"apiVersion": "katasizing.dev/v1alpha1", "kind": "KataSizingPolicy", "metadata": {"name": "p"},
          "spec": {"shim": "qemu-runtime-rs", "classes": [
              {"name": "s", "cpu": "1", "memory": "64Mi"}, {"name": "m", "cpu": "2", "memory": "192Mi"}]}}

# What the init prints on a 256 MiB VM (seen with Debian's cloud kernel), kernel noise between.
CONSOLE = """\
SeaBIOS (version 1.16.2-debian-1.16.2-1)
Booting from ROM..KSP hello version=1
KSP meminfo stage=boot MemTotal=223632 MemFree=196692 MemAvailable=199808 Buffers=0 Cached=1880 Shmem=1880 SReclaimable=8936
KSP workload target=0 step=4
[    3.1] Out of memory: Killed process 57 (init)
KSP progress held=64
KSP progress held=128
KSP done held=188 outcome=killed
KSP meminfo stage=after MemTotal=223632 MemFree=195224 MemAvailable=198356 Buffers=0 Cached=1896 Shmem=1896 SReclaimable=8952
KSP bye
"""


def test_the_console_gives_free_s_figures_and_what_the_workload_got():
    report = parse_console(CONSOLE)
    assert report_problem(report) is None
    assert report.free_total_mib == Decimal(223632) / 1024
    # free's used: total - free - buffers - cached - reclaimable slab, at boot (not after).
    assert report.free_used_mib == Decimal(223632 - 196692 - 0 - 1880 - 8936) / 1024
    assert (report.held_mib, report.outcome) == (188, "killed")


@pytest.mark.parametrize("text, problem", [
    ("SeaBIOS\nBooting from ROM..", "the guest never reported (no init output on its consoles)"),
    ("KSP hello version=1\nKSP error ksp.step=\"x\" is not a whole number\n", "the guest's init failed: ksp.step"),
    ("KSP hello version=1\nKSP workload target=0 step=4\n", "the guest did not report its memory"),
    ("KSP hello version=1\nKSP meminfo stage=boot MemTotal=1 MemFree=1\n", "the guest's workload never finished"),
])
def test_a_report_that_cannot_give_a_row_says_why(text, problem):
    assert report_problem(parse_console(text)).startswith(problem)


def test_a_row_reads_back_through_calibrate_with_the_probe_columns():
    point = ProbePoint("s", Decimal(1), 64, Vm(1, 256))  # the VM CONSOLE came from
    row = probe_row(point, parse_console(CONSOLE), HostFigures(400 * MIB, 300 * MIB), "node-1", "tcg")
    text = to_csv([row], ["a comment"], columns=(*COLUMNS, *PROBE_COLUMNS))
    [read] = parse_samples_csv(text)
    assert read == row
    assert (read.workload_allocated_mib, read.vmm_peak_resident_bytes, read.node) == (188, 400 * MIB, "node-1")
    # What it measured: the node's kernel with the probe's init, QEMU alone, under TCG with its cache.
    assert (read.accelerator, read.tcg_tb_size_mib, read.guest, read.host_processes, read.devices) == (
        "tcg", 64, "kernel-only", "vmm", "serial+virtio-console")
    under_kvm = probe_row(point, parse_console(CONSOLE), HostFigures(400 * MIB, 300 * MIB), "node-1", "kvm")
    assert (under_kvm.accelerator, under_kvm.tcg_tb_size_mib) == ("kvm", None)
    # Kata's guest booted from its image on an nvdimm, virtiofsd beside QEMU, the translation cache measured:
    # the row says each, and calibrate reads it back.
    boot = GuestBoot(KataGuest(image="/kata.img", virtio_fs_daemon="/virtiofsd"), Runtime.RUST, 4096, 20 * MIB,
                     virtio_fs_socket="/run/vfs.sock", vsock_cid=7)
    kata = probe_row(point, parse_console(CONSOLE), HostFigures(400 * MIB, 300 * MIB, 30 * MIB, 20 * MIB), "node-1",
                     "tcg", boot)
    assert (kata.guest, kata.host_processes, kata.devices, kata.tcg_cache_resident_bytes) == (
        "kata-image", "vmm+virtiofsd", "serial+virtio-console+virtio-scsi+nvdimm+vsock+rng+virtio-fs", 30 * MIB)
    assert parse_samples_csv(to_csv([kata], [], columns=(*COLUMNS, *PROBE_COLUMNS))) == [kata]
    # Under KVM there is no cache to take off, whatever was read.
    assert probe_row(point, parse_console(CONSOLE), HostFigures(400 * MIB, 300 * MIB, 50 * MIB), None, "kvm",
                     boot).tcg_cache_resident_bytes is None
    # What the workload could not have: the larger of free's view and the allocation's.
    assert read.unusable_mib == max(read.vm_nominal_mib - read.free_total_mib + read.free_used_mib,
                                    read.vm_nominal_mib - 188)


def test_a_cgroup_peak_below_the_vm_says_nothing_of_the_host_side():
    point = ProbePoint("s", Decimal(1), 64, Vm(1, 256))
    assert probe_row(point, parse_console(CONSOLE), HostFigures(None, 255 * MIB), None,
                     "kvm").pod_cgroup_memory_current_bytes is None
    row = probe_row(point, parse_console(CONSOLE), HostFigures(None, 300 * MIB), None, "kvm")
    assert row.pod_cgroup_memory_current_bytes == 300 * MIB


def test_points_are_each_class_s_smallest_and_largest_pods_as_explain_gives_them():
    sizing = size_policy(parse_policy(POLICY))
    points = probe_points(sizing, 3)
    limits = [(p.class_name, p.container_limit_mib) for p in points]
    # s: a quarter of its envelope up to it; m: 2 MiB above s's envelope up to its own.
    assert limits == [("s", 16), ("s", 40), ("s", 64), ("m", 66), ("m", 129), ("m", 192)]
    for point in points:
        assert point.vm == explain_pod(sizing, point.class_name, point.cpu_limit, point.container_limit_mib * MIB).vm
    assert [p.container_limit_mib for p in probe_points(sizing, 1)] == [64, 192]
    for wrong in (0, 11):
        with pytest.raises(ProbeError, match=f"--points {wrong}: at least 1 and at most 10 VMs per class"):
            probe_points(sizing, wrong)


def test_the_kata_configuration_gives_the_vmm_and_kernel_or_says_what_is_missing():
    text = ('[hypervisor.qemu]\npath = "/opt/kata/bin/qemu-system-x86_64"\n'
            'kernel = "/opt/kata/share/kata-containers/vmlinux.container"\n'
            'image = "/opt/kata/share/kata-containers/kata-containers.img"\n')
    found = vmm_paths(text, "c.toml", "qemu")
    assert (found.vmm, found.kernel, found.kata.image, found.kata.guest_kind) == (
        "/opt/kata/bin/qemu-system-x86_64", "/opt/kata/share/kata-containers/vmlinux.container",
        "/opt/kata/share/kata-containers/kata-containers.img", "kata-image")
    with pytest.raises(ProbeError, match=r"c.toml: \[hypervisor.qemu\]: both image and initrd are set"):
        vmm_paths(text + 'initrd = "/i"\n', "c.toml", "qemu")
    with pytest.raises(ProbeError, match=r"c.toml: \[hypervisor.qemu\] virtio_fs_daemon: '/v\\n' is longer than"):
        vmm_paths(text + 'virtio_fs_daemon = "/v\\n"\n', "c.toml", "qemu")
    with pytest.raises(ProbeError, match=r"c.toml: no \[hypervisor.clh\] section \(it has \[hypervisor.qemu\]\)"):
        vmm_paths(text, "c.toml", "clh")
    with pytest.raises(ProbeError, match=r"c.toml: \[hypervisor.qemu\] kernel is not set"):
        vmm_paths('[hypervisor.qemu]\npath = "/q"\n', "c.toml", "qemu")
    with pytest.raises(ProbeError, match="c.toml: not TOML Kata can read"):
        vmm_paths("[hypervisor.qemu", "c.toml", "qemu")
    assert config_candidates("qemu-runtime-rs", Runtime.RUST)[0] == (
        "/opt/kata/share/defaults/kata-containers/runtime-rs/runtimes/qemu-runtime-rs/configuration-qemu-runtime-rs.toml")


def test_the_vm_is_placed_as_kata_s_qemu_places_it():
    paths = vmm_paths('[hypervisor.qemu]\npath = "/q"\nkernel = "/k"\n', "c", "qemu")
    command = vm_command(paths, Vm(2, 300), accelerator="tcg", memory_dir="/dev/shm", initramfs_path="/i",
                         command_line=kernel_command_line(100, step_mib=1, step_ms=20, linger=True), console_path="/c")
    assert command[:3] == ["/q", "-accel", "tcg,tb-size=64"]
    assert "memory-backend-file,id=mem,size=300M,mem-path=/dev/shm,share=on" in command
    assert command[command.index("-smp") + 1] == "2" and command[command.index("-m") + 1] == "300M"
    assert command[-1] == "console=ttyS0 console=hvc0 quiet panic=-1 ksp.alloc=100 ksp.step=1 ksp.step_ms=20 ksp.linger=1"
    # With Kata's guest: its memory hotplug region, its devices and its kernel parameters before the probe's.
    boot = GuestBoot(paths.kata, Runtime.GO, 24000)
    kata = vm_command(paths, Vm(2, 300), accelerator="tcg", memory_dir="/dev/shm", initramfs_path="/i",
                      command_line=kernel_command_line(0), console_path="/c", boot=boot)
    assert kata[kata.index("-m") + 1] == "300M,slots=10,maxmem=25024M"
    assert "virtio-rng-pci,rng=rng0" in kata and "virtio-scsi-pci,id=scsi0" in kata
    assert kata[-1].startswith("tsc=reliable ") and kata[-1].endswith(" " + kernel_command_line(0))


def test_the_initramfs_is_a_newc_archive_with_the_init_at_slash_init():
    init = b"\x7fELF" + b"x" * 13
    archive = initramfs(init)
    assert archive[:6] == b"070701" and len(archive) % 4 == 0
    names = []
    offset = 0
    while True:
        header = archive[offset:offset + 110]
        size, name_size = int(header[54:62], 16), int(header[94:102], 16)
        name = archive[offset + 110:offset + 110 + name_size - 1].decode()
        data_at = offset + 110 + name_size + (-(110 + name_size) % 4)
        names.append((name, archive[data_at:data_at + size]))
        if name == "TRAILER!!!":
            break
        offset = data_at + size + (-size % 4)
    assert dict(names)["init"] == init and [n for n, _ in names] == [
        "dev", "proc", "sys", "kata-sizing", "kata-sizing/modules", "init", "TRAILER!!!"]
    with pytest.raises(ModuleError, match="not an ELF executable"):
        initramfs(b"#!/bin/sh\n")


def probe(tmp_path: Path, capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """`kata-sizing probe` in this process (what it refuses before any boot needs no interpreter of its own)."""
    policy = tmp_path / "policy.yaml"
    policy.write_text(yaml.safe_dump(POLICY))
    code = main(["probe", str(policy), *args])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("args, line", [
    (["--kata-root", "/nonexistent"], "error: no Kata configuration for shim qemu-runtime-rs under /nonexistent (looked at "
                                      "/nonexistent/share/defaults/kata-containers/runtime-rs/runtimes/qemu-runtime-rs/"),
    (["--vmm", "/nonexistent/qemu", "--kernel", "/bin/sh"],
     "error: the VMM /nonexistent/qemu (from --vmm/--kernel) is not an executable file"),
    (["--vmm", "/bin/sh", "--kernel", "/nonexistent"],
     "error: the guest kernel /nonexistent (from --vmm/--kernel) is not a file"),
    (["--vmm", "/bin/sh", "--kernel", "/bin/sh", "--init", "/nonexistent"], "error: --init /nonexistent: no such file"),
    (["--vmm", "/bin/sh", "--kernel", "/bin/sh", "--memory-dir", "/nonexistent"],
     "error: --memory-dir /nonexistent: not a directory"),
    (["--points", "0", "--vmm", "/bin/sh", "--kernel", "/bin/sh"],
     "error: --points 0: at least 1 and at most 10 VMs per class"),
])
def test_bad_paths_are_one_line_and_exit_2(tmp_path, capsys, args, line):
    code, out, err = probe(tmp_path, capsys, *args)
    assert code == 2, err
    assert err.startswith(line) and err.count("\n") == 1, err
    assert out == ""


END_POINT = ProbePoint("m", Decimal(1), 192, Vm(2, 350))
SHM_GUIDANCE = (" A memory directory (/dev/shm on a Kata node) too small for the VMs on it kills them this way: size it "
                "with `kata-sizing render --node-capacity` (docs/probe.md)")
LIMIT = CgroupLevel("/kubepods/pod1", 300 * MIB, 40 * MIB, 0, "memory.limit_in_bytes", 3)


@pytest.mark.parametrize("end, problem, said", [
    (VmEnd(-9, oom_kills=1, limit=LIMIT), None,
     "OOM-killed: the kernel killed 1 process(es) of its memory cgroup (oom_kill 1); the VM of 350 MiB needs about 526 "
     "MiB with its VMM, the memory limit over it is 300 MiB (memory.limit_in_bytes of /kubepods/pod1, 40 MiB in use)"),
    (VmEnd(-9, oom_kills=1), None, "OOM-killed: the kernel killed 1 process(es) of its memory cgroup (oom_kill 1); the "
     "VM of 350 MiB needs about 526 MiB with its VMM, no cgroup limit over it: the host itself ran out"),
    (VmEnd(-9, oom_kills=None, limit=LIMIT, limit_hits=2), None,
     "killed by SIGKILL after the memory limit over it was hit 2 time(s): most likely the OOM killer (this kernel keeps "
     "no OOM kill count); the VM of 350 MiB needs about 526 MiB with its VMM, the limit is 300 MiB "
     "(memory.limit_in_bytes of /kubepods/pod1, 40 MiB in use)"),
    (VmEnd(-9, oom_kills=0, limit=LIMIT, limit_hits=2), "the guest's workload never finished",
     "the VMM was killed by SIGKILL (the guest's workload never finished)"),
    (VmEnd(-7, memory_dir_size_bytes=512 * MIB, memory_dir_free_bytes=3 * MIB), None,
     "SIGBUS: the VMM died of signal 7 (exit -7): the guest touched memory its file in /dev/shm could not get: a "
     "filesystem of 512 MiB, 3 MiB free after the VM; the VM needs 350 MiB there." + SHM_GUIDANCE),
    (VmEnd(135), None, "SIGBUS: the VMM died of signal 7 (exit 135): the guest touched memory its file in /dev/shm "
     "could not get; the VM needs 350 MiB there." + SHM_GUIDANCE),
    (VmEnd(None, timed_out=True, seconds=300.2), "the guest's workload never finished",
     "timed out after 300 s (the guest's workload never finished)"),
    (VmEnd(None, stopped_because="the guest wrote more than 256 MiB on its console vm0.console"), None,
     "stopped: the guest wrote more than 256 MiB on its console vm0.console"),
    (VmEnd(1, stderr_line="qemu: could not load kernel '/k'"), "the guest never reported (no init output on its consoles)",
     "the VMM exited with 1: qemu: could not load kernel '/k'"),
    (VmEnd(0), "the guest's report is malformed: x", "the guest's report is malformed: x"),
    (VmEnd(0), None, None),
])
def test_what_ended_a_vm_is_named(end, problem, said):
    assert failure(END_POINT, "/dev/shm", end, problem) == said


def test_a_vm_is_held_to_the_host_s_available_memory_the_memory_dir_and_the_limits_over_the_probe():
    room = HostRoom(400 * MIB, "/dev/shm", 1024 * MIB, 1024 * MIB, (LIMIT,))
    assert fit_problem(END_POINT, room) == ("class m: the VM of 350 MiB (2 vCPU) needs 526 MiB with its VMM, more than "
                                            "the host's MemAvailable 400 MiB (/proc/meminfo)")
    room = HostRoom(4096 * MIB, "/dev/shm", 1024 * MIB, 1024 * MIB, (LIMIT,))
    assert fit_problem(END_POINT, room) == (
        "class m: the VM of 350 MiB (2 vCPU) needs 526 MiB with its VMM, more than the memory limit over the probe "
        "leaves: 300 MiB (memory.limit_in_bytes of /kubepods/pod1, 40 MiB in use)")
    assert fit_problem(END_POINT, HostRoom(4096 * MIB, "/dev/shm", 1024 * MIB, 1024 * MIB)) is None
    # Not read is no limit: the probe says what it could not read, and boots.
    assert fit_problem(END_POINT, HostRoom(None, "/dev/shm", None, None)) is None
