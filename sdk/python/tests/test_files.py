"""Files beyond read/write against a real server and a real sandbox, in both flavours: what
is at a path, renames, several files in one call, a directory as one tar archive, and
directory watches (events, recursion, overflow, stop, and what a pause does to them)."""

from __future__ import annotations

import asyncio
import io
import tarfile
import threading
import time
import uuid
from typing import Callable, Iterator, List, Optional

import pytest

from conftest import Server
from lizard import (
    APIConnectionError,
    AsyncSandbox,
    FsEvent,
    InvalidArgumentError,
    Lizard,
    NotFoundError,
    Sandbox,
)


@pytest.fixture(scope="module")
def sandbox(server: Server, my_project) -> Iterator[Sandbox]:
    sb = Lizard(project="my-project").create("base", timeout_ms=1_800_000)
    yield sb
    try:
        sb.kill()
    except NotFoundError:
        pass


def fresh_dir(sandbox: Sandbox) -> str:
    d = f"/tmp/files-{uuid.uuid4().hex[:8]}"
    sandbox.fs.make_dir(d)
    return d


def wait_until(check: Callable[[], bool], what: str, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"not within {timeout_s} s: {what}"
        time.sleep(0.05)


def inotify_instances(sandbox: Sandbox) -> int:
    """inotify descriptors the guest agent (PID 1) holds."""
    out = sandbox.process.exec_("ls -l /proc/1/fd | grep -c inotify || true").stdout
    return int(out.strip() or 0)


def test_info_exists_and_rename(sandbox: Sandbox) -> None:
    d = fresh_dir(sandbox)
    sandbox.fs.write(f"{d}/a.txt", "12345", mode=0o640)
    sandbox.process.exec_(f"ln -s a.txt {d}/link && chown 1000:1000 {d}/a.txt || chown 65534:65534 {d}/a.txt")
    info = sandbox.fs.get_info(f"{d}/a.txt")
    assert (info.name, info.type, info.size, info.mode) == ("a.txt", "file", 5, 0o640)
    assert info.uid != 0 and info.owner and info.mtime_ms > 1_600_000_000_000 and info.symlink_target is None
    link = sandbox.fs.get_info(f"{d}/link")
    assert (link.type, link.symlink_target) == ("symlink", "a.txt")
    assert sandbox.fs.get_info(d).type == "dir"
    assert sandbox.fs.exists(f"{d}/a.txt") and not sandbox.fs.exists(f"{d}/nothing")
    moved = sandbox.fs.rename(f"{d}/a.txt", f"{d}/b.txt")
    assert (moved.path, moved.size) == (f"{d}/b.txt", 5)
    assert not sandbox.fs.exists(f"{d}/a.txt") and sandbox.fs.read(f"{d}/b.txt") == "12345"
    # Errors: a missing path, a file where a directory is expected.
    with pytest.raises(NotFoundError) as e:
        sandbox.fs.get_info(f"{d}/nothing")
    assert e.value.code == "NOT_FOUND"
    with pytest.raises(NotFoundError):
        sandbox.fs.rename(f"{d}/nothing", f"{d}/x")
    sandbox.fs.make_dir(f"{d}/dir")
    with pytest.raises(InvalidArgumentError) as e:
        sandbox.fs.rename(f"{d}/dir", f"{d}/b.txt")
    assert "not a directory" in e.value.message.lower(), e.value.message
    with pytest.raises(InvalidArgumentError):
        sandbox.fs.get_info("relative/path")


def test_several_files_in_one_call_and_a_directory_as_one_archive(sandbox: Sandbox) -> None:
    d = fresh_dir(sandbox)
    result = sandbox.fs.write_files({f"{d}/up/a.txt": "alpha", f"{d}/up/deep/b.bin": bytes(range(256))})
    assert (result.path, result.entries, result.bytes_written) == (f"{d}/up", 2, 261)
    assert sandbox.process.exec_(f"cat {d}/up/a.txt; stat -c %a {d}/up/a.txt").stdout == "alpha644\n"
    assert sandbox.fs.read_bytes(f"{d}/up/deep/b.bin") == bytes(range(256))
    sandbox.process.exec_(f"ln -s /etc/hostname {d}/up/link")
    data = sandbox.fs.download_dir(f"{d}/up")
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        members = {m.name: m for m in tar.getmembers()}
        assert sorted(members) == ["a.txt", "deep", "deep/b.bin", "link"]
        assert members["link"].issym() and members["link"].linkname == "/etc/hostname"
        got = tar.extractfile("deep/b.bin")
        assert got is not None and got.read() == bytes(range(256))
    # An archive of the caller's own, unpacked elsewhere.
    assert sandbox.fs.write_archive(f"{d}/copy", data).entries == 4
    assert sandbox.fs.read(f"{d}/copy/a.txt") == "alpha"
    # Errors: a file where a directory is expected, a missing directory, escaping entries.
    with pytest.raises(InvalidArgumentError) as e:
        sandbox.fs.download_dir(f"{d}/up/a.txt")
    assert "not a directory" in e.value.message
    with pytest.raises(NotFoundError):
        sandbox.fs.download_dir(f"{d}/nothing")
    for name in ("../escaped.txt", "ok/../../escaped.txt", "/escaped-abs.txt"):
        with pytest.raises(InvalidArgumentError) as e:
            sandbox.fs.write_archive(f"{d}/target", raw_tar(name, b"no"))
        assert e.value.code == "INVALID_ARGUMENT", name
    through_link = io.BytesIO()
    with tarfile.open(fileobj=through_link, mode="w") as tar:
        link = tarfile.TarInfo("door")
        link.type, link.linkname = tarfile.SYMTYPE, d
        tar.addfile(link)
        add(tar, "door/escaped.txt", b"no")
    with pytest.raises(InvalidArgumentError):
        sandbox.fs.write_archive(f"{d}/target2", through_link.getvalue())
    left = sandbox.process.exec_(f"ls {d}; ls / | grep -c escaped || true").stdout.split()
    assert "escaped.txt" not in left and left[-1] == "0", left


def raw_tar(name: str, data: bytes) -> bytes:
    """A one-file archive whose name is written as given (``tarfile`` keeps ``..`` and a
    leading ``/``)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.GNU_FORMAT) as tar:
        add(tar, name, data)
    return buf.getvalue()


def add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


class Seen:
    """Events a watch delivered, safe to read from the test's thread."""

    def __init__(self) -> None:
        self.events: List[FsEvent] = []
        self.lock = threading.Lock()

    def __call__(self, event: FsEvent) -> None:
        with self.lock:
            self.events.append(event)

    def has(self, kind: str, path: str, new_path: Optional[str] = None) -> bool:
        with self.lock:
            return any(e.type == kind and e.path == path and (new_path is None or e.new_path == new_path) for e in self.events)


def test_watch_reports_changes_recursively_and_stop_frees_it(sandbox: Sandbox) -> None:
    d = fresh_dir(sandbox)
    sandbox.fs.make_dir(f"{d}/old")
    before = inotify_instances(sandbox)
    seen = Seen()
    handle = sandbox.fs.watch(d, seen, recursive=True)
    assert inotify_instances(sandbox) == before + 1
    sandbox.fs.write(f"{d}/a.txt", "1")  # written atomically: a temporary file renamed over it
    sandbox.process.exec_(f"echo more >> {d}/a.txt; mkdir -p {d}/new/deeper && echo x > {d}/new/deeper/f")
    sandbox.fs.rename(f"{d}/a.txt", f"{d}/b.txt")
    sandbox.process.exec_(f"echo y > {d}/old/g; rm {d}/b.txt")
    wait_until(lambda: seen.has("remove", f"{d}/b.txt"), "the removal")
    assert seen.has("write", f"{d}/a.txt")
    assert seen.has("create", f"{d}/new") and seen.has("create", f"{d}/new/deeper/f")
    assert seen.has("rename", f"{d}/a.txt", f"{d}/b.txt")
    assert seen.has("create", f"{d}/old/g")
    handle.stop()
    assert not handle.running and handle.exception is None
    wait_until(lambda: inotify_instances(sandbox) == before, "the guest freeing the watch")
    # Errors: a missing directory, a file where a directory is expected.
    with pytest.raises(NotFoundError):
        sandbox.fs.watch(f"{d}/nothing", seen)
    with pytest.raises(InvalidArgumentError) as e:
        sandbox.fs.watch(f"{d}/old/g", seen)
    assert "not a directory" in e.value.message


def test_an_overflow_is_reported_and_the_watch_goes_on(sandbox: Sandbox) -> None:
    d = fresh_dir(sandbox)
    # A queue of no events for inotify instances made from now on (restored below): every
    # change overflows it, however fast the agent reads. (A small queue and a burst of
    # changes raced the agent's reads, and the agent sometimes won.)
    queue = sandbox.process.exec_("cat /proc/sys/fs/inotify/max_queued_events").stdout.strip()
    sandbox.process.exec_("echo 0 > /proc/sys/fs/inotify/max_queued_events")
    try:
        seen = Seen()
        handle = sandbox.fs.watch(d, seen)
    finally:
        sandbox.process.exec_(f"echo {queue} > /proc/sys/fs/inotify/max_queued_events")
    sandbox.fs.write(f"{d}/first.txt", "lost")
    wait_until(lambda: any(e.type == "overflow" for e in list(seen.events)), "an overflow event")
    assert all(e.type == "overflow" for e in list(seen.events)), "an event the full queue cannot hold"
    # The watch goes on: a later change is reported (as one more overflow: this queue
    # holds nothing) rather than the stream ending at the first.
    # (The first write's changes may each overflow the queue again: wait for them to end.)
    overflows = -1
    for _ in range(30):
        if overflows == len(list(seen.events)):
            break
        overflows = len(list(seen.events))
        time.sleep(1)
    sandbox.fs.write(f"{d}/after.txt", "still watching")
    wait_until(lambda: len(list(seen.events)) > overflows, "an event after the overflow")
    assert list(seen.events)[-1].type == "overflow"
    handle.stop()


def test_a_pause_ends_the_watch_and_a_new_one_works_after_the_resume(server: Server, my_project) -> None:
    sb = Lizard(project="my-project").create("base")
    try:
        sb.fs.make_dir("/tmp/w")
        seen = Seen()
        exits: List[Optional[Exception]] = []
        handle = sb.fs.watch("/tmp/w", seen, on_exit=exits.append)
        sb.fs.write("/tmp/w/before", "1")
        wait_until(lambda: bool(seen.events), "an event before the pause")
        sb.pause()
        wait_until(lambda: bool(exits), "the watch ending at the pause")
        assert isinstance(exits[0], APIConnectionError) and not handle.running
        sb.resume()
        again = Seen()
        handle = sb.fs.watch("/tmp/w", again)
        sb.fs.write("/tmp/w/after", "2")
        after = lambda events: any("/tmp/w/after" in (e.path, e.new_path) for e in list(events))  # noqa: E731
        wait_until(lambda: after(again.events), "an event after the resume")
        assert not after(seen.events)  # the old watch is gone
        handle.stop()
        wait_until(lambda: inotify_instances(sb) == 0, "no watch left in the guest")
    finally:
        sb.kill()


def test_the_async_flavour(sandbox: Sandbox) -> None:
    d = fresh_dir(sandbox)

    async def main() -> None:
        sb = await AsyncSandbox.connect(sandbox.sandbox_id)
        got: List[FsEvent] = []

        async def on_event(event: FsEvent) -> None:
            got.append(event)

        handle = await sb.fs.watch(d, on_event)
        written = await sb.fs.write_files({f"{d}/x.txt": "x", f"{d}/y.txt": "y"})
        assert written.entries == 2
        assert (await sb.fs.get_info(f"{d}/x.txt")).size == 1 and await sb.fs.exists(f"{d}/y.txt")
        assert (await sb.fs.rename(f"{d}/y.txt", f"{d}/z.txt")).name == "z.txt"
        with tarfile.open(fileobj=io.BytesIO(await sb.fs.download_dir(d))) as tar:
            assert sorted(tar.getnames()) == ["x.txt", "z.txt"]
        for _ in range(600):
            if any(e.type == "rename" and e.new_path == f"{d}/z.txt" for e in got):
                break
            await asyncio.sleep(0.05)
        assert any(e.type == "create" and e.path == f"{d}/x.txt" for e in got), got
        assert any(e.type == "rename" and e.new_path == f"{d}/z.txt" for e in got), got
        await handle.stop()
        assert not handle.running
        with pytest.raises(NotFoundError):
            await sb.fs.get_info(f"{d}/y.txt")

    asyncio.run(main())
