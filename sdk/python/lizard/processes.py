"""Background processes and terminals (``sandbox.process.start/list/connect/kill``,
``sandbox.pty.create/connect``): they belong to the sandbox, not to this client, and run on
when it goes away or the sandbox is paused and resumed. A handle names one by pid.

Given callbacks (``on_stdout``/``on_stderr``, ``on_data`` for a terminal), a handle follows
its process at once — the output the sandbox kept (the newest 1 MiB), then live output — on
a daemon thread (``Sandbox``) or a task (``AsyncSandbox``), calling them as output arrives;
``wait()`` joins that follower and returns the ``ProcessResult``. Without callbacks
``wait()`` follows the process itself. Each byte reaches the callbacks once: a reattach
(``wait()`` after the stream broke off) skips what was delivered. The follower stops when
the process ends, when a callback raises (``wait()`` raises that exception; the process
runs on, and a next ``wait()`` follows on from there), when the stream breaks off (a pause:
``wait()`` after the resume follows on), and on ``sandbox.kill()`` or the client's
``close()``. Written once as operations (see ``_ops``)."""

from __future__ import annotations

import builtins
import json
import struct
from typing import TYPE_CHECKING, Any, Dict, List, Mapping, Optional, Union
from urllib.parse import quote

from ._frames import STDERR, STDOUT, Callback, Output, read_exec_frames
from ._ops import F, Flavoured, Join, Op, Spawn, Started, api
from .errors import APIConnectionError, APIError, NotFoundError
from .models import ProcessInfo, ProcessResult

if TYPE_CHECKING:
    from .sandbox import SandboxBase

#: A followed process may run this long (a server: for days) before the call gives up.
FOLLOW_TIMEOUT_S = 7 * 24 * 3600.0
#: What a terminal runs when ``cmd`` names nothing: the login shell, bash where it exists.
DEFAULT_SHELL = "command -v bash >/dev/null && exec bash -l; exec sh -l"
STARTED = 8


def _processes_path(sandbox: "SandboxBase[Any]", rest: str = "") -> str:
    return f"/v1/sandboxes/{quote(sandbox.sandbox_id, safe='')}/processes{rest}"


def command_body(
    cmd: Union[str, List[str]], cwd: Optional[str], envs: Optional[Mapping[str, str]], user: Optional[str]
) -> Dict[str, Any]:
    """The request body of an exec or a start: ``cmd`` a shell string or an argv list."""
    body: Dict[str, Any] = {"argv": list(cmd)} if isinstance(cmd, builtins.list) else {"cmd": cmd}
    if cwd is not None:
        body["cwd"] = cwd
    if envs:
        body["env"] = dict(envs)
    if user is not None:
        body["user"] = user
    return body


