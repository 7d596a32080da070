"""E2B's own Python SDK (the published `e2b` package, unchanged) against a real `lizard
server`: scripts/test-sdk.sh starts the server and sets LIZARD_SDK_TEST_API_URL,
LIZARD_SDK_TEST_API_KEY and LIZARD_SDK_TEST_PROXY. Each test module gets its own
workspace, project and a key scoped to that project, set as E2B_API_KEY."""

from __future__ import annotations

import os
import ssl
import uuid
from typing import Iterator

import httpx
import pytest

API_URL = os.environ["LIZARD_SDK_TEST_API_URL"]
OWNER_KEY = os.environ["LIZARD_SDK_TEST_API_KEY"]
SANDBOX_URL = "http://" + os.environ["LIZARD_SDK_TEST_PROXY"]
# The sandbox-URL listener's TLS mode, under the local CA `lizard tls init` minted.
TLS_PROXY = os.environ["LIZARD_SDK_TEST_TLS_PROXY"]
TLS_CA = os.environ["LIZARD_SDK_TEST_CA"]


def https_get(host: str, path: str) -> httpx.Response:
    """`https://{host}{path}` as a browser would fetch it (`host` is `name:port` as E2B's
    get_host gives it), sent to the TLS listener: the certificate is checked for the name
    against the local CA alone."""
    name = host.rsplit(":", 1)[0]
    with httpx.Client(verify=ssl.create_default_context(cafile=TLS_CA), timeout=60) as client:
        return client.get(f"https://{TLS_PROXY}{path}", headers={"Host": host}, extensions={"sni_hostname": name})


def lizard(method: str, path: str, key: str = OWNER_KEY, **kw) -> httpx.Response:
    return httpx.request(method, API_URL + path, headers={"X-API-Key": key}, timeout=120, **kw)


def scoped_key(project_name: str) -> tuple[str, str, str]:
    """A new workspace and project, and a key scoped to the project: (key, project id, workspace id)."""
    suffix = uuid.uuid4().hex[:8]
    ws = lizard("POST", "/v1/workspaces", json={"name": f"e2b-{suffix}"}).json()
    prj = lizard("POST", "/v1/projects", json={"workspaceId": ws["id"], "name": f"{project_name}-{suffix}"}).json()
    key = lizard("POST", "/v1/api-keys", json={"name": f"e2b-{suffix}", "projects": [prj["id"]]}).json()
    return key["key"], prj["id"], ws["id"]


def raw_create(env: dict[str, str], **fields) -> dict:
    """A create as E2B's SDKs send it (`POST /v2/sandboxes`), 201 asserted: its answer,
    with the sandbox's envd token, which the SDKs keep to themselves."""
    body = {"templateID": "base", **fields}
    created = httpx.post(env["E2B_API_URL"] + "/v2/sandboxes", headers={"X-API-KEY": env["lizard_key"]}, json=body, timeout=120)
    assert created.status_code == 201, created.text
    return created.json()


def e2b_form(key: str) -> str:
    return "e2b_" + key.encode().hex()


@pytest.fixture(scope="module")
def e2b_env() -> Iterator[dict[str, str]]:
    key, project, workspace = scoped_key("e2b")
    # In E2B's form (`e2b_` + the key's hex), which SDKs 2.25 to 2.50 insist on; newer
    # ones send the plain key too (test_error_paths).
    env = {"E2B_API_URL": API_URL, "E2B_SANDBOX_URL": SANDBOX_URL, "E2B_API_KEY": e2b_form(key)}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    env["project"] = project
    env["lizard_key"] = key
    try:
        yield env
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        lizard("DELETE", f"/v1/workspaces/{workspace}?force=true")
