"""Where the operator's CPU goes in its passes, before and after a change (`make bench`, section
`limit`, with BENCH_LIMIT_PROFILE=DIR).

The operator process is started with DIR first on its PYTHONPATH, where `sitecustomize.py`
(written here) sets up cProfile on the process's CPU time without starting it: SIGUSR1 starts it,
SIGUSR2 stops it and writes the profile to DIR/<who>-<pid>.pstats. The limit section sends SIGUSR1 once the operator's cold start
is over and SIGUSR2 after its policies created and spec changes, so a profile holds only those
passes (their watch events, decisions, renders and requests), not the imports and the first
passes of the cold start. `shares` reads the profiles of each operator (this checkout's and,
with BENCH_LIMIT_BASELINE, the other revision's) and says what share of the profiled CPU each part
took (ROOTS). cProfile slows the process several times over, so its figures are shares, never
times: the times are the section's own, measured without it.
"""

from __future__ import annotations

import os
import pstats
import signal
import time
from pathlib import Path

ENV_WHO = "KATA_SIZING_BENCH_PROFILE_AS"

_SITECUSTOMIZE = '''\
"""Written by bench/pass_profile.py: cProfile of the operator's passes between SIGUSR1 and SIGUSR2."""
import os

_WHO = os.environ.get("{env}")
if _WHO:
    import cProfile
    import signal
    import time

    _profile = cProfile.Profile(time.process_time)  # CPU time: the waits in epoll are not the pass's

    def _start(*_):
        _profile.enable()

    def _stop(*_):
        _profile.disable()
        _profile.dump_stats(os.path.join({folder!r}, f"{{_WHO}}-{{os.getpid()}}.pstats"))

    signal.signal(signal.SIGUSR1, _start)
    signal.signal(signal.SIGUSR2, _stop)
'''

# Where the CPU goes: the share of the profiled CPU spent inside each of these functions (their
# cumulative time; the indented ones are inside the pass, so the shares overlap).
ROOTS: tuple[tuple[str, str, str], ...] = (
    ("passes (reconcile.run_pass)", "controller/reconcile", "run_pass"),
    ("  reading what a pass knows (gather)", "controller/gather", "gather"),
    ("  rendering (plan.intent_of: sizing, drop-ins, objects)", "controller/plan", "intent_of"),
    ("  deciding (plan.plan_pass: every object against its live one)", "controller/plan", "plan_pass"),
    ("  writing (execute, the requests)", "controller/execute", "_write_once"),
    ("  the status (status.conclude)", "controller/status", "conclude"),
    ("the requests (kube._send: the kubernetes client and aiohttp)", "controller/kube", "_send"),
    ("kopf's handling of the policies' watch events", "kopf/_core/reactor/queueing", "worker"),
    ("the informers' watch events", "controller/informer", "run"),
    ("the guidance check (every policy's inputs, each interval)", "controller/worker", "watch_guidance"),
    ("the measurement loop's bookkeeping", "controller/measurement", "targets"),
    ("TLS and the event loop's reads (asyncio sslproto)", "asyncio/sslproto", "buffer_updated"),
)


def environment(folder: Path, who: str, code: Path | None) -> dict[str, str]:
    """The environment that makes an operator process (of `code`, another revision's `operator/`,
    or this checkout's) ready to be profiled as `who`, the sitecustomize written into `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "sitecustomize.py").write_text(_SITECUSTOMIZE.format(env=ENV_WHO, folder=str(folder)))
    return {ENV_WHO: who, "PYTHONPATH": os.pathsep.join(str(p) for p in (folder, code) if p)}


def start(pid: int) -> None:
    os.kill(pid, signal.SIGUSR1)


def stop(pid: int, folder: Path, who: str, timeout: float = 30) -> Path:
    """Stop the profile of process `pid` and wait until it is written; its path."""
    written = folder / f"{who}-{pid}.pstats"
    os.kill(pid, signal.SIGUSR2)
    deadline = time.monotonic() + timeout
    while not written.exists():
        if time.monotonic() > deadline:
            raise RuntimeError(f"the operator (pid {pid}) wrote no profile to {written} in {timeout:g} s")
        time.sleep(0.05)
    return written


def shares(paths: list[Path]) -> tuple[float, list[tuple[str, float]], list[tuple[str, float]]]:
    """(the profiled CPU seconds, [(part, share of them)] for ROOTS, the 8 functions of most own
    time with their shares) over the profiles `paths`."""
    stats = pstats.Stats(*(str(p) for p in paths))
    entries = stats.stats  # type: ignore[attr-defined]  # {(file, line, name): (cc, nc, tt, ct, callers)}
    total = sum(tt for _, _, tt, _, _ in entries.values()) or 1.0
    parts = [(label, sum(ct for (filename, _, name), (_, _, _, ct, _) in entries.items()
                         if where in filename and name == function) / total)
             for label, where, function in ROOTS]
    top = sorted(entries.items(), key=lambda item: item[1][2], reverse=True)[:8]
    functions = [(f"{Path(filename).name}:{name}", tt / total) for (filename, _, name), (_, _, tt, _, _) in top]
    return total, parts, functions
