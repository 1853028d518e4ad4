"""`make bench`: kata-sizing's performance figures against their targets.

Each section is a function `(report, quick) -> None` that calls
`report(what, figure, target, verdict)` once per line; nothing here asserts, a miss is
printed as MISS. Sections live in SECTIONS (add yours there); pick some with
`bench/run.py --only core,guidance`, shorten the slow ones with `--quick`.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import math
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

Report = Callable[[str, str, str, str], None]

RENDER_TARGET_MS = 5.0
COLD_START_TARGET_MS = 400.0


def percentile(values: list[float], fraction: float) -> float:
    """Nearest-rank percentile (p95 of 200 runs is the 190th fastest)."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(fraction * len(ordered)) - 1)]


def cpu_seconds(pid: int) -> float:
    """The CPU a process's threads have spent so far, in seconds: the sum of their
    /proc/PID/task/*/schedstat (nanoseconds; /proc/PID/stat counts 10 ms ticks, too coarse for
    one pass), or utime + stime of /proc/PID/stat where schedstat is missing."""
    import os

    try:
        return sum(int((task / "schedstat").read_text().split()[0])
                   for task in Path(f"/proc/{pid}/task").iterdir()) / 1e9
    except (OSError, ValueError, IndexError):
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


def _timed_ms(action: Callable[[], object], runs: int) -> list[float]:
    action()  # warm caches (templates, pydantic validators) as a long-running process has them
    timings = []
    for _ in range(runs):
        start = time.perf_counter()
        action()
        timings.append((time.perf_counter() - start) * 1000)
    return timings


def bench_core(report: Report, quick: bool = False) -> None:
    """In-process render per policy, and the CLI's cold start."""
    import yaml

    from kata_sizing.core.guidance import NodeFacts
    from kata_sizing.core.model import parse_policy
    from kata_sizing.core.render import render_policy

    runs = 50 if quick else 200
    policies = {
        f"examples/{path.name}": parse_policy(yaml.safe_load(path.read_text()))
        for path in sorted((ROOT / "examples").glob("*.yaml"))
    }
    policies["default s/m/l/xl (qemu-runtime-rs)"] = parse_policy(
        {"metadata": {"name": "bench"}, "spec": {"shim": "qemu-runtime-rs"}})
    for name, policy in policies.items():
        timings = _timed_ms(functools.partial(render_policy, policy), runs)
        median, p95 = statistics.median(timings), percentile(timings, 0.95)
        report(f"render {name} ({len(policy.spec.effective_classes)} classes), median",
               f"{median:.2f} ms", f"< {RENDER_TARGET_MS:g} ms", verdict(median < RENDER_TARGET_MS))
        report(f"render {name}, p95 of {runs}",
               f"{p95:.2f} ms", f"< {RENDER_TARGET_MS:g} ms", verdict(p95 < RENDER_TARGET_MS))

    node = NodeFacts(name="node", capacity_memory_bytes=256 * 2**30)
    default = policies["default s/m/l/xl (qemu-runtime-rs)"]
    timings = _timed_ms(lambda: render_policy(default, nodes=[node]), runs)
    report("render default policy + guidance for one 256Gi node, median",
           f"{statistics.median(timings):.2f} ms", "", "")

    cold_start(report, quick)


def baseline_checkout(revision: str, work: Path) -> Path:
    """That revision's operator/ and templates/ under `work` (git archive); returns the folder to
    put on PYTHONPATH so its kata_sizing is imported ahead of the editable install."""
    target = work / "baseline"
    target.mkdir(exist_ok=True)
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", revision, "operator", "templates"],
                             capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(target)], input=archive, check=True)
    return target / "operator"


