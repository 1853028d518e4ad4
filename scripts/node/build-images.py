#!/usr/bin/env python3
"""Write the node tests' two container images as OCI archives, without any image tool.

- `kata-sizing.test/pause:1`: the pod sandbox image containerd starts first in every pod
  (`podtool pause`: sleeps, reaps orphans, exits on SIGTERM);
- `kata-sizing.test/tools:1`: podtool (hold N MiB, the in-cluster API client) and Debian's
  busybox-static (sh, sleep, cat, ...), entry point `sh`;
- with --vm-qemu, --vm-kernel and --vm-init, `kata-sizing.test/vm:1`: the tools image plus QEMU
  (the binary, its accelerator modules, the libraries `ldd` names, its firmware directories), a guest kernel at
  /vm/vmlinuz and the probe's initramfs at /vm/initrd (its init, operator/probe-init, and the kernel
  modules of --vm-modules, after the stand-in Kata initrd of --vm-kata-initrd), the virtio-fs daemon of
  --vm-virtiofsd at /usr/libexec/virtiofsd (with its libraries) and the workload's binary at
  /vm/workload: a pod of it runs a VM as Kata's runtime would, virtiofsd beside it
  (tests/vm/test_node_vms.py). Written with the project's venv Python, which has kata_sizing (the
  initramfs is core/kataguest.py's).

No image can be pulled on the test machines, so the node imports these into containerd
(`ctr -n k8s.io images import`). Each archive is an OCI image layout in a tar (oci-layout,
index.json, blobs/sha256/...) with uncompressed layers; every timestamp and owner is fixed,
so the same inputs give the same digests.

    build-images.py --podtool .tools/podtool --busybox /bin/busybox --out .tools/node-images
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import platform
import struct
import subprocess
import sys
import tarfile
from pathlib import Path

PAUSE_IMAGE = "kata-sizing.test/pause:1"
TOOLS_IMAGE = "kata-sizing.test/tools:1"
VM_IMAGE = "kata-sizing.test/vm:1"
QEMU_DATA = (Path("/usr/share/qemu"), Path("/usr/share/seabios"))
# Where the VM image carries virtiofsd (as Kata's packages put it under their libexec).
VIRTIOFSD_PATH = "/usr/libexec/virtiofsd"
# Debian builds QEMU's accelerators (TCG among them) as modules it loads at start.
QEMU_MODULES = Path("/usr/lib/x86_64-linux-gnu/qemu")
ARCHITECTURES = {"x86_64": "amd64", "aarch64": "arm64"}

MANIFEST_TYPE = "application/vnd.oci.image.manifest.v1+json"
CONFIG_TYPE = "application/vnd.oci.image.config.v1+json"
LAYER_TYPE = "application/vnd.oci.image.layer.v1.tar"


def is_static(binary: Path) -> bool:
    """An ELF file without a PT_INTERP program header needs no loader or libraries."""
    data = binary.read_bytes()
    if data[:4] != b"\x7fELF" or data[4] != 2:  # 64-bit ELF only (the architectures above)
        raise SystemExit(f"{binary}: not a 64-bit ELF executable")
    endian = "<" if data[5] == 1 else ">"
    phoff, = struct.unpack_from(endian + "Q", data, 0x20)
    phentsize, phnum = struct.unpack_from(endian + "HH", data, 0x36)
    return all(struct.unpack_from(endian + "I", data, phoff + i * phentsize)[0] != 3 for i in range(phnum))


def layer(entries: list[tuple[str, bytes | str | None, int]]) -> bytes:
    """A tar of (path, content, mode): bytes is a file, str a symlink target, None a directory."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path, content, mode in sorted(entries):
            info = tarfile.TarInfo(path)
            info.mode, info.mtime, info.uid, info.gid, info.uname, info.gname = mode, 0, 0, 0, "", ""
            if content is None:
                info.type = tarfile.DIRTYPE
                tar.addfile(info)
            elif isinstance(content, str):
                info.type, info.linkname = tarfile.SYMTYPE, content
                tar.addfile(info)
            else:
                info.size = len(content)
                tar.addfile(info, io.BytesIO(content))
    return buffer.getvalue()


