"""The README is a front door and the documentation holds together: every relative link of
README.md and docs/*.md names a file that exists and, with an anchor, a heading of that file
(GitHub's anchors), so nothing moved out of the README left a dead link behind."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.support.markdown import FENCE, anchors
from tests.support.paths import ROOT

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# A front door, not a manual: the detail lives in docs/.
README_MAX_LINES = 320

LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def links(page: Path) -> list[str]:
    return [target for target in LINK.findall(FENCE.sub("", page.read_text()))
            if not re.match(r"[a-z]+:", target)]


def test_the_slugs_follow_github() -> None:
    assert anchors("# A\n## What `make test` checks\n## The admission webhook (optional)\n## A\n") == {
        "a", "what-make-test-checks", "the-admission-webhook-optional", "a-1"}


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_and_anchor_resolves(page: Path) -> None:
    dead = []
    for target in links(page):
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            dead.append(f"{target}: no file {file.relative_to(ROOT) if file.is_relative_to(ROOT) else file}")
        elif anchor and file.suffix == ".md" and anchor not in anchors(file.read_text()):
            dead.append(f"{target}: no heading gives #{anchor} in {file.relative_to(ROOT)}")
    assert not dead, f"{page.relative_to(ROOT)}:\n" + "\n".join(dead)


def test_the_readme_stays_a_front_door() -> None:
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= README_MAX_LINES, "move detail into docs/ and link it"
    for command in ("make demo", "make test"):
        assert command in readme
    # Each page of docs/ is reachable from the README.
    linked = {Path(t.partition("#")[0]).name for t in links(ROOT / "README.md")}
    assert {p.name for p in PAGES[1:]} <= linked


def test_every_figure_of_the_performance_page_is_attributed_to_make_bench() -> None:
    performance = (ROOT / "docs" / "performance.md").read_text()
    assert "`make bench` measures and prints" in performance.split("\n|", 1)[0]
    assert "make bench" in (ROOT / "README.md").read_text()
