"""Background processes, terminals and port waits against a real server (one ``base``
sandbox for the module; creates are slow under TCG), in both flavours: the blocking one
through a pause and resume in the middle of a followed process and of a PTY session, the
async one for the same calls as coroutines."""

from __future__ import annotations

import asyncio
import re
import threading
import time
from typing import Callable, Iterator, List

import httpx
import pytest

from conftest import Server
from lizard import AsyncLizard, ConflictError, ListeningPort, Lizard, NotFoundError, ProcessInfo, Sandbox, TimedOutError


@pytest.fixture(scope="module")
def sandbox(server: Server, my_project) -> Iterator[Sandbox]:
    sb = Lizard(project="my-project").create("base", timeout_ms=15 * 60_000)
    yield sb
    try:
        sb.kill()
    except NotFoundError:
        pass


def test_start_stdin_list_wait_and_kill(sandbox: Sandbox) -> None:
    seen: List[str] = []
    h = sandbox.process.start("echo out; echo err >&2; read line; echo \"got $line\"; exit 3", on_stdout=seen.append)
    assert h.pid > 1
    listed = sandbox.process.list()
    assert any(isinstance(p, ProcessInfo) and p.pid == h.pid and p.exit_code is None for p in listed), listed
    h.send_stdin("hello\n")
    r = h.wait()
    assert (r.stdout, r.stderr, r.exit_code) == ("out\ngot hello\n", "err\n", 3)
    assert "".join(seen) == r.stdout
    assert next(p for p in sandbox.process.list() if p.pid == h.pid).exit_code == 3
    # EOF, a signal from another client's handle, errors.
    cat = sandbox.process.start("cat; echo done")
    cat.send_stdin(b"abc")
    cat.close_stdin()
    assert cat.wait().stdout == "abcdone\n"
    with pytest.raises(ConflictError):
        cat.send_stdin("late")
    sleeper = sandbox.process.start(["sh", "-c", "echo first; exec sleep 600"])
    # Once it printed and became `sleep`:
    ready = f"for i in $(seq 100); do grep -q sleep /proc/{sleeper.pid}/cmdline && exit 0; sleep 0.1; done; exit 1"
    assert sandbox.process.exec_(ready).exit_code == 0
    other = Sandbox.connect(sandbox.sandbox_id).process.connect(sleeper.pid)
    other.kill("SIGTERM")
    r = other.wait()
    assert (r.stdout, r.exit_code) == ("first\n", 143)
    with pytest.raises(NotFoundError):
        sandbox.process.connect(999999)


def test_wait_for_port_and_timed_out(sandbox: Sandbox, server: Server) -> None:
    sandbox.fs.write("/app/py-server.js", "require('http').createServer((_, r) => r.end('py ok')).listen(3100)")
    sandbox.process.start("node /app/py-server.js")
    sandbox.wait_for_port(3100, timeout_ms=60_000)
    ports = sandbox.list_ports()
    web = next(p for p in ports if p.port == 3100)
    assert web.pid is not None and "py-server.js" in (web.cmd or ""), web
    assert web.address in ("0.0.0.0", "::"), web
    # The platform's own guest ports (the agent's API forward) are never a user's.
    assert not any(p.port in (49171, 49999) for p in ports), ports
    r = httpx.get(f"http://{server.proxy}/", headers={"Host": sandbox.get_host(3100)}, timeout=10)
    assert (r.status_code, r.text) == (200, "py ok")
    started = time.monotonic()
    with pytest.raises(TimedOutError) as e:
        sandbox.wait_for_port(3999, timeout_ms=500)
    assert e.value.code == "TIMED_OUT" and time.monotonic() - started >= 0.5


def _until(what: Callable[[], bool], seen: List[str]) -> None:
    deadline = time.monotonic() + 60
    while not what():
        assert time.monotonic() < deadline, "".join(seen)
        time.sleep(0.1)


def _followers() -> int:
    return sum(t.name == "lizard-watch" for t in threading.enumerate())