def cold_start(report: Report, quick: bool = False) -> None:
    """`kata-sizing render` from a fresh interpreter. With BENCH_BASELINE=<git revision>, that
    revision's render runs in the same loop, turn about with this checkout's, so both see the
    same machine load."""
    import compileall
    import os
    import tempfile

    script = Path(sys.executable).parent / "kata-sizing"
    argv = [str(script), "render", str(ROOT / "examples" / "qemu-runtime-rs.yaml")]
    samples = 5 if quick else 10
    revision = os.environ.get("BENCH_BASELINE")
    with tempfile.TemporaryDirectory() as work:
        runs: dict[str, dict | None] = {"this checkout": None}
        if revision:
            source = baseline_checkout(revision, Path(work))
            compileall.compile_dir(source, quiet=1)  # byte-compiled like this checkout (compile_bytecode)
            runs[f"baseline {revision}"] = {**os.environ, "PYTHONPATH": str(source)}
        for env in runs.values():
            subprocess.run(argv, stdout=subprocess.DEVNULL, check=True, env=env)  # warm the page cache
        cold: dict[str, list[float]] = {name: [] for name in runs}
        for _ in range(samples):
            for name, env in runs.items():
                start = time.perf_counter()
                subprocess.run(argv, stdout=subprocess.DEVNULL, check=True, env=env)
                cold[name].append((time.perf_counter() - start) * 1000)
    for name, timings in cold.items():
        median = statistics.median(timings)
        report(f"kata-sizing render examples/qemu-runtime-rs.yaml, cold start, median of {samples} ({name})",
               f"{median:.0f} ms", f"< {COLD_START_TARGET_MS:g} ms", verdict(median < COLD_START_TARGET_MS))


def compile_bytecode() -> None:
    """Byte-compile kata_sizing as `pip install` does for an installed package (the image's
    too). `make`'s editable install compiles nothing, and where PYTHONDONTWRITEBYTECODE=1 is
    set Python then compiles the package's source on every start, which no installed
    kata-sizing does (about 30 ms of a cold `kata-sizing render`)."""
    import compileall

    import kata_sizing

    compileall.compile_dir(Path(kata_sizing.__file__).parent, quiet=1)


def _external(module: str, function: str) -> Callable[[Report, bool], None]:
    """A section from another bench module, imported only when it runs."""

    def section(report: Report, quick: bool = False) -> None:
        getattr(importlib.import_module(module), function)(report, quick=quick)

    return section


SECTIONS: dict[str, Callable[[Report, bool], None]] = {
    "core": bench_core,
    # The cold start alone (the end of "core" too, so only with --only coldstart).
    "coldstart": cold_start,
    "guidance": _external("bench.guidance_bench", "bench_guidance"),
    "operator": _external("bench.operator_bench", "bench_operator"),
    "fleet": _external("bench.fleet_bench", "bench_fleet"),
    # kata-sizing render against helm template of the kata-deploy chart (KATA_DEPLOY_CHART).
    "helm": _external("bench.helm_bench", "bench_helm"),
    "realserver": _external("bench.realserver_bench", "bench_realserver"),
    # The operator as a ratio to a plain client writing the same objects to the same server.
    "limit": _external("bench.limit_bench", "bench_limit"),
    # The operator's image (`make image`): start-up in it, with and without bytecode.
    "image": _external("bench.image_bench", "bench_image"),
    "measurement": _external("bench.measurement_bench", "bench_measurement"),
    # `survey` of a saved 20,000-pod list, read a pod at a time.
    "survey": _external("bench.survey_bench", "bench_survey"),
    # The operator as a Pod on the real node (tests/support/realnode.py): install, memory, handover, the
    # routing webhook during a rollout.
    "node": _external("bench.node_bench", "bench_node"),
    # `probe`: a two-class plan booted under TCG, and the probe's memory while a guest floods its console.
    "probe": _external("bench.probe_bench", "bench_probe"),
    # What kata-sizing's admission costs every pod: none, the CEL, the webhook, side by side.
    "admission": _external("bench.admission_bench", "bench_admission"),
}


ONLY_WHEN_ASKED = {"coldstart"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", metavar="SECTION[,SECTION]",
                        help=f"run only these sections (of: {', '.join(SECTIONS)})")
    parser.add_argument("--quick", action="store_true", help="fewer runs; skip the slowest parts")
    args = parser.parse_args(argv)
    chosen = [name for name in SECTIONS if name not in ONLY_WHEN_ASKED]
    if args.only:
        chosen = [name.strip() for name in args.only.split(",") if name.strip()]
        unknown = [name for name in chosen if name not in SECTIONS]
        if unknown:
            parser.error(f"unknown section(s) {', '.join(unknown)}; known: {', '.join(SECTIONS)}")

    def report(what: str, figure: str, target: str, result: str) -> None:
        print(f"  {what:<78} {figure:>12} {target:>10} {result}", flush=True)

    compile_bytecode()
    for name in chosen:
        print(f"[{name}]", flush=True)
        try:
            SECTIONS[name](report, args.quick)
        except Exception as exc:  # one broken section must not hide the others' figures
            report(f"section {name} did not finish: {type(exc).__name__}: {exc}", "", "", "ERROR")
    return 0


if __name__ == "__main__":
    sys.exit(main())
