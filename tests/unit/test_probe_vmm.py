"""`kata-sizing probe` against a stand-in for QEMU (tests/support/fake_vmm.py: it reads QEMU's command line
with QEMU's grammar and writes on the consoles what a guest would): every way a VMM or a guest can
misbehave, with no VM booted, on this host's real cgroups (v1 here; the v2 path:
tests/unit/test_probe_cgroup_v2.py). Real VMs: tests/unit/test_probe.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import pytest
import yaml

from kata_sizing import vm as vmrun
from kata_sizing.cli import main
from kata_sizing.core.calibrate import parse_samples_csv
from tests.support.paths import ROOT, SUPPORT

FAKE_VMM = SUPPORT / "fake_vmm.py"
# Two classes whose VMs, with --points 1, are 200 and 350 MiB (2 and 3 vCPUs).
POLICY: dict[str, Any] = {"apiVersion": "katasizing.dev/v1alpha1", "kind": "KataSizingPolicy", "metadata": {"name": "p"},
          "spec": {"shim": "qemu-runtime-rs", "classes": [
              {"name": "s", "cpu": "1", "memory": "64Mi"}, {"name": "m", "cpu": "2", "memory": "192Mi"}]}}
S_VM, M_VM = "class s: the VM of 200 MiB (2 vCPU)", "class m: the VM of 350 MiB (3 vCPU)"


@dataclass
class Fake:
    tmp: Path
    vmm: Path
    policy: Path
    memory_dir: Path

    @property
    def pids(self) -> list[int]:
        path = self.tmp / "pids"
        return [int(p) for p in path.read_text().split()] if path.exists() else []

    @property
    def starts(self) -> list[list[str]]:
        path = self.tmp / "starts"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    def args(self, vmm: Path | None = None) -> list[str]:
        kernel, init = self.tmp / "vmlinuz", self.tmp / "init"
        return [str(self.policy), "--vmm", str(vmm or self.vmm), "--kernel", str(kernel), "--init", str(init),
                "--accel", "tcg", "--points", "1", "--memory-dir", str(self.memory_dir)]

    def env(self, mode: str, **extra: str) -> dict[str, str]:
        return {**os.environ, "FAKE_VMM": mode, "FAKE_VMM_PIDS": str(self.tmp / "pids"),
                "FAKE_VMM_LOG": str(self.tmp / "starts"), **extra}

    def wrapper(self) -> Path:
        """A VMM that is a shell script running QEMU without exec: the shell stays, QEMU is its child."""
        script = self.tmp / "qemu-wrapper"
        script.write_text(f'#!/bin/sh\n"{self.vmm}" "$@"\nexit $?\n')
        script.chmod(0o755)
        return script


@dataclass
class Ran:
    returncode: int
    stdout: str
    stderr: str
    pid: int

    @property
    def comments(self) -> list[str]:
        return [line for line in self.stdout.splitlines() if line.startswith("#")]


@pytest.fixture
def fake(tmp_path: Path) -> Fake:
    vmm = tmp_path / "qemu-system-x86_64"
    vmm.write_text(f"#!{sys.executable}\n" + FAKE_VMM.read_text())
    vmm.chmod(0o755)
    (tmp_path / "vmlinuz").write_bytes(b"not a kernel: the fake VMM does not read it")
    (tmp_path / "init").write_bytes(b"\x7fELF" + b"\0" * 60)
    policy = tmp_path / "policy.yaml"
    policy.write_text(yaml.safe_dump(POLICY))
    memory_dir = tmp_path / "shm"
    memory_dir.mkdir()
    return Fake(tmp_path, vmm, policy, memory_dir)


def probe(*args: str, env: dict[str, str] | None = None, stdout: int | IO[str] | None = subprocess.PIPE,
          timeout: float = 60, preexec=None) -> Ran:
    process = subprocess.Popen([sys.executable, "-m", "kata_sizing.cli", "probe", *args], stdout=stdout,
                               stderr=subprocess.PIPE, text=True, cwd=ROOT, env=env, preexec_fn=preexec)
    out, err = process.communicate(timeout=timeout)
    return Ran(process.returncode, out or "", err, process.pid)


def in_process(capsys: pytest.CaptureFixture[str], *args: str) -> Ran:
    """`kata-sizing probe` in this process: for what it answers before any VM starts."""
    code = main(["probe", *args])
    out, err = capsys.readouterr()
    return Ran(code, out, err, os.getpid())


def hierarchy() -> vmrun.CgroupHierarchy:
    found, why = vmrun.CgroupHierarchy.find()
    if found is None:
        pytest.skip(f"no memory cgroup here: {why}")
    return found


def own_cgroup() -> Path:
    return hierarchy().own


def vm_cgroups_here() -> Path | None:
    """The cgroup below which the probe makes its VMs' (ours, where it runs), or None where it cannot (not root)."""
    found, _ = vmrun.CgroupHierarchy.find()
    return found.own if found is not None and os.access(found.own, os.W_OK) else None


