"""The operator's image, built by `make image`, run as the chart runs it: UID 65532, a read-only
root file system, every capability dropped, no new privileges, /tmp the only writable mount.

What a user of the image sees: `kata-sizing --version` says the image's version, `render` of an
example prints the golden output, the operator started against the real control plane becomes
live and ready, writes a policy's RuntimeClasses and stops cleanly on SIGTERM; nothing in the
image can install a package, and no module is compiled at start-up.
"""

from __future__ import annotations

import base64
import json
import re
import signal
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import IO

import pytest
import yaml

from tests.support import image as img
from tests.support.operator_helpers import wait_for
from tests.support.paths import GOLDEN, ROOT
from tests.support.realcluster import (
    RUNTIME_CLASSES,
    ControlPlane,
    delete_policies,
    free_port,
    leftovers,
)

pytestmark = pytest.mark.image

EXAMPLES = ROOT / "examples"
UID = 65532


@pytest.fixture(scope="module")
def podman(tmp_path_factory: pytest.TempPathFactory) -> Iterator[img.Podman]:
    """The archive `make image` wrote, loaded into a podman store of this module's own."""
    reason = img.unavailable_reason()
    if reason is not None:
        if img.in_ci():
            pytest.fail(f"{img.REQUIRE_ENV}=1 but {reason}")
        pytest.skip(reason)
    podman = img.Podman(tmp_path_factory.mktemp("podman"))
    try:
        podman.load()
        yield podman
    finally:
        podman.reset()


def run(podman: img.Podman, *args: str, options: tuple[str, ...] = (), entrypoint: str | None = None,
        check: bool = True) -> subprocess.CompletedProcess:
    """The image run once as the chart runs it, without network unless options give one."""
    argv = ["run", "--rm", "--network", "none", *img.chart_run_options(), *options]
    if entrypoint is not None:
        argv += ["--entrypoint", entrypoint]
    return podman(*argv, img.IMAGE_REF, *args, check=check)


def test_the_chart_run_options_are_those_of_the_deployment() -> None:
    """The translation itself: what the tests below run under."""
    options = img.chart_run_options()
    assert options[options.index("--user") + 1] == f"{UID}:{UID}"
    assert "--read-only" in options and "--read-only-tmpfs=false" in options
    assert options[options.index("--cap-drop") + 1] == "ALL"
    assert options[options.index("--security-opt") + 1] == "no-new-privileges"
    assert [options[i + 1] for i, o in enumerate(options) if o == "--tmpfs"] == ["/tmp:size=64m"]


def test_image_config_names_a_numeric_non_root_user_and_the_project_version(podman: img.Podman) -> None:
    config = json.loads(podman("image", "inspect", img.IMAGE_REF).stdout)[0]["Config"]
    # runAsNonRoot: the kubelet can verify only a numeric user.
    assert config["User"] == f"{UID}:{UID}"
    assert config["Entrypoint"] == ["kata-sizing"]
    assert config["Cmd"] == ["operator", "--standalone"]
    assert config["Labels"]["org.opencontainers.image.version"] == img.project_version()
    # The base it was built on: `make image`'s runtime base, not the published one.
    assert config["Labels"]["org.opencontainers.image.base.name"].startswith("localhost/kata-sizing-base-runtime:")


PROBE = r"""
import errno, json, os
status = dict(line.split(":\t", 1) for line in open("/proc/self/status").read().splitlines())
writes = {}
for directory in ("/", "/opt/kata-sizing", "/opt/kata-sizing/lib", "/usr/lib", "/etc", "/var/tmp", "/tmp"):
    try:
        with open(os.path.join(directory, "probe"), "w"):
            pass
        writes[directory] = "written"
    except OSError as error:
        writes[directory] = errno.errorcode[error.errno]
mounts = []
for line in open("/proc/self/mountinfo"):
    fields = line.split()
    if "rw" in fields[5].split(","):
        mounts.append(fields[4])
print(json.dumps({"uid": os.getuid(), "gid": os.getgid(), "groups": os.getgroups(),
                  "CapEff": status["CapEff"].strip(), "CapPrm": status["CapPrm"].strip(),
                  "NoNewPrivs": status["NoNewPrivs"].strip(), "Seccomp": status["Seccomp"].strip(),
                  "writes": writes, "rw_mounts": mounts}))
"""


