"""`make bench` section "admission": what kata-sizing's admission costs every pod created, on the
real API server (`make controlplane`), every case side by side in one run.

Pods are created at a steady rate into namespaces that differ only in what of kata-sizing's
admission applies to them. Every pod is the same: no runtimeClassName, in a namespace labelled
`katasizing.dev/policy` (the opt-in), so the routing runs and then the validations:

- `unbound`: a namespace no policy binds (the API server's own admission chain alone);
- `CEL`: a policy's bindings of the shared admission policies: the MutatingAdmissionPolicy
  routes, the two ValidatingAdmissionPolicies judge (podfit's CEL);
- `CEL before`: the same with the shared policies' CEL before it was made cheaper
  (bench/fixtures/admission-policies-before.yaml, installed under other names and bound with the
  same parameters), so a change to the CEL is seen against the code before in one run;
- `webhook, 1 replica`: a policy with `routing: Webhook`: the operator's webhook server routes
  (one operator process, called by URL), the ValidatingAdmissionPolicies judge;
- `webhook, 2 replicas`: the same through a Service with two endpoints, two leader-elected
  operator processes (the API server picks an endpoint per call: `--enable-aggregator-routing`,
  since this control plane has no kube-proxy).

The cases take turns in blocks of a few seconds (each round in another order), so machine
load that comes and goes falls on all of them; an idle block per round gives the API server's
background CPU, taken off each block's. Per case: the create latency as the client sees it
(p50/p95/p99, from send to answer), the p99 against the unbound namespace's, the pods refused
or admitted without a class, the kube-apiserver process's CPU seconds per thousand creates
(/proc/PID/stat; the control plane runs it as a child process of its own), the webhook
processes' CPU, and the time the API server itself spent in its mutating and validating
admission (its `apiserver_admission_step_admission_duration_seconds`), the reading of what costs
what. Three pod shapes: one container; an init container and a sidecar beside the app; the
largest (`BENCH_ADMISSION_INITS` init containers, half of them sidecars), since CEL's cost
grows with the pod. Nothing here asserts: the goals are figures.

The runtime CEL cost of each shape against the API server's limits (1,000,000 per expression,
10,000,000 per policy evaluation) is computed by `.tools/celcost` (tests/controlplane/celcost,
the API server's own CEL library; `make celcost`): the API server estimates no cost for an
admission policy when it is created (its `object` is untyped there) and reports none at run time.

Settings (environment, or flags of `python -m bench.admission_bench`): BENCH_ADMISSION_RATE
(creates a second, default 50), BENCH_ADMISSION_SECONDS (seconds of each case and shape, default
60), BENCH_ADMISSION_BLOCK_SECONDS (default 5), BENCH_ADMISSION_INITS (default 400),
BENCH_ADMISSION_LARGEST_RATE (creates a second of the largest shape, default a 25th of the rate:
each such pod is about 60 KiB of JSON).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import copy
import functools
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import yaml

from bench.run import ROOT, Report, cpu_seconds, percentile, verdict
from tests.support import realnode
from tests.support.nodeoperator import serving_certificate
from tests.support.realcluster import (
    BINARY,
    KUBECTL,
    ApiError,
    ControlPlane,
    RealOperator,
    free_port,
    installed_control_plane,
)

CELCOST = ROOT / ".tools" / "celcost"
BEFORE_FIXTURE = ROOT / "bench" / "fixtures" / "admission-policies-before.yaml"
WEBHOOK_TEMPLATE = ROOT / "overlays" / "webhook" / "mutatingwebhookconfiguration.yaml"
ADMISSION = "/apis/admissionregistration.k8s.io/v1"
POLICY_LABEL = "katasizing.dev/policy"
BENCH_LABEL = "kata-sizing-bench/route"
OPERATOR_NAMESPACE = "kata-sizing"
SERVICE = "kata-sizing-bench-webhook"
PAUSE = "registry.k8s.io/pause:3.10"
LEASE_ARGS = ("--leader-elect", "--lease-duration", "15", "--renew-deadline", "10", "--retry-period", "2")

# The goals of issue "What our admission costs every pod" (docs/performance.md).
CEL_P99_RATIO = 1.1
WEBHOOK_P99_MS = 5.0
# The API server's CEL limits (k8s.io/apiserver/pkg/apis/cel/config.go, 1.37.2).
PER_CALL_LIMIT = 1_000_000
PER_EVALUATION_BUDGET = 10_000_000

CEL_POLICY, WEBHOOK_POLICY = "adm-cel", "adm-webhook"


@dataclass(frozen=True)
class Case:
    name: str
    namespace: str
    policy: str | None  # the policy whose opt-in label the namespace carries
    route: str | None = None  # which bench webhook configuration matches the namespace
    webhook: bool = False


CASES = (
    Case("unbound", "adm-unbound", None),
    Case("CEL", "adm-cel", CEL_POLICY),
    Case("CEL before", "adm-cel-before", CEL_POLICY),
    Case("webhook, 1 replica", "adm-webhook-1", WEBHOOK_POLICY, route="one", webhook=True),
    Case("webhook, 2 replicas", "adm-webhook-2", WEBHOOK_POLICY, route="two", webhook=True),
)
IDLE = "idle"


# The pod shapes (pod_spec).
ONE, SIDECAR, LARGEST = "one container", "init container + sidecar", "largest"


@dataclass
class Settings:
    rate: float = 50.0
    seconds: float = 60.0
    block_seconds: float = 5.0
    inits: int = 400
    largest_rate: float | None = None
    shapes: tuple[str, ...] = (ONE, SIDECAR, LARGEST)
    # Bisect, for each version of the CEL, the most init containers a pod may have and be judged
    # (about 30 runs of .tools/celcost).
    search_largest: bool = True

    @classmethod
    def from_env(cls, quick: bool = False) -> Settings:
        settings = cls(seconds=15.0 if quick else 60.0)
        for name, attr, kind in (("RATE", "rate", float), ("SECONDS", "seconds", float),
                                 ("BLOCK_SECONDS", "block_seconds", float), ("INITS", "inits", int),
                                 ("LARGEST_RATE", "largest_rate", float)):
            value = os.environ.get(f"BENCH_ADMISSION_{name}")
            if value:
                setattr(settings, attr, kind(value))
        return settings

    def rate_of(self, shape: str) -> float:
        # A pod of 400 init containers is about 60 KiB of JSON: the API server alone needs about
        # 40 ms of CPU to store one, and the CEL before this release 0.65 s more, so the largest
        # shape comes slower, lest the machine's two cores saturate and only queueing be measured.
        if shape == LARGEST:
            return self.largest_rate or max(1.0, self.rate / 25)
        return self.rate


# --- the pods ------------------------------------------------------------------------------------

def _container(name: str, cpu: str, memory: str, sidecar: bool = False) -> dict:
    return {"name": name, "image": PAUSE, **({"restartPolicy": "Always"} if sidecar else {}),
            "resources": {"limits": {"cpu": cpu, "memory": memory}}}


def pod_spec(shape: str, inits: int) -> dict:
    """The pod of a shape, as users write them: limits on every container, no runtimeClassName
    (the namespace opts in). All fit class s (1 CPU, 1Gi) of the bench policies."""
    app = _container("app", "500m", "512Mi")
    if shape == ONE:
        return {"containers": [app]}
    if shape == SIDECAR:
        return {"initContainers": [_container("setup", "100m", "64Mi"), _container("proxy", "100m", "128Mi", True)],
                "containers": [app]}
    # Half of them sidecars, alternating: every plain init container comes after sidecars, the
    # case the init-peak rule sums (docs/admission.md).
    return {"initContainers": [_container(f"i{i}", "1m", "1Mi", sidecar=i % 2 == 1) for i in range(inits)],
            "containers": [app]}


def shapes(settings: Settings) -> dict[str, dict]:
    return {shape: pod_spec(shape, settings.inits) for shape in settings.shapes}


def shape_title(shape: str, inits: int) -> str:
    return f"largest ({inits} init containers, half sidecars)" if shape == LARGEST else shape


# --- the policies and the webhook ----------------------------------------------------------------

CLASSES = [{"name": "s", "cpu": "1", "memory": "1Gi"}, {"name": "m", "cpu": "2", "memory": "4Gi"},
           {"name": "l", "cpu": "4", "memory": "16Gi"}]


def policy(name: str, namespaces: list[str], routing: str = "Auto") -> dict:
    return {"apiVersion": "katasizing.dev/v1alpha1", "kind": "KataSizingPolicy", "metadata": {"name": name},
            "spec": {"shim": "qemu-runtime-rs", "classes": CLASSES,
                     "admission": {"namespaces": {"names": namespaces}, "routing": routing}}}


def before_objects(cp: ControlPlane) -> list[dict]:
    """The shared policies of before (renamed, unlabelled: no operator takes them for its own) and
    bindings of them like the CEL policy's own, with its parameters, for the `CEL before` case."""
    renamed = {}
    objects = []
    for obj in yaml.safe_load_all(BEFORE_FIXTURE.read_text()):
        if not obj:
            continue
        new = obj["metadata"]["name"].replace("kata-sizing-", "kata-sizing-bench-before-")
        renamed[obj["metadata"]["name"]] = new
        objects.append({**obj, "metadata": {"name": new}})
    for plural, kind in (("validatingadmissionpolicybindings", "ValidatingAdmissionPolicyBinding"),
                         ("mutatingadmissionpolicybindings", "MutatingAdmissionPolicyBinding")):
        for name, binding in cp.items(f"{ADMISSION}/{plural}", f"{POLICY_LABEL}={CEL_POLICY}").items():
            spec = copy.deepcopy(binding["spec"])
            spec["policyName"] = renamed[spec["policyName"]]
            spec["matchResources"] = {"namespaceSelector": {"matchExpressions": [
                {"key": "kubernetes.io/metadata.name", "operator": "In", "values": ["adm-cel-before"]}]}}
            objects.append({"apiVersion": "admissionregistration.k8s.io/v1", "kind": kind,
                            "metadata": {"name": name.replace("kata-sizing-", "kata-sizing-bench-before-")},
                            "spec": spec})
    return objects


