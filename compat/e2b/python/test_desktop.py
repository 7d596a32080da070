"""E2B's desktop add-on (the published `e2b-desktop` package, unchanged) on Lizard's
`desktop` template: the SDK starts its own Xvfb at the size it asks (the template's
desktop gives way) and an XFCE session, drives the mouse and keyboard, lists windows,
opens a page in the browser, takes screenshots, and streams the screen with x11vnc and
noVNC on port 6080, which a real headless Chromium on the host opens over HTTPS at the
URL the SDK makes (`https://6080-<id>.<domain>/vnc.html`, the server's TLS listener under
the local CA). Run by scripts/test-sdk.sh with the add-on's own virtualenv
(E2B_DESKTOP_VERSIONS)."""

from __future__ import annotations

import io
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Tuple

import pytest
from e2b.sandbox.commands.command_handle import CommandExitException
from e2b_desktop import Sandbox
from PIL import Image, ImageChops

from conftest import TLS_CA, https_get

# The host's headless Chromium, driven over DevTools: the Lizard SDK suite's own helper.
sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "sdk" / "python" / "tests"))
from headless_chromium import Chromium, wait_for_canvas  # noqa: E402

SIZE = (800, 600)
GREEN, MAGENTA = (0, 192, 0), (192, 0, 192)
PAGE = """<!doctype html><title>lizard e2b page</title>
<style>html, body { margin: 0; height: 100%; background: rgb(0, 192, 0) }</style>
<body onclick="document.body.style.background = 'rgb(192, 0, 192)'">
<input autofocus style="position: fixed; top: 8px; left: 8px; width: 200px"
  oninput="document.title = 'typed ' + this.value">
</body>"""


@pytest.fixture(scope="module")
def desktop(e2b_env):
    sbx = Sandbox.create(resolution=SIZE, timeout=1200)
    yield sbx
    sbx.kill()


def screenshot(desktop: Sandbox) -> Image.Image:
    return Image.open(io.BytesIO(desktop.screenshot())).convert("RGB")


def box_of(image: Image.Image, colour: Tuple[int, int, int]) -> Tuple[int, int, int, int] | None:
    """The bounding box of the pixels of exactly `colour` (None if there are few)."""
    r, g, b = ImageChops.difference(image, Image.new("RGB", image.size, colour)).split()
    mask = ImageChops.lighter(ImageChops.lighter(r, g), b).point(lambda v: 255 if v == 0 else 0)
    box = mask.getbbox()
    if box is None or (box[2] - box[0]) * (box[3] - box[1]) < 100 * 100:
        return None
    return box


def windows_of(desktop: Sandbox, application: str) -> list:
    """The application's visible windows; none yet is an empty list (xdotool exits 1)."""
    try:
        return desktop.get_application_windows(application)
    except CommandExitException:
        return []


