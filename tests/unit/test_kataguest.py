"""The VM Kata boots, as the probe boots it (core/kataguest.py, docs/probe.md "The VM Kata boots"): what a
node's Kata configuration says of the guest and the devices, the QEMU arguments and kernel parameters
Kata's runtimes build from it, the virtio-fs daemon's command line, the initramfs after Kata's initrd,
the guest kernel's modules in load order; and what the probe reads back (the translation cache in
smaps, the init's agent and share lines). Real boots of all of it: tests/unit/test_probe.py and
tests/vm/test_node_vms.py."""

from __future__ import annotations

import gzip
import struct

import pytest

from kata_sizing.core.kataguest import (
    GuestBoot,
    KataConfigError,
    KataGuest,
    ModuleError,
    cpio_archive,
    device_arguments,
    guest_params,
    initramfs,
    kata_guest,
    kernel_module,
    load_order,
    machine_options,
    memory_option,
    module_closure,
    root_params,
    virtiofsd_command,
)
from kata_sizing.core.model import Runtime
from kata_sizing.core.probe import parse_console, report_problem, row_kinds
from kata_sizing.core.probehost import tcg_cache_resident_bytes
from kata_sizing.core.sizing import Vm

WHERE = "c.toml: [hypervisor.qemu]"


def test_a_configuration_that_leaves_keys_out_is_kata_s_shipped_one():
    kata = kata_guest({}, Runtime.RUST, WHERE)
    assert kata == KataGuest()
    assert (kata.image_on_nvdimm, kata.shared_fs, kata.virtio_fs_cache, kata.memory_slots, kata.scsi_controller) == (
        True, "virtio-fs", "auto", 10, True)
    assert kata.guest_kind == "kernel-only" and not kata.virtio_fs  # no daemon named


@pytest.mark.parametrize("runtime, section, on_nvdimm", [
    (Runtime.GO, {}, True),
    (Runtime.GO, {"disable_image_nvdimm": True}, False),
    (Runtime.RUST, {"vm_rootfs_driver": "virtio-pmem"}, True),
    (Runtime.RUST, {"vm_rootfs_driver": "virtio-blk-pci"}, False),
    # The Rust runtime reads vm_rootfs_driver, not disable_image_nvdimm.
    (Runtime.RUST, {"disable_image_nvdimm": True}, True),
])
def test_each_runtime_puts_the_image_where_its_own_key_says(runtime, section, on_nvdimm):
    kata = kata_guest({"image": "/kata.img", **section}, runtime, WHERE)
    assert (kata.guest_kind, kata.image_on_nvdimm) == ("kata-image", on_nvdimm)


@pytest.mark.parametrize("section, message", [
    ({"image": "/i", "initrd": "/r"}, "both image and initrd are set; Kata boots one of them"),
    ({"image": 7}, "image: 7 is not a string"),
    ({"shared_fs": "nfs"}, "shared_fs: 'nfs' is not one of virtio-fs, virtio-fs-nydus, virtio-9p, none"),
    ({"virtio_fs_cache": "sometimes"}, "virtio_fs_cache: 'sometimes' is not one of auto, always, never, metadata"),
    ({"rootfs_type": "btrfs"}, "rootfs_type: 'btrfs' is not one of ext4, xfs, erofs"),
    ({"virtio_fs_queue_size": 1000}, "virtio_fs_queue_size: 1000 is not a power of two"),
    ({"virtio_fs_queue_size": 2048}, "virtio_fs_queue_size: 2048 is not a whole number from 0 to 1024"),
    ({"memory_slots": -1}, "memory_slots: -1 is not a whole number from 0 to 255"),
    ({"memory_slots": True}, "memory_slots: True is not a whole number from 0 to 255"),
    ({"disable_image_nvdimm": "yes"}, "disable_image_nvdimm: 'yes' is not true or false"),
    ({"virtio_fs_extra_args": "--thread-pool-size=1"}, "virtio_fs_extra_args: not a list of at most 32 printable"),
    ({"virtio_fs_extra_args": ["--x", "a\nb"]}, "virtio_fs_extra_args: not a list of at most 32 printable"),
    ({"kernel_params": "quiet\u2028x"}, "kernel_params: 'quiet\\u2028x' is not printable ASCII (a kernel command line is)"),
    ({"virtio_fs_daemon": "/v\x1b[2J"}, "virtio_fs_daemon: '/v\\x1b[2J' is longer than 1024 characters or holds a "
                                         "control character"),
])
def test_a_key_kata_would_not_take_is_one_line_naming_it(section, message):
    with pytest.raises(KataConfigError) as caught:
        kata_guest(section, Runtime.GO, WHERE)
    assert str(caught.value).startswith(f"{WHERE}") and message in str(caught.value)
    assert "\n" not in str(caught.value)


