"""Real VMs under the project's classes, on the real node (tests/support/realnode.py) and on its host.

What is real here: QEMU (Debian's qemu-system-x86) with Kata's memory hotplug region and devices
(rng, a SCSI controller, virtio-fs; no vsock: this host has no vhost-vsock), Kata's virtio-fs daemon
(the Rust virtiofsd 1.14) beside it in the same cgroup serving a directory the workload reads through,
a Linux guest (Debian's cloud kernel, its virtio drivers loaded as modules) booted from a stand-in for
Kata's initrd with the probe's init appended (operator/probe-init), which starts the initrd's agent
before the workload, the kubelet's pod cgroups with limits + podFixed, tmpfs.
What still stands in: Kata's agent (a stand-in holding 24 MiB: scripts/node/build-standin-guest.py) and
shim (none). A pod's container runs virtiofsd and the VM itself, joined to its pod's cgroup (every
controller) before they start, as Kata's shim puts them there with sandbox_cgroup_only = true; the
container's own figures therefore come from QEMU, not from inside a guest. Guests run under TCG on
these machines (KVM_CREATE_VM works, a KVM guest hangs): the host side includes TCG's translation
cache, which KVM has not (docs/probe.md).

- `kata-sizing probe` boots the node's QEMU and kernel with that guest at the test policy's VM sizes
  and its rows (which say tcg with the cache measured apart, the kata-initrd guest, QEMU and
  virtiofsd) feed `calibrate`; the calibrated policy's largest pod of each class allocates its whole
  memory limit inside its VM, with no OOM kill, and the operator's status.measurement agrees with the
  pod cgroups' own figures. calibrate takes the translation cache off the host side (no KVM node has
  it); these pods run QEMU under TCG as the probe did, so the test adds the cache the probe measured.
- A policy whose podFixed is below what the probe measured QEMU and virtiofsd to hold that the kernel
  cannot reclaim: the operator's HeadroomLow comes first (QEMU is paused just under the warning line until
  the event is posted), then the kernel OOM-kills the VMM in the pod cgroup, which holds virtiofsd too, and
  the pod shows the kill.
- /dev/shm: a tmpfs at node guidance's size holds the VMs that fit, each touching all it can;
  one VM short, the last VM dies with SIGBUS.
"""

from __future__ import annotations

import json
import math
import os
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from fractions import Fraction
from pathlib import Path

import pytest
import yaml

from kata_sizing.core.calibrate import Sample, parse_samples_csv
from kata_sizing.core.kataguest import SHARE_DATA, SHARE_WORKLOAD, GuestBoot, KataGuest, virtiofsd_command
from kata_sizing.core.model import parse_policy
from kata_sizing.core.probe import VmmPaths, kernel_command_line, parse_console, vm_command
from kata_sizing.core.probehost import keyed_counts
from kata_sizing.core.quantity import MIB
from kata_sizing.core.sizing import Vm, explain_pod, size_policy
from tests.support import kata_vm
from tests.support.operator_helpers import wait_for as poll
from tests.support.policies import explicit_classes_policy
from tests.support.realcluster import ROOT, ControlPlane, wait_observed
from tests.support.realnode import NODE_TOLERATION, POD_CONTROLLERS, Node

pytestmark = pytest.mark.node

POLICY = "node"  # its RuntimeClasses kata-node-<class> are handlers the node maps to runc
CLASSES = [{"name": "s", "cpu": "400m", "memory": "64Mi"}, {"name": "m", "cpu": "400m", "memory": "192Mi"},
           {"name": "l", "cpu": "400m", "memory": "384Mi"}]
