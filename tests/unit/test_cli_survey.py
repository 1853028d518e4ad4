"""`kata-sizing survey`, `calibrate` of its rows and `render --proposal`, as a user runs them: from
saved Summaries and `kubectl get pods -A -o yaml`, and from a cluster (the emulator) through the
API server's node proxy."""

from __future__ import annotations

import json

import pytest
import yaml

from kata_sizing.cli import main
from kata_sizing.core.calibrate import parse_samples_csv
from kata_sizing.core.model import parse_policy
from kata_sizing.core.sizing import explain_pod, size_policy
from tests.support.summaries import MIB, Figures, json_response, kata_pod, node, summary

POLICY = {"apiVersion": "katasizing.dev/v1alpha1", "kind": "KataSizingPolicy", "metadata": {"name": "qemu-rs"},
          "spec": {"shim": "qemu-runtime-rs", "classes": [{"name": "s", "cpu": "1", "memory": "1Gi"},
                                                          {"name": "m", "cpu": "2", "memory": "4Gi"}]}}
SIZING = size_policy(parse_policy(POLICY))
LIMITS = {"s": ["256Mi", "512Mi", "1Gi"], "m": ["2Gi", "4Gi"]}


def run(capsys, *args) -> tuple[int, str, str]:
    code = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


def true_overhead(pod: dict) -> Figures:
    """What a lazily touched VM of this pod's size would hold beyond its workload: a guest part
    growing with the VM and 40 MiB of host side."""
    limit = pod["spec"]["containers"][0]["resources"]["limits"]["memory"]
    class_name = pod["spec"]["runtimeClassName"].rsplit("-", 1)[1]
    vm = explain_pod(SIZING, class_name, None, int(limit.removesuffix("Mi").removesuffix("Gi"))
                     * (MIB if limit.endswith("Mi") else 1024 * MIB)).vm.memory_mib
    return Figures(containers_working_set_bytes=100 * MIB, overhead_bytes=int((40 + 60 + 0.04 * vm) * MIB))


@pytest.fixture
def saved(tmp_path) -> dict:
    """Two nodes' Summaries and the pods' specs, as a user saves them for a cluster the CLI cannot reach."""
    pods, index = [], 0
    for class_name, limits in LIMITS.items():
        for limit in limits:
            pod = kata_pod(f"app-{index}", f"kata-{index % 2}", f"kata-qemu-rs-{class_name}", limit,
                           f"{SIZING.class_named(class_name).pod_fixed_memory_mib}Mi", uid=f"uid-{index}")
            pods.append(pod)
            index += 1
    runc = kata_pod("proxy", "kata-0", "", "64Mi", "0", namespace="kube-system", uid="uid-runc")
    del runc["spec"]["runtimeClassName"], runc["spec"]["overhead"]
    pods.append(runc)
    (tmp_path / "pods.yaml").write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": pods}))
    (tmp_path / "policy.yaml").write_text(yaml.safe_dump(POLICY))
    files = []
    for name in ("kata-0", "kata-1"):
        on_node = [p for p in pods if p["spec"]["nodeName"] == name]
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(summary(name, on_node, lambda p: true_overhead(p) if p["spec"].get(
            "runtimeClassName") else Figures(30 * MIB, 1 * MIB))))
        files.append(path)
    return {"pods": tmp_path / "pods.yaml", "policy": tmp_path / "policy.yaml", "summaries": files,
            "dir": tmp_path}


