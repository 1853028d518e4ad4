"""A real Kubernetes control plane for the tests, and the operator run against it.

`make controlplane` builds `.tools/controlplane` from tests/controlplane/ (embedded etcd, the
real kube-apiserver v1.37.2 with Node and RBAC authorization and the default admission plugins
plus NodeRestriction, and the kube-controller-manager's controllers a Deployment needs). This
plugin starts it once per test session on free ports of 127.0.0.1 (of the node's address
when the session runs node tests: tests/support/realnode.py), installs kata-sizing with the real
`kubectl apply -k manifests/`, and gives the tests:

- `control_plane`: a `ControlPlane` (admin REST calls, `kubectl`, the API server's audit log of
  every request made with the operator's ServiceAccount identity);
- `real_operator`: a `RealOperator` not yet started; `start()` runs `kata-sizing operator` as a
  subprocess with the ServiceAccount's token, so the real authorizer enforces the ClusterRole.
  At the end of each test the operator's policies are deleted (the garbage collector removes
  what the operator made), it is stopped, and the test fails if the API server answered any of
  its requests with 403.

Without the binary (no Go on the machine) the tests that use it skip with one reason; with
KATA_SIZING_REQUIRE_CONTROLPLANE=1 (set by .ci/run) that skip is a failure instead.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import pytest
import yaml

from tests.support.operator_helpers import terminate
from tests.support.operator_helpers import wait_for as poll
from tests.support.paths import ROOT
from tests.support.policies import explicit_classes_policy

BINARY = ROOT / ".tools" / "controlplane"
KUBECTL = ROOT / ".tools" / "kubectl"
OPERATOR_NAMESPACE = "kata-sizing"
OPERATOR_SA = "kata-sizing"
OPERATOR_USER = f"system:serviceaccount:{OPERATOR_NAMESPACE}:{OPERATOR_SA}"
CRD_NAME = "katasizingpolicies.katasizing.dev"
REQUIRE_ENV = "KATA_SIZING_REQUIRE_CONTROLPLANE"
WRITE_VERBS = frozenset({"create", "update", "patch", "delete", "deletecollection"})

POLICIES = "/apis/katasizing.dev/v1alpha1/katasizingpolicies"
RUNTIME_CLASSES = "/apis/node.k8s.io/v1/runtimeclasses"

def configmaps(namespace: str = OPERATOR_NAMESPACE) -> str:
    return f"/api/v1/namespaces/{namespace}/configmaps"


LOOPBACK = "127.0.0.1"


def free_port(address: str = LOOPBACK) -> int:
    with socket.socket() as sock:
        sock.bind((address, 0))
        return sock.getsockname()[1]


class ApiError(Exception):
    def __init__(self, status: int, body: dict | str) -> None:
        self.status, self.body = status, body
        message = body.get("message") if isinstance(body, dict) else body
        super().__init__(f"HTTP {status}: {message}")


@dataclass(frozen=True)
class AuditEvent:
    """One request the operator's identity made, as the API server's audit log saw it."""

    verb: str
    group: str
    resource: str  # with "/subresource" where there is one
    namespace: str
    name: str
    code: int
    uri: str
    user_agent: str = ""  # replicas name themselves here (kata-sizing/<identity>)
    source_ips: tuple[str, ...] = ()  # where the request came from (a pod's IP when run in a pod)
    # The request's body where the audit policy records it (a policy's status patches).
    request: Any = field(default=None, compare=False)

    @property
    def permission(self) -> tuple[str, str, str]:
        return self.group, self.resource, self.verb


class ControlPlane:
    """The running control plane: admin REST calls, kubectl, the operator's audit trail."""

    def __init__(self, workdir: Path, apiserver_args: tuple[str, ...] = (), address: str = LOOPBACK) -> None:
        self.workdir = workdir
        self.apiserver_args = apiserver_args
        self.address = address  # the API server binds and advertises here
        self.state = workdir / "state"
        self.log_path = workdir / "controlplane.log"
        self.etcd_port, self.api_port = free_port(), free_port(address)
        self.url = f"https://{address}:{self.api_port}"
        self.process: subprocess.Popen | None = None
        self.admin_kubeconfig = self.state / "admin.kubeconfig"
        self.operator_kubeconfig = workdir / "operator.kubeconfig"
        self.audit_path = self.state / "audit.log"

    # --- life cycle ---------------------------------------------------------------------

    def start(self, timeout: float = 180) -> None:
        log = self.log_path.open("wb")
        # Stopped by the kernel if the test session dies without tearing down (a killed pytest
        # left the whole control plane running, holding its ports).
        orphan_guard = ["setpriv", "--pdeathsig", "TERM"] if shutil.which("setpriv") else []
        process = self.process = subprocess.Popen(
            [*orphan_guard, str(BINARY), "--dir", str(self.state), "--etcd-port", str(self.etcd_port),
             "--apiserver-port", str(self.api_port), "--address", self.address, "--sa-user", OPERATOR_USER,
             "--", *self.apiserver_args],
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        )
        log.close()
        poll(lambda: process.poll() is not None or b"controlplane ready" in self.log_path.read_bytes(),
             timeout, "the control plane printed 'controlplane ready'", interval=0.2)
        if process.poll() is not None:
            raise RuntimeError(f"the control plane exited ({process.returncode}):\n{self.log_tail()}")
        self._ssl = ssl.create_default_context(cafile=str(self.state / "ca.crt"))
        self._admin_token = (self.state / "admin.token").read_text().strip()
        # JSON (which is YAML): every string quoted, so a hex token like 1234e5678 is never read as
        # a number by a Go-compatible reader (the operator refused such a kubeconfig now and then).
        self.operator_kubeconfig.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "operator",
            "clusters": [{"name": "controlplane", "cluster": {
                "server": self.url, "certificate-authority": str(self.state / "ca.crt")}}],
            "users": [{"name": "operator", "user": {
                "token": (self.state / "operator.token").read_text().strip()}}],
            "contexts": [{"name": "operator", "context": {"cluster": "controlplane", "user": "operator"}}],
        }))

    def stop(self) -> None:
        if self.process is not None:
            terminate(self.process, 30)

    def install(self) -> None:
        """What the README tells a user: `kubectl apply -k manifests/`, then wait for the CRD."""
        self.kubectl("apply", "-k", str(ROOT / "manifests"))
        self.kubectl("wait", "--for=condition=Established", f"crd/{CRD_NAME}", "--timeout=60s")
        # Established is not yet servable: the first lists answer 429 "storage is (re)initializing"
        # for a moment (the operator retries that; the tests should not race it).
        poll(lambda: self.kubectl("get", "ksp", check=False).returncode == 0, 30, "kubectl get ksp works")

    def log_tail(self, lines: int = 40) -> str:
        """The last lines of the control plane's log that are not klog info lines."""
        try:
            text = self.log_path.read_text(errors="replace").splitlines()
        except FileNotFoundError:
            return ""
        return "\n".join([line for line in text if not line.startswith("I")][-lines:])

    def compact_etcd(self) -> None:
        """Compact etcd at its current revision: every watch from an older revision gets 410 Gone."""
        before = self.log_path.read_bytes().count(b"compacted etcd")
        assert self.process is not None, "the control plane is not running"
        self.process.send_signal(signal.SIGUSR1)
        poll(lambda: self.log_path.read_bytes().count(b"compacted etcd") > before, 10, "etcd compacted")

    # --- admin access -------------------------------------------------------------------

    def request(self, method: str, path: str, body: Any = None,
                content_type: str = "application/json") -> dict:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method, headers={
            "Authorization": f"Bearer {self._admin_token}", "Content-Type": content_type,
            "Accept": "application/json"})
        try:
            with urllib.request.urlopen(req, context=self._ssl, timeout=30) as resp:
                return json.loads(resp.read() or b"{}")
        except urllib.error.HTTPError as err:
            raw = err.read()
            try:
                detail: dict | str = json.loads(raw)
            except ValueError:
                detail = raw.decode(errors="replace")
            raise ApiError(err.code, detail) from None

    @property
    def admin_token(self) -> str:
        return self._admin_token

    def client_ssl(self) -> ssl.SSLContext:
        """A TLS context that trusts the control plane's CA (for clients of the tests' own)."""
        return ssl.create_default_context(cafile=str(self.state / "ca.crt"))

    def text(self, path: str) -> str:
        """A GET of a path that answers text (the API server's /metrics), as the admin."""
        req = urllib.request.Request(self.url + path, headers={"Authorization": f"Bearer {self._admin_token}"})
        with urllib.request.urlopen(req, context=self._ssl, timeout=30) as resp:
            return resp.read().decode()

    def get(self, path: str) -> dict | None:
        try:
            return self.request("GET", path)
        except ApiError as err:
            if err.status == 404:
                return None
            raise

    def read(self, path: str) -> dict:
        """A GET of an object the test needs there: its absence fails the test, saying which."""
        found = self.get(path)
        assert found is not None, f"{path} does not exist"
        return found

    def items(self, path: str, label_selector: str | None = None) -> dict[str, dict]:
        query = f"?labelSelector={urllib.parse.quote(label_selector)}" if label_selector else ""
        return {o["metadata"]["name"]: o for o in self.request("GET", path + query)["items"]}

    def create(self, path: str, body: dict) -> dict:
        return self.request("POST", path, body)

    def replace(self, path: str, body: dict) -> dict:
        return self.request("PUT", f"{path}/{body['metadata']['name']}", body)

    def merge_patch(self, path: str, patch: dict) -> dict:
        return self.request("PATCH", path, patch, "application/merge-patch+json")

    def delete(self, path: str) -> None:
        try:
            self.request("DELETE", path)
        except ApiError as err:
            if err.status != 404:
                raise

    def edit(self, path: str, change: Callable[[dict], None]) -> dict:
        """A hand edit (`kubectl edit`): read, change, write back with the read resourceVersion."""
        body = self.get(path)
        assert body is not None, f"{path} does not exist"
        change(body)
        return self.request("PUT", path, body)

    def kubectl(self, *args: str, input: str | None = None, check: bool = True,
                as_operator: bool = False, timeout: float = 90) -> subprocess.CompletedProcess:
        kubeconfig = self.operator_kubeconfig if as_operator else self.admin_kubeconfig
        proc = subprocess.run(
            [str(KUBECTL), f"--kubeconfig={kubeconfig}", *args], input=input, capture_output=True,
            text=True, timeout=timeout)
        if check and proc.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} exited {proc.returncode}:\n{proc.stderr}")
        return proc

    def apply(self, *documents: dict, check: bool = True) -> subprocess.CompletedProcess:
        return self.kubectl("apply", "-f", "-", input=yaml.safe_dump_all(documents), check=check)

    # --- what the operator's identity did -----------------------------------------------

    def audit_offset(self) -> int:
        try:
            return self.audit_path.stat().st_size
        except FileNotFoundError:
            return 0

    def audit_entries(self, since: int = 0) -> list[dict]:
        """The audit log's entries from byte `since` on (`audit_offset()` marks a point). The API
        server may be writing a line as it is read: a line not yet ended is left for the next
        read, and one that `since` cut (the mark was taken mid-write) belongs before it."""
        try:
            with self.audit_path.open("rb") as f:
                cut = False
                if since > 0:
                    f.seek(since - 1)
                    cut = f.read(1) != b"\n"
                raw = f.read()
        except FileNotFoundError:
            return []
        lines = raw.split(b"\n")[:-1]  # the last piece is not ended (or empty)
        return [json.loads(line) for line in lines[1 if cut else 0:] if line]

    def operator_requests(self, since: int = 0, user: str = OPERATOR_USER) -> list[AuditEvent]:
        """Every completed request made with the operator's identity (or `user`, another
        ServiceAccount's), from byte `since` on."""
        events = []
        for entry in self.audit_entries(since):
            # A watch is logged when its response starts (it may never complete); the rest when done.
            stage = "ResponseStarted" if entry.get("verb") == "watch" else "ResponseComplete"
            if entry.get("stage") not in (stage, "Panic"):
                continue
            if (entry.get("user") or {}).get("username") != user:
                continue
            ref = entry.get("objectRef") or {}
            resource = ref.get("resource", "")
            if ref.get("subresource"):
                resource = f"{resource}/{ref['subresource']}"
            events.append(AuditEvent(
                verb=entry["verb"], group=ref.get("apiGroup", ""), resource=resource,
                namespace=ref.get("namespace", ""), name=ref.get("name", ""),
                code=(entry.get("responseStatus") or {}).get("code", 0), uri=entry.get("requestURI", ""),
                user_agent=entry.get("userAgent", ""), source_ips=tuple(entry.get("sourceIPs") or ()),
                request=entry.get("requestObject")))
        return events

    def operator_writes(self, since: int = 0, resource: str | None = None,
                        user: str = OPERATOR_USER) -> list[AuditEvent]:
        return [e for e in self.operator_requests(since, user)
                if e.verb in WRITE_VERBS and (resource is None or e.resource == resource)]


