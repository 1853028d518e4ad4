"""The probe's one run of real VMs (TCG): a row kept, then SIGBUS, then an OOM kill, each named.
Its unit tests are tests/unit/test_probe.py; it skips without QEMU and the guest `make node` builds."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import yaml

from kata_sizing import vm as vmrun
from kata_sizing.core.calibrate import parse_samples_csv
from kata_sizing.core.model import parse_policy
from kata_sizing.core.probe import probe_points, qemu_option_value
from kata_sizing.core.quantity import MIB
from kata_sizing.core.sizing import size_policy
from tests.support import kata_vm
from tests.support.operator_helpers import wait_for as poll
from tests.support.paths import ROOT


@pytest.fixture
def vmm() -> tuple[Path, Path, Path]:
    """Debian's QEMU and guest kernel and the probe's init, with what Kata's VM needs, as `make node` provides them."""
    if kata_vm.missing():
        why = f"missing {', '.join(map(str, kata_vm.missing()))} (`make node` builds them where QEMU installs and cargo runs)"
        if os.environ.get("KATA_SIZING_REQUIRE_NODE") == "1":
            pytest.fail(why)
        pytest.skip(why)
    return kata_vm.QEMU, kata_vm.KERNEL, kata_vm.INIT


def _qemu_pids(memory_dir: Path) -> list[int]:
    """Live QEMU processes whose guest memory is in `memory_dir` (as the command line names it)."""
    found = []
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if f"mem-path={qemu_option_value(str(memory_dir))},share=on" in cmdline.read_text() and \
                    vmrun._pid_alive(int(cmdline.parent.name)):
                found.append(int(cmdline.parent.name))
        except OSError:
            continue
    return found


