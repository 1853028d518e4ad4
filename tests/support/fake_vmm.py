"""A stand-in for qemu-system-x86_64 in the probe's tests (tests/unit/test_probe_vmm.py): it reads the
command line `kata-sizing probe` gives QEMU with QEMU's own option grammar (a doubled comma is a
comma in a value), places its guest memory file as QEMU's memory-backend-file does (a directory:
a file made and unlinked in it; any other path: that file, which is left behind), and writes on
the consoles what a guest would, or misbehaves as asked.

$FAKE_VMM picks the behaviour, per VM size: `ok`, or `350:sigbus,ok` (the 350 MiB VM dies of
SIGBUS, the others report). $FAKE_VMM_LOG, when set, gets one line per start: its argv as JSON.
$FAKE_VMM_PIDS, when set, gets the pid of every process it leaves running (daemon, hang).
"""

import json
import os
import signal
import sys
import time

MIB = 1024 * 1024


def qemu_options(text: str) -> dict[str, str]:
    """key=value pairs split at single commas; ",," is a comma (QEMU's QemuOpts and keyval)."""
    pairs, current, at = [], "", 0
    while at < len(text):
        if text[at] == ",":
            if text[at + 1:at + 2] == ",":
                current += ","
                at += 2
                continue
            pairs.append(current)
            current = ""
        else:
            current += text[at]
        at += 1
    pairs.append(current)
    found = {}
    for pair in pairs:
        key, _, value = pair.partition("=")
        found[key] = value
    return found


def values(argv: list[str], flag: str) -> list[str]:
    return [argv[i + 1] for i, word in enumerate(argv[:-1]) if word == flag]


def main() -> None:
    argv = sys.argv[1:]
    if os.environ.get("FAKE_VMM_LOG"):
        with open(os.environ["FAKE_VMM_LOG"], "a") as log:
            log.write(json.dumps(argv) + "\n")
    vm_mib = int(values(argv, "-m")[0].split(",")[0].removesuffix("M"))
    memory = next(o for o in map(qemu_options, values(argv, "-object")) if o.get("id") == "mem")
    consoles = [qemu_options(v)["path"] for v in values(argv, "-chardev") if v.startswith("file,")]
    mode = "ok"
    for choice in os.environ.get("FAKE_VMM", "ok").split(","):
        size, _, what = choice.rpartition(":")
        if not size or int(size) == vm_mib:
            mode = what
            if size:
                break

    # The guest memory file, as QEMU's memory-backend-file places it.
    path = memory["mem-path"]
    if os.path.isdir(path):
        fd = os.open(path, os.O_TMPFILE | os.O_RDWR)
    else:
        fd = os.open(path, os.O_CREAT | os.O_RDWR)
    os.ftruncate(fd, int(memory["size"].removesuffix("M")) * MIB)
    if memory.get("share") != "on":
        sys.stderr.write("fake VMM: share is not on\n")
        sys.exit(1)

    def say(*lines: str) -> None:
        for console in consoles:
            with open(console, "a") as handle:
                handle.write("".join(line + "\n" for line in lines))

    def remember(pid: int) -> None:
        if os.environ.get("FAKE_VMM_PIDS"):
            with open(os.environ["FAKE_VMM_PIDS"], "a") as handle:
                handle.write(f"{pid}\n")

    total_kib = (vm_mib - 40) * 1024
    meminfo = f"KSP meminfo stage=boot MemTotal={total_kib} MemFree={total_kib - 20000} Buffers=0 Cached=2000 SReclaimable=3000"
    done = f"KSP done held={vm_mib - 70} outcome=killed"
    if mode == "silent":
        remember(os.getpid())
        time.sleep(600)
    say("SeaBIOS (version fake)", "KSP hello version=1")
    if mode == "ok":
        say(meminfo, "KSP workload target=0 step=4", done, "KSP bye")
    elif mode == "stderr-flood":
        # 1 MiB on stderr before the report: a reader that waits for the exit deadlocks at 64 KiB.
        for _ in range(1024):
            sys.stderr.write("x" * 1023 + "\n")
        sys.stderr.flush()
        say(meminfo, done)
    elif mode == "console-flood":
        # Kernel noise on the consoles (FAKE_VMM_FLOOD_MIB, default 64), the report after it.
        noise = ("[    1.000000] a kernel message of the usual length, printed again and again\n" * 16384).encode()
        target = int(os.environ.get("FAKE_VMM_FLOOD_MIB", "64")) * MIB
        with open(consoles[0], "ab") as handle:
            written = 0
            while written < target:
                handle.write(noise)
                written += len(noise)
            handle.write(b"x" * (5 * MIB) + b" then a report: KSP error this line is cut long before here\n")
        say(meminfo, done)
    elif mode == "daemon":
        say(meminfo, done)
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                os.closerange(3, 1024)
                remember(os.getpid())
                time.sleep(600)
            os._exit(0)
    elif mode == "hang":
        remember(os.getpid())
        time.sleep(600)
    elif mode == "sigbus":
        say(meminfo)
        os.kill(os.getpid(), signal.SIGBUS)
    elif mode == "exit1":
        sys.stderr.write("fake VMM: could not load kernel\n" + "the rest " * 100000 + "\n")
        sys.exit(1)
    elif mode.startswith("forged-"):
        forged = {
            "forged-total": f"KSP meminfo stage=boot MemTotal={vm_mib * 1024 + 4} MemFree=1000",
            "forged-digit": "KSP meminfo stage=boot MemTotal=1\u00b2345 MemFree=1000",
            "forged-negative": f"KSP meminfo stage=boot MemTotal={total_kib} MemFree=-5",
            "forged-absurd": f"KSP meminfo stage=boot MemTotal={total_kib} MemFree={10**30}",
            "forged-held": meminfo,
            "forged-error": "KSP error " + "\u202e" + "y" * 100000,
        }[mode]
        say(forged, f"KSP done held={vm_mib * 4 if mode == 'forged-held' else 10} outcome=killed")
    else:
        sys.stderr.write(f"fake VMM: unknown mode {mode}\n")
        sys.exit(2)
    sys.exit(0)


if __name__ == "__main__":
    main()