class OperatorProcess:
    """`kata-sizing operator` as a subprocess, with the kubeconfig given (the emulator's, or the
    operator ServiceAccount's on the real control plane: `RealOperator`)."""

    def __init__(self, kubeconfig: Path, workdir: Path) -> None:
        self.kubeconfig = kubeconfig
        self.workdir = workdir
        self.process: subprocess.Popen | None = None
        self.log_path = workdir / "operator.log"
        self._log_handle: IO[bytes] | None = None

    def start(self, *args: str, resync_s: float = 300, guidance_s: float = 1, **env: str) -> OperatorProcess:
        assert self.process is None, "the operator is already running"
        health = free_port()
        full_env = {
            **os.environ, "KUBECONFIG": str(self.kubeconfig),
            "KATA_SIZING_RESYNC_SECONDS": str(resync_s), "KATA_SIZING_GUIDANCE_SECONDS": str(guidance_s),
            "PYTHONUNBUFFERED": "1", **env,
        }
        self._log_handle = self.log_path.open("ab")
        process = self.process = subprocess.Popen(
            [sys.executable, "-m", "kata_sizing.cli", "operator", "--standalone",
             "--liveness", f"http://127.0.0.1:{health}/healthz", *args],
            env=full_env, stdout=self._log_handle, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        )

        def healthy() -> bool:
            if process.poll() is not None:
                raise AssertionError(f"the operator exited ({process.returncode}):\n{self.log()[-3000:]}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{health}/healthz", timeout=1) as resp:
                    return resp.status == 200
            except OSError:
                return False
        poll(healthy, 30, "the operator's liveness endpoint answers 200", interval=0.1)
        return self

    def stop(self) -> int | None:
        """SIGTERM (SIGKILL after 20 s); the exit code, None if it was not running."""
        process, self.process = self.process, None
        if process is None:
            return None
        terminate(process)
        if self._log_handle is not None:
            self._log_handle.close()
        return process.returncode

    def kill(self) -> None:
        """SIGKILL, as a node that dies takes its pod: no cleanup, the Lease is not released."""
        assert self.process is not None, "the operator is not running"
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(10)

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""


