"""One shared admission policy with a `paramKind` against today's per-policy objects, on the
real API server (`make bench`, section `paramkind`; docs/performance.md says what it found).

Today a policy writes six admission objects (two ValidatingAdmissionPolicies, a
MutatingAdmissionPolicy, a binding each) whose CEL differs between policies only in the
envelopes. The alternative measured here: the three policies once, with `paramKind:
ConfigMap`, and per policy only the three bindings (today's names and namespace scope) whose
`paramRef` names one ConfigMap that carries the figures podfit computes (`params_data`). A
ConfigMap rather than the KataSizingPolicy: `kata-sizing render` prints it, so a GitOps tool
applying the output without the operator still enforces (a policy's status, which the operator
computes, would not be there), and the envelopes, the RuntimeClass names and the zero-sandbox
flags stay computed in one place (core/sizing.py, podfit.py) instead of again in CEL from the
spec and its defaults.

What it prints, for both forms in the same run: the verdict of every pod of the admission
table (tests/test_podfit.py) and of the 80 random pods of tests/test_real_admission.py against
podfit's, word for word; whether pods with 300, 400, 450 and 500 init containers are judged or
exceed the CEL cost limit; the objects written per policy; the time to write them for 50
policies, turn about. Skipped with a line saying why where the control plane is not built.
"""

from __future__ import annotations

import asyncio
import copy
import os
import re
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import yaml

from bench.plain_client import PlainClient
from bench.run import percentile
from tests.realcluster import BINARY, KUBECTL, ControlPlane, installed_control_plane, poll

Report = Callable[[str, str, str, str], None]
SHARED = {"memory": "kata-sizing-memory-limit", "envelope": "kata-sizing-envelope", "route": "kata-sizing-route"}
PARAMS_NAMESPACE = "kata-sizing"
WRITE_ROUNDS = 5
WRITE_POLICIES = 50


def params_name(policy: str) -> str:
    return f"kata-sizing-{policy}-admission"


def params_data(sizing) -> dict[str, str]:
    """What the shared CEL reads of one policy: the lists of podfit's variables, joined."""
    from kata_sizing.core import podfit
    from kata_sizing.core.rules import sandbox_zero_message

    classes = sizing.classes
    default_zero, overhead_zero = podfit.zero_sandbox_classes(sizing)
    flags = lambda values: ",".join("true" if v else "false" for v in values)  # noqa: E731
    return {
        "policy": sizing.policy.name,
        "classNames": ",".join(c.name for c in classes),
        "runtimeClasses": ",".join(c.runtime_class for c in classes),
        "classCpu": ",".join(str(podfit.envelope_millis(c)) for c in classes),
        "classMemory": ",".join(str(podfit.envelope_bytes(c)) for c in classes),
        # The texts hold commas ("cpu 1, memory 1Gi"); a semicolon is in none of them.
        "classEnvelopes": ";".join(podfit._envelope_text(c) for c in classes),
        "largestText": podfit._largest_text(sizing),
        "defaultZero": flags(default_zero),
        "overheadZero": flags(overhead_zero),
        "sandboxZeroMessage": sandbox_zero_message(sizing.hypervisor),
    }


_FROM_PARAMS = {
    "classNames": "params.data['classNames'].split(',')",
    "runtimeClasses": "params.data['runtimeClasses'].split(',')",
    "classCpu": "params.data['classCpu'].split(',').map(x, int(x))",
    "classMemory": "params.data['classMemory'].split(',').map(x, int(x))",
    "classEnvelopes": "params.data['classEnvelopes'].split(';')",
    "largestText": "params.data['largestText']",
}