def webhook_configuration(route: str, client_config: dict) -> dict:
    """The shipped MutatingWebhookConfiguration's namespace hook (overlays/webhook/, as the chart
    renders it), matching only this bench case's namespace."""
    shipped = yaml.safe_load(WEBHOOK_TEMPLATE.read_text())
    (hook,) = [copy.deepcopy(h) for h in shipped["webhooks"] if h["name"].startswith("route-namespace-pod")]
    hook["clientConfig"] = client_config
    hook["namespaceSelector"].setdefault("matchLabels", {})[BENCH_LABEL] = route
    return {"apiVersion": shipped["apiVersion"], "kind": shipped["kind"],
            "metadata": {"name": f"kata-sizing-bench-{route}"}, "webhooks": [hook]}


def service_objects(address: str, ports: list[int]) -> list[dict]:
    """A Service without selector and one EndpointSlice per replica (the API server resolves a
    webhook's service through its EndpointSlices with --enable-aggregator-routing)."""
    service = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": SERVICE, "namespace": OPERATOR_NAMESPACE},
               "spec": {"ports": [{"name": "https", "port": 443, "targetPort": ports[0], "protocol": "TCP"}]}}
    slices = [{"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
               "metadata": {"name": f"{SERVICE}-{i}", "namespace": OPERATOR_NAMESPACE,
                            "labels": {"kubernetes.io/service-name": SERVICE,
                                       "endpointslice.kubernetes.io/managed-by": "kata-sizing-bench"}},
               "addressType": "IPv4", "endpoints": [{"addresses": [address], "conditions": {"ready": True}}],
               "ports": [{"name": "https", "port": port, "protocol": "TCP"}]} for i, port in enumerate(ports)]
    return [service, *slices]


