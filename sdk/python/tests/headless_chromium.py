"""A real headless Chromium on the host, driven over the DevTools protocol on a pipe
(``--remote-debugging-pipe``: JSON messages ended by NUL on fds 3 and 4), so the test
needs no WebSocket client and no port of its own."""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import tempfile
import time
from typing import Any, Dict, Optional, Sequence


class Chromium:
    def __init__(self, extra_args: Sequence[str] = ()) -> None:
        binary = shutil.which("chromium") or shutil.which("chromium-browser")
        assert binary, "the live-view test needs Debian's chromium on the host (scripts/deps.sh installs it)"
        self._profile = tempfile.mkdtemp(prefix="lizard-chromium-")
        to_child_r, self._to_child = os.pipe()
        self._from_child, from_child_w = os.pipe()

        def fds() -> None:
            # Moved out of the way first, so that neither lands on the other's number.
            read_end = fcntl.fcntl(to_child_r, fcntl.F_DUPFD, 10)
            write_end = fcntl.fcntl(from_child_w, fcntl.F_DUPFD, 10)
            os.dup2(read_end, 3)
            os.dup2(write_end, 4)

        self._proc = subprocess.Popen(
            [binary, "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
             "--remote-debugging-pipe", f"--user-data-dir={self._profile}", "--window-size=1280,900",
             *extra_args, "about:blank"],
            preexec_fn=fds, pass_fds=(3, 4),
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        os.close(to_child_r)
        os.close(from_child_w)
        self._buffer = b""
        self._next_id = 0

    def call(self, method: str, params: Optional[Dict[str, Any]] = None, session: Optional[str] = None) -> Any:
        self._next_id += 1
        message: Dict[str, Any] = {"id": self._next_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        os.write(self._to_child, json.dumps(message).encode() + b"\0")
        while True:
            reply = self._read()
            if reply.get("id") == self._next_id:
                assert "error" not in reply, f"{method}: {reply['error']}"
                return reply.get("result", {})

    def _read(self) -> Dict[str, Any]:
        while b"\0" not in self._buffer:
            chunk = os.read(self._from_child, 1 << 16)
            assert chunk, "chromium closed its DevTools pipe"
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\0", 1)
        result: Dict[str, Any] = json.loads(line)
        return result

    def open(self, url: str) -> str:
        """A new page at ``url``; its DevTools session id."""
        target = self.call("Target.createTarget", {"url": url})["targetId"]
        return str(self.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"])

    def evaluate(self, session: str, expression: str) -> Any:
        result = self.call("Runtime.evaluate", {"expression": expression, "returnByValue": True}, session)
        return result.get("result", {}).get("value")

    def close(self) -> None:
        try:
            self.call("Browser.close")
        except (AssertionError, OSError):
            pass
        try:
            self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        os.close(self._to_child)
        os.close(self._from_child)
        shutil.rmtree(self._profile, ignore_errors=True)


#: What noVNC's canvas shows: its size and how many sampled pixels are not black.
CANVAS_PROBE = """(() => {
  const c = document.querySelector('canvas');
  const status = (document.getElementById('noVNC_status') || {}).textContent || '';
  if (!c || !c.width || !c.height) return {width: 0, height: 0, lit: 0, samples: 0, colours: 0, status};
  const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
  let lit = 0, samples = 0;
  const colours = new Set();
  for (let i = 0; i < d.length; i += 4 * 61) {
    samples++;
    if (d[i] | d[i + 1] | d[i + 2]) lit++;
    colours.add((d[i] << 16) | (d[i + 1] << 8) | d[i + 2]);
  }
  return {width: c.width, height: c.height, lit, samples, colours: colours.size, status};
})()"""


def wait_for_canvas(browser: Chromium, session: str, timeout_s: float) -> Dict[str, Any]:
    """Poll the page until its canvas is mostly not black (bounded in time)."""
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = browser.evaluate(session, CANVAS_PROBE)
        except AssertionError as e:
            # The page is still between documents (loading, or redirected).
            if "execution context" not in str(e):
                raise
            time.sleep(0.5)
            continue
        if last and last["samples"] and last["lit"] > last["samples"] // 4:
            return dict(last)
        time.sleep(0.5)
    raise AssertionError(f"the live view's canvas stayed blank: last probe {last!r}")
