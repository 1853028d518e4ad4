"""Policies the tests start from: the project's examples, the qemu-runtime-rs example with its
classes spelled out (so one can be changed), and a policy of names go-yaml would misread."""

from __future__ import annotations

from typing import Any

import yaml

from tests.support.paths import EXAMPLES


def example(name: str = "qemu-runtime-rs") -> dict:
    return yaml.safe_load((EXAMPLES / f"{name}.yaml").read_text())


def explicit_classes_policy(name: str = "qemu-rs", classes: list[dict] | None = None, **spec: Any) -> dict:
    """The qemu-runtime-rs example with its default classes spelled out (so one can be changed)."""
    body = example()
    body["metadata"]["name"] = name
    body["spec"]["classes"] = classes if classes is not None else [
        {"name": "s", "cpu": "1", "memory": "1Gi"},
        {"name": "m", "cpu": "2", "memory": "4Gi"},
        {"name": "l", "cpu": "4", "memory": "16Gi"},
        {"name": "xl", "cpu": "16", "memory": "64Gi"},
    ]
    body["spec"].update(spec)
    return body


def tricky_policy_body() -> dict:
    return {
        "apiVersion": "katasizing.dev/v1alpha1", "kind": "KataSizingPolicy",
        "metadata": {"name": "n", "uid": "0e3c9a4e-0000-4000-8000-00000000000a"},
        "spec": {
            "shim": "qemu-runtime-rs",
            "runtimeClass": {
                "namePrefix": "1e-3",
                "nodeSelector": {"katacontainers.io/kata-runtime": "true", "zone": "y"},
                "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "n", "effect": "NoSchedule"}],
            },
            "classes": [{"name": "n", "cpu": "1", "memory": "1Gi"}, {"name": "on", "cpu": "2", "memory": "4Gi"}],
            "admission": {"namespaces": {"selector": {"matchLabels": {"tier": "y"}}}},
        },
    }
