"""The operator on the real node: its image imported into the node's containerd and installed
by its own chart with `helm install`, as a user installs it. Used by tests/node/test_node_operator.py
and bench/node_bench.py.

- `guided_node_config()`: the session node's `NodeConfig` (tests/conftest.py overrides
  `node_config` with it). Its kubelet starts with the KubeletConfiguration fragment that
  `kata-sizing render --node-capacity ... --node-cpu ... --kubelet-version ...` gives for this
  machine's capacity and the node's kubelet for POLICY_FILE (the same core code the operator
  runs), and containerd maps the handlers of POLICY_FILE and SCHEDULING_HANDLER to runc.
- `OperatorRelease`: the chart installed in NAMESPACE with the webhook on (a TLS Secret and
  caBundle made here: cert-manager is not installed), the image's pull policy Never, the node's
  taint tolerated and its own shared admission policies (the chart's default); it reads the pods,
  the Lease, each replica's /metrics through the API server (pods/proxy) parsed with Prometheus'
  own parser, the pod's cgroup, and the requests the operator's ServiceAccount made (the API
  server's audit log).
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.support import image as img
from tests.support.operator_helpers import wait_for as poll
from tests.support.realcluster import BINARY, WRITE_VERBS, ApiError, AuditEvent
from tests.support.realnode import DEFAULT_RUNTIME_HANDLERS, NODE_TOLERATION, REQUIRE_ENV, ROOT, Node, NodeConfig

HELM = ROOT / ".tools" / "helm"
CHART = ROOT / "charts" / "kata-sizing"
POLICY_FILE = ROOT / "tests" / "fixtures" / "node" / "node-sizing.yaml"
# The one class of the policy the scheduling and pod-audit tests apply (kata-sizing-sched-<class>).
SCHEDULING_HANDLER = "kata-sizing-sched-only"

RELEASE = NAMESPACE = "kata-sizing-node"  # the release name already says kata-sizing: objects are named so
SA_USER = f"system:serviceaccount:{NAMESPACE}:{RELEASE}"
LEASE = f"/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/leases/kata-sizing"
TLS_SECRET = f"{RELEASE}-webhook-tls"
WEBHOOK_SERVICE = f"{RELEASE}-webhook"
METRICS_PORT = 8081  # the chart's metrics.port
SELECTOR = "app.kubernetes.io/name=kata-sizing,app.kubernetes.io/component=operator"
SHARED_SELECTOR = "katasizing.dev/shared=admission"
SHARED_ADMISSION_KINDS = ("validatingadmissionpolicies,mutatingadmissionpolicies,validatingadmissionpolicybindings,"
                          "mutatingadmissionpolicybindings")


# --- the node's configuration from the operator's own guidance ------------------------------

def machine_capacity() -> tuple[str, str]:
    """The memory and CPU capacity the kubelet reports for this machine: MemTotal of
    /proc/meminfo (cAdvisor's machine memory) and the logical CPUs."""
    meminfo = Path("/proc/meminfo").read_text()
    found = re.search(r"^MemTotal:\s+(\d+) kB$", meminfo, re.M)
    assert found is not None, "no MemTotal in /proc/meminfo"
    kib = int(found[1])
    return f"{kib}Ki", str(os.cpu_count())


def kubelet_version() -> str:
    """The node's kubelet version (v1.37.2), as it will report it in status.nodeInfo."""
    out = subprocess.run([str(BINARY), "kubelet", "--version"], capture_output=True, text=True, timeout=60,
                         check=True).stdout
    return out.split()[-1]


def cli(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    """`kata-sizing ARGS` as a user runs it."""
    proc = subprocess.run([sys.executable, "-m", "kata_sizing.cli", *args], capture_output=True, text=True,
                          timeout=60)
    if check and proc.returncode != 0:
        raise AssertionError(f"kata-sizing {' '.join(args)} exited {proc.returncode}:\n{proc.stderr}")
    return proc


def rendered(policy: Path = POLICY_FILE, *args: str) -> list[dict]:
    return [d for d in yaml.safe_load_all(cli("render", str(policy), *args).stdout) if d]


def rendered_guidance(policy: Path = POLICY_FILE) -> dict:
    """The node guidance `kata-sizing render` gives POLICY for this machine and its kubelet,
    before any node exists: the document of its one node group."""
    memory, cpu = machine_capacity()
    (configmap,) = [d for d in rendered(policy, "--node-capacity", memory, "--node-cpu", cpu,
                                        "--kubelet-version", kubelet_version())
                    if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("-node-guidance")]
    (document,) = [yaml.safe_load(v) for k, v in configmap["data"].items() if k.endswith(".yaml")]
    return document


def policy_runtime_classes(policy: Path = POLICY_FILE) -> dict[str, dict]:
    return {d["metadata"]["name"]: d for d in rendered(policy) if d["kind"] == "RuntimeClass"}


def guided_node_config() -> NodeConfig:
    """The kubelet with the reservations (and feature gates) guidance gives for this machine;
    containerd with runc behind the policy's handlers."""
    fragment = {k: v for k, v in rendered_guidance()["kubeletConfiguration"].items()
                if k not in ("apiVersion", "kind")}
    handlers = tuple(rc["handler"] for rc in policy_runtime_classes().values())
    return NodeConfig(kubelet_config=fragment,
                      runtime_handlers=(*DEFAULT_RUNTIME_HANDLERS, *handlers, SCHEDULING_HANDLER))


# --- the chart on the node -------------------------------------------------------------------

def require_image() -> None:
    """Skip with one line when the operator's image is not built (`make image`); a failure where
    the image or the node is required (.ci/run)."""
    if img.ARCHIVE.exists():
        return
    reason = f"the operator image {img.ARCHIVE.relative_to(ROOT)} is not built (`make image`): node operator tests skipped"
    if os.environ.get(REQUIRE_ENV) == "1" or os.environ.get(img.REQUIRE_ENV) == "1":
        pytest.fail(reason)
    pytest.skip(reason)


def serving_certificate(names: list[str], ips: Sequence[str] = ()) -> tuple[bytes, bytes]:
    """A self-signed certificate (also its own CA, as the chart's caBundle takes it) for `names`
    and the addresses `ips`."""
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[0])])
    now = datetime.now(UTC)
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - timedelta(minutes=5)).not_valid_after(now + timedelta(hours=6))
            .add_extension(x509.SubjectAlternativeName([*(x509.DNSName(n) for n in names),
                                                        *(x509.IPAddress(ipaddress.ip_address(a)) for a in ips)]),
                           critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .sign(key, hashes.SHA256()))
    return (cert.public_bytes(serialization.Encoding.PEM),
            key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                              serialization.NoEncryption()))


