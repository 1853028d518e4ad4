"""What `survey` reads is held to what a kubelet and the API server can send: names in Kubernetes'
grammar (refused at the door, exit 2, file and field named), figures as uint64, one Summary per
node; every pod of the policy's classes it does not measure is a line naming the pod and why; a
real cluster's `kubectl get pods -A -o yaml` (20,000 pods) is read a pod at a time."""

from __future__ import annotations

import json
import resource

import pytest
import yaml

from kata_sizing.cli import main
from kata_sizing.core.bounded import InputError
from kata_sizing.core.measure import kata_pod
from kata_sizing.core.podlist import MAX_POD_BYTES, NotStreamable, read_pod_list
from kata_sizing.core.survey import PodIndex, SurveyInputError, index_pods
from tests.support.summaries import MIB, Figures, summary, write_pod_list
from tests.support.summaries import kata_pod as pod_doc

POLICY = {"apiVersion": "katasizing.dev/v1alpha1", "kind": "KataSizingPolicy", "metadata": {"name": "qemu-rs"},
          "spec": {"shim": "qemu-runtime-rs", "classes": [{"name": "s", "cpu": "1", "memory": "1Gi"}]}}
RC = "kata-qemu-rs-s"


def run(capsys, *args) -> tuple[int, str, str]:
    code = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


def write(tmp_path, pods: list[dict], summaries: dict[str, dict]) -> list[str]:
    (tmp_path / "policy.yaml").write_text(yaml.safe_dump(POLICY))
    (tmp_path / "pods.yaml").write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": pods}))
    args = ["survey", tmp_path / "policy.yaml", "--pods", tmp_path / "pods.yaml"]
    for node, document in summaries.items():
        (tmp_path / f"{node}.json").write_text(json.dumps(document))
        args += ["--summary", tmp_path / f"{node}.json"]
    return args


def figures(_pod) -> Figures:
    return Figures(100 * MIB, 60 * MIB)


@pytest.mark.parametrize("edit, field", [
    (lambda p: p["metadata"].update(namespace="=team"), "metadata.namespace: '=team' is not a DNS label"),
    (lambda p: p["metadata"].update(name="web,1"), "metadata.name: 'web,1' is not a DNS subdomain"),
    (lambda p: p["metadata"].update(name='web"1'), "metadata.name"),
    (lambda p: p["metadata"].update(name="web\r1"), "metadata.name: 'web\\r1'"),
    (lambda p: p["metadata"].update(name="web\n1"), "metadata.name"),
    (lambda p: p["spec"].update(nodeName=["n1"]), "spec.nodeName: a list is not a name"),
    (lambda p: p["spec"].update(runtimeClassName={"a": 1}), "spec.runtimeClassName: a mapping is not a name"),
    (lambda p: p["spec"].update(runtimeClassName=[RC]), "spec.runtimeClassName: a list is not a name"),
])
def test_names_the_api_server_never_sends_are_refused_at_the_door(capsys, tmp_path, edit, field):
    pods = [pod_doc("web-0", "n1", RC, "256Mi", "300Mi", uid="u0"), pod_doc("web-1", "n1", RC, "256Mi", "300Mi", uid="u1")]
    edit(pods[1])
    code, out, err = run(capsys, *write(tmp_path, pods, {"n1": summary("n1", pods[:1], figures)}))
    assert code == 2 and out == ""
    assert err.startswith(f"error: {tmp_path / 'pods.yaml'}: items[1]: ") and field in err
    assert err.count("\n") == 1 and "Traceback" not in err


def test_the_core_takes_a_list_or_mapping_name_without_a_traceback():
    # Read straight from the core (no CLI): no TypeError: unhashable, a pod that is not a Kata pod.
    assert kata_pod({"spec": {"runtimeClassName": [RC], "nodeName": "n1"}}, {RC}) is None
    assert kata_pod({"spec": {"runtimeClassName": {"a": 1}}}, None) is None
    with pytest.raises(SurveyInputError, match=r"items\[0\]: spec.runtimeClassName: a list is not a name"):
        index_pods([{"metadata": {"name": "p"}, "spec": {"runtimeClassName": [RC]}}], {RC})


