"""``lizard.services`` against a real server: a directory deployed as a service answers at
its URL through the proxy, a second version replaces it, a version failing its health
check raises ``DeployError`` while the previous one serves on, logs carry the app's
output, and a delete frees the name (the URL answers 404)."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

import lizard
from conftest import Server, wait_for_http

APP = """
import http.server
VERSION = open('version.txt').read().strip()
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        code = 500 if VERSION.startswith('broken') else 200
        self.send_response(code)
        self.end_headers()
        self.wfile.write(VERSION.encode())
    def log_message(self, fmt, *args):
        print('request', fmt % args, flush=True)
print('app', VERSION, 'starting', flush=True)
http.server.ThreadingHTTPServer(('0.0.0.0', 8000), H).serve_forever()
"""

FAST = {"intervalMs": 1000, "graceMs": 5000}


def app(tmp_path: Path, version: str) -> str:
    (tmp_path / "app.py").write_text(APP)
    (tmp_path / "version.txt").write_text(version)
    (tmp_path / ".gitignore").write_text("secret.txt\n")
    (tmp_path / "secret.txt").write_text("never uploaded")
    return str(tmp_path)


def test_a_directory_deploys_as_a_service(server: Server, my_project: lizard.Project, tmp_path: Path) -> None:
    client = lizard.Lizard(project=my_project.id)
    name = "sdk-py-svc"
    svc = client.services.deploy(app(tmp_path, "v1"), name, cmd="python3 app.py", port=8000, health=FAST)
    try:
        assert svc.status == "live" and svc.live_version == 1
        host = svc.url.split("//", 1)[1].split(":", 1)[0]
        assert host == f"{name}.svc.local.lizard.localhost"
        wait_for_http(server.proxy, host, b"v1")
        assert name in [s.name for s in client.services.list()]
        with pytest.raises(lizard.ConflictError):
            lizard.Lizard(project=my_project.id).services._http.post(
                "/v1/services",
                json={"name": name, "projectId": my_project.id, "spec": {"cmd": "x", "port": 1}, "files": []},
            )

        svc = client.services.deploy(app(tmp_path, "v2"), name, cmd="python3 app.py", port=8000, health=FAST)
        assert svc.live_version == 2
        wait_for_http(server.proxy, host, b"v2")
        logs = "".join(line["data"] for line in client.services.logs(name))
        assert "app v2 starting" in logs

        with pytest.raises(lizard.DeployError) as failed:
            client.services.deploy(app(tmp_path, "broken"), name, cmd="python3 app.py", port=8000, health=FAST)
        assert failed.value.code == "UNHEALTHY" and "500" in failed.value.message
        assert client.services.get(name).live_version == 2
        wait_for_http(server.proxy, host, b"v2")
    finally:
        client.services.delete(name)
    with pytest.raises(lizard.NotFoundError):
        client.services.get(name)
    assert httpx.get(f"http://{server.proxy}/", headers={"Host": host}, timeout=30).status_code == 404


def test_a_deploy_without_a_port_is_refused(my_project: lizard.Project, tmp_path: Path) -> None:
    client = lizard.Lizard(project=my_project.id)
    with pytest.raises(lizard.InvalidArgumentError) as e:
        client.services.deploy(app(tmp_path, "v1"), "sdk-py-noport", cmd="python3 app.py", port=0)
    assert "port" in str(e.value)
    with pytest.raises(lizard.NotFoundError):
        client.services.get("sdk-py-noport")