def metric_samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of an exposition, parsed by Prometheus' own client parser."""
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


ADMISSION_COLLECTIONS = ("validatingadmissionpolicies", "validatingadmissionpolicybindings",
                         "mutatingadmissionpolicies", "mutatingadmissionpolicybindings")


def cached_objects(cp) -> dict[str, int]:
    """What each of the operator's list+watch caches must hold (kata_sizing_informer_objects),
    counted from the API server: every Node, RuntimeClass and admission object, the ConfigMaps
    labelled managed-by kata-sizing, and every Namespace (the release serves the routing webhook,
    which reads namespaces' labels from its cache). (The pod cache keeps only some pods: not
    counted here.)"""
    group = "/apis/admissionregistration.k8s.io/v1"
    return {
        "namespaces": len(cp.items("/api/v1/namespaces")),
        "nodes": len(cp.items("/api/v1/nodes")),
        "runtimeclasses": len(cp.items("/apis/node.k8s.io/v1/runtimeclasses")),
        "configmaps": len(cp.request("GET", "/api/v1/configmaps?labelSelector=app.kubernetes.io%2Fmanaged-by%3D"
                                            "kata-sizing")["items"]),
        **{f"admissionregistration.k8s.io/v1/{plural}": len(cp.items(f"{group}/{plural}"))
           for plural in ADMISSION_COLLECTIONS},
    }


def informer_objects(samples: Mapping) -> dict[str, float]:
    return {dict(labels)["collection"]: v for (name, labels), v in samples.items()
            if name == "kata_sizing_informer_objects" and dict(labels)["collection"] != "pods"}


def total(samples: Mapping, metric: str, **labels: str) -> float:
    """The sum of a metric's samples whose labels include `labels` (0 when it has none)."""
    return sum(v for (name, have), v in samples.items()
               if name == metric and labels.items() <= dict(have).items())


def policy_gauges(samples: Mapping) -> dict[tuple[str, str], float]:
    return {(dict(labels)["condition"], dict(labels)["status"]): v for (name, labels), v in samples.items()
            if name == "kata_sizing_policies"}


