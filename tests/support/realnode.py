"""A real one-node Kubernetes cluster for the tests: the session's control plane plus a node.

The node is the kubelet, kube-scheduler and kube-proxy of `.tools/controlplane` (the same
`k8s.io/kubernetes` v1.37.2 pins as the control plane), Debian's containerd, runc and CNI
plugins (`make node` installs them with scripts/node/install-debs.sh), and two images written
locally by scripts/node/build-images.py and imported into containerd (nothing is pulled):
`kata-sizing.test/pause:1`, the sandbox, and `kata-sizing.test/tools:1` (busybox-static and
podtool: `podtool hold N` holds N MiB, `podtool kube-get PATH` reads the API server with the
pod's in-cluster configuration). runc stands in for Kata: containerd maps every RuntimeClass
handler of `NodeConfig.runtime_handlers` to runc, so the kubelet charges and schedules a pod of
such a class exactly as on a Kata node; only the VM is missing. docs/testing.md says what it
took on this kernel.

Fixtures (wired in tests/conftest.py):

- `real_node` (session): a started `Node`, Ready, joined to `control_plane`; stopped at the end
  of the session with everything it made on the host (processes, mounts, network namespaces,
  iptables rules, the bridge, cgroups). Tests using it are marked `node` (`pytest -m node` runs
  only them); the node tests run after the others (tests/support/realcluster.py orders them).
- `node_config` (session): the `NodeConfig` the node starts with, once per session. To start it
  with other reservations, override this fixture once (for example in tests/conftest.py) with
  the KubeletConfiguration fragment the operator's node guidance gives::

      @pytest.fixture(scope="session")
      def node_config() -> NodeConfig:
          return NodeConfig(kubelet_config={
              "systemReserved": {"memory": "1Gi"}, "kubeReserved": {"memory": "512Mi"},
              "evictionHard": {"memory.available": "256Mi"}})

  Top-level keys of `kubelet_config` replace the defaults of `kubelet_configuration()`;
  `evictionHard` defaults to only `memory.available: 100Mi` (the kubelet's own default), so
  the disk of a CI machine never evicts a test pod.
- `node_namespace`: a namespace named after the test, deleted (its pods stopped) afterwards.
- `control_plane_address` (session): what `control_plane` binds to; the node's address when
  the session has node tests and this machine can run the node, else 127.0.0.1.

A `Node` gives: `name`, `ip`, `cp` (the `ControlPlane`), `pod(name, namespace=, runtime_class=,
limits=, requests=, command=, **spec)` (a pod of the tools image that tolerates the node's
taint, as a dict), `run_pod(body)` (create, wait until Running, return it), `wait_pod(body,
predicate, what)`, `namespace(name)` (created, with its ServiceAccount and `kube-root-ca.crt`)
and `delete_namespace(name)`, `events(pod)`, `pod_cgroup(pod, controller)` (the pod's cgroup
directory on the host), `hold_memory_in_pod(pod, mib)` (a host process holding `mib` MiB inside
the pod's cgroup, standing in for a Kata sandbox's shim and VMM), `stats_summary()` (the
kubelet's Summary API through the API server's node proxy), `allocatable()`, `kubectl(...)`,
`ctr(...)` (containerd's CLI on the node's socket), `start_seconds`, and `logdir` (each
component's log).

The node registers with the taint `NODE_TAINT` (pods need `NODE_TOLERATION`; `pod()` adds it,
and a policy's `runtimeClass.tolerations` can carry it), so pods other tests leave in the
cluster (the two operator pods the replicaset controller makes for the manifests' Deployment,
whose image is not on the node) stay Pending, as if there were no node, and with the labels of
`NodeConfig.labels` (by default `katacontainers.io/kata-runtime=true`, the project's default
class and guidance selector).

Where the machine cannot run a node (not root, a package or image missing, no cgroup memory
controller...), the node tests skip with one line saying why; with KATA_SIZING_REQUIRE_NODE=1
(set by .ci/run) that skip is a failure. One node runs per machine: its state lives in
`/run/kata-sizing-node` under an exclusive lock (another session waits for it), its processes
die with the session (parent-death signal), and a session that finds what a killed one left
(its pods' processes, mounts, network namespaces, iptables chains) removes it before starting.
"""

from __future__ import annotations

import contextlib
import fcntl
import ipaddress
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import tarfile
import time
import urllib.parse
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.operator_helpers import terminate
from tests.support.operator_helpers import wait_for as poll
from tests.support.paths import ROOT
from tests.support.realcluster import BINARY, KUBECTL, LOOPBACK, ApiError, ControlPlane, free_port

