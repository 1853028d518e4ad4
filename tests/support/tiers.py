"""The API tier as one client: the kmock emulator and the real kube-apiserver behind one interface,
so a scenario is written once and run on both (controller-runtime's envtest idea: one body, one
client, the backend a parameter).

A test takes the `kube` fixture and runs once per tier, with the ids `emulator` and `realserver`
(and their markers, so `-m realserver` and `-m emulator` still select):

    def test_a_hand_edit_is_put_back(kube):
        kube.start()
        kube.applied(example())
        kube.edit(RUNTIME_CLASSES, "kata-qemu-rs-m", lambda o: o["overhead"]["podFixed"].update(memory="1Mi"))
        kube.wait_for(lambda: kube.counter("qemu-rs", "driftCorrections") == 1)

`@pytest.mark.tiers("emulator", reason=...)` (or "realserver") keeps a scenario to one tier and
says why: what only the emulator can do (inject faults, drop watches, run without a garbage
collector) or what only the real server decides (the CRD's schema and CEL, admission, RBAC,
namespaces). `@pytest.mark.emulator_options(...)` starts that test's emulator otherwise
(`running_emulator`'s keywords).

`Kube` gives:
- objects: `get`, `objects` (by label selector), `create`, `replace` (a PUT: a stale
  resourceVersion is a 409, the server's rules apply, such as RuntimeClass.handler's
  immutability), `edit` (a hand edit: read, change, replace), `delete`; errors as `ApiError`;
- policies: `policy`, `status`, `conditions`, `condition`, `counter`, `wait_observed`,
  `update_spec`, `applied` (create, wait for the conditions, settle);
- the operator: `start(...)` (`OperatorOptions`' fields as keywords) and `stop()`; the
  emulator's runs in the test's process, the real server's is `kata-sizing operator` with its
  ServiceAccount's token (the real authorizer enforces its ClusterRole);
- what the operator did: `mark()`, `writes(since=...)` (`Write`: verb, resource, name, code,
  user agent; from the emulator's request log or the API server's audit log of the operator's
  identity), `settle()` (no write for a while), `events()` and `event_messages()`, `reconciles()`
  (the reconcile lines it logged at INFO, as dicts) and `log()`;
- `emu` (the emulator: faults, the whole request log) and `cp` (the control plane: kubectl,
  the audit log), each None on the other tier.
"""

from __future__ import annotations

import json
import logging
import re
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest

from kata_sizing.controller.plan import PASS_TRIGGERS
from tests.support import operator_helpers as emulated
from tests.support.harness import ApiError as EmulatorApiError
from tests.support.harness import KubernetesApiEmulator, running_emulator
from tests.support.metrics import get, samples
from tests.support.operator_helpers import OperatorCluster, wait_for
from tests.support.realcluster import ApiError as RealApiError
from tests.support.realcluster import ControlPlane, OperatorProcess, RealOperator, free_port

EMULATOR, REALSERVER = "emulator", "realserver"
TIERS = (EMULATOR, REALSERVER)
T = TypeVar("T")


@dataclass(frozen=True)
class Kind:
    """A resource the scenarios read or write, named as both tiers address it."""

    group: str
    version: str
    plural: str
    namespaced: bool = False

    @property
    def emulator_key(self) -> str:
        return f"{self.group}/{self.version}/{self.plural}" if self.group else f"{self.version}/{self.plural}"

    def path(self, namespace: str | None = None, name: str | None = None) -> str:
        base = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        scope = f"/namespaces/{namespace}" if self.namespaced and namespace else ""
        return f"{base}{scope}/{self.plural}" + (f"/{name}" if name else "")


POLICIES = Kind("katasizing.dev", "v1alpha1", "katasizingpolicies")
RUNTIME_CLASSES = Kind("node.k8s.io", "v1", "runtimeclasses")
CONFIG_MAPS = Kind("", "v1", "configmaps", namespaced=True)
NODES = Kind("", "v1", "nodes")
PODS = Kind("", "v1", "pods", namespaced=True)
NAMESPACES = Kind("", "v1", "namespaces")
LEASES = Kind("coordination.k8s.io", "v1", "leases", namespaced=True)
VAP = Kind("admissionregistration.k8s.io", "v1", "validatingadmissionpolicies")
VAPB = Kind("admissionregistration.k8s.io", "v1", "validatingadmissionpolicybindings")
MAP = Kind("admissionregistration.k8s.io", "v1", "mutatingadmissionpolicies")
MAPB = Kind("admissionregistration.k8s.io", "v1", "mutatingadmissionpolicybindings")
OUTPUT_NAMESPACE = "kata-sizing"