# A small fallback VM, so podFixed is the guest budget plus the host side rather than the
# fallback's (docs/sizing-model.md: max(G, default_memory) + host).
FALLBACK = {"cpu": "1", "memory": "64Mi"}
# Three pods of 400m each, plus podFixed's CPU, fit the node's 2 CPUs at once.
INTERVAL_S = 15  # the measurement's shortest interval
# The image's paths (scripts/node/build-images.py): its /vm/initrd is the stand-in Kata initrd with the
# probe's initramfs appended; the share goes to the container's /tmp.
IMAGE_PATHS = VmmPaths("/usr/bin/qemu-system-x86_64", "/vm/vmlinuz", "qemu", "kata-sizing.test/vm:1",
                       KataGuest(initrd="/vm/initrd", virtio_fs_daemon="/usr/libexec/virtiofsd",
                                 virtio_fs_extra_args=kata_vm.VIRTIOFSD_EXTRA))
POD_SHARE, POD_SOCKET = "/tmp/kata-sizing-share", "/tmp/kata-sizing-virtiofsd.sock"
# What a pod's cgroup holds besides its VM's memory and QEMU: the pause container. The kubelet and
# the operator read the same cgroup at slightly different moments.
TOLERANCE_MIB = 8
# What each workload reads through virtio-fs before it allocates: `kata-sizing probe`'s default.
SHARE_READ_BYTES = 16 * MIB


def vm_problem(real_node: Node) -> str | None:
    if real_node.vm_image is None or kata_vm.missing():
        return (f"no VM image, or missing {', '.join(map(str, kata_vm.missing()))} (`make node` builds them where QEMU "
                "installs and cargo runs)")
    return None


@dataclass(frozen=True)
class Calibrated:
    accelerator: str
    probe_csv: str
    overhead: dict
    policy: dict
    host_memory_mib: int  # the host's MemTotal, for the pods' QEMU as Kata's runtime reads it
    # What a probe row's QEMU and virtiofsd held beyond the VM that the kernel cannot reclaim, MiB: QEMU's
    # anonymous memory (the translation cache with it) and the kernel's, as these pods hold them (see
    # unreclaimable_host_mib).
    probe_unreclaimable_host_mib: int

    def sizing(self, body: dict | None = None):
        return size_policy(parse_policy(body or self.policy))