REQUIRE_ENV = "KATA_SIZING_REQUIRE_NODE"
IMAGES = ROOT / ".tools" / "node-images"
PODTOOL = ROOT / ".tools" / "podtool"

# The node's address: a /32 on the loopback interface, a private test address that no real
# network of the machine uses. The kubelet refuses a loopback node IP, and the kubernetes
# Service's endpoint must be an address a pod reaches; this kernel has no dummy interface
# type, and eth0's address would put the API server on the machine's network.
NODE_IP = "198.18.0.2"
NODE_NAME = "kata-sizing-node"  # the controlplane binary's default --node-name: its certificates
POD_CIDR = "10.244.0.0/24"
BRIDGE = "kata-sizing0"
CNI_NETWORK = "kata-sizing-node"
STATE = Path("/run/kata-sizing-node")
CONTAINERD_SOCKET = STATE / "containerd" / "containerd.sock"
LOCK_DIR = Path("/run/lock")
NODE_LOCK = LOCK_DIR / "kata-sizing-node.lock"
ADDRESS_LOCK = LOCK_DIR / "kata-sizing-node-address.lock"
NODE_LOCK_WAIT_S = float(os.environ.get("KATA_SIZING_NODE_LOCK_WAIT_S", "1200"))
CGROUP_ROOT = Path("/sys/fs/cgroup")
POD_CONTROLLERS = ("memory", "cpu", "cpuacct", "cpuset", "pids")
CNI_BIN = Path("/usr/lib/cni")

NODE_TAINT = {"key": "katasizing.dev/node-tests", "value": "true", "effect": "NoSchedule"}
NODE_TOLERATION = {"key": NODE_TAINT["key"], "operator": "Exists", "effect": "NoSchedule"}

# RuntimeClass handlers containerd maps to runc. The project's test policies name their
# classes kata-node-<class>; add a handler here (or in a NodeConfig) before a policy uses it.
DEFAULT_RUNTIME_HANDLERS = ("kata-node-s", "kata-node-m", "kata-node-l", "kata-node-xl")
DEFAULT_LABELS = {"katacontainers.io/kata-runtime": "true"}


def image_name(archive: Path) -> str:
    """The name build-images.py gave the image (its index's io.containerd.image.name)."""
    with tarfile.open(archive) as tar:
        member = tar.extractfile("index.json")
        assert member is not None, f"{archive} holds no index.json"
        index = json.load(member)
    return index["manifests"][0]["annotations"]["io.containerd.image.name"]


@dataclass(frozen=True)
class NodeConfig:
    """What the session's node starts with (see the module docstring to change it)."""

    kubelet_config: Mapping[str, Any] = field(default_factory=dict)
    runtime_handlers: tuple[str, ...] = DEFAULT_RUNTIME_HANDLERS
    labels: Mapping[str, str] = field(default_factory=lambda: dict(DEFAULT_LABELS))


# --- can this machine run the node? ----------------------------------------------------------

def host_problem() -> str | None:
    """Why this machine cannot run the node, in one line; None when it can."""
    if os.geteuid() != 0:
        return "not root (the kubelet, containerd and the CNI plugins need root)"
    if not BINARY.exists():
        return "the node's binary is not built (.tools/controlplane; `make node` needs Go)"
    if not KUBECTL.exists():
        return "the real kubectl is missing (.tools/kubectl; `make tools`)"
    for program in ("containerd", "containerd-shim-runc-v2", "runc", "ctr", "iptables", "iptables-save", "ip"):
        if shutil.which(program) is None:
            return f"{program} is not installed (`make node` installs the node's Debian packages as root)"
    for plugin in ("bridge", "host-local", "loopback"):
        if not (CNI_BIN / plugin).exists():
            return f"the CNI plugin {CNI_BIN / plugin} is missing (Debian's containernetworking-plugins)"
    for archive in ("pause.tar", "tools.tar"):
        if not (IMAGES / archive).exists():
            return f"the node's image {IMAGES / archive} is not built (`make node`)"
    if not PODTOOL.exists():
        return f"{PODTOOL} is not built (`make node`)"
    for controller in POD_CONTROLLERS:
        # The fixture reads and cleans the kubelet's cgroups as cgroup v1 lays them out.
        if not (CGROUP_ROOT / controller / "cgroup.procs").exists():
            return f"no cgroup v1 {controller} controller at {CGROUP_ROOT / controller}"
    return None


