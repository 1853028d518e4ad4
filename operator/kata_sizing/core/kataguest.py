"""The VM Kata boots, as `kata-sizing probe` boots it (docs/probe.md, "The VM Kata boots"): what the
node's Kata configuration says of the guest (its image or initrd) and of the VM's devices, the QEMU
arguments Kata's runtimes build from it, the command line of the virtio-fs daemon beside it, and the
initramfs that carries the probe's init (alone, after Kata's initrd, or before an image's root).

Every default below is the value of Kata's shipped configuration for x86_64 (kata-containers
src/runtime/Makefile, src/runtime-rs/Makefile and the configuration-qemu*.toml.in templates), which
is what a key a node's configuration leaves out stands for; the QEMU arguments follow the Go runtime's
govmm (src/runtime/pkg/govmm/qemu/qemu.go, virtcontainers/qemu_arch_base.go) and the Rust runtime's
cmdline_generator.rs. Sources: docs/probe.md, "The VM Kata boots".
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from .model import Runtime

# --- the configuration's guest and devices -------------------------------------------------------------

# Where Kata's rootfs builder installs the agent (tools/osbuilder/rootfs-builder/rootfs.sh: AGENT_DEST),
# in an image and in an initrd alike.
KATA_AGENT_PATH = "/usr/bin/kata-agent"
# The virtio-fs tag Kata's runtimes give the shared directory (kata_agent.go mountGuestTag, runtime-rs
# share_fs), which the agent mounts at /run/kata-containers/shared/containers.
VIRTIO_FS_TAG = "kataShared"
ROOTFS_TYPES = ("ext4", "xfs", "erofs")
SHARED_FS = ("virtio-fs", "virtio-fs-nydus", "virtio-9p", "none")
VIRTIO_FS_CACHE = ("auto", "always", "never", "metadata")
# The Rust runtime's image drivers (vm_rootfs_driver): these put the image on an nvdimm, the rest on virtio-blk.
RUST_NVDIMM_DRIVERS = ("virtio-pmem", "nvdimm")
# govmm: a block device's default queue size for vhost-user-fs is 1024; QEMU's limit is the same.
MAX_QUEUE_SIZE = 1024
# The kernel parameters Kata's Go runtime gives every x86_64 guest (virtcontainers/qemu_amd64.go
# kernelParams); the Rust runtime's are its own, much the same. None changes what the kernel keeps.
KATA_KERNEL_PARAMS = ("tsc=reliable", "no_timer_check", "rcupdate.rcu_expedited=1", "i8042.direct=1",
                      "i8042.dumbkbd=1", "i8042.nopnp=1", "i8042.noaux=1", "noreplace-smp", "reboot=k",
                      "cryptomgr.notests", "net.ifnames=0", "pci=lastbus=0")
# The Go runtime adds this much address space for the image's nvdimm to maxmem, image or not
# (genericMemoryTopology: "image NVDIMM device needs memory space 1024MB").
GO_NVDIMM_MAXMEM_MIB = 1024
MAX_EXTRA_ARGS = 32
MAX_WORD_CHARS = 1024


class KataConfigError(ValueError):
    """A key of the Kata configuration the probe cannot take; the message is one line naming it."""


@dataclass(frozen=True)
class KataGuest:
    """What a node's Kata configuration (`[hypervisor.qemu]`) says of the guest and its VM's devices;
    the defaults are Kata's shipped x86_64 configuration's."""

    image: str | None = None
    initrd: str | None = None
    # Go: not disable_image_nvdimm; Rust: vm_rootfs_driver is virtio-pmem (its shipped x86_64 value).
    image_on_nvdimm: bool = True
    rootfs_type: str = "ext4"
    shared_fs: str = "virtio-fs"
    virtio_fs_daemon: str | None = None
    virtio_fs_cache: str = "auto"
    virtio_fs_cache_size_mib: int = 0
    virtio_fs_queue_size: int = 1024
    virtio_fs_extra_args: tuple[str, ...] = ()
    entropy_source: str = "/dev/urandom"
    # block_device_driver virtio-scsi (both runtimes' shipped x86_64 value): a SCSI controller at boot.
    scsi_controller: bool = True
    memory_slots: int = 10
    # 0: the host's memory, as both runtimes read it.
    default_maxmemory_mib: int = 0
    memory_offset_mib: int = 0
    kernel_params: tuple[str, ...] = ()

    @property
    def guest_kind(self) -> str:
        """The row's `guest` for this configuration's guest (calibrate.GUESTS)."""
        return "kata-image" if self.image else "kata-initrd" if self.initrd else "kernel-only"

    @property
    def virtio_fs(self) -> bool:
        return self.shared_fs == "virtio-fs" and self.virtio_fs_daemon is not None


def _text(section: Mapping[str, object], key: str, where: str, default: str | None = None) -> str | None:
    value = section.get(key)
    if value is None or value == "":
        return default
    if not isinstance(value, str):
        raise KataConfigError(f"{where} {key}: {value!r} is not a string")
    if len(value) > MAX_WORD_CHARS or any(ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F for c in value):
        raise KataConfigError(f"{where} {key}: {value[:60]!r} is longer than {MAX_WORD_CHARS} characters or holds a "
                              "control character")
    return value


def _choice(section: Mapping[str, object], key: str, where: str, choices: Sequence[str], default: str) -> str:
    value = _text(section, key, where, default) or default
    if value not in choices:
        raise KataConfigError(f"{where} {key}: {value!r} is not one of {', '.join(choices)}")
    return value


def _whole(section: Mapping[str, object], key: str, where: str, default: int, most: int) -> int:
    value = section.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= most:
        raise KataConfigError(f"{where} {key}: {value!r} is not a whole number from 0 to {most}")
    return value


def _flag(section: Mapping[str, object], key: str, where: str, default: bool) -> bool:
    value = section.get(key, default)
    if not isinstance(value, bool):
        raise KataConfigError(f"{where} {key}: {value!r} is not true or false")
    return value


def kata_guest(section: Mapping[str, object], runtime: Runtime, where: str) -> KataGuest:
    """The guest and devices of a `[hypervisor.qemu]` section, each key held to what Kata takes; a key
    left out is the shipped configuration's value. `where` names the section in messages."""
    image, initrd = _text(section, "image", where), _text(section, "initrd", where)
    if image and initrd:
        # Kata itself refuses this (katautils: "having both an image and an initrd defined in the
        # configuration file is not supported").
        raise KataConfigError(f"{where}: both image and initrd are set; Kata boots one of them")
    if runtime is Runtime.RUST:
        driver = _text(section, "vm_rootfs_driver", where, "virtio-pmem") or "virtio-pmem"
        on_nvdimm = driver in RUST_NVDIMM_DRIVERS
    else:
        on_nvdimm = not _flag(section, "disable_image_nvdimm", where, False)
    extra = section.get("virtio_fs_extra_args", [])
    if not isinstance(extra, list) or len(extra) > MAX_EXTRA_ARGS or not all(
            isinstance(a, str) and a and len(a) <= MAX_WORD_CHARS and a.isprintable() for a in extra):
        raise KataConfigError(f"{where} virtio_fs_extra_args: not a list of at most {MAX_EXTRA_ARGS} printable "
                              "arguments")
    kernel_params = _text(section, "kernel_params", where) or ""
    if not (kernel_params.isascii() and kernel_params.isprintable()):
        raise KataConfigError(f"{where} kernel_params: {kernel_params[:60]!r} is not printable ASCII (a kernel command "
                              "line is)")
    queue = _whole(section, "virtio_fs_queue_size", where, 1024, MAX_QUEUE_SIZE)
    if queue & (queue - 1):
        raise KataConfigError(f"{where} virtio_fs_queue_size: {queue} is not a power of two (QEMU's vhost-user-fs "
                              "takes none other)")
    block_driver = _text(section, "block_device_driver", where, "virtio-scsi")
    return KataGuest(
        image=image, initrd=initrd, image_on_nvdimm=on_nvdimm,
        rootfs_type=_choice(section, "rootfs_type", where, ROOTFS_TYPES, "ext4"),
        shared_fs=_choice(section, "shared_fs", where, SHARED_FS, "virtio-fs"),
        virtio_fs_daemon=_text(section, "virtio_fs_daemon", where),
        virtio_fs_cache=_choice(section, "virtio_fs_cache", where, VIRTIO_FS_CACHE, "auto"),
        virtio_fs_cache_size_mib=_whole(section, "virtio_fs_cache_size", where, 0, 1 << 20),
        virtio_fs_queue_size=queue or 1024,
        virtio_fs_extra_args=tuple(extra),
        entropy_source=_text(section, "entropy_source", where, "/dev/urandom") or "/dev/urandom",
        scsi_controller=block_driver == "virtio-scsi" and not _flag(section, "disable_block_device_use", where, False),
        memory_slots=_whole(section, "memory_slots", where, 10, 255),
        default_maxmemory_mib=_whole(section, "default_maxmemory", where, 0, 1 << 32),
        memory_offset_mib=_whole(section, "memory_offset", where, 0, 1 << 32),
        kernel_params=tuple(kernel_params.split()),
    )


