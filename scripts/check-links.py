#!/usr/bin/env python3
"""Every relative link in README.md, CONTRIBUTING.md and docs/*.md resolves: the file or
directory exists, and an anchor (`page.md#heading`, `#heading`) names a heading of that
page (GitHub's anchors: lowercased, punctuation dropped, spaces as hyphens, a repeated
heading numbered). Links to other sites are not fetched. Exit status 1 names each broken
link with its file and line."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Dict, List, Set

ROOT = Path(__file__).resolve().parent.parent
LINK = re.compile(r"\]\(([^)\s]+)\)")


def slug(heading: str) -> str:
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def outside_code(path: Path) -> List[tuple[int, str]]:
    """The lines of a Markdown file outside fenced code blocks, numbered from 1."""
    lines, fenced = [], False
    for number, line in enumerate(path.read_text().split("\n"), 1):
        if line.startswith("```"):
            fenced = not fenced
            continue
        if not fenced:
            lines.append((number, line))
    return lines


def anchors_of(path: Path, cache: Dict[Path, Set[str]]) -> Set[str]:
    if path not in cache:
        seen: Dict[str, int] = {}
        anchors: Set[str] = set()
        for _, line in outside_code(path):
            heading = re.match(r"^#{1,6} (.*)$", line)
            if heading:
                base = slug(heading.group(1))
                count = seen.get(base, 0)
                seen[base] = count + 1
                anchors.add(base if count == 0 else f"{base}-{count}")
        cache[path] = anchors
    return cache[path]


def main() -> int:
    pages = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").glob("*.md"))]
    cache: Dict[Path, Set[str]] = {}
    broken = []
    for page in pages:
        for number, line in outside_code(page):
            for target in LINK.findall(line):
                if re.match(r"^[a-z][a-z0-9+.-]*:", target):
                    continue
                file_part, _, anchor = target.partition("#")
                resolved = (page.parent / file_part).resolve() if file_part else page
                where = f"{page.relative_to(ROOT)}:{number}: {target}"
                if not resolved.exists():
                    broken.append(f"{where}: no such file")
                elif anchor and resolved.suffix == ".md" and anchor not in anchors_of(resolved, cache):
                    broken.append(f"{where}: no heading #{anchor} in {resolved.relative_to(ROOT)}")
    for line in broken:
        print(line, file=sys.stderr)
    print(f"{len(pages)} pages checked, {len(broken)} broken links", file=sys.stderr)
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