class RealOperator(OperatorProcess):
    """`kata-sizing operator` with the operator ServiceAccount's identity on the real control
    plane: the real authorizer enforces its ClusterRole, the audit log records what it did."""

    def __init__(self, control_plane: ControlPlane, workdir: Path) -> None:
        super().__init__(control_plane.operator_kubeconfig, workdir)
        self.cp = control_plane
        self.started_at_offset = 0

    def start(self, *args: str, resync_s: float = 300, guidance_s: float = 1, **env: str) -> RealOperator:
        self.started_at_offset = self.cp.audit_offset()
        super().start(*args, resync_s=resync_s, guidance_s=guidance_s, **env)
        return self

    def forbidden(self, since: int = 0) -> list[AuditEvent]:
        return [e for e in self.cp.operator_requests(since) if e.code == 403]


# --- a policy and its objects as a user sees them on the real server ---------------------------


def render(policy: dict, tmp_path: Path) -> dict[tuple[str, str], dict]:
    """`kata-sizing render -o json` of the policy: {(kind, name): object}."""
    path = tmp_path / f"{policy['metadata']['name']}-render.yaml"
    path.write_text(yaml.safe_dump(policy))
    out = subprocess.run([sys.executable, "-m", "kata_sizing.cli", "render", str(path), "-o", "json"],
                         capture_output=True, text=True, check=True).stdout
    parsed = json.loads(out)
    items = parsed["items"] if isinstance(parsed, dict) and "items" in parsed else parsed
    return {(o["kind"], o["metadata"]["name"]): o for o in items}