# --- the VM's devices and memory, as QEMU arguments -----------------------------------------------------


@dataclass(frozen=True)
class GuestBoot:
    """One VM's Kata parts, resolved on the host that boots it: the image's size (an nvdimm's backend is
    the file's size), the virtio-fs daemon's socket, a vsock guest CID when the host has vhost-vsock
    (Kata needs it; None: the host has none and the VM goes without), and the host's memory (maxmem)."""

    kata: KataGuest
    runtime: Runtime
    host_memory_mib: int
    image_bytes: int | None = None
    virtio_fs_socket: str | None = None
    vsock_cid: int | None = None

    @property
    def nvdimm(self) -> bool:
        return self.kata.image is not None and self.kata.image_on_nvdimm

    @property
    def maxmem_mib(self) -> int | None:
        """maxmem of `-m` (with `slots`), or None where the runtime leaves the hotplug region out. Go
        (genericMemoryTopology): default_maxmemory (0 or more than the host: the host's) + memory_offset +
        1024 for the nvdimm. Rust (cmdline_generator.rs Memory): default_maxmemory likewise, dropped with a
        shared file system unless the image is on an nvdimm (add_file_memory_backend)."""
        if self.kata.memory_slots == 0:
            return None
        most = self.kata.default_maxmemory_mib
        if most == 0 or most > self.host_memory_mib:
            most = self.host_memory_mib
        if self.runtime is Runtime.GO:
            return most + self.kata.memory_offset_mib + GO_NVDIMM_MAXMEM_MIB
        if self.kata.shared_fs != "none" and not self.kata.image_on_nvdimm:
            return None
        return most

    @property
    def devices(self) -> tuple[str, ...]:
        """The row's devices besides the consoles, in the grammar's words (calibrate.DEVICES)."""
        found = []
        if self.kata.image is not None:
            found.append("nvdimm" if self.nvdimm else "virtio-blk")
        if self.kata.scsi_controller:
            found.append("virtio-scsi")
        if self.vsock_cid is not None:
            found.append("vsock")
        found.append("rng")
        if self.virtio_fs_socket is not None:
            found.append("virtio-fs")
        return tuple(found)