# --- measuring ------------------------------------------------------------------------------------


def children_of(pid: int) -> dict[int, list[str]]:
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found[int(entry.name)] = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except (OSError, ValueError, IndexError):
            continue
    return found


def apiserver_pid(cp: ControlPlane) -> int:
    """The control plane runs kube-apiserver as a child process of its own binary."""
    assert cp.process is not None, "the control plane is not running"
    for pid, argv in children_of(cp.process.pid).items():
        if len(argv) > 1 and argv[1] == "kube-apiserver":
            return pid
    raise RuntimeError("no kube-apiserver child process of the control plane")


# The API server's own timing of its admission plugins (a histogram's _sum, seconds): every pod
# CREATE of a block passes these; nothing else of the bench's creates does.
_PLUGIN = re.compile(r'^apiserver_admission_controller_admission_duration_seconds_sum\{([^}]*)\} (\S+)$')
_LABEL = re.compile(r'(\w+)="([^"]*)"')
PLUGINS = {"MutatingAdmissionPolicy": "MAP", "MutatingAdmissionWebhook": "webhook", "ValidatingAdmissionPolicy": "VAP"}


def plugin_seconds(cp: ControlPlane) -> dict[str, float]:
    """{plugin: seconds spent on CREATEs so far} of the three plugins kata-sizing's admission
    runs in, from the API server's /metrics."""
    totals: dict[str, float] = defaultdict(float)
    for line in cp.text("/metrics").splitlines():
        match = _PLUGIN.match(line)
        if match:
            labels = dict(_LABEL.findall(match[1]))
            if labels.get("name") in PLUGINS and labels.get("operation") == "CREATE":
                totals[PLUGINS[labels["name"]]] += float(match[2])
    return totals