def digest(blob: bytes) -> str:
    return "sha256:" + hashlib.sha256(blob).hexdigest()


def write_archive(path: Path, name: str, layers: list[bytes], image_config: dict, architecture: str) -> str:
    config = json.dumps({
        "architecture": architecture, "os": "linux", "config": image_config,
        "rootfs": {"type": "layers", "diff_ids": [digest(blob) for blob in layers]},
    }, sort_keys=True).encode()
    manifest = json.dumps({
        "schemaVersion": 2, "mediaType": MANIFEST_TYPE,
        "config": {"mediaType": CONFIG_TYPE, "digest": digest(config), "size": len(config)},
        "layers": [{"mediaType": LAYER_TYPE, "digest": digest(blob), "size": len(blob)} for blob in layers],
    }, sort_keys=True).encode()
    index = json.dumps({"schemaVersion": 2, "manifests": [{
        "mediaType": MANIFEST_TYPE, "digest": digest(manifest), "size": len(manifest),
        "platform": {"architecture": architecture, "os": "linux"},
        # containerd names the imported image from the first; the OCI spec's tag is the second.
        "annotations": {"io.containerd.image.name": name,
                        "org.opencontainers.image.ref.name": name.rsplit(":", 1)[1]},
    }]}, sort_keys=True).encode()
    blobs = {digest(blob): blob for blob in [*layers, config, manifest]}
    entries: list[tuple[str, bytes | str | None, int]] = [
        ("blobs", None, 0o755), ("blobs/sha256", None, 0o755),
        ("oci-layout", b'{"imageLayoutVersion":"1.0.0"}', 0o644), ("index.json", index, 0o644),
        *((f"blobs/sha256/{d.split(':', 1)[1]}", blob, 0o644) for d, blob in blobs.items()),
    ]
    path.write_bytes(layer(entries))
    return digest(manifest)


def shared_libraries(binary: Path) -> list[Path]:
    """The libraries and loader `ldd` says `binary` loads, as the paths it loads them from."""
    found = []
    for line in subprocess.run(["ldd", str(binary)], capture_output=True, text=True, check=True).stdout.splitlines():
        words = line.split()
        path = words[2] if len(words) >= 3 and words[1] == "=>" else words[0]
        if path.startswith("/"):
            found.append(Path(path))
    return found


def tree(root: Path) -> list[tuple[str, bytes | str | None, int]]:
    """Every directory and file under `root`, files dereferenced (Debian links QEMU's firmware
    between its packages' directories)."""
    entries: list[tuple[str, bytes | str | None, int]] = [(str(root).lstrip("/"), None, 0o755)]
    for path in sorted(root.rglob("*")):
        if path.is_dir():
            entries.append((str(path).lstrip("/"), None, 0o755))
        elif path.is_file():
            entries.append((str(path).lstrip("/"), path.read_bytes(), 0o644))
    return entries


def parents(paths: list[str]) -> list[tuple[str, None, int]]:
    found = {str(Path(p).parent) for p in paths}
    dirs = set()
    for directory in found:
        while directory not in ("", "."):
            dirs.add(directory)
            directory = str(Path(directory).parent)
    return [(d, None, 0o755) for d in sorted(dirs)]