class ApiError(Exception):
    """An API error as either tier answers it: its HTTP status and message."""

    def __init__(self, status: int, message: str) -> None:
        self.status, self.message = status, message
        super().__init__(f"HTTP {status}: {message}")


@dataclass(frozen=True)
class Write:
    """One write the operator sent: create, update, patch or delete."""

    verb: str
    resource: str  # the plural, with "/status" for a status write
    name: str
    namespace: str
    code: int
    user_agent: str = ""


@dataclass(frozen=True)
class LeaseTimings:
    """Leader election with short timings (client-go's order: retry < renew deadline < duration)."""

    duration_s: float = 4.0
    renew_deadline_s: float = 3.0
    retry_period_s: float = 0.25


@dataclass(frozen=True)
class OperatorOptions:
    """How a scenario starts the operator; each field means the same on both tiers."""

    resync_s: float = 300
    guidance_s: float | None = None  # None: each tier's default (1 s on the real server, 10 s here)
    lease: LeaseTimings | None = None  # leader-elected, with `identity` as POD_NAME
    identity: str = "kata-sizing-test"
    metrics_port: int | None = None  # /metrics and /readyz on 127.0.0.1
    webhook: tuple[int, Path, Path] | None = None  # (port, certificate, key) on 127.0.0.1
    webhook_drain_s: float = 0  # --webhook-drain-seconds (with `webhook`)


def operator_command(opts: OperatorOptions) -> list[str]:
    """`kata-sizing operator`'s arguments for the options: its JSON log, and /metrics (on a port of
    its own unless one is given)."""
    args = ["--log-format", "json", "--metrics-port", str(opts.metrics_port or free_port()),
            "--metrics-addr", "127.0.0.1"]
    if opts.lease is not None:
        args += ["--leader-elect", "--lease-duration", str(opts.lease.duration_s),
                 "--renew-deadline", str(opts.lease.renew_deadline_s), "--retry-period", str(opts.lease.retry_period_s)]
    if opts.webhook is not None:
        port, cert, key = opts.webhook
        args += ["--webhook-port", str(port), "--webhook-addr", "127.0.0.1",
                 "--webhook-cert", str(cert), "--webhook-key", str(key)]
        if opts.webhook_drain_s:
            args += ["--webhook-drain-seconds", str(opts.webhook_drain_s)]
    return args


def _guidance_s(opts: OperatorOptions) -> float:
    return 1.0 if opts.guidance_s is None else opts.guidance_s  # the operator process's default in the tests


WRITE_VERBS = {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}
ACCESS_LINE = re.compile(r"^[0-9a-f.:]+ \[")  # aiohttp's access log: the client's address, then the time


