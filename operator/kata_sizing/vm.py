"""Booting the probe's VMs on this host (`kata-sizing probe`, docs/probe.md): the node's VMM as a
subprocess in a memory cgroup of its own, its consoles read for the init's report, and its figures
on the host (peak resident memory, the cgroup's peak charge, its OOM kills). What to boot, how to
read what it says and how to name what went wrong is core/ (probe.py, probehost.py); this module
only runs it and reads the kernel's files.

Every process of a VM lives in the VM's cgroup (the VMM and whatever it starts; `RunningVm.start`
adds more, such as a virtiofsd): stopping a VM kills every process of that cgroup (v2
`cgroup.kill`, v1 each pid until none is left) and removes the cgroup, whatever happens (a timeout,
an error, Ctrl-C). The VMM's output is drained as it comes and the consoles are read in bounded
chunks, so neither a chatty VMM nor a flooding guest blocks or grows the probe.
"""

from __future__ import annotations

import errno
import os
import selectors
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import IO

from .core.kataguest import GuestBoot, KernelModule, ModuleError, kernel_module
from .core.probe import (
    HVC_SUFFIX,
    ConsoleReader,
    GuestReport,
    HostFigures,
    ProbeError,
    VmmPaths,
    kernel_command_line,
    quoted,
    vm_command,
)
from .core.probehost import (
    CgroupLevel,
    HostRoom,
    VmEnd,
    keyed_counts,
    limit_bytes,
    own_cgroup,
    tcg_cache_resident_bytes,
    tightest_limit,
)
from .core.quantity import MIB
from .core.sizing import Vm

# Where the image (and a package install) carries the init; `make` builds .tools/probe-init.
INIT_ENV = "KATA_SIZING_PROBE_INIT"
INIT_LOCATIONS = (Path(sys.prefix) / "lib" / "kata-sizing" / "probe-init", Path("/usr/lib/kata-sizing/probe-init"))
# A KVM guest reaches the init in well under a second; one that has said nothing after this long
# is not running (seen on hosts without nested virtualization: KVM_CREATE_VM works, the guest hangs).
KVM_CHECK_S = 10.0
POLL_S = 0.1
# Where the cgroup filesystems are mounted: the v2 (unified) hierarchy, or v1's with the memory
# controller at memory/. A parameter everywhere it is read (tests lay out a v2 tree elsewhere).
CGROUP_ROOT = Path("/sys/fs/cgroup")
PROC = Path("/proc")
# Bounds on what the probe holds of a VM's output: each of the VMM's stdout and stderr keeps its
# first line and a tail of this many bytes; a console is read this much at a time, and a guest that
# writes more than MAX_CONSOLE_BYTES on one (on the probe's disk) is stopped.
TAIL_BYTES = 16 * 1024
READ_CHUNK = 1024 * 1024
MAX_READ_PER_POLL = 64 * 1024 * 1024
MAX_CONSOLE_BYTES = 256 * 1024 * 1024
# How long stopping a VM may take: its processes killed, each waited for.
KILL_S = 10.0
# How long a virtio-fs daemon may take to listen on its socket (it does in well under a second).
DAEMON_START_S = 10.0
# At most this often /proc/PID/smaps of a TCG VMM is read for its translation cache (the read walks the
# page tables of the guest's memory too: about 10 ms a GiB of it touched, measured here).
CACHE_SAMPLE_S = 1.0
# Where the host's vhost-vsock device is: Kata gives every VM a vsock (its agent's channel) through it.
VHOST_VSOCK = Path("/dev/vhost-vsock")
# Bounds on a directory of guest kernel modules (--guest-modules): the modules Kata's devices need are
# about 2.5 MB with their dependencies (docs/probe.md); no module is near 64 MiB.
MAX_MODULES = 256
MAX_MODULE_BYTES = 64 * MIB


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
    kata = paths.kata
    for what, path in (("image", kata.image), ("initrd", kata.initrd)):
        if path is not None and not Path(path).is_file():
            raise ProbeError(f"the guest {what} {path} (from {paths.source}) is not a file")
    daemon = kata.virtio_fs_daemon
    if kata.virtio_fs and daemon is not None and not (Path(daemon).is_file() and os.access(daemon, os.X_OK)):
        raise ProbeError(f"the virtio-fs daemon {daemon} (from {paths.source} or --virtiofsd) is not an executable file")


# --- cgroups ---------------------------------------------------------------------------------------


