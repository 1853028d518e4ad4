"""The operator against the API server's own limit, in the same run (`make bench`, section
`limit`).

For 1, 50 and 200 policies, the very objects and status the operator's first pass of each
policy writes (its own builders: `plan.intent_of` renders them as `kata-sizing render` does,
`plan.plan_pass` decides, `status.conclude` makes the status, for an empty cluster) are written
by a plain client (`bench/plain_client.py`: nothing but the requests, at the connection pool the
operator's writes go through) straight to the real API server, and by the operator. Three
figures each, from the API server's audit log (its own clock: the end of the last write that
makes the result whole):

- cold start: the process started (the operator, or the plain client as a process of its own)
  -> every object of every policy created and every status written;
- policy created -> its objects and status written, with the others in place;
- spec change (class s's memory) -> every object it changes rewritten and the status written.

Printed as figures and as ratios operator / plain client (median to median, p95 to p95).
Skipped with a line saying why where the control plane is not built.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from datetime import datetime
from pathlib import Path

from bench import pass_profile
from bench.plain_client import PlainClient
from bench.realserver_bench import _peak_rss_mib, quiet
from bench.run import ROOT, cpu_seconds, percentile
from tests.support.policies import explicit_classes_policy
from tests.support.realcluster import (
    BINARY,
    KUBECTL,
    OPERATOR_USER,
    POLICIES,
    ControlPlane,
    RealOperator,
    installed_control_plane,
)

Report = Callable[[str, str, str, str], None]
SIZES = (1, 50, 200)
RATIO_TARGET = 1.3
# The chart's memory limit for the operator (charts/kata-sizing/values.yaml: resources.limits.memory).
CHART_MEMORY_LIMIT_MIB = 256
MANAGED = "app.kubernetes.io/managed-by=kata-sizing"
# The shipped intervals: a resync every 5 minutes, node guidance at most every 10 s.
OPERATOR_ENV = {"resync_s": 300, "guidance_s": 10}

Key = tuple[str, str, str]  # (audit resource, namespace, name)
PLACEHOLDER_UID = "00000000-0000-0000-0000-000000000000"


# --- what the operator's first pass of a policy writes, from its own code ----------------------


def served_admission(cp: ControlPlane) -> dict[str, str]:
    """{kind: version} of the admission kinds the server serves, as the operator's discovery finds."""
    from kata_sizing.controller.kinds import ADMISSION_GROUP, ADMISSION_KINDS, ADMISSION_VERSIONS, KINDS

    served: dict[str, str] = {}
    plurals = {KINDS[kind].plural: kind for kind in ADMISSION_KINDS}
    for version in ADMISSION_VERSIONS:
        found = cp.get(f"/apis/{ADMISSION_GROUP}/{version}") or {}
        for resource in found.get("resources") or []:
            kind = plurals.get(resource.get("name"))
            if kind is not None and kind not in served:
                served[kind] = version
    return served


def first_pass(body: dict, served: dict[str, str]):
    """(the write actions, the status) of the operator's first pass of `body` on a cluster with
    none of its objects and no node."""
    from kata_sizing.controller.execute import DONE, Outcome, Result
    from kata_sizing.controller.plan import Gathered, intent_of, plan_pass
    from kata_sizing.controller.status import conclude, status_fields

    intent = intent_of(body, nodes=[], admission_versions=served)
    gathered = Gathered(body=body, trigger="apply", intent=intent, nodes_known=True, unmanaged=(),
                        pod_findings=(), webhook_serving=False)
    plan = plan_pass(gathered)
    outcome = Outcome(results={a.key: Result(DONE, f"created {a.key}") for a in plan.writes})
    fields = status_fields(conclude(gathered, plan, outcome).status)
    return plan.writes, {k: v for k, v in fields.items() if v is not None}


def _path(obj: dict, named: bool) -> str:
    from kata_sizing.controller.kinds import KINDS
    from kata_sizing.controller.kube import KubeApi

    kind = KINDS[obj["kind"]].at(obj["apiVersion"].rpartition("/")[2])
    meta = obj["metadata"]
    return KubeApi.path(kind, meta.get("namespace"), meta["name"] if named else None)