def test_summary_names_are_refused_at_the_door(capsys, tmp_path):
    pods = [pod_doc("web-0", "n1", RC, "256Mi", "300Mi", uid="u0")]
    document = summary("n1", pods, figures)
    document["pods"][0]["podRef"]["namespace"] = "fleet\nerror: forged"
    code, out, err = run(capsys, *write(tmp_path, pods, {"n1": document}))
    assert code == 2 and "the Summary of node n1: pods[0].podRef.namespace:" in err and err.count("\n") == 1
    document = summary("n1,x", pods, figures)
    code, out, err = run(capsys, *write(tmp_path, pods, {"n1": document}))
    assert code == 2 and "node.nodeName: 'n1,x' is not a DNS subdomain" in err


def test_figures_past_a_kubelets_uint64_are_no_figures(capsys, tmp_path):
    pods = [pod_doc("web-0", "n1", RC, "256Mi", "300Mi", uid="u0"), pod_doc("web-1", "n1", RC, "256Mi", "300Mi", uid="u1")]
    document = summary("n1", pods, figures)
    document["pods"][1]["memory"]["workingSetBytes"] = 2**64
    code, out, err = run(capsys, *write(tmp_path, pods, {"n1": document}))
    assert code == 0
    assert "18446744073709551616" not in out and out.count("fleet/web-") == 1
    assert "fleet/web-1 on n1: the pod's memory.workingSetBytes 18446744073709551616 is not a figure a kubelet sends" in err


def test_every_pod_left_out_is_named_with_the_reason(capsys, tmp_path):
    pods = [pod_doc(f"web-{i}", "n1", RC, "256Mi", "300Mi", uid=f"u{i}") for i in range(3)]
    pods.append(pod_doc("moved", "n2", RC, "256Mi", "300Mi", uid="u-moved"))     # on n2 by its spec
    pods.append(pod_doc("elsewhere", "n3", RC, "256Mi", "300Mi", uid="u-far"))  # no Summary of n3
    pods[2]["spec"]["containers"][0]["resources"]["limits"]["memory"] = "5Zi"     # does not parse
    listed = [pods[0], pods[1], pods[3]]  # n1's Summary lists "moved", and not web-1's... (below)
    n1 = summary("n1", [pods[0], pods[3]], figures)
    n2 = summary("n2", [], figures)
    code, out, err = run(capsys, *write(tmp_path, pods, {"n1": n1, "n2": n2}))
    assert code == 0 and listed
    notes = err.splitlines()
    assert "note: pod fleet/web-1 not measured: not in the Summary of node n1 (just started, or gone)" in notes
    assert "note: pod fleet/moved not measured: its spec places it on node n2, but the Summary of node n1 lists it" \
        in notes
    assert "note: pod fleet/elsewhere not measured: no Summary of its node n3 was read" in notes
    assert any(line.startswith("note: pod fleet/web-2 not measured: its spec cannot be read:") and "5Zi" in line
               for line in notes), notes
    assert [line.split(",")[1] for line in out.splitlines() if line.startswith("n1,")] == ["fleet/web-0"]


def test_the_same_node_twice(capsys, tmp_path):
    pods = [pod_doc("web-0", "n1", RC, "256Mi", "300Mi", uid="u0")]
    args = write(tmp_path, pods, {"n1": summary("n1", pods, figures)})
    code, out, err = run(capsys, *args, "--summary", tmp_path / "n1.json")
    assert code == 0 and out.count("fleet/web-0") == 1
    assert err == f"note: {tmp_path / 'n1.json'} is given twice; it is read once\n"
    (tmp_path / "again.json").write_text((tmp_path / "n1.json").read_text())
    code, out, err = run(capsys, *args, "--summary", tmp_path / "again.json")
    assert code == 2 and out == ""
    assert err == (f"error: {tmp_path / 'n1.json'} and {tmp_path / 'again.json'} are both Summaries of node n1: "
                   "give one per node\n")


def test_a_pods_file_of_another_kind_is_named(capsys, tmp_path):
    args = write(tmp_path, [], {"n1": summary("n1", [], figures)})
    (tmp_path / "pods.yaml").write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {
        "name": "x"}, "data": {"a": "b"}}))
    code, out, err = run(capsys, *args)
    assert code == 2 and f"{tmp_path / 'pods.yaml'}: kind 'ConfigMap' is not a Pod or a List of Pods" in err


