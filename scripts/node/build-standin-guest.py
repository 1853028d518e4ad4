#!/usr/bin/env python3
"""Write a stand-in for Kata's guest, laid out as Kata's osbuilder lays out its own, with the project's
stand-in agent in it: no registry serves Kata's agent where the project is tested (docs/probe.md).

- `kata-containers-initrd.img`: a gzip-compressed newc cpio as osbuilder's initrd_builder.sh writes it,
  the agent at /usr/bin/kata-agent and /init -> /sbin/init -> the agent (an initrd built with AGENT_INIT).
- `kata-containers.img`: a raw disk as osbuilder's image_builder.sh writes it: MBR #1 (a partition from
  3 MiB), the DAX metadata at 4 KiB (struct nd_pfn_sb, which the guest's nvdimm driver reads to map the
  image in fsdax mode: osbuilder's nsdax.gpl.c), MBR #2 at 2 MiB (a partition from 1 MiB past it) and
  an ext4 root at 3 MiB, the whole a multiple of 2 MiB (the DAX alignment); mkfs.ext4 -d fills the root
  from a directory, no mount and no root needed.

The agent is operator/probe-init's binary, which named kata-agent holds a stated amount of memory and
waits (operator/probe-init/standin.go).

    build-standin-guest.py --agent .tools/probe-init --out .tools/vm/standin
"""

from __future__ import annotations

import argparse
import gzip
import shutil
import struct
import subprocess
import sys
import tempfile
from pathlib import Path

from kata_sizing.core.kataguest import KATA_AGENT_PATH, cpio_archive

MIB = 1024 * 1024
# image_builder.sh: the DAX header's size and alignment, and where the root partition starts.
DAX_HEADER_MIB = 2
DAX_ALIGNMENT_MIB = 2
ROOTFS_START_MIB = 1
# nsdax.gpl.c (from the kernel's drivers/nvdimm/pfn.h): the info block's signature and PFN_MODE_RAM
# (the page structures in the guest's RAM), at 4 KiB into the namespace.
PFN_SIGNATURE = b"NVDIMM_PFN_INFO\0"
PFN_MODE_RAM = 1
PFN_INFO_OFFSET = 4096
# The root filesystem: the agent (about 2 MB) and room; 16 MiB rounds the image to 20 MiB.
ROOTFS_MIB = 16
DIRECTORIES = ("dev", "proc", "sys", "run", "tmp", "etc", "sbin", "usr", "usr/bin")


def mbr(start_sector: int, sectors: int) -> bytes:
    """A DOS partition table with one primary Linux partition (parted's mklabel msdos, mkpart primary)."""
    entry = struct.pack("<B3sB3sII", 0, b"\0\0\0", 0x83, b"\0\0\0", start_sector, sectors)
    return b"\0" * 446 + entry + b"\0" * 48 + b"\x55\xaa"


def fletcher64(data: bytes) -> int:
    """The kernel's nd_fletcher64 over little-endian 32-bit words."""
    low = high = 0
    for (word,) in struct.iter_unpack("<I", data):
        low = (low + word) & 0xFFFFFFFF
        high = (high + low) & 0xFFFFFFFFFFFFFFFF
    return ((high << 32) | low) & 0xFFFFFFFFFFFFFFFF


def pfn_info(data_offset: int, alignment: int) -> bytes:
    """struct nd_pfn_sb as nsdax.gpl.c fills it: version 0.2, the data offset and alignment, PFN_MODE_RAM."""
    block = (PFN_SIGNATURE + b"\0" * 32 + struct.pack("<IHHQQIIII", 0, 0, 2, data_offset, 0, PFN_MODE_RAM, 0, 0,
                                                      alignment) + b"\0" * 4000)
    return block + struct.pack("<Q", fletcher64(block + b"\0" * 8))


def rootfs(agent: bytes, directory: Path) -> None:
    for name in DIRECTORIES:
        (directory / name).mkdir(parents=True, exist_ok=True)
    target = directory / KATA_AGENT_PATH.lstrip("/")
    target.write_bytes(agent)
    target.chmod(0o755)
    (directory / "sbin" / "init").symlink_to(KATA_AGENT_PATH)


def image(agent: bytes) -> bytes:
    with tempfile.TemporaryDirectory() as scratch:
        root, filesystem = Path(scratch) / "root", Path(scratch) / "rootfs.ext4"
        rootfs(agent, root)
        subprocess.run(["mkfs.ext4", "-q", "-F", "-b", "4096", "-d", str(root), str(filesystem), f"{ROOTFS_MIB}M"],
                       check=True, stdout=subprocess.DEVNULL)
        ext4 = filesystem.read_bytes()
    inner = mbr(ROOTFS_START_MIB * MIB // 512, len(ext4) // 512) + b"\0" * (ROOTFS_START_MIB * MIB - 512) + ext4
    start = (ROOTFS_START_MIB + DAX_HEADER_MIB) * MIB
    header = mbr(start // 512, (DAX_HEADER_MIB * MIB + len(inner) - start) // 512)
    header += b"\0" * (PFN_INFO_OFFSET - len(header)) + pfn_info(DAX_HEADER_MIB * MIB, DAX_ALIGNMENT_MIB * MIB)
    whole = header + b"\0" * (DAX_HEADER_MIB * MIB - len(header)) + inner
    return whole + b"\0" * (-len(whole) % (DAX_ALIGNMENT_MIB * MIB))


def initrd(agent: bytes) -> bytes:
    agent_path = KATA_AGENT_PATH.lstrip("/")
    return gzip.compress(cpio_archive([
        *((name, 0o40755, b"") for name in DIRECTORIES),
        (agent_path, 0o100755, agent),
        ("sbin/init", 0o120777, KATA_AGENT_PATH.encode()),
        ("init", 0o120777, b"/sbin/init"),
    ]), mtime=0)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--agent", type=Path, required=True, help="the stand-in agent (operator/probe-init's binary)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    if shutil.which("mkfs.ext4") is None:
        raise SystemExit("mkfs.ext4 not found (Debian's e2fsprogs): no stand-in image")
    agent = args.agent.read_bytes()
    args.out.mkdir(parents=True, exist_ok=True)
    for name, content in (("kata-containers-initrd.img", initrd(agent)), ("kata-containers.img", image(agent))):
        partial = args.out / f"{name}.partial"
        partial.write_bytes(content)
        partial.rename(args.out / name)
        print(f"stand-in Kata guest: {args.out / name} ({len(content) // 1024} KiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
