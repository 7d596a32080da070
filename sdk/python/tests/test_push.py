"""Unit tests of ``templates.push`` and ``templates.events`` against httpx's MockTransport
(no server): the calls a push makes and in which order, what is retried, the event stream,
and the error of a failed build."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Callable, Dict, List

import httpx
import pytest

from lizard import APIConnectionError, BuildError, BuildEvent, Lizard
from lizard import _http
from lizard import templates as templates_module


@pytest.fixture(autouse=True)
def fast(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_http, "_backoff", lambda attempt: 0.001)
    monkeypatch.setattr(templates_module, "POLL_INTERVAL_S", 0.001)


def client(handler: Callable[[httpx.Request], httpx.Response]) -> Lizard:
    return Lizard(api_key="lz_test", api_url="http://lizard.test", transport=httpx.MockTransport(handler))


def hashlib_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def ndjson(*events: Dict[str, object]) -> bytes:
    return b"".join(json.dumps(e).encode() + b"\n" for e in events)


BUILD = {"buildId": "b1", "template": "tiny", "status": "queued", "steps": [], "createdAt": "2026-01-01T00:00:00Z"}
EVENTS = [
    {"type": "phase", "message": "booting the build VM"},
    {"type": "step", "index": 1, "total": 1, "description": "run true", "cached": False},
    {"type": "output", "stream": "stdout", "data": "hi\n"},
    {"type": "stepDone", "index": 1, "durationMs": 7},
    {"type": "done", "status": "ready"},
]


@pytest.fixture
def pushed(tmp_path: Path) -> Path:
    (tmp_path / "lizard.template.toml").write_text('name = "tiny"\nfrom = "base"\n')
    (tmp_path / "a.txt").write_text("a")
    (tmp_path / "b.txt").write_text("b")
    return tmp_path


def test_push_uploads_only_missing_blobs_then_follows_the_build(pushed: Path) -> None:
    seen: List[httpx.Request] = []
    put_attempts = [0]

    def handler(req: httpx.Request) -> httpx.Response:
        seen.append(req)
        path = req.url.path
        if path == "/v1/templates/blobs/missing":
            return httpx.Response(200, json={"missing": [hashlib_hex(b"b")]})
        if path.startswith("/v1/templates/blobs/"):
            put_attempts[0] += 1
            # The first upload meets a busy gateway: a PUT is retried.
            return httpx.Response(502 if put_attempts[0] == 1 else 204)
        if path == "/v1/templates" and req.method == "POST":
            return httpx.Response(202, json=BUILD)
        if path == "/v1/templates/tiny/builds/b1/events":
            return httpx.Response(200, content=ndjson(*EVENTS), headers={"Content-Type": "application/x-ndjson"})
        if path == "/v1/templates/tiny/builds/b1":
            return httpx.Response(200, json={**BUILD, "status": "ready", "steps": [
                {"index": 1, "description": "run true", "cached": False, "status": "ready", "durationMs": 7}]})
        return httpx.Response(404, json={"code": "NOT_FOUND", "message": path})

    got: List[BuildEvent] = []
    info = client(handler).templates.push(str(pushed), on_event=got.append, workspace="ws")
    assert info.status == "ready" and info.steps[0].duration_ms == 7 and info.steps[0].cached is False
    assert [e.type for e in got] == ["phase", "step", "output", "stepDone", "done"]
    assert got[1].description == "run true" and got[2].data == "hi\n" and got[3].duration_ms == 7
    calls = [(r.method, r.url.path) for r in seen]
    assert calls == [
        ("POST", "/v1/templates/blobs/missing"),
        ("PUT", f"/v1/templates/blobs/{hashlib_hex(b'b')}"),
        ("PUT", f"/v1/templates/blobs/{hashlib_hex(b'b')}"),
        ("POST", "/v1/templates"),
        ("GET", "/v1/templates/tiny/builds/b1/events"),
        ("GET", "/v1/templates/tiny/builds/b1"),
    ]
    assert all(r.url.params.get("workspace") == "ws" for r in seen if r.url.path != "/v1/templates")
    assert seen[1].content == b"b"
    push = json.loads(seen[3].content)
    assert push["format"] == "toml" and push["workspace"] == "ws" and "name" not in push
    assert push["recipe"] == 'name = "tiny"\nfrom = "base"\n'
    assert [f["path"] for f in push["files"]] == ["a.txt", "b.txt", "lizard.template.toml"]
    assert json.loads(seen[0].content) == {"sha256": sorted(hashlib_hex(c) for c in (b"a", b"b", (pushed / "lizard.template.toml").read_bytes()))}


def test_the_push_itself_is_not_retried(pushed: Path) -> None:
    posts = [0]

    def handler(req: httpx.Request) -> httpx.Response:
        if req.url.path == "/v1/templates/blobs/missing":
            return httpx.Response(200, json={"missing": []})
        posts[0] += 1
        raise httpx.ConnectError("connection reset")

    with pytest.raises(APIConnectionError):
        client(handler).templates.push(str(pushed))
    assert posts[0] == 1


def test_a_failed_build_raises_with_code_step_and_output_tail(pushed: Path) -> None:
    failure = {"code": "STEP_FAILED", "message": "step 2 (run false) exited 1", "step": 2, "outputTail": "boom\n"}

    def handler(req: httpx.Request) -> httpx.Response:
        path = req.url.path
        if path == "/v1/templates/blobs/missing":
            return httpx.Response(200, json={"missing": []})
        if path == "/v1/templates":
            return httpx.Response(202, json=BUILD)
        if path.endswith("/events"):
            return httpx.Response(200, content=ndjson({"type": "done", "status": "failed", "error": failure}))
        return httpx.Response(200, json={**BUILD, "status": "failed", "error": failure})

    with pytest.raises(BuildError) as e:
        client(handler).templates.push(str(pushed), name="other")
    assert (e.value.code, e.value.step, e.value.output_tail) == ("STEP_FAILED", 2, "boom\n")
    assert e.value.build.status == "failed" and "boom" in str(e.value)


def test_a_broken_event_stream_falls_back_to_the_build_status(pushed: Path) -> None:
    gets = [0]

    def handler(req: httpx.Request) -> httpx.Response:
        path = req.url.path
        if path == "/v1/templates/blobs/missing":
            return httpx.Response(200, json={"missing": []})
        if path == "/v1/templates":
            return httpx.Response(202, json=BUILD)
        if path.endswith("/events"):
            return httpx.Response(200, content=ndjson(EVENTS[0]))  # cut before `done`
        gets[0] += 1
        return httpx.Response(200, json={**BUILD, "status": "running" if gets[0] < 3 else "ready"})

    assert client(handler).templates.push(str(pushed)).status == "ready"
    assert gets[0] == 3


def test_events_end_after_done_and_a_cut_stream_is_an_error() -> None:
    body = ndjson(*EVENTS) + b'{"type":"phase","message":"never read"}\n'
    lz = client(lambda req: httpx.Response(200, content=body))
    assert [e.type for e in lz.templates.events("tiny", "b1")][-1] == "done"
    lz = client(lambda req: httpx.Response(200, content=ndjson(*EVENTS[:2])))
    with pytest.raises(APIConnectionError, match="ended before"):
        list(lz.templates.events("tiny", "b1"))