def test_runs_as_the_chart_runs_it(podman: img.Podman) -> None:
    facts = json.loads(run(podman, "-c", PROBE, entrypoint="python3").stdout)
    assert (facts["uid"], facts["gid"]) == (UID, UID)
    assert facts["CapEff"] == facts["CapPrm"] == "0000000000000000"
    assert facts["NoNewPrivs"] == "1"
    assert facts["Seccomp"] == "2"  # a filter: the runtime's default profile
    # Nothing of the image's own tree can be written, not even by its owner; /tmp can.
    assert facts["writes"] == {"/": "EROFS", "/opt/kata-sizing": "EROFS", "/opt/kata-sizing/lib": "EROFS",
                               "/usr/lib": "EROFS", "/etc": "EROFS", "/var/tmp": "EROFS", "/tmp": "written"}
    # Writable mounts: /tmp, and what every runtime adds (the kubelet too: /etc/hosts,
    # /dev/shm, /dev/termination-log); none of them inside the image's own tree.
    runtime_files = {"/etc/hosts", "/etc/hostname", "/etc/resolv.conf", "/run/.containerenv"}
    others = [m for m in facts["rw_mounts"]
              if m != "/tmp" and m not in runtime_files and not m.startswith(("/dev", "/proc", "/sys"))]
    assert "/tmp" in facts["rw_mounts"] and not others, facts["rw_mounts"]


def test_version_prints_the_image_label(podman: img.Podman) -> None:
    config = json.loads(podman("image", "inspect", img.IMAGE_REF).stdout)[0]["Config"]
    label = config["Labels"]["org.opencontainers.image.version"]
    result = run(podman, "--version")
    assert result.returncode == 0
    assert result.stdout == f"kata-sizing {label}\n"


@pytest.mark.parametrize("example", sorted(p.name for p in EXAMPLES.glob("*.yaml")))
def test_render_in_the_image_prints_the_golden_output(podman: img.Podman, example: str) -> None:
    result = run(podman, "render", f"/policies/{example}", "--node-capacity", "256Gi", "--node-cpu", "64",
                 options=("--volume", f"{EXAMPLES}:/policies:ro"))
    assert result.returncode == 0, result.stderr
    assert result.stdout == (GOLDEN / example).read_text()


def test_bad_input_in_the_image_is_one_line_not_a_traceback(podman: img.Podman) -> None:
    result = run(podman, "render", "/policies/missing.yaml", options=("--volume", f"{EXAMPLES}:/policies:ro"),
                 check=False)
    assert result.returncode != 0
    assert "Traceback" not in result.stderr
    assert "/policies/missing.yaml" in result.stderr


def test_the_image_carries_the_probes_init_and_probe_finds_it(podman: img.Podman) -> None:
    """The probe Job (examples/probe/job.yaml) runs this image: its init is where `probe` looks, and
    the first thing it misses on a machine without Kata is the node's configuration."""
    result = run(podman, "probe", "/policies/qemu-runtime-rs.yaml", "--vmm", "/bin/sh", "--kernel", "/bin/sh",
                 "--memory-dir", "/guest-memory", "--accel", "tcg", "--timeout", "5", "--classes", "s", "--points", "1",
                 options=("--volume", f"{EXAMPLES}:/policies:ro", "--tmpfs", "/guest-memory:size=2g"), check=False)
    # /bin/sh is no VMM: QEMU's place is taken, and the init was found (it is checked first); the VM
    # fails, said in the CSV, and the probe says some failed.
    assert result.returncode == 3 and "Traceback" not in result.stderr, result.stderr
    assert "no probe init found" not in result.stderr
    assert ("# class s: the VM of 1332 MiB (2 vCPU) failed: the VMM exited with 127: -machine: 1: tcg,tb-size=64: "
            "not found") in result.stdout, result.stdout


PIP_NAMES = ("pip", "pip3", "pip3.11", "ensurepip", "python-wheels", "setuptools", "easy_install")


def is_package_installer(path: str) -> bool:
    parts = path.strip("/").split("/")
    return any(part in PIP_NAMES or part.startswith(("pip-", "setuptools-")) or
               (part.endswith(".whl") and part.startswith(("pip", "setuptools"))) for part in parts)


def test_no_package_installer_in_the_image(podman: img.Podman, tmp_path: Path) -> None:
    """The README's "nothing can be installed at run time": no pip, no pip wheel (ensurepip's
    bundled one or Debian's python3-venv's), no setuptools, in the file system the container
    sees nor in any layer of the archive."""
    container = podman("create", img.IMAGE_REF).stdout.strip()
    exported = tmp_path / "rootfs.tar"  # about 300 MB: removed once listed
    try:
        podman("export", "--output", str(exported), container)
        listing = subprocess.run(["tar", "-tf", str(exported)], capture_output=True, text=True, check=True)
    finally:
        podman("rm", container)
        exported.unlink(missing_ok=True)
    files = listing.stdout.splitlines()
    assert any(f.endswith("kata_sizing/__main__.py") for f in files)
    assert [f for f in files if is_package_installer(f)] == []

    layers = layer_listings(img.ARCHIVE, tmp_path)
    assert layers and all(layers.values())
    assert {digest: found for digest, listing in layers.items()
            if (found := [f for f in listing if is_package_installer(f)])} == {}

    for module in ("pip", "ensurepip"):
        result = run(podman, "-m", module, "--version", entrypoint="python3", check=False)
        assert result.returncode == 1 and f"No module named {module}" in result.stderr


