"""The node's configuration files and its gate, without a node (these run on any machine):
containerd maps every test handler to runc and restricts oom_score_adj, the kubelet takes the
caller's reservations in place of its defaults, and a machine that cannot run the node skips
the node tests with one line, or fails them under KATA_SIZING_REQUIRE_NODE=1."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from tests.support import realnode

CRI = "io.containerd.grpc.v1.cri"


def test_containerd_maps_every_handler_to_runc_and_restricts_the_oom_score() -> None:
    handlers = (*realnode.DEFAULT_RUNTIME_HANDLERS, "kata-other-s", "kata-node-s")  # a repeat is one table
    config = tomllib.loads(realnode.containerd_configuration("kata-sizing.test/pause:1", handlers))

    cri = config["plugins"][CRI]
    assert cri["restrict_oom_score_adj"] is True
    assert cri["sandbox_image"] == "kata-sizing.test/pause:1"
    runtimes = cri["containerd"]["runtimes"]
    assert set(runtimes) == {"runc", *handlers}
    for name, runtime in runtimes.items():
        assert runtime["runtime_type"] == "io.containerd.runc.v2", name
        assert runtime["options"] == {"SystemdCgroup": False, "Root": str(realnode.STATE / "runc")}, name
    assert cri["containerd"]["default_runtime_name"] == "runc"
    # Everything containerd keeps is under the node's state directory.
    for path in (config["root"], config["state"], config["grpc"]["address"], cri["cni"]["conf_dir"],
                 config["plugins"]["io.containerd.internal.v1.opt"]["path"]):
        assert Path(path).is_relative_to(realnode.STATE), path


def test_the_kubelet_takes_the_callers_reservations_in_place_of_its_defaults() -> None:
    guidance = {"systemReserved": {"memory": "1Gi"}, "kubeReserved": {"memory": "512Mi"},
                "evictionHard": {"memory.available": "256Mi"}}
    config = realnode.kubelet_configuration(Path("/cp"), 10250, guidance)

    assert config["systemReserved"] == {"memory": "1Gi"}
    assert config["kubeReserved"] == {"memory": "512Mi"}
    assert config["evictionHard"] == {"memory.available": "256Mi"}  # replaced whole, not merged
    assert (config["failCgroupV1"], config["cgroupDriver"]) == (False, "cgroupfs")
    assert config["registerWithTaints"] == [realnode.NODE_TAINT]
    assert config["authorization"] == {"mode": "Webhook"}
    assert config["authentication"]["x509"] == {"clientCAFile": "/cp/ca.crt"}

    default = realnode.kubelet_configuration(Path("/cp"), 10250, {})
    assert default["evictionHard"] == {"memory.available": "100Mi"}
    assert "systemReserved" not in default and "kubeReserved" not in default


def test_pods_tolerate_the_nodes_taint() -> None:
    taint, toleration = realnode.NODE_TAINT, realnode.NODE_TOLERATION
    assert (toleration["key"], toleration["effect"], toleration["operator"]) == (taint["key"], taint["effect"], "Exists")


def test_a_machine_without_root_has_a_one_line_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(realnode.os, "geteuid", lambda: 1000)
    problem = realnode.host_problem()
    assert problem is not None and "not root" in problem and "\n" not in problem


def test_the_gate_skips_with_one_line_or_fails_when_the_node_is_required(monkeypatch: pytest.MonkeyPatch) -> None:
    realnode.require_node(None)  # a machine that can: nothing happens

    monkeypatch.delenv(realnode.REQUIRE_ENV, raising=False)
    with pytest.raises(pytest.skip.Exception) as skipped:
        realnode.require_node("not root (the kubelet needs root)")
    assert str(skipped.value) == ("no real node on this machine: not root (the kubelet needs root): "
                                  "node tests skipped")

    monkeypatch.setenv(realnode.REQUIRE_ENV, "1")
    with pytest.raises(pytest.fail.Exception) as failed:
        realnode.require_node("not root (the kubelet needs root)")
    assert str(failed.value).startswith("KATA_SIZING_REQUIRE_NODE=1 but no real node on this machine: not root")