def assert_nothing_left(fake: Fake, ran: Ran) -> None:
    """No process a VM started runs on, no VM cgroup is left, no memory file beside the directory."""
    alive = [pid for pid in fake.pids if vmrun._pid_alive(pid)]
    assert alive == [], f"processes left running: {alive}"
    own = vm_cgroups_here()
    assert own is None or list(own.glob(f"kata-sizing-probe-{ran.pid}-*")) == []
    assert [p.name for p in fake.tmp.iterdir() if p.name.startswith("shm")] == ["shm"]
    assert list(fake.memory_dir.iterdir()) == []


def test_a_failed_vm_is_a_comment_line_and_the_run_goes_on_to_keep_the_rows(fake: Fake) -> None:
    ran = probe(*fake.args(), env=fake.env("200:sigbus,ok"))
    assert ran.returncode == 3, ran.stderr
    # The failed VM, named (class, size, why: SIGBUS with the memory directory and the guidance),
    # then the row of the next VM: calibrate reads it.
    failed = next(line for line in ran.comments if S_VM in line)
    assert failed.startswith(f"# {S_VM} failed: SIGBUS: the VMM died of signal 7 (exit -7): the guest touched memory "
                             f"its file in {fake.memory_dir} could not get: a filesystem of ")
    assert "size it with `kata-sizing render --node-capacity`" in failed
    [row] = parse_samples_csv(ran.stdout)
    assert (row.class_name, row.vm_nominal_mib) == ("m", 350)
    assert ran.comments[-1] == "# 1 of 2 VM(s) measured; 1 failed (the lines above say why)."
    assert "Traceback" not in ran.stderr
    assert_nothing_left(fake, ran)


def test_a_wrapper_script_s_sigbus_is_named_too(fake: Fake) -> None:
    # sh reports a child killed by signal 7 as exit 135.
    ran = probe(*fake.args(fake.wrapper()), env=fake.env("sigbus"))
    assert ran.returncode == 3
    assert all(" failed: SIGBUS: the VMM died of signal 7 (exit 135)" in line for line in ran.comments[-3:-1]), ran.stdout


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_sigterm_or_ctrl_c_keeps_the_rows_written_and_stops_every_vm(fake: Fake, signum: signal.Signals) -> None:
    process = subprocess.Popen([sys.executable, "-m", "kata_sizing.cli", "probe", *fake.args()],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                               env=fake.env("200:ok,hang"))
    try:
        assert process.stdout is not None
        lines: list[str] = []
        while not lines or not lines[-1].startswith(",,s,"):  # the first VM's row, written as it finished
            lines.append(process.stdout.readline())
            assert lines[-1], "the probe ended before its first row"
        deadline = time.monotonic() + 30
        while not fake.pids and time.monotonic() < deadline:  # the second VM, hanging
            time.sleep(0.05)
        process.send_signal(signum)  # a Job's pod deleted, or Ctrl-C
        out, err = process.communicate(timeout=30)
    finally:
        process.kill()
    assert process.returncode == 130, err
    text = "".join(lines) + out
    assert [s.class_name for s in parse_samples_csv(text)] == ["s"]
    assert text.splitlines()[-2:] == [f"# {M_VM}: stopped by {signum.name} before it finished: not measured",
                                      f"# Stopped by {signum.name}: 1 of 2 VM(s) measured."]
    assert_nothing_left(fake, Ran(process.returncode, text, err, process.pid))