class Kube(ABC):
    """One API tier (see the module docstring)."""

    tier: str
    _test_start: int
    workdir: Path  # the test's tmp_path: the replicas' logs
    _replicas: list[OperatorProcess]
    # How long a change may take to show: the real server's watches and the operator's own
    # start-up are slower than the emulator in this process.
    timeout_s: float
    emu: KubernetesApiEmulator | None = None
    cp: ControlPlane | None = None

    # --- objects ---------------------------------------------------------------------------

    @abstractmethod
    def get(self, kind: Kind, name: str, namespace: str | None = None) -> dict | None: ...

    @abstractmethod
    def objects(self, kind: Kind, namespace: str | None = None, labels: str | None = None) -> dict[str, dict]: ...

    def create(self, kind: Kind, body: dict, namespace: str | None = None) -> dict:
        """A client's POST; a status in the body is then written to the status subresource, as the
        object's owner would (a kubelet its Node's)."""
        body = dict(body)
        status = body.pop("status", None)
        created = self._create(kind, body, namespace or body["metadata"].get("namespace") or _default_namespace(kind))
        if status is None:
            return created
        return self._write_status(kind, created, status)

    @abstractmethod
    def _create(self, kind: Kind, body: dict, namespace: str | None) -> dict: ...

    @abstractmethod
    def _write_status(self, kind: Kind, obj: dict, status: dict) -> dict: ...

    @abstractmethod
    def replace(self, kind: Kind, body: dict, namespace: str | None = None) -> dict: ...

    @abstractmethod
    def delete(self, kind: Kind, name: str, namespace: str | None = None) -> None: ...

    def read(self, kind: Kind, name: str, namespace: str | None = None) -> dict:
        """`get` of an object the test needs there: its absence fails the test, saying which."""
        found = self.get(kind, name, namespace)
        assert found is not None, f"{kind.plural} {name} does not exist"
        return found

    def edit(self, kind: Kind, name: str, change: Callable[[dict], Any], namespace: str | None = None) -> dict:
        """A hand edit (`kubectl edit`): read, change, write back with the resourceVersion read."""
        body = self.get(kind, name, namespace)
        assert body is not None, f"{kind.plural} {name} does not exist"
        change(body)
        return self.replace(kind, body, namespace)

    # --- policies ----------------------------------------------------------------------------

    def policy(self, name: str) -> dict | None:
        return self.get(POLICIES, name)

    def status(self, name: str) -> dict:
        return (self.policy(name) or {}).get("status") or {}

    def conditions(self, name: str) -> dict[str, str]:
        """{type: status} of every condition."""
        return {c["type"]: c["status"] for c in self.status(name).get("conditions") or []}

    def condition(self, name: str, type_: str) -> dict:
        return next((c for c in self.status(name).get("conditions") or [] if c.get("type") == type_), {})

    def counter(self, name: str, field: str) -> int:
        return int(self.status(name).get(field) or 0)

    def wait_observed(self, name: str, timeout: float | None = None, **expected: str) -> dict:
        """Wait until status is for the policy's current generation and each condition named has
        the status given (`Ready="True"`); the status."""
        return self._wait_conditions(name, timeout, expected)

    def _wait_conditions(self, name: str, timeout: float | None, expected: dict[str, str]) -> dict:
        def done() -> dict | None:
            body = self.policy(name) or {}
            found = body.get("status") or {}
            if not body or found.get("observedGeneration") != body["metadata"]["generation"]:
                return None
            current = {c["type"]: c["status"] for c in found.get("conditions") or []}
            return found if all(current.get(k) == v for k, v in expected.items()) else None
        return self.wait_for(done, timeout, lambda: f"status of {name}: {self.status(name)!r}")

    def update_spec(self, name: str, change: Callable[[dict], Any]) -> dict:
        """Change the spec as `kubectl edit` would (a whole replace): the generation goes up."""
        return self.edit(POLICIES, name, lambda body: change(body["spec"]))

    def applied(self, body: dict, **expected: str) -> dict:
        """Create the policy, wait for its status (Ready unless told otherwise), let the operator
        go quiet; the policy as it is then."""
        self.create(POLICIES, body)
        name = body["metadata"]["name"]
        self._wait_conditions(name, None, expected or {"Ready": "True"})
        self.settle()
        policy = self.policy(name)
        assert policy is not None
        return policy

    # --- the operator ------------------------------------------------------------------------

    @abstractmethod
    def start(self, **options: Any) -> None:
        """Start the operator with `OperatorOptions`' fields as keywords."""

    @abstractmethod
    def stop(self) -> None: ...

    def replica(self, identity: str, **options: Any) -> OperatorProcess:
        """Another replica, `kata-sizing operator` as a subprocess (`OperatorOptions`' fields as
        keywords; leader-elected with short timings unless `lease` says otherwise): started,
        stopped with the test. Its requests carry `kata-sizing/<identity>_<suffix>` as their
        User-Agent."""
        opts = OperatorOptions(**{"lease": LeaseTimings(), **options, "identity": identity})
        process = self._process(self.workdir / identity)
        self._replicas.append(process)
        process.start(*operator_command(opts), resync_s=opts.resync_s, guidance_s=_guidance_s(opts),
                      POD_NAME=opts.identity)
        return process

    @abstractmethod
    def _process(self, workdir: Path) -> OperatorProcess: ...

    def stop_replicas(self) -> None:
        for process in self._replicas:
            process.stop()

    # --- what the operator did ---------------------------------------------------------------

    @abstractmethod
    def mark(self) -> int:
        """A point in the record of the operator's requests; `writes(since=mark)` reads on from it
        (by default from the test's start: the real server's audit log holds the whole session's)."""

    def _since(self, since: int | None) -> int:
        return self._test_start if since is None else since

    @abstractmethod
    def writes(self, since: int | None = None, kind: Kind | None = None, name: str | None = None) -> list[Write]: ...

    @abstractmethod
    def user_agents(self, since: int | None = None) -> list[str]:
        """The User-Agent of every request the operator's replicas made (reads too), in order."""

    @abstractmethod
    def settle(self, quiet_s: float | None = None) -> None:
        """Wait until the operator has written nothing for a while (its Lease renewals aside)."""

    @abstractmethod
    def events(self, reason: str | None = None, type_: str | None = None) -> list[dict]:
        """The Events posted during this test, oldest first."""

    def event_messages(self, reason: str, type_: str | None = None) -> list[str]:
        return [e.get("message") or e.get("note") or "" for e in self.events(reason, type_)]

    @abstractmethod
    def reconciles(self) -> list[dict]:
        """The operator's reconcile lines at INFO (policy, trigger, result, writes, duration_s)."""

    @abstractmethod
    def log_lines(self) -> list[str]:
        """What the operator logged at INFO and above, one "severity: message" a line."""

    def log(self) -> str:
        return "\n".join(self.log_lines())

    @abstractmethod
    def passes(self, trigger: str) -> float:
        """How many passes the operator has run for `trigger` (kata_sizing_reconciles_total over
        every result and policy: compare two readings)."""

    def wait_for(self, predicate: Callable[[], T | None], timeout: float | None = None,
                 message: str | Callable[[], str] = "") -> T:
        return wait_for(predicate, timeout or self.timeout_s, message)

    def stays(self, predicate: Callable[[], Any], duration: float, message: str = "") -> None:
        emulated.stays(predicate, duration, message)