def test_maxmem_is_the_host_s_memory_as_each_runtime_reads_it():
    go = GuestBoot(KataGuest(), Runtime.GO, host_memory_mib=24000)
    # Go: the host's memory (default_maxmemory 0) + memory_offset + 1024 for the image's nvdimm.
    assert (go.maxmem_mib, memory_option(512, go)) == (25024, "512M,slots=10,maxmem=25024M")
    capped = GuestBoot(KataGuest(default_maxmemory_mib=4096, memory_offset_mib=100), Runtime.GO, 24000)
    assert capped.maxmem_mib == 4096 + 100 + 1024
    beyond = GuestBoot(KataGuest(default_maxmemory_mib=99999), Runtime.GO, 24000)
    assert beyond.maxmem_mib == 24000 + 1024
    # Rust: the host's memory, dropped with a shared file system unless the image is on an nvdimm.
    assert GuestBoot(KataGuest(), Runtime.RUST, 24000).maxmem_mib == 24000
    assert GuestBoot(KataGuest(image_on_nvdimm=False), Runtime.RUST, 24000).maxmem_mib is None
    assert GuestBoot(KataGuest(image_on_nvdimm=False, shared_fs="none"), Runtime.RUST, 24000).maxmem_mib == 24000
    assert GuestBoot(KataGuest(memory_slots=0), Runtime.GO, 24000).maxmem_mib is None
    # Without Kata's configuration the VM has no hotplug region (the probe's own plain VM), and maxmem is
    # never below the VM.
    assert memory_option(512, None) == "512M"
    assert memory_option(30000, go) == "30000M,slots=10,maxmem=30000M"


def test_the_devices_are_those_kata_s_qemu_command_line_has():
    kata = KataGuest(image="/opt/kata/kata,containers.img", virtio_fs_daemon="/opt/kata/libexec/virtiofsd",
                     virtio_fs_cache_size_mib=0, virtio_fs_queue_size=512)
    boot = GuestBoot(kata, Runtime.GO, 8192, image_bytes=20 * 1024 * 1024, virtio_fs_socket="/run/vm,0/vfs.sock",
                     vsock_cid=1234)
    arguments = device_arguments(boot)
    pairs = list(zip(arguments[::2], arguments[1::2], strict=True))
    assert pairs == [
        # The image as an nvdimm, read-only (govmm Object: MemoryBackendFile + NVDIMM); the comma doubled.
        ("-object", "memory-backend-file,id=mem0,mem-path=/opt/kata/kata,,containers.img,size=20971520,readonly=on"),
        ("-device", "nvdimm,id=nv0,memdev=mem0,unarmed=on"),
        ("-device", "virtio-scsi-pci,id=scsi0"),
        ("-device", "vhost-vsock-pci,id=vsock-1234,guest-cid=1234"),
        ("-object", "rng-random,id=rng0,filename=/dev/urandom"),
        ("-device", "virtio-rng-pci,rng=rng0"),
        ("-chardev", "socket,id=char-virtiofs,path=/run/vm,,0/vfs.sock"),
        ("-device", "vhost-user-fs-pci,chardev=char-virtiofs,tag=kataShared,queue-size=512"),
    ]
    assert machine_options(boot) == "q35,nvdimm=on"
    assert row_kinds(boot) == ("kata-image", "vmm+virtiofsd",
                               "serial+virtio-console+virtio-scsi+nvdimm+vsock+rng+virtio-fs")
    on_blk = GuestBoot(KataGuest(image="/kata.img", image_on_nvdimm=False, scsi_controller=False,
                                 entropy_source="/dev/random"), Runtime.GO, 8192, image_bytes=1)
    assert device_arguments(on_blk) == [
        "-device", "virtio-blk-pci,drive=image-0,config-wce=off,share-rw=on,serial=image-0",
        "-drive", "id=image-0,file=/kata.img,aio=threads,format=raw,if=none,readonly=on",
        "-object", "rng-random,id=rng0,filename=/dev/random", "-device", "virtio-rng-pci,rng=rng0"]
    assert machine_options(on_blk) == "q35" and row_kinds(on_blk)[2] == "serial+virtio-console+virtio-blk+rng"
    assert row_kinds(None) == ("kernel-only", "vmm", "serial+virtio-console")