def test_a_vmm_that_fills_its_stderr_pipe_does_not_block_the_probe(fake: Fake) -> None:
    # 1 MiB on stderr before the guest reports: 16 times what a pipe holds.
    ran = probe(*fake.args(), env=fake.env("stderr-flood"))
    assert ran.returncode == 0, ran.stderr
    assert [s.class_name for s in parse_samples_csv(ran.stdout)] == ["s", "m"]


def test_a_wrapper_without_exec_that_hangs_is_stopped_at_the_timeout_with_every_process(fake: Fake) -> None:
    started = time.monotonic()
    ran = probe(*fake.args(fake.wrapper()), "--timeout", "1", env=fake.env("200:hang,ok"))
    assert ran.returncode == 3
    assert f"# {S_VM} failed: timed out after 1 s (the guest did not report its memory)" in ran.comments
    # The VM was stopped at its timeout, not when the wrapper's child (holding the pipes) ended.
    assert time.monotonic() - started < 30
    assert [s.class_name for s in parse_samples_csv(ran.stdout)] == ["m"]
    assert len(fake.pids) == 1
    assert_nothing_left(fake, ran)


def test_a_guest_that_never_reports_times_out_in_one_line(fake: Fake) -> None:
    ran = probe(*fake.args(), "--timeout", "1", env=fake.env("200:silent,ok"))
    assert ran.returncode == 3
    assert (f"# {S_VM} failed: timed out after 1 s (the guest never reported (no init output on its consoles))"
            in ran.comments), ran.stdout
    assert_nothing_left(fake, ran)


def test_a_daemon_the_vmm_leaves_behind_is_killed_with_its_vm(fake: Fake) -> None:
    if vm_cgroups_here() is None:
        pytest.skip("a daemon leaves the VMM's session: only the VM's cgroup finds it, and making one needs root")
    ran = probe(*fake.args(), env=fake.env("daemon"))
    assert ran.returncode == 0, ran.stderr
    assert len(fake.pids) == 2  # one daemon per VM, each in a session of its own
    assert_nothing_left(fake, ran)


FORGED = {
    "forged-total": "the guest reported MemTotal {kib} kB, more than its VM's {mib} MiB ({vm_kib} kB)",
    "forged-digit": "the guest's report is malformed: meminfo MemTotal='1²345' is not a whole number (ASCII digits, "
                    "at most 19)",
    "forged-negative": "the guest's report is malformed: meminfo MemFree='-5' is not a whole number",
    "forged-absurd": "the guest's report is malformed: meminfo MemFree='1000000000000000000000000000000' is not a "
                     "whole number",
    "forged-held": "the guest reported holding {held} MiB, more than its VM's {mib} MiB",
    "forged-error": "the guest's init failed: \\u202eyyyy",
}


@pytest.mark.parametrize("modes", [("forged-total", "forged-digit"), ("forged-negative", "forged-absurd"),
                                   ("forged-held", "forged-error")])
def test_a_report_no_guest_of_that_vm_can_give_is_a_one_line_row_error(fake: Fake, modes: tuple[str, str]) -> None:
    ran = probe(*fake.args(), env=fake.env(f"200:{modes[0]},350:{modes[1]}"))
    assert ran.returncode == 3, ran.stderr
    for what, mib, mode in ((S_VM, 200, modes[0]), (M_VM, 350, modes[1])):
        failed = next(line for line in ran.comments if what in line)
        problem = FORGED[mode].format(mib=mib, kib=mib * 1024 + 4, vm_kib=mib * 1024, held=mib * 4)
        assert failed.startswith(f"# {what} failed: {problem}"), failed
        assert len(failed) < 600  # a guest's text is quoted clipped
    assert "Traceback" not in ran.stderr
    header = next(line for line in ran.stdout.splitlines() if not line.startswith("#")).split(",")
    figures = {"node": "0", "container_limit_mib": "1", "vm_nominal_mib": "1", "free_total_mib": "1", "free_used_mib": "1"}
    by_hand = ",".join(figures.get(column, "") for column in header) + "\n"
    assert parse_samples_csv(ran.stdout + by_hand)[0].line == len(ran.stdout.splitlines()) + 1


