"""A sandbox's ports and network through E2B's SDK: public ports by header and by E2B's
host order (`get_host`), private ones behind the traffic token, `autoResume` waking a
paused sandbox for a request, and E2B's egress lists enforced by Lizard's policy."""

from __future__ import annotations

import time

import httpx
import pytest
from e2b import Sandbox
from e2b.sandbox.commands.command_handle import CommandExitException

from conftest import SANDBOX_URL, TLS_PROXY, https_get, lizard, raw_create

INDEX = "/index.txt"


def serve(sbx: Sandbox, port: int = 8000) -> None:
    """A web server on `port` of the sandbox answering `served` at /index.txt."""
    sbx.commands.run("mkdir -p srv && echo served > srv/index.txt")
    sbx.commands.run(f"cd srv && python3 -m http.server {port}", background=True)


def get(headers: dict, path: str = INDEX, wait: bool = False) -> httpx.Response:
    """A request to the sandbox-URL listener; with `wait`, repeated (60 s at most) until
    the guest's server answers."""
    deadline = time.monotonic() + 60
    while True:
        r = httpx.get(SANDBOX_URL + path, headers=headers, timeout=60)
        if not wait or r.status_code == 200 or time.monotonic() > deadline:
            return r
        time.sleep(0.5)


def by_host(host: str, **extra: str) -> dict:
    return {"Host": host, **extra}


def test_ports_are_public_by_header_and_by_e2bs_host(e2b_env):
    sbx = Sandbox.create()
    try:
        serve(sbx)
        sid = sbx.sandbox_id
        route = {"E2b-Sandbox-Id": sid, "E2b-Sandbox-Port": "8000"}
        r = get(route, wait=True)
        assert (r.status_code, r.text) == (200, "served\n")
        # The create's `domain` makes get_host E2B's `{port}-{id}.{domain}`, which the
        # listener routes (and Lizard's own `{id}-{port}.{domain}` beside it). With a TLS
        # listener the domain carries its port, so `https://{get_host(port)}` (how E2B's
        # SDKs make a URL of it) reaches that listener as it is.
        host = sbx.get_host(8000)
        assert host == f"8000-{sid}.sandbox.local.lizard.localhost:{TLS_PROXY.rsplit(':', 1)[1]}", host
        assert get(by_host(host)).text == "served\n"
        secure = https_get(host, INDEX)
        assert (secure.status_code, secure.text) == (200, "served\n")
        assert get(by_host(f"{sid}-8000.sandbox.local.lizard.localhost")).text == "served\n"
        # envd itself by host: its health, and a command with the envd token only.
        assert get(by_host(sbx.get_host(49983)), "/health").status_code == 204
        # The platform's own ports are never public.
        assert get({**route, "E2b-Sandbox-Port": "49999"}, "/health").status_code == 401
        closed = get({**route, "E2b-Sandbox-Port": "8001"}, "/")
        assert closed.status_code == 502 and "port 8001 is not open" in closed.json()["message"]
    finally:
        sbx.kill()


def test_private_ports_need_the_traffic_token(e2b_env):
    created = raw_create(e2b_env, network={"allowPublicTraffic": False})
    sid, envd, traffic = created["sandboxID"], created["envdAccessToken"], created["trafficAccessToken"]
    assert traffic and traffic != envd
    sbx = Sandbox.connect(sid)
    try:
        serve(sbx)
        route = {"E2b-Sandbox-Id": sid, "E2b-Sandbox-Port": "8000"}
        assert get({**route, "E2B-Traffic-Access-Token": traffic}, wait=True).text == "served\n"
        assert get({**route, "X-Access-Token": envd}).status_code == 200
        assert get(route).status_code == 401
        host = by_host(f"8000-{sid}.sandbox.local.lizard.localhost")
        assert get({**host, "E2B-Traffic-Access-Token": traffic}).text == "served\n"
        assert get(host).status_code == 403
        # Neither token stands in for the other: the traffic token opens no envd.
        assert get({**host, "E2B-Traffic-Access-Token": envd}).status_code == 403
        run = {"E2b-Sandbox-Id": sid, "X-Access-Token": traffic, "Content-Type": "application/json"}
        assert httpx.post(SANDBOX_URL + "/process.Process/List", headers=run, json={}).status_code == 401
        # Another sandbox's traffic token opens nothing here.
        other = raw_create(e2b_env, network={"allowPublicTraffic": False})
        try:
            assert get({**host, "E2B-Traffic-Access-Token": other["trafficAccessToken"]}).status_code == 403
        finally:
            Sandbox.kill(other["sandboxID"])
    finally:
        sbx.kill()