class CgroupFiles:
    """The kernel's cgroup filesystem as the probe uses it: reads, writes, mkdir and rmdir. The
    tests put a model of cgroup v2's rules in its place (this host mounts v1 only)."""

    def read(self, path: Path) -> str:
        return path.read_text()

    def write(self, path: Path, text: str) -> None:
        with open(path, "w") as handle:
            handle.write(text)

    def mkdir(self, path: Path) -> None:
        path.mkdir()

    def rmdir(self, path: Path) -> None:
        path.rmdir()


def _pid_alive(pid: int) -> bool:
    """A process that still runs: a zombie (dead, not yet reaped) does not."""
    try:
        stat = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[:1] != ["Z"]


@dataclass
class CgroupHierarchy:
    """Where this process's memory cgroup is: the hierarchy's mount (v2: the unified one; v1: the
    memory controller's) and its own cgroup's directory in it."""

    mount: Path
    v2: bool
    own: Path
    files: CgroupFiles = field(default_factory=CgroupFiles)

    @classmethod
    def find(cls, root: Path = CGROUP_ROOT, proc_self_cgroup: Path = PROC / "self" / "cgroup",
             files: CgroupFiles | None = None) -> tuple[CgroupHierarchy | None, str | None]:
        """(the hierarchy, None) or (None, why there is none)."""
        v2 = (root / "cgroup.controllers").is_file()
        mount = root if v2 else root / "memory"
        try:
            where = own_cgroup(proc_self_cgroup.read_text(), v2)
        except OSError as exc:
            return None, f"cannot read {proc_self_cgroup}: {exc.strerror}"
        if where is None:
            return None, f"{proc_self_cgroup} names no {'cgroup v2' if v2 else 'memory'} cgroup"
        own = mount / where.lstrip("/")
        if not own.is_dir():
            return None, f"this process's memory cgroup {own} is not a directory (another cgroup namespace?)"
        return cls(mount, v2, own, files or CgroupFiles()), None

    def name(self, path: Path) -> str:
        return "/" + str(path.relative_to(self.mount)).removeprefix(".")

    def text(self, path: Path) -> str | None:
        """A cgroup file's text; None when it cannot be read (absent: the kernel does not offer it)."""
        try:
            return self.files.read(path)
        except OSError:
            return None

    def level(self, path: Path) -> CgroupLevel | None:
        """The memory limit of one cgroup and what it holds (None: it has no memory files, as a
        v2 cgroup whose parent does not enable the controller, or the root)."""
        limit_file, usage_file, inactive_key = (
            ("memory.max", "memory.current", "inactive_file") if self.v2
            else ("memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file"))
        limit_text, usage_text = self.text(path / limit_file), self.text(path / usage_file)
        if limit_text is None or usage_text is None or not usage_text.strip().isdigit():
            return None
        inactive = keyed_counts(self.text(path / "memory.stat") or "").get(inactive_key, 0)
        if self.v2:
            hits = keyed_counts(self.text(path / "memory.events") or "").get("max")
        else:
            failcnt = (self.text(path / "memory.failcnt") or "").strip()
            hits = int(failcnt) if failcnt.isdigit() else None
        return CgroupLevel(self.name(path), limit_bytes(limit_text), int(usage_text.strip()), inactive, limit_file,
                           hits)

    def levels(self, start: Path | None = None) -> list[CgroupLevel]:
        """Every memory cgroup whose limit applies to `start` (default: this process's own), from
        it up to the hierarchy's root. The kernel charges each page to every level up (v2 always;
        v1 while the parent's memory.use_hierarchy is 1, the only value recent kernels allow)."""
        found = []
        path = start or self.own
        while True:
            level = self.level(path)
            if level is not None:
                found.append(level)
            if path == self.mount or self.mount not in path.parents:
                return found
            parent = path.parent
            if not self.v2 and (self.text(parent / "memory.use_hierarchy") or "1").strip() == "0":
                return found
            path = parent