@dataclass
class Tally:
    """What one case and shape measured, over all its blocks."""

    latencies_ms: list[float] = field(default_factory=list)
    refused: int = 0
    unrouted: int = 0
    sent: int = 0
    warm: int = 0  # the untimed creates that open a block's connection (their CPU is in the block's)
    late_ms: list[float] = field(default_factory=list)
    apiserver_cpu_s: float = 0.0
    webhook_cpu_s: float = 0.0
    seconds: float = 0.0
    plugins_s: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    failures: dict[str, int] = field(default_factory=lambda: defaultdict(int))


class Creator:
    """Creates pods at a steady rate (open loop: each at its time, whatever the answers before),
    timing each from send to answer, on one aiohttp session with the admin's identity."""

    def __init__(self, cp: ControlPlane) -> None:
        self.cp = cp
        self.ssl = cp.client_ssl()
        self.headers = {"Authorization": f"Bearer {cp.admin_token}", "Content-Type": "application/json",
                        "Accept": "application/json"}

    async def block(self, case: Case, spec: dict, rate: float, seconds: float, first: int, tally: Tally,
                    dry_run: bool = False) -> None:
        """`rate` creates a second for `seconds`; `dry_run`: the whole admission chain, nothing stored."""
        count = max(1, round(rate * seconds))
        template = json.dumps({"apiVersion": "v1", "kind": "Pod",
                               "metadata": {"name": "@NAME@", "namespace": case.namespace}, "spec": spec})
        url = f"{self.cp.url}/api/v1/namespaces/{case.namespace}/pods{'?dryRun=All' if dry_run else ''}"
        connector = aiohttp.TCPConnector(limit=64, ssl=self.ssl)
        async with aiohttp.ClientSession(connector=connector, headers=self.headers) as session:
            # One request first, untimed: the session's TLS connection is up before the clock starts.
            await self._create(session, url, template.replace("@NAME@", f"warm-{first}"), case, None)
            tally.warm += 1
            loop = asyncio.get_running_loop()
            start = loop.time()
            tasks = []
            for i in range(count):
                due = start + i / rate
                delay = due - loop.time()
                if delay > 0:
                    await asyncio.sleep(delay)
                tally.late_ms.append(max(0.0, loop.time() - due) * 1000)
                body = template.replace("@NAME@", f"p{first + i}")
                tasks.append(asyncio.create_task(self._create(session, url, body, case, tally)))
            await asyncio.gather(*tasks)

    async def _create(self, session: aiohttp.ClientSession, url: str, body: str, case: Case, tally: Tally | None) -> None:
        began = time.perf_counter()
        try:
            async with session.post(url, data=body) as response:
                answer = await response.read()
                status = response.status
        except (TimeoutError, aiohttp.ClientError) as exc:
            if tally is not None:
                tally.sent += 1
                tally.refused += 1
                tally.failures[type(exc).__name__] += 1
            return
        if tally is None:
            return
        tally.sent += 1
        tally.latencies_ms.append((time.perf_counter() - began) * 1000)
        if status >= 300:
            tally.refused += 1
            try:
                message = json.loads(answer).get("message", "")
            except ValueError:
                message = answer[:200].decode(errors="replace")
            tally.failures[f"{status}: {message[:160]}"] += 1
        elif case.policy and b'"runtimeClassName"' not in answer:
            tally.unrouted += 1


def delete_pods(cp: ControlPlane, namespace: str) -> None:
    cp.request("DELETE", f"/api/v1/namespaces/{namespace}/pods")


# --- the cluster for the bench ------------------------------------------------------------------


