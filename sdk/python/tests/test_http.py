"""Unit tests of the HTTP layer (no server): error mapping, which calls are retried, timeouts.
The transport is httpx's MockTransport, so the retry rules are checked exactly."""

from __future__ import annotations

import time
from typing import List

import httpx
import pytest

from lizard import (
    APIConnectionError,
    APITimeoutError,
    ConflictError,
    HttpClient,
    NotFoundError,
    PaymentRequiredError,
    PermissionDeniedError,
    RateLimitError,
    UnavailableError,
)
from lizard import _http


@pytest.fixture(autouse=True)
def fast_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_http, "_backoff", lambda attempt: 0.001)


def client(handler, **kw) -> HttpClient:
    return HttpClient(api_key="lz_test", api_url="http://lizard.test", transport=httpx.MockTransport(handler), **kw)


def test_error_bodies_become_typed_exceptions_with_the_code() -> None:
    cases = [
        (404, "NOT_FOUND", NotFoundError),
        (409, "CONFLICT", ConflictError),
        (402, "PAYMENT_REQUIRED", PaymentRequiredError),
        (403, "ACCOUNT_SCOPE_REQUIRED", PermissionDeniedError),
    ]
    for status, code, cls in cases:
        c = client(lambda req, s=status, k=code: httpx.Response(s, json={"code": k, "message": "why"}))
        with pytest.raises(cls) as e:
            c.get("/v1/x")
        assert (e.value.status, e.value.code, e.value.message) == (status, code, "why")


def test_key_header_and_json() -> None:
    seen: List[httpx.Request] = []

    def handler(req: httpx.Request) -> httpx.Response:
        seen.append(req)
        return httpx.Response(200, json={"ok": True})

    assert client(handler).post("/v1/y", {"a": 1}, params={"force": True, "skip": None}) == {"ok": True}
    assert seen[0].headers["x-api-key"] == "lz_test"
    assert seen[0].url.params == httpx.QueryParams({"force": "true"})
    assert seen[0].content == b'{"a":1}' or seen[0].content == b'{"a": 1}'


def test_429_is_retried_for_any_call_503_only_for_calls_safe_to_repeat() -> None:
    calls = []

    def handler(req: httpx.Request) -> httpx.Response:
        calls.append(req.method)
        if len(calls) < 3:
            return httpx.Response(429 if len(calls) == 1 else 503, json={"code": "RATE_LIMITED", "message": "slow"})
        return httpx.Response(201, json={"id": "x"})

    # A create carries an idempotency key: safe to retry on 503.
    assert client(handler).post("/v1/sandboxes", {"template": "base"}) == {"id": "x"}
    assert calls == ["POST", "POST", "POST"]

    calls.clear()
    always = client(lambda req: (calls.append(1), httpx.Response(429, json={"code": "RATE_LIMITED", "message": "m"}))[1], max_retries=2)
    with pytest.raises(RateLimitError):
        always.get("/v1/x")
    assert len(calls) == 3  # one try and two retries, then the typed error

    # A POST without a key (a pause) is not retried on 503: it may have been done.
    calls.clear()
    unavailable = client(lambda req: (calls.append(1), httpx.Response(503, json={"code": "UNAVAILABLE", "message": "m"}))[1])
    with pytest.raises(UnavailableError):
        unavailable.post("/v1/sandboxes/x/pause")
    assert len(calls) == 1


def test_creates_and_execs_carry_one_idempotency_key_across_their_retries() -> None:
    keys: List[str] = []

    def handler(req: httpx.Request) -> httpx.Response:
        keys.append(req.headers.get("idempotency-key", ""))
        if len(keys) == 1:
            raise httpx.ConnectError("reset", request=req)
        return httpx.Response(200, json={"stdout": "1\n", "stderr": "", "exitCode": 0})

    assert client(handler).post("/v1/sandboxes/s/exec", {"cmd": "echo run >> /tmp/runs"})["exitCode"] == 0
    assert len(keys) == 2 and keys[0] and keys[0] == keys[1], keys
    keys.clear()
    client(handler).post("/v1/sandboxes/s/exec", {"cmd": "x"})
    assert keys[0] != "" and len(set(keys)) == 1
    for path in ("/v1/sandboxes", "/v1/sandboxes/s/fork", "/v1/volumes"):
        assert _http.with_idempotency_key("POST", path, None)[_http.IDEMPOTENCY_HEADER]
    assert _http.with_idempotency_key("POST", "/v1/sandboxes/s/pause", None) == {}
    assert _http.with_idempotency_key("POST", "/v1/sandboxes", {"Idempotency-Key": "mine"}) == {"Idempotency-Key": "mine"}