def _after(obj: dict) -> list[str]:
    """The objects (by path) a write must follow, as the operator orders them (plan.binding_refs):
    the API server refuses a binding whose admission policy it cannot find yet."""
    from kata_sizing.controller.kinds import KINDS
    from kata_sizing.controller.kube import KubeApi
    from kata_sizing.controller.plan import binding_refs

    return [KubeApi.path(KINDS[ref[0]], ref[1], ref[2]) for ref in binding_refs(obj) if ref is not None]


def _audit_key(obj: dict) -> Key:
    from kata_sizing.controller.kinds import KINDS

    return KINDS[obj["kind"]].plural, obj["metadata"].get("namespace") or "", obj["metadata"]["name"]


def _status_key(policy: str) -> Key:
    return "katasizingpolicies/status", "", policy


def batch(policy: str, creates: Iterable[dict], replaces: Iterable[dict], status: dict) -> dict:
    from kata_sizing.controller.kinds import KINDS
    from kata_sizing.controller.kube import KubeApi
    from kata_sizing.core.model import KIND

    writes = [["POST", _path(o, False), o, _path(o, True), _after(o)] for o in creates]
    writes += [["PUT", _path(o, True), o, _path(o, True), _after(o)] for o in replaces]
    return {"policy": policy, "writes": writes, "status": status,
            "status_path": KubeApi.path(KINDS[KIND], None, policy, "status")}


def expected_keys(batches: list[dict]) -> set[Key]:
    keys = {_status_key(b["policy"]) for b in batches}
    for b in batches:
        keys |= {_audit_key(write[2]) for write in b["writes"]}
    return keys


def creation(body: dict, served: dict[str, str], with_shared: bool = False) -> dict:
    """The first pass's writes; the admission policies every policy shares only `with_shared`
    (the first policy of a cold start: the others find them, as the operator's passes do)."""
    from kata_sizing.core.render import SHARED_LABEL

    writes, status = first_pass(body, served)
    creates = [a.body for a in writes if with_shared or SHARED_LABEL not in a.body["metadata"].get("labels", {})]
    return batch(body["metadata"]["name"], creates, [], status)


def cold_start_batches(bodies: list[dict], served: dict[str, str]) -> list[dict]:
    return [creation(b, served, with_shared=i == 0) for i, b in enumerate(bodies)]


def spec_change(before: dict, after: dict, served: dict[str, str],
                resource_version: Callable[[dict], str] | None = None) -> dict:
    """The objects `after` renders differently from `before` (the operator replaces those), and
    the status. The replacements carry `resource_version(object)`: the API server refuses an
    update of an admission object without one, and the operator has it from its cache."""
    old = {a.key: a.body for a in first_pass(before, served)[0]}
    writes, status = first_pass(after, served)
    changed = [copy.deepcopy(a.body) for a in writes if old.get(a.key) != a.body]
    if resource_version is not None:
        for body in changed:
            body["metadata"]["resourceVersion"] = resource_version(body)
    return batch(after["metadata"]["name"], [], changed, status)


# --- the audit log: when each write ended ------------------------------------------------------


def _operator_writes(entries: list[dict]) -> Iterator[tuple[Key, float, int, str]]:
    """(key, end in epoch seconds, code, verb) of each completed write by the operator's identity
    (the plain client uses it too) among audit `entries`."""
    for entry in entries:
        if entry.get("stage") != "ResponseComplete" or entry.get("verb") not in ("create", "update", "patch"):
            continue
        if (entry.get("user") or {}).get("username") != OPERATOR_USER:
            continue
        ref = entry.get("objectRef") or {}
        resource = ref.get("resource", "") + (f"/{ref['subresource']}" if ref.get("subresource") else "")
        yield ((resource, ref.get("namespace", ""), ref.get("name", "")),
               datetime.fromisoformat(entry["stageTimestamp"]).timestamp(),
               (entry.get("responseStatus") or {}).get("code", 0), entry["verb"])


