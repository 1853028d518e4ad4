"""Booting the probe's VMs on this host (`kata-sizing probe`, docs/probe.md): the node's VMM as a
subprocess in a memory cgroup of its own, its consoles read for the init's report, and its figures
on the host (peak resident memory, the cgroup's peak charge). What to boot and how to read what it
says is core/probe.py; this module only runs it. Every VM it starts is stopped when it returns,
whatever happens (a timeout, an error, Ctrl-C).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from .core.probe import (
    GuestReport,
    HostFigures,
    ProbeError,
    VmmPaths,
    kernel_command_line,
    parse_console,
    vm_command,
)
from .core.sizing import Vm

# Where the image (and a package install) carries the init; `make` builds .tools/probe-init.
INIT_ENV = "KATA_SIZING_PROBE_INIT"
INIT_LOCATIONS = (Path(sys.prefix) / "lib" / "kata-sizing" / "probe-init", Path("/usr/lib/kata-sizing/probe-init"))
# A KVM guest reaches the init in well under a second; one that has said nothing after this long
# is not running (seen on hosts without nested virtualization: KVM_CREATE_VM works, the guest hangs).
KVM_CHECK_S = 10.0
POLL_S = 0.1
CGROUP_ROOT = Path("/sys/fs/cgroup")


def find_init(explicit: str | None) -> Path:
    """The probe's init binary: --init, $KATA_SIZING_PROBE_INIT, or where the image installs it."""
    for candidate in ([explicit] if explicit else [os.environ.get(INIT_ENV), *map(str, INIT_LOCATIONS)]):
        if candidate and Path(candidate).is_file():
            return Path(candidate)
    if explicit:
        raise ProbeError(f"--init {explicit}: no such file")
    raise ProbeError(f"no probe init found (looked at ${INIT_ENV} and {', '.join(map(str, INIT_LOCATIONS))}); "
                     "build it with `make probe-init` and give --init .tools/probe-init")


def check_paths(paths: VmmPaths) -> None:
    if not os.access(paths.vmm, os.X_OK) or not Path(paths.vmm).is_file():
        raise ProbeError(f"the VMM {paths.vmm} (from {paths.source}) is not an executable file")
    if not Path(paths.kernel).is_file():
        raise ProbeError(f"the guest kernel {paths.kernel} (from {paths.source}) is not a file")


@dataclass(frozen=True)
class BootResult:
    console: str
    exit_code: int | None  # None: stopped by us (a timeout); negative: killed by that signal
    report: GuestReport
    host: HostFigures
    seconds: float


