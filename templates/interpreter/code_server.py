"""Lizard's in-guest code service: stateful code execution for `run_code` / `runCode`.

It listens on guest loopback only (127.0.0.1:49999, `lizard_api::code::CODE_SERVICE_PORT`):
the public sandbox-URL proxy refuses that port, and the control plane reaches it through
the node's tunnel, so the only door to it is the authenticated API.

A *context* is one live interpreter whose variables persist between executions:
  python      an IPython kernel (ipykernel), driven over the Jupyter kernel protocol by
              jupyter_client; every MIME bundle the kernel displays becomes a result.
  javascript  a Node.js process running js_context.js (no JS Jupyter kernel installs
              cleanly on Debian): each cell is a script in one V8 context.
  typescript  the same, each cell's types stripped by Node.js before it runs.
  r           an R process running r_context.R (Debian has no R Jupyter kernel): each
              cell is evaluated in one global environment, its plots as PNG.
  bash        a bash process; each cell is sourced, so variables and `cd` persist.

An execution answers one JSON object per line (application/x-ndjson) as output happens:
  {"type":"stdout","text":…}  {"type":"stderr","text":…}
  {"type":"result","data":{"text/plain":…,"image/png":…},"isMainResult":bool}
  {"type":"error","name":…,"value":…,"traceback":…}
  {"type":"end","executionCount":N}              always last
A timeout interrupts the context (its state is kept) and is reported as an error named
TimeoutError; a caller that closes its connection before the end interrupts it the same
way (E2B's add-on gives up by disconnecting). A context that dies while running is
reported as DeadKernelError and is started afresh by the next execution.

Routes: GET /health; POST /execute; GET|POST /contexts; DELETE /contexts/{id};
POST /contexts/{id}/restart. Errors: {"code": "NOT_FOUND"|"INVALID_ARGUMENT"|…, "message"}.

At start the default Python context's kernel is started before the port is bound, so a
template snapshot taken once the port answers already holds a warm kernel.
"""

from __future__ import annotations

import codecs
import json
import os
import queue
import re
import secrets
import select
import selectors
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Callable, Iterator, Optional

HOST = "127.0.0.1"
PORT = int(os.environ.get("LIZARD_CODE_PORT", "49999"))
HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_TIMEOUT_MS = 300_000
MAX_BODY = 16 * 1024 * 1024
# After an interrupt, how long the context may take to stop before it is declared dead.
INTERRUPT_GRACE_S = 10.0
ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")

Event = dict[str, Any]
Emit = Callable[[Event], None]


