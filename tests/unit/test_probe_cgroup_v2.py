"""The probe's cgroup v2 path, checked against a layout, not a live v2 hierarchy: this host mounts
cgroup v1 only (docs/probe.md says which path ran where).

The layout is a tree of files in a tmp dir named as Documentation/admin-guide/cgroup-v2.rst names
them (cgroup.controllers, cgroup.subtree_control, cgroup.procs, cgroup.kill, memory.max,
memory.current, memory.peak, memory.events, memory.stat); `V2Kernel` models what the kernel does
on the writes and directory calls the probe makes, each rule as that document states it:
- mkdir makes a cgroup with the core files, and the memory.* files only when its parent enables
  memory in cgroup.subtree_control ("Enabling a controller in a cgroup indicates that the
  distribution of the target resource across its immediate children will be controlled");
- a controller can be enabled only if the parent has it (cgroup.controllers), and not in a
  non-root cgroup that has processes, nor can a process move into such a cgroup ("no internal
  process" constraint: EBUSY);
- a controller cannot be disabled while a child enables it;
- writing a pid to cgroup.procs moves it out of every other cgroup;
- writing "1" to cgroup.kill kills every process of the cgroup and below;
- rmdir of a cgroup with processes or children fails (EBUSY).
The VMM is the stand-in of tests/support/fake_vmm.py, a real process the model really kills.
"""

from __future__ import annotations

import errno
import os
import signal
import sys
from decimal import Decimal
from pathlib import Path

import pytest

from kata_sizing import vm as vmrun
from kata_sizing.core.probe import ProbePoint, VmmPaths, report_problem
from kata_sizing.core.probehost import (
    CgroupLevel,
    HostRoom,
    failure,
    fit_problem,
    keyed_counts,
    limit_bytes,
    own_cgroup,
    tightest_limit,
)
from kata_sizing.core.quantity import MIB
from kata_sizing.core.sizing import Vm
from tests.support.paths import SUPPORT

FAKE_VMM = SUPPORT / "fake_vmm.py"
CORE_FILES = ("cgroup.procs", "cgroup.controllers", "cgroup.subtree_control", "cgroup.kill", "cgroup.events")
MEMORY_FILES = {"memory.max": "max\n", "memory.current": "0\n", "memory.peak": "0\n", "memory.stat": "anon 0\n"
                "file 0\ninactive_file 0\n", "memory.events": "low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\n"}


