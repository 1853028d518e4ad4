"""
Test harness: a strict Kubernetes API emulator (kmock 0.8 underneath) and a runner for
kopf operators in their own thread. See ``emulator.py`` and ``kopf_thread.py``.
"""
from .emulator import (
    FaultRule,
    KubernetesApiEmulator,
    RequestRecord,
    ResourceObjects,
    default_resources,
    running_emulator,
)
from .kopf_thread import KopfThread, fast_test_settings  # noqa: E402
from .store import ApiError, ResourceType

__all__ = [
    'ApiError',
    'FaultRule',
    'KopfThread',
    'KubernetesApiEmulator',
    'RequestRecord',
    'ResourceObjects',
    'ResourceType',
    'default_resources',
    'fast_test_settings',
    'running_emulator',
]
