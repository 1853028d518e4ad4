"""Polling and reading helpers for the operator's emulator tests: what a user would look at
(objects, status conditions, events) and what the operator sent (the request log)."""

from __future__ import annotations

import copy
import re
import signal
import subprocess
import time
from collections.abc import Callable
from typing import Any, TypeVar

from tests.support.harness import KopfThread, KubernetesApiEmulator
from tests.support.paths import ROOT

EXAMPLES = ROOT / "examples"

POLICIES = "katasizingpolicies"
RUNTIME_CLASSES = "runtimeclasses"
CONFIG_MAPS = "v1/configmaps"
OUTPUT_NAMESPACE = "kata-sizing"
POLL_S = 0.02

RC_PATH = re.compile(r"^/apis/node\.k8s\.io/v1/runtimeclasses")
CM_PATH = re.compile(r"^/api/v1/(namespaces/[^/]+/)?configmaps")
STATUS_PATH = re.compile(r"^/apis/katasizing\.dev/v1alpha1/katasizingpolicies/[^/]+/status$")
POLICY_PATH = re.compile(r"^/apis/katasizing\.dev/v1alpha1/katasizingpolicies/[^/]+$")
EVENT_PATH = re.compile(r"^/api/v1/namespaces/[^/]+/events|^/apis/events\.k8s\.io/")

T = TypeVar("T")


def terminate(process: subprocess.Popen, grace_s: float = 20) -> int:
    """SIGTERM, then SIGKILL after `grace_s` seconds; the exit code."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(grace_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    return process.returncode


def wait_for(predicate: Callable[[], T | None], timeout: float = 5, message: str | Callable[[], str] = "",
             interval: float = POLL_S) -> T:
    """Poll `predicate` every `interval` (20 ms) until it returns something truthy; return that."""
    deadline = time.monotonic() + timeout
    while True:
        result = predicate()
        if result:
            return result
        if time.monotonic() > deadline:
            text = message() if callable(message) else message
            raise AssertionError(f"not met within {timeout}s: {text or getattr(predicate, '__name__', predicate)}")
        time.sleep(interval)


def stays(predicate: Callable[[], Any], duration: float, message: str = "") -> None:
    """`predicate` holds on every poll for `duration` seconds (for "is NOT restored" checks)."""
    deadline = time.monotonic() + duration
    while time.monotonic() < deadline:
        assert predicate(), message or "the condition stopped holding"
        time.sleep(POLL_S)


LEASE_PATH = re.compile(r"^/apis/coordination\.k8s\.io/v1/namespaces/[^/]+/leases")


def settle(emu: KubernetesApiEmulator, quiet_s: float = 0.4, timeout: float = 8) -> None:
    """Wait until the operator has written nothing for `quiet_s` seconds (a leader renewing its
    Lease does not count)."""
    def count() -> int:
        return len([r for r in emu.write_requests() if not LEASE_PATH.search(r.path)])

    deadline = time.monotonic() + timeout
    last, since = count(), time.monotonic()
    while time.monotonic() - since < quiet_s:
        if time.monotonic() > deadline:
            raise AssertionError(f"the operator kept writing for {timeout}s: {emu.write_requests()[-5:]}")
        time.sleep(POLL_S)
        now = count()
        if now != last:
            last, since = now, time.monotonic()


# --- policies ---------------------------------------------------------------------------


def policy(emu: KubernetesApiEmulator, name: str) -> dict | None:
    return emu.objects(POLICIES).get(name)


def status(emu: KubernetesApiEmulator, name: str) -> dict:
    return (policy(emu, name) or {}).get("status") or {}


def condition(emu: KubernetesApiEmulator, name: str, type_: str) -> dict:
    for cond in status(emu, name).get("conditions") or []:
        if cond.get("type") == type_:
            return cond
    return {}


def conditions(emu: KubernetesApiEmulator, name: str) -> dict[str, str]:
    """{type: status} of every condition."""
    return {c["type"]: c["status"] for c in status(emu, name).get("conditions") or []}


def observed(emu: KubernetesApiEmulator, name: str) -> bool:
    """Status is written for the policy's current generation."""
    body = policy(emu, name)
    return body is not None and (body.get("status") or {}).get("observedGeneration") == body["metadata"]["generation"]


def wait_observed(emu: KubernetesApiEmulator, name: str, timeout: float = 5, **expected: str) -> dict:
    """Wait until status is for the current generation and each condition has the given status
    (`Ready="True"`); returns the status."""
    def done() -> bool:
        if not observed(emu, name):
            return False
        current = conditions(emu, name)
        return all(current.get(type_) == value for type_, value in expected.items())
    wait_for(done, timeout, lambda: f"status of {name}: {status(emu, name)!r}")
    return status(emu, name)


def update_spec(emu: KubernetesApiEmulator, name: str, change: Callable[[dict], None]) -> dict:
    """Change the policy's spec the way `kubectl edit` would (a full replace); generation goes up."""
    body = copy.deepcopy(policy(emu, name))
    assert body is not None, f"policy {name} is gone"
    change(body["spec"])
    return emu.objects(POLICIES).put(body)


def counter(emu: KubernetesApiEmulator, name: str, field: str) -> int:
    return int(status(emu, name).get(field) or 0)