def vm_layer(qemu: Path, kernel: Path, init: Path, guest_modules: Path | None, kata_initrd: Path | None,
             virtiofsd: Path | None) -> bytes:
    from kata_sizing.core.kataguest import initramfs, kernel_module, load_order

    files: list[tuple[str, bytes | str | None, int]] = [("usr/bin/qemu-system-x86_64", qemu.read_bytes(), 0o755)]
    modules = sorted(QEMU_MODULES.glob("accel-*.so")) if QEMU_MODULES.is_dir() else []
    binaries = [qemu, *modules, *([virtiofsd] if virtiofsd else [])]
    libraries = dict.fromkeys(lib for binary in binaries for lib in shared_libraries(binary))
    files += [(str(lib).lstrip("/"), lib.resolve().read_bytes(), 0o755) for lib in [*libraries, *modules]]
    if virtiofsd:
        files.append((VIRTIOFSD_PATH.lstrip("/"), virtiofsd.read_bytes(), 0o755))
    for directory in QEMU_DATA:
        if directory.is_dir():
            files += tree(directory)
    kernel_modules = load_order(kernel_module(path.read_bytes(), str(path))
                                for path in sorted(guest_modules.glob("*.ko"))) if guest_modules else []
    guest = initramfs(init.read_bytes(), [(m.name, m.data) for m in kernel_modules],
                      kata_initrd.read_bytes() if kata_initrd else None)
    files += [("vm/vmlinuz", kernel.read_bytes(), 0o644), ("vm/initrd", guest, 0o644),
              ("vm/workload", init.read_bytes(), 0o755)]
    names = {name for name, _, _ in files}
    return layer([*[d for d in parents([n for n, c, _ in files if c is not None]) if d[0] not in names], *files])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--podtool", type=Path, required=True)
    parser.add_argument("--busybox", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--vm-qemu", type=Path, help="with --vm-kernel and --vm-init: also the VM image")
    parser.add_argument("--vm-kernel", type=Path)
    parser.add_argument("--vm-init", type=Path)
    parser.add_argument("--vm-modules", type=Path, help="the guest kernel's modules (*.ko) for the VM image's initramfs")
    parser.add_argument("--vm-kata-initrd", type=Path, help="the (stand-in) Kata initrd the probe's initramfs follows")
    parser.add_argument("--vm-virtiofsd", type=Path, help="the virtio-fs daemon for the VM image")
    args = parser.parse_args()
    architecture = ARCHITECTURES.get(platform.machine())
    if architecture is None:
        raise SystemExit(f"no image architecture for machine {platform.machine()!r}")
    for binary in (args.podtool, args.busybox):
        if not binary.is_file():
            raise SystemExit(f"{binary}: missing")
        if not is_static(binary):
            raise SystemExit(f"{binary}: dynamically linked; the images carry no libraries "
                             "(podtool: CGO_ENABLED=0; busybox: Debian's busybox-static)")
    applets = subprocess.run([str(args.busybox), "--list"], capture_output=True, text=True,
                             check=True).stdout.split()

    podtool = layer([("podtool", args.podtool.read_bytes(), 0o755)])
    busybox = layer([
        ("bin", None, 0o755), ("etc", None, 0o755), ("tmp", None, 0o1777),
        ("bin/busybox", args.busybox.read_bytes(), 0o755),
        *((f"bin/{applet}", "busybox", 0o777) for applet in applets if applet != "busybox"),
        ("etc/passwd", b"root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/:/bin/false\n", 0o644),
        ("etc/group", b"root:x:0:\nnogroup:x:65534:\n", 0o644),
    ])
    args.out.mkdir(parents=True, exist_ok=True)
    pause = write_archive(args.out / "pause.tar", PAUSE_IMAGE, [podtool],
                          {"Entrypoint": ["/podtool", "pause"]}, architecture)
    tools = write_archive(args.out / "tools.tar", TOOLS_IMAGE, [podtool, busybox],
                          {"Entrypoint": ["/bin/sh"], "Env": ["PATH=/bin:/"], "WorkingDir": "/"}, architecture)
    print(f"{PAUSE_IMAGE} {pause}\n{TOOLS_IMAGE} {tools}")
    if args.vm_qemu:
        if not (args.vm_kernel and args.vm_init):
            raise SystemExit("--vm-qemu needs --vm-kernel and --vm-init")
        vm = write_archive(args.out / "vm.tar", VM_IMAGE,
                           [podtool, busybox, vm_layer(args.vm_qemu, args.vm_kernel, args.vm_init, args.vm_modules,
                                                       args.vm_kata_initrd, args.vm_virtiofsd)],
                           {"Entrypoint": ["/usr/bin/qemu-system-x86_64"], "Env": ["PATH=/usr/bin:/bin:/"],
                            "WorkingDir": "/"}, architecture)
        print(f"{VM_IMAGE} {vm}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