def test_real_vms_a_row_kept_then_sigbus_and_an_oom_kill_each_named(tmp_path, vmm):
    """Three real VMs (TCG) of one probe, booted as Kata boots its guest from an image (a stand-in's, on an
    nvdimm with DAX, its agent started before the workload) with virtiofsd beside QEMU in the VM's cgroup,
    their memory on a tmpfs in a directory whose name holds a comma: the first gives its row, which says
    what it measured; while the second runs, other files fill the tmpfs (as other Kata VMs fill /dev/shm)
    and it dies of SIGBUS; while the third runs, the memory limit over the probe (a Job's container)
    drops below it and the kernel OOM-kills it. The run goes on through both, and says each."""
    qemu, kernel, init = vmm
    if os.geteuid() != 0:
        pytest.skip("a tmpfs and a memory cgroup of the test's own need root")
    hierarchy, why = vmrun.CgroupHierarchy.find()
    if hierarchy is None or hierarchy.v2:
        pytest.skip(f"the test sets a cgroup v1 limit: {why or 'this host runs cgroup v2'}")
    body = {"apiVersion": "katasizing.dev/v1alpha1", "kind": "KataSizingPolicy", "metadata": {"name": "p"},
            "spec": {"shim": "qemu-runtime-rs", "classes": [
        {"name": "s", "cpu": "1", "memory": "64Mi"}, {"name": "m", "cpu": "1", "memory": "192Mi"},
        {"name": "l", "cpu": "1", "memory": "384Mi"}]}}
    vms = [p.vm for p in probe_points(size_policy(parse_policy(body)), 1)]
    policy = tmp_path / "policy.yaml"
    policy.write_text(yaml.safe_dump(body))
    config = kata_vm.kata_configuration(tmp_path / "configuration-qemu-runtime-rs.toml", image=True)
    mount = tmp_path / "tmpfs"
    mount.mkdir()
    tmpfs_mib = vms[-1].memory_mib + 16
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={tmpfs_mib}m", "tmpfs", str(mount)], check=True)
    memory_dir = mount / "shm,share=off"  # unescaped, QEMU would read share=off as an option
    memory_dir.mkdir()
    parent = hierarchy.own / f"ksp-test-{os.getpid()}"  # the probe's cgroup, as a Job's container's
    parent.mkdir()
    filler = mount / "other-vms"
    stderr_path = tmp_path / "stderr"
    with open(stderr_path, "w") as stderr_file:
        process = subprocess.Popen(
            [sys.executable, "-m", "kata_sizing.cli", "probe", str(policy), "--config", str(config), "--init", str(init),
             "--guest-modules", str(kata_vm.MODULES), "--accel", "tcg", "--points", "1", "--memory-dir", str(memory_dir),
             "--timeout", "120"],
            stdout=subprocess.PIPE, stderr=stderr_file, text=True, cwd=ROOT,
            preexec_fn=lambda: (parent / "cgroup.procs").write_text(str(os.getpid())))
    assert process.stdout is not None
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(process.stdout.readline, "")), daemon=True)
    reader.start()
    try:
        def vm_started(number: int, seen: list[int]) -> int:
            return poll(lambda: next((p for p in _qemu_pids(memory_dir) if p not in seen), None), 120,
                        lambda: f"VM {number} never started: {lines} {process.poll()}", interval=0.01)

        first = vm_started(1, [])
        # The guest's memory file is in the directory the comma is part of.
        maps = poll(lambda: [line for line in Path(f"/proc/{first}/maps").read_text().splitlines()
                             if f"{memory_dir}/" in line], 30, "QEMU's memory file", interval=0.05)
        assert maps
        poll(lambda: any(line.startswith(",,s,") for line in lines), 120, lambda: f"the first row: {lines}", interval=0.05)
        second = vm_started(2, [first])
        # The probe holds still while other files fill the tmpfs and go again, so it sees them only
        # through what they did to its VM (it looks again before the next VM boots).
        os.kill(process.pid, signal.SIGSTOP)
        try:
            with open(filler, "wb") as handle:  # all but 64 MiB, before the guest has touched much
                free = os.statvfs(mount)
                os.posix_fallocate(handle.fileno(), 0, free.f_bavail * free.f_frsize - 64 * MIB)
            poll(lambda: not vmrun._pid_alive(second), 120, "the second VM's end", interval=0.05)
            filler.unlink()
        finally:
            os.kill(process.pid, signal.SIGCONT)
        vm_started(3, [first, second])
        (parent / "memory.limit_in_bytes").write_text(str(300 * MIB))
        process.wait(timeout=180)
    finally:
        process.kill()
        process.wait()
        reader.join(5)
        process.stdout.close()
        filler.unlink(missing_ok=True)
        leftovers = list(parent.glob("kata-sizing-probe-*"))
        parent.rmdir()
        left_in_tmpfs = sorted(p.name for p in mount.rglob("*"))
        subprocess.run(["umount", str(mount)], check=True)
    stderr = stderr_path.read_text()
    assert process.returncode == 3, stderr
    text = "".join(lines)
    [row] = parse_samples_csv(text)
    assert (row.class_name, row.vm_nominal_mib) == ("s", vms[0].memory_mib)
    # What it measured: Kata's image on an nvdimm with its (stand-in) agent, QEMU and virtiofsd, under TCG
    # with what of the translation cache was resident apart.
    assert (row.accelerator, row.guest, row.host_processes) == ("tcg", "kata-image", "vmm+virtiofsd")
    assert {"nvdimm", "rng", "virtio-fs"} <= set(row.devices.split("+"))
    assert row.tcg_cache_resident_bytes and 0 < row.tcg_cache_resident_bytes <= 64 * MIB
    # The agent's memory is in the guest's used: the stand-in holds 24 MiB (operator/probe-init/standin.go).
    assert row.free_used_mib > 24, row
    assert "virtiofsd peak resident" in stderr and "its agent held" in stderr
    comments = [line for line in text.splitlines() if line.startswith("# class ")]
    m, large = vms[1], vms[2]
    assert comments[0].startswith(
        f"# class m: the VM of {m.memory_mib} MiB ({m.vcpus} vCPU) failed: SIGBUS: the VMM died of signal 7 (exit -7): "
        f"the guest touched memory its file in {memory_dir} could not get: a filesystem of {tmpfs_mib} MiB"), comments
    assert "size it with `kata-sizing render --node-capacity`" in comments[0]
    assert comments[1] == (
        f"# class l: the VM of {large.memory_mib} MiB ({large.vcpus} vCPU) failed: OOM-killed: the kernel killed 1 process(es) "
        f"of its memory cgroup (oom_kill 1); the VM of {large.memory_mib} MiB needs about {large.memory_mib + 192} MiB with its "
        f"VMM, the memory limit over it is 300 MiB (memory.limit_in_bytes of {hierarchy.name(parent)}, "
        f"{comments[1].rsplit(', ', 1)[1]}"), comments
    assert comments[1].endswith(" MiB in use)")
    assert text.splitlines()[-1] == "# 1 of 3 VM(s) measured; 2 failed (the lines above say why)."
    # Nothing left: no QEMU, no VM cgroup, no memory file (none beside the directory either).
    assert _qemu_pids(memory_dir) == [] and leftovers == []
    assert left_in_tmpfs == ["shm,share=off"]
    print(f"three VMs of {[vm.memory_mib for vm in vms]} MiB under TCG: {stderr}")
