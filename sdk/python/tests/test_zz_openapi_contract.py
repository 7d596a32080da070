"""The SDK and the server share one contract, the server's OpenAPI document: every request
an SDK sends (in this whole session, plus a sweep over every method) must name a path and
method the document has, with query parameters and JSON fields the document declares.

Runs last (file name) so that it also checks what the other tests sent. A request the
document lacks fails the test: nothing is waived."""

from __future__ import annotations

import re
import shutil
import tempfile
import uuid
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import pytest

import lizard
from conftest import SENT, Server

def _pattern(template: str) -> re.Pattern:
    return re.compile("^" + re.sub(r"\\\{[^}]+\\\}", "[^/]+", re.escape(template)) + "$")


def _resolve(doc: dict, schema: Optional[dict]) -> dict:
    while schema and "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        schema = doc["components"]["schemas"][name]
    return schema or {}


def _properties(doc: dict, schema: dict) -> Optional[set]:
    """The field names an object schema allows; None when it does not restrict them."""
    schema = _resolve(doc, schema)
    for combo in ("allOf", "oneOf", "anyOf"):
        if combo in schema:
            names: set = set()
            for part in schema[combo]:
                p = _properties(doc, part)
                if p is None:
                    return None
                names |= p
            return names
    if "properties" not in schema:
        return None
    return set(schema["properties"])


def violations(doc: dict, sent: List[Tuple[str, str, dict, Any]]) -> List[str]:
    templates = [(t, _pattern(t)) for t in doc["paths"]]
    bad: List[str] = []
    for method, path, params, body in sent:
        matches = [t for t, rx in templates if rx.match(path)]
        # A literal segment beats a parameter (/v1/sandboxes/{id}/files/list vs …).
        matches.sort(key=lambda t: t.count("{"))
        ops = [(t, doc["paths"][t].get(method.lower())) for t in matches]
        ops = [(t, op) for t, op in ops if op]
        if not ops:
            bad.append(f"{method} {path}: no such operation in the OpenAPI document")
            continue
        template, op = ops[0]
        declared = {p["name"] for p in op.get("parameters", []) + doc["paths"][template].get("parameters", []) if p.get("in") == "query"}
        for name in params:
            if name not in declared:
                bad.append(f"{method} {template}: query parameter {name!r} is not in the document ({sorted(declared)})")
        if isinstance(body, dict):
            content = (op.get("requestBody") or {}).get("content", {})
            schema = content.get("application/json", {}).get("schema")
            if schema is None:
                bad.append(f"{method} {template}: sends a JSON body the document does not take")
                continue
            allowed = _properties(doc, schema)
            if allowed is not None:
                for field in body:
                    if field not in allowed:
                        bad.append(f"{method} {template}: field {field!r} is not in the document ({sorted(allowed)})")
    return bad


def _push_dirs() -> Tuple[str, str]:
    """Two directories whose push the server refuses after the uploads (a recipe with a bad
    name, a Dockerfile FROM an image), each with a file the server has not seen."""
    toml_dir, docker_dir = Path(tempfile.mkdtemp()), Path(tempfile.mkdtemp())
    (toml_dir / "lizard.template.toml").write_text('name = "Not_A_Name"\nfrom = "base"\n')
    (docker_dir / "Dockerfile").write_text("FROM python:3.12\nRUN true\n")
    for d in (toml_dir, docker_dir):
        (d / "fresh.txt").write_text(uuid.uuid4().hex)
    return str(toml_dir), str(docker_dir)


