"""``sandbox.desktop`` on the ``desktop`` template, against a real server: a page served in
the sandbox, opened in its Chromium, clicked and typed into, checked on screenshots (the
PNG decoded, pixels read); the live view rendered by a real headless Chromium on the host,
and refused without its secret.

One sandbox serves the whole module (Chromium's first start under TCG takes a while)."""

from __future__ import annotations

import asyncio
import io
import os
import time
from typing import Callable, Iterator, Optional, Tuple
from urllib.parse import urlsplit

import httpx
import pytest
from PIL import Image

import lizard as lizard_sdk
from conftest import Server
from headless_chromium import Chromium, wait_for_canvas

#: A pushed copy of templates/desktop can stand in (to try a recipe change before rebuilding
#: the built-in).
TEMPLATE = os.environ.get("LIZARD_SDK_TEST_DESKTOP_TEMPLATE", "desktop")
PAGE_PORT = 8000
BUTTON = (0, 0, 255)  # the button
CLICKED = (0, 200, 0)  # the button and the page after a click on the button
INPUT = (255, 255, 0)  # the text box
TYPED = (255, 0, 255)  # the page once the box holds exactly TEXT
TEXT = "hello lizard"

PAGE = f"""<!doctype html>
<html><head><title>desktop test</title><style>
  html, body {{ margin: 0; height: 100%; background: rgb(255, 255, 255); }}
  #go {{ position: absolute; left: 100px; top: 60px; width: 240px; height: 120px; border: 0;
         background: rgb{BUTTON}; }}
  #box {{ position: absolute; left: 100px; top: 260px; width: 300px; height: 60px; border: 0;
          background: rgb{INPUT}; font-size: 24px; outline: none; }}
</style></head><body>
<button id="go"></button>
<input id="box" autocomplete="off">
<script>
  document.getElementById('go').onclick = (e) => {{
    document.body.style.background = 'rgb{CLICKED}';
    e.target.style.background = 'rgb{CLICKED}';
  }};
  document.getElementById('box').oninput = (e) => {{
    if (e.target.value === {TEXT!r}) document.body.style.background = 'rgb{TYPED}';
    fetch('/typed?' + encodeURIComponent(e.target.value)).catch(() => {{}});
  }};
</script></body></html>
"""

Pixel = Tuple[int, int, int]