# --- the emulator --------------------------------------------------------------------------------


def _operators(record: logging.LogRecord) -> bool:
    """A line of the operator's own log (not the emulator's access log, which runs in this process too)."""
    return record.name.split(".")[0] in ("kata_sizing", "kopf")


def _reconciles_total(trigger: str) -> float:
    from kata_sizing.controller import metrics

    return sum(s.value for family in metrics.REGISTRY.collect() for s in family.samples
               if s.name == "kata_sizing_reconciles_total" and s.labels.get("trigger") == trigger)


class EmulatorKube(Kube):
    tier = EMULATOR
    timeout_s = 5.0

    def __init__(self, cluster: OperatorCluster, monkeypatch: pytest.MonkeyPatch,
                 caplog: pytest.LogCaptureFixture, workdir: Path) -> None:
        self.workdir = workdir
        self._replicas: list[OperatorProcess] = []
        self.cluster = cluster
        self.emu = cluster.emu
        self._monkeypatch = monkeypatch
        # The operator runs in this process: its log is captured as the real operator's is written.
        caplog.set_level(logging.INFO, logger="kopf")
        caplog.set_level(logging.DEBUG, logger="kata_sizing")
        self.caplog = caplog
        self._passes_before: dict[str, float] = {}
        self._test_start = self.mark()

    def _objects(self, kind: Kind) -> Any:
        assert self.emu is not None
        return self.emu.objects(kind.emulator_key)

    def _call(self, method: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        try:
            return method(*args, **kwargs)
        except EmulatorApiError as err:
            raise ApiError(err.code, str(err)) from None

    def get(self, kind: Kind, name: str, namespace: str | None = None) -> dict | None:
        return self._objects(kind).get(name, namespace or _default_namespace(kind))

    def objects(self, kind: Kind, namespace: str | None = None, labels: str | None = None) -> dict[str, dict]:
        return {o["metadata"]["name"]: o for o in self._objects(kind).list(namespace, labels)}

    def _create(self, kind: Kind, body: dict, namespace: str | None) -> dict:
        return self._call(self._objects(kind).create, body, namespace, enforce=True)

    def _write_status(self, kind: Kind, obj: dict, status: dict) -> dict:
        meta = obj["metadata"]
        return self._objects(kind).patch(meta["name"], {"status": status}, meta.get("namespace"),
                                         subresource="status")

    def replace(self, kind: Kind, body: dict, namespace: str | None = None) -> dict:
        return self._call(self._objects(kind).replace, body, namespace or _default_namespace(kind))

    def delete(self, kind: Kind, name: str, namespace: str | None = None) -> None:
        self._objects(kind).delete(name, namespace or _default_namespace(kind))

    def start(self, **options: Any) -> None:
        import kopf

        from kata_sizing.controller import handlers, leader, metrics, worker
        from kata_sizing.controller.operator_main import (
            MetricsOptions,
            WebhookOptions,
            configure_webhook,
            install_metrics,
        )
        from tests.support.harness import KopfThread

        opts = OperatorOptions(**options)
        assert self.cluster.operator is None, "the operator is already running"
        self._passes_before = {t: _reconciles_total(t) for t in PASS_TRIGGERS}
        # The policy gauges are this process's too: an operator starts with none, as a new process does.
        metrics.STATE.conditions.clear()
        self._monkeypatch.setattr(worker, "RESYNC_INTERVAL_S", opts.resync_s)
        if opts.guidance_s is not None:
            self._monkeypatch.setattr(worker, "GUIDANCE_INTERVAL_S", opts.guidance_s)
        registry = handlers.build_registry(admission=opts.webhook is not None)
        settings_hook = None
        if opts.webhook is not None:
            port, cert, key = opts.webhook
            webhook = WebhookOptions(port=port, certfile=str(cert), pkeyfile=str(key), addr="127.0.0.1")
            settings_hook = lambda settings: configure_webhook(settings, webhook)  # noqa: E731
        if opts.metrics_port is not None:
            install_metrics(registry, MetricsOptions(port=opts.metrics_port, addr="127.0.0.1"))
        lease = None if opts.lease is None else leader.LeaseOptions(
            namespace=OUTPUT_NAMESPACE, identity=opts.identity, lease_duration_s=opts.lease.duration_s,
            renew_deadline_s=opts.lease.renew_deadline_s, retry_period_s=opts.lease.retry_period_s)
        assert self.emu is not None and self.emu.kubeconfig is not None
        self.cluster.operator = KopfThread(self.emu.kubeconfig, registry=registry, settings_hook=settings_hook,
                                           memo=kopf.Memo(lease=lease))
        self.cluster.memo = self.cluster.operator.memo
        self.cluster.operator.start()

    def stop(self) -> None:
        self.cluster.stop()

    def _process(self, workdir: Path) -> OperatorProcess:
        assert self.emu is not None and self.emu.kubeconfig is not None
        workdir.mkdir()
        return OperatorProcess(self.emu.kubeconfig, workdir)

    def mark(self) -> int:
        assert self.emu is not None
        return len(self.emu.request_log)

    def writes(self, since: int | None = None, kind: Kind | None = None, name: str | None = None) -> list[Write]:
        assert self.emu is not None
        found = []
        for record in self.emu.request_log[self._since(since):]:
            if not record.is_write:
                continue
            parts = [p for p in record.path.split("/") if p]
            rest = parts[2:] if parts[0] == "api" else parts[3:]
            namespace = ""
            if rest[:1] == ["namespaces"] and len(rest) > 2:
                namespace, rest = rest[1], rest[2:]
            resource = rest[0] + (f"/{rest[2]}" if len(rest) > 2 else "")
            written = rest[1] if len(rest) > 1 else ((record.body or {}).get("metadata") or {}).get("name", "")
            found.append(Write(WRITE_VERBS[record.method], resource, written, namespace, record.status,
                               record.user_agent))
        return [w for w in found if (kind is None or w.resource.split("/")[0] == kind.plural)
                and (name is None or w.name == name)]

    def user_agents(self, since: int | None = None) -> list[str]:
        assert self.emu is not None
        return [r.user_agent for r in self.emu.request_log[self._since(since):]]

    def settle(self, quiet_s: float | None = None) -> None:
        assert self.emu is not None
        emulated.settle(self.emu, 0.4 if quiet_s is None else quiet_s)

    def events(self, reason: str | None = None, type_: str | None = None) -> list[dict]:
        assert self.emu is not None
        return emulated.events(self.emu, reason, type_)

    def reconciles(self) -> list[dict]:
        return [{k: getattr(r, k) for k in ("policy", "trigger", "result", "writes", "duration_s")}
                for r in self.caplog.records
                if r.name == "kata_sizing.reconcile" and r.levelno >= logging.INFO and hasattr(r, "policy")]

    def log_lines(self) -> list[str]:
        return [f"{r.levelname.lower()}: {r.getMessage()}" for r in self.caplog.records
                if _operators(r) and r.levelno >= logging.INFO]

    def passes(self, trigger: str) -> float:
        # The registry is this process's, with every earlier test's passes: count from the start.
        return _reconciles_total(trigger) - self._passes_before.get(trigger, 0.0)

    def passes_of(self, policy: str, trigger: str) -> int:
        """The passes of one policy, those that changed nothing too (its DEBUG lines, which this
        process keeps and the real operator's log at INFO does not)."""
        return sum(1 for r in self.caplog.records if getattr(r, "policy", None) == policy
                   and getattr(r, "trigger", None) == trigger)


# --- the real API server -------------------------------------------------------------------------


class RealKube(Kube):
    tier = REALSERVER
    timeout_s = 20.0

    def __init__(self, cp: ControlPlane, operator: RealOperator, workdir: Path) -> None:
        self.workdir = workdir
        self._replicas: list[OperatorProcess] = []
        self.cp = cp
        self.operator = operator
        self.metrics_port = 0
        self._created: list[tuple[Kind, str, str | None]] = []
        self._test_start = self.mark()
        # Events of this test only: the session's control plane keeps every earlier test's.
        self._events_from = int(cp.request("GET", "/api/v1/events?limit=1")["metadata"]["resourceVersion"])

    def _call(self, method: Callable[..., T], *args: Any) -> T:
        try:
            return method(*args)
        except RealApiError as err:
            message = err.body.get("message", "") if isinstance(err.body, dict) else str(err.body)
            raise ApiError(err.status, message) from None

    def get(self, kind: Kind, name: str, namespace: str | None = None) -> dict | None:
        assert self.cp is not None
        return self._call(self.cp.get, kind.path(namespace or _default_namespace(kind), name))

    def objects(self, kind: Kind, namespace: str | None = None, labels: str | None = None) -> dict[str, dict]:
        assert self.cp is not None
        return self._call(self.cp.items, kind.path(namespace), labels)

    def _create(self, kind: Kind, body: dict, namespace: str | None) -> dict:
        assert self.cp is not None
        created = self._call(self.cp.create, kind.path(namespace), {
            "apiVersion": f"{kind.group}/{kind.version}" if kind.group else kind.version, **body})
        self._created.append((kind, created["metadata"]["name"], namespace))
        return created

    def _write_status(self, kind: Kind, obj: dict, status: dict) -> dict:
        assert self.cp is not None
        meta = obj["metadata"]
        return self._call(self.cp.merge_patch, kind.path(meta.get("namespace"), meta["name"]) + "/status",
                          {"status": status})

    def remove_created(self) -> None:
        """What the test created and left (the session's control plane serves the next test)."""
        for kind, name, namespace in reversed(self._created):
            self.delete(kind, name, namespace)

    def replace(self, kind: Kind, body: dict, namespace: str | None = None) -> dict:
        assert self.cp is not None
        namespace = namespace or body["metadata"].get("namespace") or _default_namespace(kind)
        return self._call(self.cp.request, "PUT", kind.path(namespace, body["metadata"]["name"]), body)

    def delete(self, kind: Kind, name: str, namespace: str | None = None) -> None:
        assert self.cp is not None
        self._call(self.cp.delete, kind.path(namespace or _default_namespace(kind), name))

    def start(self, **options: Any) -> None:
        opts = OperatorOptions(**options)
        args = operator_command(opts)
        self.metrics_port = int(args[args.index("--metrics-port") + 1])  # `passes` reads it
        self.operator.start(*args, resync_s=opts.resync_s, guidance_s=_guidance_s(opts), POD_NAME=opts.identity)

    def stop(self) -> None:
        self.operator.stop()

    def _process(self, workdir: Path) -> OperatorProcess:
        assert self.cp is not None
        workdir.mkdir()
        return RealOperator(self.cp, workdir)

    def mark(self) -> int:
        assert self.cp is not None
        return self.cp.audit_offset()

    def writes(self, since: int | None = None, kind: Kind | None = None, name: str | None = None) -> list[Write]:
        assert self.cp is not None
        return [Write(e.verb, e.resource, e.name, e.namespace, e.code, e.user_agent)
                for e in self.cp.operator_writes(self._since(since))
                if (kind is None or e.resource.split("/")[0] == kind.plural) and (name is None or e.name == name)]

    def user_agents(self, since: int | None = None) -> list[str]:
        assert self.cp is not None
        return [e.user_agent for e in self.cp.operator_requests(self._since(since))]

    def settle(self, quiet_s: float | None = None) -> None:
        assert self.cp is not None
        quiet_for = 1.5 if quiet_s is None else quiet_s
        deadline = time.monotonic() + 20
        while True:
            mark = self.cp.audit_offset()
            time.sleep(quiet_for)
            if not [w for w in self.cp.operator_writes(mark) if w.resource != "leases"]:
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"the operator kept writing: {self.cp.operator_writes(mark)[-5:]}")

    def events(self, reason: str | None = None, type_: str | None = None) -> list[dict]:
        assert self.cp is not None
        found = [e for e in self.cp.request("GET", "/api/v1/events")["items"]
                 if int(e["metadata"]["resourceVersion"]) > self._events_from]
        found.sort(key=lambda e: int(e["metadata"]["resourceVersion"]))
        return [e for e in found if reason in (None, e.get("reason")) and type_ in (None, e.get("type"))]

    def _lines(self) -> list[dict]:
        return [json.loads(line) for line in self.operator.log().splitlines() if line.startswith("{")]

    def reconciles(self) -> list[dict]:
        return [{k: line.get(k) for k in ("policy", "trigger", "result", "writes", "duration_s")}
                for line in self._lines() if "policy" in line and "trigger" in line]

    def log_lines(self) -> list[str]:
        # aiohttp's access lines of the operator's own HTTP servers (liveness, /metrics) are left
        # out, as the emulator tier's capture of the operator's loggers leaves them.
        return [f"{line.get('severity')}: {line.get('message')}" for line in self._lines()
                if line.get("severity") != "debug" and not ACCESS_LINE.match(str(line.get("message")))]

    def passes(self, trigger: str) -> float:
        status, text = get(f"http://127.0.0.1:{self.metrics_port}/metrics")
        assert status == 200, f"/metrics answered {status}"
        return sum(v for (name, labels), v in samples(text).items()
                   if name == "kata_sizing_reconciles_total" and dict(labels).get("trigger") == trigger)


