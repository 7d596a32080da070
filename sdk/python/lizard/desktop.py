"""``sandbox.desktop``: computer use on the ``desktop`` template's X display.

Every action is a process in the guest (``xdotool``, ``scrot``, the template's
``lizard-desktop`` script) run through the sandbox's exec API, so it needs no port of its
own and works wherever ``sandbox.process`` does. The live view (``desktop.stream``) is
noVNC through the sandbox URL of port 6080, behind a secret made per stream: a URL
without it is answered 403 inside the guest.
"""

from __future__ import annotations

import base64
import secrets
from typing import TYPE_CHECKING, Dict, List, Optional, Sequence, Tuple, Union
from urllib.parse import quote, urlencode

from ._ops import F, Flavoured, Op, Sleep, api
from .errors import LizardError

if TYPE_CHECKING:
    from .models import ProcessResult
    from .sandbox import SandboxBase

#: The guest port the live view listens on (reached through the sandbox URL).
STREAM_PORT = 6080
#: The display every action targets (the template's ``DISPLAY``).
DISPLAY = ":0"

_BUTTONS: Dict[str, int] = {"left": 1, "middle": 2, "right": 3}
_SCROLL: Dict[str, int] = {"up": 4, "down": 5, "left": 6, "right": 7}
#: Common key names → X keysyms (anything else is passed to xdotool as it is).
_KEYS: Dict[str, str] = {
    "enter": "Return",
    "return": "Return",
    "esc": "Escape",
    "escape": "Escape",
    "backspace": "BackSpace",
    "tab": "Tab",
    "space": "space",
    "delete": "Delete",
    "del": "Delete",
    "insert": "Insert",
    "home": "Home",
    "end": "End",
    "pageup": "Page_Up",
    "page_up": "Page_Up",
    "pagedown": "Page_Down",
    "page_down": "Page_Down",
    "up": "Up",
    "down": "Down",
    "left": "Left",
    "right": "Right",
    "ctrl": "ctrl",
    "control": "ctrl",
    "alt": "alt",
    "shift": "shift",
    "super": "super",
    "meta": "super",
    "win": "super",
    "cmd": "super",
    "capslock": "Caps_Lock",
}


class DesktopError(LizardError):
    """A desktop action failed inside the sandbox (the message carries the tool's stderr)."""


def _key(name: str) -> str:
    lower = name.lower()
    if lower in _KEYS:
        return _KEYS[lower]
    if len(lower) in (2, 3) and lower[0] == "f" and lower[1:].isdigit():
        return lower.upper()
    return name


def _button(button: str) -> str:
    if button not in _BUTTONS:
        raise ValueError(f"button must be one of {sorted(_BUTTONS)}, got {button!r}")
    return str(_BUTTONS[button])


def _coordinate(value: int, name: str) -> str:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} must be a non-negative int, got {value!r}")
    return str(value)


class DesktopStream(Flavoured[F]):
    """``desktop.stream``: the live view, a noVNC page through the sandbox URL."""

    def __init__(self, desktop: "Desktop[F]") -> None:
        self._desktop: Desktop[F] = desktop
        self._http = desktop._http
        self._secret: Optional[str] = None

    @property
    def secret(self) -> Optional[str]:
        """The running stream's secret (``None`` when none was started by this object)."""
        return self._secret

    @api
    def start(self) -> Op[None]:
        """Start the live view with a new secret (a running one is replaced, and its URLs
        stop working)."""
        secret = secrets.token_urlsafe(24)
        yield from self._desktop._run(["lizard-desktop", "stream-start"], stdin=secret + "\n")
        self._secret = secret

    def get_url(self, *, view_only: bool = False, port: Optional[int] = None, scheme: str = "http") -> str:
        """The noVNC page of the running stream. ``port`` is the sandbox-URL proxy's port
        when it is not the scheme's default (``lizard server --proxy-listen``). ``view_only``
        asks noVNC to send no input (a viewer setting: anyone holding the URL holds the
        secret)."""
        if self._secret is None:
            raise DesktopError("no stream: call desktop.stream.start() first")
        host = self._desktop._sandbox.get_host(STREAM_PORT)
        origin = f"{scheme}://{host}" + (f":{port}" if port is not None else "")
        query = urlencode(
            {
                "autoconnect": "true",
                "reconnect": "true",
                "resize": "scale",
                "view_only": "true" if view_only else "false",
                "path": f"{self._secret}/websockify",
            }
        )
        return f"{origin}/{quote(self._secret)}/vnc.html?{query}"

    @api
    def stop(self) -> Op[None]:
        """Stop the live view: x11vnc and the page end, every URL of it stops working."""
        yield from self._desktop._run(["lizard-desktop", "stream-stop"])
        self._secret = None


