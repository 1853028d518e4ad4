"""The Helm chart and the tools the tests run offline (helm, kubectl from .tools/, else PATH)."""

from __future__ import annotations

import os
import shutil

from tests.support.paths import ROOT

CHART = ROOT / "charts" / "kata-sizing"
# Every optional object of the chart: the webhook, the ServiceMonitor, the alerts, the namespace.
EVERYTHING_ON = ["--set", "webhook.enabled=true", "--set", "metrics.serviceMonitor.enabled=true",
                 "--set", "metrics.prometheusRule.enabled=true", "--set", "namespace.create=true"]


def find_tool(name: str) -> str | None:
    local = ROOT / ".tools" / name
    return str(local) if os.access(local, os.X_OK) else shutil.which(name)