def test_a_guest_flooding_its_console_gets_its_report_read_all_the_same(fake: Fake) -> None:
    # 64 MiB of kernel messages, a 5 MiB line (with a report in it, past what a line may hold).
    ran = probe(*fake.args(), env=fake.env("console-flood"))
    assert ran.returncode == 0, ran.stderr
    assert [s.class_name for s in parse_samples_csv(ran.stdout)] == ["s", "m"]


def test_a_vmm_s_error_is_quoted_clipped(fake: Fake) -> None:
    ran = probe(*fake.args(), env=fake.env("exit1"))
    assert ran.returncode == 3
    failed = next(line for line in ran.comments if S_VM in line)
    assert failed.startswith(f"# {S_VM} failed: the VMM exited with 1: fake VMM: could not load kernel")
    assert len(failed) < 400


def test_a_memory_dir_with_a_comma_stays_one_qemu_value(fake: Fake) -> None:
    # Unescaped, QEMU would read `share=off` as an option and put a file named `shm` beside the
    # directory (it was left behind).
    memory_dir = fake.tmp / "shm,share=off"
    memory_dir.mkdir()
    fake.memory_dir.rmdir()
    ran = probe(*fake.args()[:-2], "--memory-dir", str(memory_dir), env=fake.env("ok"))
    assert ran.returncode == 0, ran.stderr
    for argv in fake.starts:
        backend = argv[argv.index("-object") + 1]
        assert backend.endswith(f",mem-path={str(memory_dir).replace(',', ',,')},share=on"), backend
    assert [p.name for p in fake.tmp.iterdir() if p.name.startswith("shm")] == ["shm,share=off"]
    assert list(memory_dir.iterdir()) == []


@pytest.mark.parametrize("stdout, why", [
    ("full", "No space left on device"),
    ("closed", "closed (a pipe whose reader ended)"),
])
def test_an_output_that_cannot_be_written_is_one_line_and_stops_the_run(fake: Fake, stdout: str, why: str) -> None:
    if stdout == "full":
        with open("/dev/full", "w") as full:
            ran = probe(*fake.args(), env=fake.env("ok"), stdout=full)
    else:
        reader, writer = os.pipe()
        os.close(reader)
        try:
            ran = probe(*fake.args(), env=fake.env("ok"), stdout=writer)
        finally:
            os.close(writer)
    assert ran.returncode == 4, ran.stderr
    assert ran.stderr.splitlines()[-1] == (f"error: stdout: cannot write the CSV: {why}; 0 row(s) were written before it, "
                                           "the VMs are stopped")
    assert "Traceback" not in ran.stderr and "Exception ignored" not in ran.stderr
    assert fake.starts == []  # the header could not be written: no VM booted


def test_the_plan_comes_first_and_plan_alone_boots_nothing(fake: Fake, capsys: pytest.CaptureFixture[str]) -> None:
    ran = in_process(capsys, *fake.args(), "--plan")
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout == "" and fake.starts == []
    lines = ran.stderr.splitlines()
    assert lines[0] == "plan: 2 VM(s) of policy p, one at a time, under tcg (--accel)"
    assert lines[1:3] == ["  class s: 1 VM(s) of 200 MiB (2 vCPU)", "  class m: 1 VM(s) of 350 MiB (3 vCPU)"]
    assert lines[3] == ("  guest memory 550 MiB in all, at most 350 MiB at once (542 MiB with its VMM); a container "
                        "running this probe needs a memory limit of at least 670 MiB")
    assert lines[4] == "  about 14 s under tcg (6 s a boot, 4 s a GiB the guest touches)"
    assert lines[5].startswith("  room now: MemAvailable ") and f"; {fake.memory_dir} " in lines[5]
    # A run prints the same plan before its first boot.
    ran = probe(*fake.args(), env=fake.env("ok"))
    assert ran.stderr.splitlines()[:5] == lines[:5]


