"""The RuntimeClasses the kata-deploy chart and Helm create from a values overlay, per the facts
in tests/fixtures/kata-deploy-chart-runtimeclasses.yaml: what the operator's KataDeploy mode
finds in a real cluster (Helm's ownership label over ours, the chart's scheduling gate)."""

from __future__ import annotations

import copy

import yaml

from tests.support.paths import FIXTURES

FACTS = yaml.safe_load(
    (FIXTURES / "kata-deploy-chart-runtimeclasses.yaml").read_text())
RELEASE = "kata-deploy"
RELEASE_NAMESPACE = "kube-system"


def instance_marker(instance: str | None = None) -> str:
    facts = FACTS["customRuntimeClass"]
    return facts["instanceMarkerLabel"].format(instance=instance or facts["instanceDefault"])


def chart_runtime_classes(values_yaml: str, *, instance: str | None = None, release: str = RELEASE,
                          namespace: str = RELEASE_NAMESPACE, base_pod_fixed: dict | None = None) -> list[dict]:
    """Every custom runtime's RuntimeClass as it lands in the cluster after `helm upgrade -f`."""
    facts = FACTS["customRuntimeClass"]
    values = yaml.safe_load(values_yaml)
    runtimes = values["customRuntimes"]["runtimes"]
    objects = []
    for runtime in (runtimes.values() if isinstance(runtimes, dict) else runtimes):
        if not runtime.get("runtimeClass"):
            continue
        obj = yaml.safe_load(runtime["runtimeClass"]) or {}
        if runtime.get("inheritBaseOverhead", facts["inheritBaseOverheadDefault"]) and base_pod_fixed:
            given = ((obj.get("overhead") or {}).get("podFixed")) or {}
            obj["overhead"] = {"podFixed": {**copy.deepcopy(base_pod_fixed), **given}}
        scheduling = obj.setdefault("scheduling", {}) or {}
        obj["scheduling"] = scheduling
        selector = scheduling.setdefault("nodeSelector", {}) or {}
        scheduling["nodeSelector"] = selector
        selector[instance_marker(instance)] = facts["instanceMarkerValue"]
        meta = obj.setdefault("metadata", {})
        meta["labels"] = {**(meta.get("labels") or {}), **FACTS["helm"]["labels"]}
        meta["annotations"] = {
            **(meta.get("annotations") or {}),
            **{k: v.format(release=release, namespace=namespace) for k, v in FACTS["helm"]["annotations"].items()},
        }
        objects.append(obj)
    return objects
