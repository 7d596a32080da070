"""Unit tests of the push's directory scan (no server): ignore rules, symlinks, modes,
hashes, the order of the manifest and the recipe file."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from lizard import ContextError
from lizard._context import read_recipe, scan
from lizard._ignore import IgnoreRules, is_ignored


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    (tmp_path / "tools/sub").mkdir(parents=True)
    (tmp_path / "tools/setup.sh").write_text("#!/bin/sh\necho hi\n")
    (tmp_path / "tools/setup.sh").chmod(0o755)
    (tmp_path / "tools/sub/data").write_text("data")
    (tmp_path / "tools-b").write_text("sorts between tools and tools/ in byte order")
    (tmp_path / "same-as-data").write_text("data")
    (tmp_path / "tools/sub").chmod(0o750)
    os.symlink("setup.sh", tmp_path / "tools/run.sh")
    os.symlink("/etc/passwd", tmp_path / "passwd")
    return tmp_path


def test_scan_lists_files_dirs_and_symlinks_in_byte_order(tree: Path) -> None:
    m = scan(str(tree))
    assert [e["path"] for e in m.entries] == [
        "passwd", "same-as-data", "tools", "tools-b", "tools/run.sh", "tools/setup.sh", "tools/sub", "tools/sub/data",
    ]
    by = {e["path"]: e for e in m.entries}
    assert by["tools/setup.sh"] == {
        "path": "tools/setup.sh", "mode": 0o755, "type": "file", "sha256": sha(b"#!/bin/sh\necho hi\n"), "size": 18,
    }
    assert by["tools/sub"] == {"path": "tools/sub", "mode": 0o750, "type": "dir"}
    # Links are recorded, never followed: the one pointing out is the server's to refuse.
    assert by["tools/run.sh"]["type"] == "symlink" and by["tools/run.sh"]["target"] == "setup.sh"
    assert by["passwd"] == {"path": "passwd", "mode": 0o777, "type": "symlink", "target": "/etc/passwd"}
    assert "sha256" not in by["passwd"] and "size" not in by["passwd"]
    # Two files with one content: one upload.
    assert m.hashes() == sorted({sha(b"data"), sha(b"#!/bin/sh\necho hi\n"), sha((tree / "tools-b").read_bytes())})
    assert m.files_by_hash[sha(b"data")] in (str(tree / "same-as-data"), str(tree / "tools/sub/data"))


def test_a_symlinked_directory_is_not_entered_and_names_sort_by_bytes(tree: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    outside = tmp_path_factory.mktemp("outside")
    (outside / "secret").write_text("s")
    os.symlink(str(outside), tree / "out")
    (tree / "\U0001F600").write_text("astral")
    (tree / "\uFF5E").write_text("bmp")
    paths = [e["path"] for e in scan(str(tree)).entries]
    assert "out" in paths and not any(p.startswith("out/") for p in paths)
    assert paths[-2:] == ["\uFF5E", "\U0001F600"]  # by their UTF-8 bytes


def test_lizardignore_names_dirs_and_globs(tree: Path) -> None:
    (tree / ".lizardignore").write_text("# comment\n\ntools/sub/\n*.sh\n!setup.sh\nsame-as-data\n")
    paths = [e["path"] for e in scan(str(tree)).entries]
    assert paths == [".lizardignore", "passwd", "tools", "tools-b", "tools/setup.sh"]
    # A nested ignore file applies below its directory and overrides the outer one.
    (tree / ".lizardignore").write_text("*.sh\n")
    (tree / "tools/.lizardignore").write_text("!run.sh\ndata\n")
    paths = [e["path"] for e in scan(str(tree)).entries]
    assert paths == [
        ".lizardignore", "passwd", "same-as-data", "tools", "tools-b", "tools/.lizardignore", "tools/run.sh", "tools/sub",
    ]


def test_ignore_pattern_rules() -> None:
    rules = [IgnoreRules("", ["build/", "/top.txt", "docs/*.md", "**/cache", "a?c", "[xy].log"])]
    cases = [
        ("build", True, True), ("build", False, False), ("src/build", True, True),
        ("top.txt", False, True), ("sub/top.txt", False, False),
        ("docs/a.md", False, True), ("docs/sub/a.md", False, False), ("x/docs/a.md", False, False),
        ("cache", True, True), ("deep/er/cache", False, True),
        ("abc", False, True), ("a/c", False, False),
        ("x.log", False, True), ("z.log", False, False),
    ]
    for path, is_dir, ignored in cases:
        assert is_ignored(rules, path, is_dir) is ignored, (path, is_dir)
    nested = [IgnoreRules("", ["*.tmp"]), IgnoreRules("keep", ["!*.tmp", "/local"])]
    assert is_ignored(nested, "a.tmp", False) and not is_ignored(nested, "keep/a.tmp", False)
    assert is_ignored(nested, "keep/local", False) and not is_ignored(nested, "keep/x/local", False)


def test_special_files_are_refused(tree: Path) -> None:
    os.mkfifo(tree / "pipe")
    with pytest.raises(ContextError, match="pipe"):
        scan(str(tree))
    (tree / ".lizardignore").write_text("pipe\n")
    assert "pipe" not in [e["path"] for e in scan(str(tree)).entries]


def test_recipe_file_toml_then_dockerfile(tmp_path: Path) -> None:
    with pytest.raises(ContextError, match="neither lizard.template.toml nor Dockerfile"):
        read_recipe(str(tmp_path), None)
    (tmp_path / "Dockerfile").write_text("FROM base\nRUN true\n")
    with pytest.raises(ContextError, match="needs a name"):
        read_recipe(str(tmp_path), None)
    r = read_recipe(str(tmp_path), "mine")
    assert (r.format, r.text) == ("dockerfile", "FROM base\nRUN true\n")
    (tmp_path / "lizard.template.toml").write_text('name = "t"\nfrom = "base"\n')
    r = read_recipe(str(tmp_path), None)
    assert (r.format, r.text) == ("toml", 'name = "t"\nfrom = "base"\n')
    with pytest.raises(ContextError, match="not a directory"):
        scan(str(tmp_path / "nope"))