def status(cp: ControlPlane, name: str) -> dict:
    return (cp.get(f"{POLICIES}/{name}") or {}).get("status") or {}


def conditions(cp: ControlPlane, name: str) -> dict[str, str]:
    return {c["type"]: c["status"] for c in status(cp, name).get("conditions") or []}


def wait_observed(cp: ControlPlane, name: str, timeout: float = 20, **expected: str) -> dict:
    def done() -> bool:
        body = cp.get(f"{POLICIES}/{name}") or {}
        st = body.get("status") or {}
        if st.get("observedGeneration") != body.get("metadata", {}).get("generation"):
            return False
        found = {c["type"]: c["status"] for c in st.get("conditions") or []}
        return all(found.get(k) == v for k, v in expected.items())
    poll(done, timeout, lambda: f"status of {name}: {status(cp, name)}")
    return status(cp, name)


def rc_path(name: str) -> str:
    return f"{RUNTIME_CLASSES}/{name}"


def cm_path(name: str) -> str:
    return f"{configmaps(OPERATOR_NAMESPACE)}/{name}"


def runtime_classes(cp: ControlPlane, policy: str) -> dict[str, dict]:
    return cp.items(RUNTIME_CLASSES, f"katasizing.dev/policy={policy}")


def policy_configmaps(cp: ControlPlane, policy: str) -> dict[str, dict]:
    return cp.items(configmaps(OPERATOR_NAMESPACE), f"katasizing.dev/policy={policy}")


