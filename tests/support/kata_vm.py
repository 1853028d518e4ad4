"""What `make node` builds to boot Kata's VM on this host (the probe's real VMs, the VM tests, the probe
bench): Debian's QEMU and cloud kernel with its modules, the probe's init, the stand-in Kata initrd and
image (scripts/node/build-standin-guest.py) and Kata's virtiofsd; and a Kata-shaped configuration naming
them, as kata-deploy's names its own (docs/probe.md, "The VM Kata boots")."""

from __future__ import annotations

import json
from pathlib import Path

from tests.support.paths import ROOT

TOOLS = ROOT / ".tools"
QEMU = Path("/usr/bin/qemu-system-x86_64")
KERNEL = TOOLS / "vm" / "vmlinuz"
INIT = TOOLS / "probe-init"
MODULES = TOOLS / "vm" / "modules"
STANDIN_INITRD = TOOLS / "vm" / "standin" / "kata-containers-initrd.img"
STANDIN_IMAGE = TOOLS / "vm" / "standin" / "kata-containers.img"
VIRTIOFSD = TOOLS / "virtiofsd"
# Kata's virtio-fs daemon arguments beyond the socket, directory and cache: the Rust runtime's shipped
# virtio_fs_extra_args (src/runtime-rs/Makefile DEFVIRTIOFSEXTRAARGS).
VIRTIOFSD_EXTRA = ("--thread-pool-size=1", "-o", "announce_submounts")


def missing() -> list[Path]:
    """What of it is not built here (`make node` builds it where QEMU installs and cargo runs)."""
    return [p for p in (QEMU, KERNEL, INIT, MODULES, STANDIN_INITRD, STANDIN_IMAGE, VIRTIOFSD) if not p.exists()]


def kata_configuration(path: Path, *, image: bool = False) -> Path:
    """A `[hypervisor.qemu]` section naming this host's QEMU and kernel, the stand-in initrd (or its image, on
    an nvdimm as the Rust runtime's shipped vm_rootfs_driver puts it) and virtiofsd."""
    guest = f'image = "{STANDIN_IMAGE}"\nvm_rootfs_driver = "virtio-pmem"\n' if image else f'initrd = "{STANDIN_INITRD}"\n'
    path.write_text(f'[hypervisor.qemu]\npath = "{QEMU}"\nkernel = "{KERNEL}"\n{guest}virtio_fs_daemon = "{VIRTIOFSD}"\n'
                    f'virtio_fs_extra_args = {json.dumps(list(VIRTIOFSD_EXTRA))}\n')
    return path