@pytest.mark.parametrize("kata, words", [
    (KataGuest(image="/i"), ("root=/dev/pmem0p1", "rootflags=dax,data=ordered,errors=remount-ro", "ro",
                             "rootfstype=ext4")),
    (KataGuest(image="/i", image_on_nvdimm=False), ("root=/dev/vda1", "rootflags=data=ordered,errors=remount-ro",
                                                    "ro", "rootfstype=ext4")),
    (KataGuest(image="/i", rootfs_type="erofs"), ("root=/dev/pmem0p1", "rootflags=dax", "ro", "rootfstype=erofs")),
    (KataGuest(image="/i", rootfs_type="xfs", image_on_nvdimm=False), ("root=/dev/vda1", "ro", "rootfstype=xfs")),
    (KataGuest(initrd="/r"), ()),
])
def test_an_image_s_root_is_given_as_kata_gives_it(kata, words):
    assert root_params(kata) == words


def test_the_kernel_command_line_starts_the_agent_and_mounts_the_share_for_the_init():
    boot = GuestBoot(KataGuest(initrd="/r", virtio_fs_daemon="/v", kernel_params=("agent.log=debug",)), Runtime.RUST,
                     4096, virtio_fs_socket="/s")
    words = guest_params(boot)
    assert words[:2] == ("tsc=reliable", "no_timer_check")
    assert words[-3:] == ("agent.log=debug", "ksp.agent=/usr/bin/kata-agent", "ksp.share=kataShared")
    # A kernel-only guest starts no agent; without virtiofsd, nothing is mounted.
    assert "ksp.agent=/usr/bin/kata-agent" not in guest_params(GuestBoot(KataGuest(), Runtime.GO, 4096))
    assert not any(w.startswith("ksp.share") for w in guest_params(GuestBoot(KataGuest(initrd="/r"), Runtime.GO, 4096)))
    assert guest_params(None) == ()


def test_virtiofsd_starts_as_the_rust_runtime_starts_it():
    kata = KataGuest(virtio_fs_daemon="/opt/kata/libexec/virtiofsd", virtio_fs_cache="never",
                     virtio_fs_extra_args=("--thread-pool-size=1", "-o", "announce_submounts"))
    assert virtiofsd_command(kata, "/run/vfs.sock", "/run/share") == [
        "/opt/kata/libexec/virtiofsd", "--socket-path", "/run/vfs.sock", "--shared-dir", "/run/share", "--cache", "never",
        "--thread-pool-size=1", "-o", "announce_submounts"]


def read_cpio(archive: bytes) -> tuple[list[tuple[str, int, bytes]], int]:
    """(name, mode, data) of a newc archive up to its trailer, and where it ended."""
    entries: list[tuple[str, int, bytes]] = []
    offset = 0
    while True:
        header = archive[offset:offset + 110]
        assert header[:6] == b"070701", (offset, header[:6])
        mode, size, name_size = int(header[14:22], 16), int(header[54:62], 16), int(header[94:102], 16)
        name = archive[offset + 110:offset + 110 + name_size - 1].decode()
        data_at = offset + 110 + name_size + (-(110 + name_size) % 4)
        offset = data_at + size + (-size % 4)
        if name == "TRAILER!!!":
            return entries, offset
        entries.append((name, mode, archive[data_at:data_at + size]))