def write_times(cp: ControlPlane, since: int, entries: list[dict] | None = None) -> dict[Key, float]:
    """The end of the first successful write of each object since byte `since` of the audit log
    (or among `entries` read from there)."""
    found: dict[Key, float] = {}
    for key, end, code, _ in _operator_writes(cp.audit_entries(since) if entries is None else entries):
        if code < 400 and key not in found:
            found[key] = end
    return found


def first_request(cp: ControlPlane, since: int, writes_only: bool = False) -> float | None:
    """When the API server received the first request (with `writes_only`, the first write of a
    policy's object or status) of the operator's identity since byte `since` of the audit log
    (epoch seconds): what separates reacting from writing."""
    received = []
    for entry in cp.audit_entries(since):
        if (entry.get("user") or {}).get("username") != OPERATOR_USER or "requestReceivedTimestamp" not in entry:
            continue
        if writes_only and (entry.get("verb") not in ("create", "update", "patch")
                            or (entry.get("objectRef") or {}).get("resource") == "katasizingpolicies"):
            continue  # the policy's own writes (its status) are not its objects' writes
        received.append(datetime.fromisoformat(entry["requestReceivedTimestamp"]).timestamp())
    return min(received, default=None)


def failed_writes(entries: list[dict]) -> dict[Key, tuple[float, int]]:
    """(the end, the code) of the last write of each object that the API server ended with 504
    (its own timeout: the object may be stored all the same) or a create answered 409 (a retry of
    such a write finding it stored), among audit `entries`."""
    return {key: (end, code) for key, end, code, verb in _operator_writes(entries)
            if code == 504 or code == 409 and verb == "create"}


# Writes the API server ended with its own timeout (504) during a wait, per writer: on a slow
# machine, at 200 policies, some admission objects' creates outlast the operator's 30 s request
# timeout (the server compiles each one's CEL); the object is stored all the same.
SERVER_TIMEOUTS: dict[str, int] = {}