@contextlib.contextmanager
def admission_cluster(work: Path, address: str, apiserver_args: tuple[str, ...] = ()
                      ) -> Iterator[tuple[ControlPlane, list[RealOperator]]]:
    """The control plane, both policies written by the operator, the `CEL before` objects, two
    webhook replicas and their configurations; every case routes its probe pod."""
    (work / "cp").mkdir(exist_ok=True)
    with installed_control_plane(work / "cp", apiserver_args=("--enable-aggregator-routing=true", *apiserver_args)) as cp:
        certs = work / "certs"
        certs.mkdir()
        service_dns = f"{SERVICE}.{OPERATOR_NAMESPACE}.svc"
        cert, key = serving_certificate([service_dns], ips=[address])
        (certs / "tls.crt").write_bytes(cert)
        (certs / "tls.key").write_bytes(key)
        ports = [free_port(address) for _ in range(2)]
        operators = []
        try:
            for i, port in enumerate(ports):
                (work / f"replica-{i}").mkdir()
                operators.append(RealOperator(cp, work / f"replica-{i}").start(
                    *LEASE_ARGS, "--webhook-port", str(port), "--webhook-addr", address,
                    "--webhook-cert", str(certs / "tls.crt"), "--webhook-key", str(certs / "tls.key"),
                    resync_s=300, guidance_s=10, POD_NAME=f"bench-replica-{i}"))
            namespaces = []
            for case in CASES:
                labels = {**({POLICY_LABEL: case.policy} if case.policy else {}),
                          **({BENCH_LABEL: case.route} if case.route else {})}
                namespaces.append({"apiVersion": "v1", "kind": "Namespace",
                                   "metadata": {"name": case.namespace, **({"labels": labels} if labels else {})}})
            cp.apply(*namespaces,
                     policy(CEL_POLICY, ["adm-cel"]),
                     policy(WEBHOOK_POLICY, ["adm-webhook-1", "adm-webhook-2"], routing="Webhook"))
            ca = base64.b64encode(cert).decode()
            cp.apply(*service_objects(address, ports),
                     webhook_configuration("one", {"url": f"https://{address}:{ports[0]}/route-pod", "caBundle": ca}),
                     webhook_configuration("two", {"service": {"namespace": OPERATOR_NAMESPACE, "name": SERVICE,
                                                               "path": "/route-pod", "port": 443}, "caBundle": ca}))
            wait_for(lambda: _bindings_written(cp), 120, "the operator wrote both policies' bindings")
            cp.apply(*before_objects(cp))
            probe = pod_spec(ONE, 0)
            for case in CASES:
                if case.policy:
                    wait_for(functools.partial(_routed, cp, case, probe), 60, f"a pod in {case.namespace} routed")
            yield cp, operators
        finally:
            for operator in operators:
                operator.stop()


def _bindings_written(cp: ControlPlane) -> bool:
    found = {name for kind in ("validatingadmissionpolicybindings", "mutatingadmissionpolicybindings")
             for name in cp.items(f"{ADMISSION}/{kind}", POLICY_LABEL)}
    return len(found) == 5  # adm-cel: 2 VAP bindings + the MAP's; adm-webhook: 2 VAP bindings


def _routed(cp: ControlPlane, case: Case, spec: dict) -> bool:
    body = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "probe", "namespace": case.namespace}, "spec": spec}
    try:
        stored = cp.request("POST", f"/api/v1/namespaces/{case.namespace}/pods?dryRun=All", body)
    except Exception:  # noqa: BLE001 - not yet: the policies reach the admission plugins through informers
        return False
    return bool(stored["spec"].get("runtimeClassName"))


def wait_for(predicate: Callable[[], object], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.25)
    raise TimeoutError(f"not in {timeout:.0f} s: {what}")


# --- the run --------------------------------------------------------------------------------------