def shared_specs(sizing) -> list[tuple[str, str, str, dict]]:
    """Today's three policies (podfit.admission_specs) with every per-policy literal read from
    params instead; `sizing` only supplies the structure, none of its figures remain."""
    from kata_sizing.core import podfit

    name = sizing.policy.name
    by_name = {n: s for (_, k, n, s) in podfit.admission_specs(sizing) if not k.endswith("Binding")}
    names = podfit.admission_names(name)
    label = podfit.POLICY_LABEL

    def variables(spec: dict) -> list[dict]:
        out = []
        for v in spec["variables"]:
            expression = _FROM_PARAMS.get(v["name"], v["expression"])
            if v["name"] == "optedIn":
                expression = (f"(has(object.metadata.labels) && '{label}' in object.metadata.labels && "
                              f"object.metadata.labels['{label}'] == params.data['policy']) || "
                              f"(namespaceObject != null && has(namespaceObject.metadata.labels) && "
                              f"'{label}' in namespaceObject.metadata.labels && "
                              f"namespaceObject.metadata.labels['{label}'] == params.data['policy'])")
            if v["name"] == "fitText":
                expression = ("size(variables.fits) > 0 ? 'the smallest class that fits is ' + "
                              "variables.runtimeClasses[variables.fits[0]] : 'no class of policy ' + "
                              "params.data['policy'] + ' fits (' + variables.largestText + ')'")
            out.append({"name": v["name"], "expression": expression})
        out.append({"name": "defaultZero", "expression": "params.data['defaultZero'].split(',').map(x, x == 'true')"})
        out.append({"name": "overheadZero", "expression": "params.data['overheadZero'].split(',').map(x, x == 'true')"})
        return out

    in_class = ("has(object.spec.runtimeClassName) && "
                "object.spec.runtimeClassName in params.data['runtimeClasses'].split(',')")
    param_kind = {"apiVersion": "v1", "kind": "ConfigMap"}
    memory = copy.deepcopy(by_name[names["memory"]])
    envelope = copy.deepcopy(by_name[names["envelope"]])
    for spec in (memory, envelope):
        spec["variables"] = variables(spec)
        spec["paramKind"] = param_kind
    memory["matchConditions"] = [{"name": "runs-in-a-class-of-this-policy", "expression": in_class}]
    envelope["matchConditions"] = [{"name": "runs-in-a-class-of-this-policy-or-has-none",
                                    "expression": f"!has(object.spec.runtimeClassName) || ({in_class})"}]
    checks = [c for c in envelope["validations"] if "Kata refuses" not in c["messageExpression"]]
    routed = checks[-1]
    routed["messageExpression"] = routed["messageExpression"].replace(
        f'asks for a class of policy {name} (label', "asks for a class of policy \" + params.data[\"policy\"] + \" (label")
    assert f"policy {name} (" not in routed["messageExpression"], routed["messageExpression"]
    no_limits = "(!variables.cpuSet && !variables.memorySet)"
    zero = {
        "expression": (f"!(variables.own >= 0) || !({no_limits} ? variables.defaultZero[variables.own] : "
                       f"(variables.overheadZero[variables.own] && variables.memory < {podfit.MIB}))"),
        "messageExpression": (
            "variables.who + ' on RuntimeClass ' + object.spec.runtimeClassName + ': Kata refuses to start it: ' + "
            "params.data['sandboxZeroMessage'] + ' (class ' + variables.classNames[variables.own] + ' ' + "
            f"({no_limits} ? {podfit._cel_string(podfit._BOOTS_WITHOUT_LIMITS)} : "
            f"{podfit._cel_string(podfit._BOOTS_WITH_LIMITS)}) + "
            "', which is 0; ' + variables.figures + ')'"),
        "reason": "Forbidden",
    }
    envelope["validations"] = [checks[0], zero, *checks[1:]]
    route = copy.deepcopy(by_name[names["route"]])
    route["variables"] = variables(route)
    route["paramKind"] = param_kind
    return [(podfit.ADMISSION_API_VERSION, "ValidatingAdmissionPolicy", SHARED["memory"], memory),
            (podfit.ADMISSION_API_VERSION, "ValidatingAdmissionPolicy", SHARED["envelope"], envelope),
            (podfit.MUTATING_API_VERSION, "MutatingAdmissionPolicy", SHARED["route"], route)]


