"""Markdown as GitHub reads it: the anchors of a page's headings (the docs' links, the alerts' runbooks)."""

from __future__ import annotations

import re

FENCE = re.compile(r"^```.*?^```", re.S | re.M)


def anchors(markdown: str) -> set[str]:
    """The anchors GitHub gives a page's headings: lower case, punctuation dropped, spaces as
    hyphens, a repeated heading numbered -1, -2..."""
    seen: dict[str, int] = {}
    found = set()
    for heading in re.findall(r"^#{1,6} (.+)$", FENCE.sub("", markdown), re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        found.add(slug if count == 0 else f"{slug}-{count}")
    return found