@pytest.mark.filterwarnings("error::pytest.PytestUnhandledThreadExceptionWarning")
def test_callbacks_fire_as_output_arrives_without_a_wait(sandbox: Sandbox) -> None:
    before = _followers()
    out: List[str] = []
    err: List[str] = []
    h = sandbox.process.start("echo ready; echo oops >&2; read x; echo got-$x", on_stdout=out.append, on_stderr=err.append)
    _until(lambda: "".join(out) == "ready\n" and "".join(err) == "oops\n", out + err)
    # Another client's handle follows at once too: the kept output, then live output.
    again: List[str] = []
    other = Sandbox.connect(sandbox.sandbox_id).process.connect(h.pid, on_stdout=again.append)
    _until(lambda: "".join(again) == "ready\n", again)
    h.send_stdin("7\n")
    r = h.wait()
    assert (r.stdout, r.stderr, r.exit_code) == ("ready\ngot-7\n", "oops\n", 0)
    assert ("".join(out), "".join(err)) == (r.stdout, r.stderr)  # each byte once
    assert other.wait().stdout == "".join(again) == r.stdout
    assert h.wait() is r  # the result is kept
    # A callback that raises: wait() raises it; the process runs on, and a next wait()
    # follows on from there (what reached the callback is not sent again).
    def boom(text: str) -> None:
        raise ValueError(text)

    bad = sandbox.process.start("echo one; read x; echo two", on_stdout=boom)
    with pytest.raises(ValueError, match="one"):
        bad.wait()
    assert next(p for p in sandbox.process.list() if p.pid == bad.pid).exit_code is None
    bad.send_stdin("go\n")
    rest: List[str] = []
    r = bad.wait(on_stdout=rest.append)
    assert (r.stdout, rest) == ("one\ntwo\n", ["two\n"])
    # kill(): the follower sees the exit and ends.
    sleeper = sandbox.process.start("echo z; exec sleep 600", on_stdout=out.append)
    _until(lambda: "".join(out).endswith("z\n"), out)
    sleeper.kill()
    assert sleeper.wait().exit_code == 137
    assert _followers() == before


@pytest.mark.filterwarnings("error::pytest.PytestUnhandledThreadExceptionWarning")
def test_closing_the_client_or_killing_the_sandbox_stops_followers(sandbox: Sandbox) -> None:
    before = _followers()
    lz = Lizard(project="my-project")
    seen: List[str] = []
    h = lz.connect(sandbox.sandbox_id).process.start("echo a; exec sleep 600", on_stdout=seen.append)
    _until(lambda: seen == ["a\n"], seen)
    assert _followers() == before + 1
    lz.close()
    assert _followers() == before
    sandbox.process.kill(h.pid)
    # The sandbox's kill() stops its handles' followers before the sandbox goes.
    other = Lizard(project="my-project").create("base", timeout_ms=5 * 60_000)
    p = other.process.start("echo b; exec sleep 600", on_stdout=seen.append)
    _until(lambda: seen == ["a\n", "b\n"], seen)
    other.kill()
    assert _followers() == before
    with pytest.raises(NotFoundError):
        p.wait()


@pytest.mark.filterwarnings("error::pytest.PytestUnhandledThreadExceptionWarning")
def test_pty_and_a_pause_in_the_middle(sandbox: Sandbox) -> None:
    screen: List[str] = []
    pty = sandbox.pty.create(cols=100, rows=30, on_data=screen.append)
    counted: List[str] = []
    counter = sandbox.process.start("for i in $(seq 1 40); do echo $i; sleep 0.1; done", on_stdout=counted.append)
    # Wait for the terminal on a thread while the sandbox is paused and resumed under it.
    outcome: List[object] = []
    waiter = threading.Thread(target=lambda: outcome.append(_wait_catching(pty)))
    waiter.start()

    def until(what: str) -> None:
        _until(lambda: what in "".join(screen), screen)

    pty.send_input("tty; stty size; echo before-$((1+1))\n")
    until("before-2")
    text = "".join(screen)
    assert "/dev/pts/" in text and "30 100" in text, text
    pty.resize(120, 40)
    pty.send_input("stty size\n")
    until("40 120")
    _until(lambda: len(counted) > 0, counted)
    sandbox.pause()
    # The followers' streams broke off: the waiting wait() tried once more, and a paused
    # sandbox answers that with ConflictError.
    waiter.join(timeout=60)
    assert outcome and isinstance(outcome[0], ConflictError), outcome
    sandbox.resume()
    # The same shell and the same counter run on after the resume.
    again: List[str] = []
    back = sandbox.pty.connect(pty.pid, on_data=again.append)
    back.send_input("echo after-$((20+1)); exit 5\n")
    r = back.wait()
    assert r.exit_code == 5 and "before-2" in r.stdout and "after-21" in r.stdout, r.stdout
    assert "".join(again) == r.stdout
    # wait() after the resume follows on where each follower stopped: every byte reached
    # the callbacks once, across the pause.
    assert pty.wait().stdout == "".join(screen) == r.stdout
    r = counter.wait()
    assert (r.stdout, r.exit_code) == ("".join(f"{i}\n" for i in range(1, 41)), 0)
    assert "".join(counted) == r.stdout