def test_survey_from_saved_summaries_writes_calibrates_csv(capsys, saved):
    args = ["survey", saved["policy"], "--pods", saved["pods"]]
    for path in saved["summaries"]:
        args += ["--summary", path]
    code, out, err = run(capsys, *args)
    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert lines[0] == "# kata-sizing survey of policy qemu-rs: 5 pod(s) on 2 node(s), from saved Summaries."
    assert lines[3] == ("node,pod,class,accelerator,guest,host_processes,devices,container_limit_mib,vm_nominal_mib,"
                        "free_total_mib,free_used_mib,pod_cgroup_memory_current_bytes,pod_working_set_bytes,"
                        "containers_working_set_bytes,pod_cgroup_limit_bytes")
    rows = parse_samples_csv(out)
    assert sorted(r.pod for r in rows) == [f"fleet/app-{i}" for i in range(5)]
    first = next(r for r in rows if r.pod == "fleet/app-0")
    assert (first.node, first.class_name, first.container_limit_mib) == ("kata-0", "s", 256)
    # What it measured: a live Kata pod, its shim, VMM and virtiofsd in the pod cgroup (sandboxCgroupOnly).
    assert (first.accelerator, first.guest, first.host_processes, first.devices) == ("kvm", "kata-pod", "kata-pod",
                                                                                    "kata")
    assert first.vm_nominal_mib == 256 + SIZING.class_named("s").overhead_memory_mib
    spec = next(p for p in yaml.safe_load(saved["pods"].read_text())["items"] if p["metadata"]["name"] == "app-0")
    assert first.pod_working_set_bytes - first.containers_working_set_bytes == true_overhead(spec).overhead_bytes
    assert first.pod_cgroup_limit_bytes == (256 + SIZING.class_named("s").pod_fixed_memory_mib) * MIB


def test_survey_calibrate_render_round_trip(capsys, saved):
    args = ["survey", saved["policy"], "--pods", saved["pods"]]
    for path in saved["summaries"]:
        args += ["--summary", path]
    _, out, _ = run(capsys, *args)
    survey = saved["dir"] / "survey.csv"
    survey.write_text(out)

    code, out, err = run(capsys, "calibrate", survey, "--policy", saved["policy"], "-o", "json")
    assert (code, err) == (0, ""), err
    report = json.loads(out)
    # The host side is not measured (no VM fully resident): the policy's 50Mi is kept, and the
    # guest line is the overhead used less it: 60 MiB + 4% of the VM.
    assert report["overhead"]["guestMemoryRatio"] in ("0.0400", "0.0401")  # bytes rounded down, ratio up
    assert report["overhead"]["guestMemoryBase"] in ("50Mi", "51Mi")
    assert "hostMemory" not in report["overhead"]
    assert any("50 MiB assumed" in note for note in report["notes"])
    # Every measured pod fits under the cgroup limit the proposal gives it.
    assert [c["podsMeasured"] for c in report["classes"]] == [3, 2]
    assert all(c["minHeadroomBytes"] >= 0 for c in report["classes"])

    code, out, err = run(capsys, "render", saved["policy"], "--proposal", survey)
    assert (code, err) == (0, "")
    assert out.startswith(f"# kata-sizing: policy qemu-rs refitted from {survey} (5 row(s)).\n")
    assert "--- qemu-rs-kata-deploy-values/values.yaml (now)\n+++ qemu-rs-kata-deploy-values/values.yaml (proposed)\n" in out
    proposed = {c["name"]: c["podFixed"]["memory"] for c in report["classes"]}
    assert f'+            memory: {proposed["s"]}' in out
    assert f'-            memory: {SIZING.class_named("s").pod_fixed["memory"]}' in out


def test_calibrate_without_a_policy_needs_a_host_side_for_kubelet_rows(capsys, saved, tmp_path):
    args = ["survey", saved["policy"], "--pods", saved["pods"]]
    for path in saved["summaries"]:
        args += ["--summary", path]
    _, out, _ = run(capsys, *args)
    survey = tmp_path / "s.csv"
    survey.write_text(out)
    code, _, err = run(capsys, "calibrate", survey)
    assert code == 1 and "no row measures the host side" in err and "--host-memory" in err
    code, out, err = run(capsys, "calibrate", survey, "--host-memory", "40Mi")
    assert (code, err) == (0, "")
    assert yaml.safe_load(out)["overhead"]["guestMemoryBase"] in ("60Mi", "61Mi")