def shared_objects(sizing) -> list[dict]:
    return [{"apiVersion": v, "kind": k, "metadata": {"name": n, "labels": {"app.kubernetes.io/name": "kata-sizing"}},
             "spec": s} for v, k, n, s in shared_specs(sizing)]


def per_policy_objects(sizing) -> list[dict]:
    """The params ConfigMap and the three bindings (today's names and namespace scope)."""
    from kata_sizing.core import podfit

    name = sizing.policy.name
    labels = {"app.kubernetes.io/managed-by": "kata-sizing", podfit.POLICY_LABEL: name}
    objects = [{"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": params_name(name), "namespace": PARAMS_NAMESPACE, "labels": labels},
                "data": params_data(sizing)}]
    ref = {"name": params_name(name), "namespace": PARAMS_NAMESPACE, "parameterNotFoundAction": "Deny"}
    for version, kind, obj_name, spec in podfit.admission_specs(sizing):
        if not kind.endswith("Binding"):
            continue
        key = next(k for k, n in podfit.admission_names(name).items() if n == obj_name)
        objects.append({"apiVersion": version, "kind": kind, "metadata": {"name": obj_name, "labels": labels},
                        "spec": {**spec, "policyName": SHARED[key], "paramRef": ref}})
    return objects


def today_objects(sizing) -> list[dict]:
    from kata_sizing.core.render import render_admission

    return render_admission(sizing)


# --- correctness ---------------------------------------------------------------------------------


def _verdicts_match(cp: ControlPlane, pods: list[dict], sizing, names: dict[str, str]) -> tuple[int, int, list[str]]:
    """(pods whose verdicts match podfit's, pods, the first differences) for one dry run."""
    from tests.test_real_admission import dry_run, expected_verdicts, verdicts

    from kata_sizing.core import podfit

    proc = dry_run(cp, pods)
    got = verdicts(proc)
    today = podfit.admission_names(sizing.policy.name)
    rename = {today[k]: names[k] for k in ("memory", "envelope")}
    expected = {pod: {(rename[vap], kind, message) for vap, kind, message in found}
                for pod, found in expected_verdicts(pods, sizing).items()}
    differ = [f"{p['metadata']['name']}: server {sorted(got.get(p['metadata']['name'], ()))} "
              f"podfit {sorted(expected.get(p['metadata']['name'], ()))}"
              for p in pods if set(got.get(p["metadata"]["name"], ())) != set(expected.get(p["metadata"]["name"], ()))]
    if "is invalid" in proc.stderr:
        differ.append(proc.stderr[:400])
    return len(pods) - len(differ), len(pods), differ


def _many_inits(cp: ControlPlane, count: int) -> str:
    from tests.test_podfit import Case, limits
    from tests.test_real_admission import dry_run

    inits = tuple({**({"restartPolicy": "Always"} if i % 2 else {}), **limits("1m", "1Mi")} for i in range(count))
    over = Case(f"inits-{count}", (limits("8", "1Gi"),), None, None, init_containers=inits,
                runtime_class="kata-fit-l").pod()
    proc = dry_run(cp, [over])
    if "cost" in proc.stderr:
        return "cost limit exceeded"
    return "judged (refused by the rule)" if "exceed class l" in proc.stderr else f"? {proc.stderr[:200]}"


def _wait_enforcing(cp: ControlPlane, envelope: str) -> None:
    """Until the admission plugin's informers judge by `envelope` alone: the other form's
    policies, just deleted, are still applied for a while on a loaded machine."""
    from tests.test_podfit import Case, limits
    from tests.test_real_admission import dry_run

    probe = Case("probe", (limits("8", "1Gi"),), None, None).pod()

    def judged_by_it_alone() -> bool:
        names = set(re.findall(r"ValidatingAdmissionPolicy '([^']+)'", dry_run(cp, [probe]).stderr))
        return names == {envelope}

    poll(judged_by_it_alone, 60, f"only {envelope} refuses a pod")


