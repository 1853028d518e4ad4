#!/usr/bin/env bash
# `make image`: the operator image built from the project's own Dockerfile without a registry.
# Usage: scripts/image/build.sh IMAGE_REF ARCHIVE
#
# 1. Three base root file systems from Debian's packages (mmdebstrap, bookworm with its updates
#    and security suites): "runtime" (python3, ca-certificates) for the final stage,
#    "builder" (the same plus python3-venv) for the stage that creates the venv, and "go"
#    (golang-go) for the stage that builds the probe's init. Each tarball is
#    named by a hash of what goes into it and kept in .tools/images/base/, so it is built once
#    per machine until its package list changes; apt's downloads are kept beside it.
# 2. Each imported into podman's store under .tools/images/podman as
#    localhost/kata-sizing-base-<role>:<hash>, with the configuration the published python
#    image has (PATH, LANG).
# 3. The Dockerfile built by podman with those bases as BUILDER_BASE and BASE (the published
#    python image by digest stays their default), host networking for pip.
# 4. Saved as an OCI archive tagged IMAGE_REF, which `podman load` and
#    `ctr -n k8s.io images import` accept.
set -euo pipefail
shopt -s inherit_errexit
image_ref="$1"
archive="$2"
project="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$project"
podman=(bash scripts/image/podman.sh)
images="$project/.tools/images"
mkdir -p "$images/base" "$images/apt-cache/archives" "$images/apt-cache/lists" "$(dirname "$archive")"

suite=bookworm
mirrors=(
  "deb http://deb.debian.org/debian $suite main"
  "deb http://deb.debian.org/debian $suite-updates main"
  "deb http://deb.debian.org/debian-security $suite-security main"
)
# What Debian's slim images leave out: manuals, translations and documentation other than the
# copyright files.
dpkg_options=(
  "path-exclude=/usr/share/man/*"
  "path-exclude=/usr/share/info/*"
  "path-exclude=/usr/share/locale/*"
  "path-include=/usr/share/locale/locale.alias"
  "path-exclude=/usr/share/doc/*"
  "path-include=/usr/share/doc/*/copyright"
)
runtime_packages=python3,ca-certificates
builder_packages=$runtime_packages,python3-venv
# The probe's init (operator/probe-init) builds with Debian's Go (1.19).
go_packages=golang-go,ca-certificates
# The published base's configuration (docker-library/python: PATH, LANG) so the Dockerfile's
# `ENV PATH=...:$PATH` and Python's locale behave as they do on it.
base_config=(
  --change "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
  --change "ENV LANG=C.UTF-8"
  --change 'CMD ["python3"]'
)

base_image() {  # base_image ROLE PACKAGES: prints the local image name, building what is missing
  local role="$1" packages="$2" key tarball name
  key="$(printf '%s\n' "$suite" "${mirrors[@]}" "${dpkg_options[@]}" "$packages" "${base_config[@]}" \
         | sha256sum | cut -c1-16)"
  tarball="$images/base/$role-$key.tar"
  name="localhost/kata-sizing-base-$role:$key"
  if [ ! -s "$tarball" ]; then
    echo "base $role: mmdebstrap $suite with $packages" >&2
    local cache="$images/apt-cache" options=()
    for option in "${dpkg_options[@]}"; do options+=(--dpkgopt="$option"); done
    # force-unsafe-io: no fsync per file; the tarball is written once at the end anyway.
    mmdebstrap --quiet --mode=root --format=tar --variant=essential --include="$packages" \
      --dpkgopt=force-unsafe-io "${options[@]}" \
      --skip=essential/unlink --skip=download/empty \
      --setup-hook='mkdir -p "$1"/var/cache/apt/archives "$1"/var/lib/apt/lists' \
      --setup-hook="sync-in $cache/archives /var/cache/apt/archives/" \
      --setup-hook="sync-in $cache/lists /var/lib/apt/lists/" \
      --customize-hook="sync-out /var/cache/apt/archives $cache/archives" \
      --customize-hook="sync-out /var/lib/apt/lists $cache/lists" \
      "$suite" "$tarball.partial" "${mirrors[@]}" >&2
    mv "$tarball.partial" "$tarball"
    find "$images/base" -name "$role-*.tar" ! -name "$role-$key.tar" -delete  # superseded lists
  fi
  if ! "${podman[@]}" image exists "$name"; then
    "${podman[@]}" import --quiet "${base_config[@]}" "$tarball" "$name" >/dev/null
  fi
  echo "$name"
}

runtime_base="$(base_image runtime "$runtime_packages")"
builder_base="$(base_image builder "$builder_packages")"
go_base="$(base_image go "$go_packages")"

version="$(sed -n 's/^version = "\(.*\)"$/\1/p' pyproject.toml)"
revision="$(git rev-parse HEAD 2>/dev/null || echo unknown)"
# Where the way to PyPI passes a TLS-intercepting proxy, the machine trusts the proxy's CA (and
# tells pip so with PIP_CERT and friends): the build's RUN steps see that bundle in place of the
# base's as a read-only mount, which is never part of a layer. The builder's pip (Debian's)
# reads the system bundle.
build_mounts=()
ca_bundle="${PIP_CERT:-${REQUESTS_CA_BUNDLE:-${SSL_CERT_FILE:-/etc/ssl/certs/ca-certificates.crt}}}"
if [ -f "$ca_bundle" ]; then
  build_mounts+=(--volume "$ca_bundle:/etc/ssl/certs/ca-certificates.crt:ro")
fi
"${podman[@]}" build --pull=never --network=host --layers "${build_mounts[@]}" \
  --build-arg "BUILDER_BASE=$builder_base" --build-arg "BASE=$runtime_base" --build-arg "GO_BUILDER=$go_base" \
  --build-arg "VERSION=$version" --build-arg "REVISION=$revision" \
  --tag "$image_ref" --file Dockerfile .
rm -f "$archive.partial"
"${podman[@]}" save --quiet --format oci-archive --output "$archive.partial" "$image_ref"
mv "$archive.partial" "$archive"
echo "$image_ref -> ${archive#"$project/"}"
