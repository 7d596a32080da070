"""The pushed directory as the server takes it: its recipe file and its manifest (every
path with its mode; files with their SHA-256 and size, symlinks with their target).

The walk never follows symlinks (a link is sent as a link, and the server refuses a ``copy``
of one that points outside), leaves out what ``.lizardignore`` names, and sorts paths in
byte order, the order the server checks."""

from __future__ import annotations

import hashlib
import os
import stat
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

from ._ignore import IGNORE_FILE, IgnoreRules, is_ignored
from .errors import ContextError

#: The recipe file a pushed directory is read from, before a ``Dockerfile``.
RECIPE_FILE = "lizard.template.toml"
DOCKERFILE = "Dockerfile"

_CHUNK = 1 << 16


@dataclass(frozen=True)
class Recipe:
    """The recipe text and its format (``toml`` or ``dockerfile``)."""

    text: str
    format: str


def read_recipe(root: str, name: Optional[str]) -> Recipe:
    """``lizard.template.toml``, else a ``Dockerfile`` (which needs ``name``: it has none)."""
    toml_path = os.path.join(root, RECIPE_FILE)
    docker_path = os.path.join(root, DOCKERFILE)
    if os.path.isfile(toml_path):
        return Recipe(_read_text(toml_path, RECIPE_FILE), "toml")
    if os.path.isfile(docker_path):
        if not name:
            raise ContextError("a template built from a Dockerfile needs a name (a Dockerfile has none)")
        return Recipe(_read_text(docker_path, DOCKERFILE), "dockerfile")
    if not os.path.isdir(root):
        raise ContextError(f"{root!r} is not a directory")
    raise ContextError(f"the directory has neither {RECIPE_FILE} nor {DOCKERFILE}")


def _read_text(path: str, shown: str) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except (OSError, UnicodeDecodeError) as e:
        raise ContextError(f"cannot read {shown}: {e}") from e


def hash_file(path: str) -> str:
    """SHA-256 of a file's content, hex."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(_CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


@dataclass(frozen=True)
class Manifest:
    """The scanned directory: ``entries`` as sent (wire form, sorted by path) and, for
    each content hash, a file that has it (for the upload)."""

    entries: List[Dict[str, Any]]
    files_by_hash: Dict[str, str]

    def hashes(self) -> List[str]:
        return sorted(self.files_by_hash)


def scan(root: str, *, app: bool = False) -> Manifest:
    """Walk ``root`` without following symlinks, hashing every file. An app directory
    (``app``, what ``lizard up`` sends) also leaves out what its ``.gitignore`` files name,
    and ``.git`` itself."""
    if not os.path.isdir(root):
        raise ContextError(f"{root!r} is not a directory")
    entries: List[Dict[str, Any]] = []
    files: Dict[str, str] = {}
    ignore_files = (IGNORE_FILE, ".gitignore") if app else (IGNORE_FILE,)
    _walk(root, "", [], entries, files, ignore_files)
    entries.sort(key=lambda e: e["path"].encode("utf-8"))
    return Manifest(entries, files)


def _walk(
    root: str,
    rel_dir: str,
    stack: List[IgnoreRules],
    entries: List[Dict[str, Any]],
    files: Dict[str, str],
    ignore_files: Tuple[str, ...],
) -> None:
    directory = os.path.join(root, rel_dir) if rel_dir else root
    for ignore_file in ignore_files:
        ignore_path = os.path.join(directory, ignore_file)
        if os.path.isfile(ignore_path):
            try:
                with open(ignore_path, encoding="utf-8", errors="replace") as f:
                    stack = stack + [IgnoreRules(rel_dir, f.read().splitlines())]
            except OSError as e:
                raise ContextError(f"cannot read {_shown(rel_dir, ignore_file)}: {e}") from e
    try:
        names = sorted(os.listdir(directory))
    except OSError as e:
        raise ContextError(f"cannot read {rel_dir or '.'!r}: {e}") from e
    for name in names:
        path = _shown(rel_dir, name)
        try:
            path.encode("utf-8")
        except UnicodeEncodeError:
            raise ContextError(f"{path.encode('utf-8', 'surrogateescape')!r}: the name is not UTF-8") from None
        full = os.path.join(directory, name)
        try:
            st = os.lstat(full)
        except OSError as e:
            raise ContextError(f"cannot read {path!r}: {e}") from e
        is_dir = stat.S_ISDIR(st.st_mode)
        if is_ignored(stack, path, is_dir) or (len(ignore_files) > 1 and is_dir and name == ".git"):
            continue
        entry: Dict[str, Any] = {"path": path, "mode": stat.S_IMODE(st.st_mode)}
        if stat.S_ISLNK(st.st_mode):
            entry["type"] = "symlink"
            target = os.readlink(full)
            try:
                target.encode("utf-8")
            except UnicodeEncodeError:
                raise ContextError(f"{path!r}: the link's target is not UTF-8") from None
            entry["target"] = target
        elif is_dir:
            entry["type"] = "dir"
        elif stat.S_ISREG(st.st_mode):
            try:
                sha256 = hash_file(full)
            except OSError as e:
                raise ContextError(f"cannot read {path!r}: {e}") from e
            entry.update(type="file", sha256=sha256, size=st.st_size)
            files.setdefault(sha256, full)
        else:
            raise ContextError(f"{path!r} is neither a file, a directory nor a symbolic link")
        entries.append(entry)
        if is_dir:
            _walk(root, path, stack, entries, files, ignore_files)


def _shown(rel_dir: str, name: str) -> str:
    return f"{rel_dir}/{name}" if rel_dir else name
