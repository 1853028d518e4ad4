"""The operator beside the kata-deploy chart, and beside GitOps tools: it guards exactly the fields
a policy decides and leaves every key other writers add alone, so re-applying the chart (or a
GitOps sync) makes the operator write nothing, while a hand edit of podFixed is still put back."""

from __future__ import annotations

import copy

import pytest

from kata_sizing.controller import conditions as cond
from kata_sizing.core.render import POLICY_LABEL
from tests.support.kata_deploy_chart import FACTS, chart_runtime_classes, instance_marker
from tests.support.operator_helpers import (
    CM_PATH,
    CONFIG_MAPS,
    OUTPUT_NAMESPACE,
    RC_PATH,
    RUNTIME_CLASSES,
    counter,
    describe_writes,
    edit,
    event_messages,
    get_cm,
    get_rc,
    pod_fixed,
    runtime_classes,
    settle,
    stays,
    wait_for,
    wait_observed,
    writes,
)
from tests.support.policies import example

pytestmark = pytest.mark.emulator

NAME = "qemu-rs"
RC_NAMES = {f"kata-qemu-rs-{c}" for c in ("s", "m", "l", "xl")}
SHARED_GATE = FACTS["sharedGateLabel"]
HELM_LABEL = next(iter(FACTS["helm"]["labels"].items()))


def kata_deploy_policy(**runtime_class) -> dict:
    body = example()
    body["spec"]["runtimeClass"].update(managedBy="KataDeploy", **runtime_class)
    return body


def helm_upgrade(emu) -> list[dict]:
    """`helm upgrade -f values.yaml` with the operator's overlay: every custom RuntimeClass is
    written exactly as the chart renders it (the strictest re-apply: whatever else is on the
    live object goes)."""
    values = get_cm(emu, f"{NAME}-kata-deploy-values")["data"]["values.yaml"]
    rendered = chart_runtime_classes(values)
    for obj in rendered:
        emu.objects(RUNTIME_CLASSES).put(copy.deepcopy(obj))
    return rendered


def chart_keys_kept(emu, name: str) -> bool:
    obj = get_rc(emu, name)
    selector = obj["scheduling"]["nodeSelector"]
    labels = obj["metadata"]["labels"]
    return (selector.get(instance_marker()) == "true" and selector.get(SHARED_GATE) == "true"
            and labels.get(HELM_LABEL[0]) == HELM_LABEL[1]
            and "meta.helm.sh/release-name" in (obj["metadata"].get("annotations") or {}))


def test_chart_shaped_runtime_classes_re_applied_get_no_operator_write_and_a_pod_fixed_edit_is_put_back(cluster):
    emu = cluster.emu
    cluster.start(resync_s=0.5)
    cluster.create(kata_deploy_policy(tolerations=[{"key": "kata", "operator": "Exists", "effect": "NoSchedule"}]))
    wait_observed(emu, NAME, InSync="False", Valid="True")

    rendered = helm_upgrade(emu)
    assert {o["metadata"]["name"] for o in rendered} == RC_NAMES
    # What the chart made of our strings: Helm's managed-by over ours, the per-install gate added.
    assert all(o["metadata"]["labels"][HELM_LABEL[0]] == HELM_LABEL[1] for o in rendered)
    assert all(o["scheduling"]["nodeSelector"] == {SHARED_GATE: "true", instance_marker(): "true"} for o in rendered)
    wait_observed(emu, NAME, InSync="True", Ready="True", Conflict="False")
    settle(emu)

    emu.reset_request_log()
    for _ in range(4):  # helm upgrades, Flux reconciles
        helm_upgrade(emu)
        settle(emu, quiet_s=0.3)
    stays(lambda: not writes(emu, RC_PATH), 1.2, "the operator wrote a chart RuntimeClass")  # resyncs included
    assert not writes(emu, RC_PATH), describe_writes(writes(emu, RC_PATH))
    assert not event_messages(emu, cond.EVENT_DRIFT_CORRECTED)
    assert all(chart_keys_kept(emu, name) for name in RC_NAMES)
    assert counter(emu, NAME, "driftCorrections") == 0

    name = "kata-qemu-rs-m"
    want = next(o for o in rendered if o["metadata"]["name"] == name)["overhead"]["podFixed"]
    edit(emu, RUNTIME_CLASSES, name, lambda o: o["overhead"]["podFixed"].update(memory="1Mi"))
    wait_for(lambda: pod_fixed(emu, name) == want, 5)
    wait_for(lambda: counter(emu, NAME, "driftCorrections") == 1, 5)
    assert chart_keys_kept(emu, name), get_rc(emu, name)
    assert get_rc(emu, name)["scheduling"]["tolerations"] == [
        {"key": "kata", "operator": "Exists", "effect": "NoSchedule"}]
    [put] = writes(emu, f"/runtimeclasses/{name}")
    assert put.method == "PUT"

    # A selector key the policy sets, removed by hand, is put back; the chart's stay.
    edit(emu, RUNTIME_CLASSES, name, lambda o: o["scheduling"]["nodeSelector"].pop(SHARED_GATE))
    wait_for(lambda: get_rc(emu, name)["scheduling"]["nodeSelector"].get(SHARED_GATE) == "true", 5)
    assert chart_keys_kept(emu, name)