@pytest.mark.parametrize("check, accelerator, why", [
    ("ok", "kvm", "a KVM guest reached its init in "),
    ("silent", "tcg", "/dev/kvm opens but a KVM guest did not reach its init within 1 s (no nested virtualization?)"),
])
def test_accel_auto_checks_kvm_with_a_small_guest_first(fake: Fake, capsys: pytest.CaptureFixture[str],
                                                        monkeypatch: pytest.MonkeyPatch, check: str, accelerator: str,
                                                        why: str) -> None:
    """`--accel auto` boots a 128 MiB VM under KVM first and uses KVM only when its guest reaches its init in
    time (on the machines the project is tested on, /dev/kvm opens and a KVM guest hangs: the real VMs run
    --accel tcg, and this stand-in VMM stands in for both answers, the check's wait cut to a second)."""
    monkeypatch.setattr(vmrun, "KVM_CHECK_S", 1.0)
    monkeypatch.setattr(vmrun, "kvm_problem", lambda: None)
    for key, value in fake.env(f"128:{check},ok").items():
        monkeypatch.setenv(key, value)
    args = fake.args()
    args[args.index("--accel") + 1] = "auto"
    ran = in_process(capsys, *args)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.startswith(f"# kata-sizing probe of policy p: 2 VM(s) of {fake.vmm} with ")
    assert f" under {accelerator} ({why}" in ran.stdout.splitlines()[0]
    rows = parse_samples_csv(ran.stdout)
    assert {(r.accelerator, r.tcg_tb_size_mib) for r in rows} == {(accelerator, 64 if accelerator == "tcg" else None)}
    first = fake.starts[0]
    assert first[first.index("-accel") + 1] == "kvm" and first[first.index("-m") + 1].startswith("128M")
    assert [start[start.index("-accel") + 1] for start in fake.starts[1:]] == [
        "kvm" if accelerator == "kvm" else "tcg,tb-size=64"] * 2
    assert_nothing_left(fake, ran)


def test_a_subset_is_probed_as_asked_and_said(fake: Fake) -> None:
    ran = probe(*fake.args(), "--max-vm-memory", "300Mi", env=fake.env("ok"))
    assert ran.returncode == 0, ran.stderr
    assert [s.class_name for s in parse_samples_csv(ran.stdout)] == ["s"]
    assert "# Left out as asked: 350 MiB of class m." in ran.comments
    assert "  left out: class m: 350 MiB (above --max-vm-memory 300 MiB)" in ran.stderr.splitlines()
    ran = probe(*fake.args(), "--classes", "m", env=fake.env("ok"))
    assert [s.class_name for s in parse_samples_csv(ran.stdout)] == ["m"]


@pytest.mark.parametrize("args, line", [
    (["--points", "11"], "error: --points 11: at least 1 and at most 10 VMs per class"),
    (["--classes", "s,xl"], "error: --classes: 'xl' is not a class of the policy (its classes: s, m)"),
    (["--classes", "s,"], "error: --classes: 's,' is not a list of class names separated by commas"),
    (["--max-vm-memory", "5Zi"], "error: --max-vm-memory: '5Zi' is not a Kubernetes quantity"),
    (["--max-vm-memory", "100Mi"], "error: nothing to probe: every VM of the policy is left out (above "
                                   "--max-vm-memory 100 MiB; the smallest is 200 MiB)"),
    (["--node", 'Bad Node,"x"'], "error: --node: 'Bad Node,\"x\"' is not a DNS subdomain"),
    (["--kernel", "/tmp/k\nnode,pod"], "error: --kernel: '/tmp/k\\nnode,pod' holds the control character '\\n'"),
    (["--memory-dir", "/dev/shm\u2028x"], "error: --memory-dir: '/dev/shm\\u2028x' holds the control character"),
])
def test_flags_that_would_forge_output_or_run_away_are_refused_in_one_line(
        fake: Fake, capsys: pytest.CaptureFixture[str], args: list[str], line: str) -> None:
    ran = in_process(capsys, *fake.args(), *args)
    assert ran.returncode == 2, ran.stderr
    assert ran.stderr.startswith(line) and ran.stderr.count("\n") == 1, ran.stderr
    assert ran.stdout == "" and fake.starts == []