def require_node(problem: str | None) -> None:
    """Skip with one line saying why the node cannot run; with KATA_SIZING_REQUIRE_NODE=1, fail."""
    if problem is None:
        return
    reason = f"no real node on this machine: {problem}: node tests skipped"
    if os.environ.get(REQUIRE_ENV) == "1":
        pytest.fail(f"{REQUIRE_ENV}=1 but {reason}")
    pytest.skip(reason)


# --- small host helpers ----------------------------------------------------------------------

def run(*args: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess:
    proc = subprocess.run(args, capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} exited {proc.returncode}: {proc.stderr.strip()}")
    return proc


@contextlib.contextmanager
def flock(path: Path, mode: int, wait_s: float, what: str) -> Iterator[None]:
    """Hold `path`'s lock (fcntl.LOCK_SH or LOCK_EX), waiting up to `wait_s` for it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handle = path.open("a+")
    try:
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(handle, mode | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{what} is still held by another test session after {wait_s:.0f}s "
                                       f"({path})") from None
                time.sleep(1)
        yield
    finally:
        handle.close()


@contextlib.contextmanager
def node_address() -> Iterator[str]:
    """NODE_IP on the loopback interface while the caller runs; removed when no session uses it."""
    with flock(ADDRESS_LOCK, fcntl.LOCK_SH, 60, "the node address"):
        present = run("ip", "-4", "-o", "addr", "show", "dev", "lo").stdout
        if f" {NODE_IP}/32 " not in present:
            run("ip", "addr", "add", f"{NODE_IP}/32", "dev", "lo")
        yield NODE_IP
    with open(ADDRESS_LOCK, "a+") as handle:  # the last user removes it
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return
        run("ip", "addr", "del", f"{NODE_IP}/32", "dev", "lo", check=False)


# --- the node's configuration files (pure: tests/unit/test_node_configuration.py checks them) ------

def containerd_configuration(pause_image: str, runtime_handlers: Iterable[str]) -> str:
    """containerd 1.6's configuration: its own root, state and socket under STATE, the CRI
    plugin with runc behind the default runtime and behind every handler given."""
    state = STATE / "containerd"
    runtimes = "".join(f'''
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.{json.dumps(handler)}]
  runtime_type = "io.containerd.runc.v2"
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.{json.dumps(handler)}.options]
  SystemdCgroup = false
  Root = "{STATE / 'runc'}"
''' for handler in dict.fromkeys(("runc", *runtime_handlers)))
    return f'''version = 2
root = "{state / 'root'}"
state = "{state / 'state'}"
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.zfs",
                    "io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.devmapper",
                    "io.containerd.tracing.processor.v1.otlp"]
[grpc]
  address = "{CONTAINERD_SOCKET}"
[plugins."io.containerd.internal.v1.opt"]
  path = "{state / 'opt'}"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{pause_image}"
  # Root here lacks CAP_SYS_RESOURCE: without this every sandbox fails to start ("can't get
  # final child's PID from pipe") when the kubelet asks for a negative oom_score_adj.
  restrict_oom_score_adj = true
[plugins."io.containerd.grpc.v1.cri".containerd]
  default_runtime_name = "runc"
  snapshotter = "overlayfs"
[plugins."io.containerd.grpc.v1.cri".cni]
  bin_dir = "{CNI_BIN}"
  conf_dir = "{STATE / 'cni' / 'net.d'}"
  max_conf_num = 1
{runtimes}'''


def cni_configuration() -> dict:
    """One bridge network for the pods, addresses from POD_CIDR kept under STATE."""
    return {"cniVersion": "1.0.0", "name": CNI_NETWORK, "plugins": [{
        "type": "bridge", "bridge": BRIDGE, "isGateway": True, "ipMasq": True, "hairpinMode": True,
        "ipam": {"type": "host-local", "ranges": [[{"subnet": POD_CIDR}]],
                 "routes": [{"dst": "0.0.0.0/0"}], "dataDir": str(STATE / "cni" / "ipam")},
    }]}


def kubelet_configuration(credentials: Path, port: int, fragment: Mapping[str, Any]) -> dict:
    """The KubeletConfiguration: the defaults below with `fragment`'s top-level keys in their
    place. `credentials` is the control plane's directory (CA, the kubelet's certificate)."""
    defaults = {
        "apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
        # This kernel mounts cgroup v1, which v1.37's kubelet refuses unless told otherwise.
        "failCgroupV1": False, "cgroupDriver": "cgroupfs",
        "containerRuntimeEndpoint": f"unix://{CONTAINERD_SOCKET}",
        "address": NODE_IP, "port": port, "readOnlyPort": 0, "healthzPort": 0,
        "tlsCertFile": str(credentials / "kubelet.crt"),
        "tlsPrivateKeyFile": str(credentials / "kubelet.key"),
        # As a kubeadm node: client certificates from the cluster CA, bearer tokens and
        # every request checked with the API server (TokenReview, SubjectAccessReview).
        "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": True},
                           "x509": {"clientCAFile": str(credentials / "ca.crt")}},
        "authorization": {"mode": "Webhook"},
        "clusterDomain": "cluster.local", "clusterDNS": [],
        "registerWithTaints": [NODE_TAINT],
        "podLogsDir": str(STATE / "pod-logs"),
        "enforceNodeAllocatable": ["pods"],
        # The kubelet's own default for memory; none for disks, so a full CI disk never evicts.
        "evictionHard": {"memory.available": "100Mi"},
        # Imported images cannot be pulled again: never collect them.
        "imageGCHighThresholdPercent": 100, "imageGCLowThresholdPercent": 99,
        "failSwapOn": False, "serializeImagePulls": False,
    }
    return {**defaults, **fragment}


def kube_proxy_configuration(credentials: Path, healthz_port: int, metrics_port: int) -> dict:
    return {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1", "kind": "KubeProxyConfiguration",
        "clientConnection": {"kubeconfig": str(credentials / "proxy.kubeconfig")},
        "hostnameOverride": NODE_NAME, "mode": "iptables", "clusterCIDR": POD_CIDR,
        "healthzBindAddress": f"127.0.0.1:{healthz_port}", "metricsBindAddress": f"127.0.0.1:{metrics_port}",
        # Leave the machine's conntrack sysctls and kube-proxy's OOM score as they are.
        "conntrack": {"maxPerCore": 0, "min": 0},
        "oomScoreAdj": 0,
    }


def kube_scheduler_configuration(credentials: Path) -> dict:
    return {
        "apiVersion": "kubescheduler.config.k8s.io/v1", "kind": "KubeSchedulerConfiguration",
        "clientConnection": {"kubeconfig": str(credentials / "scheduler.kubeconfig")},
        "leaderElection": {"leaderElect": False},
    }


# --- the node --------------------------------------------------------------------------------

class Node:
    """The node's processes, their configuration files, and what tests ask of the node."""

    def __init__(self, cp: ControlPlane, config: NodeConfig, logdir: Path) -> None:
        assert cp.address == NODE_IP, f"the control plane serves on {cp.address}, not the node's address"
        self.cp, self.config, self.logdir = cp, config, logdir
        self.name, self.ip = NODE_NAME, NODE_IP
        self.processes: dict[str, subprocess.Popen] = {}
        self.containerd_socket = CONTAINERD_SOCKET
        self.kubelet_port = free_port(NODE_IP)
        self.pause_image = image_name(IMAGES / "pause.tar")
        self.tools_image = image_name(IMAGES / "tools.tar")
        # The VM tests' image (QEMU, a guest kernel, the probe's initramfs), when `make node` built it.
        self.vm_image = image_name(IMAGES / "vm.tar") if (IMAGES / "vm.tar").exists() else None
        self.start_seconds = 0.0

    # --- life cycle -------------------------------------------------------------------

    def start(self, timeout: float = 240) -> None:
        began = time.monotonic()
        clean_host()
        for directory in ("containerd", "cni/net.d", "cni/ipam", "kubelet", "pod-logs", "runc"):
            (STATE / directory).mkdir(parents=True, exist_ok=True)
        (STATE / "containerd" / "config.toml").write_text(
            containerd_configuration(self.pause_image, self.config.runtime_handlers))
        (STATE / "cni" / "net.d" / "10-kata-sizing.conflist").write_text(json.dumps(cni_configuration()))
        (STATE / "kubelet.yaml").write_text(yaml.safe_dump(
            kubelet_configuration(self.cp.state, self.kubelet_port, self.config.kubelet_config)))
        (STATE / "kube-proxy.yaml").write_text(yaml.safe_dump(
            kube_proxy_configuration(self.cp.state, free_port(), free_port())))
        (STATE / "kube-scheduler.yaml").write_text(yaml.safe_dump(kube_scheduler_configuration(self.cp.state)))

        self._spawn("containerd", "containerd", "--config", str(STATE / "containerd" / "config.toml"))
        poll(lambda: self._alive("containerd") and self.ctr("version", check=False).returncode == 0, 60,
             lambda: f"containerd answers on its socket\n{self.log_tail('containerd')}", interval=0.2)
        for archive in ("pause.tar", "tools.tar", *(("vm.tar",) if self.vm_image else ())):
            self.ctr("images", "import", str(IMAGES / archive))
        labels = ",".join(f"{k}={v}" for k, v in self.config.labels.items())
        # --housekeeping-interval: the kubelet's cAdvisor refreshes a pod's figures every 10 s by
        # default, backing off to 15 s while they do not change; here 1 s (the flag Kubernetes'
        # own node e2e tests set), so a test waiting for the kubelet to see a stand-in's memory
        # waits about a second, not up to 15 (about 55 s off the suite). The backing off to 15 s
        # stays, and the operator's reads keep their own 15 s minimum interval.
        self._spawn("kubelet", str(BINARY), "kubelet", f"--config={STATE / 'kubelet.yaml'}",
                    f"--kubeconfig={self.cp.state / 'node.kubeconfig'}", f"--node-ip={NODE_IP}",
                    f"--hostname-override={NODE_NAME}", f"--root-dir={STATE / 'kubelet'}",
                    f"--cert-dir={STATE / 'kubelet' / 'pki'}", f"--node-labels={labels}",
                    "--housekeeping-interval=1s", "--v=1")
        self._spawn("kube-scheduler", str(BINARY), "kube-scheduler", f"--config={STATE / 'kube-scheduler.yaml'}",
                    "--secure-port=0", "--v=1")
        self._spawn("kube-proxy", str(BINARY), "kube-proxy", f"--config={STATE / 'kube-proxy.yaml'}", "--v=1")

        def ready() -> bool:
            for name in self.processes:
                if not self._alive(name):
                    raise RuntimeError(f"{name} exited ({self.processes[name].returncode}):\n{self.log_tail(name)}")
            node = self.cp.get(f"/api/v1/nodes/{NODE_NAME}")
            if node is None:
                return False
            conditions = {c["type"]: c["status"] for c in node.get("status", {}).get("conditions", [])}
            taints = {t["key"] for t in node.get("spec", {}).get("taints", [])}
            return conditions.get("Ready") == "True" and "node.kubernetes.io/not-ready" not in taints
        poll(ready, timeout, lambda: f"node {NODE_NAME} Ready\n{self.log_tail('kubelet')}", interval=0.5)
        # kube-proxy has written the kubernetes Service's rules: pods reach the API server.
        poll(lambda: "default/kubernetes:https" in run("iptables-save", "-t", "nat").stdout, 60,
             lambda: f"kube-proxy's rules for the kubernetes Service\n{self.log_tail('kube-proxy')}", interval=0.5)
        self.start_seconds = time.monotonic() - began

    def stop(self) -> None:
        """Drain the node through the kubelet (CNI teardown, volume unmounts), stop every process,
        then remove whatever is left on the host."""
        try:
            if self._alive("kubelet"):
                self._drain()
        finally:
            for name in ("kube-proxy", "kube-scheduler", "kubelet", "containerd"):
                self._terminate(name)
            clean_host()

    def _drain(self, timeout: float = 90) -> None:
        selector = urllib.parse.quote(f"spec.nodeName={NODE_NAME}")
        pods = f"/api/v1/pods?fieldSelector={selector}"
        # Cordoned first, as `kubectl drain` does: the pods a Deployment replaces (the operator's
        # chart) stay Pending instead of landing on the node again (the drain waited out its
        # timeout until it did this).
        self.cp.merge_patch(f"/api/v1/nodes/{NODE_NAME}", {"spec": {"unschedulable": True}})
        for pod in self.cp.request("GET", pods)["items"]:
            meta = pod["metadata"]
            with contextlib.suppress(ApiError):
                self.cp.request("DELETE", f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}",
                                {"gracePeriodSeconds": 1})
        poll(lambda: not self.cp.request("GET", pods)["items"], timeout, "every pod of the node is gone")
        # The kubelet confirms a deletion once the containers are dead; the sandboxes (with
        # their network) are stopped right after.
        poll(lambda: not self.ctr("tasks", "list", "-q", check=False).stdout.split(), 60,
             lambda: f"containerd runs no task: {self.ctr('tasks', 'list', check=False).stdout}")

    def _spawn(self, name: str, *args: str) -> None:
        # Stopped by the kernel if the test session dies without tearing down (the next session
        # removes what their pods leave); in a session of its own, so a terminal's ^C reaches
        # pytest first and the teardown drains the node.
        orphan_guard = ("setpriv", "--pdeathsig", "TERM") if shutil.which("setpriv") else ()
        log = (self.logdir / f"{name}.log").open("ab")
        self.processes[name] = subprocess.Popen((*orphan_guard, *args), stdout=log, stderr=subprocess.STDOUT,
                                                stdin=subprocess.DEVNULL, start_new_session=True)
        log.close()

    def _alive(self, name: str) -> bool:
        process = self.processes.get(name)
        return process is not None and process.poll() is None

    def _terminate(self, name: str) -> None:
        process = self.processes.get(name)
        if process is not None:
            terminate(process)

    def log_tail(self, name: str, lines: int = 30) -> str:
        try:
            text = (self.logdir / f"{name}.log").read_text(errors="replace").splitlines()
        except FileNotFoundError:
            return ""
        return "\n".join(f"{name}: {line}" for line in text[-lines:])

    # --- what tests use ---------------------------------------------------------------

    def ctr(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        return run("ctr", "--address", str(self.containerd_socket), "--namespace", "k8s.io", *args, check=check)

    def kubectl(self, *args: str, **kwargs: Any) -> subprocess.CompletedProcess:
        return self.cp.kubectl(*args, **kwargs)

    def pod(self, name: str, *, namespace: str = "default", runtime_class: str | None = None,
            command: list[str] | None = None, limits: Mapping[str, str] | None = None,
            requests: Mapping[str, str] | None = None, **spec: Any) -> dict:
        """A pod of the tools image (never pulled) tolerating the node's taint; `command`
        defaults to `podtool pause` (sleeps, and exits at once on SIGTERM, where a shell's
        `sleep` as PID 1 ignores it until the grace period ends). Extra keyword arguments go
        into its spec."""
        resources = {k: dict(v) for k, v in (("limits", limits), ("requests", requests)) if v}
        container = {"name": "main", "image": self.tools_image, "imagePullPolicy": "Never",
                     "command": command or ["/podtool", "pause"], "resources": resources}
        body: dict[str, Any] = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace},
                "spec": {"containers": [container], "tolerations": [NODE_TOLERATION],
                         "terminationGracePeriodSeconds": 1, "restartPolicy": "Never", **spec}}
        if runtime_class:
            body["spec"]["runtimeClassName"] = runtime_class
        return body

    def namespace(self, name: str) -> str:
        """A new namespace, usable by pods: its default ServiceAccount and kube-root-ca.crt exist."""
        self.cp.create("/api/v1/namespaces", {"metadata": {"name": name}})
        poll(lambda: self.cp.get(f"/api/v1/namespaces/{name}/serviceaccounts/default"), 30,
             f"the default ServiceAccount of {name}")
        poll(lambda: self.cp.get(f"/api/v1/namespaces/{name}/configmaps/kube-root-ca.crt"), 30,
             f"kube-root-ca.crt in {name}")
        return name

    def delete_namespace(self, name: str, timeout: float = 90) -> None:
        """Delete its pods and wait until the kubelet has stopped them (the next test finds the
        node empty), then the namespace, without waiting: the namespace controller takes about
        5 s more to remove even an empty one."""
        pods = f"/api/v1/namespaces/{name}/pods"
        self.cp.request("DELETE", pods)
        poll(lambda: not self.cp.request("GET", pods)["items"], timeout, f"the pods of {name} gone")
        self.cp.delete(f"/api/v1/namespaces/{name}")

    def pod_path(self, pod: Mapping[str, Any]) -> str:
        return f"/api/v1/namespaces/{pod['metadata']['namespace']}/pods/{pod['metadata']['name']}"

    def run_pod(self, body: Mapping[str, Any], timeout: float = 60) -> dict:
        """Create the pod and wait until it is Running; return it as the API server has it."""
        self.cp.create(f"/api/v1/namespaces/{body['metadata']['namespace']}/pods", dict(body))
        return self.wait_pod(body, lambda p: p.get("status", {}).get("phase") == "Running", "Running", timeout)

    def wait_pod(self, pod: Mapping[str, Any], predicate, what: str, timeout: float = 60) -> dict:
        path = self.pod_path(pod)

        def met() -> dict | None:
            current = self.cp.get(path)
            if current is None:
                return None
            phase = current.get("status", {}).get("phase")
            if phase == "Failed" and what != "Failed":
                raise AssertionError(f"pod {path} failed: {json.dumps(current.get('status'))}\n{self.events(pod)}")
            return current if predicate(current) else None
        return poll(met, timeout, lambda: f"pod {path} {what}: {json.dumps((self.cp.get(path) or {}).get('status'))}"
                                          f"\n{self.events(pod)}", interval=0.2)

    def events(self, pod: Mapping[str, Any]) -> str:
        meta = pod["metadata"]
        selector = urllib.parse.quote(f"involvedObject.name={meta['name']}")
        items = self.cp.request("GET", f"/api/v1/namespaces/{meta['namespace']}/events?fieldSelector={selector}")["items"]
        return "\n".join(f"{e.get('type')} {e.get('reason')}: {e.get('message')}" for e in items)

    def pod_cgroup(self, pod: Mapping[str, Any], controller: str = "memory") -> Path:
        """The pod's cgroup on the host (cgroupfs driver: kubepods[/burstable|/besteffort]/pod<uid>)."""
        uid = pod["metadata"]["uid"]
        base = CGROUP_ROOT / controller / "kubepods"
        for candidate in (base / f"pod{uid}", base / "burstable" / f"pod{uid}", base / "besteffort" / f"pod{uid}"):
            if candidate.is_dir():
                return candidate
        raise AssertionError(f"no {controller} cgroup for pod {uid} under {base}")

    def hold_memory_in_pod(self, pod: Mapping[str, Any], mib: int) -> subprocess.Popen:
        """A host process in the pod's cgroup (every controller) holding `mib` MiB, as the
        shim, VMM and virtiofsd of a Kata sandbox sit in it with sandbox_cgroup_only; it joins
        before it allocates (cgroup v1 leaves earlier charges where they were made). The
        caller kills it; the kubelet kills it with the pod."""
        procs = [self.pod_cgroup(pod, controller) / "cgroup.procs" for controller in POD_CONTROLLERS]

        def join() -> None:
            for path in procs:
                path.write_text("0")  # "0" is the writing process: the child, before its exec
        return subprocess.Popen([str(PODTOOL), "hold", str(mib)], stdout=subprocess.PIPE, text=True,
                                preexec_fn=join)

    def allocatable(self) -> dict[str, str]:
        return self.cp.request("GET", f"/api/v1/nodes/{NODE_NAME}")["status"]["allocatable"]

    def stats_summary(self) -> dict:
        """The kubelet's Summary API, as a client with `nodes/proxy` reads it through the API server."""
        return self.cp.request("GET", f"/api/v1/nodes/{NODE_NAME}/proxy/stats/summary")