class MemoryCgroup:
    """One VM's cgroup: every process of the VM joins it before it runs, so it is charged here
    from its first page (the guest's pages in the memory file are charged to the VMM, which
    touches them first, as on a Kata node with sandbox_cgroup_only), and found here to be killed."""

    def __init__(self, path: Path, hierarchy: CgroupHierarchy) -> None:
        self.path, self.hierarchy = path, hierarchy
        self.files = hierarchy.files
        self.killed: set[int] = set()

    def _text(self, name: str) -> str | None:
        return self.hierarchy.text(self.path / name)

    def join(self) -> None:
        """Run in a process of the VM before it executes (Popen's preexec_fn)."""
        self.files.write(self.path / "cgroup.procs", str(os.getpid()))

    def pids(self) -> list[int]:
        return [int(word) for word in (self._text("cgroup.procs") or "").split() if word.isdigit()]

    def live_pids(self) -> list[int]:
        return [pid for pid in self.pids() if _pid_alive(pid)]

    def usage_bytes(self) -> int | None:
        text = self._text("memory.current" if self.hierarchy.v2 else "memory.usage_in_bytes")
        return int(text) if text and text.strip().isdigit() else None

    def peak_bytes(self) -> int | None:
        """The kernel's own peak: v2 memory.peak (Linux 5.19 and later), v1 memory.max_usage_in_bytes."""
        text = self._text("memory.peak" if self.hierarchy.v2 else "memory.max_usage_in_bytes")
        return int(text) if text and text.strip().isdigit() else None

    def oom_kills(self) -> int | None:
        """Processes of this cgroup the OOM killer killed: v2 memory.events (this cgroup and those
        below), v1 memory.oom_control (Linux 4.13 and later); None: the kernel does not say."""
        text = self._text("memory.events" if self.hierarchy.v2 else "memory.oom_control")
        return None if text is None else keyed_counts(text).get("oom_kill")

    def kill_all(self, timeout_s: float = KILL_S) -> list[int]:
        """Kill every process of the cgroup, those started since included (a daemon that forked
        away from the VMM, a wrapper's child): v2's cgroup.kill where the kernel has it (5.14),
        and SIGKILL to each pid listed until none is left (each one in `killed`, for its reaper).
        The pids still alive at the timeout."""
        if self.hierarchy.v2 and (self.path / "cgroup.kill").exists():
            try:
                self.files.write(self.path / "cgroup.kill", "1")
            except OSError:
                pass
        deadline = time.monotonic() + timeout_s
        while True:
            alive = self.live_pids()
            if not alive or time.monotonic() > deadline:
                break
            for pid in alive:
                try:
                    os.kill(pid, signal.SIGKILL)
                    self.killed.add(pid)
                except ProcessLookupError:
                    pass
            time.sleep(0.01)
        return alive

    def remove(self) -> str | None:
        """rmdir the cgroup (the kernel refuses while a process is in it); why not, or None."""
        for _ in range(50):
            try:
                self.files.rmdir(self.path)
                return None
            except FileNotFoundError:
                return None
            except OSError as exc:
                problem = exc.strerror
                time.sleep(POLL_S)
        return f"the VM's cgroup {self.path} could not be removed: {problem}"