def qemu_option_value(text: str) -> str:
    """`text` as one value of QEMU's option grammar (`-object`, `-chardev`, `-device`, `-drive`:
    key=value pairs split at commas): a comma doubled is a comma in the value (QEMU's
    docs/system/invocation: "to use a comma in a value, double it"), so a path such as
    `shm,share=off` stays a path and never becomes an option of its own."""
    return text.replace(",", ",,")


def machine_options(boot: GuestBoot | None) -> str:
    return "q35,nvdimm=on" if boot is not None and boot.nvdimm else "q35"


def memory_option(memory_mib: int, boot: GuestBoot | None) -> str:
    """`-m`: the VM's memory, and Kata's memory hotplug region (slots, maxmem) where its runtime has one.
    With it the guest sees hotpluggable memory above 4 GiB and sets up a 64 MiB swiotlb bounce buffer
    (docs/probe.md): a part of what Kata's guest kernel keeps."""
    maxmem = boot.maxmem_mib if boot is not None else None
    if maxmem is None or boot is None:
        return f"{memory_mib}M"
    return f"{memory_mib}M,slots={boot.kata.memory_slots},maxmem={max(maxmem, memory_mib)}M"


def device_arguments(boot: GuestBoot) -> list[str]:
    """The devices Kata's QEMU command line gives the VM besides memory and consoles (govmm's Object,
    BlockDevice, VSOCKDevice, RngDevice, VhostUserDevice; runtime-rs's DeviceNvdimm, DeviceVirtioBlk,
    VhostVsock, DeviceRng, DeviceVhostUserFs)."""
    kata, value = boot.kata, qemu_option_value
    arguments: list[str] = []
    if kata.image is not None:
        if boot.nvdimm:
            arguments += ["-object", f"memory-backend-file,id=mem0,mem-path={value(kata.image)},size={boot.image_bytes},"
                          "readonly=on", "-device", "nvdimm,id=nv0,memdev=mem0,unarmed=on"]
        else:
            arguments += ["-device", "virtio-blk-pci,drive=image-0,config-wce=off,share-rw=on,serial=image-0",
                          "-drive", f"id=image-0,file={value(kata.image)},aio=threads,format=raw,if=none,readonly=on"]
    if kata.scsi_controller:
        arguments += ["-device", "virtio-scsi-pci,id=scsi0"]
    if boot.vsock_cid is not None:
        arguments += ["-device", f"vhost-vsock-pci,id=vsock-{boot.vsock_cid},guest-cid={boot.vsock_cid}"]
    arguments += ["-object", f"rng-random,id=rng0,filename={value(kata.entropy_source)}",
                  "-device", "virtio-rng-pci,rng=rng0"]
    if boot.virtio_fs_socket is not None:
        cache = f",cache-size={kata.virtio_fs_cache_size_mib}M" if kata.virtio_fs_cache_size_mib else ""
        arguments += ["-chardev", f"socket,id=char-virtiofs,path={value(boot.virtio_fs_socket)}",
                      "-device", f"vhost-user-fs-pci,chardev=char-virtiofs,tag={VIRTIO_FS_TAG},"
                      f"queue-size={kata.virtio_fs_queue_size}{cache}"]
    return arguments