def cli(cp: ControlPlane, *args: object, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kata_sizing.cli", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "KUBECONFIG": str(cp.admin_kubeconfig)}, cwd=ROOT)


def policy_body(**spec: object) -> dict:
    body = explicit_classes_policy(POLICY, classes=[dict(c) for c in CLASSES])
    body["spec"]["fallback"] = dict(FALLBACK)
    body["spec"]["runtimeClass"]["tolerations"] = [NODE_TOLERATION]
    body["spec"]["measurement"] = {"intervalSeconds": INTERVAL_S, "windowSeconds": 600}
    body["spec"].update(spec)
    return body


@pytest.fixture(scope="module")
def calibrated(real_node: Node, tmp_path_factory: pytest.TempPathFactory) -> Calibrated:
    """`kata-sizing probe` of the test policy on this host's QEMU and kernel (those the VM image carries)
    with the stand-in Kata initrd and virtiofsd, then `calibrate --policy`: the policy every VM test
    starts from."""
    from kata_sizing import vm as vmrun

    problem = vm_problem(real_node)
    if problem:
        if os.environ.get("KATA_SIZING_REQUIRE_NODE") == "1":
            pytest.fail(problem)
        pytest.skip(problem)
    workdir = tmp_path_factory.mktemp("probe")
    config = kata_vm.kata_configuration(workdir / "configuration-qemu-runtime-rs.toml")
    policy_file = workdir / "policy.yaml"
    policy_file.write_text(yaml.safe_dump(policy_body()))
    # TCG unless asked (KVM_CREATE_VM works here and a KVM guest hangs: --accel auto would spend its 10 s KVM
    # check on every session; tests/unit/test_probe_vmm.py covers auto with a stand-in VMM).
    accel = os.environ.get("KATA_SIZING_VM_ACCEL", "tcg")
    probed = cli(real_node.cp, "probe", policy_file, "--config", config, "--init", kata_vm.INIT, "--guest-modules",
                 kata_vm.MODULES,
                 "--points", "1", "--share-read", f"{SHARE_READ_BYTES // MIB}Mi", "--node", real_node.name,
                 "--accel", accel)
    assert probed.returncode == 0, probed.stderr
    accelerator = "kvm" if " under kvm " in probed.stdout.splitlines()[0] else "tcg"
    csv_path = workdir / "probe.csv"
    csv_path.write_text(probed.stdout)
    rows = parse_samples_csv(probed.stdout)
    assert {(r.accelerator, r.guest, r.host_processes) for r in rows} == {(accelerator, "kata-initrd", "vmm+virtiofsd")}
    assert all("virtio-fs" in r.devices.split("+") for r in rows)
    print(probed.stderr)
    fitted = cli(real_node.cp, "calibrate", csv_path, "--policy", policy_file, "-o", "json")
    assert fitted.returncode == 0, fitted.stderr
    report = json.loads(fitted.stdout)
    overhead = report["overhead"]
    parts = {p["part"]: p for p in report["parts"]}
    # Each part these rows saw is measured; the shim alone is a stated default.
    assert all("measured" in parts[part] for part in ("guest kernel", "guest userland", "VMM", "virtiofsd")), parts
    assert "measured" not in parts["shim"] and parts["shim"]["assumedMiB"] == 20, parts
    if accelerator == "tcg":
        # calibrate took the translation cache off the host side (no KVM node has one); these pods run QEMU
        # under TCG with the same tb-size as the probe's VMs did, so their host side holds it again.
        cache_mib = math.ceil(max(r.tcg_cache_resident_bytes or 0 for r in rows) / MIB)
        overhead["hostMemory"] = f"{int(overhead['hostMemory'].removesuffix('Mi')) + cache_mib}Mi"
    classes = {"classes": report["specClasses"]} if "specClasses" in report else {}
    return Calibrated(accelerator, probed.stdout, overhead, policy_body(overhead=overhead, **classes),
                      vmrun.host_memory_mib(), unreclaimable_host_mib(rows))


def unreclaimable_host_mib(rows: list[Sample]) -> int:
    """What the probe's VMs held beyond their VM that the kernel cannot reclaim (MiB, rounded up): the least host
    side over the rows (each VM's cgroup peak beyond its fully resident VM) less the page cache of the share its
    workload read through virtio-fs (the workload's binary and SHARE_READ_BYTES), which every row holds.

    A row's host side holds page cache besides QEMU's and the kernel's own memory, and the kernel reclaims page
    cache before it OOM-kills. Measured on the probe's cgroups at their peak here (TCG): 102 to 104 MiB of QEMU's
    anonymous memory and the kernel's in every row; page cache 23 MiB (the share and the probe's initramfs), and
    80 MiB in the first row when the host had QEMU's binary, libraries and kernel out of its page cache (that VM
    read them first and was charged for them; the rows after it find them cached). So the largest host side
    ranged 130 to 185 MiB from run to run, and two thirds of it could exceed all that a pod cannot give back.
    What is left of page cache here (the probe's initramfs, about 4 MiB) stays well inside the third the OOM test
    leaves."""
    share_mib = Fraction(SHARE_READ_BYTES + kata_vm.INIT.stat().st_size, MIB)
    return math.ceil(min(r.host_mib for r in rows if r.host_mib is not None) - share_mib)


# --- a pod whose container runs the VM its class gives it ------------------------------------------

JOIN_POD_CGROUP = (
    # The container's process joins its pod's cgroup (the kubelet's pod<uid>, under the pod's QoS
    # class) in every controller, as Kata's shim puts the VMM and virtiofsd there. "0" is the
    # writing process (the shell: echo is built in), whose pid the host's cgroup tree does not know
    # by its number in the container.
    'for c in ' + " ".join(POD_CONTROLLERS) + '; do for d in /host/cgroup/$c/kubepods/pod$POD_UID '
    '/host/cgroup/$c/kubepods/burstable/pod$POD_UID; do if [ -d $d ]; then echo 0 > $d/cgroup.procs || exit 1; fi; '
    'done; done; ')


def start_virtiofsd(share_read_bytes: int) -> str:
    """The share the workload reads through (its binary and a file of `share_read_bytes`, written here so
    their pages are in the pod's cgroup as the probe's VMs had them in theirs), and virtiofsd serving it in
    the background, the VMM started once it listens: what Kata's runtime does before it starts QEMU."""
    daemon = shlex.join(virtiofsd_command(IMAGE_PATHS.kata, POD_SOCKET, POD_SHARE))
    return (f'mkdir -p {POD_SHARE} && cp /vm/workload {POD_SHARE}/{SHARE_WORKLOAD} && '
            f'head -c {share_read_bytes} /dev/zero > {POD_SHARE}/{SHARE_DATA} || exit 1; {daemon} & '
            f'i=0; while [ ! -S {POD_SOCKET} ]; do i=$((i + 1)); [ $i -le 100 ] || exit 1; sleep 0.1; done; exec "$@"')


def vm_pod(real_node: Node, name: str, namespace: str, class_name: str, *, cpu: str, memory_mib: int, vm: Vm,
           accelerator: str, command_line: str, calibrated: Calibrated) -> dict:
    boot = GuestBoot(IMAGE_PATHS.kata, calibrated.sizing().runtime, calibrated.host_memory_mib,
                     virtio_fs_socket=POD_SOCKET)
    command = vm_command(IMAGE_PATHS, vm, accelerator=accelerator, memory_dir="/dev/shm",
                         initramfs_path="/vm/initrd", command_line=command_line, console_path=None, boot=boot)
    body = real_node.pod(name, namespace=namespace, runtime_class=f"kata-{POLICY}-{class_name}",
                         command=["/bin/sh", "-c", JOIN_POD_CGROUP + start_virtiofsd(SHARE_READ_BYTES), "vm",
                                  *command],
                         limits={"cpu": cpu, "memory": f"{memory_mib}Mi"})
    container = body["spec"]["containers"][0]
    container["image"] = real_node.vm_image
    container["securityContext"] = {"privileged": True}  # writes the host's cgroup tree
    container["env"] = [{"name": "POD_UID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}}]
    container["volumeMounts"] = [{"name": "cgroup", "mountPath": "/host/cgroup"},
                                 {"name": "shm", "mountPath": "/dev/shm"}]
    # Guest memory on a memory-backed emptyDir: a tmpfs whose pages are charged to the pod cgroup
    # of whoever touches them first (QEMU, for the guest), as /dev/shm is on a Kata node.
    body["spec"]["volumes"] = [{"name": "cgroup", "hostPath": {"path": "/sys/fs/cgroup"}},
                               {"name": "shm", "emptyDir": {"medium": "Memory"}}]
    return body


def console(real_node: Node, pod: dict) -> str:
    """The VM's serial console: its container's log."""
    meta = pod["metadata"]
    found = real_node.kubectl("logs", "-n", meta["namespace"], meta["name"], check=False)
    return found.stdout or found.stderr


def qemu_pid(real_node: Node, pod: dict) -> int | None:
    """QEMU's pid once it has joined the pod's cgroup (None before)."""
    for pid in (real_node.pod_cgroup(pod) / "cgroup.procs").read_text().split():
        try:
            if Path(f"/proc/{pid}/comm").read_text().startswith("qemu"):
                return int(pid)
        except OSError:
            continue
    return None


def memory_stat(cgroup: Path) -> dict[str, int]:
    return keyed_counts((cgroup / "memory.stat").read_text())


def working_set_bytes(cgroup: Path) -> int:
    """What the kubelet calls the working set: usage less inactive file pages (cgroup v1)."""
    usage = int((cgroup / "memory.usage_in_bytes").read_text())
    return usage - min(usage, memory_stat(cgroup)["total_inactive_file"])


def pod_memory(cgroup: Path) -> str:
    """What a pod cgroup holds, for a person: what the kernel can reclaim (page cache) and what it cannot
    (anonymous memory, the VM's memory file on its tmpfs) apart."""
    stat = memory_stat(cgroup)
    usage, limit = (int((cgroup / name).read_text()) for name in ("memory.usage_in_bytes", "memory.limit_in_bytes"))
    hits = (cgroup / "memory.failcnt").read_text().strip()
    return (f"usage {usage / MIB:.1f} MiB of its limit {limit / MIB:.1f} MiB: anonymous {stat['total_rss'] / MIB:.1f} "
            f"MiB, tmpfs (the VM's memory) {stat['total_shmem'] / MIB:.1f} MiB, page cache "
            f"{(stat['total_cache'] - stat['total_shmem']) / MIB:.1f} MiB; limit hit {hits} time(s), "
            f"{oom_kills(cgroup)} OOM kill(s)")


def oom_kills(cgroup: Path) -> int:
    for line in (cgroup / "memory.oom_control").read_text().splitlines():
        if line.startswith("oom_kill "):
            return int(line.split()[1])
    return 0


def measured_class(cp: ControlPlane, name: str) -> dict:
    body = cp.get(f"/apis/katasizing.dev/v1alpha1/katasizingpolicies/{POLICY}") or {}
    found = ((body.get("status") or {}).get("measurement") or {}).get("classes") or []
    return next((c for c in found if c["name"] == name), {})


def test_the_largest_pod_of_each_calibrated_class_uses_its_whole_limit_in_its_vm(
        real_node: Node, node_namespace: str, real_operator, calibrated: Calibrated) -> None:
    cp = real_node.cp
    real_operator.start()
    cp.apply(calibrated.policy)
    wait_observed(cp, POLICY, timeout=60, Ready="True")
    sizing = calibrated.sizing()
    pods = {}
    for sized in sizing.classes:
        limit_mib = sized.envelope_memory_mib
        vm = explain_pod(sizing, sized.name, sized.envelope_cpu, limit_mib * MIB).vm
        body = vm_pod(real_node, f"vm-{sized.name}", node_namespace, sized.name, cpu=str(sized.envelope_cpu),
                      memory_mib=limit_mib, vm=vm, accelerator=calibrated.accelerator,
                      command_line=kernel_command_line(limit_mib, linger=True), calibrated=calibrated)
        cp.create(f"/api/v1/namespaces/{node_namespace}/pods", body)
        pods[sized.name] = (body, vm, limit_mib)
    started = time.monotonic()
    reports = {}
    for name, (body, _vm, limit_mib) in pods.items():
        report = poll(lambda: (lambda r: r if r.outcome else None)(parse_console(console(real_node, body))), 180,
                      lambda: f"the VM of class {name} reports: {console(real_node, body)[-600:]}; pod status "
                              f"{json.dumps((cp.get(real_node.pod_path(body)) or {}).get('status'))[-1500:]}",
                      interval=1)
        # The guest budget is right: the workload holds its whole limit inside the VM.
        assert (report.outcome, report.held_mib) == ("reached", limit_mib), (name, report)
        reports[name] = report
    filled_s = time.monotonic() - started
    for name, (body, _, _) in pods.items():
        pod = real_node.cp.get(real_node.pod_path(body))
        assert pod is not None, f"pod {name} is gone"
        state = pod["status"]["containerStatuses"][0]
        # podFixed covers the host side: the VMM runs on, never OOM-killed.
        assert "running" in state["state"] and state["restartCount"] == 0, (name, state)
        assert oom_kills(real_node.pod_cgroup(pod)) == 0, name

    # The operator's measurement agrees with each pod cgroup's own figures, once it has read
    # them after every workload held its limit (a reading from before is of a smaller VM). Under TCG
    # QEMU still grows a little after that (its translation cache), and the kubelet's figure lags the
    # cgroup by up to 15 s: a reading within the tolerance comes once it has settled.
    filled = datetime.now(UTC).replace(microsecond=0)
    last: dict = {}

    def agreed() -> dict | None:
        found = {}
        for name, (body, _, _) in pods.items():
            measured = measured_class(cp, name)
            if measured.get("podsMeasured") != 1 or "minHeadroomBytes" not in measured:
                return None
            if datetime.fromisoformat(measured["lastMeasured"].replace("Z", "+00:00")) <= filled:
                return None
            live = cp.get(real_node.pod_path(body))
            if live is None:
                return None
            cgroup = real_node.pod_cgroup(live)
            limit = int((cgroup / "memory.limit_in_bytes").read_text())
            found[name] = (measured, limit - working_set_bytes(cgroup), limit)
        last.update(found)
        if any(abs(m["minHeadroomBytes"] - h) > TOLERANCE_MIB * MIB for m, h, _ in found.values()):
            return None
        return found
    found = poll(agreed, 6 * INTERVAL_S, lambda: f"status.measurement for every class, within {TOLERANCE_MIB} MiB "
                 f"of the cgroups': {last}", interval=1)
    for name, (measured, headroom_bytes, limit) in found.items():
        pod_fixed = sizing.class_named(name).pod_fixed_memory_mib
        assert limit == (pods[name][2] + pod_fixed) * MIB, (name, limit)
        assert abs(measured["minHeadroomBytes"] - headroom_bytes) <= TOLERANCE_MIB * MIB, (name, measured, headroom_bytes)
        assert measured["minHeadroomBytes"] > 0
    print(f"largest pods (VMs of {', '.join(str(vm.memory_mib) for _, vm, _ in pods.values())} MiB): every workload "
          f"held its limit {filled_s:.0f} s after the pods were created, the measurement "
          f"agreed {time.monotonic() - started - filled_s:.0f} s later; least headroom "
          f"{', '.join(f'{n} {h / MIB:.0f} MiB' for n, (_, h, _) in found.items())} ({calibrated.accelerator})")


def test_a_podfixed_below_the_probe_warns_first_then_the_vmm_is_oom_killed(
        real_node: Node, node_namespace: str, real_operator, calibrated: Calibrated) -> None:
    cp = real_node.cp
    sizing = calibrated.sizing()
    s = sizing.class_named("s")
    # podFixed = the guest budget plus two thirds of what the probe's QEMU and virtiofsd held that the kernel
    # cannot reclaim (not the policy's hostMemory, which holds a shim these pods have not and a margin; not the
    # probe's whole host side, whose page cache the kernel reclaims before it kills): the guest boots, and once
    # its workload has touched all of the VM the pod holds a third of that beyond its limit.
    low = s.guest_budget_mib + calibrated.probe_unreclaimable_host_mib * 2 // 3
    # The warning line is a share of what podFixed holds beyond the guest budget. The test pauses QEMU at three
    # quarters of it, and the kill comes once the pod's working set passes the limit: 40% leaves about 20 MiB
    # for the pause to land in (it came up to 6 MiB late with both cores busy).
    warning_percent = 40
    body = policy_body(overhead=calibrated.overhead, classes=[{
        **CLASSES[0], "overheadMemory": f"{s.guest_budget_mib}Mi", "defaultMemory": FALLBACK["memory"],
        "podFixed": {"cpu": "250m", "memory": f"{low}Mi"}}],
        measurement={"intervalSeconds": INTERVAL_S, "windowSeconds": 600, "headroomWarning": f"{warning_percent}%"})
    real_operator.start()
    cp.apply(body)
    wait_observed(cp, POLICY, timeout=60, Ready="True")
    limit_mib = s.envelope_memory_mib
    vm = explain_pod(calibrated.sizing(body), "s", s.envelope_cpu, limit_mib * MIB).vm
    # One MiB at a time, 20 ms apart, until the guest refuses: the guest budget holds a margin beyond what
    # the class's largest pod gets, so the VM fills only once the workload takes that too: all of it (measured:
    # 247.5 MiB of a 248 MiB VM in its memory file). The test sees the pod (QEMU, virtiofsd and the page cache of
    # the share) cross its warning line and pauses QEMU.
    pod_body = vm_pod(real_node, "vm-low", node_namespace, "s", cpu=str(s.envelope_cpu), memory_mib=limit_mib, vm=vm,
                      accelerator=calibrated.accelerator,
                      command_line=kernel_command_line(0, step_mib=1, step_ms=20, linger=True), calibrated=calibrated)
    pod = real_node.run_pod(pod_body, timeout=60)
    cgroup = real_node.pod_cgroup(pod)
    limit = int((cgroup / "memory.limit_in_bytes").read_text())
    assert limit == (limit_mib + low) * MIB
    warning_line = (low - s.guest_budget_mib) * MIB * warning_percent // 100  # of podFixed beyond the guest budget
    pid = poll(lambda: qemu_pid(real_node, pod), 10, "QEMU in the pod cgroup", interval=0.1)

    def under_the_line() -> bool:
        return limit - working_set_bytes(cgroup) < warning_line * 3 // 4
    poll(under_the_line, 120, lambda: f"the pod under its warning line: {console(real_node, pod)[-400:]}",
         interval=0.01)
    os.kill(pid, signal.SIGSTOP)  # the VM holds still, a few MiB from the kill, until the warning is out
    try:
        paused_headroom = limit - working_set_bytes(cgroup)
        assert 0 < paused_headroom < warning_line, paused_headroom
        # The workload is still allocating inside its VM: what the pod cgroup lacks is the host side.
        print(f"paused {paused_headroom / MIB:.1f} MiB under the limit ({pod_memory(cgroup)}): "
              f"{console(real_node, pod)[-300:]!r}")
        paused = parse_console(console(real_node, pod))
        assert paused.outcome is None, paused
        # The premise: the whole VM beside the anonymous memory the pod already holds (QEMU's, virtiofsd's),
        # which the kernel cannot reclaim without swap, is more than the limit; the page cache it reclaims
        # first does not count.
        assert vm.memory_mib * MIB + memory_stat(cgroup)["total_rss"] > limit, pod_memory(cgroup)
        warned = poll(lambda: [e for e in cp.request("GET", "/api/v1/namespaces/default/events")["items"]
                               if e.get("reason") == "HeadroomLow"
                               and f"pod {node_namespace}/vm-low " in e.get("message", "")],
                      2 * INTERVAL_S + 10, "the operator's HeadroomLow event", interval=0.5)
        assert "its VMM is close to an OOM kill" in warned[0]["message"]
    finally:
        os.kill(pid, signal.SIGCONT)
    try:
        ended = real_node.wait_pod(pod_body, lambda p: "terminated" in p["status"]["containerStatuses"][0]["state"],
                                   "its VM killed", timeout=60)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\nthe pod cgroup: {pod_memory(cgroup)}\nthe VM's console: "
                             f"{console(real_node, pod)[-600:]}") from None
    terminated = ended["status"]["containerStatuses"][0]["state"]["terminated"]
    # The kernel killed the VMM for the pod cgroup's limit (limits + podFixed): SIGKILL. containerd
    # watches OOM on the container's own cgroup, and the VMM sat in the pod's, as with Kata: the
    # pod says exit 137; the kernel's log names the kill.
    assert terminated["exitCode"] == 137, terminated
    log = subprocess.run(["dmesg"], capture_output=True, text=True).stdout
    assert f"Killed process {pid} (qemu-system-x86)" in log, log[-2000:]
    assert "Memory cgroup out of memory" in log


def test_dev_shm_at_guidance_size_holds_the_vms_that_fit_and_one_vm_short_the_last_dies_of_sigbus(
        calibrated: Calibrated, tmp_path: Path) -> None:
    from kata_sizing import vm as vmrun
    from kata_sizing.core.kataguest import initramfs

    sizing = calibrated.sizing()
    sized = sizing.class_named("l")
    pod_mib = sized.envelope_memory_mib + sized.pod_fixed_memory_mib
    reserved_mib = 3 * 64
    capacity_mib = 2 * pod_mib + reserved_mib + 8  # two of class l's largest pods fill its allocatable
    policy_file = tmp_path / "policy.yaml"
    policy_file.write_text(yaml.safe_dump(policy_body(overhead=calibrated.overhead, nodes={
        "systemReserved": "64Mi", "kubeReserved": "64Mi", "evictionHard": "64Mi", "infraPodMemory": "0"})))
    rendered = subprocess.run([sys.executable, "-m", "kata_sizing.cli", "render", str(policy_file), "--node-capacity",
                               f"{capacity_mib}Mi"], capture_output=True, text=True, cwd=ROOT, check=True).stdout
    guidance_cm = next(o for o in yaml.safe_load_all(rendered) if o and o["metadata"]["name"].endswith("-node-guidance"))
    guidance = yaml.safe_load(next(v for k, v in guidance_cm["data"].items() if k.endswith(".yaml")))
    shm_mib = int(guidance["devShm"]["size"].removesuffix("Mi"))
    fit = guidance["vmsPerClass"]["l"]["fit"]
    vm_mib = guidance["vmsPerClass"]["l"]["largestVmMemory"]
    assert fit == 2 and int(vm_mib.removesuffix("Mi")) == sized.largest_vm.memory_mib
    paths = VmmPaths(str(kata_vm.QEMU), str(kata_vm.KERNEL), "qemu", "the test")
    image = tmp_path / "initramfs"
    image.write_bytes(initramfs(kata_vm.INIT.read_bytes()))

    def boot_all(size_mib: int) -> tuple[list[int | None], int]:
        """Boot `fit` VMs one after another on a tmpfs of `size_mib`, each touching all it can and
        staying up; (each one's exit code while the next ran, the tmpfs's use in bytes at the end)."""
        mount = tmp_path / f"shm-{size_mib}"
        mount.mkdir()
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_mib}m", "tmpfs", str(mount)], check=True)
        running = []
        try:
            for number in range(fit):
                vm = vmrun.RunningVm(paths, sized.largest_vm, accelerator=calibrated.accelerator, initramfs_path=image,
                                     memory_dir=str(mount), workdir=tmp_path, command_line=kernel_command_line(0, linger=True),
                                     name=f"shm-{size_mib}-{number}")
                running.append(vm.__enter__())
                vm.wait(120, lambda report: report.outcome is not None)
            used = os.statvfs(mount)
            return [vm.exit_code for vm in running], (used.f_blocks - used.f_bfree) * used.f_frsize
        finally:
            for vm in running:
                vm.stop()
            subprocess.run(["umount", str(mount)], check=True)

    exits, used_bytes = boot_all(shm_mib)
    assert exits == [None] * fit, exits  # every VM up, all it touched in the tmpfs
    slack_mib = shm_mib - used_bytes / MIB
    assert 0 < slack_mib < sized.largest_vm.memory_mib, slack_mib
    exits, _ = boot_all(shm_mib - sized.largest_vm.memory_mib)
    assert exits[:-1] == [None] * (fit - 1) and exits[-1] == -signal.SIGBUS, exits
    print(f"/dev/shm at guidance's {shm_mib} MiB: {fit} VMs of {sized.largest_vm.memory_mib} MiB touched "
          f"{used_bytes / MIB:.0f} MiB, {slack_mib:.0f} MiB left ({calibrated.accelerator})")