# --- leftovers on the host -------------------------------------------------------------------

def clean_host() -> None:
    """Remove what a node (this one, or one of a session that was killed) left on the host. Every
    step touches only what the node made: processes in the kubepods cgroups or naming a file
    of STATE, mounts under STATE, network namespaces holding an address of POD_CIDR,
    the iptables chains of kube-proxy, the kubelet and the bridge plugin, the bridge, the
    kubepods cgroups, STATE itself."""
    kill_pod_processes()
    state = f"{STATE}/"
    for pid, cmdline in processes():
        # Every process of the node names a file of STATE: containerd and the kubelet, scheduler
        # and kube-proxy their configuration, the shims containerd's socket.
        if state in cmdline:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    for mount in reversed(mounts_under(STATE)):
        run("umount", "-l", mount, check=False)
    pods = ipaddress.ip_network(POD_CIDR)
    for netns in Path("/run/netns").glob("cni-*"):
        words = run("ip", "-n", netns.name, "-4", "-o", "addr", check=False).stdout.split()
        addresses = [ipaddress.ip_interface(w).ip for w, prev in zip(words[1:], words) if prev == "inet"]
        if any(a in pods for a in addresses):
            run("ip", "netns", "delete", netns.name, check=False)
    remove_iptables_rules()
    run("ip", "link", "delete", BRIDGE, check=False)
    remove_kubepods_cgroups()
    for link in Path("/var/log/containers").glob("*.log"):
        if link.is_symlink() and str(STATE) in os.readlink(link):
            link.unlink()
    for cached in Path("/var/lib/cni/results").glob(f"{CNI_NETWORK}-*"):
        cached.unlink()
    shutil.rmtree(STATE, ignore_errors=True)
    # Directories the node's parts create outside STATE, when nothing else has put anything there.
    for directory in ("/run/containerd/s", "/run/containerd", "/var/log/containers", "/var/lib/cni/results",
                      "/var/lib/cni"):
        with contextlib.suppress(OSError):
            os.rmdir(directory)


