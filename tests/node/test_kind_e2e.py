"""The kind end-to-end run (scripts/kind-e2e.sh). It needs Docker, kind and a kubectl,
so it runs only when asked for with KATA_SIZING_E2E=1; the cheap consistency checks of
the script run everywhere."""

from __future__ import annotations

import os
import re
import shutil
import subprocess

import pytest
import yaml

from tests.support.paths import ROOT

SCRIPT = ROOT / "scripts" / "kind-e2e.sh"
# Image build, cluster creation and the checks; generous because a cold Docker cache
# downloads the base image and the kind node image.
E2E_TIMEOUT_S = 1800


def kubectl_path() -> str | None:
    found = shutil.which("kubectl")
    if found:
        return found
    local = ROOT / ".tools" / "kubectl"
    return str(local) if os.access(local, os.X_OK) else None


def reason_not_to_run() -> str | None:
    if os.environ.get("KATA_SIZING_E2E") != "1":
        return "kind end-to-end run not requested (set KATA_SIZING_E2E=1)"
    for tool in ("docker", "kind"):
        if shutil.which(tool) is None:
            return f"{tool} not on PATH"
    if kubectl_path() is None:
        return "kubectl not on PATH and not at .tools/kubectl (run `make tools`)"
    daemon = subprocess.run(
        ["docker", "info"], capture_output=True, text=True, check=False, timeout=30
    )
    if daemon.returncode != 0:
        last_line = (daemon.stderr.strip().splitlines() or ["docker info failed"])[-1]
        return f"Docker daemon not reachable: {last_line}"
    return None


def test_script_is_valid_bash() -> None:
    result = subprocess.run(
        ["bash", "-n", str(SCRIPT)], capture_output=True, text=True, check=False, timeout=30
    )
    assert result.returncode == 0, result.stderr


def test_script_deploys_the_image_the_manifests_run() -> None:
    deployment = yaml.safe_load((ROOT / "manifests" / "deployment.yaml").read_text())
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    match = re.search(r'^image="([^"]+)"', SCRIPT.read_text(), re.MULTILINE)
    assert match, "scripts/kind-e2e.sh sets no image"
    assert match.group(1) == container["image"]


@pytest.mark.kind
def test_kind_end_to_end() -> None:
    reason = reason_not_to_run()
    if reason:
        pytest.skip(reason)
    env = dict(os.environ, KUBECTL=kubectl_path() or "kubectl")
    result = subprocess.run(
        ["bash", str(SCRIPT)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=E2E_TIMEOUT_S,
    )
    assert result.returncode == 0, (
        f"kind-e2e.sh exited {result.returncode}\n"
        f"--- stdout (tail) ---\n{result.stdout[-4000:]}\n"
        f"--- stderr (tail) ---\n{result.stderr[-8000:]}"
    )