def _correctness(report: Report, cp: ControlPlane, form: str, objects: list[dict], sizing,
                 names: dict[str, str]) -> None:
    from tests.test_podfit import CASES
    from tests.test_real_admission import random_pods

    cp.apply(*objects)
    try:
        _wait_enforcing(cp, names["envelope"])
        for what, pods in (("admission table", [c.pod() for c in CASES]), ("80 random pods", random_pods(80, 10))):
            same, total, differ = _verdicts_match(cp, pods, sizing, names)
            report(f"{form}: {what}, verdicts equal to podfit's", f"{same} of {total}", "all",
                   "PASS" if same == total else "MISS")
            for line in differ[:3]:
                report(f"    {line[:300]}", "", "", "")
        for count in (300, 400, 450, 500):
            report(f"{form}: a pod with {count} init containers (half sidecars)", _many_inits(cp, count), "", "")
    finally:
        cp.kubectl("delete", "--wait=true", "--ignore-not-found", "-f", "-", input=yaml.safe_dump_all(objects),
                   check=False)


# --- writes ---------------------------------------------------------------------------------------


def _batches(bodies: list[dict]) -> list[dict]:
    from bench.limit_bench import _path

    return [{"writes": [["POST", _path(o, False), o]]} for o in bodies]


def _write_all(cp: ControlPlane, bodies: list[dict]) -> float:
    from kata_sizing.controller.kube import CONNECTIONS

    async def go() -> float:
        async with PlainClient(cp.operator_kubeconfig, CONNECTIONS) as client:
            start = time.perf_counter()
            await asyncio.gather(*(client._send(m, p, b) for m, p, b in
                                   (w for batch in _batches(bodies) for w in batch["writes"])))
            return time.perf_counter() - start

    return asyncio.run(go())


def _replace_all(cp: ControlPlane, bodies: list[dict]) -> float:
    """PUT each body over the live object (with its resourceVersion, read before the clock), at once."""
    from bench.limit_bench import _path
    from kata_sizing.controller.kube import CONNECTIONS

    writes = []
    for body in bodies:
        body = copy.deepcopy(body)
        body["metadata"]["resourceVersion"] = cp.get(_path(body, True))["metadata"]["resourceVersion"]
        writes.append(("PUT", _path(body, True), body))

    async def go() -> float:
        async with PlainClient(cp.operator_kubeconfig, CONNECTIONS) as client:
            start = time.perf_counter()
            await asyncio.gather(*(client._send(m, p, b) for m, p, b in writes))
            return time.perf_counter() - start

    return asyncio.run(go())


def _spec_change_writes(form: str, before, after) -> list[dict]:
    """What a spec change (class s's memory) rewrites of the admission objects in each form."""
    objects = today_objects if form == "today" else per_policy_objects
    old = {(o["kind"], o["metadata"]["name"]): o for o in objects(before)}
    return [o for o in objects(after) if old.get((o["kind"], o["metadata"]["name"])) != o]


_COLLECTIONS = ("/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicybindings",
                "/apis/admissionregistration.k8s.io/v1/mutatingadmissionpolicybindings",
                "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies",
                "/apis/admissionregistration.k8s.io/v1/mutatingadmissionpolicies",
                f"/api/v1/namespaces/{PARAMS_NAMESPACE}/configmaps")


def _delete_all(cp: ControlPlane) -> None:
    """Every per-policy object (by its label; the shared policies have none), one request per kind."""
    from kata_sizing.core import podfit

    selector = f"?labelSelector={podfit.POLICY_LABEL}"
    for path in _COLLECTIONS:
        cp.request("DELETE", path + selector)
    poll(lambda: not any(cp.request("GET", p + selector)["items"] for p in _COLLECTIONS), 120,
         "the per-policy objects are gone")