class ProcessHandle(Flavoured[F]):
    """A process in a sandbox: ``pid``, ``wait()``, ``kill(signal)``, ``send_stdin(data)``,
    ``close_stdin()``."""

    def __init__(self, sandbox: "SandboxBase[F]", info: ProcessInfo, on_stdout: Callback = None, on_stderr: Callback = None) -> None:
        self._sandbox: SandboxBase[F] = sandbox
        self._http = sandbox._http
        self.info = info
        self._output = Output(on_stdout, on_stderr)
        self._result: Optional[ProcessResult] = None
        #: The background operation following the process (a ``WatchHandle`` or an
        #: ``AsyncWatchHandle``), while one was started and not joined.
        self._follower: Any = None

    @property
    def pid(self) -> int:
        return self.info.pid

    def __repr__(self) -> str:
        return f"ProcessHandle(pid={self.pid}, cmd={self.info.cmd!r})"

    def _path(self, rest: str = "") -> str:
        return _processes_path(self._sandbox, f"/{self.pid}{rest}")

    def _follow(self) -> Op[ProcessResult]:
        """Follow the process to its end from where this handle stopped: the sandbox
        replays what it kept, less the bytes delivered before."""
        stream = yield from self._http.open("GET", self._path("/output"), timeout=FOLLOW_TIMEOUT_S)
        try:
            self._result = yield from read_exec_frames(lambda: self._http.next(stream), self._output, self._output.delivered)
        except APIError as e:
            # An error frame: the stream broke off (a pause, a VM that stopped answering);
            # the process may run on.
            raise APIConnectionError(f"the stream of process {self.pid} broke off: {e}") from e
        return self._result

    def _follow_in_background(self) -> Op[None]:
        yield Started()
        yield from self._follow()

    def _start_following(self) -> Op[None]:
        """Follow the process in the background when there is someone to tell."""
        if any(self._output.callbacks.values()):
            self._follower = yield Spawn(self._follow_in_background())
            self._sandbox._followers = [w for w in self._sandbox._followers if w.running] + [self._follower]

    def _joined(self) -> Op[ProcessResult]:
        """The result: the follower's once it ended, else followed here."""
        follower = self._follower
        if self._result is None and follower is None:
            return (yield from self._follow())
        if follower is not None:
            yield Join(follower)
            if self._follower is follower:
                self._follower = None
        if self._result is None:
            raise follower.exception or APIConnectionError(f"the following of process {self.pid} was stopped")
        return self._result

    def _wait(self, *, on_stdout: Callback = None, on_stderr: Callback = None) -> Op[ProcessResult]:
        """Wait for the process to end: ``ProcessResult(stdout, stderr, exit_code)`` with
        its output (what the sandbox kept: its newest 1 MiB). ``on_stdout``/``on_stderr``
        replace the callbacks given before. A stream that broke off is followed again once:
        a paused sandbox raises ``ConflictError`` (resume it and wait again). An exception
        a callback raised is raised here."""
        for kind, callback in ((STDOUT, on_stdout), (STDERR, on_stderr)):
            if callback is not None:
                self._output.callbacks[kind] = callback
        try:
            return (yield from self._joined())
        except APIConnectionError as e:
            if e is self._output.callback_error:
                raise
        return (yield from self._joined())

    wait = api(_wait)

    @api
    def kill(self, signal: str = "SIGKILL") -> Op[None]:
        """Send a signal (``SIGTERM``, ``TERM``, a number; default ``SIGKILL``) to the
        process's group; an ended process: nothing to do."""
        yield from self._http.call("POST", self._path("/signal"), {"signal": signal})

    @api
    def send_stdin(self, data: Union[str, bytes]) -> Op[None]:
        """Write to the process's stdin (a terminal's keyboard, for a PTY)."""
        content = data.encode() if isinstance(data, str) else bytes(data)
        headers = {"Content-Type": "application/octet-stream"}
        yield from self._http.send("POST", self._path("/stdin"), content=content, headers=headers)

    @api
    def close_stdin(self) -> Op[None]:
        """End the process's stdin (a PTY gets ``^D``)."""
        yield from self._http.call("DELETE", self._path("/stdin"))


class PtyHandle(ProcessHandle[F]):
    """A terminal in a sandbox: a process handle with ``send_input`` and ``resize``; its
    ``wait(on_data=…)`` passes the terminal's output as text."""

    @api
    def send_input(self, data: Union[str, bytes]) -> Op[None]:
        """Type into the terminal."""
        content = data.encode() if isinstance(data, str) else bytes(data)
        headers = {"Content-Type": "application/octet-stream"}
        yield from self._http.send("POST", self._path("/stdin"), content=content, headers=headers)

    @api
    def resize(self, cols: int, rows: int) -> Op[None]:
        """A new terminal size; its programs get ``SIGWINCH``."""
        yield from self._http.call("POST", self._path("/resize"), {"cols": cols, "rows": rows})


def _started(http: Any, method: str, path: str, body: Dict[str, Any]) -> Op[ProcessInfo]:
    """Start a process and read its first frame, ``Started``; the stream closes after it
    (the process runs on)."""
    stream = yield from http.open(method, path, json=body)
    buf = bytearray()
    while len(buf) < 5 or len(buf) < 5 + struct.unpack(">I", bytes(buf[1:5]))[0]:
        chunk = yield from http.next(stream)
        if chunk is None:
            raise APIConnectionError("the process's stream ended before it started")
        buf += chunk
    kind, length = struct.unpack(">BI", bytes(buf[:5]))
    if kind != STARTED:
        raise APIConnectionError(f"the process's stream began with frame {kind}, not Started")
    return ProcessInfo.from_json(json.loads(bytes(buf[5 : 5 + length])))


