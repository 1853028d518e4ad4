#!/usr/bin/env bash
# The node's parts from Debian's packages: containerd (with ctr), runc, the CNI plugins
# (bridge, host-local, loopback, portmap), iptables and conntrack for kube-proxy,
# busybox-static for the test image, QEMU for the VM tests, what the Rust virtiofsd builds
# against (libseccomp-dev, libcap-ng-dev) and e2fsprogs (mkfs.ext4 -d) for the stand-in Kata
# image. Idempotent: when every package is installed it only
# asks dpkg and exits. Needs root and apt-get; otherwise it says why and exits 0, so
# `make test` goes on and the node tests skip with one line saying why.
set -euo pipefail

PACKAGES=(containerd runc containernetworking-plugins iptables conntrack busybox-static qemu-system-x86
          libseccomp-dev libcap-ng-dev e2fsprogs)

missing=()
for package in "${PACKAGES[@]}"; do
  status=$(dpkg-query -W -f='${db:Status-Status}' "$package" 2>/dev/null || true)
  [[ $status == installed ]] || missing+=("$package")
done
if ((${#missing[@]} == 0)); then
  exit 0
fi
if [[ $(id -u) != 0 ]] || ! command -v apt-get >/dev/null 2>&1; then
  echo "node packages missing (${missing[*]}) and this is not root with apt-get: the node tests will skip"
  exit 0
fi

echo "installing the node's packages: ${missing[*]}"
# Another session may hold dpkg's lock (installing its own packages): wait for it.
apt_get=(apt-get -q -o DPkg::Lock::Timeout=600)
export DEBIAN_FRONTEND=noninteractive
"${apt_get[@]}" update -qq
# No service is started by the packages here (no init system runs them); the tests start
# their own containerd with its own configuration, socket and state directories.
"${apt_get[@]}" install -y -qq --no-install-recommends "${missing[@]}"
