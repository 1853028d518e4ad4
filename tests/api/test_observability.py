"""What a user sees of the operator: `kubectl get ksp` saying why a policy is not Ready and who
creates its RuntimeClasses, `kubectl explain` reading the CRD's descriptions and the built-in
view/edit roles picking up the aggregated ones (all the real API server's: its printer columns,
defaulting, OpenAPI and RBAC aggregation), and, on both API tiers, the operator's /metrics, /readyz
and reconcile line while it works."""

from __future__ import annotations

import pytest
import yaml

from tests.support.metrics import get, samples, value
from tests.support.policies import example, explicit_classes_policy
from tests.support.realcluster import ROOT, ControlPlane, free_port
from tests.support.tiers import POLICIES, RUNTIME_CLASSES


def columns(cp: ControlPlane, name: str) -> dict[str, str]:
    out = cp.kubectl("get", "ksp", name).stdout.splitlines()
    return dict(zip(out[0].split(), out[1].split()))


@pytest.mark.tiers("realserver", reason="printer columns and the schema's defaults are the API server's")
def test_kubectl_get_ksp_says_why_not_ready_and_who_creates_the_runtime_classes(kube):
    cp = kube.cp
    assert cp is not None
    kube.start()
    # No runtimeClass in the spec at all: the server defaults it to {} and then managedBy.
    plain = explicit_classes_policy("plain")
    plain["spec"].pop("runtimeClass", None)
    kube.applied(plain)
    row = columns(cp, "plain")
    assert (row["READY"], row["RUNTIMECLASSES"]) == ("True", "Operator"), row
    assert kube.policy("plain")["spec"]["runtimeClass"]["managedBy"] == "Operator"

    # The chart's classes do not exist yet: not Ready, and the reason says so.
    kube.create(POLICIES, explicit_classes_policy("chart", runtimeClass={"managedBy": "KataDeploy"}))
    kube.wait_observed("chart", Ready="False")
    row = columns(cp, "chart")
    assert (row["READY"], row["REASON"], row["RUNTIMECLASSES"]) == ("False", "RuntimeClassMissing", "KataDeploy"), row


@pytest.mark.realserver
@pytest.mark.parametrize("field, words", [
    ("ksp.spec.overhead.guestMemoryRatio", "Fraction of VM memory the workload cannot use"),
    ("ksp.spec.runtimeClass.managedBy", "the operator only guards their fields"),
    ("ksp.status.conditions.reason", "One CamelCase word saying why"),
])
def test_kubectl_explain_reads_the_field_descriptions(control_plane, field, words):
    out = control_plane.kubectl("explain", field).stdout
    assert words in " ".join(out.split()), out


@pytest.mark.realserver
def test_the_builtin_view_and_edit_roles_select_the_aggregated_roles(control_plane):
    ours = {doc["metadata"]["name"]: doc["metadata"]["labels"]
            for doc in yaml.safe_load_all((ROOT / "manifests" / "clusterrole-aggregate.yaml").read_text()) if doc}
    # The API server's own bootstrap roles: which labels they aggregate.
    for builtin, role in (("view", "kata-sizing-view"), ("edit", "kata-sizing-edit"), ("edit", "kata-sizing-view"),
                          ("admin", "kata-sizing-edit")):
        selectors = control_plane.read(f"/apis/rbac.authorization.k8s.io/v1/clusterroles/{builtin}")[
            "aggregationRule"]["clusterRoleSelectors"]
        assert any(s["matchLabels"].items() <= ours[role].items() for s in selectors), (builtin, role, selectors)
    # ...and the installed roles are the ones in manifests/.
    installed = control_plane.get("/apis/rbac.authorization.k8s.io/v1/clusterroles/kata-sizing-view")
    assert installed["metadata"]["labels"] == ours["kata-sizing-view"]


def test_metrics_readiness_and_the_reconcile_line_of_the_running_operator(kube):
    """/readyz once the caches synced; /metrics as Prometheus scrapes it while the operator creates
    a policy's objects, corrects a hand edit (counted by kind) and meets an invalid policy; and the
    reconcile line a log pipeline reads (the JSON log's fields)."""
    port = free_port()
    kube.start(metrics_port=port)
    base = f"http://127.0.0.1:{port}"
    kube.wait_for(lambda: get(f"{base}/readyz")[0] == 200, 20, "readyz answers 200 once the caches synced")
    before = get(f"{base}/metrics")[1]

    body = example()
    name = body["metadata"]["name"]
    kube.applied(body)
    text = kube.wait_for(lambda: (lambda t: t if value(t, "kata_sizing_policies", condition="Ready", status="True")
                                  else "")(get(f"{base}/metrics")[1]),
                         message="the Ready policy appears in kata_sizing_policies")
    assert value(text, "kata_sizing_reconciles_total", trigger="apply", result="ok") >= \
        value(before, "kata_sizing_reconciles_total", trigger="apply", result="ok") + 1
    assert value(text, "kata_sizing_reconcile_writes_total", trigger="apply") >= \
        value(before, "kata_sizing_reconcile_writes_total", trigger="apply") + 7  # 4 RuntimeClasses, 3 ConfigMaps
    assert value(text, "kata_sizing_policies", condition="Ready", status="True") == 1
    assert value(text, "kata_sizing_policies", condition="Valid", status="True") == 1
    for collection in ("nodes", "pods", "runtimeclasses"):
        assert ("kata_sizing_informer_objects", (("collection", collection),)) in samples(text)
    assert value(text, "kata_sizing_informer_objects", collection="runtimeclasses") >= 4
    [first] = [line for line in kube.reconciles() if line["policy"] == name and line["trigger"] == "apply"][:1]
    assert first["result"] == "ok" and first["writes"] >= 7 and first["duration_s"] > 0

    # A hand edit of a RuntimeClass: detected and corrected, per kind.
    kube.edit(RUNTIME_CLASSES, f"kata-{name}-s", lambda obj: obj["overhead"]["podFixed"].update(memory="1Mi"))
    kube.wait_for(lambda: kube.counter(name, "driftCorrections") == 1)
    text = get(f"{base}/metrics")[1]
    for metric in ("kata_sizing_drift_detected_total", "kata_sizing_drift_corrected_total"):
        assert value(text, metric, kind="RuntimeClass") == value(before, metric, kind="RuntimeClass") + 1

    # An invalid policy is counted under Valid=False.
    broken = explicit_classes_policy("broken")  # valid for the CRD's schema, not for the sizing rules
    broken["spec"]["classes"][0].update(overheadMemory="512Mi", podFixed={"cpu": "2", "memory": "256Mi"})
    kube.create(POLICIES, broken)
    kube.wait_observed("broken", Valid="False")
    text = kube.wait_for(lambda: (lambda t: t if value(t, "kata_sizing_policies", condition="Valid", status="False")
                                  else "")(get(f"{base}/metrics")[1]))
    assert value(text, "kata_sizing_policies", condition="Valid", status="False") == 1
    assert value(text, "kata_sizing_reconciles_total", trigger="apply", result="invalid") >= \
        value(before, "kata_sizing_reconciles_total", trigger="apply", result="invalid") + 1
