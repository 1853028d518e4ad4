#!/usr/bin/env bash
# The VM tests' guest kernel: Debian's cloud kernel (the linux-image-cloud-amd64 metapackage's
# current image), taken out of its package with `apt-get download` and `dpkg-deb -x`; nothing
# is installed. Writes DIR/vmlinuz, DIR/VERSION (the package it came from) and DIR/modules/: the
# kernel modules Kata's devices need (virtio over PCI, the console, the disks, rng, vsock, virtio-fs,
# the nvdimm's ACPI and pmem drivers: kata_sizing.core.kataguest.WANTED_MODULES) with everything they
# depend on. This kernel builds them as modules; Kata's own guest kernel builds them in. Idempotent: a
# kernel and its modules already there are kept. Without apt-get it says why and exits 0 (the VM tests
# skip). $PYTHON is an interpreter with kata_sizing (the project's venv).
# Usage: fetch-guest-kernel.sh DIR
set -euo pipefail
out="$1"
python="${PYTHON:-python3}"
if [[ -s $out/vmlinuz && -e $out/modules/.complete ]]; then
  exit 0
fi
if ! command -v apt-get >/dev/null 2>&1 || [[ $(uname -m) != x86_64 ]]; then
  echo "no guest kernel: this is not an x86_64 machine with apt-get; the VM tests will skip"
  exit 0
fi
package=$(apt-cache depends linux-image-cloud-amd64 2>/dev/null | awk '/Depends: linux-image-/{print $2; exit}')
if [[ -z $package ]]; then
  apt-get -q -o DPkg::Lock::Timeout=600 update -qq
  package=$(apt-cache depends linux-image-cloud-amd64 | awk '/Depends: linux-image-/{print $2; exit}')
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
(cd "$work" && apt-get -q download "$package" 2>&1 | grep -v "^W: Download is performed unsandboxed" || true)
deb=$(ls "$work"/*.deb)
dpkg-deb -x "$deb" "$work/root"
mkdir -p "$out"
rm -rf "$out/modules"
"$python" - "$work/root/lib/modules" "$out/modules" <<'PY'
import shutil
import sys
from pathlib import Path

from kata_sizing.core.kataguest import WANTED_MODULES, kernel_module, module_closure

tree, out = Path(sys.argv[1]), Path(sys.argv[2])
found = {}
for path in tree.rglob("*.ko"):
    module = kernel_module(path.read_bytes(), str(path))
    found[module.name] = (module, path)
wanted = module_closure(WANTED_MODULES, {name: module for name, (module, _) in found.items()})
out.mkdir(parents=True)
for module in wanted:
    shutil.copyfile(found[module.name][1], out / f"{module.name}.ko")
(out / ".complete").write_text("".join(f"{module.name}\n" for module in wanted))
print(f"guest kernel modules: {' '.join(module.name for module in wanted)}")
PY
cp "$work"/root/boot/vmlinuz-* "$out/vmlinuz.partial"
mv "$out/vmlinuz.partial" "$out/vmlinuz"
basename "$deb" > "$out/VERSION"
echo "guest kernel: $(cat "$out/VERSION")"
