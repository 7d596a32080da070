"""Unit tests of the async flavour's driver (no server): the retry rules, idempotency keys,
typed errors, streamed answers and callbacks behave as in the blocking flavour, since both
run the same operations. The transport is httpx's MockTransport."""

from __future__ import annotations

import asyncio
import json
import struct
from typing import Any, List

import httpx
import pytest

from lizard import (
    APIConnectionError,
    AsyncHttpClient,
    AsyncLizard,
    AsyncSandbox,
    BuildEvent,
    Lizard,
    NotFoundError,
    RateLimitError,
    Sandbox,
    UnavailableError,
)
from lizard import _http
from lizard.models import SandboxInfo


@pytest.fixture(autouse=True)
def fast_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_http, "_backoff", lambda attempt: 0.001)


def client(handler: Any, **kw: Any) -> AsyncHttpClient:
    return AsyncHttpClient(api_key="lz_test", api_url="http://lizard.test", transport=httpx.MockTransport(handler), **kw)


def frame(kind: int, payload: bytes) -> bytes:
    return struct.pack(">BI", kind, len(payload)) + payload


def test_retries_keys_and_typed_errors_as_in_the_blocking_flavour() -> None:
    keys: List[str] = []

    def flaky(req: httpx.Request) -> httpx.Response:
        keys.append(req.headers.get("idempotency-key", ""))
        if len(keys) == 1:
            raise httpx.ConnectError("reset", request=req)
        if len(keys) == 2:
            return httpx.Response(429, json={"code": "RATE_LIMITED", "message": "slow"})
        return httpx.Response(200, json={"stdout": "1\n", "stderr": "", "exitCode": 0})

    async def main() -> None:
        c = client(flaky)
        assert (await c.post("/v1/sandboxes/s/exec", {"cmd": "x"}))["exitCode"] == 0
        assert len(keys) == 3 and keys[0] and len(set(keys)) == 1, keys

        calls: List[str] = []

        def unavailable(req: httpx.Request) -> httpx.Response:
            calls.append(req.method)
            return httpx.Response(503, json={"code": "UNAVAILABLE", "message": "busy"})

        # A POST without a key is not retried; a GET is, up to max_retries.
        with pytest.raises(UnavailableError):
            await client(unavailable).post("/v1/sandboxes/x/pause")
        assert calls == ["POST"]
        calls.clear()
        with pytest.raises(UnavailableError) as e:
            await client(unavailable, max_retries=2).get("/v1/x")
        assert calls == ["GET"] * 3 and e.value.code == "UNAVAILABLE"
        with pytest.raises(RateLimitError):
            await client(lambda r: httpx.Response(429, json={"code": "RATE_LIMITED", "message": "m"}), max_retries=0).get("/v1/x")
        with pytest.raises(APIConnectionError):
            await client(lambda r: (_ for _ in ()).throw(httpx.ConnectError("refused", request=r))).delete("/v1/x")

    asyncio.run(main())


def test_streamed_exec_calls_sync_and_async_callbacks_in_order() -> None:
    body = frame(4, b"a") + frame(5, b"w") + frame(4, b"b") + frame(6, b'{"exitCode":2,"timedOut":false}')

    def handler(req: httpx.Request) -> httpx.Response:
        assert req.url.params["stream"] == "true"
        return httpx.Response(200, content=body)

    async def main() -> None:
        seen: List[str] = []

        async def on_stdout(text: str) -> None:
            await asyncio.sleep(0)
            seen.append("out:" + text)

        sb = AsyncSandbox(SandboxInfo(sandbox_id="s"), client(handler))
        r = await sb.process.exec_("x", on_stdout=on_stdout, on_stderr=lambda t: seen.append("err:" + t))
        assert (r.stdout, r.stderr, r.exit_code) == ("ab", "w", 2)
        assert seen == ["out:a", "err:w", "out:b"]

    asyncio.run(main())
    # The blocking flavour refuses an async callback instead of dropping its coroutine.
    sync = Sandbox(SandboxInfo(sandbox_id="s"), _http.HttpClient(api_url="http://lizard.test", transport=httpx.MockTransport(handler)))

    async def cb(text: str) -> None:
        pass

    with pytest.raises(TypeError, match="async"):
        sync.process.exec_("x", on_stdout=cb)


def test_static_forms_and_iterators_take_the_async_flavour() -> None:
    events = [{"type": "phase", "message": "booting"}, {"type": "done", "status": "ready"}]

    def handler(req: httpx.Request) -> httpx.Response:
        if req.url.path == "/v1/sandboxes/gone/connect":
            return httpx.Response(404, json={"code": "NOT_FOUND", "message": "no sandbox gone"})
        if req.url.path == "/v1/sandboxes/s1/connect":
            return httpx.Response(200, json={"sandboxId": "s1", "template": "base", "state": "running"})
        if req.url.path.endswith("/events"):
            return httpx.Response(200, content=b"".join(json.dumps(e).encode() + b"\n" for e in events))
        if req.url.path == "/v1/sandboxes/s1/fork":
            return httpx.Response(200, json=[{"sandboxId": "s2", "state": "running"}])
        return httpx.Response(500, json={"code": "INTERNAL", "message": req.url.path})

    async def main() -> None:
        http = client(handler)
        sb = await AsyncSandbox.connect("s1", http=http)
        assert isinstance(sb, AsyncSandbox) and sb.state == "running"
        [copy] = await sb.fork()
        assert isinstance(copy, AsyncSandbox) and copy.sandbox_id == "s2"
        with pytest.raises(NotFoundError):
            await AsyncSandbox.connect("gone", http=http)
        lz = AsyncLizard(api_key="lz_test", api_url="http://lizard.test", transport=httpx.MockTransport(handler))
        got = [e async for e in lz.templates.events("t", "b1", workspace="w")]
        assert [e.type for e in got] == ["phase", "done"] and isinstance(got[0], BuildEvent)
        await lz.close()

    asyncio.run(main())
    # The same calls on the blocking flavour.
    lz = Lizard(api_key="lz_test", api_url="http://lizard.test", transport=httpx.MockTransport(handler))
    assert [e.type for e in lz.templates.events("t", "b1", workspace="w")] == ["phase", "done"]
    assert isinstance(lz.connect("s1"), Sandbox)
