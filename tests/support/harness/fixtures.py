"""
Pytest fixtures. Use them from a conftest.py with ``pytest_plugins = ['tests.support.harness.fixtures']``,
or import them by name into a test module.
"""
import pathlib
import threading
from collections.abc import Iterator

import pytest

from .emulator import KubernetesApiEmulator, running_emulator


@pytest.fixture
def emulator(tmp_path: pathlib.Path) -> Iterator[KubernetesApiEmulator]:
    """A running emulator; ``emulator.kubeconfig`` is the path of a kubeconfig pointing at it."""
    threads_before = set(threading.enumerate())
    with running_emulator(tmp_path) as emu:
        yield emu
    assert not emu.server_errors, f"The emulator itself failed: {emu.server_errors!r}"
    leaked = [t for t in threading.enumerate() if t not in threads_before and t.name == 'kubernetes-api-emulator']
    assert not leaked, f"Leaked emulator threads: {leaked!r}"


@pytest.fixture
def kubeconfig(emulator: KubernetesApiEmulator) -> pathlib.Path:
    assert emulator.kubeconfig is not None
    return emulator.kubeconfig