def pod_fixed(cp: ControlPlane, name: str) -> dict | None:
    return ((cp.get(rc_path(name)) or {}).get("overhead") or {}).get("podFixed")


def versions(objects: dict[str, dict]) -> dict[str, str]:
    return {name: o["metadata"]["resourceVersion"] for name, o in objects.items()}


def quiet(cp: ControlPlane, seconds: float = 1.5, timeout: float = 20) -> None:
    """Wait until the operator has made no write for `seconds` (renewing its Lease aside)."""
    deadline = time.monotonic() + timeout
    while True:
        mark = cp.audit_offset()
        time.sleep(seconds)
        if not [w for w in cp.operator_writes(mark) if w.resource != "leases"]:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"the operator kept writing: {cp.operator_writes(mark)[-5:]}")


def create_ready(cp: ControlPlane, body: dict) -> dict:
    cp.apply(body)
    return wait_observed(cp, body["metadata"]["name"], Ready="True")


def qemu_rs(name: str = "qemu-rs", **spec) -> dict:
    return explicit_classes_policy(name, **spec)


# --- fixtures --------------------------------------------------------------------------------


def require_binary() -> None:
    if not BINARY.exists():
        reason = ("the real control plane is not built (.tools/controlplane; `make controlplane` "
                  "needs Go): real-server tests skipped")
        if os.environ.get(REQUIRE_ENV) == "1":
            pytest.fail(f"{REQUIRE_ENV}=1 but {reason}")
        pytest.skip(reason)
    if not KUBECTL.exists():
        pytest.fail("the real kubectl is missing (.tools/kubectl; `make tools`)")