def test_a_chart_class_with_a_tee_key_in_pod_fixed_keeps_it(cluster):
    """The chart may request an extended resource (a TEE key slot) in podFixed: the policy
    decides cpu and memory only."""
    emu = cluster.emu
    cluster.start()
    cluster.create(kata_deploy_policy())
    wait_observed(emu, NAME, InSync="False")
    for obj in helm_upgrade(emu):
        obj["overhead"]["podFixed"]["sev-snp.amd.com/esids"] = "1"
        emu.objects(RUNTIME_CLASSES).put(obj)
    wait_observed(emu, NAME, InSync="True", Ready="True")
    settle(emu)
    assert not writes(emu, RC_PATH)
    assert all(o["overhead"]["podFixed"]["sev-snp.amd.com/esids"] == "1" for o in runtime_classes(emu).values())


def test_operator_mode_leaves_labels_and_annotations_of_gitops_tools_alone(cluster):
    emu = cluster.emu
    cluster.start(resync_s=0.4)
    cluster.create(example())
    wait_observed(emu, NAME, Ready="True")
    settle(emu)
    emu.reset_request_log()

    def gitops(obj: dict) -> None:
        meta = obj["metadata"]
        meta.setdefault("labels", {})["kustomize.toolkit.fluxcd.io/name"] = "kata"
        meta.setdefault("annotations", {})["argocd.argoproj.io/tracking-id"] = "kata:node.k8s.io/RuntimeClass:x"

    for name in RC_NAMES:
        edit(emu, RUNTIME_CLASSES, name, gitops)
    edit(emu, CONFIG_MAPS, f"{NAME}-dropins", gitops, OUTPUT_NAMESPACE)
    stays(lambda: not emu.write_requests(), 1.5, "the operator wrote after a GitOps tool labelled its objects")
    for name in RC_NAMES:
        meta = get_rc(emu, name)["metadata"]
        assert meta["labels"]["kustomize.toolkit.fluxcd.io/name"] == "kata"
        assert meta["labels"][POLICY_LABEL] == NAME
        assert "argocd.argoproj.io/tracking-id" in meta["annotations"]

    # A real edit next to them is corrected, and their keys survive the correction.
    edit(emu, CONFIG_MAPS, f"{NAME}-dropins", lambda o: o["data"].update({"m.toml": "#"}), OUTPUT_NAMESPACE)
    wait_for(lambda: get_cm(emu, f"{NAME}-dropins")["data"]["m.toml"] != "#", 5)
    meta = get_cm(emu, f"{NAME}-dropins")["metadata"]
    assert meta["labels"]["kustomize.toolkit.fluxcd.io/name"] == "kata"
    assert "argocd.argoproj.io/tracking-id" in meta["annotations"]
    assert [r.method for r in writes(emu, CM_PATH)] == ["PUT"]
