# ---- Operator scenario fixtures (tests/test_operator_*.py, tests/test_rbac_coverage.py) ----
# An emulator with the real operator; see tests/operator_helpers.py. Other fixture blocks may
# follow; keep this one self-contained.
from collections.abc import Iterator

import pytest

from tests.harness import running_emulator
from tests.operator_helpers import OperatorCluster


def _operator_cluster(tmp_path, monkeypatch, **emulator_options) -> Iterator[OperatorCluster]:
    with running_emulator(tmp_path, **emulator_options) as emu:
        cluster = OperatorCluster(emu, monkeypatch)
        try:
            yield cluster
        finally:
            cluster.stop()  # before the emulator goes away; re-raises an operator crash
    assert not emu.server_errors, f"the emulator itself failed: {emu.server_errors!r}"


@pytest.fixture
def cluster(tmp_path, monkeypatch) -> Iterator[OperatorCluster]:
    """The emulator (with its garbage collector) and a not yet started operator: `cluster.start()`."""
    yield from _operator_cluster(tmp_path, monkeypatch)


@pytest.fixture
def cluster_without_gc(tmp_path, monkeypatch) -> Iterator[OperatorCluster]:
    """As `cluster`, but ownerReferences are not garbage-collected: only the operator's cleanup removes."""
    yield from _operator_cluster(tmp_path, monkeypatch, garbage_collection=False)
# ---- end of operator scenario fixtures ----

# ---- The real control plane (tests/realcluster.py): `control_plane`, `real_operator` ----
from tests.realcluster import (  # noqa: E402,F401
    control_plane,
    pytest_collection_modifyitems,
    pytest_runtest_makereport,
    real_operator,
)

# ---- The real node (tests/realnode.py): `real_node`, `node_config`, `control_plane_address` ----
from tests.realnode import NodeConfig, control_plane_address, host_problem, node_namespace, real_node  # noqa: E402,F401


@pytest.fixture(scope="session")
def node_config() -> NodeConfig:
    """The session's node: its kubelet with the reservations the operator's node guidance gives
    for this machine, its containerd with runc behind the node tests' policy handlers
    (tests/nodeoperator.py; tests/test_node_operator.py checks the node against that guidance).
    Where no node can run, the default (`real_node` then skips with the reason)."""
    from tests.nodeoperator import guided_node_config

    return NodeConfig() if host_problem() is not None else guided_node_config()