@contextlib.contextmanager
def installed_control_plane(workdir: Path, apiserver_args: tuple[str, ...] = (),
                            address: str = LOOPBACK) -> Iterator[ControlPlane]:
    """A started control plane with kata-sizing installed; stopped on exit."""
    require_binary()
    cp = ControlPlane(workdir, apiserver_args, address)
    try:
        cp.start()
        cp.install()
        yield cp
    finally:
        cp.stop()


@pytest.fixture(scope="session")
def control_plane(tmp_path_factory: pytest.TempPathFactory, control_plane_address: str) -> Iterator[ControlPlane]:
    """The session's control plane; the node of tests/support/realnode.py joins it when the session has
    node tests (`control_plane_address` is then the node's address, else 127.0.0.1)."""
    with installed_control_plane(tmp_path_factory.mktemp("controlplane"), address=control_plane_address) as cp:
        yield cp


def delete_policies(cp: ControlPlane, operator_running: bool) -> None:
    """Delete every KataSizingPolicy; with the operator stopped, drop finalizers (an older
    operator's, which a test may set) so none hangs."""
    for name in cp.items(POLICIES):
        if not operator_running:
            cp.merge_patch(f"{POLICIES}/{name}", {"metadata": {"finalizers": None}})
        cp.delete(f"{POLICIES}/{name}")
    poll(lambda: not cp.items(POLICIES), 30, lambda: f"policies still there: {sorted(cp.items(POLICIES))}")


@pytest.fixture
def real_operator(control_plane: ControlPlane, tmp_path: Path) -> Iterator[RealOperator]:
    """The operator, not yet started (`real_operator.start()`); the test leaves no policy behind
    and the operator's identity met no 403."""
    operator = RealOperator(control_plane, tmp_path)
    start = control_plane.audit_offset()
    try:
        yield operator
    finally:
        try:
            delete_policies(control_plane, operator.running)
        finally:
            operator.stop()
            leftovers(control_plane)
    refused = operator.forbidden(start)
    assert not refused, f"the API server refused the operator (403): {refused}"


def leftovers(cp: ControlPlane) -> None:
    """Remove what a test left behind so the next one starts from an empty cluster: every
    RuntimeClass (the control plane has none of its own) and the policies' ConfigMaps."""
    for name in cp.items(RUNTIME_CLASSES):
        cp.delete(f"{RUNTIME_CLASSES}/{name}")
    for name in cp.items(configmaps(), "katasizing.dev/policy"):
        cp.delete(f"{configmaps()}/{name}")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The node tests run after the others: until the node joins, the session's control plane
    has no node (the operator's node guidance and the tests' pods see what they always saw).
    The RBAC coverage test reads the whole session's audit log: it runs last. Run by pytest-xdist
    (`make test`: `-n 2 --dist loadgroup`), each worker writes each test's group (`xdist_group`)
    where the controller's scheduler reads it (`pytest_xdist_make_scheduler`)."""
    last = [i for i in items if i.name.startswith("test_every_grant_of_the_clusterrole_is_used")]
    node = [i for i in items if i.get_closest_marker("node") and i not in last]
    items[:] = [i for i in items if i not in last and i not in node] + node + last
    folder = getattr(config, "workerinput", {}).get(GROUPS_FOLDER)
    if folder is not None:
        groups = {item.nodeid: group for item in items if (group := xdist_group(item)) is not None}
        worker = config.workerinput["workerid"]  # type: ignore[attr-defined]
        (Path(folder) / f"{worker}.json.tmp").write_text(json.dumps(groups))
        (Path(folder) / f"{worker}.json.tmp").rename(Path(folder) / f"{worker}.json")


# What runs on the session's control plane: `kube` does on its realserver tier. And what runs on
# the session's node (which joins that worker's control plane).
SESSION_FIXTURES = frozenset({"control_plane", "real_operator"})
NODE_FIXTURES = frozenset({"real_node", "node_namespace"})