def processes() -> Iterator[tuple[int, str]]:
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                yield int(entry.name), (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")


def kubepods_dirs(controller: str) -> list[Path]:
    """Every cgroup under kubepods in `controller`'s hierarchy, deepest first."""
    base = CGROUP_ROOT / controller / "kubepods"
    if not base.is_dir():
        return []
    return sorted((p for p in [base, *base.rglob("*")] if p.is_dir()), key=lambda p: len(p.parts), reverse=True)


def kill_pod_processes(timeout: float = 30) -> None:
    """SIGKILL every process in the kubepods cgroups (the pods' containers and sandboxes)."""
    deadline = time.monotonic() + timeout
    while True:
        pids = {int(pid) for d in kubepods_dirs("pids") for pid in (d / "cgroup.procs").read_text().split()}
        if not pids:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"processes of the kubepods cgroups survive SIGKILL: {sorted(pids)}")
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.1)


def remove_kubepods_cgroups() -> None:
    for controller in sorted(p.name for p in CGROUP_ROOT.iterdir() if p.is_dir()):  # "unified" too
        for directory in kubepods_dirs(controller):
            with contextlib.suppress(OSError):
                directory.rmdir()


def mounts_under(root: Path) -> list[str]:
    prefix = str(root) + "/"
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        mount_point = line.split()[4].encode().decode("unicode_escape")
        if mount_point.startswith(prefix) or mount_point == str(root):
            found.append(mount_point)
    return found


