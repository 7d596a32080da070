"""``.lizardignore``: which paths of a pushed directory stay out of the push.

A gitignore subset, the same rules ``lizard push`` applies: one pattern a line; blank lines
and ``#`` comments are skipped; ``!pattern`` takes a path back in; a trailing ``/`` matches
directories only; a pattern without a ``/`` elsewhere matches a name at any depth, one with
a ``/`` is relative to the file's directory; ``*`` and ``?`` stay within one path segment,
``**`` spans segments, ``[abc]`` is a character class. The last pattern that matches
decides, and a ``.lizardignore`` deeper in the tree overrides those above it."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable, List, Optional, Pattern

#: The ignore file's name, read in every directory of the push.
IGNORE_FILE = ".lizardignore"


@dataclass(frozen=True)
class _Rule:
    regex: Pattern[str]
    negated: bool
    dir_only: bool
    #: Matched against the whole relative path (else against the last segment).
    anchored: bool


def _glob_to_regex(glob: str) -> str:
    """A glob as a regular expression over ``/``-separated paths."""
    out: List[str] = []
    i = 0
    while i < len(glob):
        c = glob[i]
        if glob.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif glob.startswith("**", i):
            out.append(".*")
            i += 2
        elif c == "*":
            out.append("[^/]*")
            i += 1
        elif c == "?":
            out.append("[^/]")
            i += 1
        elif c == "[" and "]" in glob[i + 2 :]:
            end = glob.index("]", i + 2)
            body = glob[i + 1 : end]
            if body.startswith("!"):
                body = "^" + body[1:]
            out.append("[" + body.replace("\\", "\\\\") + "]")
            i = end + 1
        elif c == "\\" and i + 1 < len(glob):
            out.append(re.escape(glob[i + 1]))
            i += 2
        else:
            out.append(re.escape(c))
            i += 1
    return "".join(out)


def _parse(line: str) -> Optional[_Rule]:
    line = line.rstrip("\r\n")
    # Trailing spaces do not count unless escaped.
    stripped = line.rstrip(" ")
    if stripped.endswith("\\") and len(stripped) < len(line):
        stripped += " "
    line = stripped
    if not line or line.startswith("#"):
        return None
    negated = line.startswith("!")
    if negated:
        line = line[1:]
    elif line.startswith("\\#") or line.startswith("\\!"):
        line = line[1:]
    dir_only = line.endswith("/")
    line = line.rstrip("/")
    if not line:
        return None
    anchored = "/" in line
    line = line.lstrip("/")
    return _Rule(re.compile(_glob_to_regex(line) + r"\Z", re.DOTALL), negated, dir_only, anchored)


class IgnoreRules:
    """The patterns of one ``.lizardignore``; ``base`` is its directory, relative to the
    pushed directory (``""`` for the top)."""

    def __init__(self, base: str, lines: Iterable[str]) -> None:
        self.base = base
        self._rules = [r for r in (_parse(line) for line in lines) if r is not None]

    def decide(self, path: str, is_dir: bool) -> Optional[bool]:
        """True: ``path`` (relative to the pushed directory) is ignored; False: taken back
        in by a ``!`` pattern; None: no pattern of this file matches it."""
        if self.base:
            if not path.startswith(self.base + "/"):
                return None
            path = path[len(self.base) + 1 :]
        name = path.rsplit("/", 1)[-1]
        for rule in reversed(self._rules):
            if rule.dir_only and not is_dir:
                continue
            if rule.regex.match(path if rule.anchored else name):
                return not rule.negated
        return None


def is_ignored(stack: List[IgnoreRules], path: str, is_dir: bool) -> bool:
    """Whether the ignore files in force (outermost first) leave ``path`` out."""
    for rules in reversed(stack):
        decision = rules.decide(path, is_dir)
        if decision is not None:
            return decision
    return False