class Desktop(Flavoured[F]):
    """``sandbox.desktop``: mouse, keyboard, screenshots, apps and the live view of a
    sandbox of the ``desktop`` template (or a template built on it)."""

    def __init__(self, sandbox: "SandboxBase[F]") -> None:
        self._sandbox: SandboxBase[F] = sandbox
        self._http = sandbox._http
        self.stream: DesktopStream[F] = DesktopStream(self)

    def _run(self, argv: List[str], *, stdin: Optional[str] = None, timeout_ms: int = 60_000) -> Op["ProcessResult"]:
        result = yield from self._sandbox.process._exec(argv, envs={"DISPLAY": DISPLAY}, stdin=stdin, timeout_ms=timeout_ms)
        if result.exit_code != 0:
            detail = (result.stderr or result.stdout).strip()[-2000:]
            raise DesktopError(f"{argv[0]} {argv[1] if len(argv) > 1 else ''} exited {result.exit_code}: {detail}")
        return result

    def _xdotool(self, *args: str) -> Op["ProcessResult"]:
        return (yield from self._run(["xdotool", *args]))

    # -- screen ------------------------------------------------------------------------------

    @api
    def screenshot(self) -> Op[bytes]:
        """The whole screen as PNG bytes."""
        path = f"/tmp/lizard-screenshot-{secrets.token_hex(8)}.png"
        script = 'scrot -o "$1" && base64 -w0 "$1"; status=$?; rm -f "$1"; exit $status'
        out = (yield from self._run(["sh", "-c", script, "screenshot", path])).stdout
        return base64.b64decode(out)

    @api
    def get_screen_size(self) -> Op[Tuple[int, int]]:
        """(width, height) of the screen in pixels."""
        width, height = (yield from self._xdotool("getdisplaygeometry")).stdout.split()
        return int(width), int(height)

    @api
    def get_cursor_position(self) -> Op[Tuple[int, int]]:
        """(x, y) of the mouse pointer."""
        location = (yield from self._xdotool("getmouselocation", "--shell")).stdout
        fields = dict(line.split("=", 1) for line in location.splitlines() if "=" in line)
        return int(fields["X"]), int(fields["Y"])

    def _set_resolution(self, width: int, height: int) -> Op[None]:
        """Restart the desktop at ``width`` x ``height`` (open windows are closed)."""
        yield from self._run(["lizard-desktop", "resize", f"{_coordinate(width, 'width')}x{_coordinate(height, 'height')}"])

    set_resolution = api(_set_resolution)

    # -- mouse -------------------------------------------------------------------------------

    def _click(self, button: str, x: Optional[int], y: Optional[int], repeat: int = 1) -> Op[None]:
        args: List[str] = []
        if (x is None) != (y is None):
            raise ValueError("give both x and y, or neither (click where the pointer is)")
        if x is not None and y is not None:
            args += ["mousemove", "--sync", _coordinate(x, "x"), _coordinate(y, "y")]
        args += ["click"]
        if repeat > 1:
            args += ["--repeat", str(repeat), "--delay", "100"]
        yield from self._xdotool(*args, _button(button))

    @api
    def left_click(self, x: Optional[int] = None, y: Optional[int] = None) -> Op[None]:
        """Click the left button (at ``(x, y)`` when given, else where the pointer is)."""
        yield from self._click("left", x, y)

    @api
    def right_click(self, x: Optional[int] = None, y: Optional[int] = None) -> Op[None]:
        yield from self._click("right", x, y)

    @api
    def middle_click(self, x: Optional[int] = None, y: Optional[int] = None) -> Op[None]:
        yield from self._click("middle", x, y)

    @api
    def double_click(self, x: Optional[int] = None, y: Optional[int] = None) -> Op[None]:
        yield from self._click("left", x, y, repeat=2)

    @api
    def move_mouse(self, x: int, y: int) -> Op[None]:
        yield from self._xdotool("mousemove", "--sync", _coordinate(x, "x"), _coordinate(y, "y"))

    @api
    def mouse_press(self, button: str = "left") -> Op[None]:
        """Press ``button`` (``left``, ``middle``, ``right``) and keep it down."""
        yield from self._xdotool("mousedown", _button(button))

    @api
    def mouse_release(self, button: str = "left") -> Op[None]:
        yield from self._xdotool("mouseup", _button(button))

    @api
    def drag(self, from_: Tuple[int, int], to: Tuple[int, int]) -> Op[None]:
        """Press the left button at ``from_``, move to ``to``, release."""
        (x0, y0), (x1, y1) = from_, to
        yield from self._xdotool(
            "mousemove", "--sync", _coordinate(x0, "x"), _coordinate(y0, "y"),
            "mousedown", "1",
            "mousemove", "--sync", _coordinate(x1, "x"), _coordinate(y1, "y"),
            "mouseup", "1",
        )  # fmt: skip

    @api
    def scroll(self, direction: str = "down", amount: int = 1) -> Op[None]:
        """Scroll ``amount`` wheel steps ``up``, ``down``, ``left`` or ``right``."""
        if direction not in _SCROLL:
            raise ValueError(f"direction must be one of {sorted(_SCROLL)}, got {direction!r}")
        if isinstance(amount, bool) or not isinstance(amount, int) or amount < 1:
            raise ValueError(f"amount must be a positive int, got {amount!r}")
        yield from self._xdotool("click", "--repeat", str(amount), "--delay", "50", str(_SCROLL[direction]))

    # -- keyboard ----------------------------------------------------------------------------

    @api
    def write(self, text: str, *, chunk_size: int = 50, delay_in_ms: int = 12) -> Op[None]:
        """Type ``text`` into the focused window, ``chunk_size`` characters per call."""
        for i in range(0, len(text), max(1, chunk_size)):
            yield from self._xdotool("type", "--delay", str(max(0, delay_in_ms)), "--", text[i : i + chunk_size])

    @api
    def press(self, key: Union[str, Sequence[str]]) -> Op[None]:
        """Press one key (``"enter"``, ``"a"``, ``"F5"``) or a chord of them together
        (``["ctrl", "c"]``)."""
        keys = [key] if isinstance(key, str) else list(key)
        if not keys or not all(isinstance(k, str) and k for k in keys):
            raise ValueError("press needs a key name or a non-empty list of them")
        yield from self._xdotool("key", "--", "+".join(_key(k) for k in keys))

    # -- apps --------------------------------------------------------------------------------

    @api
    def open(self, url_or_file: str) -> Op[None]:
        """Open a URL or a file in Chromium (returns once it is launched, not loaded)."""
        yield from self._run(["lizard-desktop", "open", url_or_file])

    @api
    def launch(self, application: str) -> Op[None]:
        """Start ``application`` (a command line, run by ``sh -c``) on the desktop, detached."""
        yield from self._run(["lizard-desktop", "launch", application])

    @api
    def wait(self, ms: int) -> Op[None]:
        """Sleep ``ms`` milliseconds (on the caller's side)."""
        yield Sleep(ms / 1000)