def layer_listings(archive: Path, workdir: Path) -> dict[str, list[str]]:
    """File names of every layer in an OCI archive, by layer digest."""
    import tarfile

    with tarfile.open(archive) as oci:
        def member(name: str) -> IO[bytes]:
            found = oci.extractfile(name)
            assert found is not None, f"{archive} has no file {name}"
            return found

        index = json.load(member("index.json"))
        (manifest_descriptor,) = index["manifests"]
        manifest = json.load(member("blobs/" + manifest_descriptor["digest"].replace(":", "/")))
        listings = {}
        for layer in manifest["layers"]:
            blob = member("blobs/" + layer["digest"].replace(":", "/"))
            with tarfile.open(fileobj=blob, mode="r|*") as layer_tar:
                listings[layer["digest"]] = [member.name for member in layer_tar]
    return listings


BYTECODE_PROBE = r"""
import importlib, importlib.util, json, os, pkgutil, sys
import kopf, kubernetes, aiohttp, kata_sizing
for module in pkgutil.walk_packages(kata_sizing.__path__, "kata_sizing."):
    # The compiled templates are not imported: render runs their code objects (from the .pyc).
    if "compiled_templates." not in module.name:
        importlib.import_module(module.name)
from kata_sizing import cli
cli.main(["render", "/policies/qemu-runtime-rs.yaml"])  # and whatever a render imports

def stale(source):
    # What the import system checks before it uses a .pyc (importlib._bootstrap_external).
    try:
        with open(importlib.util.cache_from_source(source), "rb") as f:
            header = f.read(16)
    except OSError:
        return "no .pyc"
    if header[:4] != importlib.util.MAGIC_NUMBER:
        return "another Python's .pyc"
    if int.from_bytes(header[4:8], "little") == 0:
        st = os.stat(source)
        if (int.from_bytes(header[8:12], "little") != int(st.st_mtime) & 0xFFFFFFFF
                or int.from_bytes(header[12:16], "little") != st.st_size & 0xFFFFFFFF):
            return "stale .pyc"
    return None

modules = {m.__file__ for m in list(sys.modules.values())
           if (getattr(m, "__file__", None) or "").endswith(".py")}
package = os.path.dirname(kata_sizing.__file__)
modules |= {os.path.join(d, f) for d, _, files in os.walk(package) for f in files if f.endswith(".py")}
print(json.dumps({"modules": len(modules),
                  "not_usable": {f: why for f in sorted(modules) if (why := stale(f))}}), file=sys.stderr)
"""


def test_every_module_the_operator_imports_has_usable_bytecode_in_the_image(podman: img.Podman) -> None:
    """With a read-only root and PYTHONDONTWRITEBYTECODE, a module without a current .pyc in
    the image is compiled from source at every start (docs/image.md has the figures)."""
    result = run(podman, "-c", BYTECODE_PROBE, entrypoint="/opt/kata-sizing/bin/python",
                 options=("--volume", f"{EXAMPLES}:/policies:ro"))
    facts = json.loads(result.stderr.strip().splitlines()[-1])
    assert facts["modules"] > 500
    assert facts["not_usable"] == {}


# --- the operator's start-up against the real control plane --------------------------------


def container_kubeconfig(cp: ControlPlane, path: Path) -> Path:
    """The operator ServiceAccount's kubeconfig with the CA inline: one file to mount."""
    config = yaml.safe_load(cp.operator_kubeconfig.read_text())
    cluster = config["clusters"][0]["cluster"]
    ca = Path(cluster.pop("certificate-authority")).read_bytes()
    cluster["certificate-authority-data"] = base64.b64encode(ca).decode()
    path.write_text(yaml.safe_dump(config))
    path.chmod(0o644)  # read by UID 65532 through the read-only mount
    return path


def http_status(url: str) -> int | None:
    try:
        with urllib.request.urlopen(url, timeout=1) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code
    except OSError:
        return None


def golden_runtime_classes(example: str) -> dict[str, dict]:
    documents = yaml.safe_load_all((GOLDEN / example).read_text())
    return {d["metadata"]["name"]: d for d in documents if d and d.get("kind") == "RuntimeClass"}


