"""``sandbox.desktop``'s actions as the commands they run in the guest (no server: a
stand-in ``process._exec`` operation records each argv; the blocking driver runs it
without a request)."""

from __future__ import annotations

import base64
from typing import Any, List, Optional
from urllib.parse import parse_qs, urlsplit

import pytest

import lizard
from lizard._ops import Op
from lizard.desktop import Desktop
from lizard.models import ProcessResult, SandboxInfo


class FakeProcess:
    def __init__(self) -> None:
        self.calls: List[List[str]] = []
        self.stdins: List[Optional[str]] = []
        self.answer = ProcessResult()

    def _exec(self, argv: List[str], **kw: Any) -> Op[ProcessResult]:
        assert kw["envs"] == {"DISPLAY": ":0"}
        self.calls.append(argv)
        self.stdins.append(kw.get("stdin"))
        return self.answer
        yield  # an operation that needs no I/O


class FakeSandbox:
    def __init__(self) -> None:
        self.process = FakeProcess()
        self._http = lizard.HttpClient(api_key="lz_test", api_url="http://127.0.0.1:9")
        self.sandbox_id = "sbx_1"
        self.info = SandboxInfo(sandbox_id="sbx_1", domain="sandbox.local.lizard.localhost")

    def get_host(self, port: int) -> str:
        return f"{self.sandbox_id}-{port}.{self.info.domain}"


def desktop() -> "tuple[Desktop, FakeProcess]":
    sandbox = FakeSandbox()
    return Desktop(sandbox), sandbox.process  # type: ignore[arg-type]


def test_mouse_and_keys_become_xdotool_argv() -> None:
    d, p = desktop()
    d.left_click(10, 20)
    d.right_click()
    d.double_click(5, 6)
    d.drag((1, 2), (3, 4))
    d.scroll("up", 3)
    d.press(["ctrl", "c"])
    d.press("enter")
    d.press("F5")
    d.write("hi; rm -rf /")
    assert p.calls == [
        ["xdotool", "mousemove", "--sync", "10", "20", "click", "1"],
        ["xdotool", "click", "3"],
        ["xdotool", "mousemove", "--sync", "5", "6", "click", "--repeat", "2", "--delay", "100", "1"],
        ["xdotool", "mousemove", "--sync", "1", "2", "mousedown", "1", "mousemove", "--sync", "3", "4", "mouseup", "1"],
        ["xdotool", "click", "--repeat", "3", "--delay", "50", "4"],
        ["xdotool", "key", "--", "ctrl+c"],
        ["xdotool", "key", "--", "Return"],
        ["xdotool", "key", "--", "F5"],
        ["xdotool", "type", "--delay", "12", "--", "hi; rm -rf /"],
    ]


def test_bad_arguments_are_refused_before_anything_runs() -> None:
    d, p = desktop()
    with pytest.raises(ValueError):
        d.left_click(10)
    with pytest.raises(ValueError):
        d.move_mouse(-1, 0)
    with pytest.raises(ValueError):
        d.scroll("sideways")
    with pytest.raises(ValueError):
        d.mouse_press("fourth")
    with pytest.raises(ValueError):
        d.press([])
    assert p.calls == []


def test_a_failing_tool_raises_with_its_stderr() -> None:
    d, p = desktop()
    p.answer = ProcessResult(stderr="Can't open display\n", exit_code=1)
    with pytest.raises(lizard.DesktopError, match="Can't open display"):
        d.get_screen_size()


def test_screenshot_decodes_what_the_guest_printed() -> None:
    d, p = desktop()
    png = b"\x89PNG\r\n\x1a\nrest"
    p.answer = ProcessResult(stdout=base64.b64encode(png).decode())
    assert d.screenshot() == png
    assert p.calls[0][:2] == ["sh", "-c"] and p.calls[0][-1].startswith("/tmp/lizard-screenshot-")


def test_stream_url_carries_the_secret_and_a_new_start_makes_a_new_one() -> None:
    d, p = desktop()
    with pytest.raises(lizard.DesktopError):
        d.stream.get_url()
    d.stream.start()
    first = d.stream.secret
    assert first and len(first) >= 32 and p.stdins[-1] == f"{first}\n"
    assert p.calls[-1] == ["lizard-desktop", "stream-start"]
    url = urlsplit(d.stream.get_url(view_only=True, port=7172))
    assert (url.scheme, url.hostname, url.port) == ("http", "sbx_1-6080.sandbox.local.lizard.localhost", 7172)
    assert url.path == f"/{first}/vnc.html"
    query = parse_qs(url.query)
    assert query["path"] == [f"{first}/websockify"] and query["view_only"] == ["true"]
    d.stream.start()
    assert d.stream.secret != first
    d.stream.stop()
    assert d.stream.secret is None and p.calls[-1] == ["lizard-desktop", "stream-stop"]
