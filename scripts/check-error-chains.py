#!/usr/bin/env python3
"""Fails when an error's message repeats its source.

Lizard's rule for error chains: a message says what failed and carries its cause's text
(`write {path}: {cause}`), so every log line and every `{e}` is whole on its own, and no
variant also returns that cause from `Error::source()` — a chain printer (`{e:#}` in the
CLI) would print it twice. A variant either shows its cause or passes it on whole
(`#[error(transparent)]`). thiserror makes a field a source when it is marked `#[source]`
or `#[from]`, or is named `source`; this script reads every `#[error("…")]` in crates/
and names each variant whose message or arguments use that field.

A small reader of Rust text, not a parser: it knows attributes, doc comments, strings and
brackets, which is all an error enum's variants use.

    python3 scripts/check-error-chains.py [DIR]     # default: crates
"""

import pathlib
import re
import sys


def closing(text: str, i: int, open_ch: str, close_ch: str) -> int:
    """The index just past the bracket that closes the one at text[i] (strings skipped)."""
    depth, j, in_string = 0, i, False
    while j < len(text):
        c = text[j]
        if in_string:
            if c == "\\":
                j += 1
            elif c == '"':
                in_string = False
        elif c == '"':
            in_string = True
        elif c == open_ch:
            depth += 1
        elif c == close_ch:
            depth -= 1
            if depth == 0:
                return j + 1
        j += 1
    return len(text)


def top_level_fields(text: str) -> list[str]:
    """The comma-separated parts of a field list, brackets and strings kept whole."""
    parts, depth, current, in_string = [], 0, "", False
    for c in text:
        if in_string:
            current += c
            in_string = c != '"'
            continue
        in_string = c == '"'
        depth += c in "([{<"
        depth -= c in ")]}>"
        if c == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += c
    return parts + [current] if current.strip() else parts


def source_field(opener: str, fields: list[str]) -> str | None:
    """The field thiserror makes the source: `0`, `1`… for a tuple, the name otherwise."""
    for i, field in enumerate(fields):
        if "#[source]" in field or "#[from]" in field:
            bare = re.sub(r"#\[[^\]]*\]|///[^\n]*", "", field)
            named = re.match(r"\s*(?:pub\s+)?(\w+)\s*:", bare) if opener == "{" else None
            return named.group(1) if named else str(i)
    for field in fields if opener == "{" else []:
        if re.match(r"\s*(?:pub\s+)?source\s*:", re.sub(r"#\[[^\]]*\]|///[^\n]*", "", field)):
            return "source"
    return None


def repeats(path: pathlib.Path) -> list[str]:
    text = path.read_text()
    found = []
    for attr in re.finditer(r"#\[error\(", text):
        end = closing(text, attr.end() - 1, "(", ")")
        inside = text[attr.end() : end - 1].strip()
        message = re.match(r'"((?:[^"\\]|\\.)*)"', inside)
        if not message:  # transparent
            continue
        arguments = inside[message.end() :]
        # The item the attribute is on: past `]`, other attributes and doc comments.
        rest, k = text[end + 1 :], 0
        while True:
            stripped = rest[k:].lstrip()
            k = len(rest) - len(stripped)
            if stripped.startswith("#["):
                k += closing(stripped, 1, "[", "]")
            elif stripped.startswith("//"):
                k += stripped.index("\n")
            else:
                break
        item = re.match(r"\s*(?:pub(?:\([^)]*\))?\s+)?(?:struct\s+|enum\s+)?(\w+)(?:<[^>]*>)?\s*([({]?)", rest[k:])
        if not item or not item.group(2):
            continue
        opener = item.group(2)
        start = k + item.end() - 1
        body = rest[start + 1 : closing(rest, start, opener, ")" if opener == "(" else "}") - 1]
        source = source_field(opener, top_level_fields(body))
        if source is None:
            continue
        in_message = re.search(r"\{%s(?::[^}]*)?\}" % re.escape(source), message.group(1))
        in_arguments = re.search(r"\.%s\b" % source if source.isdigit() else r"\b%s\b" % source, arguments)
        if in_message or in_arguments:
            line = text[: attr.start()].count("\n") + 1
            found.append(f'{path}:{line}: {item.group(1)}: "{message.group(1)}" repeats its source `{source}`')
    return found


def main() -> int:
    root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else "crates")
    found = [hit for path in sorted(root.rglob("*.rs")) if "target" not in path.parts for hit in repeats(path)]
    for hit in found:
        print(hit)
    if found:
        print(
            f"{len(found)} error variants repeat their source: keep the cause in the message and "
            "drop the source (rename the field, a From impl for `?`), or make it transparent",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
