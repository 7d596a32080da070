#!/usr/bin/env python3
"""CI's compiled dependencies, kept between runs on the machine (as CI services cache them).

    scripts/ci-cargo-cache.py attach   # before the first cargo command of a clean clone
    scripts/ci-cargo-cache.py prune    # when the run ends

`attach` makes the clone's `target/debug` a link to the cache's (LIZARD_CI_CARGO_CACHE,
default /var/cache/lizard/ci-target), so a clean clone compiles only the workspace's own
crates: the dependencies' artifacts (the debug build and clippy's check build) are there
from the last run. Everything else under `target/` (the SDK suites' virtual environments,
the static agent) stays in the clone.

`prune` removes the workspace's own artifacts from the cache: they are the clone's, keyed by
its path, and would only pile up. So the cache holds dependencies alone; one that has grown
past LIZARD_CI_CARGO_CACHE_GB (default 20) through dependency upgrades is emptied by the
next `attach`, which then compiles everything as a cache-less run would.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CACHE = Path(os.environ.get("LIZARD_CI_CARGO_CACHE", "/var/cache/lizard/ci-target")) / "debug"
LIMIT = int(os.environ.get("LIZARD_CI_CARGO_CACHE_GB", "20")) << 30


def say(message: str) -> None:
    print(f"ci-cargo-cache: {message}", file=sys.stderr)


def size(path: Path) -> int:
    total = 0
    for dirpath, _, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_size
            except FileNotFoundError:
                pass
    return total


def workspace_names() -> tuple[set[str], set[str]]:
    """The workspace's package names and its targets' crate names (`-` as `_`)."""
    meta = json.loads(
        subprocess.run(
            ["cargo", "metadata", "--no-deps", "--format-version", "1", "--offline"],
            cwd=ROOT,
            check=True,
            capture_output=True,
            text=True,
        ).stdout
    )
    packages = {p["name"] for p in meta["packages"]}
    crates = {t["name"].replace("-", "_") for p in meta["packages"] for t in p["targets"]}
    return packages, crates


def is_workspace_artifact(name: str, packages: set[str], crates: set[str]) -> bool:
    """`<crate>-<hash>…` or `lib<crate>-<hash>…` in deps/; `<package>-<hash>` in .fingerprint/ and build/."""
    stem = name.split(".", 1)[0]
    base = stem.rsplit("-", 1)[0] if "-" in stem else stem
    if base.startswith("lib") and base[3:] in crates:
        return True
    return base in crates or base in packages or base.replace("-", "_") in crates


def prune() -> None:
    if not CACHE.is_dir():
        return
    packages, crates = workspace_names()
    removed = 0
    for sub in ("deps", ".fingerprint", "build"):
        folder = CACHE / sub
        if not folder.is_dir():
            continue
        for entry in folder.iterdir():
            if is_workspace_artifact(entry.name, packages, crates):
                if entry.is_dir() and not entry.is_symlink():
                    shutil.rmtree(entry)
                else:
                    entry.unlink()
                removed += 1
    # What cargo copies up beside deps/ (binaries and their .d files), and what is per run.
    for entry in CACHE.iterdir():
        if entry.is_file() or entry.name in ("examples", "incremental"):
            if entry.is_dir():
                shutil.rmtree(entry)
            else:
                entry.unlink()
            removed += 1
    say(f"{removed} artifacts of the workspace's own crates removed from {CACHE}")


def attach() -> None:
    target = ROOT / "target" / "debug"
    if target.is_symlink() or target.exists():
        say(f"{target} exists: left as it is")
        return
    if CACHE.is_dir():
        prune()  # what a run that was killed left
        held = size(CACHE)
        if held > LIMIT:
            say(f"{held >> 30} GiB is over the limit: emptied")
            shutil.rmtree(CACHE)
        else:
            say(f"dependencies from earlier runs: {held >> 20} MiB")
    CACHE.mkdir(parents=True, exist_ok=True)
    target.parent.mkdir(exist_ok=True)
    target.symlink_to(CACHE)


def main() -> None:
    commands = {"attach": attach, "prune": prune}
    if len(sys.argv) != 2 or sys.argv[1] not in commands:
        sys.exit(f"usage: {sys.argv[0]} attach|prune")
    commands[sys.argv[1]]()


if __name__ == "__main__":
    main()