def test_a_replayed_failure_is_final_and_a_call_in_progress_is_waited_for() -> None:
    calls = []

    def replayed(req: httpx.Request) -> httpx.Response:
        calls.append(1)
        return httpx.Response(503, json={"code": "UNAVAILABLE", "message": "m"}, headers={"Idempotency-Replayed": "true"})

    with pytest.raises(UnavailableError):
        client(replayed).post("/v1/sandboxes/s/exec", {"cmd": "x"})
    assert len(calls) == 1

    calls.clear()

    def in_progress(req: httpx.Request) -> httpx.Response:
        calls.append(1)
        if len(calls) == 1:
            return httpx.Response(409, json={"code": "CONFLICT", "message": "still served"}, headers={"Retry-After": "0"})
        return httpx.Response(201, json={"sandboxId": "s"})

    assert client(in_progress).post("/v1/sandboxes", {"template": "base"}) == {"sandboxId": "s"}
    assert len(calls) == 2


def test_calls_not_safe_to_repeat_are_not_retried_on_502_or_connection_errors() -> None:
    calls = []

    def bad_gateway(req: httpx.Request) -> httpx.Response:
        calls.append(req.method)
        return httpx.Response(502, json={"code": "BOOT_FAILED", "message": "m"})

    with pytest.raises(Exception):
        client(bad_gateway).post("/v1/sandboxes/x/resume")
    assert calls == ["POST"]
    calls.clear()
    with pytest.raises(Exception):
        client(bad_gateway).get("/v1/sandboxes")
    assert calls == ["GET"] * 4

    calls.clear()

    def refused(req: httpx.Request) -> httpx.Response:
        calls.append(req.method)
        raise httpx.ConnectError("refused", request=req)

    with pytest.raises(APIConnectionError):
        client(refused).post("/v1/sandboxes/x/pause")
    assert calls == ["POST"]
    calls.clear()
    with pytest.raises(APIConnectionError):
        client(refused).delete("/v1/sandboxes/x")
    assert calls == ["DELETE"] * 4


def test_timeouts_raise_a_timeout_error_in_bounded_time() -> None:
    def slow(req: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("slow", request=req)

    t = time.monotonic()
    with pytest.raises(APITimeoutError):
        client(slow, max_retries=1).get("/v1/x")
    assert time.monotonic() - t < 5


def test_real_timeout_against_a_silent_socket() -> None:
    """A server that accepts and never answers: the call ends after ~timeout, not never."""
    import socket
    import threading

    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(4)
    conns = []
    stop = threading.Event()

    def accept() -> None:
        srv.settimeout(0.2)
        while not stop.is_set():
            try:
                conns.append(srv.accept()[0])
            except OSError:
                pass

    th = threading.Thread(target=accept, daemon=True)
    th.start()
    try:
        c = HttpClient(api_key="k", api_url=f"http://127.0.0.1:{srv.getsockname()[1]}", timeout=0.5, max_retries=0)
        t = time.monotonic()
        with pytest.raises(APITimeoutError):
            c.get("/v1/x")
        assert 0.4 < time.monotonic() - t < 5
    finally:
        stop.set()
        th.join()
        for s in conns:
            s.close()
        srv.close()


def test_unavailable_after_retries_is_typed() -> None:
    c = client(lambda req: httpx.Response(503, json={"code": "UNAVAILABLE", "message": "busy"}), max_retries=1)
    with pytest.raises(UnavailableError) as e:
        c.get("/v1/x")
    assert e.value.code == "UNAVAILABLE"


def test_connections_are_reused() -> None:
    """Many calls over one pooled client open one TCP connection (keep-alive)."""
    import http.server
    import threading

    peers = set()

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            peers.add(self.client_address)
            body = b"[]"
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a) -> None:
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    th = threading.Thread(target=srv.serve_forever, daemon=True)
    th.start()
    try:
        c = HttpClient(api_key="k", api_url=f"http://127.0.0.1:{srv.server_address[1]}")
        for _ in range(10):
            assert c.get("/v1/workspaces") == []
        assert len(peers) == 1
    finally:
        srv.shutdown()
        srv.server_close()