def test_the_probe_s_initramfs_follows_kata_s_initrd_so_its_init_wins():
    init = b"\x7fELF the probe's init"
    kata = b""
    for size in range(64):  # a length not a multiple of 4: the probe's archive still starts where a header may
        kata = gzip.compress(cpio_archive([("usr/bin/kata-agent", 0o100755, b"the agent"),
                                           ("init", 0o120777, b"/usr/bin/kata-agent"), ("pad", 0o100644, b"x" * size)]),
                             mtime=0)
        if len(kata) % 4:
            break
    assert len(kata) % 4
    whole = initramfs(init, [("virtio", b"\x7fELF a"), ("virtio_pci", b"\x7fELF b")], kata)
    assert whole.startswith(kata)
    ours_at = len(kata) + (-len(kata) % 4)
    assert whole[len(kata):ours_at] == b"\0" * (ours_at - len(kata))
    entries, end = read_cpio(whole[ours_at:])
    assert end == len(whole) - ours_at
    # Modules in the order given (the init loads them sorted by name), under a directory of the probe's own
    # (a /lib of Kata's that is a symlink is left alone); /init last, over Kata's symlink.
    assert [(name, oct(mode)) for name, mode, _ in entries] == [
        ("dev", "0o40755"), ("proc", "0o40755"), ("sys", "0o40755"), ("kata-sizing", "0o40755"),
        ("kata-sizing/modules", "0o40755"), ("kata-sizing/modules/00-virtio.ko", "0o100644"),
        ("kata-sizing/modules/01-virtio_pci.ko", "0o100644"), ("init", "0o100755")]
    assert entries[-1][2] == init
    # Kata's initrd unpacks as it was.
    assert read_cpio(gzip.decompress(kata))[0][0] == ("usr/bin/kata-agent", 0o100755, b"the agent")


def elf_module(name: str, depends: str, *, modinfo: bool = True) -> bytes:
    """A 64-bit little-endian ELF relocatable file with a .modinfo section, as a kernel module has."""
    info = f"license=GPL\0depends={depends}\0name={name}\0".encode()
    names = b"\0.modinfo\0.shstrtab\0"
    body_at = 64
    info_at, names_at = body_at, body_at + len(info)
    sections_at = names_at + len(names)
    header = b"\x7fELF" + bytes([2, 1, 1]) + b"\0" * 9 + struct.pack(
        "<HHIQQQIHHHHHH", 1, 62, 1, 0, 0, sections_at, 0, 64, 0, 0, 64, 3, 2)
    section = lambda name_at, offset, size: struct.pack("<IIQQQQIIQQ", name_at, 1, 0, 0, offset, size, 0, 0, 1, 0)  # noqa: E731
    table = section(0, 0, 0) + section(1 if modinfo else 10, info_at, len(info)) + section(10, names_at, len(names))
    return header + info + names + table


def test_modules_load_after_what_they_depend_on():
    modules = {name: kernel_module(elf_module(name, depends), f"/m/{name}.ko") for name, depends in [
        ("virtio_pci", "virtio_ring,virtio_pci_modern_dev,virtio"), ("virtio", "virtio_ring"), ("virtio_ring", ""),
        ("virtio_pci_modern_dev", ""), ("virtiofs", "fuse,virtio,virtio_ring"), ("fuse", ""), ("nd_pmem", "libnvdimm")]}
    assert modules["virtio_pci"].depends == ("virtio_ring", "virtio_pci_modern_dev", "virtio")
    order = [m.name for m in load_order(modules.values())]
    assert order.index("virtio_ring") < order.index("virtio") < order.index("virtio_pci")
    assert order.index("fuse") < order.index("virtiofs")
    # A dependency that is not there (libnvdimm) is the kernel's own; only what is wanted comes, with its
    # dependencies.
    assert [m.name for m in module_closure(["virtiofs", "not-a-module"], modules)] == [
        "fuse", "virtio_ring", "virtio", "virtiofs"]
    cycle = [kernel_module(elf_module("a", "b"), "a.ko"), kernel_module(elf_module("b", "a"), "b.ko")]
    with pytest.raises(ModuleError, match="the modules depend on each other in a cycle: a -> b -> a"):
        load_order(cycle)


@pytest.mark.parametrize("data, message", [
    (b"#!/bin/sh\n", "/m/x.ko: not a 64-bit ELF kernel module"),
    (elf_module("x", "", modinfo=False), "/m/x.ko: no .modinfo section (not a kernel module)"),
    (elf_module("x", "")[:80], "/m/x.ko: its ELF section table cannot be read"),
])
def test_a_file_that_is_not_a_kernel_module_is_one_line(data, message):
    with pytest.raises(ModuleError) as caught:
        kernel_module(data, "/m/x.ko")
    assert str(caught.value) == message


