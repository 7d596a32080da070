"""The async flavour (``AsyncLizard``, ``AsyncSandbox``) against a real server: every
namespace once, a sandbox's files and processes, its life (connect, timeout, pause, resume,
fork) and calls running concurrently on one client. One sandbox serves the module."""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Callable, Iterator, List

import pytest

from conftest import Server
from lizard import (
    AsyncLizard,
    AsyncSandbox,
    AuthenticationError,
    ConflictError,
    InvalidArgumentError,
    NotFoundError,
    ProcessResult,
    Sandbox,
)


@pytest.fixture(scope="module")
def sandbox_id(server: Server, my_project) -> Iterator[str]:
    async def create() -> str:
        async with AsyncLizard(project="my-project") as lz:
            return (await lz.create("base")).sandbox_id

    sid = asyncio.run(create())
    yield sid
    try:
        Sandbox.connect(sid).kill()
    except NotFoundError:
        pass


def test_exec_plain_streamed_and_concurrent(sandbox_id: str) -> None:
    async def main() -> None:
        async with AsyncLizard(project="my-project") as lz:
            sb = await lz.connect(sandbox_id)
            r = await sb.process.exec_("echo out; echo err >&2; exit 3")
            assert isinstance(r, ProcessResult) and (r.stdout, r.stderr, r.exit_code) == ("out\n", "err\n", 3)
            r = await sb.process.exec_(["printf", "%s|", "a b", "c"], cwd="/tmp", envs={"X": "1"})
            assert r.stdout == "a b|c|"
            assert (await sb.process.exec_("sleep 30", timeout_ms=500)).timed_out
            # Streamed: an async callback is awaited for each piece as it arrives.
            chunks: List[str] = []

            async def on_stdout(text: str) -> None:
                chunks.append(text)

            r = await sb.process.exec_("for i in 1 2 3; do echo $i; sleep 0.3; done", on_stdout=on_stdout)
            assert r.stdout == "1\n2\n3\n" and len(chunks) >= 2 and "".join(chunks) == r.stdout, chunks
            # Calls run concurrently on one client: three 2-second sleeps take well under 6 s.
            start = time.monotonic()
            results = await asyncio.gather(*(sb.process.exec_(f"sleep 2; echo {i}") for i in range(3)))
            assert [x.stdout for x in results] == ["0\n", "1\n", "2\n"]
            assert time.monotonic() - start < 5.5

    asyncio.run(main())


def test_fs_round_trip(sandbox_id: str) -> None:
    async def main() -> None:
        sb = await AsyncSandbox.connect(sandbox_id)
        d = f"/tmp/sdk-async-{uuid.uuid4().hex[:6]}"
        await sb.fs.make_dir(f"{d}/sub")
        await sb.fs.write(f"{d}/a.txt", "héllo\n")
        await sb.fs.write(f"{d}/b.bin", bytes(range(256)), mode=0o600)
        assert await sb.fs.read(f"{d}/a.txt") == "héllo\n"
        assert await sb.fs.read_bytes(f"{d}/b.bin") == bytes(range(256))
        entries = await sb.fs.list(d)
        assert [(e.name, e.type) for e in entries] == [("a.txt", "file"), ("b.bin", "file"), ("sub", "dir")]
        assert entries[1].mode & 0o777 == 0o600
        await sb.fs.remove(f"{d}/a.txt")
        with pytest.raises(NotFoundError) as e:
            await sb.fs.read(f"{d}/a.txt")
        assert e.value.code == "NOT_FOUND"

    asyncio.run(main())


def test_connect_list_and_set_timeout(sandbox_id: str) -> None:
    async def main() -> None:
        sb = await AsyncSandbox.connect(sandbox_id)
        assert sb.state == "running" and await sb.is_running()
        assert sandbox_id in [s.sandbox_id for s in await AsyncSandbox.list()]
        before = sb.info.end_at
        await sb.set_timeout(3_600_000)
        assert sb.info.end_at and sb.info.end_at > (before or "")
        assert (await sb.get_info()).sandbox_id == sandbox_id
        with pytest.raises(InvalidArgumentError) as e:
            await sb.set_timeout(0)
        assert e.value.code == "INVALID_ARGUMENT"

    asyncio.run(main())


async def _until(what: Callable[[], bool], seen: List[str]) -> None:
    deadline = time.monotonic() + 60
    while not what():
        assert time.monotonic() < deadline, "".join(seen)
        await asyncio.sleep(0.1)


