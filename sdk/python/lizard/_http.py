"""The HTTP client under every call: one pooled ``httpx.Client`` per ``Lizard`` (connections
are reused), a timeout on every request, and retries with exponential backoff where a
retry cannot do anything twice.

A call is safe to retry when its method is idempotent (GET, HEAD, PUT, DELETE, OPTIONS) or
it carries an ``Idempotency-Key`` — which the client adds to the calls that create
something or run something (create sandbox, exec, fork, create volume), one key per call,
the same on each of its retries, so that the server answers a retry with the first
answer instead of doing the work again. Safe calls are retried on connection failures,
timeouts and 502/503/504; every call on 429 (the server refused before doing anything,
after its ``Retry-After``); a keyed call also on 409 with ``Retry-After`` (its first
attempt is still being served). A replayed answer (``Idempotency-Replayed``) is final."""

from __future__ import annotations

import os
import contextlib
import random
import re
import threading
import time
import uuid
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Tuple, Union

import httpx

from .errors import APIConnectionError, APITimeoutError, error_for

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


class HttpClient:
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
        self.api_key = api_key or os.environ.get("LIZARD_API_KEY")
        self.api_url = (api_url or os.environ.get("LIZARD_API_URL") or DEFAULT_API_URL).rstrip("/")
        self.timeout = timeout
        self.max_retries = max_retries
        headers = {"User-Agent": "lizard-sdk-python/0.1.0"}
        if self.api_key:
            headers["X-API-Key"] = self.api_key
        self._client = httpx.Client(base_url=self.api_url, headers=headers, timeout=timeout, transport=transport)

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> "HttpClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

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
    ) -> httpx.Response:
        """Send one request (with retries where safe); raise the typed error on 4xx/5xx."""
        method = method.upper()
        params = {k: _query_value(v) for k, v in (params or {}).items() if v is not None}
        for observe in request_observers:
            observe(self.api_url, method, path, params, json)
        headers = with_idempotency_key(method, path, headers)
        keyed = any(k.lower() == IDEMPOTENCY_HEADER.lower() for k in headers)
        idempotent = method in _IDEMPOTENT or keyed
        attempt = 0
        while True:
            try:
                resp = self._client.request(
                    method,
                    path,
                    params=params,
                    json=json,
                    content=content,
                    headers=headers,
                    timeout=self.timeout if timeout is None else timeout,
                )
            except httpx.TimeoutException as e:
                if idempotent and attempt < self.max_retries:
                    attempt += 1
                    time.sleep(_backoff(attempt))
                    continue
                raise APITimeoutError(f"{method} {path}: timed out") from e
            except httpx.TransportError as e:
                if idempotent and attempt < self.max_retries:
                    attempt += 1
                    time.sleep(_backoff(attempt))
                    continue
                raise APIConnectionError(f"{method} {path}: {e}") from e
            if resp.status_code < 400:
                return resp
            retryable = _retryable(resp, idempotent, keyed)
            if retryable and attempt < self.max_retries:
                attempt += 1
                time.sleep(_retry_after(resp) or _backoff(attempt))
                continue
            raise _error(resp)

    @contextlib.contextmanager
    def stream(
        self,
        method: str,
        path: str,
        *,
        params: Params = None,
        json: Any = None,
        timeout: Optional[float] = None,
    ) -> Iterator[httpx.Response]:
        """A request whose response body is read as it arrives (not retried: it is not
        idempotent where it is used). Raises the typed error on 4xx/5xx."""
        method = method.upper()
        params = {k: _query_value(v) for k, v in (params or {}).items() if v is not None}
        for observe in request_observers:
            observe(self.api_url, method, path, params, json)
        try:
            with self._client.stream(
                method, path, params=params, json=json, timeout=self.timeout if timeout is None else timeout
            ) as resp:
                if resp.status_code >= 400:
                    resp.read()
                    raise _error(resp)
                yield resp
        except httpx.TimeoutException as e:
            raise APITimeoutError(f"{method} {path}: timed out") from e
        except httpx.TransportError as e:
            raise APIConnectionError(f"{method} {path}: {e}") from e

    def get(self, path: str, *, params: Params = None, timeout: Optional[float] = None) -> Any:
        return _json(self.request("GET", path, params=params, timeout=timeout))

    def post(self, path: str, json: Any = None, *, params: Params = None, timeout: Optional[float] = None) -> Any:
        return _json(self.request("POST", path, params=params, json=json, timeout=timeout))

    def put(self, path: str, json: Any = None, *, params: Params = None, timeout: Optional[float] = None) -> Any:
        return _json(self.request("PUT", path, params=params, json=json, timeout=timeout))

    def patch(self, path: str, json: Any = None, *, params: Params = None, timeout: Optional[float] = None) -> Any:
        return _json(self.request("PATCH", path, params=params, json=json, timeout=timeout))

    def delete(self, path: str, *, params: Params = None, timeout: Optional[float] = None) -> Any:
        return _json(self.request("DELETE", path, params=params, timeout=timeout))


_shared: Dict[Tuple[Optional[str], Optional[str]], HttpClient] = {}
_shared_lock = threading.Lock()


def shared_client(api_key: Optional[str] = None, api_url: Optional[str] = None) -> HttpClient:
    """One pooled client per (key, URL) for the static forms (``Sandbox.create`` without a
    ``Lizard``), so that an agent loop calling them reuses its connections."""
    key = (api_key or os.environ.get("LIZARD_API_KEY"), api_url or os.environ.get("LIZARD_API_URL"))
    with _shared_lock:
        client = _shared.get(key)
        if client is None:
            client = _shared[key] = HttpClient(api_key=key[0], api_url=key[1])
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
