#!/usr/bin/env bash
# podman with its whole state (images, layers, containers, configuration) in one directory,
# .tools/images/podman unless `--store DIR` comes first, so it never touches the machine's own
# container storage. Usage: scripts/image/podman.sh [--store DIR] PODMAN-ARGS...
#
# Settings this machine type needs (see docs/image.md):
# - runc, not crun: crun refuses this kernel's hybrid cgroup v1 hierarchy;
# - cgroupfs and file events: no systemd manages the machine's cgroups or journal;
# - ulimits no higher than the machine's hard limits: as root podman raises a container's
#   open-files and process limits to its own maxima, which needs CAP_SYS_RESOURCE. The process
#   limit is also kept at kernel.pid_max: runc is seen to run with that lower limit here, and
#   setting a container's limit above the runtime's own is a raise too.
set -euo pipefail
project="$(cd "$(dirname "$0")/../.." && pwd)"
store="$project/.tools/images/podman"
if [ "${1:-}" = "--store" ]; then
  store="$2"
  shift 2
fi
mkdir -p "$store/tmp"
store="$(cd "$store" && pwd)"

ulimits=()
nproc="$(ulimit -Hu)"
pid_max="$(cat /proc/sys/kernel/pid_max 2>/dev/null || echo unlimited)"
if [ "$nproc" = unlimited ] || { [ "$pid_max" != unlimited ] && [ "$pid_max" -lt "$nproc" ]; }; then
  nproc="$pid_max"
fi
for limit in "nofile:$(ulimit -Hn)" "nproc:$nproc"; do
  name="${limit%%:*}" value="${limit#*:}"
  [ "$value" = unlimited ] || ulimits+=("\"$name=$value:$value\"")
done

write() {  # write FILE: stdin to FILE, replaced whole so a concurrent reader never sees half
  cat > "$1.$$" && mv -f "$1.$$" "$1"
}
write "$store/containers.conf" <<CONF
[containers]
default_ulimits = [$(IFS=,; echo "${ulimits[*]}")]

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
events_logfile_path = "$store/events.log"
tmp_dir = "$store/libpod"
image_copy_tmp_dir = "$store/tmp"
CONF
write "$store/storage.conf" <<CONF
[storage]
driver = "overlay"
graphroot = "$store/storage"
runroot = "$store/run"
CONF

export CONTAINERS_CONF="$store/containers.conf" CONTAINERS_STORAGE_CONF="$store/storage.conf"
export TMPDIR="$store/tmp"
exec podman "$@"