class OperatorRelease:
    """The chart's release on the session's node (see the module docstring)."""

    def __init__(self, node: Node, workdir: Path) -> None:
        self.node, self.cp, self.workdir = node, node.cp, workdir
        self.image_name = ""
        self.ca_bundle = ""
        self.import_seconds = self.install_seconds = 0.0
        self.audit_start = node.cp.audit_offset()  # the audit log from here on is this release's

    # --- install -------------------------------------------------------------------------

    def import_image(self) -> str:
        """`ctr -n k8s.io images import` of the archive `make image` wrote; the name containerd
        gave it (the archive's org.opencontainers.image.ref.name), which the chart must name."""
        began = time.monotonic()
        before = set(self.node.ctr("images", "list", "-q").stdout.split())
        self.node.ctr("images", "import", str(img.ARCHIVE))
        added = set(self.node.ctr("images", "list", "-q").stdout.split()) - before
        self.import_seconds = time.monotonic() - began
        self.image_name = next((n for n in added if not n.startswith("sha256:")), "")
        return self.image_name

    def prepare_namespace(self) -> None:
        """The namespace and the webhook's TLS Secret, made as a user without cert-manager makes
        them (the chart's webhook.caBundle and tlsSecretName)."""
        self.cp.create("/api/v1/namespaces", {"metadata": {"name": NAMESPACE}})
        service = f"{WEBHOOK_SERVICE}.{NAMESPACE}.svc"
        cert, key = serving_certificate([service, f"{service}.cluster.local"])
        self.cp.create(f"/api/v1/namespaces/{NAMESPACE}/secrets", {
            "metadata": {"name": TLS_SECRET}, "type": "kubernetes.io/tls",
            "data": {"tls.crt": base64.b64encode(cert).decode(), "tls.key": base64.b64encode(key).decode()}})
        self.ca_bundle = base64.b64encode(cert).decode()

    def values(self, **overrides: Any) -> Path:
        values = {
            "image": {"pullPolicy": "Never"},  # imported, never pulled: there is no registry
            "tolerations": [NODE_TOLERATION],
            "webhook": {"enabled": True, "certManager": {"enabled": False}, "caBundle": self.ca_bundle,
                        "tlsSecretName": TLS_SECRET},
            # admissionPolicies left at the chart's default: the release creates the shared
            # admission policies (the session's install steps aside while it runs: installed_release).
            **overrides,
        }
        path = self.workdir / f"values-{len(list(self.workdir.glob('values-*')))}.yaml"
        path.write_text(yaml.safe_dump(values))
        return path

    def helm(self, *args: str, timeout: float = 240) -> subprocess.CompletedProcess:
        proc = subprocess.run([str(HELM), *args, f"--kubeconfig={self.cp.admin_kubeconfig}"],
                              capture_output=True, text=True, timeout=timeout)
        if proc.returncode != 0:
            raise AssertionError(f"helm {' '.join(args)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
        return proc

    def install(self, values: Path) -> None:
        began = time.monotonic()
        self.helm("install", RELEASE, str(CHART), "--namespace", NAMESPACE, "--values", str(values),
                  "--wait", "--timeout", "180s")
        self.install_seconds = time.monotonic() - began

    def upgrade(self, values: Path) -> None:
        self.helm("upgrade", RELEASE, str(CHART), "--namespace", NAMESPACE, "--values", str(values),
                  "--wait", "--timeout", "180s")

    def helm_started(self, action: str, values: Path) -> subprocess.Popen:
        """`helm install|upgrade --wait` running in the background (stdout and stderr in .stdout)."""
        return subprocess.Popen([str(HELM), action, RELEASE, str(CHART), "--namespace", NAMESPACE,
                                 "--values", str(values), "--wait", "--timeout", "180s",
                                 f"--kubeconfig={self.cp.admin_kubeconfig}"],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    def uninstall(self) -> None:
        """The documented order: policies first (in the foreground: their objects go with them),
        then the release."""
        self.cp.kubectl("delete", "ksp", "--all", "--cascade=foreground", "--timeout=90s")
        self.helm("uninstall", RELEASE, "--namespace", NAMESPACE, "--wait", "--timeout", "120s")
        self.node.delete_namespace(NAMESPACE)

    # The shared admission policies: the chart's, for the release's lifetime. The session's install
    # (`kubectl apply -k manifests/`) made them first, and Helm adopts no object it did not create.

    def take_over_shared_admission(self) -> None:
        self.cp.kubectl("delete", SHARED_ADMISSION_KINDS, "-l", SHARED_SELECTOR, "--wait")

    def give_back_shared_admission(self) -> None:
        self.cp.kubectl("delete", SHARED_ADMISSION_KINDS, "-l", SHARED_SELECTOR, "--ignore-not-found")
        self.cp.kubectl("apply", "-k", str(ROOT / "manifests" / "admission"))

    # --- what runs -----------------------------------------------------------------------

    def pods(self) -> list[dict]:
        """The operator's pods that are not being deleted, by name."""
        found = self.cp.request("GET", f"/api/v1/namespaces/{NAMESPACE}/pods?labelSelector={SELECTOR}")["items"]
        return sorted((p for p in found if not p["metadata"].get("deletionTimestamp")),
                      key=lambda p: p["metadata"]["name"])

    def all_pods(self) -> list[dict]:
        return self.cp.request("GET", f"/api/v1/namespaces/{NAMESPACE}/pods?labelSelector={SELECTOR}")["items"]

    @staticmethod
    def ready(pod: Mapping) -> bool:
        conditions = {c["type"]: c["status"] for c in pod.get("status", {}).get("conditions", [])}
        return pod.get("status", {}).get("phase") == "Running" and conditions.get("Ready") == "True"

    def wait_ready(self, count: int = 2, timeout: float = 120) -> list[dict]:
        """Exactly `count` operator pods, all Running and Ready, and no other (a rolled-out one
        still terminating counts as other)."""
        def settled() -> list[dict] | None:
            pods = self.all_pods()
            return pods if len(pods) == count and all(map(self.ready, pods)) else None
        return poll(settled, timeout, lambda: f"{count} operator pods Ready: "
                    f"{[(p['metadata']['name'], p['status'].get('phase')) for p in self.all_pods()]}", interval=0.5)

    def lease(self) -> dict:
        return (self.cp.get(LEASE) or {}).get("spec") or {}

    def leader(self) -> str:
        """The pod holding the Lease (its identity is <pod name>_<random suffix>)."""
        holder = self.lease().get("holderIdentity") or ""
        return holder.rsplit("_", 1)[0] if "_" in holder else ""

    def raw(self, path: str) -> str:
        return self.node.kubectl("get", "--raw", path).stdout

    def scrape(self, pod: str) -> dict:
        """One replica's /metrics, through the API server's pods/proxy, parsed by Prometheus' parser."""
        return metric_samples(self.raw(f"/api/v1/namespaces/{NAMESPACE}/pods/{pod}:{METRICS_PORT}/proxy/metrics"))

    def readyz(self, pod: str) -> str:
        return self.raw(f"/api/v1/namespaces/{NAMESPACE}/pods/{pod}:{METRICS_PORT}/proxy/readyz")

    def peak_memory_bytes(self, pod: Mapping) -> int:
        """The pod's peak memory, from its cgroup (cgroup v1: memory.max_usage_in_bytes)."""
        return int((self.node.pod_cgroup(pod, "memory") / "memory.max_usage_in_bytes").read_text())

    def log(self, pod: str) -> str:
        return self.node.kubectl("logs", "-n", NAMESPACE, pod, check=False).stdout

    # --- what the operator's ServiceAccount did ------------------------------------------

    def requests(self, since: int = 0) -> list[AuditEvent]:
        return self.cp.operator_requests(since, SA_USER)

    def forbidden(self, since: int = 0) -> list[AuditEvent]:
        return [e for e in self.requests(since) if e.code == 403]

    def writes_per_object(self, since: int = 0) -> Counter:
        """Writes per object (resource, namespace, name) by the operator's identity, the Lease's
        renewals and the events it posts (each a new object) aside."""
        return Counter((e.resource, e.namespace, e.name) for e in self.requests(since)
                       if e.verb in WRITE_VERBS and e.resource not in ("leases", "events"))


@contextlib.contextmanager
def installed_release(node: Node, workdir: Path, apply_first: Sequence[dict] = ()) -> Iterator[OperatorRelease]:
    """The image imported, the namespace and Secret made, `apply_first` applied (the operator
    then finds them when it starts), the chart installed and both replicas Ready; uninstalled
    (policies first, in the foreground) on exit."""
    require_image()
    release = OperatorRelease(node, workdir)
    name = release.import_image()
    assert name == img.IMAGE_REF, f"containerd named the imported image {name!r}, the chart runs {img.IMAGE_REF!r}"
    release.prepare_namespace()
    release.take_over_shared_admission()
    try:
        if apply_first:
            node.cp.apply(*apply_first)
        release.install(release.values())
        yield release
    finally:
        with contextlib.suppress(AssertionError, ApiError):
            release.uninstall()
        release.give_back_shared_admission()


def events(cp, reason: str | None = None, since: str = "") -> list[dict]:
    """Events about KataSizingPolicies (kopf posts them into "default"), oldest first."""
    found = cp.request("GET", "/api/v1/namespaces/default/events")["items"]
    chosen = [e for e in found if (e.get("involvedObject") or {}).get("kind") == "KataSizingPolicy"
              and (reason is None or e.get("reason") == reason)
              and (e.get("lastTimestamp") or e.get("eventTime") or "") >= since]
    return sorted(chosen, key=lambda e: e.get("lastTimestamp") or e.get("eventTime") or "")


def to_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True)
