"""The HTTP client under every call: one pooled ``httpx.Client`` per ``Lizard`` (an
``httpx.AsyncClient`` per ``AsyncLizard``; connections are reused), a timeout on every
request, and retries with exponential backoff where a retry cannot do anything twice.
Requests, retries and answers are operations (``_ops``) shared by both flavours; the two
clients here are their drivers, each doing one step at a time.

A call is safe to retry when its method is idempotent (GET, HEAD, PUT, DELETE, OPTIONS) or
it carries an ``Idempotency-Key`` — which the client adds to the calls that create
something or run something (create sandbox, exec, fork, create volume), one key per call,
the same on each of its retries, so that the server answers a retry with the first
answer instead of doing the work again. Safe calls are retried on connection failures,
timeouts and 502/503/504; every call on 429 (the server refused before doing anything,
after its ``Retry-After``); a keyed call also on 409 with ``Retry-After`` (its first
attempt is still being served). A replayed answer (``Idempotency-Replayed``) is final."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import os
import random
import re
import socket
import threading
import time
import uuid
import weakref
from typing import Any, AsyncIterator, Callable, Dict, Generator, Iterator, List, Mapping, Optional, Tuple, TypeVar, Union

import httpx

from ._ops import Async, Body, Emit, F, Flavoured, Invoke, Items, Join, Next, Op, Open, Request, Send, Sleep, Spawn, Started, Step, Sync, api
from .errors import APIConnectionError, APITimeoutError, error_for

T = TypeVar("T")

DEFAULT_API_URL = "http://127.0.0.1:7171"
DEFAULT_TIMEOUT_S = 60.0
DEFAULT_MAX_RETRIES = 3

_IDEMPOTENT = {"GET", "HEAD", "PUT", "DELETE", "OPTIONS"}
#: Statuses retried whatever the call: the server refused before doing anything.
_RETRY_ANY = {429}
#: Statuses retried for calls safe to repeat (idempotent method or idempotency key).
_RETRY_SAFE = {502, 503, 504}

#: The header that makes a POST safe to retry.
IDEMPOTENCY_HEADER = "Idempotency-Key"
#: POST routes that create or run something: each call gets its own idempotency key.
_KEYED_POSTS = [
    re.compile(p) for p in (r"^/v1/sandboxes$", r"^/v1/sandboxes/[^/]+/(exec|fork)$", r"^/v1/volumes$")
]


def with_idempotency_key(method: str, path: str, headers: Optional[Dict[str, str]]) -> Dict[str, str]:
    """``headers`` plus a fresh ``Idempotency-Key`` when ``method path`` creates or runs
    something and the caller did not set one."""
    headers = dict(headers or {})
    keyed = any(k.lower() == IDEMPOTENCY_HEADER.lower() for k in headers)
    if method == "POST" and not keyed and any(p.match(path) for p in _KEYED_POSTS):
        headers[IDEMPOTENCY_HEADER] = uuid.uuid4().hex
    return headers

#: Observers of every request any client sends: ``f(api_url, method, path, params, json_body)``.
#: The OpenAPI contract tests use it; it costs nothing when empty.
request_observers: List[Callable[[str, str, str, Mapping[str, Any], Any], None]] = []

Params = Optional[Mapping[str, Any]]


class _Client(Flavoured[F]):
    """What both clients share: their settings and the calls, as operations."""

    def __init__(self, api_key: Optional[str], api_url: Optional[str], timeout: float, max_retries: int) -> None:
        self.api_key = api_key or os.environ.get("LIZARD_API_KEY")
        self.api_url = (api_url or os.environ.get("LIZARD_API_URL") or DEFAULT_API_URL).rstrip("/")
        self.timeout = timeout
        self.max_retries = max_retries
        self.headers = {"User-Agent": "lizard-sdk-python/0.1.0"}
        if self.api_key:
            self.headers["X-API-Key"] = self.api_key
        assert isinstance(self, (HttpClient, AsyncHttpClient))
        self._http = self  # its calls run on itself
        #: The background operations (watches, process followers) that ``close()`` stops.
        self._background: "weakref.WeakSet[Any]" = weakref.WeakSet()

    def _request(
        self,
        method: str,
        path: str,
        params: Params,
        json: Any = None,
        content: Optional[bytes] = None,
        headers: Optional[Dict[str, str]] = None,
        timeout: Optional[float] = None,
    ) -> Request:
        method = method.upper()
        query = {k: _query_value(v) for k, v in (params or {}).items() if v is not None}
        for observe in request_observers:
            observe(self.api_url, method, path, query, json)
        return Request(
            method, path, query, json, content, dict(headers or {}), self.timeout if timeout is None else timeout
        )

    def send(
        self,
        method: str,
        path: str,
        *,
        params: Params = None,
        json: Any = None,
        content: Optional[bytes] = None,
        headers: Optional[Dict[str, str]] = None,
        timeout: Optional[float] = None,
    ) -> Op[httpx.Response]:
        """Send one request (with retries where safe); raise the typed error on 4xx/5xx."""
        headers = with_idempotency_key(method.upper(), path, headers)
        req = self._request(method, path, params, json, content, headers, timeout)
        keyed = any(k.lower() == IDEMPOTENCY_HEADER.lower() for k in headers)
        idempotent = req.method in _IDEMPOTENT or keyed
        attempt = 0
        while True:
            try:
                resp: httpx.Response = yield Send(req)
            except httpx.TransportError as e:
                if idempotent and attempt < self.max_retries:
                    attempt += 1
                    yield Sleep(_backoff(attempt))
                    continue
                raise _transport_error(req, e) from e
            if resp.status_code < 400:
                return resp
            if _retryable(resp, idempotent, keyed) and attempt < self.max_retries:
                attempt += 1
                yield Sleep(_retry_after(resp) or _backoff(attempt))
                continue
            raise _error(resp)

    def open(
        self, method: str, path: str, *, params: Params = None, json: Any = None, timeout: Optional[float] = None, lines: bool = False
    ) -> Op[Body]:
        """A request whose answer is read as it arrives, with :meth:`next` (not retried: it is
        not idempotent where it is used). Raises the typed error on 4xx/5xx."""
        req = self._request(method, path, params, json, timeout=timeout)
        try:
            body: Body = yield Open(req, lines)
        except httpx.TransportError as e:
            raise _transport_error(req, e) from e
        if body.response.status_code >= 400:
            raise _error(body.response)
        return body

    @staticmethod
    def next(body: Body) -> Op[Any]:
        """The next piece of an opened answer (``None`` at its end)."""
        try:
            return (yield Next(body))
        except httpx.TransportError as e:
            raise _transport_error(body.request, e) from e

    @api
    def request(
        self,
        method: str,
        path: str,
        *,
        params: Params = None,
        json: Any = None,
        content: Union[bytes, None] = None,
        headers: Optional[Dict[str, str]] = None,
        timeout: Optional[float] = None,
    ) -> Op[httpx.Response]:
        """Send one request (with retries where safe); raise the typed error on 4xx/5xx."""
        return (yield from self.send(method, path, params=params, json=json, content=content, headers=headers, timeout=timeout))

    def call(self, method: str, path: str, json: Any = None, *, params: Params = None, timeout: Optional[float] = None) -> Op[Any]:
        """A JSON call: the decoded answer (``None`` when it has no body)."""
        return _json((yield from self.send(method, path, params=params, json=json, timeout=timeout)))

    @api
    def get(self, path: str, *, params: Params = None, timeout: Optional[float] = None) -> Op[Any]:
        return (yield from self.call("GET", path, params=params, timeout=timeout))

    @api
    def post(self, path: str, json: Any = None, *, params: Params = None, timeout: Optional[float] = None) -> Op[Any]:
        return (yield from self.call("POST", path, json, params=params, timeout=timeout))

    @api
    def put(self, path: str, json: Any = None, *, params: Params = None, timeout: Optional[float] = None) -> Op[Any]:
        return (yield from self.call("PUT", path, json, params=params, timeout=timeout))

    @api
    def patch(self, path: str, json: Any = None, *, params: Params = None, timeout: Optional[float] = None) -> Op[Any]:
        return (yield from self.call("PATCH", path, json, params=params, timeout=timeout))

    @api
    def delete(self, path: str, *, params: Params = None, timeout: Optional[float] = None) -> Op[Any]:
        return (yield from self.call("DELETE", path, params=params, timeout=timeout))


def _drive(op: Op[T], do: Callable[[Step], Any]) -> Generator[Any, None, T]:
    """Run ``op`` with ``do`` doing each step (its exceptions are thrown into the
    operation), yielding what the operation emits; returns what it returns."""
    value: Any = None
    error: Optional[BaseException] = None
    while True:
        try:
            step = op.throw(error) if error is not None else op.send(value)
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]
        value, error = None, None
        if isinstance(step, Emit):
            yield step.item
            continue
        try:
            value = do(step)
        except Exception as e:
            error = e


class HttpClient(_Client[Sync]):
    """The raw HTTP client (``lizard.platform``): JSON in, JSON out, typed errors.

    ``api_key`` defaults to ``LIZARD_API_KEY`` and ``api_url`` to ``LIZARD_API_URL`` (then
    ``http://127.0.0.1:7171``). ``timeout`` (seconds) bounds every request unless a call
    passes its own."""

    def __init__(
        self,
        api_key: Optional[str] = None,
        api_url: Optional[str] = None,
        timeout: float = DEFAULT_TIMEOUT_S,
        max_retries: int = DEFAULT_MAX_RETRIES,
        transport: Optional[httpx.BaseTransport] = None,
    ) -> None:
        super().__init__(api_key, api_url, timeout, max_retries)
        self._client = httpx.Client(base_url=self.api_url, headers=self.headers, timeout=timeout, transport=transport)

    def close(self) -> None:
        """Stop the background operations (watches, process followers), then close."""
        for watch in list(self._background):
            watch.stop()
        self._client.close()

    def __enter__(self) -> "HttpClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def run(self, op: Op[T]) -> T:
        """Run an operation to its end."""
        with contextlib.ExitStack() as opened:
            steps = _drive(op, lambda step: self._do(step, opened))
            try:
                item = next(steps)
            except StopIteration as stop:
                return stop.value  # type: ignore[no-any-return]
            raise TypeError(f"an operation run as a call emitted {item!r}")

    def iterate(self, op: Items[T]) -> Iterator[T]:
        """Run an operation, yielding what it emits."""
        with contextlib.ExitStack() as opened:
            yield from _drive(op, lambda step: self._do(step, opened))

    def spawn(self, op: Op[None]) -> "WatchHandle":
        """Run an operation until it yields ``Started``, then on in a thread of its own."""
        handle = WatchHandle()
        started = threading.Event()
        early: List[BaseException] = []

        def do(step: Step, opened: contextlib.ExitStack) -> Any:
            if handle.stopping:
                raise _Stopped
            if isinstance(step, Started):
                started.set()
                return None
            try:
                answer = self._do(step, opened)
            except Exception:
                if handle.stopping:
                    raise _Stopped from None  # stop() closed the stream under the read
                raise
            if isinstance(answer, Body):
                handle._responses.append(answer.response)
            return answer

        def main() -> None:
            try:
                with contextlib.ExitStack() as opened:
                    for _ in _drive(op, lambda step: do(step, opened)):
                        pass
            except _Stopped:
                pass
            except Exception as e:
                if started.is_set():
                    handle.exception = e
                else:
                    early.append(e)
            finally:
                op.close()
                started.set()

        handle._thread = threading.Thread(target=main, name="lizard-watch", daemon=True)
        handle._thread.start()
        started.wait()
        if early:
            raise early[0]
        self._background.add(handle)
        return handle

    def _do(self, step: Step, opened: contextlib.ExitStack) -> Any:
        if isinstance(step, Send):
            r = step.request
            return self._client.request(
                r.method, r.path, params=r.params, json=r.json, content=r.content, headers=r.headers, timeout=r.timeout
            )
        if isinstance(step, Open):
            r = step.request
            request = self._client.build_request(r.method, r.path, params=r.params, json=r.json, timeout=r.timeout)
            resp = self._client.send(request, stream=True)
            opened.callback(resp.close)
            if resp.status_code >= 400:
                resp.read()
            return Body(r, resp, resp.iter_lines() if step.lines else resp.iter_bytes())
        if isinstance(step, Next):
            return next(step.body.pieces, None)
        if isinstance(step, Sleep):
            time.sleep(step.seconds)
            return None
        if isinstance(step, Started):
            return None
        if isinstance(step, Spawn):
            return self.spawn(step.op)
        if isinstance(step, Join):
            step.watch.stop() if step.stop else step.watch.join()
            return None
        if isinstance(step, Invoke):
            result = step.fn(*step.args)
            if inspect.isawaitable(result):
                getattr(result, "close", lambda: None)()  # never awaited: no warning
                raise TypeError(f"{step.fn!r} is async: pass it to the async client (AsyncLizard, AsyncSandbox)")
            return result
        raise TypeError(f"unknown step {step!r}")


class AsyncHttpClient(_Client[Async]):
    """The raw HTTP client of ``AsyncLizard`` (``lizard.platform``): as :class:`HttpClient`,
    on ``httpx.AsyncClient``; every call is a coroutine."""

    def __init__(
        self,
        api_key: Optional[str] = None,
        api_url: Optional[str] = None,
        timeout: float = DEFAULT_TIMEOUT_S,
        max_retries: int = DEFAULT_MAX_RETRIES,
        transport: Optional[httpx.AsyncBaseTransport] = None,
    ) -> None:
        super().__init__(api_key, api_url, timeout, max_retries)
        self._client = httpx.AsyncClient(base_url=self.api_url, headers=self.headers, timeout=timeout, transport=transport)

    async def close(self) -> None:
        """Stop the background operations (watches, process followers), then close."""
        for watch in list(self._background):
            await watch.stop()
        await self._client.aclose()

    async def __aenter__(self) -> "AsyncHttpClient":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def run(self, op: Op[T]) -> T:
        """Run an operation to its end."""
        result: List[T] = []
        async for item in self._drive(_returning(op, result)):
            raise TypeError(f"an operation run as a call emitted {item!r}")
        return result[0]

    def iterate(self, op: Items[T]) -> AsyncIterator[T]:
        """Run an operation, yielding what it emits."""
        return self._drive(op)

    async def spawn(self, op: Op[None]) -> "AsyncWatchHandle":
        """Run an operation until it yields ``Started``, then on in a task of its own."""
        started = asyncio.Event()
        handle = AsyncWatchHandle()

        async def main() -> None:
            try:
                async for _ in self._drive(op, started.set):
                    pass
            except Exception as e:
                if not started.is_set():
                    raise
                handle.exception = e
            finally:
                op.close()

        task = handle._task = asyncio.ensure_future(main())
        waiting = asyncio.ensure_future(started.wait())
        try:
            await asyncio.wait({task, waiting}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            waiting.cancel()
        if task.done() and not started.is_set():
            task.result()  # the error that came before the operation started
        self._background.add(handle)
        return handle

    async def _drive(self, op: Op[None], on_started: Callable[[], None] = lambda: None) -> AsyncIterator[Any]:
        """As :func:`_drive`, awaiting each step (an async generator cannot return a value:
        :func:`_returning` keeps it)."""
        async with contextlib.AsyncExitStack() as opened:
            value: Any = None
            error: Optional[BaseException] = None
            while True:
                try:
                    step = op.throw(error) if error is not None else op.send(value)
                except StopIteration:
                    return
                value, error = None, None
                if isinstance(step, Emit):
                    yield step.item
                    continue
                if isinstance(step, Started):
                    on_started()
                    continue
                try:
                    value = await self._do(step, opened)
                except Exception as e:
                    error = e

    async def _do(self, step: Step, opened: contextlib.AsyncExitStack) -> Any:
        if isinstance(step, Send):
            r = step.request
            return await self._client.request(
                r.method, r.path, params=r.params, json=r.json, content=r.content, headers=r.headers, timeout=r.timeout
            )
        if isinstance(step, Open):
            r = step.request
            request = self._client.build_request(r.method, r.path, params=r.params, json=r.json, timeout=r.timeout)
            resp = await self._client.send(request, stream=True)
            opened.push_async_callback(resp.aclose)
            if resp.status_code >= 400:
                await resp.aread()
            return Body(r, resp, resp.aiter_lines() if step.lines else resp.aiter_bytes())
        if isinstance(step, Next):
            try:
                return await step.body.pieces.__anext__()
            except StopAsyncIteration:
                return None
        if isinstance(step, Sleep):
            await asyncio.sleep(step.seconds)
            return None
        if isinstance(step, Spawn):
            return await self.spawn(step.op)
        if isinstance(step, Join):
            await (step.watch.stop() if step.stop else step.watch.join())
            return None
        if isinstance(step, Invoke):
            result = step.fn(*step.args)
            return await result if inspect.isawaitable(result) else result
        raise TypeError(f"unknown step {step!r}")


def _returning(op: Op[T], into: List[T]) -> Op[None]:
    into.append((yield from op))


class _Stopped(BaseException):
    """Unwinds a background operation whose handle was stopped."""


def _interrupt(resp: httpx.Response) -> None:
    """Wake a thread blocked reading ``resp``: closing a response from another thread does
    not, shutting its socket down does."""
    stream = resp.extensions.get("network_stream")
    sock = stream.get_extra_info("socket") if stream is not None else None
    if sock is not None:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass  # already closed


class WatchHandle:
    """A background operation of the blocking flavour (``sandbox.fs.watch``, a process's
    follower), running in a thread. ``stop()`` ends it, ``join()`` waits until it ended;
    ``exception`` is what broke it, if anything did."""

    def __init__(self) -> None:
        self.stopping = False
        self.exception: Optional[BaseException] = None
        self._responses: List[httpx.Response] = []
        self._thread: Optional[threading.Thread] = None

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def stop(self, timeout: float = 30.0) -> None:
        """End it (closing its stream) and wait until its thread did."""
        self.stopping = True
        for resp in self._responses:
            _interrupt(resp)
            resp.close()
        self.join(timeout)

    def join(self, timeout: Optional[float] = None) -> None:
        """Wait until it ended (by itself, or stopped)."""
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)


class AsyncWatchHandle:
    """A background operation of the async flavour, running as a task. ``await stop()``
    ends it, ``await join()`` waits until it ended; ``exception`` is what broke it, if
    anything did."""

    def __init__(self) -> None:
        self.exception: Optional[BaseException] = None
        self._task: "Optional[asyncio.Future[None]]" = None

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    async def stop(self) -> None:
        """Cancel it and wait until it ended (its stream closed)."""
        if self._task is None or self._task.done() or self._task is asyncio.current_task():
            return  # ended, or stopped from one of its own callbacks (whose awaits go on)
        self._task.cancel()
        try:
            await self._task
        except asyncio.CancelledError:
            pass

    async def join(self) -> None:
        """Wait until it ended (by itself, or stopped); cancelling this wait leaves it
        running."""
        if self._task is not None and self._task is not asyncio.current_task():
            await asyncio.wait({self._task})


_shared: Dict[Tuple[Optional[str], Optional[str]], HttpClient] = {}
_shared_async: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Dict[Tuple[Optional[str], Optional[str]], AsyncHttpClient]]" = (
    weakref.WeakKeyDictionary()
)
_shared_lock = threading.Lock()


def _shared_key(api_key: Optional[str], api_url: Optional[str]) -> Tuple[Optional[str], Optional[str]]:
    return (api_key or os.environ.get("LIZARD_API_KEY"), api_url or os.environ.get("LIZARD_API_URL"))


def shared_client(api_key: Optional[str] = None, api_url: Optional[str] = None) -> HttpClient:
    """One pooled client per (key, URL) for the static forms (``Sandbox.create`` without a
    ``Lizard``), so that an agent loop calling them reuses its connections."""
    key = _shared_key(api_key, api_url)
    with _shared_lock:
        client = _shared.get(key)
        if client is None:
            client = _shared[key] = HttpClient(api_key=key[0], api_url=key[1])
        return client


def shared_async_client(api_key: Optional[str] = None, api_url: Optional[str] = None) -> AsyncHttpClient:
    """As :func:`shared_client` for ``AsyncSandbox``'s static forms: one per (key, URL) and
    event loop (an ``httpx.AsyncClient``'s connections belong to the loop that opened them)."""
    key = _shared_key(api_key, api_url)
    clients = _shared_async.setdefault(asyncio.get_running_loop(), {})
    client = clients.get(key)
    if client is None:
        client = clients[key] = AsyncHttpClient(api_key=key[0], api_url=key[1])
    return client


def _retryable(resp: httpx.Response, idempotent: bool, keyed: bool) -> bool:
    """Whether an error answer may be retried (see the module doc)."""
    if resp.headers.get("idempotency-replayed"):
        return False
    status = resp.status_code
    in_progress = keyed and status == 409 and "retry-after" in resp.headers
    return status in _RETRY_ANY or (idempotent and status in _RETRY_SAFE) or in_progress


def _query_value(v: Any) -> Any:
    if isinstance(v, bool):
        return "true" if v else "false"
    return v


def _json(resp: httpx.Response) -> Any:
    if resp.status_code == 204 or not resp.content:
        return None
    return resp.json()


def _transport_error(req: Request, e: httpx.TransportError) -> APIConnectionError:
    if isinstance(e, httpx.TimeoutException):
        return APITimeoutError(f"{req.method} {req.path}: timed out")
    return APIConnectionError(f"{req.method} {req.path}: {e}")


def _error(resp: httpx.Response) -> Exception:
    code, message = None, resp.text or resp.reason_phrase
    try:
        body = resp.json()
        if isinstance(body, dict):
            code = body.get("code")
            message = body.get("message", message)
    except ValueError:
        pass
    return error_for(resp.status_code, code, message)


def _backoff(attempt: int) -> float:
    """0.25 s, 0.5 s, 1 s, … (capped at 8 s) with ±25 % jitter."""
    base: float = min(0.25 * 2.0 ** (attempt - 1), 8.0)
    return base * random.uniform(0.75, 1.25)


def _retry_after(resp: httpx.Response) -> Optional[float]:
    value = resp.headers.get("retry-after")
    try:
        return min(float(value), 30.0) if value else None
    except ValueError:
        return None