def bench_paramkind(report: Report, quick: bool = False) -> None:
    if not BINARY.exists() or not KUBECTL.exists():
        report("real control plane not built (`make controlplane` needs Go): section skipped", "", "", "SKIP")
        return
    from kata_sizing.core import podfit
    from kata_sizing.core.model import parse_policy
    from kata_sizing.core.sizing import size_policy
    from tests.test_real_admission import NAMESPACE_OPTED, POLICY_BODY
    from tests.test_podfit import IN, OUT, ROUTED
    from tests.operator_helpers import explicit_classes_policy

    sizing = size_policy(parse_policy(POLICY_BODY))
    work = Path(tempfile.mkdtemp(prefix="kata-sizing-paramkind-"))
    try:
        with installed_control_plane(work) as cp:
            namespaces = [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": n}} for n in (IN, OUT, ROUTED)]
            namespaces.append({"apiVersion": "v1", "kind": "Namespace",
                               "metadata": {"name": NAMESPACE_OPTED, "labels": {podfit.POLICY_LABEL: "fit"}}})
            from kata_sizing.core.render import render_policy
            classes = render_policy(sizing.policy, sizing=sizing).runtime_classes
            cp.apply(*namespaces, *classes)
            _correctness(report, cp, "today (6 objects)", today_objects(sizing), sizing,
                         podfit.admission_names("fit"))
            _correctness(report, cp, "paramKind (3 shared + 4 per policy)",
                         shared_objects(sizing) + per_policy_objects(sizing), sizing, SHARED)

            sized = [size_policy(parse_policy(explicit_classes_policy(f"w{i}"))) for i in range(WRITE_POLICIES)]
            report("objects written per policy: today / paramKind",
                   f"{len(today_objects(sized[0]))} / {len(per_policy_objects(sized[0]))}", "", "")
            cp.apply(*shared_objects(sized[0]))
            times: dict[str, list[float]] = {"today": [], "paramKind": []}
            rounds = 2 if quick else WRITE_ROUNDS
            for run in range(rounds):
                for form in (("today", "paramKind") if run % 2 == 0 else ("paramKind", "today")):
                    bodies = [o for s in sized for o in (today_objects(s) if form == "today"
                                                         else per_policy_objects(s))]
                    times[form].append(_write_all(cp, bodies))
                    _delete_all(cp)
            # A spec change: class s's memory, on one policy, turn about.
            changed_body = explicit_classes_policy("w0")
            changed_body["spec"]["classes"][0]["memory"] = "768Mi"
            changed = size_policy(parse_policy(changed_body))
            rewrites = {form: _spec_change_writes(form, sized[0], changed) for form in ("today", "paramKind")}
            report("objects a spec change rewrites: today / paramKind",
                   " / ".join(", ".join(o["kind"] for o in rewrites[f]) for f in ("today", "paramKind")), "", "")
            updates: dict[str, list[float]] = {"today": [], "paramKind": []}
            for form in ("today", "paramKind"):
                cp.apply(*(today_objects(sized[0]) if form == "today" else per_policy_objects(sized[0])))
            for run in range(rounds * 4):
                for form in (("today", "paramKind") if run // 2 % 2 == 0 else ("paramKind", "today")):
                    updates[form].append(_replace_all(cp, rewrites[form] if run % 2 == 0 else
                                                      _spec_change_writes(form, changed, sized[0])))
            for form, values in updates.items():
                report(f"{form}: a spec change's admission rewrites, median / p95 of {len(values)}",
                       f"{statistics.median(values) * 1000:.0f} / {percentile(values, 0.95) * 1000:.0f} ms", "", "")
            for form, values in times.items():
                report(f"{form}: {WRITE_POLICIES} policies' admission objects written at once, median / p95 of "
                       f"{rounds}", f"{statistics.median(values) * 1000:.0f} / {percentile(values, 0.95) * 1000:.0f} ms",
                       "", "")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    def _print(what: str, figure: str, target: str, result: str) -> None:
        print(f"  {what:<78} {figure:>12} {target:>10} {result}", flush=True)

    bench_paramkind(_print, quick=bool(os.environ.get("QUICK")))