def _default_namespace(kind: Kind) -> str | None:
    return OUTPUT_NAMESPACE if kind.namespaced else None


# --- the fixture ---------------------------------------------------------------------------------


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "kube" not in metafunc.fixturenames:
        return
    marker = metafunc.definition.get_closest_marker("tiers")
    tiers = TIERS
    if marker is not None:
        tiers = marker.args
        if not tiers or set(tiers) - set(TIERS) or not marker.kwargs.get("reason"):
            raise pytest.UsageError(f"{metafunc.definition.nodeid}: @pytest.mark.tiers takes tiers of "
                                    f"{TIERS} and a reason= saying why the others cannot run it")
    metafunc.parametrize("kube", [pytest.param(t, id=t, marks=getattr(pytest.mark, t)) for t in tiers],
                         indirect=True)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A `tiers` mark on one parameter of a scenario (pytest.param(..., marks=...)) keeps that case
    to its tiers: the runs on the others are deselected, not skipped."""
    kept: list[pytest.Item] = []
    dropped: list[pytest.Item] = []
    for item in items:
        tier = getattr(getattr(item, "callspec", None), "params", {}).get("kube")
        allowed = [set(m.args) for m in item.iter_markers("tiers")]
        (dropped if tier is not None and any(tier not in a for a in allowed) else kept).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


@pytest.fixture
def kube(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Kube]:
    """One API tier (the module docstring); the operator not yet started (`kube.start()`)."""
    if request.param == EMULATOR:
        marker = request.node.get_closest_marker("emulator_options")
        options = marker.kwargs if marker else {}
        with running_emulator(tmp_path, **options) as emu:
            tier = EmulatorKube(OperatorCluster(emu, monkeypatch), monkeypatch, request.getfixturevalue("caplog"),
                                tmp_path)
            try:
                yield tier
            finally:
                tier.stop_replicas()
                tier.stop()  # before the emulator goes away; re-raises an operator crash
        assert not emu.server_errors, f"the emulator itself failed: {emu.server_errors!r}"
    else:
        # The real_operator fixture's teardown deletes the test's policies, stops the operator,
        # removes what is left and fails on any 403 the operator met.
        operator: RealOperator = request.getfixturevalue("real_operator")
        real = RealKube(request.getfixturevalue("control_plane"), operator, tmp_path)
        try:
            yield real
        finally:
            real.stop_replicas()
            real.remove_created()

