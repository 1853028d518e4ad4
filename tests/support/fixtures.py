"""The emulator with the real operator in a thread (`cluster`, `cluster_without_gc`), for the
scenarios only the emulator can run (tests/support/operator_helpers.py reads what they look at),
and the session node's configuration: the reservations the operator's node guidance gives for
this machine."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.harness import running_emulator
from tests.support.operator_helpers import OperatorCluster
from tests.support.realnode import NodeConfig, host_problem


def operator_cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                     **emulator_options: Any) -> Iterator[OperatorCluster]:
    """An emulator (`running_emulator`'s options) and a not yet started operator; the operator is
    stopped before the emulator goes, and either one's failure fails the test."""
    with running_emulator(tmp_path, **emulator_options) as emu:
        cluster = OperatorCluster(emu, monkeypatch)
        try:
            yield cluster
        finally:
            cluster.stop()  # before the emulator goes away; re-raises an operator crash
    assert not emu.server_errors, f"the emulator itself failed: {emu.server_errors!r}"


@pytest.fixture
def cluster(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[OperatorCluster]:
    """The emulator (with its garbage collector) and a not yet started operator: `cluster.start()`."""
    yield from operator_cluster(tmp_path, monkeypatch)


@pytest.fixture
def cluster_without_gc(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[OperatorCluster]:
    """As `cluster`, but ownerReferences are not garbage-collected: only the operator's cleanup removes."""
    yield from operator_cluster(tmp_path, monkeypatch, garbage_collection=False)


@pytest.fixture(scope="session")
def node_config() -> NodeConfig:
    """The session's node (overrides tests/support/realnode.py's default): its kubelet with the
    reservations the operator's node guidance gives for this machine, its containerd with runc
    behind the node tests' policy handlers (tests/support/nodeoperator.py; tests/node/
    test_node_operator.py checks the node against that guidance). Where no node can run, the
    default (`real_node` then skips with the reason)."""
    from tests.support.nodeoperator import guided_node_config

    return NodeConfig() if host_problem() is not None else guided_node_config()