class BackgroundProcesses(Flavoured[F]):
    """The background half of ``sandbox.process`` (``exec_`` lives in ``sandbox``)."""

    _sandbox: "SandboxBase[F]"

    @api
    def start(
        self,
        cmd: Union[str, List[str]],
        *,
        cwd: Optional[str] = None,
        envs: Optional[Mapping[str, str]] = None,
        user: Optional[str] = None,
        on_stdout: Callback = None,
        on_stderr: Callback = None,
    ) -> Op[ProcessHandle[F]]:
        """Start ``cmd`` (a shell string, or an argv list) in the background: a
        ``ProcessHandle``. ``on_stdout``/``on_stderr`` receive its output as it arrives,
        from now on (see the module doc)."""
        body = command_body(cmd, cwd, envs, user)
        info = yield from _started(self._http, "POST", _processes_path(self._sandbox), body)
        handle = ProcessHandle(self._sandbox, info, on_stdout, on_stderr)
        yield from handle._start_following()
        return handle

    @api
    def list(self) -> Op[List[ProcessInfo]]:
        """The processes the sandbox keeps: running ones and the most recent ended ones."""
        data = yield from self._http.call("GET", _processes_path(self._sandbox))
        return [ProcessInfo.from_json(p) for p in data]

    @api
    def connect(self, pid: int, *, on_stdout: Callback = None, on_stderr: Callback = None) -> Op[ProcessHandle[F]]:
        """A handle on process ``pid`` (started by any client); ``NotFoundError`` when the
        sandbox keeps no such process. ``on_stdout``/``on_stderr`` receive the output the
        sandbox kept, then live output, from now on."""
        data = yield from self._http.call("GET", _processes_path(self._sandbox))
        for p in data:
            if p["pid"] == pid:
                handle = ProcessHandle(self._sandbox, ProcessInfo.from_json(p), on_stdout, on_stderr)
                yield from handle._start_following()
                return handle
        raise NotFoundError(404, "NOT_FOUND", f"no process {pid}")

    @api
    def kill(self, pid: int, signal: str = "SIGKILL") -> Op[None]:
        """Send a signal (default ``SIGKILL``) to process ``pid``'s group."""
        yield from self._http.call("POST", _processes_path(self._sandbox, f"/{pid}/signal"), {"signal": signal})


class Pty(Flavoured[F]):
    """``sandbox.pty``: terminals in the sandbox."""

    def __init__(self, sandbox: "SandboxBase[F]") -> None:
        self._sandbox: SandboxBase[F] = sandbox
        self._http = sandbox._http

    @api
    def create(
        self,
        *,
        cols: int = 80,
        rows: int = 24,
        cmd: str = DEFAULT_SHELL,
        cwd: Optional[str] = None,
        envs: Optional[Mapping[str, str]] = None,
        user: Optional[str] = None,
        on_data: Callback = None,
    ) -> Op[PtyHandle[F]]:
        """A terminal of ``cols`` × ``rows`` running ``cmd`` (default the login shell);
        ``on_data`` receives its output as it arrives, from now on."""
        body = command_body(cmd, cwd, envs, user)
        body["pty"] = {"cols": cols, "rows": rows}
        info = yield from _started(self._http, "POST", _processes_path(self._sandbox), body)
        handle = PtyHandle(self._sandbox, info, on_data)
        yield from handle._start_following()
        return handle

    @api
    def connect(self, pid: int, *, on_data: Callback = None) -> Op[PtyHandle[F]]:
        """A handle on terminal ``pid``: ``on_data`` receives the output the sandbox kept,
        then live output, from now on."""
        handle = PtyHandle(self._sandbox, ProcessInfo(pid=pid, cmd="", started_at_ms=0, pty=True), on_data)
        yield from handle._start_following()
        return handle