# --- children ---------------------------------------------------------------------------


def runtime_classes(emu: KubernetesApiEmulator) -> dict[str, dict]:
    return {o["metadata"]["name"]: o for o in emu.objects(RUNTIME_CLASSES).list()}


def config_maps(emu: KubernetesApiEmulator, namespace: str = OUTPUT_NAMESPACE) -> dict[str, dict]:
    return {o["metadata"]["name"]: o for o in emu.objects(CONFIG_MAPS).list(namespace)}


def get_rc(emu: KubernetesApiEmulator, name: str) -> dict | None:
    return emu.objects(RUNTIME_CLASSES).get(name)


def get_cm(emu: KubernetesApiEmulator, name: str, namespace: str = OUTPUT_NAMESPACE) -> dict | None:
    return emu.objects(CONFIG_MAPS).get(name, namespace)


def pod_fixed(emu: KubernetesApiEmulator, name: str) -> dict | None:
    obj = get_rc(emu, name)
    return ((obj or {}).get("overhead") or {}).get("podFixed")


def edit(emu: KubernetesApiEmulator, resource: str, name: str, change: Callable[[dict], None],
         namespace: str | None = None) -> dict:
    """A hand edit (`kubectl edit`): read, change, write back."""
    body = copy.deepcopy(emu.objects(resource).get(name, namespace))
    assert body is not None, f"{resource} {name} does not exist"
    change(body)
    return emu.objects(resource).put(body, namespace)


def versions(objects: dict[str, dict]) -> dict[str, str]:
    return {name: o["metadata"]["resourceVersion"] for name, o in objects.items()}


# --- events and the request log --------------------------------------------------------------


def events(emu: KubernetesApiEmulator, reason: str | None = None, type_: str | None = None) -> list[dict]:
    """Kubernetes Events from both events APIs, oldest first."""
    found = [*emu.objects("v1/events").list(), *emu.objects("events.k8s.io/v1/events").list()]
    found.sort(key=lambda e: int(e["metadata"]["resourceVersion"]))
    return [e for e in found
            if reason is None or e.get("reason") == reason
            if type_ is None or e.get("type") == type_]


def event_messages(emu: KubernetesApiEmulator, reason: str, type_: str | None = None) -> list[str]:
    return [e.get("message") or e.get("note") or "" for e in events(emu, reason, type_)]


def writes(emu: KubernetesApiEmulator, path: re.Pattern[str] | str | None = None,
           method: str | None = None) -> list:
    found = emu.write_requests(path)
    return [r for r in found if method is None or r.method == method]


def describe_writes(records: list) -> list[str]:
    return [f"{r.method} {r.path} -> {r.status}" for r in records]


def named(records: list) -> list[str | None]:
    """The object names that PUT/DELETE requests address, or the body's name for a POST."""
    names = []
    for r in records:
        if r.method == "POST":
            names.append(((r.body or {}).get("metadata") or {}).get("name"))
        else:
            names.append(r.path.rstrip("/").split("/")[-1])
    return names


def passes(caplog: Any, policy: str, trigger: str | None = None) -> int:
    """How many passes of `policy` (for `trigger`) the operator logged. Passes that read only the
    operator's caches make no request to count them by; the test must have called
    `caplog.set_level(logging.DEBUG, logger="kata_sizing.reconcile")` (a pass that changed
    nothing says so at DEBUG)."""
    return sum(1 for r in caplog.records if getattr(r, "policy", None) == policy
               and (trigger is None or getattr(r, "trigger", None) == trigger))


# --- the operator under test -----------------------------------------------------------------


class OperatorCluster:
    """An emulator plus the real operator (fresh kopf registry per start) in its own thread.

    The `cluster` fixtures build one; `start()` may be called again after `stop()` to model an
    operator restart."""

    def __init__(self, emu: KubernetesApiEmulator, monkeypatch: Any) -> None:
        self.emu = emu
        self._monkeypatch = monkeypatch
        self.operator: KopfThread | None = None
        self.memo: Any = None  # kopf's memo of the running operator (its caches, the measurement loop)

    def start(self, resync_s: float = 300, settings_hook: Callable[[Any], None] | None = None,
              lease: Any = None, **memo: Any):
        """`lease`: a leader.LeaseOptions to run as one leader-elected replica. Other keywords go
        into kopf's memo (`kubelet`: a kubelet.KubeletOptions, `measurement_clock`: a
        measurement.Clock)."""
        import kopf

        from kata_sizing.controller import handlers, worker

        assert self.operator is None, "the operator is already running"
        assert self.emu.kubeconfig is not None
        # Read as each pass ends; set here, so a short one never leaks into other tests.
        self._monkeypatch.setattr(worker, "RESYNC_INTERVAL_S", resync_s)
        operator = self.operator = KopfThread(self.emu.kubeconfig, registry=handlers.build_registry(),
                                              settings_hook=settings_hook, memo=kopf.Memo(lease=lease, **memo))
        self.memo = operator.memo
        operator.start()
        return operator

    def stop(self) -> None:
        operator, self.operator = self.operator, None
        if operator is not None:
            operator.stop()  # re-raises whatever crashed the operator

    def create(self, body: dict) -> dict:
        return self.emu.objects(POLICIES).create(body)
