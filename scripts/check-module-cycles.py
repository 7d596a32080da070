#!/usr/bin/env python3
"""No import circle between the modules of one crate or package: among the files of each
Rust crate (`use crate::…`, `super::…` and `crate::…` paths), of the Python SDK (relative
imports) and of the web console's TypeScript (relative imports), the graph of "this file
uses that one" has no cycle: what two modules both need belongs in a module of its own
that both use. Exit status 1 names each circle's files.

Each Rust file is a node (`src/a/b.rs` and `src/a/b/mod.rs` are module `a::b`); a path is
resolved to the deepest module file it names (`crate::a::b::Item` → `a::b` when that file
exists, else `a`); a bare path (`use child::Item` in a parent) is not followed. Comments
and string literals are ignored, and so are inline `#[cfg(test)]` modules (a unit test may
drive its module through the whole crate); `use` lists in braces are expanded. Imports under
`if TYPE_CHECKING:` (for annotations only) are not edges."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Dict, Iterable, List, Set, Tuple

ROOT = Path(__file__).resolve().parent.parent
Graph = Dict[str, Set[str]]


def strip_rust(text: str) -> str:
    """`text` without comments, string and char literals (their contents could look like paths)."""
    text = re.sub(r"//[^\n]*", "", text)
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    text = re.sub(r'r#*"(?:.|\n)*?"#*', '""', text)
    text = re.sub(r'"(?:\\.|[^"\\])*"', '""', text)
    return re.sub(r"'(?:\\.|[^'\\])'", "' '", text)


def closing(text: str, start: int) -> int:
    """The index of the `}` that closes the `{` at `start` (the text's end if none does)."""
    depth = 0
    for i in range(start, len(text)):
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        if depth == 0:
            return i
    return len(text)


def without_test_modules(text: str) -> str:
    """`text` without its inline `#[cfg(test)] mod … { … }` blocks: a unit test may drive
    its module through the whole of its crate (a handler through the router)."""
    while match := re.search(r"#\[cfg\(test\)\]\s*(?:pub(?:\([^)]*\))?\s+)?mod\s+\w+\s*\{", text):
        text = text[: match.start()] + text[closing(text, match.end() - 1) + 1 :]
    return text


def expand(tree: str) -> List[str]:
    """`a::{b, c::{d, e as f}}` → [`a::b`, `a::c::d`, `a::c::e`]."""
    tree = re.sub(r"\s+", "", re.sub(r"\s+as\s+\w+", "", tree))
    start = tree.find("{")
    if start < 0:
        return [tree]
    end = closing(tree, start)
    depth, items, begin = 0, [], start + 1
    for i in range(start, end):
        depth += {"{": 1, "}": -1}.get(tree[i], 0)
        if tree[i] == "," and depth == 1:
            items.append(tree[begin:i])
            begin = i + 1
    items.append(tree[begin:end])
    return [path for item in items if item for path in expand(tree[:start] + item)]


def rust_modules(src: Path) -> Dict[Tuple[str, ...], Path]:
    modules = {}
    for path in src.rglob("*.rs"):
        parts = list(path.relative_to(src).with_suffix("").parts)
        if parts[-1] in ("mod", "lib", "main"):
            parts = parts[:-1]
        if path.parent == src and path.stem == "main" and (src / "lib.rs").exists():
            continue  # a binary beside the library is a crate of its own
        if parts and parts[0] == "bin":
            continue
        modules[tuple(parts)] = path
    return modules


def rust_graph(src: Path) -> Graph:
    modules = rust_modules(src)
    graph: Graph = {}

    def resolve(path: List[str]) -> Tuple[str, ...]:
        for n in range(len(path), -1, -1):
            if tuple(path[:n]) in modules:
                return tuple(path[:n])
        return ()

    for module, file in modules.items():
        text = without_test_modules(strip_rust(file.read_text()))
        paths: List[str] = []
        for statement in re.findall(r"\buse\s+([^;]+);", text):
            paths += expand(statement)
        paths += re.findall(r"(?<![\w:])((?:crate|super)(?:::\w+)+)", text)
        targets = set()
        for p in paths:
            segs = [s for s in p.split("::") if s]
            if not segs or segs[0] not in ("crate", "super", "self"):
                continue
            # `super` is relative to this module's parent; a mod.rs file is its directory's module.
            base = list(module)
            if segs[0] == "crate":
                base, segs = [], segs[1:]
            elif segs[0] == "self":
                segs = segs[1:]
            while segs and segs[0] == "super":
                base, segs = base[:-1], segs[1:]
            target = resolve(base + [s for s in segs if s != "self"])
            if target != module:
                targets.add(target)
        graph[name(src, module)] = {name(src, t) for t in targets}
    return graph


def name(src: Path, module: Tuple[str, ...]) -> str:
    return f"{src.parent.name}::{'::'.join(module) or '(root)'}"


def runtime_python(text: str) -> str:
    """`text` without its `if TYPE_CHECKING:` blocks: imports for annotations only are not
    circles at run time."""
    out, skipping, indent = [], False, 0
    for line in text.split("\n"):
        stripped = line.lstrip()
        if skipping and stripped and len(line) - len(stripped) <= indent:
            skipping = False
        if not skipping and stripped.startswith("if TYPE_CHECKING:"):
            skipping, indent = True, len(line) - len(stripped)
            continue
        if not skipping:
            out.append(line)
    return "\n".join(out)


def relative_graph(root: Path, pattern: str, imports: str, resolve, prepare=lambda text: text) -> Graph:
    graph: Graph = {}
    for file in root.rglob(pattern):
        if "node_modules" in file.parts:
            continue
        targets = set()
        for spec in re.findall(imports, prepare(file.read_text()), flags=re.M):
            target = resolve(file, spec)
            if target is not None and target != file:
                targets.add(str(target.relative_to(ROOT)))
        graph[str(file.relative_to(ROOT))] = targets
    return graph


def typescript(file: Path, spec: str) -> Path | None:
    if not spec.startswith("."):
        return None
    base = (file.parent / spec).resolve()
    for candidate in (base.with_suffix(".ts"), base / "index.ts"):
        if candidate.exists():
            return candidate
    return None


def python(file: Path, spec: str) -> Path | None:
    # `from .x import …` (spec `.x`) or `from . import x, y` (spec `. x, y`: the first name).
    dots = len(spec) - len(spec.lstrip("."))
    rest = spec[dots:].strip()
    if not dots:
        return None
    base = file.parent
    for _ in range(dots - 1):
        base = base.parent
    if rest.startswith("import"):
        first = rest[len("import") :].split(",")[0].strip(" ()")
        candidate = base / f"{first}.py"
        return candidate if candidate.exists() else base / "__init__.py"
    candidate = base / (rest.split()[0].replace(".", "/") + ".py")
    return candidate if candidate.exists() else None


def cycles(graph: Graph) -> Iterable[List[str]]:
    """The strongly connected components of more than one node (Tarjan)."""
    index: Dict[str, int] = {}
    low: Dict[str, int] = {}
    stack: List[str] = []
    on_stack: Set[str] = set()
    found: List[List[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(10_000)
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def all_graphs() -> List[Graph]:
    """Each Rust crate's, the Python SDK's and the web console's."""
    graphs: List[Graph] = [rust_graph(src) for src in sorted(ROOT.glob("crates/*/src"))]
    graphs.append(
        relative_graph(
            ROOT / "sdk/python/lizard",
            "*.py",
            r"^\s*from\s+(\.+[\w.]*\s*(?:import\s+[\w, ]+)?)",
            python,
            runtime_python,
        )
    )
    graphs.append(
        relative_graph(
            ROOT / "crates/lizard-console/web/src", "*.ts", r"""(?:import|export)[^'"]*from\s+['"]([^'"]+)['"]""", typescript
        )
    )
    return graphs


def main() -> int:
    graphs = all_graphs()
    circles = [c for g in graphs for c in cycles(g)]
    for circle in circles:
        print(f"import circle of {len(circle)}: {' ↔ '.join(circle)}")
    if circles:
        print(f"{len(circles)} import circles: move what both sides use into a module of its own")
        return 1
    print("no import circles")
    return 0


if __name__ == "__main__":
    sys.exit(main())