SMAPS = """\
5612a6c65000-5612a71fc000 r-xp 00000000 fe:00 1234 /usr/bin/qemu-system-x86_64
Size:               5724 kB
Rss:                5300 kB
7f2023fff000-7f2043fff000 rw-s 00000000 00:19 99 /dev/shm/qemu_back_mem.mem.gzNZni (deleted)
Size:             524288 kB
Rss:              307496 kB
7f2044000000-7f20443ff000 rwxp 00000000 00:00 0
Size:               4092 kB
Rss:                4092 kB
7f20443ff000-7f2044400000 ---p 00000000 00:00 0
Size:                  4 kB
Rss:                   0 kB
7f2044400000-7f20447ff000 rwxp 00000000 00:00 0
Size:               4092 kB
Rss:                2048 kB
7f2048021000-7f204c000000 rw-p 00000000 00:00 0
Size:              65404 kB
Rss:               1000 kB
"""


def test_the_translation_cache_is_the_vmm_s_anonymous_writable_executable_memory():
    assert tcg_cache_resident_bytes(SMAPS) == (4092 + 2048) * 1024
    # QEMU keeping the writable and executable views apart (split-wx): the executable view of its memfd.
    split = ("7f2044000000-7f2048000000 r-xs 00000000 00:01 5 /memfd:tcg-jit (deleted)\nRss: 3000 kB\n"
             "7f2050000000-7f2054000000 rw-s 00000000 00:01 5 /memfd:tcg-jit (deleted)\nRss: 3000 kB\n")
    assert tcg_cache_resident_bytes(split) == 3000 * 1024
    # Under KVM there is none: nothing to take off.
    assert tcg_cache_resident_bytes(SMAPS.replace("rwxp", "rw-p")) is None
    assert tcg_cache_resident_bytes("") is None


CONSOLE = """\
KSP hello version=1
KSP note module nfit.ko did not load: no such device
KSP hello version=1
KSP agent path=/usr/bin/kata-agent rss_kib=26904 settled=yes
KSP agent-said kata-sizing stand-in agent: holding 24 MiB
KSP meminfo stage=boot MemTotal=414748 MemFree=353336 MemAvailable=354104 Buffers=0 Cached=3920 SReclaimable=9224
KSP workload target=0 step=4
KSP share read=16777216
KSP done held=340 outcome=killed
"""


def test_the_init_says_its_agent_ran_and_its_workload_read_through_the_share():
    report = parse_console(CONSOLE)
    assert (report.agent_rss_kib, report.agent_settled, report.agent_said, report.share_read_bytes) == (
        26904, True, "kata-sizing stand-in agent: holding 24 MiB", 16 * 1024 * 1024)
    assert report.notes == ("module nfit.ko did not load: no such device",)
    boot = GuestBoot(KataGuest(initrd="/r", virtio_fs_daemon="/v"), Runtime.RUST, 4096, virtio_fs_socket="/s")
    assert report_problem(report, Vm(1, 512), boot) is None


@pytest.mark.parametrize("edit, problem", [
    (lambda text: text.replace("KSP agent path", "KSP nothing"),
     "the guest did not report its Kata agent running: its memory would not be in the row's used"),
    (lambda text: text.replace("KSP share read=16777216\n", ""),
     "the guest's workload did not report reading through the virtio-fs share"),
    (lambda text: text.replace("rss_kib=26904", "rss_kib=999999"),
     "the guest reported its agent holding 999999 kB, more than its MemTotal 414748 kB"),
    (lambda text: text.replace("settled=yes", "settled=maybe"),
     "the guest's report is malformed: agent settled='maybe' is not yes or no"),
    (lambda text: text.replace("read=16777216", "read=1e6"),
     "the guest's report is malformed: share read='1e6' is not a whole number"),
])
def test_a_kata_guest_s_report_without_its_agent_or_share_gives_no_row(edit, problem):
    boot = GuestBoot(KataGuest(initrd="/r", virtio_fs_daemon="/v"), Runtime.RUST, 4096, virtio_fs_socket="/s")
    assert report_problem(parse_console(edit(CONSOLE)), Vm(1, 512), boot).startswith(problem)