@pytest.mark.parametrize("extra, message, code", [
    (["--summary", "{summary}"], "--summary needs --pods", 2),
    (["--pods", "{pods}"], "--pods goes with --summary", 2),
    (["--summary", "{pods}", "--pods", "{pods}"], "not valid JSON", 2),
    (["--summary", "{empty}", "--pods", "{pods}"], "not a kubelet Summary (no node.nodeName)", 2),
    (["--timeout", "0"], "--timeout: 0 is not a number of seconds above 0", 2),
    (["--timeout", "nan"], "--timeout: nan is not a number of seconds", 2),
])
def test_survey_input_errors_are_one_line(capsys, saved, extra, message, code):
    (saved["dir"] / "empty.json").write_text("{}")
    values = {"summary": saved["summaries"][0], "pods": saved["pods"], "empty": saved["dir"] / "empty.json"}
    got, out, err = run(capsys, "survey", saved["policy"], *[e.format(**values) for e in extra])
    assert got == code and out == ""
    assert message in err and err.count("\n") == 1 and "Traceback" not in err


def test_survey_of_pods_that_are_not_the_policys_says_so(capsys, saved):
    other = dict(POLICY, metadata={"name": "other"})
    (saved["dir"] / "other.yaml").write_text(yaml.safe_dump(other))
    code, out, err = run(capsys, "survey", saved["dir"] / "other.yaml", "--pods", saved["pods"],
                         "--summary", saved["summaries"][0])
    assert code == 1 and out == ""
    assert "no pod of policy other's classes (kata-other-m, kata-other-s) was measured in saved Summaries" in err


@pytest.mark.emulator
def test_survey_reads_a_cluster_through_the_api_servers_node_proxy(capsys, saved, tmp_path, monkeypatch):
    from tests.support.harness import running_emulator

    pods = yaml.safe_load(saved["pods"].read_text())["items"]
    with running_emulator(tmp_path) as emu:
        stored = []
        for name in ("kata-0", "kata-1", "kata-2"):
            emu.objects("v1/nodes").create(node(name))
        for pod in pods:
            pod = dict(pod, metadata={k: v for k, v in pod["metadata"].items() if k != "uid"})
            stored.append(emu.objects("v1/pods").create(pod, pod["metadata"]["namespace"]))
        stored.append(emu.objects("v1/pods").create(kata_pod("late", "kata-2", "kata-qemu-rs-s", "256Mi", "300Mi"),
                                                    "fleet"))

        async def kubelet(node_name: str, path: str):
            if node_name == "kata-2":
                return json_response({"kind": "Status", "code": 503, "message": "kubelet unavailable"}, 503)
            on_node = [p for p in stored if p["spec"]["nodeName"] == node_name]
            return json_response(summary(node_name, on_node, lambda p: true_overhead(p) if p["spec"].get(
                "runtimeClassName") else Figures(30 * MIB, MIB)))

        emu.serve_node_proxy(kubelet)
        monkeypatch.setenv("KUBECONFIG", str(emu.kubeconfig))
        code, out, err = run(capsys, "survey", saved["policy"])
        assert code == 0, err
        assert err.splitlines() == [
            "note: node kata-2 skipped: read the Summary of node kata-2: kubelet unavailable",
            "note: pod fleet/late not measured: no Summary of its node kata-2 was read"]
        assert out.splitlines()[0] == ("# kata-sizing survey of policy qemu-rs: 5 pod(s) on 2 node(s), from the "
                                       "cluster (kubelet Summaries through the API server).")
        assert len(parse_samples_csv(out)) == 5
        proxied = sorted(r.path for r in emu.requests("GET", "/proxy/"))
        assert proxied == [f"/api/v1/nodes/kata-{i}/proxy/stats/summary" for i in range(3)]
