"""`make bench` section "image": start-up of the operator's image (`make image`), and what the
bytecode in it is worth.

The container runs with a read-only root and PYTHONDONTWRITEBYTECODE=1, so a module whose .pyc
is not in the image is compiled from source at every start. The Dockerfile compiles the venv
and the standard library (the published python:slim base ships its standard library without
bytecode). Three cases are timed inside one container as the chart runs it, each command
started afresh `runs` times:

- as built: every .pyc in the image;
- without stdlib bytecode: what the published base gives without the Dockerfile's compileall
  (PYTHONPYCACHEPREFIX points at a directory holding only the venv's .pyc, so the standard
  library's, beside its sources, are not found);
- without any bytecode: PYTHONPYCACHEPREFIX at an empty directory.

Plus `podman run --rm IMAGE --version` end to end (container creation included), and the
archive's size. Skips with one line when the image is not built.
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from pathlib import Path

from bench.run import Report
from tests.support import image as img

# Run inside the container by its own python3: time each command started afresh.
DRIVER = r"""
import json, os, shutil, subprocess, sys, time
runs, commands = int(sys.argv[1]), json.loads(sys.argv[2])
base = dict(os.environ)
venv_only = "/tmp/pyc-venv-only"
# Fill a cache prefix with the .pyc of every module the commands import, then drop the
# standard library's part: the venv's bytecode without the stdlib's.
warm = dict(base, PYTHONPYCACHEPREFIX=venv_only)
warm.pop("PYTHONDONTWRITEBYTECODE", None)
for argv in commands.values():
    subprocess.run(argv, env=warm, stdout=subprocess.DEVNULL, check=True)
shutil.rmtree(os.path.join(venv_only, "usr"), ignore_errors=True)
os.makedirs("/tmp/pyc-none", exist_ok=True)
cases = {
    "as built": base,
    "without stdlib bytecode": dict(base, PYTHONPYCACHEPREFIX=venv_only),
    "without any bytecode": dict(base, PYTHONPYCACHEPREFIX="/tmp/pyc-none"),
}
result = {}
for case, env in cases.items():
    for name, argv in commands.items():
        subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, check=True)  # page cache warm
        timings = []
        for _ in range(runs):
            start = time.perf_counter()
            subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, check=True)
            timings.append((time.perf_counter() - start) * 1000)
        result[f"{case}|{name}"] = timings
print(json.dumps(result))
"""

COMMANDS = {
    "kata-sizing --version": ["kata-sizing", "--version"],
    "kata-sizing render examples/qemu-runtime-rs.yaml": [
        "kata-sizing", "render", "/policies/qemu-runtime-rs.yaml"],
    # What `kata-sizing operator` imports before it talks to the API server, and a bit more.
    "import kopf, kubernetes and every kata_sizing module": [
        "/opt/kata-sizing/bin/python", "-c",
        "import importlib, pkgutil, kopf, kubernetes, kata_sizing\n"
        "for m in pkgutil.walk_packages(kata_sizing.__path__, 'kata_sizing.'):\n"
        "    if 'compiled_templates.' not in m.name: importlib.import_module(m.name)"],
}


def bench_image(report: Report, quick: bool = False) -> None:
    reason = img.unavailable_reason()
    if reason is not None:
        report(f"skipped: {reason}", "", "", "SKIP")
        return
    runs = 5 if quick else 11
    report("OCI archive size", f"{img.ARCHIVE.stat().st_size / 2**20:.0f} MiB", "", "")
    with tempfile.TemporaryDirectory(prefix="kata-sizing-image-bench-") as store:
        podman = img.Podman(Path(store))
        try:
            start = time.perf_counter()
            podman.load()
            report("podman load of the archive", f"{time.perf_counter() - start:.1f} s", "", "")
            _bench_container_start(podman, report, runs)
            _bench_bytecode(podman, report, runs)
        finally:
            podman.reset()


def _bench_container_start(podman: img.Podman, report: Report, runs: int) -> None:
    argv = ["run", "--rm", "--network", "none", *img.chart_run_options(), img.IMAGE_REF, "--version"]
    podman(*argv)
    timings = []
    for _ in range(runs):
        start = time.perf_counter()
        podman(*argv)
        timings.append((time.perf_counter() - start) * 1000)
    report(f"podman run --rm IMAGE --version, end to end, median of {runs}",
           f"{statistics.median(timings):.0f} ms", "", "")


def _bench_bytecode(podman: img.Podman, report: Report, runs: int) -> None:
    # The chart's options, with a larger /tmp for the cache prefixes the cases use.
    options = _without_tmpfs(img.chart_run_options()) + ["--tmpfs", "/tmp:size=512m"]
    result = podman("run", "--rm", "--network", "none", *options,
                    "--volume", f"{img.ROOT / 'examples'}:/policies:ro", "--entrypoint", "python3",
                    img.IMAGE_REF, "-c", DRIVER, str(runs), json.dumps(COMMANDS), timeout=900)
    timings = json.loads(result.stdout)
    for name in COMMANDS:
        built = statistics.median(timings[f"as built|{name}"])
        report(f"{name}, in the image as built, median of {runs}", f"{built:.0f} ms", "", "")
        for case in ("without stdlib bytecode", "without any bytecode"):
            median = statistics.median(timings[f"{case}|{name}"])
            report(f"  {case}", f"{median:.0f} ms", f"x{median / built:.2f}", "")


def _without_tmpfs(options: list[str]) -> list[str]:
    kept, skip = [], False
    for option in options:
        if skip:
            skip = False
        elif option == "--tmpfs":
            skip = True
        else:
            kept.append(option)
    return kept
