"""`make bench`, section probe: `kata-sizing probe` as a user runs it (docs/probe.md).

- A two-class plan (the VM tests' classes s and m, two VMs each) booted on this host's QEMU with
  the suite's guest kernel as the probe boots Kata's VM (the stand-in Kata initrd with its agent, the
  kernel's modules, virtiofsd beside QEMU: what `make node` builds; TCG where KVM does not run guests):
  its wall time against the estimate the plan printed.
- The probe's own peak resident memory (getrusage of its process alone) while a guest writes 200
  MiB on its console, against a quiet guest's: the guest is tests/support/fake_vmm.py, a stand-in for QEMU
  that writes what a flooding guest would, so the figure is the probe's and not QEMU's.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from bench.run import ROOT, Report, verdict
from tests.support import kata_vm

RSS_TARGET_MIB = 100
FLOOD_MIB = 200
# The guest budget's base is what Kata's VM needs on this kernel (docs/probe.md, figures: its hotplug region's
# bounce buffer and the agent): with the shipped 96Mi the smallest pod's VM cannot hold the agent.
POLICY = {"apiVersion": "katasizing.dev/v1alpha1", "kind": "KataSizingPolicy", "metadata": {"name": "bench"},
          "spec": {"shim": "qemu-runtime-rs", "overhead": {"guestMemoryBase": "192Mi"},
                   "classes": [{"name": "s", "cpu": "400m", "memory": "64Mi"},
                               {"name": "m", "cpu": "400m", "memory": "192Mi"}]}}
# The probe in a process of its own that writes its own peak RSS (KiB) where it is told, on exit.
MEASURED = ("import resource, sys; from kata_sizing.cli import main; code = main(sys.argv[2:]); "
            "open(sys.argv[1], 'w').write(str(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)); sys.exit(code)")


def _peak_rss_mib(work: Path, mode: str, flood_mib: int) -> tuple[float, int]:
    vmm = work / "qemu-fake"
    vmm.write_text(f"#!{sys.executable}\n" + (ROOT / "tests" / "fake_vmm.py").read_text())
    vmm.chmod(0o755)
    (work / "init").write_bytes(b"\x7fELF" + b"\0" * 60)
    (work / "shm").mkdir(exist_ok=True)
    out = work / f"rss-{mode}"
    done = subprocess.run(
        [sys.executable, "-c", MEASURED, str(out), "probe", str(work / "policy.yaml"), "--vmm", str(vmm), "--kernel",
         str(vmm), "--init", str(work / "init"), "--accel", "tcg", "--points", "1", "--classes", "s",
         "--memory-dir", str(work / "shm")],
        capture_output=True, text=True, cwd=ROOT, env={"FAKE_VMM": mode, "FAKE_VMM_FLOOD_MIB": str(flood_mib),
                                                         "PATH": "/usr/bin:/bin"})
    return int(out.read_text()) / 1024, done.returncode


def bench_probe(report: Report, quick: bool = False) -> None:
    with tempfile.TemporaryDirectory(prefix="kata-sizing-bench-probe-") as scratch:
        work = Path(scratch)
        (work / "policy.yaml").write_text(yaml.safe_dump(POLICY))
        flood_mib = 64 if quick else FLOOD_MIB
        quiet_mib, quiet_code = _peak_rss_mib(work, "ok", 0)
        report("probe's peak RSS, a quiet guest (stand-in VMM)", f"{quiet_mib:.0f} MiB", "", f"exit {quiet_code}")
        flood_rss, flood_code = _peak_rss_mib(work, "console-flood", flood_mib)
        report(f"probe's peak RSS, a guest writing {flood_mib} MiB on its console (stand-in VMM)",
               f"{flood_rss:.0f} MiB", f"<= {RSS_TARGET_MIB} MiB",
               verdict(flood_rss <= RSS_TARGET_MIB and flood_code == 0))

        missing = kata_vm.missing()
        if missing:
            report(f"two-class plan on QEMU: skipped, missing {', '.join(map(str, missing))} (`make node`)", "", "", "")
            return
        config = kata_vm.kata_configuration(work / "configuration-qemu-runtime-rs.toml")
        argv = [str(Path(sys.executable).parent / "kata-sizing"), "probe", str(work / "policy.yaml"), "--config",
                str(config), "--init", str(kata_vm.INIT), "--guest-modules", str(kata_vm.MODULES), "--accel", "tcg",
                "--points", "1" if quick else "2"]
        start = time.perf_counter()
        done = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT)
        took = time.perf_counter() - start
        rows = sum(1 for line in done.stdout.splitlines() if line and not line.startswith(("#", "node,")))
        estimate = re.search(r"about (\d+) (s|min) under", done.stderr)
        said = f"{estimate.group(1)} {estimate.group(2)}" if estimate else "none"
        report(f"two-class plan, {rows} of Kata's VM(s) booted under TCG (the plan said about {said}), wall time",
               f"{took:.1f} s", "", f"exit {done.returncode}")