class VmCgroups:
    """Where the VMs' cgroups go: below the probe's own memory cgroup, so every limit over the probe
    (a Job's) applies to them. On cgroup v2 the memory controller must be enabled in the parent's
    cgroup.subtree_control for a child to have memory files, and the kernel refuses that while the
    parent holds processes (the no-internal-process rule): the probe then moves itself into a leaf
    of its own first. Everything changed is put back on exit."""

    def __init__(self, hierarchy: CgroupHierarchy | None, why: str | None = None) -> None:
        self.hierarchy = hierarchy
        self.notes: list[str] = [why] if why else []
        self._can_create = hierarchy is not None
        self._enabled = False
        self._leaf: Path | None = None

    @classmethod
    def here(cls, root: Path = CGROUP_ROOT) -> VmCgroups:
        hierarchy, why = CgroupHierarchy.find(root)
        return cls(hierarchy, None if hierarchy else f"no VM cgroups ({why}): the rows' cgroup peak stays empty")

    def __enter__(self) -> VmCgroups:
        hierarchy = self.hierarchy
        if hierarchy is None or not hierarchy.v2:
            return self
        files, own = hierarchy.files, hierarchy.own
        read = lambda name: (hierarchy.text(own / name) or "").split()  # noqa: E731
        if "memory" in read("cgroup.subtree_control"):
            return self
        if "memory" not in read("cgroup.controllers"):
            self.notes.append(f"the memory controller is not delegated to {hierarchy.name(own)} (not in its "
                              "cgroup.controllers): the VMs' cgroups have no memory files, the rows' cgroup peak "
                              "stays empty")
            return self
        try:
            files.write(own / "cgroup.subtree_control", "+memory")
            self._enabled = True
            return self
        except OSError as exc:
            if exc.errno != errno.EBUSY:
                self.notes.append(f"cannot enable +memory in {hierarchy.name(own)}/cgroup.subtree_control: "
                                  f"{exc.strerror}; the rows' cgroup peak stays empty")
                return self
        # EBUSY: processes in our own cgroup; we are one of them.
        leaf = own / f"kata-sizing-probe-{os.getpid()}"
        try:
            files.mkdir(leaf)
            files.write(leaf / "cgroup.procs", str(os.getpid()))
            self._leaf = leaf
            files.write(own / "cgroup.subtree_control", "+memory")
            self._enabled = True
        except OSError as exc:
            self.notes.append(f"cannot enable +memory in {hierarchy.name(own)}/cgroup.subtree_control ({exc.strerror}: "
                              "other processes share the probe's cgroup, and cgroup v2 keeps processes out of a "
                              "cgroup that enables controllers for its children); the rows' cgroup peak stays empty")
            self._restore()
        return self

    def __exit__(self, *_: object) -> None:
        self._restore()

    def _restore(self) -> None:
        hierarchy = self.hierarchy
        if hierarchy is None:
            return
        files, own = hierarchy.files, hierarchy.own
        if self._enabled:
            try:
                files.write(own / "cgroup.subtree_control", "-memory")
            except OSError:
                pass
            self._enabled = False
        if self._leaf is not None:
            try:
                files.write(own / "cgroup.procs", str(os.getpid()))
                files.rmdir(self._leaf)
            except OSError as exc:
                self.notes.append(f"could not leave the probe's own leaf cgroup {self._leaf}: {exc.strerror}")
            self._leaf = None

    def create(self, name: str) -> MemoryCgroup | None:
        """A VM's cgroup below the probe's (one a crashed probe of the same pid left, empty, is
        removed first); None, and a note, where none can be made."""
        if self.hierarchy is None or not self._can_create:
            return None
        path, files = self.hierarchy.own / name, self.hierarchy.files
        try:
            try:
                files.mkdir(path)
            except FileExistsError:
                files.rmdir(path)
                files.mkdir(path)
        except OSError as exc:
            self.notes.append(f"cannot create a cgroup under {self.hierarchy.own}: {exc.strerror}; the rows' cgroup "
                              "peak stays empty, and processes a VMM leaves may outlive it")
            self._can_create = False
            return None
        return MemoryCgroup(path, self.hierarchy)

    def levels_over(self, cgroup: MemoryCgroup | None) -> list[CgroupLevel]:
        if self.hierarchy is None:
            return []
        return self.hierarchy.levels(cgroup.path if cgroup is not None else None)


# --- the host's room --------------------------------------------------------------------------------


def mem_available_bytes(meminfo: Path = PROC / "meminfo") -> int | None:
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def memory_dir_space(memory_dir: str) -> tuple[int | None, int | None]:
    """(free, size) of the filesystem holding the memory directory, bytes (statvfs: what an
    unprivileged writer may still use)."""
    try:
        stats = os.statvfs(memory_dir)
    except OSError:
        return None, None
    return stats.f_bavail * stats.f_frsize, stats.f_blocks * stats.f_frsize


def host_room(memory_dir: str, cgroups: VmCgroups, meminfo: Path = PROC / "meminfo") -> HostRoom:
    free, size = memory_dir_space(memory_dir)
    return HostRoom(mem_available_bytes(meminfo), memory_dir, free, size, tuple(cgroups.levels_over(None)),
                    tuple(cgroups.notes), os.cpu_count())


# --- a VM ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class BootResult:
    report: GuestReport
    host: HostFigures
    end: VmEnd
    notes: tuple[str, ...] = ()

    @property
    def exit_code(self) -> int | None:
        return self.end.exit_code


class _Output:
    """One of a process's pipes, read as it comes: its first 4 KiB (for its first line) and a
    bounded tail."""

    HEAD_BYTES = 4096

    def __init__(self) -> None:
        self._head = b""
        self.tail = b""

    def add(self, data: bytes) -> None:
        if len(self._head) < self.HEAD_BYTES:
            self._head += data[:self.HEAD_BYTES - len(self._head)]
        self.tail = (self.tail[-TAIL_BYTES:] + data[-TAIL_BYTES:])[-TAIL_BYTES:]

    @property
    def first_line(self) -> str | None:
        line = next((line for line in self._head.split(b"\n") if line.strip()), None)
        return None if line is None else line.decode(errors="replace").strip()

    @property
    def last_line(self) -> str | None:
        line = next((line for line in reversed(self.tail.split(b"\n")) if line.strip()), None)
        return None if line is None else line.decode(errors="replace").strip()


