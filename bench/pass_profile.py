"""Where the operator's CPU goes in its passes, before and after a change (`make bench`, section
`limit`, with BENCH_LIMIT_PROFILE=DIR).

The operator process is started with DIR first on its PYTHONPATH, where `sitecustomize.py` (written
here) sets up cProfile without starting it: SIGUSR1 starts it, SIGUSR2 stops it and writes the
profile to DIR/<who>-<pid>.pstats. The limit section sends SIGUSR1 once the operator's cold start
is over and SIGUSR2 after its policies created and spec changes, so a profile holds only those
passes (their watch events, decisions, renders and requests), not the imports and the first
passes of the cold start. `summary` reads the profiles of each operator (this checkout's and,
with BENCH_LIMIT_BASELINE, the other revision's) and says what share of the profiled CPU each part
of the pass took. cProfile slows the process several times over, so its figures are shares, never
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

    _profile = cProfile.Profile()

    def _start(*_):
        _profile.enable()

    def _stop(*_):
        _profile.disable()
        _profile.dump_stats(os.path.join({folder!r}, f"{{_WHO}}-{{os.getpid()}}.pstats"))

    signal.signal(signal.SIGUSR1, _start)
    signal.signal(signal.SIGUSR2, _stop)
'''

# The parts of a pass, by the file a function is defined in: the first that matches names it.
PARTS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("render and the sizing core (classes, drop-ins, RuntimeClasses, admission objects)",
     ("kata_sizing/core/render", "kata_sizing/core/sizing", "kata_sizing/core/podfit", "kata_sizing/core/yamlout",
      "kata_sizing/core/dropins", "kata_sizing/core/rules", "kata_sizing/core/model", "kata_sizing/core/")),
    ("decide and compare (plan, compare, status)", ("kata_sizing/controller/plan", "kata_sizing/controller/compare",
                                                    "kata_sizing/controller/status", "kata_sizing/controller/conditions",
                                                    "kata_sizing/controller/decide")),
    ("the operator's request path (kube.py, the kubernetes client)", ("kata_sizing/controller/kube",
                                                                       "kubernetes_asyncio/", "kubernetes/")),
    ("HTTP and JSON (aiohttp, json)", ("aiohttp/", "/json/", "yarl/", "multidict/")),
    ("kopf's event handling", ("kopf/",)),
    ("pydantic", ("pydantic",)),
    ("asyncio", ("asyncio/",)),
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


def _part(filename: str) -> str:
    for part, needles in PARTS:
        if any(needle in filename for needle in needles):
            return part
    return "other (the standard library, logging, the rest)"


def shares(paths: list[Path]) -> tuple[float, dict[str, float], list[tuple[str, float]]]:
    """(the profiled CPU seconds, {part: share of them by own time}, the 8 functions of most own
    time with their shares) over the profiles `paths`."""
    stats = pstats.Stats(*(str(p) for p in paths))
    entries = stats.stats  # type: ignore[attr-defined]  # {(file, line, name): (cc, nc, tt, ct, callers)}
    total = sum(tt for _, _, tt, _, _ in entries.values()) or 1.0
    parts: dict[str, float] = {}
    for (filename, _, _), (_, _, tt, _, _) in entries.items():
        parts[_part(filename)] = parts.get(_part(filename), 0.0) + tt / total
    top = sorted(entries.items(), key=lambda item: item[1][2], reverse=True)[:8]
    functions = [(f"{Path(filename).name}:{name}", tt / total) for (filename, _, name), (_, _, tt, _, _) in top]
    return total, dict(sorted(parts.items(), key=lambda item: item[1], reverse=True)), functions
