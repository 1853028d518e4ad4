"""`kata-sizing probe`'s pure part (core/probe.py) and its command's answers to bad input; the VMs
themselves boot in tests/test_node_vms.py (and `probe` end to end there)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from decimal import Decimal
from pathlib import Path

import pytest
import yaml

from kata_sizing.core.calibrate import PROBE_COLUMNS, parse_samples_csv
from kata_sizing.core.model import Runtime, parse_policy
from kata_sizing.core.probe import (
    HostFigures,
    ProbeError,
    ProbePoint,
    config_candidates,
    initramfs,
    kernel_command_line,
    parse_console,
    probe_points,
    probe_row,
    report_problem,
    vm_command,
    vmm_paths,
)
from kata_sizing.core.quantity import MIB
from kata_sizing.core.sizing import Vm, explain_pod, size_policy
from kata_sizing.core.survey import COLUMNS, to_csv

ROOT = Path(__file__).resolve().parent.parent
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
    with pytest.raises(ProbeError, match="at least 1 VM per class"):
        probe_points(sizing, 0)


def test_the_kata_configuration_gives_the_vmm_and_kernel_or_says_what_is_missing():
    text = ('[hypervisor.qemu]\npath = "/opt/kata/bin/qemu-system-x86_64"\n'
            'kernel = "/opt/kata/share/kata-containers/vmlinux.container"\n'
            'image = "/opt/kata/share/kata-containers/kata-containers.img"\n')
    found = vmm_paths(text, "c.toml", "qemu")
    assert (found.vmm, found.kernel, found.guest_image) == (
        "/opt/kata/bin/qemu-system-x86_64", "/opt/kata/share/kata-containers/vmlinux.container",
        "/opt/kata/share/kata-containers/kata-containers.img")
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
    assert dict(names)["init"] == init and [n for n, _ in names] == ["dev", "proc", "init", "TRAILER!!!"]
    with pytest.raises(ProbeError, match="not an ELF executable"):
        initramfs(b"#!/bin/sh\n")


def probe(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    policy = tmp_path / "policy.yaml"
    policy.write_text(yaml.safe_dump(POLICY))
    return subprocess.run([sys.executable, "-m", "kata_sizing.cli", "probe", str(policy), *args], capture_output=True,
                          text=True, timeout=60, cwd=ROOT)


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
    (["--points", "0", "--vmm", "/bin/sh", "--kernel", "/bin/sh"], "error: --points 0: at least 1 VM per class"),
])
def test_bad_paths_are_one_line_and_exit_2(tmp_path, args, line):
    found = probe(tmp_path, *args)
    assert found.returncode == 2, found.stderr
    assert found.stderr.startswith(line) and found.stderr.count("\n") == 1, found.stderr
    assert found.stdout == ""


QEMU = Path("/usr/bin/qemu-system-x86_64")
KERNEL = ROOT / ".tools" / "vm" / "vmlinuz"
INIT = ROOT / ".tools" / "probe-init"


@pytest.fixture
def vmm() -> tuple[Path, Path, Path]:
    """Debian's QEMU and guest kernel and the probe's init, as `make node` provides them."""
    if not (QEMU.is_file() and KERNEL.is_file() and INIT.is_file()):
        why = "no QEMU, guest kernel or probe init (`make node` installs and builds them)"
        if os.environ.get("KATA_SIZING_REQUIRE_NODE") == "1":
            pytest.fail(why)
        pytest.skip(why)
    return QEMU, KERNEL, INIT


def test_a_vmm_that_will_not_start_is_one_line(tmp_path, vmm):
    _, kernel, init = vmm
    found = probe(tmp_path, "--vmm", "/bin/false", "--kernel", str(kernel), "--init", str(init), "--accel", "tcg")
    assert found.returncode == 2
    assert found.stderr.splitlines()[-1] == "error: the VMM /bin/false failed: exit 1", found.stderr


def test_a_guest_that_never_reports_is_one_line(tmp_path, vmm):
    qemu, kernel, _ = vmm
    # A static binary that is not the probe's init: the guest boots it and says nothing.
    found = probe(tmp_path, "--vmm", str(qemu), "--kernel", str(kernel), "--init", "/bin/busybox", "--accel", "tcg",
                  "--points", "1", "--timeout", "3")
    assert found.returncode == 2
    assert found.stderr.splitlines()[-1] == (
        "error: VM of 200 MiB (class s): the guest never reported (no init output on its consoles) within 3 s"), found.stderr


def test_a_probe_stopped_midway_leaves_no_vm_running(tmp_path, vmm):
    qemu, kernel, init = vmm
    policy = tmp_path / "policy.yaml"
    policy.write_text(yaml.safe_dump(POLICY))
    process = subprocess.Popen([sys.executable, "-m", "kata_sizing.cli", "probe", str(policy), "--vmm", str(qemu),
                                "--kernel", str(kernel), "--init", str(init), "--accel", "tcg", "--memory-dir", str(tmp_path)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        deadline = time.monotonic() + 30
        while not list(tmp_path.glob("kata-sizing-probe-*")) and not _vms_of(tmp_path) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _vms_of(tmp_path), "no VM started"
        process.send_signal(signal.SIGTERM)  # a Job's pod deleted
        _, stderr = process.communicate(timeout=30)
    finally:
        process.kill()
    assert process.returncode == 130, stderr
    assert _vms_of(tmp_path) == []


def _vms_of(memory_dir: Path) -> list[int]:
    """QEMU processes whose guest memory is in `memory_dir`."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if f"mem-path={memory_dir}," in cmdline.read_text():
                found.append(int(cmdline.parent.name))
        except OSError:
            continue
    return found