def _sweep() -> None:
    """Call every method of the SDK once (ids need not exist: only the requests matter)."""
    lz = lizard.Lizard(project="my-project")
    toml_dir, docker_dir = _push_dirs()
    sb = lizard.Sandbox(lizard.SandboxInfo(sandbox_id="sb_contract", domain="d"), lz.platform)
    calls = [
        lambda: lz.whoami(),
        lambda: lz.list(),
        lambda: lz.connect("sb_contract"),
        lambda: lizard.Sandbox.list(project_id="p", workspace_id="w"),
        lambda: lizard.Sandbox.create(
            "nope", project="no-such", timeout_ms=1, envs={"A": "1"}, metadata={"m": "1"},
            lizard_token="lz_x", vcpus=1, memory_mib=128,
        ),
        lambda: lizard.Sandbox.create("nope", project_id="no-such", volume_name="v", on_timeout="kill"),
        lambda: sb.get_info(),
        lambda: sb.set_timeout(1000),
        lambda: sb.kill(),
        lambda: sb.pause(),
        lambda: sb.resume(),
        lambda: sb.fork(2),
        lambda: sb.list_ports(),
        lambda: sb.fs.write("/x", "y", mode=0o644),
        lambda: sb.fs.read("/x"),
        lambda: sb.fs.list("/"),
        lambda: sb.fs.remove("/x"),
        lambda: sb.fs.make_dir("/x"),
        lambda: sb.process.exec_("true", cwd="/", envs={"A": "b"}, user="root", timeout_ms=1000, stdin="x"),
        lambda: sb.process.exec_(["true"]),
        lambda: sb.process.exec_("true", on_stdout=print),
        lambda: lz.workspaces.list(),
        lambda: lz.workspaces.create(name=""),
        lambda: lz.workspaces.find("nope"),
        lambda: lz.workspaces.delete("nope", force=True),
        lambda: lz.projects.list(workspace_id="nope"),
        lambda: lz.projects.get("nope"),
        lambda: lz.projects.create(workspace_id="nope", name="x"),
        lambda: lz.projects.update("nope", name="x"),
        lambda: lz.projects.delete("nope"),
        lambda: lz.api_keys.list(),
        lambda: lz.api_keys.create(name="x", workspaces=["nope"], projects=["nope"]),
        lambda: lz.api_keys.delete("nope"),
        lambda: lz.regions.list(),
        lambda: lz.volumes.create("contract-vol", size_gb=1, region="nowhere"),
        lambda: lz.volumes.get("contract-vol"),
        lambda: lz.volumes.list(),
        lambda: lz.volumes.delete("contract-vol"),
        lambda: lz.billing.balance(),
        lambda: lz.billing.transactions(limit=1, cursor="c", include_usage=True),
        lambda: lz.billing.summary(granularity="day", periods=2),
        lambda: lz.billing.live(),
        lambda: lz.metrics.get(workspace_id="w", project_id="p", from_="2026-01-01T00:00:00Z", to="2026-01-02T00:00:00Z"),
        lambda: lz.templates.list(),
        lambda: lz.templates.list(workspace="sdk-examples"),
        lambda: lz.templates.get("nope"),
        lambda: lz.templates.delete("nope", workspace="sdk-examples"),
        lambda: lz.templates.get_build("nope", "bld_x"),
        lambda: lz.templates.cancel_build("nope", "bld_x"),
        lambda: list(lz.templates.events("nope", "bld_x")),
        lambda: lz.templates.push(toml_dir),
        lambda: lz.templates.push(docker_dir, name="contract", workspace="sdk-examples"),
        lambda: lizard.Lizard().templates.list(),
    ]
    for call in calls:
        try:
            call()
        except lizard.APIError:
            pass
    for d in (toml_dir, docker_dir):
        shutil.rmtree(d, ignore_errors=True)


def test_every_request_is_in_the_openapi_document(server: Server, openapi: dict, my_project) -> None:
    _sweep()
    sent = [(m, p, q, b) for url, m, p, q, b in SENT if url == server.url]
    assert len(sent) >= 40
    bad = violations(openapi, sent)
    assert not bad, "\n".join(sorted(set(bad)))


def test_the_check_catches_an_unknown_path_or_field(openapi: dict) -> None:
    bad = violations(openapi, [("POST", "/v1/workspaces", {}, {"name": "a", "colour": "red"})])
    assert any("colour" in b for b in bad)
    bad = violations(openapi, [("GET", "/v1/no-such-thing", {}, None)])
    assert bad
    bad = violations(openapi, [("GET", "/v1/sandboxes", {"sort": "x"}, None)])
    assert any("sort" in b for b in bad)
    bad = violations(openapi, [("PATCH", "/v1/regions", {}, None)])
    assert bad
    bad = violations(openapi, [("GET", "/v1/sandboxes/sb_1/files/list", {"path": "/"}, None)])
    assert not bad