def pause(e2b_env, sid: str) -> None:
    r = httpx.post(f"{e2b_env['E2B_API_URL']}/sandboxes/{sid}/pause", headers={"X-API-KEY": e2b_env["lizard_key"]}, timeout=120)
    assert r.status_code == 204, r.text
    assert Sandbox.get_info(sid).state.value == "paused"


def test_a_request_wakes_a_paused_sandbox_made_with_auto_resume(e2b_env):
    # As the SDKs send `lifecycle={"on_timeout": "pause", "auto_resume": True}`.
    waking = raw_create(e2b_env, autoPause=True, autoResume={"enabled": True})["sandboxID"]
    sleeping = raw_create(e2b_env, autoPause=True)["sandboxID"]
    try:
        for sid in (waking, sleeping):
            serve(Sandbox.connect(sid))
            assert get({"E2b-Sandbox-Id": sid, "E2b-Sandbox-Port": "8000"}, wait=True).status_code == 200
            pause(e2b_env, sid)
        detail = httpx.get(f"{e2b_env['E2B_API_URL']}/sandboxes/{waking}", headers={"X-API-KEY": e2b_env["lizard_key"]})
        assert detail.json()["lifecycle"] == {"autoResume": True, "onTimeout": "pause"}
        # The server process was paused with the rest: the request finds it serving.
        r = get(by_host(f"8000-{waking}.sandbox.local.lizard.localhost"))
        assert (r.status_code, r.text) == (200, "served\n")
        assert Sandbox.get_info(waking).state.value == "running"
        # Without autoResume a request finds it not running, and it stays paused.
        assert get(by_host(f"8000-{sleeping}.sandbox.local.lizard.localhost")).status_code != 200
        assert get({"E2b-Sandbox-Id": sleeping, "E2b-Sandbox-Port": "8000"}).status_code == 502
        assert Sandbox.get_info(sleeping).state.value == "paused"
    finally:
        Sandbox.kill(waking)
        Sandbox.kill(sleeping)


def test_egress_lists_are_enforced(e2b_env):
    """`denyOut: [0.0.0.0/0]` with `allowOut` naming the npm registry: the registry answers
    by name, and not by its bare address (allowed by no entry), until `update_network`
    opens everything, and again after it closes. The registry is the one the guest's npm
    is configured with (the only outside host a test may reach)."""
    sbx = Sandbox.create()
    try:
        registry = httpx.URL(sbx.commands.run("npm config get registry").stdout.strip()).host
    finally:
        sbx.kill()
    assert registry
    sbx = Sandbox.create(network={"deny_out": ["0.0.0.0/0"], "allow_out": [registry]})
    try:
        version = sbx.commands.run("npm view left-pad version", timeout=150).stdout.strip()
        assert version.count(".") == 2, version
        address = sbx.commands.run(f"getent ahostsv4 {registry} | head -1").stdout.split()[0]
        by_address = f"curl -s -o /dev/null --max-time 10 http://{address}/"
        with pytest.raises(CommandExitException):
            sbx.commands.run(by_address, timeout=30)
        # Updated in place: no lists, everything open (the address answers), then closed
        # again, as before.
        sbx.update_network({})
        sbx.commands.run(by_address, timeout=30)
        sbx.update_network({"deny_out": ["0.0.0.0/0"], "allow_out": [registry]})
        with pytest.raises(CommandExitException):
            sbx.commands.run(by_address, timeout=30)
        assert sbx.commands.run("npm view left-pad version", timeout=150).stdout.strip() == version
    finally:
        sbx.kill()
    # What Lizard cannot hold is refused, saying why, and nothing is made.
    before = len(lizard("GET", f"/v1/sandboxes?projectId={e2b_env['project']}").json())
    for network, says in [
        ({"allowOut": ["8.8.8.8"], "denyOut": ["8.8.8.0/24"]}, "overlaps denyOut"),
        ({"egressProxy": {"address": "127.0.0.1:1080"}}, "network.egressProxy is not served"),
    ]:
        update = httpx.put(
            f"{e2b_env['E2B_API_URL']}/sandboxes/{sbx.sandbox_id}/network",
            headers={"X-API-KEY": e2b_env["lizard_key"]},
            json=network,
            timeout=60,
        )
        assert update.status_code == 422 and says in update.json()["message"], update.text
        r = httpx.post(
            e2b_env["E2B_API_URL"] + "/v2/sandboxes",
            headers={"X-API-KEY": e2b_env["lizard_key"]},
            json={"templateID": "base", "network": network},
            timeout=60,
        )
        assert r.status_code == 422 and says in r.json()["message"], r.text
    assert len(lizard("GET", f"/v1/sandboxes?projectId={e2b_env['project']}").json()) == before
