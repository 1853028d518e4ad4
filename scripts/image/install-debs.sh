#!/usr/bin/env bash
# The Debian packages `make image` and the image tests need, installed with apt-get:
#   mmdebstrap  builds the base root file systems from Debian's packages (no registry here);
#   podman      imports them, builds the Dockerfile, runs and saves the image;
#   runc        the OCI runtime podman is told to use: crun refuses a hybrid cgroup v1 hierarchy.
# Quick when they are present. Without root or apt-get it installs nothing and exits 2 with one
# line saying why (`make test` then skips the image and says so).
set -euo pipefail
packages=(mmdebstrap podman runc)

missing=()
for package in "${packages[@]}"; do
  status="$(dpkg-query -W -f='${Status}' "$package" 2>/dev/null || true)"
  [ "$status" = "install ok installed" ] || missing+=("$package")
done
[ "${#missing[@]}" -eq 0 ] && exit 0

if [ "$(id -u)" -ne 0 ]; then
  echo "image tools missing (${missing[*]}) and not root: cannot apt-get install them" >&2
  exit 2
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "image tools missing (${missing[*]}) and no apt-get on this machine" >&2
  exit 2
fi
echo "installing ${missing[*]} with apt-get"
export DEBIAN_FRONTEND=noninteractive
# Package lists older than a day may name versions the mirror no longer has.
if [ -z "$(find /var/lib/apt/lists -maxdepth 1 -name '*_Packages*' -mmin -1440 2>/dev/null | head -n1)" ]; then
  apt-get update -qq
fi
# No recommends: podman's pull in buildah, slirp4netns, fuse-overlayfs and crun, none of which
# a root build with host networking uses.
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