#: A full-screen editor for the test below. The built-in images have no vi, vim, nano or
#: busybox (`base` is Debian's `--variant=apt` plus its recipe's packages); what they have is
#: Python's curses, so the editor is the standard library's ``curses.textpad.Textbox``:
#: ncurses on the terminal's terminfo (``TERM=xterm-256color``), cbreak mode, the keypad,
#: cursor addressing, and ``SIGWINCH`` arriving as ``KEY_RESIZE``. ^G saves and quits.
EDITOR = """
import curses, curses.textpad, sys

def main(screen):
    screen.addstr(0, 0, "editing " + sys.argv[1] + ": ^G saves and quits")
    screen.refresh()
    lines, cols = screen.getmaxyx()
    box = curses.textpad.Textbox(curses.newwin(lines - 2, cols - 1, 1, 0))

    def key(ch):
        if ch == curses.KEY_RESIZE:
            curses.update_lines_cols()
            screen.addstr(0, 0, "size %dx%d" % (curses.LINES, curses.COLS))
            screen.refresh()
            return 0
        return ch

    text = box.edit(key)
    with open(sys.argv[1], "w") as f:
        f.write("".join(line.rstrip() + "\\n" for line in text.splitlines() if line.strip()))

curses.wrapper(main)
"""


def test_a_full_screen_editor_in_a_pty_types_saves_and_quits(sandbox: Sandbox) -> None:
    sandbox.fs.write("/tmp/editor.py", EDITOR)
    screen: List[str] = []
    shown = lambda: re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", "".join(screen))  # noqa: E731
    pty = sandbox.pty.create(cols=80, rows=24, cmd="python3 /tmp/editor.py /tmp/note.txt", on_data=screen.append)
    _until(lambda: "^G saves and quits" in shown(), screen)
    pty.send_input("hello from the pty")
    _until(lambda: "the pty" in shown(), screen)
    pty.resize(120, 40)
    _until(lambda: "size 40x120" in shown(), screen)
    pty.send_input("\nsecond line\x07")
    r = pty.wait()
    assert r.exit_code == 0, r.stdout
    assert sandbox.fs.read("/tmp/note.txt") == "hello from the pty\nsecond line\n"


def _wait_catching(pty: object) -> object:
    try:
        return pty.wait()  # type: ignore[attr-defined]
    except Exception as e:  # noqa: BLE001 - the outcome is checked by the test
        return e


def test_the_async_flavour(sandbox: Sandbox) -> None:
    async def main() -> None:
        async with AsyncLizard(project="my-project") as lz:
            sb = await lz.connect(sandbox.sandbox_id)
            chunks: List[str] = []

            async def on_stdout(text: str) -> None:
                chunks.append(text)

            h = await sb.process.start("read x; echo async-$x", on_stdout=on_stdout)
            assert any(p.pid == h.pid for p in await sb.process.list())
            await h.send_stdin("7\n")
            r = await h.wait()
            assert (r.stdout, r.exit_code, "".join(chunks)) == ("async-7\n", 0, "async-7\n")
            pty = await sb.pty.create(cols=50, rows=10)
            await pty.send_input("stty size; exit 2\n")
            r = await pty.wait()
            assert r.exit_code == 2 and "10 50" in r.stdout, r.stdout
            with pytest.raises(TimedOutError):
                await sb.wait_for_port(3998, timeout_ms=300)
            assert all(isinstance(p, ListeningPort) for p in await sb.list_ports())

    asyncio.run(main())