def wait_written(cp: ControlPlane, since: int, keys: set[Key], timeout: float, interval: float = 0.05,
                 paths: dict[Key, str] | None = None, who: str = "") -> float | None:
    """The end of the last of `keys`' writes, once all have happened; None after `timeout`.
    With `paths` (an object's path by key), an object whose write the server ended with 504, or
    whose create was answered 409 after such a write, counts as written at the end of that
    request once it exists: the state is what was asked for, only the answer was lost."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        entries = cp.audit_entries(since)
        times = write_times(cp, since, entries)
        missing = keys - times.keys()
        failed = failed_writes(entries) if paths is not None else {}
        if not missing or missing <= failed.keys() and all(k in paths and cp.get(paths[k]) for k in missing):
            if paths is not None:
                SERVER_TIMEOUTS[who] = SERVER_TIMEOUTS.get(who, 0) + sum(
                    1 for _, _, code, _ in _operator_writes(entries) if code == 504)
            return max([times[k] for k in keys - missing] + [failed[k][0] for k in missing])
        time.sleep(interval)
    return None


def expected_paths(batches: list[dict]) -> dict[Key, str]:
    """The path of each object `batches` create or replace, by its key."""
    return {_audit_key(body): _path(body, True) for b in batches for _, _, body, *_ in b["writes"]}


# --- the cluster between runs ------------------------------------------------------------------


ADMISSION_COLLECTIONS = ("validatingadmissionpolicies", "validatingadmissionpolicybindings",
                         "mutatingadmissionpolicies", "mutatingadmissionpolicybindings")


def clear(cp: ControlPlane) -> None:
    """No policy and none of their objects: policies go (a finalizer, an older operator's, is
    dropped), the objects are deleted by collection (one request per kind)."""
    for name in cp.items(POLICIES):
        cp.merge_patch(f"{POLICIES}/{name}", {"metadata": {"finalizers": None}})
        cp.delete(f"{POLICIES}/{name}")
    selector = f"?labelSelector={MANAGED}"
    paths = ["/apis/node.k8s.io/v1/runtimeclasses", "/api/v1/namespaces/kata-sizing/configmaps",
             *(f"/apis/admissionregistration.k8s.io/v1/{c}" for c in ADMISSION_COLLECTIONS)]
    for path in paths:
        cp.request("DELETE", path + selector)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if not cp.items(POLICIES) and not any(cp.request("GET", p + selector)["items"] for p in paths):
            return
        time.sleep(0.2)
    raise RuntimeError("the cluster did not empty in 120 s")


def create_policies(cp: ControlPlane, names: list[str]) -> list[dict]:
    return [cp.create(POLICIES, explicit_classes_policy(name)) for name in names]


def toggled(body: dict) -> dict:
    changed = copy.deepcopy(body)
    first = changed["spec"]["classes"][0]
    first["memory"] = "768Mi" if first["memory"] != "768Mi" else "1Gi"
    return changed


# --- one measurement each --------------------------------------------------------------------


def plain_cold_start(cp: ControlPlane, work: Path, bodies: list[dict], served: dict[str, str],
                     connections: int) -> tuple[float, float] | None:
    batches = cold_start_batches(bodies, served)
    path = work / "batches.json"
    path.write_text(json.dumps(batches))
    mark = cp.audit_offset()
    start = time.time()
    proc = subprocess.run([sys.executable, "-m", "bench.plain_client", str(path), "--kubeconfig",
                           str(cp.operator_kubeconfig), "--connections", str(connections)],
                          capture_output=True, text=True, timeout=600, cwd=ROOT)
    if proc.returncode != 0:
        raise RuntimeError(f"the plain client failed: {proc.stderr[-2000:]}")
    end = wait_written(cp, mark, expected_keys(batches), 30, paths=expected_paths(batches), who="plain")
    return _split(cp, mark, start, end)


def _split(cp: ControlPlane, mark: int, start: float, end: float | None,
           writes_only: bool = False) -> tuple[float, float] | None:
    """(start -> all written, start -> the first request (write) received), or None."""
    if end is None:
        return None
    first = first_request(cp, mark, writes_only)
    return end - start, (first - start) if first is not None else float("nan")


def operator_cold_start(cp: ControlPlane, work: Path, bodies: list[dict], served: dict[str, str],
                        code: Path | None = None, profile: Path | None = None):
    """(seconds, the running operator); `code`: the `operator/` directory of another revision;
    `profile`: a folder for its profile (bench/pass_profile.py), started later by a signal."""
    batches = cold_start_batches(bodies, served)
    keys = expected_keys(batches)
    mark = cp.audit_offset()
    start = time.time()
    env = {"PYTHONPATH": str(code)} if code else {}
    if profile is not None:
        env = pass_profile.environment(profile, "baseline" if code else "operator", code)
    operator = RealOperator(cp, work).start(**OPERATOR_ENV, **env)
    try:
        end = wait_written(cp, mark, keys, 600, interval=0.5, paths=expected_paths(batches),
                           who="baseline" if code else "operator")
    except BaseException:
        operator.stop()
        raise
    if end is None:
        log = operator.log()[-2000:]
        operator.stop()
        raise RuntimeError(f"the operator did not write every object in 600 s:\n{log}")
    return _split(cp, mark, start, end), operator


# kopf's `settings.batching.idle_timeout`: a policy's worker task ends this long after its last event.
KOPF_IDLE_TIMEOUT_S = 5.0


def settle(pid: int, idle_share: float = 0.02, window_s: float = 1.0, timeout_s: float = 60.0) -> bool:
    """Wait until the cold start is over: kopf's worker of each policy has ended (they end
    KOPF_IDLE_TIMEOUT_S after the policy's last event, 200 of them together) and the operator
    spends under `idle_share` of a core over `window_s`. Its cold start goes on after every object
    is written (those workers, the measurement's and the guidance's first rounds), and a sample
    taken then counted that tail, growing with the number of policies, as a policy's own CPU.
    False when it never got that idle within `timeout_s`."""
    time.sleep(KOPF_IDLE_TIMEOUT_S + 1.0)
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        began = cpu_seconds(pid)
        time.sleep(window_s)
        if cpu_seconds(pid) - began < idle_share * window_s:
            return True
    return False


@contextlib.contextmanager
def cpu_of(operator: RealOperator, into: list[float]) -> Iterator[None]:
    """The CPU seconds the operator process spent while the block ran, appended to `into`."""
    began = cpu_seconds(operator.process.pid)
    yield
    into.append(cpu_seconds(operator.process.pid) - began)


def operator_created(cp: ControlPlane, name: str, served: dict[str, str]) -> float | None:
    mark = cp.audit_offset()
    start = time.time()
    body = cp.create(POLICIES, explicit_classes_policy(name))
    end = wait_written(cp, mark, expected_keys([creation(body, served)]), 30, interval=0.02)
    quiet(cp, 0.5, 30)
    return _split(cp, mark, start, end, writes_only=True)


def operator_spec_change(cp: ControlPlane, name: str, served: dict[str, str]) -> float | None:
    before = cp.get(f"{POLICIES}/{name}")
    after = toggled(before)
    mark = cp.audit_offset()
    start = time.time()
    after = cp.request("PUT", f"{POLICIES}/{name}", after)
    end = wait_written(cp, mark, expected_keys([spec_change(before, after, served)]), 30, interval=0.02)
    quiet(cp, 0.5, 30)
    return _split(cp, mark, start, end, writes_only=True)


def plain_created(cp: ControlPlane, loop: asyncio.AbstractEventLoop, client: PlainClient, name: str,
                  served: dict[str, str]) -> float | None:
    # Decided before the clock starts, with a stand-in for the uid the create returns (the
    # objects' ownerReference), so only the requests are timed.
    stand_in = explicit_classes_policy(name)
    stand_in["metadata"].update(uid=PLACEHOLDER_UID, generation=1)
    planned = json.dumps(creation(stand_in, served))
    mark = cp.audit_offset()
    start = time.time()
    body = cp.create(POLICIES, explicit_classes_policy(name))
    work = json.loads(planned.replace(PLACEHOLDER_UID, body["metadata"]["uid"]))
    loop.run_until_complete(client.write([work]))
    end = wait_written(cp, mark, expected_keys([work]), 30, interval=0.02)
    return _split(cp, mark, start, end, writes_only=True)


def plain_spec_change(cp: ControlPlane, loop: asyncio.AbstractEventLoop, client: PlainClient, name: str,
                      served: dict[str, str]) -> float | None:
    before = cp.get(f"{POLICIES}/{name}")
    after = toggled(before)
    after["metadata"]["generation"] = before["metadata"]["generation"] + 1
    # Decided before the clock starts, as the operator's caches hold what it needs.
    work = spec_change(before, after, served, lambda body: cp.get(_path(body, True))["metadata"]["resourceVersion"])
    mark = cp.audit_offset()
    start = time.time()
    cp.request("PUT", f"{POLICIES}/{name}", toggled(before))
    loop.run_until_complete(client.write([work]))
    end = wait_written(cp, mark, expected_keys([work]), 30, interval=0.02)
    return _split(cp, mark, start, end, writes_only=True)


# --- the section ---------------------------------------------------------------------------------


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms" if seconds < 10 else f"{seconds:.1f} s"


def _summarize(report: Report, what: str, operator: list[float], plain: list[float],
               against: str = "plain client") -> None:
    if not operator or not plain:
        report(f"{what}: no complete sample (operator {len(operator)}, {against} {len(plain)})", "", "", "MISS")
        return
    for label, fraction in (("median", 0.5), ("p95", 0.95)):
        op = statistics.median(operator) if fraction == 0.5 else percentile(operator, fraction)
        base = statistics.median(plain) if fraction == 0.5 else percentile(plain, fraction)
        ratio = op / base
        if against == "plain client":
            report(f"{what}, {label} of {len(operator)}: operator {_ms(op)}, plain client {_ms(base)}",
                   f"{ratio:.2f}x", f"<= {RATIO_TARGET}x", "PASS" if ratio <= RATIO_TARGET else "MISS")
        else:
            report(f"{what}, {label} of {len(operator)}: {_ms(op)} against {_ms(base)}", f"{ratio:.2f}x", "", "")


def bench_limit(report: Report, quick: bool = False) -> None:
    if not BINARY.exists() or not KUBECTL.exists():
        report("real control plane not built (`make controlplane` needs Go): section skipped", "", "", "SKIP")
        return
    from kata_sizing.controller.kube import CONNECTIONS

    cold_runs = int(os.environ.get("BENCH_LIMIT_RUNS") or (2 if quick else 5))
    samples = int(os.environ.get("BENCH_LIMIT_SAMPLES") or (3 if quick else 4))  # per round
    sizes = tuple(int(n) for n in (os.environ.get("BENCH_LIMIT_SIZES") or "").split(",") if n) or SIZES
    # The `operator/` directory of another revision (`git archive REV operator templates | tar
    # -x -C DIR`, then DIR/operator): its operator takes a turn in every round too. It must write
    # the objects this revision writes (one since the shared admission policies).
    baseline = Path(os.environ["BENCH_LIMIT_BASELINE"]) if os.environ.get("BENCH_LIMIT_BASELINE") else None
    # A folder: each operator's passes (policies created, spec changes) profiled by cProfile
    # (bench/pass_profile.py); the section's times are then cProfile's, slower several times over.
    profiles = os.environ.get("BENCH_LIMIT_PROFILE")
    work = Path(tempfile.mkdtemp(prefix="kata-sizing-limit-"))
    try:
        with installed_control_plane(work) as cp:
            served = served_admission(cp)
            counted = explicit_classes_policy("counted")
            counted["metadata"]["uid"] = PLACEHOLDER_UID
            report(f"plain client: the operator's client pool, {CONNECTIONS} connections; objects a policy "
                   "writes besides its status (the first of a cluster also the shared admission policies, "
                   f"{len(creation(counted, served, with_shared=True)['writes'])})",
                   str(len(creation(counted, served)["writes"])), "", "")
            for size in sizes:
                profile = Path(profiles) / f"{size}-policies" if profiles else None
                _size(report, cp, work, served, size, cold_runs, samples, CONNECTIONS, baseline, profile)
                if profile is not None:
                    _profile_summary(report, profile, size)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _profile_summary(report: Report, folder: Path, size: int) -> None:
    """What share of each operator's profiled CPU each part of its passes took."""
    for who in ("operator", "baseline"):
        paths = sorted(folder.glob(f"{who}-*.pstats"))
        if not paths:
            continue
        total, parts, functions = pass_profile.shares(paths)
        name = "operator" if who == "operator" else "baseline operator"
        report(f"{name} profile, {size} policies: CPU under cProfile, {len(paths)} rounds", f"{total:.2f} s", "", "")
        for part, share in parts:
            report(f"  {part}", f"{share:.0%}", "", "")
        report("  the functions of most own time: " + ", ".join(f"{fn} {share:.0%}" for fn, share in functions),
               "", "", "")


