"""What a user sees of the operator on the real kube-apiserver (tests/support/realcluster.py): `kubectl
get ksp` saying why a policy is not Ready and who creates its RuntimeClasses, `kubectl explain`
reading the CRD's descriptions, the built-in view/edit roles picking up the aggregated ones, and
the operator's /metrics, /readyz and JSON log line while it reconciles against the real server."""

from __future__ import annotations

import json

import pytest
import yaml

from tests.support.metrics import get, value
from tests.support.realcluster import ROOT, create_ready, free_port, poll, qemu_rs, wait_observed

pytestmark = pytest.mark.realserver


def columns(cp, name: str) -> dict[str, str]:
    out = cp.kubectl("get", "ksp", name).stdout.splitlines()
    return dict(zip(out[0].split(), out[1].split()))


def test_kubectl_get_ksp_says_why_not_ready_and_who_creates_the_runtime_classes(control_plane, real_operator):
    real_operator.start()
    # No runtimeClass in the spec at all: the server defaults it to {} and then managedBy.
    plain = qemu_rs("plain")
    plain["spec"].pop("runtimeClass", None)
    create_ready(control_plane, plain)
    row = columns(control_plane, "plain")
    assert (row["READY"], row["RUNTIMECLASSES"]) == ("True", "Operator"), row
    assert control_plane.get("/apis/katasizing.dev/v1alpha1/katasizingpolicies/plain")["spec"]["runtimeClass"][
        "managedBy"] == "Operator"

    # The chart's classes do not exist yet: not Ready, and the reason says so.
    chart = qemu_rs("chart")
    chart["spec"]["runtimeClass"] = {"managedBy": "KataDeploy"}
    control_plane.apply(chart)
    wait_observed(control_plane, "chart", Ready="False")
    row = columns(control_plane, "chart")
    assert (row["READY"], row["REASON"], row["RUNTIMECLASSES"]) == ("False", "RuntimeClassMissing", "KataDeploy"), row


@pytest.mark.parametrize("field, words", [
    ("ksp.spec.overhead.guestMemoryRatio", "Fraction of VM memory the workload cannot use"),
    ("ksp.spec.runtimeClass.managedBy", "the operator only guards their fields"),
    ("ksp.status.conditions.reason", "One CamelCase word saying why"),
])
def test_kubectl_explain_reads_the_field_descriptions(control_plane, field, words):
    out = control_plane.kubectl("explain", field).stdout
    assert words in " ".join(out.split()), out


def test_the_builtin_view_and_edit_roles_select_the_aggregated_roles(control_plane):
    ours = {doc["metadata"]["name"]: doc["metadata"]["labels"]
            for doc in yaml.safe_load_all((ROOT / "manifests" / "clusterrole-aggregate.yaml").read_text()) if doc}
    # The API server's own bootstrap roles: which labels they aggregate.
    for builtin, role in (("view", "kata-sizing-view"), ("edit", "kata-sizing-edit"), ("edit", "kata-sizing-view"),
                          ("admin", "kata-sizing-edit")):
        selectors = control_plane.get(f"/apis/rbac.authorization.k8s.io/v1/clusterroles/{builtin}")[
            "aggregationRule"]["clusterRoleSelectors"]
        assert any(s["matchLabels"].items() <= ours[role].items() for s in selectors), (builtin, role, selectors)
    # ...and the installed roles are the ones in manifests/.
    installed = control_plane.get("/apis/rbac.authorization.k8s.io/v1/clusterroles/kata-sizing-view")
    assert installed["metadata"]["labels"] == ours["kata-sizing-view"]


def test_metrics_readiness_and_the_json_reconcile_line_against_the_real_server(control_plane, real_operator):
    port = free_port()
    real_operator.start("--metrics-port", str(port), "--metrics-addr", "127.0.0.1", "--log-format", "json")
    base = f"http://127.0.0.1:{port}"
    poll(lambda: get(f"{base}/readyz")[0] == 200, 20, "readyz answers 200 once the caches synced")
    create_ready(control_plane, qemu_rs("observed"))

    def scraped() -> str:
        status, text = get(f"{base}/metrics")
        return text if status == 200 and value(text, "kata_sizing_policies", condition="Ready", status="True") else ""
    text = poll(scraped, 10, "the Ready policy appears in kata_sizing_policies")
    assert value(text, "kata_sizing_policies", condition="Ready", status="True") == 1
    assert value(text, "kata_sizing_reconciles_total", trigger="apply", result="ok") >= 1
    assert value(text, "kata_sizing_reconcile_writes_total", trigger="apply") >= 7
    assert value(text, "kata_sizing_informer_objects", collection="runtimeclasses") >= 4

    lines = [json.loads(line) for line in real_operator.log().splitlines() if line.startswith("{")]
    [first] = [entry for entry in lines if entry.get("policy") == "observed" and entry.get("trigger") == "apply"][:1]
    assert first["result"] == "ok" and first["writes"] >= 7 and first["duration_s"] > 0