class ApiError(Exception):
    """An answer with a stable code, shown to the caller."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


def timeout_error(ms: int, what: str) -> Event:
    return {
        "type": "error",
        "name": "TimeoutError",
        "value": f"execution exceeded its timeout of {ms} ms; {what}",
        "traceback": "",
    }


def dead_error(detail: str) -> Event:
    return {
        "type": "error",
        "name": "DeadKernelError",
        "value": f"the context's interpreter died while running this code ({detail}); "
        "the next execution starts a new one, and its variables are lost",
        "traceback": "",
    }


class Execution:
    """One call of `/execute`; `cancelled` once its caller has gone."""

    __slots__ = ("cancelled",)

    def __init__(self) -> None:
        self.cancelled = False


class Context:
    """One interpreter. `lock` serialises executions: a context runs one cell at a time.

    `deadline` is when the running cell is interrupted (its timeout); `cancel` brings it
    forward when the caller has gone, as E2B's code interpreter cancels an execution whose
    client disconnected (its SDK's own timeout): the cell is stopped as on a timeout, and the
    context is free for the next call."""

    language = ""

    def __init__(self, cwd: str) -> None:
        self.id = secrets.token_hex(8)
        self.cwd = cwd
        self.lock = threading.Lock()
        self.count = 0
        self.dead = False
        self.deadline = 0.0
        self.running: Optional[object] = None
        self.state_lock = threading.Lock()

    def begin(self, execution: "Execution", timeout_ms: int) -> None:
        """`execution` runs now, to be interrupted after `timeout_ms` (at once if it was
        cancelled meanwhile)."""
        with self.state_lock:
            self.running = execution
            self.deadline = time.monotonic() + (0 if execution.cancelled else timeout_ms / 1000)

    def end(self) -> None:
        with self.state_lock:
            self.running = None

    def cancel(self, execution: "Execution") -> None:
        """Stop `execution` now if it runs, or as soon as it begins: the caller may go away
        before its cell has the context (another cell holds it, or the worker has not
        started yet)."""
        with self.state_lock:
            execution.cancelled = True
            if self.running is execution:
                self.deadline = time.monotonic()

    def describe(self) -> dict[str, str]:
        return {"id": self.id, "language": self.language, "cwd": self.cwd}

    def start(self) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def restart(self) -> None:
        self.stop()
        self.count = 0
        self.start()
        self.dead = False

    def execute(self, code: str, envs: dict[str, str], timeout_ms: int, emit: Emit) -> None:
        raise NotImplementedError


#: What the default Python context runs before the port answers (PythonContext.warm_up).
WARM_UP = """
import io
import numpy, pandas, matplotlib.pyplot
from matplotlib.figure import Figure
from matplotlib.backends.backend_agg import FigureCanvasAgg
figure = Figure()
figure.add_subplot().plot([0, 1], [1, 0])
FigureCanvasAgg(figure).print_png(io.BytesIO())
"""


class PythonContext(Context):
    """An ipykernel, spoken to over the Jupyter protocol (jupyter_client)."""

    language = "python"

    def start(self) -> None:
        from jupyter_client import KernelManager

        self.km = KernelManager(kernel_name="python3")
        self.km.start_kernel(cwd=self.cwd, env=dict(os.environ))
        self.kc = self.km.client()
        self.kc.start_channels()
        self.kc.wait_for_ready(timeout=300)
        # matplotlib's inline backend: a figure shown or left at the end of a cell becomes a
        # PNG result, of exactly the figure's size (IPython would crop it to a tight box).
        self._run_silent("%matplotlib inline\n%config InlineBackend.print_figure_kwargs = {'bbox_inches': None}")
        # Each figure's data beside its PNG (lizard_charts.py), without a name left in the
        # user's namespace.
        self._run_silent(
            "__import__('sys').path.append('/opt/lizard/code');"
            " __import__('lizard_charts').register(get_ipython())"
        )

    def warm_up(self) -> None:
        """The data stack imported and one figure drawn to PNG (fonts loaded, the Agg
        backend's paths run), in a namespace of its own: a sandbox restored from the
        template snapshot finds them done, and the user's names untouched."""
        self._run_silent(f"exec({WARM_UP!r}, {{}})", limit_s=300.0)

    def stop(self) -> None:
        try:
            self.kc.stop_channels()
        except Exception:
            pass
        try:
            self.km.shutdown_kernel(now=True)
        except Exception:
            pass

    def _run_silent(self, code: str, limit_s: float = 60.0) -> None:
        msg_id = self.kc.execute(code, silent=True, store_history=False)
        deadline = time.monotonic() + limit_s
        while time.monotonic() < deadline:
            try:
                msg = self.kc.get_shell_msg(timeout=0.5)
            except queue.Empty:
                if not self.km.is_alive():
                    return
                continue
            if msg["parent_header"].get("msg_id") == msg_id:
                return

    def execute(self, code: str, envs: dict[str, str], timeout_ms: int, emit: Emit) -> None:
        if envs:
            self._run_silent(
                "import os as __lz_os\n"
                f"__lz_saved_env = {{k: __lz_os.environ.get(k) for k in {list(envs)!r}}}\n"
                f"__lz_os.environ.update({envs!r})\n"
            )
        try:
            self._execute(code, timeout_ms, emit)
        finally:
            if envs and not self.dead:
                self._run_silent(
                    "for __lz_k, __lz_v in __lz_saved_env.items():\n"
                    "    __lz_os.environ.pop(__lz_k, None) if __lz_v is None else __lz_os.environ.__setitem__(__lz_k, __lz_v)\n"
                    "del __lz_saved_env\n"
                )

    def _execute(self, code: str, timeout_ms: int, emit: Emit) -> None:
        msg_id = self.kc.execute(code, store_history=True, allow_stdin=False, stop_on_error=True)
        interrupted_at: Optional[float] = None
        reported = False
        while True:
            now = time.monotonic()
            if interrupted_at is None and now >= self.deadline:
                self.km.interrupt_kernel()
                interrupted_at = now
            if interrupted_at is not None and now - interrupted_at > INTERRUPT_GRACE_S:
                # The interrupt did not stop it: only a new kernel will.
                emit(timeout_error(timeout_ms, "the kernel did not stop when interrupted and was restarted"))
                self.dead = True
                return
            try:
                msg = self.kc.get_iopub_msg(timeout=0.2)
            except queue.Empty:
                if not self.km.is_alive():
                    self.dead = True
                    emit(dead_error("the kernel process exited"))
                    return
                continue
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            kind, content = msg["msg_type"], msg["content"]
            if kind == "stream":
                emit({"type": "stdout" if content["name"] == "stdout" else "stderr", "text": content["text"]})
            elif kind == "execute_result":
                emit({"type": "result", "data": content["data"], "isMainResult": True})
            elif kind == "display_data":
                emit({"type": "result", "data": content["data"], "isMainResult": False})
            elif kind == "error":
                if interrupted_at is not None and content["ename"] == "KeyboardInterrupt":
                    emit(timeout_error(timeout_ms, "the kernel was interrupted and keeps its state"))
                    reported = True
                else:
                    emit(
                        {
                            "type": "error",
                            "name": content["ename"],
                            "value": content["evalue"],
                            "traceback": ANSI.sub("", "\n".join(content["traceback"])),
                        }
                    )
            elif kind == "execute_input":
                self.count = int(content.get("execution_count") or self.count + 1)
            elif kind == "status" and content["execution_state"] == "idle":
                if interrupted_at is not None and not reported:
                    emit(timeout_error(timeout_ms, "the kernel was interrupted and keeps its state"))
                return


class ProcessContext(Context):
    """A child process fed one cell at a time, its stdout/stderr read as they come, and a
    private pipe (fd passed in LIZARD_EVENTS_FD) on which it says when a cell is done.

    A cell runs in that same process and can write to the pipe too, so every event line
    carries the cell's nonce, which only the runner knows: a line without it (a cell's
    `echo 0 >&$LIZARD_EVENTS_FD`, or an earlier cell's late end) is ignored, and a cell
    cannot end itself early and leak its later output into the next one."""

    def command(self) -> list[str]:
        raise NotImplementedError

    def start(self) -> None:
        self.events_r, events_w = os.pipe()
        env = dict(os.environ, LIZARD_EVENTS_FD=str(events_w))
        self.proc = subprocess.Popen(
            self.command(),
            cwd=self.cwd,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            pass_fds=(events_w,),
            start_new_session=True,
        )
        os.close(events_w)
        for fd in (self.proc.stdout.fileno(), self.proc.stderr.fileno(), self.events_r):  # type: ignore[union-attr]
            os.set_blocking(fd, False)
        self.pending = b""

    def stop(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except OSError:
            pass
        self.proc.wait()
        os.close(self.events_r)

    def send(self, code: str, envs: dict[str, str], timeout_ms: int) -> None:
        """Start a cell whose event lines carry `self.nonce`."""
        raise NotImplementedError

    def done(self, line: str, emit: Emit) -> None:
        """A line from the events pipe (any line: check its nonce)."""
        raise NotImplementedError

    def interrupt(self) -> None:
        os.killpg(self.proc.pid, signal.SIGINT)

    def _drain(self, emit: Optional[Emit]) -> None:
        for fd, kind in ((self.proc.stdout.fileno(), "stdout"), (self.proc.stderr.fileno(), "stderr")):  # type: ignore[union-attr]
            while True:
                try:
                    chunk = os.read(fd, 65536)
                except BlockingIOError:
                    break
                if not chunk:
                    break
                if emit:
                    emit({"type": kind, "text": chunk.decode("utf-8", "replace")})

    def execute(self, code: str, envs: dict[str, str], timeout_ms: int, emit: Emit) -> None:
        self._drain(None)  # output of background work since the last cell is not this cell's
        self.finished = False
        self.nonce = secrets.token_hex(16)
        try:
            self.send(code, envs, timeout_ms)
        except (BrokenPipeError, OSError):
            self.dead = True
            emit(dead_error("it had exited"))
            return
        out, err = self.proc.stdout.fileno(), self.proc.stderr.fileno()  # type: ignore[union-attr]
        sel = selectors.DefaultSelector()
        sel.register(out, selectors.EVENT_READ, "stdout")
        sel.register(err, selectors.EVENT_READ, "stderr")
        sel.register(self.events_r, selectors.EVENT_READ, "events")
        interrupted_at: Optional[float] = None
        decoders = {k: codecs.getincrementaldecoder("utf-8")("replace") for k in ("stdout", "stderr")}
        try:
            while not self.finished:
                now = time.monotonic()
                if interrupted_at is None and now >= self.deadline:
                    self.interrupt()
                    interrupted_at = now
                    emit(timeout_error(timeout_ms, "the context was interrupted"))
                if interrupted_at is not None and now - interrupted_at > INTERRUPT_GRACE_S:
                    self.dead = True
                    return
                for key, _ in sel.select(timeout=0.2):
                    try:
                        chunk = os.read(key.fd, 65536)
                    except BlockingIOError:
                        continue
                    if not chunk:
                        sel.unregister(key.fd)
                        if key.data == "events":
                            self.dead = True
                            self._drain(emit)
                            emit(dead_error(f"exit status {self.proc.wait()}"))
                            return
                        continue
                    if key.data == "events":
                        self.pending += chunk
                        while b"\n" in self.pending:
                            line, self.pending = self.pending.split(b"\n", 1)
                            self._drain(emit)
                            self.done(line.decode(), emit if interrupted_at is None else (lambda e: None))
                    else:
                        # An incremental decoder keeps a UTF-8 character split across reads whole.
                        text = decoders[key.data].decode(chunk)
                        if text:
                            emit({"type": key.data, "text": text})
        finally:
            sel.close()


class RunnerContext(ProcessContext):
    """A runner of our own (js_context.js, r_context.R) that takes each cell as a JSON line
    on stdin and answers its results, errors and end as JSON lines on the events pipe."""

    def send(self, code: str, envs: dict[str, str], timeout_ms: int) -> None:
        assert self.proc.stdin is not None
        cell = {"code": code, "envs": envs, "timeoutMs": timeout_ms, "nonce": self.nonce}
        self.proc.stdin.write(json.dumps(cell).encode() + b"\n")
        self.proc.stdin.flush()

    def done(self, line: str, emit: Emit) -> None:
        try:
            event = json.loads(line)
        except ValueError:
            return
        if not isinstance(event, dict) or event.pop("cell", None) != self.nonce:
            return
        if event.get("type") == "done":
            self.count += 1
            self.finished = True
        else:
            emit(event)


class JavascriptContext(RunnerContext):
    language = "javascript"

    def command(self) -> list[str]:
        return ["node", os.path.join(HERE, "js_context.js")]


class TypescriptContext(RunnerContext):
    """Node.js's own `stripTypeScriptTypes` first: erasable syntax only (an `enum` or a
    `namespace` with values is refused by name)."""

    language = "typescript"

    def command(self) -> list[str]:
        return ["node", "--disable-warning=ExperimentalWarning", os.path.join(HERE, "js_context.js"), "--typescript"]


class RContext(RunnerContext):
    language = "r"

    def command(self) -> list[str]:
        return ["Rscript", "--no-save", "--no-restore", os.path.join(HERE, "r_context.R")]


class BashContext(ProcessContext):
    """Each cell is written to a file and sourced with stdin from /dev/null, so a cell
    cannot read the next one, and its status is written to the events pipe."""

    language = "bash"

    def command(self) -> list[str]:
        return ["bash", "--noprofile", "--norc"]

    def start(self) -> None:
        super().start()
        assert self.proc.stdin is not None
        # A SIGINT trap (not an ignore, which children would inherit): a non-interactive
        # bash whose foreground child dies of SIGINT would otherwise exit itself, and the
        # context would lose its state on every timeout.
        self.proc.stdin.write(b"trap : INT\n")
        self.proc.stdin.flush()

    def send(self, code: str, envs: dict[str, str], timeout_ms: int) -> None:
        assert self.proc.stdin is not None
        fd, path = tempfile.mkstemp(prefix="lizard-cell-", suffix=".sh")
        with os.fdopen(fd, "w") as f:
            f.write(code + "\n")
        before = after = ""
        for i, (k, v) in enumerate(envs.items()):
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", k):
                continue
            before += f'__lz_s{i}=${{{k}+x}}; __lz_v{i}="${{{k}-}}"; export {k}={shlex.quote(v)}; '
            after += f'if [ -n "$__lz_s{i}" ]; then export {k}="$__lz_v{i}"; else unset {k}; fi; '
        script = (
            f"{before}. {shlex.quote(path)} < /dev/null; __lz_rc=$?; rm -f {shlex.quote(path)}; {after}"
            f'printf "%s %s\\n" {self.nonce} "$__lz_rc" >&$LIZARD_EVENTS_FD\n'
        )
        self.proc.stdin.write(script.encode())
        self.proc.stdin.flush()

    def interrupt(self) -> None:
        # The cell's commands, not bash itself (which must live on to keep the state).
        subprocess.run(["pkill", "-INT", "-P", str(self.proc.pid)], check=False)

    def done(self, line: str, emit: Emit) -> None:
        nonce, _, rc = line.strip().partition(" ")
        if nonce != self.nonce:
            return
        self.count += 1
        self.finished = True
        status = int(rc or "0")
        if status != 0:
            emit({"type": "error", "name": "NonZeroExitStatus", "value": f"exit status {status}", "traceback": ""})


KINDS: dict[str, type[Context]] = {
    "python": PythonContext,
    "javascript": JavascriptContext,
    "typescript": TypescriptContext,
    "r": RContext,
    "bash": BashContext,
}
LANGUAGES = tuple(KINDS)


class Contexts:
    """Every context of this sandbox, and the default one of each language."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.by_id: dict[str, Context] = {}
        self.defaults: dict[str, str] = {}
        self.default_cwd = os.getcwd()

    def create(self, language: str, cwd: Optional[str]) -> Context:
        if language not in KINDS:
            raise ApiError(422, "INVALID_ARGUMENT", f"unknown language {language!r}: one of {', '.join(LANGUAGES)}")
        cwd = cwd or self.default_cwd
        if not os.path.isabs(cwd):
            raise ApiError(422, "INVALID_ARGUMENT", f"cwd must be an absolute path, got {cwd!r}")
        if not os.path.isdir(cwd):
            raise ApiError(422, "INVALID_ARGUMENT", f"cwd {cwd!r} is not a directory in the sandbox")
        ctx = KINDS[language](cwd)
        ctx.start()
        with self.lock:
            self.by_id[ctx.id] = ctx
        return ctx

    def get(self, context_id: str) -> Context:
        with self.lock:
            ctx = self.by_id.get(context_id)
        if ctx is None:
            raise ApiError(404, "NOT_FOUND", f"code context {context_id} not found")
        return ctx

    def default(self, language: str) -> Context:
        with self.lock:
            existing = self.defaults.get(language)
            if existing and existing in self.by_id:
                return self.by_id[existing]
        ctx = self.create(language, None)
        with self.lock:
            self.defaults[language] = ctx.id
        return ctx

    def remove(self, context_id: str) -> None:
        ctx = self.get(context_id)
        with self.lock:
            self.by_id.pop(context_id, None)
            self.defaults = {k: v for k, v in self.defaults.items() if v != context_id}
        with ctx.lock:
            ctx.stop()

    def list(self) -> list[dict[str, str]]:
        with self.lock:
            return [c.describe() for c in self.by_id.values()]


CONTEXTS = Contexts()


def run(body: dict[str, Any]) -> tuple[Iterator[Event], Callable[[], None]]:
    """One execution's events, produced by a worker thread and yielded as they come, and
    what cancels it."""
    code = body.get("code")
    if not isinstance(code, str):
        raise ApiError(422, "INVALID_ARGUMENT", "code must be a string")
    language, context_id = body.get("language"), body.get("contextId")
    if language is not None and context_id is not None:
        raise ApiError(422, "INVALID_ARGUMENT", "give a language or a contextId, not both")
    envs = body.get("envs") or {}
    if not isinstance(envs, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in envs.items()):
        raise ApiError(422, "INVALID_ARGUMENT", "envs must map names to strings")
    timeout_ms = body.get("timeoutMs") or DEFAULT_TIMEOUT_MS
    if not isinstance(timeout_ms, int) or timeout_ms <= 0:
        raise ApiError(422, "INVALID_ARGUMENT", "timeoutMs must be a positive integer")
    ctx = CONTEXTS.get(context_id) if context_id else CONTEXTS.default(language or "python")

    events: "queue.Queue[Optional[Event]]" = queue.Queue()
    execution = Execution()

    def work() -> None:
        try:
            with ctx.lock:
                if execution.cancelled:  # its caller went away while it waited: never run it
                    return
                if ctx.dead:
                    ctx.restart()
                ctx.begin(execution, timeout_ms)
                try:
                    ctx.execute(code, envs, timeout_ms, events.put)
                finally:
                    ctx.end()
                events.put({"type": "end", "executionCount": ctx.count})
        except Exception as e:  # the service must always end the stream
            print(f"code service: execution failed: {e!r}", file=sys.stderr)
            events.put({"type": "error", "name": "CodeServiceError", "value": str(e), "traceback": ""})
            events.put({"type": "end", "executionCount": ctx.count})
        finally:
            events.put(None)

    threading.Thread(target=work, daemon=True).start()

    def stream() -> Iterator[Event]:
        while (event := events.get()) is not None:
            yield event

    return stream(), lambda: ctx.cancel(execution)


class Handler(BaseHTTPRequestHandler):
    server_version = "lizard-code/1"

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _json(self, status: int, value: Any) -> None:
        data = json.dumps(value).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _body(self) -> dict[str, Any]:
        n = int(self.headers.get("Content-Length") or 0)
        if n > MAX_BODY:
            raise ApiError(422, "INVALID_ARGUMENT", f"request body over {MAX_BODY} bytes")
        try:
            value = json.loads(self.rfile.read(n) or b"{}")
        except ValueError as e:
            raise ApiError(422, "INVALID_ARGUMENT", f"invalid JSON: {e}") from None
        if not isinstance(value, dict):
            raise ApiError(422, "INVALID_ARGUMENT", "the body must be a JSON object")
        return value

    def _cancel_when_gone(self, cancel: Callable[[], None], done: threading.Event) -> None:
        """Cancel the execution once the caller closes its connection (it sends nothing
        after its request: the connection readable means it is gone), unless it is `done`."""
        try:
            while not done.is_set():
                readable, _, _ = select.select([self.connection], [], [], 0.5)
                if readable and not self.connection.recv(1, socket.MSG_PEEK):
                    break
        except (OSError, ValueError):
            pass
        if not done.is_set():
            cancel()

    def _route(self, method: str) -> None:
        parts = [p for p in self.path.split("?")[0].split("/") if p]
        try:
            if method == "GET" and parts == ["health"]:
                self._json(200, {"ok": True})
            elif method == "GET" and parts == ["contexts"]:
                self._json(200, CONTEXTS.list())
            elif method == "POST" and parts == ["contexts"]:
                body = self._body()
                self._json(201, CONTEXTS.create(body.get("language") or "python", body.get("cwd")).describe())
            elif method == "DELETE" and len(parts) == 2 and parts[0] == "contexts":
                CONTEXTS.remove(parts[1])
                self.send_response(204)
                self.end_headers()
            elif method == "POST" and len(parts) == 3 and parts[0] == "contexts" and parts[2] == "restart":
                ctx = CONTEXTS.get(parts[1])
                with ctx.lock:
                    ctx.restart()
                self._json(200, ctx.describe())
            elif method == "POST" and parts == ["execute"]:
                events, cancel = run(self._body())  # a bad request is answered before the stream
                self.send_response(200)
                self.send_header("Content-Type", "application/x-ndjson")
                self.send_header("Connection", "close")
                self.end_headers()
                done = threading.Event()
                threading.Thread(target=self._cancel_when_gone, args=(cancel, done), daemon=True).start()
                try:
                    for event in events:
                        self.wfile.write(json.dumps(event).encode() + b"\n")
                        self.wfile.flush()
                except (BrokenPipeError, ConnectionResetError):
                    cancel()
                    for _ in events:  # until the cell has stopped
                        pass
                    raise
                finally:
                    done.set()
            else:
                raise ApiError(404, "NOT_FOUND", f"no route for {method} {self.path}")
        except ApiError as e:
            self._json(e.status, {"code": e.code, "message": e.message})
        except (BrokenPipeError, ConnectionResetError):
            pass
        except Exception as e:
            print(f"code service: {method} {self.path}: {e!r}", file=sys.stderr)
            self._json(500, {"code": "INTERNAL", "message": "the code service failed; see its log"})

    def do_GET(self) -> None:
        self._route("GET")

    def do_POST(self) -> None:
        self._route("POST")

    def do_DELETE(self) -> None:
        self._route("DELETE")


def main() -> None:
    # Before the port answers: the template snapshot holds the default kernel, warmed.
    default = CONTEXTS.default("python")
    if isinstance(default, PythonContext):
        default.warm_up()
    server = ThreadingHTTPServer((HOST, PORT), Handler)
    server.daemon_threads = True
    print(f"code service on {HOST}:{PORT}", file=sys.stderr, flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
