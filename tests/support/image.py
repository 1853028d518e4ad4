"""The operator's image as `make image` writes it, loaded and run with podman the way the chart
runs it. Used by tests/node/test_image.py and bench/image_bench.py.

`make image` (scripts/image/build.sh) writes ARCHIVE, an OCI archive tagged IMAGE_REF. Here it
is loaded into a podman store of its own (scripts/image/podman.sh --store DIR), so what runs is
exactly what `podman load` or `ctr -n k8s.io images import` of that file gives, not whatever the
build left in its store.

Without the archive or podman the image tests skip with one reason; with
KATA_SIZING_REQUIRE_IMAGE=1 (set by .ci/run) that skip is a failure instead.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tomllib
from pathlib import Path

import yaml

from tests.support.paths import ROOT

# Keep equal to the Makefile's IMAGE_ARCHIVE and IMAGE_REF (the node's tests import this file).
ARCHIVE = ROOT / ".tools" / "images" / "kata-sizing.oci.tar"
PODMAN_SH = ROOT / "scripts" / "image" / "podman.sh"
DEPLOYMENT = ROOT / "manifests" / "deployment.yaml"
REQUIRE_ENV = "KATA_SIZING_REQUIRE_IMAGE"


def project_version() -> str:
    with (ROOT / "pyproject.toml").open("rb") as stream:
        return tomllib.load(stream)["project"]["version"]


IMAGE_REF = f"ghcr.io/kata-sizing/kata-sizing:{project_version()}"


def unavailable_reason() -> str | None:
    """Why the image cannot be run here, or None."""
    if shutil.which("podman") is None:
        return ("podman is not installed (`make image` installs it with apt-get as root): "
                "image tests skipped")
    if not ARCHIVE.exists():
        return (f"the image is not built ({ARCHIVE.relative_to(ROOT)}; `make image` needs root, "
                "apt-get, mmdebstrap and podman): image tests skipped")
    return None


class Podman:
    """podman with its own store directory (scripts/image/podman.sh)."""

    def __init__(self, store: Path) -> None:
        self.store = store

    def command(self, *args: str) -> list[str]:
        return ["bash", str(PODMAN_SH), "--store", str(self.store), *args]

    def __call__(self, *args: str, check: bool = True, timeout: float = 120,
                 input: str | None = None) -> subprocess.CompletedProcess:
        result = subprocess.run(self.command(*args), capture_output=True, text=True, input=input,
                                timeout=timeout, check=False)
        if check and result.returncode != 0:
            raise AssertionError(f"podman {' '.join(args)} exited {result.returncode}:\n"
                                 f"{result.stdout[-2000:]}\n{result.stderr[-3000:]}")
        return result

    def load(self, archive: Path = ARCHIVE) -> None:
        self("load", "--quiet", "--input", str(archive), timeout=300)

    def reset(self) -> None:
        """Remove every container and image of this store (unmounting its layers)."""
        self("system", "reset", "--force", check=False, timeout=120)


def deployment_container() -> tuple[dict, dict]:
    """The pod spec and the operator container of manifests/deployment.yaml (the chart renders
    the same Deployment: tests/unit/test_chart.py)."""
    deployment = yaml.safe_load(DEPLOYMENT.read_text())
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    return pod, container


def chart_run_options() -> list[str]:
    """`podman run` options for the Deployment's security context and volumes.

    Every key of the pod's and the container's securityContext, and every volume mount, is
    translated or this raises: a setting added to the Deployment must be added here, so the
    image is never tested under a laxer context than the chart gives it."""
    pod, container = deployment_container()
    context = {**pod.get("securityContext", {}), **container.get("securityContext", {})}
    options: list[str] = []
    user, group = context.pop("runAsUser", None), context.pop("runAsGroup", None)
    if user is not None:
        # podman adds an /etc/passwd entry for a user the image lacks; the kubelet does not (kopf
        # named itself from that entry and the operator died on the real node's first start).
        options += ["--user", f"{user}:{group}" if group is not None else str(user), "--passwd=false"]
    # runAsNonRoot: the kubelet refuses to start a container whose user is 0 or not numeric;
    # podman has no such check, so the tests assert the image's user and the running UID.
    context.pop("runAsNonRoot", None)
    if context.pop("readOnlyRootFilesystem", False):
        # No tmpfs of podman's own on /tmp, /var/tmp and /run: only the volumes below.
        options += ["--read-only", "--read-only-tmpfs=false"]
    if context.pop("allowPrivilegeEscalation", True) is False:
        options += ["--security-opt", "no-new-privileges"]
    capabilities = context.pop("capabilities", {})
    for capability in capabilities.pop("drop", []):
        options += ["--cap-drop", capability]
    for capability in capabilities.pop("add", []):
        options += ["--cap-add", capability]
    if capabilities:
        raise AssertionError(f"capabilities settings not translated for podman: {capabilities}")
    seccomp = context.pop("seccompProfile", {"type": "RuntimeDefault"})
    if seccomp != {"type": "RuntimeDefault"}:
        raise AssertionError(f"seccompProfile not translated for podman: {seccomp}")
    # RuntimeDefault is podman's default profile: nothing to add (podman never runs unconfined
    # unless told).
    if context:
        raise AssertionError(f"securityContext settings not translated for podman: {context}")

    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    for mount in container.get("volumeMounts", []):
        volume = volumes[mount["name"]]
        if set(volume) - {"name"} != {"emptyDir"}:
            raise AssertionError(f"volume {volume} not translated for podman")
        size = (volume["emptyDir"] or {}).get("sizeLimit")
        tmpfs = mount["mountPath"] + (f":size={quantity_to_podman(size)}" if size else "")
        options += ["--tmpfs", tmpfs]
    return options


def quantity_to_podman(quantity: str) -> str:
    """A Kubernetes memory quantity as podman's size syntax (64Mi -> 64m)."""
    for suffix, unit in (("Ki", "k"), ("Mi", "m"), ("Gi", "g")):
        if quantity.endswith(suffix):
            return quantity[: -len(suffix)] + unit
    raise AssertionError(f"sizeLimit {quantity!r} not translated for podman")


def in_ci() -> bool:
    return os.environ.get(REQUIRE_ENV) == "1"