def test_a_kata_configuration_whose_paths_would_forge_lines_is_refused(
        fake: Fake, capsys: pytest.CaptureFixture[str]) -> None:
    config = fake.tmp / "configuration-qemu-runtime-rs.toml"
    config.write_text(f'[hypervisor.qemu]\npath = "{fake.vmm}"\nkernel = "/k\\nnode,pod,class"\n')
    ran = in_process(capsys, str(fake.policy), "--config", str(config), "--init", str(fake.tmp / "init"))
    assert ran.returncode == 2
    assert ran.stderr == (f"error: {config}: [hypervisor.qemu] kernel: '/k\\nnode,pod,class' holds the control "
                          "character '\\n' (a path with it could forge a line of output)\n")


def test_a_vm_larger_than_the_host_is_refused_before_any_boot(fake: Fake, capsys: pytest.CaptureFixture[str]) -> None:
    # A class whose VM is 1 TiB: no host this runs on has it (its memory dir neither).
    huge = {**POLICY, "spec": {**POLICY["spec"], "classes": [*POLICY["spec"]["classes"],
                                                             {"name": "xl", "cpu": "2", "memory": "1Ti"}]}}
    fake.policy.write_text(yaml.safe_dump(huge))
    ran = in_process(capsys, *fake.args())
    assert ran.returncode == 2
    [error] = [line for line in ran.stderr.splitlines() if line.startswith("error:")]
    assert error.startswith("error: class xl: the VM of 1") and "nothing booted (probe less:" in error
    assert ("more than the host's MemAvailable" in error) or ("does not fit the memory directory" in error)
    assert fake.starts == [] and ran.stdout == ""


def test_a_vm_the_memory_dir_cannot_hold_is_refused_before_any_boot(fake: Fake, capsys: pytest.CaptureFixture[str]
                                                                    ) -> None:
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mount = fake.tmp / "small"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16m", "tmpfs", str(mount)], check=True)
    try:
        ran = in_process(capsys, *fake.args()[:-2], "--memory-dir", str(mount))
    finally:
        subprocess.run(["umount", str(mount)], check=True)
    assert ran.returncode == 2
    errors = [line for line in ran.stderr.splitlines() if line.startswith("error:")]
    assert errors == [
        f"error: {vm} does not fit the memory directory {mount} (its guest would die of SIGBUS): 16 MiB free of "
        "16 MiB (statvfs); nothing booted (probe less: --classes, --max-vm-memory)" for vm in (S_VM, M_VM)]
    assert fake.starts == []


def test_a_vm_the_probe_s_cgroup_limit_cannot_hold_is_refused_before_any_boot(fake: Fake) -> None:
    # The probe runs in a cgroup of 450 MiB below ours (as a Job's container with its limit):
    # the 350 MiB VM with its VMM would not fit, the 200 MiB one would.
    own = own_cgroup()
    parent = own / f"ksp-test-limit-{os.getpid()}"
    parent.mkdir()
    try:
        (parent / "memory.limit_in_bytes").write_text(str(450 * 1024 * 1024))
        ran = probe(*fake.args(), env=fake.env("ok"),
                    preexec=lambda: (parent / "cgroup.procs").write_text(str(os.getpid())))
    finally:
        parent.rmdir()
    assert ran.returncode == 2, ran.stderr
    [error] = [line for line in ran.stderr.splitlines() if line.startswith("error:")]
    assert error.startswith(f"error: {M_VM} needs 542 MiB with its VMM, more than the memory limit over the probe "
                            f"leaves: 450 MiB (memory.limit_in_bytes of {hierarchy().name(parent)}, "), error
    assert fake.starts == []