def _peak_resident_bytes(pid: int) -> int | None:
    try:
        for line in (PROC / str(pid) / "status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _parent_pid(pid: int) -> int | None:
    try:
        return int((PROC / str(pid) / "stat").read_text().rpartition(")")[2].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def _tcg_cache_bytes(pid: int) -> int | None:
    try:
        return tcg_cache_resident_bytes((PROC / str(pid) / "smaps").read_text())
    except OSError:
        return None


class RunningVm:
    """One VM being run: started in its own memory cgroup (a virtio-fs daemon first, when it has one, then
    its VMM), its pipes drained and consoles read as they grow (`poll`), stopped (every process of its
    cgroup killed, the cgroup removed) by `stop()`, which every path out of a `with` block calls."""

    def __init__(self, paths: VmmPaths, vm: Vm, *, accelerator: str, initramfs_path: Path, memory_dir: str,
                 workdir: Path, command_line: str, name: str = "vm", cgroups: VmCgroups | None = None,
                 boot: GuestBoot | None = None, virtiofsd: list[str] | None = None) -> None:
        self.paths, self.vm, self.name, self.memory_dir = paths, vm, name, memory_dir
        self.accelerator = accelerator
        self.console = workdir / f"{name}.console"
        self.consoles = [self.console, Path(f"{self.console}{HVC_SUFFIX}")]
        for stale in self.consoles:
            stale.unlink(missing_ok=True)
        self.command = vm_command(paths, vm, accelerator=accelerator, memory_dir=memory_dir,
                                  initramfs_path=str(initramfs_path), command_line=command_line,
                                  console_path=str(self.console), boot=boot)
        self.boot = boot
        self.virtiofsd_command = virtiofsd
        self.cgroups = cgroups
        self.cgroup: MemoryCgroup | None = None
        self.processes: list[subprocess.Popen] = []
        self.main: subprocess.Popen | None = None  # the VMM
        self.daemon: subprocess.Popen | None = None  # the virtio-fs daemon
        self.reader = ConsoleReader()
        self._offsets = {path: 0 for path in self.consoles}
        self._selector = selectors.DefaultSelector()
        self._outputs: dict[int, _Output] = {}
        self.stderr = _Output()
        self.daemon_stderr = _Output()
        self.started = 0.0
        self.peak_resident: int | None = None
        self.daemon_peak_resident: int | None = None
        self.polled_peak: int | None = None
        self.cache_at_peak: int | None = None
        self._cache_sampled = 0.0
        self._daemon_pids: set[int] = set()
        self.stopped_by_us = False
        self.stopped_because: str | None = None
        self.timed_out = False
        self.result_: BootResult | None = None
        self._hits_before: dict[str, int | None] = {}

    # -- starting

    def __enter__(self) -> RunningVm:
        if self.cgroups is None:
            self.cgroups = VmCgroups.here()
        self.cgroup = self.cgroups.create(f"kata-sizing-probe-{os.getpid()}-{self.name}")
        self._hits_before = {level.path: level.limit_hits for level in self.cgroups.levels_over(self.cgroup)}
        self.started = time.monotonic()
        try:
            if self.virtiofsd_command is not None:
                self.daemon = self.start(self.virtiofsd_command, stderr=self.daemon_stderr)
                self._daemon_pids.add(self.daemon.pid)
                self._wait_for_socket()
            self.main = self.start(self.command, stderr=self.stderr)
        except ProbeError:
            self.stop()
            raise
        return self

    def __exit__(self, *_: object) -> None:
        self.stop()

    def _wait_for_socket(self) -> None:
        """Until the daemon listens on its socket (QEMU connects to it at start), or it ends."""
        assert self.boot is not None and self.boot.virtio_fs_socket is not None and self.daemon is not None
        assert self.virtiofsd_command is not None
        socket_path = Path(self.boot.virtio_fs_socket)
        deadline = time.monotonic() + DAEMON_START_S
        while not socket_path.is_socket():
            self.poll(POLL_S)
            ended = self.daemon.poll()
            if ended is None and time.monotonic() < deadline:
                continue
            self.poll()
            why = f"exited with {ended}" if ended is not None else f"did not listen within {DAEMON_START_S:g} s"
            said = self.daemon_stderr.last_line
            raise ProbeError(f"the virtio-fs daemon {quoted(self.virtiofsd_command[0])} {why}"
                             + (f": {quoted(said)}" if said else ""))

    def start(self, argv: list[str], stderr: _Output | None = None) -> subprocess.Popen:
        """Start a process of this VM (the VMM; a virtiofsd before it): in the VM's cgroup
        before it runs, in a session of its own, its output drained."""
        cgroup = self.cgroup
        try:
            process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                       start_new_session=True, preexec_fn=cgroup.join if cgroup else None)
        except OSError as exc:
            raise ProbeError(f"{argv[0]} did not start: {exc.strerror}") from None
        except subprocess.SubprocessError as exc:  # the join in the child failed
            raise ProbeError(f"{argv[0]} did not start: {exc}") from None
        self.processes.append(process)
        for pipe, output in ((process.stdout, _Output()), (process.stderr, stderr or _Output())):
            assert pipe is not None
            os.set_blocking(pipe.fileno(), False)
            self._selector.register(pipe, selectors.EVENT_READ)
            self._outputs[pipe.fileno()] = output
        return process

    # -- watching

    def poll(self, wait_s: float = 0.0) -> None:
        """Drain the processes' pipes (waiting up to `wait_s` for them), read what the consoles
        added, and sample the VM's memory."""
        if self._outputs:
            for key, _ in self._selector.select(wait_s):
                self._drain(key.fileobj)  # type: ignore[arg-type]
        elif wait_s:
            time.sleep(wait_s)
        self._read_consoles()
        pids = self.cgroup.pids() if self.cgroup is not None else [p.pid for p in self.processes if p.poll() is None]
        for pid in pids:  # the daemon's own, and any process it started (its sandbox)
            if pid not in self._daemon_pids and _parent_pid(pid) in self._daemon_pids:
                self._daemon_pids.add(pid)
        vmm_pids = [pid for pid in pids if pid not in self._daemon_pids]
        for pid in pids:
            resident = _peak_resident_bytes(pid)
            if resident is None:
                continue
            if pid in self._daemon_pids:
                self.daemon_peak_resident = max(resident, self.daemon_peak_resident or 0)
            else:
                self.peak_resident = max(resident, self.peak_resident or 0)
        if self.cgroup is not None:
            usage = self.cgroup.usage_bytes()
            if usage is not None and usage >= (self.polled_peak or 0):
                self.polled_peak = usage
                self._sample_cache(vmm_pids)

    def _sample_cache(self, vmm_pids: list[int]) -> None:
        """Under TCG, what of QEMU's translation cache is resident, sampled as the cgroup's charge reaches
        a new high (at most every CACHE_SAMPLE_S: smaps walks the guest's memory too), so it goes with
        the cgroup's peak."""
        now = time.monotonic()
        if self.accelerator != "tcg" or now - self._cache_sampled < CACHE_SAMPLE_S:
            return
        self._cache_sampled = now
        found = [cache for cache in map(_tcg_cache_bytes, vmm_pids) if cache is not None]
        if found:
            self.cache_at_peak = sum(found)

    def _drain(self, pipe: IO[bytes]) -> None:
        fd = pipe.fileno()
        try:
            while True:
                data = os.read(fd, READ_CHUNK)
                if not data:
                    self._selector.unregister(pipe)
                    pipe.close()
                    del self._outputs[fd]
                    return
                self._outputs[fd].add(data)
        except BlockingIOError:
            return

    def _read_consoles(self) -> None:
        for path in self.consoles:
            offset = self._offsets[path]
            try:
                with open(path, "rb") as handle:
                    handle.seek(offset)
                    read = 0
                    while read < MAX_READ_PER_POLL:
                        data = handle.read(READ_CHUNK)
                        if not data:
                            break
                        self.reader.feed(data, path.name)
                        read += len(data)
                    offset += read
            except FileNotFoundError:
                continue
            self._offsets[path] = offset
            if offset > MAX_CONSOLE_BYTES and self.stopped_because is None:
                self.stopped_because = (f"the guest wrote more than {MAX_CONSOLE_BYTES // MIB} MiB on its console "
                                        f"{path.name}")

    def report(self) -> GuestReport:
        return self.reader.report()

    def running(self) -> bool:
        return self.main is not None and self.main.poll() is None

    def wait(self, timeout_s: float, until: Callable[[GuestReport], bool] | None = None,
             interrupted: Callable[[], bool] | None = None) -> bool:
        """Until the VMM ends (True), `until` holds on the report (True), the probe is interrupted
        or the guest floods its console (True: stopped_because or the caller says why), or the
        timeout (False)."""
        while time.monotonic() - self.started < timeout_s:
            self.poll(POLL_S)
            if not self.running() or self.stopped_because is not None:
                return True
            if until is not None and until(self.report()):
                return True
            if interrupted is not None and interrupted():
                return True
        self.timed_out = True
        return False

    # -- stopping

    def stop(self) -> BootResult:
        """Kill every process of the VM, read what is left of its output and its cgroup's figures,
        remove its cgroup. Idempotent."""
        if self.result_ is not None:
            return self.result_
        notes = []
        main = self.main
        if main is not None and main.poll() is None:
            self.stopped_by_us = True
        if main is not None:
            self.poll()
        if self.cgroup is not None:
            left = self.cgroup.kill_all()
            if left:
                notes.append(f"processes {', '.join(map(str, left))} of the VM's cgroup would not die")
        else:  # no cgroup to find them by: the sessions the processes were started in
            for process in self.processes:
                if process.poll() is None:
                    try:
                        os.killpg(process.pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
        for process in self.processes:
            try:
                process.wait(KILL_S)
            except subprocess.TimeoutExpired:
                notes.append(f"process {process.pid} of the VM did not end within {KILL_S:g} s of SIGKILL")
        own = {process.pid for process in self.processes}
        for pid in (self.cgroup.killed - own) if self.cgroup is not None else ():
            try:  # orphans the probe reaps when it is PID 1 (a Job's container)
                os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                pass
        self.poll()
        for pipe in [key.fileobj for key in self._selector.get_map().values()]:
            self._selector.unregister(pipe)
            pipe.close()  # type: ignore[union-attr]
        self._selector.close()
        self._outputs.clear()
        for path in self.consoles:
            self.reader.end(path.name)
        peak = oom = hits = None
        limit = None
        if self.cgroup is not None:
            peak, oom = self.cgroup.peak_bytes(), self.cgroup.oom_kills()
            if peak is None and self.polled_peak is not None:
                peak = self.polled_peak
                notes.append("the cgroup's peak was polled every 0.1 s (the kernel has no memory.peak before Linux "
                             "5.19): a lower bound")
            assert self.cgroups is not None
            limit = tightest_limit(self.cgroups.levels_over(self.cgroup))
            before = self._hits_before.get(limit.path) if limit is not None else None
            if limit is not None and limit.limit_hits is not None and before is not None:
                hits = limit.limit_hits - before
            problem = self.cgroup.remove()
            if problem:
                notes.append(problem)
            self.cgroup = None
        free, size = memory_dir_space(self.memory_dir)
        exit_code = None if main is None or self.stopped_by_us else main.returncode
        first, last = self.stderr.first_line, self.stderr.last_line
        if exit_code not in (0, None) and last and last != first:
            notes.append(f"the VMM's stderr ended with: {quoted(last)}")
        daemon_said = self.daemon_stderr.last_line
        if self.daemon is not None and self.daemon.returncode not in (0, None, -signal.SIGKILL) and daemon_said:
            notes.append(f"the virtio-fs daemon exited with {self.daemon.returncode}: {quoted(daemon_said)}")
        end = VmEnd(exit_code, timed_out=self.timed_out, seconds=time.monotonic() - self.started, oom_kills=oom,
                    limit=limit, memory_dir_free_bytes=free, memory_dir_size_bytes=size,
                    stderr_line=quoted(first) if first else None, stopped_because=self.stopped_because,
                    limit_hits=hits)
        cache = self.cache_at_peak if peak is not None else None
        self.result_ = BootResult(self.reader.report(), HostFigures(self.peak_resident, peak, cache,
                                                                    self.daemon_peak_resident), end, tuple(notes))
        return self.result_

    @property
    def exit_code(self) -> int | None:
        """None while running or when stopped by us; negative: killed by that signal (SIGBUS: -7)."""
        main = self.main
        if main is None or main.poll() is None or self.stopped_by_us:
            return None
        return main.returncode


def boot(paths: VmmPaths, vm: Vm, *, accelerator: str, initramfs_path: Path, memory_dir: str, workdir: Path,
         command_line: str, timeout_s: float, name: str = "vm", cgroups: VmCgroups | None = None,
         until: Callable[[GuestReport], bool] | None = None,
         interrupted: Callable[[], bool] | None = None, guest: GuestBoot | None = None,
         virtiofsd: list[str] | None = None) -> BootResult:
    """Boot one VM (with `guest`'s devices, and `virtiofsd` beside it) and wait until it powers off (or
    `until` the report says so, the probe is interrupted, or the timeout); it is stopped in every case
    before this returns."""
    with RunningVm(paths, vm, accelerator=accelerator, initramfs_path=initramfs_path, memory_dir=memory_dir,
                   workdir=workdir, command_line=command_line, name=name, cgroups=cgroups, boot=guest,
                   virtiofsd=virtiofsd) as running:
        running.wait(timeout_s, until, interrupted)
    return running.stop()


# --- the host's parts of a Kata guest ---------------------------------------------------------------------


def vsock_available(device: Path = VHOST_VSOCK) -> bool:
    """Whether a VM can have Kata's vsock here (vhost-vsock-pci opens the host's /dev/vhost-vsock)."""
    return device.is_char_device() and os.access(device, os.R_OK | os.W_OK)


def host_memory_mib(meminfo: Path = PROC / "meminfo") -> int:
    """The host's MemTotal, MiB: what Kata's runtimes read for a VM's maxmem when default_maxmemory is 0."""
    for line in meminfo.read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) // 1024
    raise ProbeError(f"{meminfo} holds no MemTotal")


def read_modules(directory: Path) -> list[KernelModule]:
    """The kernel modules (*.ko) of a directory, each read and named from its .modinfo."""
    if not directory.is_dir():
        raise ProbeError(f"--guest-modules {directory}: not a directory")
    files = sorted(directory.glob("*.ko"))
    if not files or len(files) > MAX_MODULES:
        raise ProbeError(f"--guest-modules {directory}: {len(files)} kernel modules (*.ko); from 1 to {MAX_MODULES}")
    modules = []
    for path in files:
        if path.stat().st_size > MAX_MODULE_BYTES:
            raise ProbeError(f"--guest-modules: {path.name} is larger than {MAX_MODULE_BYTES // MIB} MiB")
        try:
            modules.append(kernel_module(path.read_bytes(), str(path)))
        except ModuleError as exc:
            raise ProbeError(f"--guest-modules: {exc}") from None
    return modules


def drop_cached(path: Path, written: bool) -> str | None:
    """Out of the host's page cache (a file the probe `written`, to disk first): the next VM that reads the
    file is charged for its pages as the first Kata pod on a node is (POSIX_FADV_DONTNEED; pages another
    process maps stay, and a tmpfs keeps all of them). Why not, or None."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError as exc:
        return f"{quoted(str(path))} cannot be dropped from the page cache: {exc.strerror}"
    try:
        if written:
            os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    except OSError as exc:
        return f"{quoted(str(path))} cannot be dropped from the page cache: {exc.strerror}"
    finally:
        os.close(fd)
    return None


def filesystem_type(path: Path, mounts: Path = PROC / "self" / "mounts") -> str | None:
    """The type of the filesystem `path` is on (the longest mount point above it), or None."""
    resolved, best, kind = str(path.resolve()), "", None
    try:
        lines = mounts.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        words = line.split()
        if len(words) < 3:
            continue
        point = words[1].replace("\\040", " ")
        if (resolved == point or resolved.startswith(point.rstrip("/") + "/")) and len(point) >= len(best):
            best, kind = point, words[2]
    return kind


def kvm_problem() -> str | None:
    """Why KVM cannot be used here without booting anything (/dev/kvm does not open), or None."""
    try:
        os.close(os.open("/dev/kvm", os.O_RDWR))
    except OSError as exc:
        return f"/dev/kvm cannot be opened ({exc.strerror})"
    return None


def detect_accelerator(paths: VmmPaths, initramfs_path: Path, workdir: Path, memory_dir: str,
                       cgroups: VmCgroups | None = None,
                       interrupted: Callable[[], bool] | None = None) -> tuple[str, str]:
    """("kvm" | "tcg", why): KVM when /dev/kvm opens and a small guest under it reaches its init
    within KVM_CHECK_S; TCG (QEMU's emulator) otherwise."""
    why_not = kvm_problem()
    if why_not:
        return "tcg", why_not
    result = boot(paths, Vm(1, 128), accelerator="kvm", initramfs_path=initramfs_path, memory_dir=memory_dir,
                  workdir=workdir, command_line=kernel_command_line(1), timeout_s=KVM_CHECK_S, name="kvm-check",
                  cgroups=cgroups, until=lambda report: report.said_hello, interrupted=interrupted)
    if result.report.said_hello:
        return "kvm", f"a KVM guest reached its init in {result.end.seconds:.1f} s"
    return "tcg", (f"/dev/kvm opens but a KVM guest did not reach its init within {KVM_CHECK_S:.0f} s "
                   "(no nested virtualization?)")


class StopRequest:
    """SIGTERM (a Job's pod deleted) and SIGINT (Ctrl-C) ask the probe to stop: a flag the run
    checks between polls, so a row is never cut in half and every VM is stopped on the way out."""

    def __init__(self) -> None:
        self.signal: int | None = None
        self._previous: dict[int, object] = {}

    def __call__(self) -> bool:
        return self.signal is not None

    def _handle(self, signum: int, frame: FrameType | None) -> None:  # noqa: ARG002
        self.signal = signum

    def __enter__(self) -> StopRequest:
        for signum in (signal.SIGTERM, signal.SIGINT):
            self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *_: object) -> None:
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)  # type: ignore[arg-type]
