"""The network options of a create (``allow_internet_access``, ``allow_out``, ``deny_out``,
``public_urls``) against a real server: each reaches it (a bad CIDR in either list is
refused), and a sandbox with private URLs answers only to its access token or a signed URL."""

from __future__ import annotations

import time
from urllib.parse import urlsplit

import httpx
import pytest

from conftest import Server
from lizard import InvalidArgumentError, Sandbox


@pytest.mark.parametrize("field", ["allow_out", "deny_out"])
def test_each_cidr_list_reaches_the_server(server: Server, my_project, field: str) -> None:
    with pytest.raises(InvalidArgumentError):
        Sandbox.create("base", project="my-project", **{field: ["not-a-cidr"]})


def _get(proxy: str, path: str, headers: dict) -> httpx.Response:
    return httpx.get(f"http://{proxy}{path}", headers=headers, timeout=10)


def test_a_sandbox_without_internet_and_with_private_urls(server: Server, my_project) -> None:
    sb = Sandbox.create(
        "base",
        project="my-project",
        allow_internet_access=False,
        allow_out=["198.51.100.7", "registry.example", "*.cdn.example"],
        deny_out=["203.0.113.0/24"],
        public_urls=False,
    )
    try:
        token = sb.access_token
        assert token and token.startswith("lzat_")
        # Shown once: a later read of the sandbox does not carry it.
        assert Sandbox.connect(sb.sandbox_id).access_token is None
        sb.process.exec_("nohup python3 -m http.server 8000 --bind 127.0.0.1 >/dev/null 2>&1 &")
        host = sb.get_host(8000)
        # The token opens the URL (once the server in the guest listens) ...
        deadline = time.monotonic() + 60
        while True:
            r = _get(server.proxy, "/", {"Host": host, "X-Lizard-Access-Token": token})
            if r.status_code == 200 or time.monotonic() > deadline:
                break
            time.sleep(0.25)
        assert r.status_code == 200 and b"Directory listing" in r.content, r.text
        assert _get(server.proxy, f"/?lizardAccessToken={token}", {"Host": host}).status_code == 200
        # ... and nothing else does.
        for headers in ({"Host": host}, {"Host": host, "X-Lizard-Access-Token": "lzat_wrong"}):
            assert _get(server.proxy, "/", headers).status_code == 403
        # A signed URL stands in for the token: its host, path and proof, until it expires.
        url = urlsplit(sb.get_signed_url(8000, expires_in=2, path="/?a=1"))
        assert (url.scheme, url.hostname) == ("http", host) and "lizardSignature=" in url.query, url
        r = _get(server.proxy, f"{url.path}?{url.query}", {"Host": host})
        assert r.status_code == 200 and "lizard_signed=" in r.headers["set-cookie"], r.text
        deadline = time.monotonic() + 10
        while _get(server.proxy, f"{url.path}?{url.query}", {"Host": host}).status_code == 200:
            assert time.monotonic() < deadline, "the signed URL outlived its expiry"
            time.sleep(0.25)
        with pytest.raises(InvalidArgumentError):
            sb.get_signed_url(8000, expires_in=0)
    finally:
        sb.kill()
