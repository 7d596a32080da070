"""Stateful code execution in the ``interpreter`` template: ``sandbox.run_code`` and code
contexts, named after the best-known code-interpreter SDK so code moves over unchanged.

    sandbox = lizard.create("interpreter")
    sandbox.run_code("x = 41")
    print(sandbox.run_code("x + 1").text)          # 42

An execution streams from the server as the code runs (``on_stdout``, ``on_stderr``,
``on_result``, ``on_error`` see each piece as it arrives) and is returned whole as an
``Execution``. An exception raised by the code is ``execution.error``, not a Python
exception here; so is a timeout (``TimeoutError``: the context was interrupted and keeps
its state) and a dead interpreter (``DeadKernelError``: the next run starts a new one).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Mapping, Optional, Union
from urllib.parse import quote

from ._ops import F, Flavoured, Op, api, invoke
from .errors import APIConnectionError

#: ``run_code`` without ``timeout`` interrupts the code after this many seconds (the
#: server's default).
DEFAULT_TIMEOUT_S = 300.0
#: How long the HTTP call may outlive the code's own timeout.
REQUEST_GRACE_S = 90.0

#: MIME type → ``Result`` attribute.
MIME_FIELDS = {
    "text/plain": "text",
    "text/html": "html",
    "text/markdown": "markdown",
    "image/svg+xml": "svg",
    "image/png": "png",
    "image/jpeg": "jpeg",
    "application/pdf": "pdf",
    "text/latex": "latex",
    "application/json": "json",
    "application/javascript": "javascript",
}


@dataclass
class Result:
    """Something the code displayed: the cell's value (``is_main_result``) or a
    ``display()``/figure. Each MIME type the kernel produced is an attribute (``png`` and
    ``jpeg`` are base64, ``json`` is the decoded value); others are in ``extra``; the whole
    bundle is ``data``."""

    text: Optional[str] = None
    html: Optional[str] = None
    markdown: Optional[str] = None
    svg: Optional[str] = None
    png: Optional[str] = None
    jpeg: Optional[str] = None
    pdf: Optional[str] = None
    latex: Optional[str] = None
    json: Optional[Any] = None
    javascript: Optional[str] = None
    is_main_result: bool = False
    extra: Dict[str, Any] = field(default_factory=dict)
    data: Dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_bundle(cls, data: Mapping[str, Any], is_main_result: bool) -> "Result":
        r = cls(is_main_result=is_main_result, data=dict(data))
        for mime, value in data.items():
            name = MIME_FIELDS.get(mime)
            if name is None:
                r.extra[mime] = value
            else:
                setattr(r, name, "".join(value) if isinstance(value, list) and name != "json" else value)
        return r

    def formats(self) -> List[str]:
        """The names of the formats this result has (``text``, ``png``, …)."""
        return [name for name in MIME_FIELDS.values() if getattr(self, name) is not None] + list(self.extra)

    def __str__(self) -> str:
        return self.text or ""


@dataclass
class Logs:
    """What the code printed, in the pieces it arrived in."""

    stdout: List[str] = field(default_factory=list)
    stderr: List[str] = field(default_factory=list)


@dataclass
class ExecutionError:
    """An error the code raised (``name``: ``ZeroDivisionError``, ``TimeoutError``,
    ``DeadKernelError``, …), its message and its traceback as text."""

    name: str
    value: str
    traceback: str


@dataclass
class Execution:
    results: List[Result] = field(default_factory=list)
    logs: Logs = field(default_factory=Logs)
    error: Optional[ExecutionError] = None
    execution_count: Optional[int] = None

    @property
    def text(self) -> Optional[str]:
        """The main result's text (the value of the cell's last expression), if any."""
        for r in self.results:
            if r.is_main_result:
                return r.text
        return None


@dataclass
class Context:
    """A code context: one interpreter whose variables persist between runs."""

    id: str
    language: str
    cwd: str

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "Context":
        return cls(id=str(data["id"]), language=str(data["language"]), cwd=str(data.get("cwd", "")))


def _context_id(context: Union[Context, str]) -> str:
    return context.id if isinstance(context, Context) else context


def read_events(
    next_line: Callable[[], Op[Optional[str]]],
    on_stdout: Optional[Callable[[str], object]] = None,
    on_stderr: Optional[Callable[[str], object]] = None,
    on_result: Optional[Callable[[Result], object]] = None,
    on_error: Optional[Callable[[ExecutionError], object]] = None,
) -> Op[Execution]:
    """Fold an execution's NDJSON events (the lines ``next_line`` reads, ``None`` at the
    end) into an ``Execution``, calling back as they come. ``APIConnectionError`` when the
    stream ends before its ``end`` event."""
    execution = Execution()
    while True:
        line = yield from next_line()
        if line is None:
            break
        if not line.strip():
            continue
        try:
            event = json.loads(line)
        except ValueError as e:
            raise APIConnectionError(f"run_code: a line that is not JSON: {e}") from e
        kind = event.get("type")
        if kind == "stdout":
            execution.logs.stdout.append(event["text"])
            yield from invoke(on_stdout, event["text"])
        elif kind == "stderr":
            execution.logs.stderr.append(event["text"])
            yield from invoke(on_stderr, event["text"])
        elif kind == "result":
            result = Result.from_bundle(event.get("data") or {}, bool(event.get("isMainResult")))
            execution.results.append(result)
            yield from invoke(on_result, result)
        elif kind == "error":
            execution.error = ExecutionError(event["name"], event["value"], event.get("traceback", ""))
            yield from invoke(on_error, execution.error)
        elif kind == "end":
            execution.execution_count = event.get("executionCount")
            return execution
    raise APIConnectionError("run_code: the stream ended before the execution did")


class CodeInterpreter(Flavoured[F]):
    """``run_code`` and the code-context methods of a sandbox."""

    @property
    def sandbox_id(self) -> str:
        raise NotImplementedError

    def _code_path(self, rest: str = "") -> str:
        return f"/v1/sandboxes/{quote(self.sandbox_id, safe='')}/code{rest}"

    @api
    def run_code(
        self,
        code: str,
        language: Optional[str] = None,
        context: Optional[Union[Context, str]] = None,
        on_stdout: Optional[Callable[[str], object]] = None,
        on_stderr: Optional[Callable[[str], object]] = None,
        on_result: Optional[Callable[[Result], object]] = None,
        on_error: Optional[Callable[[ExecutionError], object]] = None,
        envs: Optional[Mapping[str, str]] = None,
        timeout: Optional[float] = None,
        request_timeout: Optional[float] = None,
    ) -> Op[Execution]:
        """Run ``code`` in a context: ``context``, or ``language``'s default one
        (``"python"`` — an IPython kernel —, ``"javascript"``, ``"typescript"``, ``"r"``
        or ``"bash"``; default python), not both. ``envs`` hold for this run only. ``timeout`` (seconds,
        default 300) interrupts the code; ``request_timeout`` bounds the HTTP call."""
        body: Dict[str, Any] = {"code": code}
        if language is not None:
            body["language"] = language
        if context is not None:
            body["contextId"] = _context_id(context)
        if envs:
            body["envs"] = dict(envs)
        if timeout is not None:
            body["timeoutMs"] = max(1, int(timeout * 1000))
        if request_timeout is None:
            request_timeout = (timeout if timeout is not None else DEFAULT_TIMEOUT_S) + REQUEST_GRACE_S
        stream = yield from self._http.open("POST", self._code_path(), json=body, timeout=request_timeout, lines=True)
        return (yield from read_events(lambda: self._http.next(stream), on_stdout, on_stderr, on_result, on_error))

    @api
    def create_code_context(self, language: Optional[str] = None, cwd: Optional[str] = None) -> Op[Context]:
        """A new context with its own interpreter (started before this returns)."""
        body: Dict[str, Any] = {}
        if language is not None:
            body["language"] = language
        if cwd is not None:
            body["cwd"] = cwd
        return Context.from_json((yield from self._http.call("POST", self._code_path("/contexts"), body, timeout=240)))

    @api
    def list_code_contexts(self) -> Op[List[Context]]:
        """Every context of the sandbox (the default ones, once used, included)."""
        return [Context.from_json(c) for c in (yield from self._http.call("GET", self._code_path("/contexts")))]

    @api
    def restart_code_context(self, context: Union[Context, str]) -> Op[Context]:
        """A new interpreter for the context: same id, variables gone."""
        path = self._code_path(f"/contexts/{quote(_context_id(context), safe='')}/restart")
        return Context.from_json((yield from self._http.call("POST", path, timeout=240)))

    @api
    def remove_code_context(self, context: Union[Context, str]) -> Op[None]:
        """End the context's interpreter."""
        yield from self._http.call("DELETE", self._code_path(f"/contexts/{quote(_context_id(context), safe='')}"))