def died_at(podman: img.Podman, name: str) -> datetime:
    """When podman recorded the container `name` dying (its events log, `events_logger = "file"`)."""
    died = [json.loads(line)["Time"] for line in (podman.store / "events.log").read_text().splitlines()
            if '"Status":"died"' in line and f'"Name":"{name}"' in line]
    assert died, f"podman recorded no death of {name}"
    # RFC 3339 with nanoseconds: datetime takes microseconds.
    stamp = re.sub(r"(\.\d{6})\d*", r"\1", died[-1]).replace("Z", "+00:00")
    return datetime.fromisoformat(stamp)


@pytest.mark.realserver
def test_operator_in_the_image_runs_against_the_real_control_plane(
        podman: img.Podman, control_plane: ControlPlane, tmp_path: Path) -> None:
    kubeconfig = container_kubeconfig(control_plane, tmp_path / "kubeconfig")
    health_port, metrics_port = free_port(), free_port()
    log_path = tmp_path / "operator.log"
    name = f"kata-sizing-operator-{health_port}"
    argv = podman.command(
        "run", "--rm", "--name", name, "--network", "host", *img.chart_run_options(),
        "--volume", f"{kubeconfig}:/etc/kata-sizing/kubeconfig:ro",
        "--env", "KUBECONFIG=/etc/kata-sizing/kubeconfig",
        img.IMAGE_REF, "operator", "--standalone",
        "--liveness", f"http://127.0.0.1:{health_port}/healthz", "--metrics-port", str(metrics_port))
    audit_start = control_plane.audit_offset()
    expected = golden_runtime_classes("qemu-runtime-rs.yaml")
    with log_path.open("wb") as log:
        process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        def live() -> bool:
            assert process.poll() is None, f"the operator exited ({process.returncode}):\n{log_path.read_text()}"
            return http_status(f"http://127.0.0.1:{health_port}/healthz") == 200
        wait_for(live, 60, "the operator in the image answers /healthz with 200", interval=0.2)
        wait_for(lambda: http_status(f"http://127.0.0.1:{metrics_port}/readyz") == 200, 60,
                 "the operator in the image answers /readyz with 200", interval=0.2)

        control_plane.kubectl("apply", "-f", str(EXAMPLES / "qemu-runtime-rs.yaml"))
        wait_for(lambda: set(control_plane.items(RUNTIME_CLASSES, "katasizing.dev/policy=qemu-rs")) == set(expected),
                 30, f"RuntimeClasses {sorted(expected)} written")
        live_classes = control_plane.items(RUNTIME_CLASSES, "katasizing.dev/policy=qemu-rs")
        for class_name, golden in expected.items():
            assert live_classes[class_name]["handler"] == golden["handler"]
            assert live_classes[class_name]["overhead"] == golden["overhead"]
        # The pass's log line comes once its last write is done.
        wait_for(lambda: "reconciled qemu-rs" in log_path.read_text(), 30, "the operator logged its pass")

        # Deleting the policy: the garbage collector removes what the operator in the image made
        # (it may still be starting to follow the CRD on a young control plane).
        control_plane.kubectl("delete", "-f", str(EXAMPLES / "qemu-runtime-rs.yaml"), "--wait=true")
        wait_for(lambda: not control_plane.items(RUNTIME_CLASSES, "katasizing.dev/policy=qemu-rs"), 90,
                 "the policy's RuntimeClasses removed")

        # SIGTERM reaches the operator (PID 1 in the container) as the kubelet sends it. How long it
        # took is read from podman's own record of the container's death: `podman run` itself may
        # return up to 20 s later (podman 4.3 waits that long, at times, for its container monitor
        # to exit after the container did).
        stop_started = datetime.now(UTC)
        process.send_signal(signal.SIGTERM)
        returncode = process.wait(60)
        stop_seconds = (died_at(podman, name) - stop_started).total_seconds()
    finally:
        if process.poll() is None:
            podman("kill", name, check=False)
            process.wait(30)
        delete_policies(control_plane, operator_running=False)
        leftovers(control_plane)
    log_text = log_path.read_text()
    assert returncode == 0, f"exit code {returncode} after SIGTERM:\n{log_text[-3000:]}"
    assert stop_seconds < 20, f"the operator's container died {stop_seconds:.1f} s after SIGTERM"
    assert "Traceback" not in log_text, log_text[-3000:]
    assert "SIGTERM" in log_text  # kopf says it received the signal and stopped on it
    refused = [e for e in control_plane.operator_requests(audit_start) if e.code == 403]
    assert not refused, f"the API server refused the operator in the image (403): {refused}"