class V2Kernel(vmrun.CgroupFiles):
    """What the kernel does on the probe's writes to a cgroup v2 hierarchy (the rules above)."""

    def __init__(self, root: Path) -> None:
        self.root = root

    @staticmethod
    def words(path: Path) -> list[str]:
        return path.read_text().split() if path.exists() else []

    def _controllers_file(self, cgroup: Path) -> list[str]:
        return self.words(cgroup / "cgroup.subtree_control")

    def populate(self, cgroup: Path) -> None:
        parent_enables = self._controllers_file(cgroup.parent)
        for name in CORE_FILES:
            if not (cgroup / name).exists():
                initial = {"cgroup.controllers": " ".join(parent_enables) + "\n", "cgroup.subtree_control": "\n"}
                (cgroup / name).write_text(initial.get(name, ""))
        if "memory" in parent_enables:
            for name, text in MEMORY_FILES.items():
                if not (cgroup / name).exists():
                    (cgroup / name).write_text(text)

    def mkdir(self, path: Path) -> None:
        path.mkdir()
        self.populate(path)

    def rmdir(self, path: Path) -> None:
        if self.words(path / "cgroup.procs") or any(p.is_dir() for p in path.iterdir()):
            raise OSError(errno.EBUSY, os.strerror(errno.EBUSY))
        for child in path.iterdir():
            child.unlink()
        path.rmdir()

    def write(self, path: Path, text: str) -> None:
        cgroup, name = path.parent, path.name
        busy = OSError(errno.EBUSY, os.strerror(errno.EBUSY))
        if name == "cgroup.subtree_control":
            enabled = self._controllers_file(cgroup)
            for token in text.split():
                controller = token[1:]
                if token[0] == "+":
                    if controller not in self.words(cgroup / "cgroup.controllers"):
                        raise OSError(errno.ENOENT, os.strerror(errno.ENOENT))
                    if cgroup != self.root and self.words(cgroup / "cgroup.procs"):
                        raise busy
                    enabled = [*dict.fromkeys([*enabled, controller])]
                else:
                    if any(controller in self._controllers_file(child) for child in cgroup.iterdir() if child.is_dir()):
                        raise busy
                    enabled = [c for c in enabled if c != controller]
            path.write_text(" ".join(enabled) + "\n")
            for child in (c for c in cgroup.iterdir() if c.is_dir()):
                (child / "cgroup.controllers").write_text(" ".join(enabled) + "\n")
                if "memory" in enabled:
                    self.populate(child)
                else:
                    for memory_file in child.glob("memory.*"):
                        memory_file.unlink()
        elif name == "cgroup.procs":
            if cgroup != self.root and self._controllers_file(cgroup):
                raise busy
            pid = text.strip()
            for procs in self.root.rglob("cgroup.procs"):
                procs.write_text("".join(f"{p}\n" for p in self.words(procs) if p != pid))
            path.write_text(path.read_text() + f"{pid}\n")
        elif name == "cgroup.kill":
            for procs in [cgroup / "cgroup.procs", *cgroup.rglob("*/cgroup.procs")]:
                for pid in self.words(procs):
                    try:
                        os.kill(int(pid), signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                procs.write_text("")
        else:
            path.write_text(text)


def layout(tmp_path: Path, own_controllers: str = "memory pids", others_in_own: tuple[int, ...] = ()
           ) -> tuple[Path, Path, V2Kernel, vmrun.CgroupHierarchy]:
    """A v2 hierarchy as a container's pod sees it (/kubepods/pod1/ctr, limits on the pod and the
    container), with this process in the container's cgroup."""
    root = tmp_path / "cgroup"
    root.mkdir()
    kernel = V2Kernel(root)
    (root / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    (root / "cgroup.subtree_control").write_text("cpu memory pids\n")
    (root / "cgroup.procs").write_text("1\n")
    kubepods = root / "kubepods"
    kernel.mkdir(kubepods)
    kernel.write(kubepods / "cgroup.subtree_control", "+memory +pids")
    pod = kubepods / "pod1"
    kernel.mkdir(pod)
    (pod / "memory.max").write_text(f"{2048 * MIB}\n")
    (pod / "memory.current").write_text(f"{300 * MIB}\n")
    kernel.write(pod / "cgroup.subtree_control", "+" + " +".join(own_controllers.split()))
    own = pod / "ctr"
    kernel.mkdir(own)
    if "memory" in own_controllers:
        (own / "memory.max").write_text(f"{1024 * MIB}\n")
        (own / "memory.current").write_text(f"{100 * MIB}\n")
        (own / "memory.stat").write_text(f"anon {40 * MIB}\nfile {60 * MIB}\ninactive_file {60 * MIB}\n")
    (own / "cgroup.procs").write_text("".join(f"{pid}\n" for pid in (os.getpid(), *others_in_own)))
    proc_self = tmp_path / "proc-self-cgroup"
    proc_self.write_text("0::/kubepods/pod1/ctr\n")
    hierarchy, why = vmrun.CgroupHierarchy.find(root, proc_self, kernel)
    assert hierarchy is not None, why
    return root, own, kernel, hierarchy


def test_the_files_read_as_the_kernel_writes_them():
    assert own_cgroup("0::/kubepods/pod1/ctr\n", v2=True) == "/kubepods/pod1/ctr"
    # A hybrid host (this one): v1's memory controller, an empty v2 hierarchy beside it.
    hybrid = "9:name=systemd:/\n4:memory:/process_api/x\n1:cpu:/\n0::/\n"
    assert own_cgroup(hybrid, v2=False) == "/process_api/x" and own_cgroup(hybrid, v2=True) == "/"
    assert limit_bytes("max\n") is None and limit_bytes("9223372036854771712\n") is None  # v2's and v1's "none"
    assert limit_bytes("1073741824\n") == 1024 * MIB and limit_bytes("garbage") is None
    events = "low 0\nhigh 3\nmax 12\noom 2\noom_kill 1\noom_group_kill 0\n"
    assert keyed_counts(events)["oom_kill"] == 1
    v1 = "oom_kill_disable 0\nunder_oom 0\noom_kill 4\n"
    assert keyed_counts(v1)["oom_kill"] == 4 and keyed_counts("oom_kill ²\n") == {}
    levels = [CgroupLevel("/a", None, 5, 0, "memory.max"), CgroupLevel("/a/b", 1000, 900, 800, "memory.max"),
              CgroupLevel("/a/b/c", 500, 450, 0, "memory.max")]
    # /a/b: 1000 - (900 - 800 inactive) = 900 left; /a/b/c: 500 - 450 = 50 left.
    assert tightest_limit(levels) == levels[2] and tightest_limit(levels[:2]) == levels[1]


def test_the_limits_over_the_probe_are_read_from_memory_max_up_the_hierarchy(tmp_path: Path) -> None:
    _, own, _, hierarchy = layout(tmp_path)
    assert hierarchy.v2 and hierarchy.own == own
    levels = hierarchy.levels()
    assert [(lv.path, lv.limit_bytes, lv.working_set_bytes) for lv in levels] == [
        ("/kubepods/pod1/ctr", 1024 * MIB, 40 * MIB), ("/kubepods/pod1", 2048 * MIB, 300 * MIB),
        ("/kubepods", None, 0)]
    room = HostRoom(64 * 1024 * MIB, "/dev/shm", 32 * 1024 * MIB, 32 * 1024 * MIB, tuple(levels))
    fits = ProbePoint("s", Decimal(1), 700, Vm(1, 800))
    too_big = ProbePoint("m", Decimal(2), 800, Vm(2, 900))
    assert fit_problem(fits, room) is None  # 800 + 176 for the VMM within 1024 - 40
    assert fit_problem(too_big, room) == (
        "class m: the VM of 900 MiB (2 vCPU) needs 1076 MiB with its VMM, more than the memory limit over the probe "
        "leaves: 1024 MiB (memory.max of /kubepods/pod1/ctr, 40 MiB in use)")


@pytest.fixture
def fake_vmm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> VmmPaths:
    vmm = tmp_path / "qemu-system-x86_64"
    vmm.write_text(f"#!{sys.executable}\n" + FAKE_VMM.read_text())
    vmm.chmod(0o755)
    (tmp_path / "shm").mkdir()
    monkeypatch.setenv("FAKE_VMM", "hang")
    monkeypatch.setenv("FAKE_VMM_PIDS", str(tmp_path / "pids"))
    return VmmPaths(str(vmm), "/vmlinuz", "qemu", "the test")


def run_vm(tmp_path: Path, paths: VmmPaths, cgroups: vmrun.VmCgroups, during=None) -> vmrun.BootResult:
    """The fake VMM as a VM in `cgroups` until a 0.3 s timeout; `during(vm_cgroup)` plays the kernel's
    accounting while it runs."""
    with vmrun.RunningVm(paths, Vm(1, 900), accelerator="tcg", initramfs_path=tmp_path / "initrd",
                         memory_dir=str(tmp_path / "shm"), workdir=tmp_path, command_line="", name="vm0",
                         cgroups=cgroups) as running:
        assert running.cgroup is not None
        pid = running.processes[0].pid
        assert running.cgroup.pids() == [pid]  # joined before it ran
        if during:
            during(running.cgroup.path, running)
        running.wait(0.3)
    assert not vmrun._pid_alive(pid)
    return running.stop()


def test_memory_is_enabled_for_the_vm_cgroups_and_the_probe_leaves_the_hierarchy_as_it_found_it(
        tmp_path: Path, fake_vmm: VmmPaths) -> None:
    _, own, _, hierarchy = layout(tmp_path)
    before = {p.relative_to(tmp_path): p.read_text() for p in tmp_path.joinpath("cgroup").rglob("*") if p.is_file()}

    def kernel_accounts(vm_cgroup: Path, _running: vmrun.RunningVm) -> None:
        # The probe had to move itself out of its cgroup to enable memory for its children.
        assert hierarchy.files.read(own / "cgroup.subtree_control").split() == ["memory"]
        assert hierarchy.files.read(own / "cgroup.procs").split() == []
        assert (own / f"kata-sizing-probe-{os.getpid()}" / "cgroup.procs").read_text().split() == [str(os.getpid())]
        (vm_cgroup / "memory.peak").write_text(f"{1000 * MIB}\n")
        (vm_cgroup / "memory.events").write_text("low 0\nhigh 0\nmax 7\noom 1\noom_kill 1\n")

    with vmrun.VmCgroups(hierarchy) as cgroups:
        result = run_vm(tmp_path, fake_vmm, cgroups, kernel_accounts)
        assert list(own.glob("kata-sizing-probe-*-vm0")) == []  # killed (cgroup.kill) and removed
    assert cgroups.notes == []
    after = {p.relative_to(tmp_path): p.read_text() for p in tmp_path.joinpath("cgroup").rglob("*") if p.is_file()}
    assert after == before
    assert (result.host.cgroup_peak_bytes, result.end.oom_kills) == (1000 * MIB, 1)
    point = ProbePoint("l", Decimal(1), 700, Vm(1, 900))
    assert failure(point, "/dev/shm", result.end, report_problem(result.report, point.vm)) == (
        "OOM-killed: the kernel killed 1 process(es) of its memory cgroup (oom_kill 1); the VM of 900 MiB needs about "
        "1076 MiB with its VMM, the memory limit over it is 1024 MiB (memory.max of /kubepods/pod1/ctr, 40 MiB in use)")


def test_without_memory_peak_the_peak_is_polled_and_said_to_be(tmp_path: Path, fake_vmm: VmmPaths) -> None:
    _, own, _, hierarchy = layout(tmp_path)
    (own / "cgroup.procs").write_text("")  # nothing in the probe's cgroup (it runs elsewhere): no move needed

    def older_kernel(vm_cgroup: Path, running: vmrun.RunningVm) -> None:
        (vm_cgroup / "memory.peak").unlink()  # Linux before 5.19
        (vm_cgroup / "memory.current").write_text(f"{700 * MIB}\n")
        running.poll()
        (vm_cgroup / "memory.current").write_text(f"{200 * MIB}\n")

    with vmrun.VmCgroups(hierarchy) as cgroups:
        result = run_vm(tmp_path, fake_vmm, cgroups, older_kernel)
    assert result.host.cgroup_peak_bytes == 700 * MIB
    assert "the cgroup's peak was polled every 0.1 s (the kernel has no memory.peak before Linux 5.19): a lower bound" \
        in result.notes
    assert (own / "cgroup.subtree_control").read_text().split() == []


def test_other_processes_in_the_probe_s_cgroup_leave_the_vms_without_memory_files_and_say_why(
        tmp_path: Path, fake_vmm: VmmPaths) -> None:
    _, own, _, hierarchy = layout(tmp_path, others_in_own=(1,))
    with vmrun.VmCgroups(hierarchy) as cgroups:
        assert cgroups.notes == [
            "cannot enable +memory in /kubepods/pod1/ctr/cgroup.subtree_control (Device or resource busy: other "
            "processes share the probe's cgroup, and cgroup v2 keeps processes out of a cgroup that enables "
            "controllers for its children); the rows' cgroup peak stays empty"]
        # Put back at once: the probe in its own cgroup again, the leaf gone.
        assert (own / "cgroup.procs").read_text().split() == ["1", str(os.getpid())]
        assert [p.name for p in own.iterdir() if p.is_dir()] == []
        result = run_vm(tmp_path, fake_vmm, cgroups)  # still killed through its cgroup, which has no memory files
    assert result.host.cgroup_peak_bytes is None and result.end.oom_kills is None


def test_a_controller_the_parent_does_not_delegate_is_said(tmp_path: Path, fake_vmm: VmmPaths) -> None:
    _, _, _, hierarchy = layout(tmp_path, own_controllers="pids")
    with vmrun.VmCgroups(hierarchy) as cgroups:
        result = run_vm(tmp_path, fake_vmm, cgroups)
    assert cgroups.notes == [
        "the memory controller is not delegated to /kubepods/pod1/ctr (not in its cgroup.controllers): the VMs' "
        "cgroups have no memory files, the rows' cgroup peak stays empty"]
    assert result.host.cgroup_peak_bytes is None