def remove_iptables_rules() -> None:
    """Every KUBE-* chain (kube-proxy's and the kubelet's: no other Kubernetes node runs on the
    machine, the node lock sees to that) and the bridge plugin's per-pod masquerade chains of
    CNI_NETWORK (a pod torn down normally removes its own), with the rules jumping to them,
    in IPv4 and IPv6."""
    marker = f'name: \\"{CNI_NETWORK}\\"'
    for family in ("iptables", "ip6tables"):
        table, rules, chains = "", [], []
        for line in run(f"{family}-save").stdout.splitlines():
            if line.startswith("*"):
                table = line[1:]
            elif line.startswith(":KUBE-"):
                chains.append((table, line[1:].split()[0]))
            elif line.startswith("-A ") and " -j " in line:
                words = shlex.split(line)
                chain, target = words[1], words[words.index("-j") + 1]
                ours = target.startswith("KUBE-") or (target.startswith("CNI-") and marker in line)
                if ours and not chain.startswith("KUBE-"):
                    rules.append((table, words[1:]))
                    if target.startswith("CNI-"):
                        chains.append((table, target))
        for table, rule in rules:
            run(family, "-t", table, "-D", *rule, check=False)
        for option in ("-F", "-X"):  # every chain emptied before any is deleted: they jump to each other
            for table, chain in chains:
                run(family, "-t", table, option, chain, check=False)