def root_params(kata: KataGuest) -> tuple[str, ...]:
    """The kernel parameters Kata gives an image's root (Go: GetKernelRootParams; Rust:
    new_rootfs_kernel_params), DAX on an nvdimm."""
    if kata.image is None:
        return ()
    device = "/dev/pmem0p1" if kata.image_on_nvdimm else "/dev/vda1"
    flags = {"ext4": "data=ordered,errors=remount-ro"}.get(kata.rootfs_type, "")
    if kata.image_on_nvdimm:
        flags = "dax," + flags if flags else "dax"
    return (f"root={device}", *((f"rootflags={flags}",) if flags else ()), "ro", f"rootfstype={kata.rootfs_type}")


def guest_params(boot: GuestBoot | None) -> tuple[str, ...]:
    """What the kernel command line holds for Kata's guest before the probe's own words: Kata's
    parameters, the image's root, the configuration's kernel_params, and the init's: start the agent
    (a Kata guest), mount the share (virtio-fs)."""
    if boot is None:
        return ()
    kata = boot.kata
    words = [*KATA_KERNEL_PARAMS, *root_params(kata), *kata.kernel_params]
    if kata.image is not None or kata.initrd is not None:
        words.append(f"ksp.agent={KATA_AGENT_PATH}")
    if boot.virtio_fs_socket is not None:
        words.append(f"ksp.share={VIRTIO_FS_TAG}")
    return tuple(words)


def virtiofsd_command(kata: KataGuest, socket: str, shared_dir: str) -> list[str]:
    """The virtio-fs daemon as Kata's Rust runtime starts it (share_virtio_fs_standalone.rs: --socket-path,
    --shared-dir, --cache, then virtio_fs_extra_args); the Go runtime passes the same with the socket as a
    file descriptor and --syslog."""
    assert kata.virtio_fs_daemon is not None
    return [kata.virtio_fs_daemon, "--socket-path", socket, "--shared-dir", shared_dir, "--cache",
            kata.virtio_fs_cache, *kata.virtio_fs_extra_args]


# --- the initramfs ---------------------------------------------------------------------------------------

# Where the init finds the modules (operator/probe-init/guest.go), and the files of the share
# (mountShare): a top-level directory of its own, so nothing of Kata's initrd is replaced (a /lib that is
# a symlink to usr/lib would be, by a directory of the same name: the kernel unpacks later entries over
# earlier ones).
MODULES_DIR = "kata-sizing/modules"
SHARE_WORKLOAD = "kata-sizing-workload"
SHARE_DATA = "kata-sizing-data"
# The modules a guest kernel that builds them as modules needs for Kata's devices (Kata's guest kernel
# builds them in): virtio over PCI, the console, the disks an image is attached as, the SCSI controller,
# rng, vsock, virtio-fs, and an nvdimm's ACPI NFIT and pmem driver. Their dependencies come with them.
WANTED_MODULES = ("virtio_pci", "virtio_console", "virtio_blk", "virtio_scsi", "virtio_rng", "virtiofs",
                  "vmw_vsock_virtio_transport", "nfit", "nd_pmem")


class ModuleError(ValueError):
    """A kernel module file that is not one; the message is one line naming it."""


def _cpio_entry(name: str, mode: int, data: bytes, inode: int) -> bytes:
    encoded = name.encode() + b"\0"
    fields = (inode, mode, 0, 0, 1, 0, len(data), 0, 0, 0, 0, len(encoded), 0)
    header = b"070701" + b"".join(f"{value:08x}".encode() for value in fields)
    entry = header + encoded
    entry += b"\0" * (-len(entry) % 4)
    return entry + data + b"\0" * (-len(data) % 4)


