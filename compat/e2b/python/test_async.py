"""E2B's async Python SDK (`AsyncSandbox`) on Lizard: create, live output, files, pause
and connect, kill."""

from __future__ import annotations

import asyncio
import time

import pytest
from e2b import AsyncSandbox
from e2b.exceptions import NotFoundException


def test_the_async_sdk_runs_commands_and_moves_files(e2b_env):
    async def scenario() -> None:
        sbx = await AsyncSandbox.create(metadata={"flavour": "async"})
        try:
            seen: list[tuple[float, str]] = []
            started = time.monotonic()
            r = await sbx.commands.run(
                "echo one; sleep 2; echo two", on_stdout=lambda line: seen.append((time.monotonic() - started, line))
            )
            assert r.stdout == "one\ntwo\n" and r.exit_code == 0
            assert [line for _, line in seen] == ["one\n", "two\n"] and seen[1][0] - seen[0][0] > 1.5, seen
            await sbx.files.write("/tmp/async.txt", "from asyncio")
            assert await sbx.files.read("/tmp/async.txt") == "from asyncio"
            results = await asyncio.gather(*(sbx.commands.run(f"echo {i}") for i in range(5)))
            assert [x.stdout for x in results] == [f"{i}\n" for i in range(5)]
            info = await sbx.get_info()
            assert info.metadata["flavour"] == "async"
        finally:
            assert await sbx.kill() is True
        with pytest.raises(NotFoundException):
            await AsyncSandbox.connect(sbx.sandbox_id)

    asyncio.run(scenario())


def test_auto_pause_at_the_timeout_and_resume_on_connect(e2b_env):
    from conftest import raw_create
    from e2b import Sandbox

    # As the SDKs send `lifecycle={"on_timeout": "pause"}` (or `auto_pause=True`).
    sid = raw_create(e2b_env, timeout=5, autoPause=True)["sandboxID"]
    try:
        # A connect only ever moves the end later: 5 s from now keeps it near.
        Sandbox.connect(sid, timeout=5).files.write("kept.txt", "still here")
        deadline = time.monotonic() + 120
        while Sandbox.get_info(sid).state.value != "paused":
            assert time.monotonic() < deadline, "the timeout did not pause the sandbox"
            time.sleep(1)
        again = Sandbox.connect(sid, timeout=60)
        assert Sandbox.get_info(sid).state.value == "running"
        assert again.files.read("kept.txt") == "still here"
    finally:
        Sandbox.kill(sid)


def test_an_async_watch_streams_events(e2b_env):
    async def scenario() -> None:
        sbx = await AsyncSandbox.create()
        try:
            await sbx.files.make_dir("/tmp/aw")
            seen: list[tuple[str, str]] = []
            got = asyncio.Event()

            def on_event(e) -> None:
                seen.append((e.name, e.type.value))
                if e.name == "done.txt":
                    got.set()

            handle = await sbx.files.watch_dir("/tmp/aw", on_event=on_event)
            await sbx.files.write("/tmp/aw/x.txt", "1")
            await sbx.commands.run("echo 2 >> /tmp/aw/x.txt; touch /tmp/aw/done.txt")
            await asyncio.wait_for(got.wait(), 30)
            await handle.stop()
            assert ("x.txt", "create") in seen and ("x.txt", "write") in seen, seen
        finally:
            await sbx.kill()

    asyncio.run(scenario())