def xdist_group(item: pytest.Item) -> str | None:
    """The tests of the node in one worker ("node": one node per machine, its lock held for the
    session); the other tests of the session's control plane in one worker ("cluster", the RBAC
    check last: the API tier alone uses every grant, and it reads that worker's whole audit log);
    a module that starts control planes of its own in one worker, so its module-scoped ones start
    once; the rest wherever a worker is free. Each worker that runs "cluster" or "node" starts a
    session control plane of its own."""
    fixtures = set(getattr(item, "fixturenames", ()))
    if NODE_FIXTURES & fixtures or item.get_closest_marker("node"):
        return "node"
    kube = getattr(getattr(item, "callspec", None), "params", {}).get("kube")
    if SESSION_FIXTURES & fixtures or kube == "realserver":
        return "cluster"
    if item.get_closest_marker("realserver") or item.get_closest_marker("image"):
        return item.nodeid.split("::")[0]
    return None


# pytest-xdist 3.8's own loadgroup adds the group to a test's node id through an attribute pytest
# 9 no longer reads (its tests then went wherever a worker was free). So the groups go from the
# workers to the controller through files, and the controller schedules by them.
GROUPS_FOLDER = "kata_sizing_xdist_groups"
_GROUPS_KEY = pytest.StashKey[Path]()


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """Controller: each worker is told where to write its tests' groups."""
    config = node.config
    if _GROUPS_KEY not in config.stash:
        config.stash[_GROUPS_KEY] = Path(tempfile.mkdtemp(prefix="kata-sizing-xdist-groups-"))
    node.workerinput[GROUPS_FOLDER] = str(config.stash[_GROUPS_KEY])


def pytest_unconfigure(config: pytest.Config) -> None:
    folder = config.stash.get(_GROUPS_KEY, None)
    if folder is not None:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Controller, `--dist loadgroup`: whole groups to a worker, the rest test by test."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling  # type: ignore[import-untyped]

    # `_split_scope` is the method pytest-xdist's own loadgroup and loadfile override (pinned in
    # requirements.lock): should a release drop it, say so instead of scheduling test by test.
    if not callable(getattr(LoadScopeScheduling, "_split_scope", None)):
        raise pytest.UsageError("pytest-xdist's LoadScopeScheduling has no _split_scope: the suite's groups "
                                "(tests/support/realcluster.py) need another way in; run with TEST_WORKERS=0")

    class GroupScheduling(LoadScopeScheduling):
        groups: dict[str, str] | None = None

        def _split_scope(self, nodeid: str) -> str:
            if self.groups is None:  # asked first once every worker has collected (and written)
                folder = config.stash.get(_GROUPS_KEY, None)
                self.groups = {}
                for path in sorted(folder.glob("*.json")) if folder is not None else ():
                    self.groups.update(json.loads(path.read_text()))
            return self.groups.get(nodeid, nodeid)

    return GroupScheduling(config, log)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    report = yield
    if report.failed and "control_plane" in getattr(item, "fixturenames", ()):
        cp = item.funcargs.get("control_plane") if hasattr(item, "funcargs") else None
        if isinstance(cp, ControlPlane):
            report.sections.append(("control plane", f"log: {cp.log_path}\n{cp.log_tail()}"))
        operator = item.funcargs.get("real_operator") if hasattr(item, "funcargs") else None
        if isinstance(operator, RealOperator):
            report.sections.append(("operator", f"log: {operator.log_path}\n{operator.log()[-4000:]}"))
    node = item.funcargs.get("real_node") if report.failed and hasattr(item, "funcargs") else None
    if node is not None:  # tests/support/realnode.py's Node, whose control plane is the session's
        report.sections.append(("control plane", f"log: {node.cp.log_path}\n{node.cp.log_tail()}"))
        for name in ("kubelet", "containerd", "kube-scheduler", "kube-proxy"):
            report.sections.append((name, f"log: {node.logdir / (name + '.log')}\n{node.log_tail(name)}"))
    return report