def cpio_archive(entries: Iterable[tuple[str, int, bytes]]) -> bytes:
    """A newc cpio archive (the format the kernel unpacks as its initramfs) of (name, mode, data)."""
    return b"".join([*(_cpio_entry(name, mode, data, inode) for inode, (name, mode, data) in
                       enumerate(entries, start=1)), _cpio_entry("TRAILER!!!", 0, b"", 0)])


def initramfs(init: bytes, modules: Sequence[tuple[str, bytes]] = (), base: bytes | None = None) -> bytes:
    """The probe's initramfs: its init as /init, the mount points it uses and the kernel modules it
    loads (in this order). With `base` (Kata's initrd) it comes after it: the kernel unpacks
    concatenated archives, compressed or not, in order, a later file over an earlier one, so /init is
    the probe's and the rest (the agent) is Kata's. The base is padded to 4 bytes, where a newc header
    must start."""
    if init[:4] != b"\x7fELF":
        raise ModuleError("the probe's init is not an ELF executable")
    ours = cpio_archive([
        ("dev", 0o40755, b""), ("proc", 0o40755, b""), ("sys", 0o40755, b""),
        ("kata-sizing", 0o40755, b""), (MODULES_DIR, 0o40755, b""),
        *((f"{MODULES_DIR}/{number:02d}-{name}.ko", 0o100644, data)
          for number, (name, data) in enumerate(modules)),
        ("init", 0o100755, init),
    ])
    if base is None:
        return ours
    return base + b"\0" * (-len(base) % 4) + ours


def modinfo(module: bytes, where: str) -> dict[str, str]:
    """The `.modinfo` section of a kernel module (an ELF relocatable file): key=value strings."""
    if module[:4] != b"\x7fELF" or module[4] != 2 or module[5] not in (1, 2):
        raise ModuleError(f"{where}: not a 64-bit ELF kernel module")
    endian = "<" if module[5] == 1 else ">"
    try:
        shoff, = struct.unpack_from(endian + "Q", module, 0x28)
        shentsize, shnum, shstrndx = struct.unpack_from(endian + "HHH", module, 0x3A)
        sections = [struct.unpack_from(endian + "IIQQQQ", module, shoff + i * shentsize) for i in range(shnum)]
        names_at = sections[shstrndx][4]
        for name_at, _, _, _, offset, size in sections:
            name = module[names_at + name_at:module.index(b"\0", names_at + name_at)]
            if name == b".modinfo":
                found: dict[str, str] = {}
                for item in module[offset:offset + size].split(b"\0"):
                    key, equals, value = item.decode("ascii", "replace").partition("=")
                    if equals:
                        found.setdefault(key, value)
                return found
    except (struct.error, IndexError, ValueError):
        raise ModuleError(f"{where}: its ELF section table cannot be read") from None
    raise ModuleError(f"{where}: no .modinfo section (not a kernel module)")


@dataclass(frozen=True)
class KernelModule:
    name: str
    depends: tuple[str, ...]
    data: bytes = field(repr=False)


def kernel_module(data: bytes, where: str) -> KernelModule:
    info = modinfo(data, where)
    name = info.get("name") or where.rsplit("/", 1)[-1].removesuffix(".ko").replace("-", "_")
    return KernelModule(name, tuple(d for d in info.get("depends", "").split(",") if d), data)


def load_order(modules: Iterable[KernelModule]) -> list[KernelModule]:
    """Each module after those it depends on (a dependency not among them is built in or loaded
    already), otherwise by name; a cycle is refused."""
    by_name = {m.name: m for m in modules}
    ordered: list[KernelModule] = []
    state: dict[str, str] = {}

    def visit(name: str, path: tuple[str, ...]) -> None:
        if state.get(name) == "done" or name not in by_name:
            return
        if state.get(name) == "visiting":
            raise ModuleError(f"the modules depend on each other in a cycle: {' -> '.join((*path, name))}")
        state[name] = "visiting"
        for dependency in sorted(by_name[name].depends):
            visit(dependency, (*path, name))
        state[name] = "done"
        ordered.append(by_name[name])

    for name in sorted(by_name):
        visit(name, ())
    return ordered


def module_closure(wanted: Iterable[str], available: Mapping[str, KernelModule]) -> list[KernelModule]:
    """The wanted modules that are in `available` (a kernel builds the others in) and everything they
    depend on, in load order."""
    found: dict[str, KernelModule] = {}
    pending = [name for name in wanted if name in available]
    while pending:
        name = pending.pop()
        if name in found or name not in available:
            continue
        found[name] = available[name]
        pending += found[name].depends
    return load_order(found.values())