# --- the pod list, streamed ------------------------------------------------------------------


def _runc(pod: dict, runc: bool) -> dict:
    if runc:
        del pod["spec"]["runtimeClassName"]
    return pod


def test_a_list_is_read_a_pod_at_a_time_as_kubectl_writes_it():
    text = yaml.safe_dump({"apiVersion": "v1", "items": [
        _runc(pod_doc(f"p{i}", "n1", RC, "1Gi", "1Mi", uid=f"u{i}"), i % 2 == 0) for i in range(4)],
        "kind": "List", "metadata": {"resourceVersion": ""}})
    found = list(read_pod_list(text.splitlines(keepends=True), "pods.yaml", lambda t: "runtimeClassName" in t))
    assert [(where, pod["metadata"]["name"]) for where, pod in found] == [
        ("pods.yaml: items[1]", "p1"), ("pods.yaml: items[3]", "p3")]
    with pytest.raises(NotStreamable):
        list(read_pod_list(json.dumps({"items": []}).splitlines(keepends=True), "pods.json"))
    other = text.replace("kind: List", "kind: ConfigMapList")
    with pytest.raises(InputError, match="kind 'ConfigMapList' is not a List of Pods"):
        list(read_pod_list(other.splitlines(keepends=True), "pods.yaml"))
    huge = "items:\n- metadata: {name: p}\n  note: " + "x" * (MAX_POD_BYTES + 10) + "\n"
    with pytest.raises(InputError, match="a pod of more than 3 MiB"):
        list(read_pod_list(huge.splitlines(keepends=True), "pods.yaml"))


def test_a_20000_pod_cluster_is_surveyed_within_the_bounds(capsys, tmp_path):
    """`kubectl get pods -A -o yaml` of 20,000 pods of about 4 KiB each (76 MiB: 19 times the 4 MiB any
    other input may be), 200 of them of the policy's class on 50 nodes: read a pod at a time."""
    kata_pods = write_pod_list(tmp_path / "pods.yaml", 20_000, 100, 50, RC)
    size = (tmp_path / "pods.yaml").stat().st_size
    assert size > 75 * MIB
    (tmp_path / "policy.yaml").write_text(yaml.safe_dump(POLICY))
    args = ["survey", tmp_path / "policy.yaml", "--pods", tmp_path / "pods.yaml"]
    for node in sorted({p["spec"]["nodeName"] for p in kata_pods}):
        (tmp_path / f"{node}.json").write_text(json.dumps(summary(
            node, [p for p in kata_pods if p["spec"]["nodeName"] == node], figures)))
        args += ["--summary", tmp_path / f"{node}.json"]
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    code, out, err = run(capsys, *args)
    assert (code, err) == (0, ""), err[:2000]
    assert out.splitlines()[0].startswith("# kata-sizing survey of policy qemu-rs: 200 pod(s) on 50 node(s)")
    assert sorted(line.split(",")[1] for line in out.splitlines()[4:]) == sorted(
        f"payments/{p['metadata']['name']}" for p in kata_pods)
    # A pod at a time: the peak grows by far less than the 76 MiB of text (a whole-file parse builds
    # about 2 GB of objects). The time and the peak are figures of `make bench` (section survey).
    grown_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert grown_mib < 64, grown_mib


def test_an_index_counts_pods_and_keeps_only_the_measured_classes():
    index = PodIndex({RC})
    index.add(pod_doc("a", "n1", RC, "1Gi", "1Mi", uid="u1"), "items[0]")
    index.add(pod_doc("b", "n1", "kata-other", "1Gi", "1Mi", uid="u2"), "items[1]")
    pending = pod_doc("c", "n1", RC, "1Gi", "1Mi", uid="u3")
    del pending["spec"]["nodeName"]
    index.add(pending, "items[2]")
    assert index.pods == 3 and list(index.by_node) == ["n1"] and list(index.by_node["n1"]) == ["u1"]
    assert index.notes() == ["pod fleet/c not measured: not scheduled on a node yet"]