def measure(cp: ControlPlane, operators: list[RealOperator], settings: Settings,
            progress: Callable[[str], None] | None = None) -> dict[str, dict[str, Tally]]:
    """{shape: {case name: Tally}}, and {shape: {IDLE: Tally}} for the idle blocks."""
    apiserver = apiserver_pid(cp)
    webhook_pids = [o.process.pid for o in operators if o.process is not None]
    creator = Creator(cp)
    results: dict[str, dict[str, Tally]] = {}
    rounds = max(1, math.ceil(settings.seconds / settings.block_seconds))
    for shape, spec in shapes(settings).items():
        rate = settings.rate_of(shape)
        tallies = {name: Tally() for name in [c.name for c in CASES] + [IDLE]}
        serial = 0
        for round_ in range(rounds):
            order = [*CASES[round_ % len(CASES):], *CASES[:round_ % len(CASES)]]
            for case in [None, *order]:  # None: the idle block
                tally = tallies[IDLE if case is None else case.name]
                before_metrics = plugin_seconds(cp)
                api0, hook0 = cpu_seconds(apiserver), sum(cpu_seconds(p) for p in webhook_pids)
                began = time.monotonic()
                if case is None:
                    time.sleep(settings.block_seconds)
                else:
                    asyncio.run(creator.block(case, spec, rate, settings.block_seconds, serial, tally))
                    serial += round(rate * settings.block_seconds) + 1
                tally.seconds += time.monotonic() - began
                tally.apiserver_cpu_s += cpu_seconds(apiserver) - api0
                tally.webhook_cpu_s += sum(cpu_seconds(p) for p in webhook_pids) - hook0
                for plugin, value in plugin_seconds(cp).items():
                    tally.plugins_s[plugin] += value - before_metrics.get(plugin, 0.0)
                if case is not None:
                    delete_pods(cp, case.namespace)
                    # The deletions' watch events settle outside the next block.
                    time.sleep(min(0.5, settings.block_seconds / 4))
            if progress is not None:
                progress(f"{shape}: round {round_ + 1} of {rounds}")
        results[shape] = tallies
    return results


# A pod the CEL before could not judge (it ran out of cost budget from about 460 init containers,
# half sidecars, and refused the pod under failurePolicy Fail).
BEYOND_BEFORE_INITS = 2000


def report_beyond_before(report: Report, cp: ControlPlane) -> None:
    """One pod of BEYOND_BEFORE_INITS init containers created in each CEL namespace: what a user
    gets from each version of the CEL on the real API server."""
    spec = pod_spec(LARGEST, BEYOND_BEFORE_INITS)
    for case in CASES:
        if case.policy != CEL_POLICY:
            continue
        body = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "beyond", "namespace": case.namespace},
                "spec": spec}
        try:
            stored = cp.request("POST", f"/api/v1/namespaces/{case.namespace}/pods?dryRun=All", body)
            outcome = "admitted, class " + str(stored["spec"].get("runtimeClassName"))
        except ApiError as err:
            outcome = "refused: " + ("its CEL ran out of cost" if "cost" in str(err) else str(err)[:90])
        report(f"admission, a pod of {BEYOND_BEFORE_INITS} init containers (half sidecars), {case.name}", outcome, "", "")


def _net_cpu_per_thousand(tally: Tally, idle: Tally, attr: str) -> float | None:
    if not tally.sent or not idle.seconds:
        return None
    background = getattr(idle, attr) / idle.seconds * tally.seconds
    return max(0.0, getattr(tally, attr) - background) / (tally.sent + tally.warm) * 1000


def _plugins_text(tally: Tally) -> str:
    """The mean time of a create in each of the three plugins (the API server's clock)."""
    return " / ".join(f"{tally.plugins_s.get(p, 0.0) / (tally.sent + tally.warm) * 1000:.2f}" for p in PLUGINS.values())


