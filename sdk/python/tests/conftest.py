"""Fixtures: a real ``lizard server`` (real microVMs, real SQLite, real HTTP).

``scripts/test-sdk.sh`` starts one server for both SDK suites and passes it in
``LIZARD_SDK_TEST_API_URL``, ``LIZARD_SDK_TEST_API_KEY`` and ``LIZARD_SDK_TEST_PROXY``.
Without those, this starts its own from ``target/debug/lizard`` (guest images from
``LIZARD_TEST_DATA_DIR``, default the machine's image store ``/var/lib/lizard``)."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, List, Tuple

import httpx
import pytest

import lizard
from lizard import _http

REPO = Path(__file__).resolve().parents[3]


@dataclass
class Server:
    url: str
    key: str
    proxy: str  # host:port of the sandbox-URL proxy


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start_server() -> Tuple[Server, subprocess.Popen, Path]:
    binary = Path(os.environ.get("LIZARD_BIN", REPO / "target/debug/lizard"))
    images = Path(os.environ.get("LIZARD_TEST_DATA_DIR", "/var/lib/lizard"))
    data = Path(tempfile.mkdtemp(prefix="lizard-sdk-py-"))
    (data / "images").symlink_to(images / "images")
    if (images / "accel.json").exists():
        shutil.copy(images / "accel.json", data / "accel.json")
    api, proxy = _free_port(), _free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("LIZARD_API_URL", "LIZARD_API_KEY")}
    log = open(data / "server.log", "w")
    proc = subprocess.Popen(
        [str(binary), "--data-dir", str(data), "server", "--listen", f"127.0.0.1:{api}",
         "--proxy-listen", f"127.0.0.1:{proxy}"],
        stdout=subprocess.PIPE, stderr=log, env=env, text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()
    assert line.startswith("LIZARD_API_KEY="), f"server said {line!r}; log: {data / 'server.log'}"
    url = f"http://127.0.0.1:{api}"
    deadline = time.monotonic() + 60
    while True:
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                break
        except httpx.TransportError:
            pass
        assert time.monotonic() < deadline, "the server did not come up"
        time.sleep(0.1)
    return Server(url, line.split("=", 1)[1], f"127.0.0.1:{proxy}"), proc, data


@pytest.fixture(scope="session")
def server() -> Iterator[Server]:
    given = os.environ.get("LIZARD_SDK_TEST_API_URL")
    if given:
        srv = Server(given, os.environ["LIZARD_SDK_TEST_API_KEY"], os.environ["LIZARD_SDK_TEST_PROXY"])
        proc = None
    else:
        srv, proc, data = _start_server()
    # The examples read the key and URL from the environment, as a user's program would.
    os.environ["LIZARD_API_URL"] = srv.url
    os.environ["LIZARD_API_KEY"] = srv.key
    yield srv
    if proc is not None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        shutil.rmtree(data, ignore_errors=True)


@pytest.fixture(scope="session")
def openapi(server: Server) -> dict:
    return httpx.get(f"{server.url}/openapi.json", timeout=30).json()



@pytest.fixture(scope="session")
def my_project(server: Server) -> lizard.Project:
    """The project the reference's examples name: ``my-project`` (in a workspace of its own)."""
    client = lizard.Lizard()
    try:
        return client.projects.get("my-project")
    except lizard.NotFoundError:
        ws = client.workspaces.create("sdk-examples")
        return client.projects.create(workspace_id=ws.id, name="my-project")


#: Every request any SDK client sent during the session, by API URL (for the OpenAPI
#: contract test, which checks those sent to the test server).
SENT: List[Tuple[str, str, str, dict, Any]] = []


def _record(api_url: str, method: str, path: str, params: Any, body: Any) -> None:
    SENT.append((api_url, method, path, dict(params), body))


_http.request_observers.append(_record)


def wait_for_http(proxy: str, host: str, expect: bytes, timeout_s: float = 60) -> httpx.Response:
    """GET ``/`` of a sandbox host through the proxy until it answers 200 with ``expect``
    (the server in the sandbox starts in the background); bounded in time."""
    deadline = time.monotonic() + timeout_s
    last: Any = None
    while time.monotonic() < deadline:
        try:
            r = httpx.get(f"http://{proxy}/", headers={"Host": host}, timeout=10)
            if r.status_code == 200 and expect in r.content:
                return r
            last = r
        except httpx.TransportError as e:
            last = e
        time.sleep(0.25)
    raise AssertionError(f"{host} never answered {expect!r}: last {last!r}")