# --- fixtures --------------------------------------------------------------------------------

@pytest.fixture(scope="session")
def control_plane_address(request: pytest.FixtureRequest) -> Iterator[str]:
    """127.0.0.1, or NODE_IP when the session runs node tests on a machine that can run the node."""
    wants_node = any(item.get_closest_marker("node") for item in request.session.items)
    if not wants_node or host_problem() is not None:
        yield LOOPBACK
        return
    with node_address() as address:
        yield address


@pytest.fixture(scope="session")
def node_config() -> NodeConfig:
    """The session node's configuration; override this fixture to start it otherwise."""
    return NodeConfig()


@pytest.fixture(scope="session")
def real_node(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory,
              node_config: NodeConfig) -> Iterator[Node]:
    require_node(host_problem())  # before the control plane starts: a skip costs nothing
    cp: ControlPlane = request.getfixturevalue("control_plane")
    node = Node(cp, node_config, tmp_path_factory.mktemp("node"))
    with contextlib.ExitStack() as held:
        try:
            held.enter_context(flock(NODE_LOCK, fcntl.LOCK_EX, NODE_LOCK_WAIT_S, "the machine's node"))
        except TimeoutError as err:
            require_node(str(err))
        try:
            node.start()
            print(f"\nnode {node.name} Ready in {node.start_seconds:.1f}s")
            yield node
        finally:
            began = time.monotonic()
            node.stop()
            print(f"\nnode {node.name} stopped and its host state removed in {time.monotonic() - began:.1f}s")


@pytest.fixture
def node_namespace(real_node: Node, request: pytest.FixtureRequest) -> Iterator[str]:
    """A namespace of the test's own name on the real node, its pods stopped afterwards."""
    name = re.sub(r"[^a-z0-9-]", "-", request.node.name.lower())[:50].strip("-")
    real_node.namespace(name)
    try:
        yield name
    finally:
        real_node.delete_namespace(name)