def report_results(report: Report, results: dict[str, dict[str, Tally]], settings: Settings) -> None:
    for shape, tallies in results.items():
        title = shape_title(shape, settings.inits)
        idle = tallies[IDLE]
        unbound = tallies["unbound"]
        base_p99 = percentile(unbound.latencies_ms, 0.99) if unbound.latencies_ms else None
        rate = settings.rate_of(shape)
        for case in CASES:
            tally = tallies[case.name]
            what = f"admission, {title}, {case.name}"
            if not tally.latencies_ms:
                report(f"{what}: no pod created", "", "", "ERROR")
                continue
            p50, p95, p99 = (percentile(tally.latencies_ms, f) for f in (0.5, 0.95, 0.99))
            report(f"{what}: create p50 / p95 / p99 ({tally.sent} pods at {rate:g}/s)",
                   f"{p50:.1f} / {p95:.1f} / {p99:.1f} ms", "", "")
            if case.name != "unbound" and base_p99:
                if case.webhook:
                    report(f"{what}: p99 against unbound", f"{p99 - base_p99:+.1f} ms", f"<= +{WEBHOOK_P99_MS:g} ms",
                           verdict(p99 - base_p99 <= WEBHOOK_P99_MS))
                else:
                    report(f"{what}: p99 against unbound", f"{p99 / base_p99:.2f}x", f"<= {CEL_P99_RATIO:g}x",
                           verdict(p99 / base_p99 <= CEL_P99_RATIO))
            bad = tally.refused + tally.unrouted
            report(f"{what}: refused / admitted without a class", f"{tally.refused} / {tally.unrouted}", "0",
                   verdict(bad == 0))
            for failure, count in sorted(tally.failures.items(), key=lambda kv: -kv[1])[:3]:
                report(f"  {count} x {failure}", "", "", "")
            cpu = _net_cpu_per_thousand(tally, idle, "apiserver_cpu_s")
            report(f"{what}: kube-apiserver CPU per 1000 creates (net of idle)",
                   f"{cpu:.2f} s" if cpu is not None else "-", "", "")
            report(f"{what}: time in its admission plugins MAP / webhook / VAP, mean per create",
                   f"{_plugins_text(tally)} ms", "", "")
            if case.webhook:
                hook = _net_cpu_per_thousand(tally, idle, "webhook_cpu_s")
                report(f"{what}: the operator processes' CPU per 1000 creates (net of idle)",
                       f"{hook:.2f} s" if hook is not None else "-", "", "")
            late = percentile(tally.late_ms, 0.99) if tally.late_ms else 0.0
            if late > 5:
                report(f"{what}: the client sent late (p99 behind its schedule): the machine was busy",
                       f"{late:.0f} ms", "", "")
        report(f"admission, {title}: kube-apiserver background CPU (idle blocks)",
               f"{idle.apiserver_cpu_s / idle.seconds:.3f} s/s" if idle.seconds else "-", "", "")


# --- the CEL's cost against the API server's limits ----------------------------------------------


def shared_policies_now() -> list[dict]:
    from kata_sizing.core import podfit
    from kata_sizing.core.render import shared_admission_objects

    return [o for o in shared_admission_objects() if o["kind"] in ("ValidatingAdmissionPolicy", "MutatingAdmissionPolicy")
            and o["metadata"]["name"] in podfit.SHARED_NAMES.values()]


def policies_before() -> list[dict]:
    return [o for o in yaml.safe_load_all(BEFORE_FIXTURE.read_text()) if o]


def params_of(name: str) -> dict:
    from kata_sizing.core import podfit
    from kata_sizing.core.model import parse_policy
    from kata_sizing.core.sizing import size_policy

    return podfit.params_data(size_policy(parse_policy(policy(name, [name]))))


def celcost(policies: list[dict], params: dict, pods: list[dict], namespace_labels: dict,
            breakdown: bool = True) -> list[dict]:
    """The runtime cost of each policy on each pod, from `.tools/celcost` (the API server's own
    CEL evaluation: tests/controlplane/celcost); `breakdown`: each expression's own cost too."""
    request = {"policies": policies, "params": params, "namespaceLabels": namespace_labels, "pods": pods,
               "breakdown": breakdown}
    proc = subprocess.run([str(CELCOST)], input=json.dumps(request), capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"celcost exited {proc.returncode}: {proc.stderr[-500:]}")
    return json.loads(proc.stdout)


def cel_costs(policies: list[dict], spec: dict, breakdown: bool = True) -> list[dict]:
    """Each policy's cost on the pod `spec`, as the API server sees it: the MutatingAdmissionPolicy
    the pod as created (no class), the ValidatingAdmissionPolicies the pod it routed (class s)."""
    params = params_of(CEL_POLICY)
    labels = {POLICY_LABEL: CEL_POLICY}

    def pod(runtime_class: str | None) -> dict:
        routed = {**spec, **({"runtimeClassName": runtime_class} if runtime_class else {})}
        return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "adm-cel"}, "spec": routed}

    mutating = [p for p in policies if p["kind"] == "MutatingAdmissionPolicy"]
    validating = [p for p in policies if p["kind"] == "ValidatingAdmissionPolicy"]
    (routed,) = celcost(validating, params, [pod(f"kata-{CEL_POLICY}-s")], labels, breakdown)
    (created,) = celcost(mutating, params, [pod(None)], labels, breakdown)
    return routed["policies"] + created["policies"]