def decode(png: bytes) -> Image.Image:
    assert png[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    return Image.open(io.BytesIO(png)).convert("RGB")


def bbox_of(image: Image.Image, colour: Pixel) -> Optional[Tuple[int, int, int, int]]:
    """The bounding box (left, top, right, bottom) of the pixels of exactly ``colour``."""
    width, height = image.size
    data = image.load()
    assert data is not None
    xs, ys = [], []
    for y in range(0, height, 2):
        for x in range(0, width, 2):
            if data[x, y] == colour:
                xs.append(x)
                ys.append(y)
    if not xs:
        return None
    return min(xs), min(ys), max(xs), max(ys)


def screen_until(sandbox: lizard_sdk.Sandbox, ok: Callable[[Image.Image], bool], timeout_s: float, what: str) -> Image.Image:
    """Screenshots until ``ok`` holds for one (bounded in time); a timeout says what the
    guest's browser and page server were doing."""
    deadline = time.monotonic() + timeout_s
    while True:
        image = decode(sandbox.desktop.screenshot())
        if ok(image):
            return image
        if time.monotonic() >= deadline:
            guest = sandbox.process.exec_(
                "pgrep -a chromium | head -3; tail -c 1500 /run/lizard-desktop/chromium.log; tail -5 /srv/page.log"
            )
            raise AssertionError(f"{what}: not on screen within {timeout_s} s; in the guest:\n{guest.stdout}")
        time.sleep(1)


@pytest.fixture(scope="module")
def sandbox(server: Server, my_project: lizard_sdk.Project) -> Iterator[lizard_sdk.Sandbox]:
    client = lizard_sdk.Lizard(project="my-project")
    sandbox = client.create(TEMPLATE, timeout_ms=30 * 60 * 1000)
    try:
        sandbox.fs.write("/srv/page/index.html", PAGE)
        sandbox.process.exec_(
            f"cd /srv/page && nohup python3 -m http.server {PAGE_PORT} --bind 127.0.0.1 > /srv/page.log 2>&1 &"
        )
        # Up before Chromium asks for the page: it retries a refused load only after growing
        # pauses (seconds, then minutes).
        sandbox.wait_for_port(PAGE_PORT)
        yield sandbox
    finally:
        sandbox.kill()


def test_the_template_brings_its_own_size_and_a_1024x768_desktop(sandbox: lizard_sdk.Sandbox) -> None:
    # No size named at create: the template's [sandbox] section decided it.
    assert (sandbox.info.vcpus, sandbox.info.memory_mib) == (2, 2048)
    assert sandbox.desktop.get_screen_size() == (1024, 768)
    image = decode(sandbox.desktop.screenshot())
    assert image.size == (1024, 768)
    sandbox.desktop.move_mouse(200, 150)
    assert sandbox.desktop.get_cursor_position() == (200, 150)


def test_the_async_flavour_drives_the_same_desktop(sandbox: lizard_sdk.Sandbox) -> None:
    async def main() -> None:
        desktop = (await lizard_sdk.AsyncSandbox.connect(sandbox.sandbox_id)).desktop
        assert await desktop.get_screen_size() == (1024, 768)
        assert decode(await desktop.screenshot()).size == (1024, 768)
        await desktop.move_mouse(321, 123)
        await desktop.wait(10)
        assert await desktop.get_cursor_position() == (321, 123)

    asyncio.run(main())


def test_a_click_on_the_button_changes_the_page_where_it_was_clicked(sandbox: lizard_sdk.Sandbox) -> None:
    desktop = sandbox.desktop
    desktop.open(f"http://127.0.0.1:{PAGE_PORT}/")
    image = screen_until(sandbox, lambda im: bbox_of(im, BUTTON) is not None, 180, "the page's button")
    box = bbox_of(image, BUTTON)
    assert box is not None
    left, top, right, bottom = box
    assert (right - left, bottom - top) >= (200, 100), f"button box {box}"
    x, y = (left + right) // 2, (top + bottom) // 2
    below = (x, bottom + 30)  # page background under the button
    assert image.getpixel(below) == (255, 255, 255)
    desktop.left_click(x, y)
    after = screen_until(sandbox, lambda im: im.getpixel((x, y)) == CLICKED, 30, "the clicked button's colour")
    assert after.getpixel(below) == CLICKED
    assert bbox_of(after, BUTTON) is None
    assert desktop.get_cursor_position() == (x, y)


def test_write_types_into_the_focused_input(sandbox: lizard_sdk.Sandbox) -> None:
    desktop = sandbox.desktop
    image = screen_until(sandbox, lambda im: bbox_of(im, INPUT) is not None, 60, "the page's text box")
    box = bbox_of(image, INPUT)
    assert box is not None
    left, top, right, bottom = box
    desktop.left_click((left + right) // 2, (top + bottom) // 2)
    desktop.write(TEXT)
    spot = ((left + right) // 2, bottom + 40)
    screen_until(sandbox, lambda im: im.getpixel(spot) == TYPED, 30, "the page's colour for the typed text")
    log = sandbox.fs.read("/srv/page.log")
    assert "/typed?hello%20lizard" in log, log[-2000:]
    # press: a key the page sees (Backspace removes the last character, so the text no
    # longer matches and the page logs the shorter value).
    desktop.press("backspace")
    deadline = time.monotonic() + 30
    while "/typed?hello%20lizar " not in sandbox.fs.read("/srv/page.log"):
        assert time.monotonic() < deadline, "backspace never reached the page"
        time.sleep(0.5)


def test_the_live_view_renders_in_a_real_browser_and_needs_its_secret(
    server: Server, sandbox: lizard_sdk.Sandbox
) -> None:
    stream = sandbox.desktop.stream
    stream.start()
    proxy_port = int(server.proxy.rsplit(":", 1)[1])
    url = stream.get_url(port=proxy_port, view_only=True)
    parts = urlsplit(url)
    assert parts.hostname == sandbox.get_host(6080)
    secret = stream.secret
    assert secret and secret in parts.path and "view_only=true" in parts.query
    host = sandbox.get_host(6080)

    def get(path: str) -> httpx.Response:
        return httpx.get(f"http://{server.proxy}{path}", headers={"Host": host}, timeout=30)

    # Without the secret, or with another one, nothing of the desktop is served.
    for path in ["/", "/vnc.html", "/websockify", f"/{secret[:-1]}/vnc.html", "/app/ui.js"]:
        r = get(path)
        assert r.status_code == 403, (path, r.status_code)
    assert get(f"/{secret}/vnc.html").status_code == 200
    # A WebSocket upgrade without the secret is refused too.
    r = httpx.get(
        f"http://{server.proxy}/websockify",
        headers={"Host": host, "Connection": "Upgrade", "Upgrade": "websocket", "Sec-WebSocket-Version": "13",
                 "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ=="},
        timeout=30,
    )  # fmt: skip
    assert r.status_code == 403

    browser = Chromium()
    try:
        session = browser.open(url)
        probe = wait_for_canvas(browser, session, timeout_s=180)
        assert (probe["width"], probe["height"]) == (1024, 768), probe
    finally:
        browser.close()

    # A new stream has a new secret: the old URL stops working; after stop, none works.
    old = secret
    stream.start()
    assert stream.secret != old
    assert get(f"/{old}/vnc.html").status_code == 403
    stream.stop()
    assert get(f"/{old}/vnc.html").status_code in (502, 503)


def test_resolution_at_create(server: Server, my_project: lizard_sdk.Project) -> None:
    client = lizard_sdk.Lizard(project="my-project")
    sandbox = client.create(TEMPLATE, resolution=(1280, 800), memory_mib=1024, vcpus=1)
    try:
        # A size named at create wins over the template's.
        assert (sandbox.info.vcpus, sandbox.info.memory_mib) == (1, 1024)
        assert sandbox.desktop.get_screen_size() == (1280, 800)
        assert decode(sandbox.desktop.screenshot()).size == (1280, 800)
        with pytest.raises(lizard_sdk.DesktopError, match="WIDTHxHEIGHT|outside"):
            sandbox.desktop.set_resolution(10, 10)
        # A refused size leaves the desktop as it was.
        assert sandbox.desktop.get_screen_size() == (1280, 800)
        # Restarts one after another on one vCPU: Xvfb once refused openbox here while it
        # reset after each probe, so every restart but the first failed.
        for size in [(800, 600), (1024, 768), (1280, 800)]:
            sandbox.desktop.set_resolution(*size)
            assert sandbox.desktop.get_screen_size() == size
        assert decode(sandbox.desktop.screenshot()).size == (1280, 800)
    finally:
        sandbox.kill()
