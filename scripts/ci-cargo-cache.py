#!/usr/bin/env python3
"""CI's compiled dependencies, kept between runs on the machine (as CI services cache them).

    scripts/ci-cargo-cache.py attach   # before the first cargo command of a clean clone
    scripts/ci-cargo-cache.py prune    # when the run ends

`attach` makes the clone's `target/debug` a link to the cache's (LIZARD_CI_CARGO_CACHE,
default /var/cache/lizard/ci-target) and prints the cache, which the caller makes cargo's
target directory (CARGO_TARGET_DIR): cargo then sees the same path in every clone, where
through the link alone each clone's new path made every dependency with a build script
compile again (183 s instead of 113 s). A clean clone compiles only the workspace's own
crates: the dependencies' artifacts (the debug build and clippy's check build) are there
from the last run. The paths the scripts use (`target/debug/lizard`) reach them through the
link; everything else under the clone's `target/` (the SDK suites' virtual environments)
stays in the clone.

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


def workspace_names() -> set[str]:
    """The workspace's package names and its targets' crate names, `-` as `_`."""
    meta = json.loads(
        subprocess.run(
            ["cargo", "metadata", "--no-deps", "--format-version", "1", "--offline"],
            cwd=ROOT,
            check=True,
            capture_output=True,
            text=True,
        ).stdout
    )
    names = {p["name"] for p in meta["packages"]} | {t["name"] for p in meta["packages"] for t in p["targets"]}
    return {n.replace("-", "_") for n in names}


def is_workspace_artifact(name: str, workspace: set[str]) -> bool:
    """`<crate>-<hash>…` or `lib<crate>-<hash>…` in deps/; `<package>-<hash>` in .fingerprint/ and build/."""
    base = name.split(".", 1)[0].rsplit("-", 1)[0].replace("-", "_")
    return base in workspace or base.removeprefix("lib") in workspace


def remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink()


def prune() -> None:
    if not CACHE.is_dir():
        return
    workspace = workspace_names()
    doomed = [
        entry
        for sub in ("deps", ".fingerprint", "build")
        if (CACHE / sub).is_dir()
        for entry in (CACHE / sub).iterdir()
        if is_workspace_artifact(entry.name, workspace)
    ]
    # What cargo copies up beside deps/ (binaries and their .d files), and what is per run.
    doomed += [e for e in CACHE.iterdir() if e.is_file() or e.name in ("examples", "incremental")]
    for entry in doomed:
        remove(entry)
    say(f"{len(doomed)} artifacts of the workspace's own crates removed from {CACHE}")


def attach() -> None:
    target = ROOT / "target" / "debug"
    if target.is_symlink() or target.exists():
        say(f"{target} exists: left as it is")
        print(target.parent)
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
    print(CACHE.parent)


def main() -> None:
    commands = {"attach": attach, "prune": prune}
    if len(sys.argv) != 2 or sys.argv[1] not in commands:
        sys.exit(f"usage: {sys.argv[0]} attach|prune")
    commands[sys.argv[1]]()


if __name__ == "__main__":
    main()