def report_cel_cost(report: Report, settings: Settings) -> None:
    if not CELCOST.exists():
        report("CEL cost: .tools/celcost is not built (`make celcost` needs Go): skipped", "", "", "SKIP")
        return
    versions = {"now": shared_policies_now(), "before": policies_before()}
    for shape, spec in shapes(settings).items():
        for version, policies in versions.items():
            costs = cel_costs(policies, spec)
            errors = [c["error"] for c in costs if c.get("error")]
            total = max(c["total"] for c in costs)
            worst = max(costs, key=lambda c: c["largestExpression"])
            what = (f"CEL cost ({version}), {shape_title(shape, settings.inits)}: the largest policy's evaluation "
                    f"(budget {PER_EVALUATION_BUDGET:,}) / its largest expression (limit {PER_CALL_LIMIT:,})")
            report(what, f"{total:,} / {worst['largestExpression']:,}" if not errors else errors[0][:70], "within",
                   verdict(not errors and total <= PER_EVALUATION_BUDGET and worst["largestExpression"] <= PER_CALL_LIMIT))
            report(f"  all three policies, per pod created; the largest expression: {worst['largestExpressionName']}",
                   f"{sum(c['total'] for c in costs):,}", "", "")
    # The most init containers (half sidecars) each version judges within the limits.
    for version, policies in versions.items() if settings.search_largest else ():
        most = largest_judged(policies)
        report(f"CEL cost ({version}): most init containers (half sidecars) a pod may have and still be judged",
               f"{'>= ' if most == LARGEST_SEARCHED else ''}{most:,}", "", "")


# Past this many init containers (about 2.6 MB of pod) the search stops: etcd stores no object
# larger than 1.5 MiB by default.
LARGEST_SEARCHED = 20_000


def largest_judged(policies: list[dict], ceiling: int = LARGEST_SEARCHED) -> int:
    """Bisect on the number of init containers (half sidecars) until a policy runs out of budget
    (to within 2%)."""
    def judged(inits: int) -> bool:
        return not any(c.get("error") for c in cel_costs(policies, pod_spec(LARGEST, inits), breakdown=False))

    low, high = 0, ceiling
    if judged(high):
        return high
    while high - low > max(1, low // 50):
        middle = (low + high) // 2
        low, high = (middle, high) if judged(middle) else (low, middle)
    return low


# --- the section ----------------------------------------------------------------------------------


def bench_admission(report: Report, quick: bool = False, settings: Settings | None = None) -> None:
    settings = settings or Settings.from_env(quick)
    report_cel_cost(report, settings)
    if not BINARY.exists() or not KUBECTL.exists():
        report("real control plane not built (`make controlplane` needs Go): the create latencies skipped", "", "", "SKIP")
        return
    if os.geteuid() != 0 or shutil.which("ip") is None:
        # The webhook replicas listen on the node's test address (an EndpointSlice refuses loopback).
        report("skipped: the webhook replicas need the node's test address (root and `ip`)", "", "", "SKIP")
        return
    work = Path(tempfile.mkdtemp(prefix="kata-sizing-admission-bench-"))
    try:
        with realnode.node_address() as address, admission_cluster(work, address) as (cp, operators):
            report_beyond_before(report, cp)
            results = measure(cp, operators, settings)
            report_results(report, results, settings)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    defaults = Settings.from_env()
    parser.add_argument("--rate", type=float, default=defaults.rate, help="pod creates a second")
    parser.add_argument("--seconds", type=float, default=defaults.seconds, help="seconds of each case and shape")
    parser.add_argument("--block-seconds", type=float, default=defaults.block_seconds)
    parser.add_argument("--inits", type=int, default=defaults.inits, help="init containers of the largest pod")
    parser.add_argument("--largest-rate", type=float, default=defaults.largest_rate)
    args = parser.parse_args(argv)
    settings = Settings(args.rate, args.seconds, args.block_seconds, args.inits, args.largest_rate)

    def report(what: str, figure: str, target: str, result: str) -> None:
        print(f"  {what:<78} {figure:>12} {target:>10} {result}", flush=True)

    bench_admission(report, settings=settings)
    return 0


if __name__ == "__main__":
    sys.exit(main())
