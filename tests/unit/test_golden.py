"""`kata-sizing render` of every example, byte for byte against tests/golden/.

A change in rendered output must be a reviewed change: regenerate with
`KATA_SIZING_UPDATE_GOLDEN=1 pytest tests/unit/test_golden.py` and read the diff in git.
"""

from __future__ import annotations

import contextlib
import difflib
import io
import os
from pathlib import Path

import pytest

from kata_sizing.cli import main
from tests.support.paths import GOLDEN, ROOT

EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))
UPDATE = os.environ.get("KATA_SIZING_UPDATE_GOLDEN") == "1"
REGENERATE = "KATA_SIZING_UPDATE_GOLDEN=1 pytest tests/unit/test_golden.py"


def _render(example: Path) -> str:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["render", str(example), "--node-capacity", "256Gi", "--node-cpu", "64"])
    assert code == 0, err.getvalue()
    return out.getvalue()


def test_every_example_has_a_golden_file():
    assert EXAMPLES
    if UPDATE:
        # The render tests write the current ones; drop goldens of removed examples.
        for stale in set(GOLDEN.glob("*.yaml")) - {GOLDEN / e.name for e in EXAMPLES}:
            stale.unlink()
        return
    names = sorted(p.name for p in GOLDEN.glob("*.yaml"))
    assert names == [e.name for e in EXAMPLES], f"golden files do not match examples/; run {REGENERATE}"


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.stem)
def test_render_matches_golden(example):
    golden = GOLDEN / example.name
    rendered = _render(example)
    if UPDATE:
        GOLDEN.mkdir(exist_ok=True)
        golden.write_text(rendered)
        return
    if not golden.exists():
        pytest.fail(f"no {golden.relative_to(ROOT)}; create it with {REGENERATE}")
    expected = golden.read_text()
    if rendered != expected:
        diff = "".join(difflib.unified_diff(
            expected.splitlines(keepends=True), rendered.splitlines(keepends=True),
            fromfile=f"tests/golden/{example.name}", tofile=f"render examples/{example.name}", n=2,
        ))
        lines = diff.splitlines(keepends=True)
        shown = "".join(lines[:80]) + (f"... ({len(lines) - 80} more diff lines)\n" if len(lines) > 80 else "")
        pytest.fail(
            f"`kata-sizing render examples/{example.name} --node-capacity 256Gi --node-cpu 64` differs from "
            f"tests/golden/{example.name}. If the change is intended, regenerate with {REGENERATE} "
            f"and review the diff.\n{shown}",
            pytrace=False,
        )