def until(what: str, timeout_s: float, probe: Callable[[], object]) -> object:
    """`probe()` until it is truthy, bounded in time."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = probe()
        if value:
            return value
        assert time.monotonic() < deadline, f"{what}: not within {timeout_s} s"
        time.sleep(1)


def test_the_sdk_starts_its_own_desktop_at_the_size_it_asks(desktop):
    assert desktop.get_screen_size() == SIZE
    # The SDK's Xvfb and XFCE session, as `user`; the template's own desktop gave way.
    running = desktop.commands.run("ps -o user=,comm= -C Xvfb,xfce4-session,xfwm4,xfdesktop").stdout.split("\n")
    processes = sorted(line.split()[1] for line in running if line.strip())
    assert processes == ["Xvfb", "xfce4-session", "xfdesktop", "xfwm4"], running
    assert all(line.split()[0] == "user" for line in running if line.strip()), running
    assert desktop.commands.run("pgrep -x openbox || echo none").stdout == "none\n"
    assert screenshot(desktop).size == SIZE
    desktop.move_mouse(123, 321)
    assert desktop.get_cursor_position() == (123, 321)
    # `launch` starts an application by its desktop entry (gtk-launch), on this desktop.
    desktop.launch("xfce4-appfinder")
    finder = until("the launched application's window", 120, lambda: windows_of(desktop, "xfce4-appfinder"))
    assert finder
    desktop.commands.run("pkill -x xfce4-appfinder || true")


def test_a_page_opens_in_the_browser_takes_typing_and_a_click(desktop):
    desktop.files.write("/home/user/site/page.html", PAGE)
    desktop.commands.run("cd /home/user/site && python3 -m http.server 8000", background=True)
    until("the page's server", 60, lambda: "200" in desktop.commands.run(
        "curl -s -o /dev/null -w '%{http_code}' http://localhost:8000/page.html || true").stdout)
    desktop.open("http://localhost:8000/page.html")
    page = until("the page on the screen", 240, lambda: box_of(screenshot(desktop), GREEN))
    windows = until("the browser's window", 60, lambda: windows_of(desktop, "chromium"))
    assert "lizard e2b page" in desktop.get_window_title(windows[0]).lower()
    # The page's input has the focus: typing changes its title, and so the window's.
    desktop.write("hello")
    until("the typed title", 60, lambda: "typed hello" in desktop.get_window_title(desktop.get_current_window_id()))
    x, y = (page[0] + page[2]) // 2, (page[1] + page[3]) // 2
    desktop.left_click(x, y)
    # (Not the pixel clicked: the SDK's screenshot draws the pointer there.)
    until("the clicked page's colour", 60, lambda: box_of(screenshot(desktop), MAGENTA))


def spki_of(cert_pem: Path) -> str:
    """The base64 SHA-256 of a certificate's public key, for Chromium's
    --ignore-certificate-errors-spki-list (which accepts a chain the server presents with
    that key in it: the listener's certificate, which `lizard tls init` wrote beside the
    CA; the CA itself is not sent)."""
    script = (
        f"openssl x509 -in {cert_pem} -pubkey -noout | openssl pkey -pubin -outform der"
        " | openssl dgst -sha256 -binary | base64"
    )
    return subprocess.run(["sh", "-c", script], check=True, capture_output=True, text=True).stdout.strip()


def canvas_pixel(browser: Chromium, session: str, x: int, y: int) -> Tuple[int, int, int]:
    rgb = browser.evaluate(
        session, f"Array.from(document.querySelector('canvas').getContext('2d').getImageData({x}, {y}, 1, 1).data)"
    )
    return tuple(rgb[:3])


def test_the_stream_opens_in_a_real_browser_over_https(desktop):
    desktop.stream.start()
    with pytest.raises(RuntimeError, match="already running"):
        desktop.stream.start()
    host = desktop.get_host(6080)
    url = desktop.stream.get_url()
    assert url == f"https://{host}/vnc.html?autoconnect=true&resize=scale", url
    assert https_get(host, "/vnc.html").status_code == 200
    shot = screenshot(desktop)
    page = box_of(shot, MAGENTA) or box_of(shot, GREEN)
    assert page, "the page of the previous test is not on the screen"
    # Up and left of the page's centre, where the previous test left the pointer.
    x, y = (page[0] + page[2]) // 2 - 40, (page[1] + page[3]) // 2 - 40
    browser = Chromium([f"--ignore-certificate-errors-spki-list={spki_of(Path(TLS_CA).with_name('cert.pem'))}"])
    try:
        session = browser.open(url)
        probe = wait_for_canvas(browser, session, timeout_s=180)
        assert (probe["width"], probe["height"]) == SIZE, probe
        # What the browser shows is the sandbox's screen (noVNC's encoding may round).
        seen = until("the page's colour in the stream", 60, lambda: (
            lambda p: p if max(abs(a - b) for a, b in zip(p, shot.getpixel((x, y)))) <= 24 else None
        )(canvas_pixel(browser, session, x, y)))
        assert seen
    finally:
        browser.close()
    desktop.stream.stop()
    assert desktop.commands.run("pgrep -x x11vnc || echo none").stdout == "none\n"
    until("the stream's port to close", 30, lambda: https_get(host, "/vnc.html").status_code == 502)