def test_callbacks_fire_as_output_arrives_without_a_wait(sandbox_id: str) -> None:
    async def main() -> None:
        lz = AsyncLizard(project="my-project")
        sb = await lz.connect(sandbox_id)
        out: List[str] = []

        async def on_stdout(text: str) -> None:
            out.append(text)

        h = await sb.process.start("echo ready; read x; echo got-$x", on_stdout=on_stdout)
        await _until(lambda: out == ["ready\n"], out)
        await h.send_stdin("7\n")
        r = await h.wait()
        assert (r.stdout, "".join(out)) == ("ready\ngot-7\n", "ready\ngot-7\n")
        # A callback that raises: wait() raises it; a next wait() follows on from there.
        def boom(text: str) -> None:
            raise ValueError(text)

        bad = await sb.process.start("echo one; read x; echo two", on_stdout=boom)
        with pytest.raises(ValueError, match="one"):
            await bad.wait()
        await bad.send_stdin("go\n")
        rest: List[str] = []
        r = await bad.wait(on_stdout=rest.append)
        assert (r.stdout, rest) == ("one\ntwo\n", ["two\n"])
        # A terminal's follower, and a reattached one, while nobody waits.
        screen: List[str] = []
        pty = await sb.pty.create(cols=50, rows=10, on_data=screen.append)
        await pty.send_input("stty size\n")
        await _until(lambda: "10 50" in "".join(screen), screen)
        again: List[str] = []
        await sb.pty.connect(pty.pid, on_data=again.append)
        await _until(lambda: "10 50" in "".join(again), again)
        # Closing the client stops its followers: no task is left behind.
        await lz.close()
        assert asyncio.all_tasks() == {asyncio.current_task()}
        await (await AsyncSandbox.connect(sandbox_id)).process.kill(pty.pid)

    asyncio.run(main())


def test_pause_resume_and_fork(sandbox_id: str) -> None:
    async def main() -> None:
        sb = await AsyncSandbox.connect(sandbox_id)
        await sb.process.exec_("echo kept > /tmp/kept-async; sleep 600 >/dev/null 2>&1 &")
        await sb.pause()
        assert sb.state == "paused"
        await sb.resume()
        assert sb.state == "running"
        assert (await sb.process.exec_("pgrep -x sleep")).exit_code == 0  # the process survived
        [copy] = await sb.fork()
        assert isinstance(copy, AsyncSandbox) and copy.sandbox_id != sandbox_id
        assert await copy.fs.read("/tmp/kept-async") == "kept\n"
        # kill() stops the followers of the sandbox's processes: no task is left.
        seen: List[str] = []
        h = await copy.process.start("echo b; exec sleep 600", on_stdout=seen.append)
        await _until(lambda: seen == ["b\n"], seen)
        await copy.kill()
        assert asyncio.all_tasks() == {asyncio.current_task()}
        with pytest.raises(NotFoundError):
            await h.wait()
        assert not await copy.is_running()

    asyncio.run(main())


def test_namespaces(server: Server) -> None:
    async def main() -> None:
        async with AsyncLizard(project="my-project") as lz:
            me = await lz.whoami()
            assert not me.scoped and me.key_name == "owner"
            assert [r.id for r in await lz.regions.list()] == ["local"]
            name = f"ns-async-{uuid.uuid4().hex[:6]}"
            ws = await lz.workspaces.create(name=name)
            assert (await lz.workspaces.find(name)).id == ws.id
            prj = await lz.projects.create(workspace_id=ws.id, name="alpha")
            assert (await lz.projects.update(prj.id, name="beta")).name == "beta"
            assert (await lz.projects.get(prj.id)).slug == "alpha"
            assert [p.id for p in await lz.projects.list(workspace_id=ws.id)] == [prj.id]
            with pytest.raises(ConflictError):
                await lz.workspaces.delete(ws.id)  # not empty
            key = await lz.api_keys.create(name=name, projects=[prj.id])
            assert key.key and key.id in [k.id for k in await lz.api_keys.list()]
            async with AsyncLizard(api_key=key.key) as scoped:
                assert (await scoped.whoami()).projects == [prj.id]
            await lz.api_keys.delete(key.id)
            with pytest.raises(AuthenticationError):
                await AsyncLizard(api_key=key.key).whoami()
            await lz.projects.delete(prj.id)
            await lz.workspaces.delete(ws.id)
            # Billing and metrics.
            balance = await lz.billing.balance()
            assert balance["currency"] == "USD"
            assert len((await lz.billing.transactions(limit=2))["items"]) <= 2
            assert (await lz.billing.summary(granularity="day", periods=1))["granularity"] == "day"
            assert "sandboxes" in (await lz.billing.live()).raw
            assert (await lz.metrics.get(project_id=await lz.project_id())).raw is not None
            assert (await lz.metrics()).raw is not None
            # Templates: the built-ins, and a typed error.
            assert (await lz.templates.get("base")).builtin
            assert "base" in [t.name for t in await lz.templates.list()]
            with pytest.raises(NotFoundError):
                await lz.templates.get("nope")
            # The raw client.
            assert (await lz.platform.get("/v1/whoami"))["keyName"] == "owner"

    asyncio.run(main())