class MemoryCgroup:
    """A memory cgroup of its own for one VMM (cgroup v1 or v2), below this process's, so its peak
    charge is the VMM's alone: the guest's pages in the memory file are charged to the VMM, which
    touches them first, as on a Kata node with sandbox_cgroup_only."""

    def __init__(self, path: Path, v2: bool) -> None:
        self.path, self.v2 = path, v2

    @classmethod
    def create(cls, name: str) -> tuple[MemoryCgroup | None, str | None]:
        v2 = (CGROUP_ROOT / "cgroup.controllers").exists()
        try:
            lines = Path("/proc/self/cgroup").read_text().splitlines()
        except OSError as exc:
            return None, f"cannot read /proc/self/cgroup: {exc}"
        own = None
        for line in lines:
            _, controllers, where = line.split(":", 2)
            if (v2 and controllers == "") or (not v2 and "memory" in controllers.split(",")):
                own = where
        if own is None:
            return None, "no memory cgroup controller"
        base = (CGROUP_ROOT if v2 else CGROUP_ROOT / "memory") / own.lstrip("/")
        path = base / name
        try:
            path.mkdir()
        except OSError as exc:
            return None, f"cannot create a cgroup under {base}: {exc.strerror}"
        return cls(path, v2), None

    def join(self) -> None:
        """Run in the VMM's process before it executes: it is charged here from its first page."""
        (self.path / "cgroup.procs").write_text(str(os.getpid()))

    def peak_bytes(self) -> int | None:
        name = "memory.peak" if self.v2 else "memory.max_usage_in_bytes"
        try:
            return int((self.path / name).read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    def remove(self) -> None:
        for _ in range(50):
            try:
                self.path.rmdir()
                return
            except FileNotFoundError:
                return
            except OSError:
                time.sleep(POLL_S)


def _peak_resident_bytes(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


class RunningVm:
    """One VM being run: started in its own memory cgroup, its consoles read on demand, stopped
    (and its cgroup removed) by `stop()`, which every path out of a `with` block calls."""

    def __init__(self, paths: VmmPaths, vm: Vm, *, accelerator: str, initramfs_path: Path, memory_dir: str,
                 workdir: Path, command_line: str, name: str = "vm") -> None:
        self.paths, self.vm, self.name = paths, vm, name
        self.console = workdir / f"{name}.console"
        for stale in (self.console, Path(f"{self.console}.hvc")):
            stale.unlink(missing_ok=True)
        self.command = vm_command(paths, vm, accelerator=accelerator, memory_dir=memory_dir,
                                  initramfs_path=str(initramfs_path), command_line=command_line,
                                  console_path=str(self.console))
        self.cgroup: MemoryCgroup | None = None
        self.process: subprocess.Popen | None = None
        self.started = 0.0
        self.peak_resident: int | None = None
        self.cgroup_peak: int | None = None
        self.stopped_by_us = False
        self.stderr = ""

    def __enter__(self) -> RunningVm:
        self.cgroup, _ = MemoryCgroup.create(f"kata-sizing-probe-{os.getpid()}-{self.name}")
        self.started = time.monotonic()
        try:
            self.process = subprocess.Popen(self.command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                            stderr=subprocess.PIPE,
                                            preexec_fn=self.cgroup.join if self.cgroup else None)
        except OSError as exc:
            self._release()
            raise ProbeError(f"the VMM {self.paths.vmm} did not start: {exc.strerror}") from None
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()

    def text(self) -> str:
        return _read(self.console) + _read(Path(f"{self.console}.hvc"))

    def report(self) -> GuestReport:
        return parse_console(self.text())

    def running(self) -> bool:
        assert self.process is not None
        if self.process.poll() is None:
            self.peak_resident = _peak_resident_bytes(self.process.pid) or self.peak_resident
            return True
        return False

    def wait(self, timeout_s: float, until: Callable[[GuestReport], bool] | None = None) -> bool:
        """Until the VM stops (True) or `until` holds (True), or the timeout (False)."""
        while time.monotonic() - self.started < timeout_s:
            if not self.running():
                return True
            if until is not None and until(self.report()):
                return True
            time.sleep(POLL_S)
        return False

    def stop(self) -> None:
        if self.process is None:
            return
        if self.process.poll() is None:
            self.stopped_by_us = True
            self.process.kill()
        self.process.wait()
        if self.process.stderr:
            self.stderr = self.process.stderr.read().decode(errors="replace")
            self.process.stderr.close()
        self._release()

    def _release(self) -> None:
        if self.cgroup is not None:
            self.cgroup_peak = self.cgroup.peak_bytes()
            self.cgroup.remove()
            self.cgroup = None

    @property
    def exit_code(self) -> int | None:
        """None while running or when stopped by us; negative: killed by that signal (SIGBUS: -7)."""
        if self.process is None or self.process.returncode is None or self.stopped_by_us:
            return None
        return self.process.returncode

    def result(self) -> BootResult:
        text = self.text()
        if not self.stopped_by_us and self.exit_code not in (0, None) and "KSP hello" not in text:
            first = next((line for line in self.stderr.splitlines() if line.strip()), f"exit {self.exit_code}")
            raise ProbeError(f"the VMM {self.paths.vmm} failed: {first.strip()}")
        return BootResult(text, self.exit_code, parse_console(text), HostFigures(self.peak_resident, self.cgroup_peak),
                          time.monotonic() - self.started)


def boot(paths: VmmPaths, vm: Vm, *, accelerator: str, initramfs_path: Path, memory_dir: str, workdir: Path,
         command_line: str, timeout_s: float, name: str = "vm",
         until: Callable[[GuestReport], bool] | None = None) -> BootResult:
    """Boot one VM and wait until it powers off (or `until` the report says so, or the timeout);
    it is stopped in every case before this returns."""
    with RunningVm(paths, vm, accelerator=accelerator, initramfs_path=initramfs_path, memory_dir=memory_dir,
                   workdir=workdir, command_line=command_line, name=name) as running:
        running.wait(timeout_s, until)
    return running.result()


def detect_accelerator(paths: VmmPaths, initramfs_path: Path, workdir: Path, memory_dir: str) -> tuple[str, str]:
    """("kvm" | "tcg", why): KVM when /dev/kvm opens and a small guest under it reaches its init
    within KVM_CHECK_S; TCG (QEMU's emulator) otherwise."""
    try:
        os.close(os.open("/dev/kvm", os.O_RDWR))
    except OSError as exc:
        return "tcg", f"/dev/kvm cannot be opened ({exc.strerror})"
    result = boot(paths, Vm(1, 128), accelerator="kvm", initramfs_path=initramfs_path, memory_dir=memory_dir,
                  workdir=workdir, command_line=kernel_command_line(1), timeout_s=KVM_CHECK_S, name="kvm-check",
                  until=lambda report: report.said_hello)
    if result.report.said_hello:
        return "kvm", f"a KVM guest reached its init in {result.seconds:.1f} s"
    return "tcg", (f"/dev/kvm opens but a KVM guest did not reach its init within {KVM_CHECK_S:.0f} s "
                   "(no nested virtualization?)")


@contextmanager
def stopped_on_signals() -> Iterator[None]:
    """SIGTERM (a Job's pod deleted) unwinds like Ctrl-C, so every VM is stopped on the way out."""
    import signal

    def interrupt(signum, frame):  # noqa: ARG001
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