def _size(report: Report, cp: ControlPlane, work: Path, served: dict[str, str], size: int, cold_runs: int,
          samples: int, connections: int, baseline: Path | None = None, profile: Path | None = None) -> None:
    """Rounds turn about (the plain client, the operator and, given `baseline`, the operator of
    that revision, each round starting one later), so that a change of the machine's load falls
    on all: each round a cold start, then, on the cluster it left, `samples` policies created and
    `samples` spec changes."""
    names = [f"p{size}-{i}" for i in range(size)]
    figures: dict[tuple[str, str], list[float]] = {}
    cpu: dict[tuple[str, str], list[float]] = {}  # the operator process's CPU seconds
    peak_mib: dict[str, list[float | None]] = {}

    def keep(who: str, what: str, took: tuple[float, float] | None) -> None:
        if took is not None:
            figures.setdefault((who, what), []).append(took[0])
            figures.setdefault((who, what + " first"), []).append(took[1])

    turns = ("plain", "operator", "baseline") if baseline is not None else ("plain", "operator")
    for run in range(cold_runs):
        for who in turns[run % len(turns):] + turns[:run % len(turns)]:
            clear(cp)
            bodies = create_policies(cp, names)
            if who == "plain":
                keep(who, "cold", plain_cold_start(cp, work, bodies, served, connections))
                loop = asyncio.new_event_loop()
                client = PlainClient(cp.operator_kubeconfig, connections)
                try:
                    loop.run_until_complete(client.__aenter__())
                    for i in range(samples):
                        keep(who, "created", plain_created(cp, loop, client, f"n{size}-{run}-{i}", served))
                    for i in range(samples):
                        keep(who, "changed", plain_spec_change(cp, loop, client, names[i % size], served))
                finally:
                    loop.run_until_complete(client.__aexit__())
                    loop.close()
            else:
                took, operator = operator_cold_start(cp, work, bodies, served,
                                                     baseline if who == "baseline" else None, profile)
                try:
                    keep(who, "cold", took)
                    quiet(cp, 0.5, 30)
                    if not settle(operator.process.pid):
                        report(f"{who} operator, {size} policies: not idle 60 s after its cold start; its samples "
                               "count what it was still doing", "", "", "")
                    # Its CPU until it is idle again: the cold start's tail is the cold start's.
                    cpu.setdefault((who, "cold"), []).append(cpu_seconds(operator.process.pid) / size)
                    if profile is not None:
                        pass_profile.start(operator.process.pid)
                    for i in range(samples):
                        with cpu_of(operator, cpu.setdefault((who, "created"), [])):
                            keep(who, "created", operator_created(cp, f"n{size}-{run}-{i}", served))
                    for i in range(samples):
                        with cpu_of(operator, cpu.setdefault((who, "changed"), [])):
                            keep(who, "changed", operator_spec_change(cp, names[i % size], served))
                    if profile is not None:
                        pass_profile.stop(operator.process.pid, profile, who)
                finally:
                    peak_mib.setdefault(who, []).append(_peak_rss_mib(operator))
                    operator.stop()
    for what, label in (("cold", "cold start"), ("created", "policy created -> all written"),
                        ("changed", "spec change -> all updated")):
        _summarize(report, f"{label}, {size} policies", figures.get(("operator", what), []),
                   figures.get(("plain", what), []))
        # Where the difference lies: before the first request (start-up; the watch event and
        # the decision) or in the writing.
        firsts = {who: [t for t in figures.get((who, what + " first"), []) if t == t] for who in ("operator", "plain")}
        if firsts["operator"] and firsts["plain"]:
            report(f"  of which until the first {'request' if what == 'cold' else 'object written'}, median: operator "
                   f"{_ms(statistics.median(firsts['operator']))}, plain client {_ms(statistics.median(firsts['plain']))}",
                   "", "", "")
        if baseline is not None:
            _summarize(report, f"  {label}, {size} policies, against the baseline's operator",
                       figures.get(("operator", what), []), figures.get(("baseline", what), []), "baseline")
    # The operator's own CPU (utime + stime of its process): for a policy created and a spec
    # change, from the request until it wrote nothing for 0.5 s (its passes, the watch events of its
    # own writes); a cold start's, per policy, from its start (imports included).
    for what, label in (("cold", "cold start, per policy"), ("created", "a policy created"),
                        ("changed", "a spec change")):
        for who in ("operator", "baseline"):
            spent = cpu.get((who, what))
            if spent:
                report(f"{'operator' if who == 'operator' else 'baseline operator'} CPU, {label}, {size} policies, "
                       f"median of {len(spent)}", _ms(statistics.median(spent)), "", "")
    for who in turns:
        if SERVER_TIMEOUTS.get(who):
            report(f"  writes the API server ended with 504 (its timeout) in {who} cold starts, {size} policies; "
                   "each object stored all the same", str(SERVER_TIMEOUTS[who]), "", "")
    SERVER_TIMEOUTS.clear()
    for who in peak_mib:
        peaks = [p for p in peak_mib[who] if p is not None]
        if peaks:
            report(f"{'operator' if who == 'operator' else 'baseline operator'} peak RSS over its rounds, "
                   f"{size} policies", f"{max(peaks):.0f} MiB", f"< {CHART_MEMORY_LIMIT_MIB} MiB",
                   "PASS" if max(peaks) < CHART_MEMORY_LIMIT_MIB else "MISS")
    clear(cp)
