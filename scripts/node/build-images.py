#!/usr/bin/env python3
"""Write the node tests' two container images as OCI archives, without any image tool.

- `kata-sizing.test/pause:1`: the pod sandbox image containerd starts first in every pod
  (`podtool pause`: sleeps, reaps orphans, exits on SIGTERM);
- `kata-sizing.test/tools:1`: podtool (hold N MiB, the in-cluster API client) and Debian's
  busybox-static (sh, sleep, cat, ...), entry point `sh`.

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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--podtool", type=Path, required=True)
    parser.add_argument("--busybox", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
