#!/usr/bin/env bash
# The VM tests' guest kernel: Debian's cloud kernel (the linux-image-cloud-amd64 metapackage's
# current image), taken out of its package with `apt-get download` and `dpkg-deb -x`; nothing
# is installed. Writes DIR/vmlinuz and DIR/VERSION (the package it came from). Idempotent: a
# kernel already there is kept. Without apt-get it says why and exits 0 (the VM tests skip).
# Usage: fetch-guest-kernel.sh DIR
set -euo pipefail
out="$1"
if [[ -s $out/vmlinuz ]]; then
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
cp "$work"/root/boot/vmlinuz-* "$out/vmlinuz.partial"
mv "$out/vmlinuz.partial" "$out/vmlinuz"
basename "$deb" > "$out/VERSION"
echo "guest kernel: $(cat "$out/VERSION")"
