"""E2B's Template SDK on Lizard, through E2B's own Python package: `Template.build` with
each kind of step builds on Lizard's own builder (a rebuild with one step changed shows
the steps before it cached), sandboxes start from the result, a failing step fails the
build with its output, what Lizard cannot build is refused at once, and `Template.exists`
and delete."""

from __future__ import annotations

import os

import httpx
import pytest
from e2b import Sandbox, Template, wait_for_port
from e2b.exceptions import BuildException

from conftest import API_URL


def template(context: str, marker: str):
    return (
        Template(file_context_path=context)
        .from_template("base")
        .apt_install(["jq"])
        .pip_install(["six"])
        .npm_install(["left-pad"], g=True)
        .copy("app", "/home/user/app")
        .copy("run.sh", "/opt/run.sh", mode=0o755)
        .set_envs({"GREETING": "hi there"})
        .run_cmd("whoami > /home/user/whoami")
        .run_cmd("mkdir -p /srv && echo root-only > /srv/r", user="root")
        .set_workdir("/home/user/app")
        .run_cmd(f"echo {marker} > marker")
        .set_start_cmd("python3 -m http.server 8000", wait_for_port(8000))
    )


def test_a_template_builds_each_kind_of_step_and_rebuilds_from_the_cache(e2b_env, tmp_path):
    (tmp_path / "app").mkdir()
    (tmp_path / "app" / "main.txt").write_text("hello")
    (tmp_path / "run.sh").write_text("#!/bin/sh\necho ran\n")
    name = "e2b-tpl-" + os.urandom(3).hex()
    logs = []
    built = Template.build(template(str(tmp_path), "one"), name, on_build_logs=logs.append)
    assert built.template_id == name
    messages = [e.message for e in logs]
    assert any("Template created with ID" in m for m in messages), messages
    assert any(m.endswith(f"Template {name} is ready") for m in messages), messages
    assert Template.exists(name) is True
    assert Template.exists("e2b-no-such-template") is False

    sbx = Sandbox.create(name)
    try:
        run = lambda cmd: sbx.commands.run(cmd).stdout  # noqa: E731
        assert run("cat /home/user/app/main.txt") == "hello"
        # What the package steps installed, through apt, pip and npm.
        assert run("echo '{\"a\": 1}' | jq .a") == "1\n"
        assert run("python -c 'import six; print(six.__name__)'") == "six\n"
        assert run("test -d \"$(npm root -g)/left-pad\" && echo ok") == "ok\n"
        assert run("/opt/run.sh") == "ran\n"
        assert run("stat -c %a /opt/run.sh") == "755\n"
        assert run("stat -c %U /home/user/app/main.txt") == "user\n"
        assert run("cat /home/user/whoami") == "user\n"
        assert run("cat /srv/r") == "root-only\n"
        assert run("echo $GREETING") == "hi there\n"
        assert run("pwd") == "/home/user/app\n"
        assert run("cat marker") == "one\n"
        # The start command runs in the sandbox, as it did in the snapshot.
        assert run("curl -s -o /dev/null -w '%{http_code}' http://127.0.0.1:8000/") == "200"
    finally:
        sbx.kill()

    # One step changed: the steps before it come from the cache.
    logs.clear()
    Template.build(template(str(tmp_path), "two"), name, on_build_logs=logs.append)
    steps = [e.message for e in logs if e.message.startswith("[")]
    assert steps and all(m.endswith("CACHED") for m in steps if "copy" in m), steps
    assert not any(m.endswith("CACHED") for m in steps if "echo two" in m), steps
    sbx = Sandbox.create(name)
    try:
        assert sbx.commands.run("cat marker").stdout == "two\n"
    finally:
        sbx.kill()

    # Deleted, it is gone.
    headers = {"X-API-KEY": e2b_env["lizard_key"]}
    assert httpx.delete(f"{API_URL}/templates/{name}", headers=headers, timeout=60).status_code == 204
    assert Template.exists(name) is False


def test_a_failing_step_fails_the_build_with_its_output_and_bad_bases_are_refused(e2b_env, tmp_path):
    name = "e2b-fail-" + os.urandom(3).hex()
    failing = Template().from_template("base").run_cmd("echo before").run_cmd("echo it-broke >&2; exit 3")
    logs = []
    with pytest.raises(BuildException) as failed:
        Template.build(failing, name, on_build_logs=logs.append)
    assert "it-broke" in str(failed.value), failed.value
    assert any(e.level == "error" and "it-broke" in e.message for e in logs), [e.message for e in logs]

    # A base from an image registry: refused before anything is built.
    with pytest.raises(Exception) as refused:
        Template.build(Template().from_image("ubuntu:22.04").run_cmd("true"), name)
    assert "cannot be a base" in str(refused.value), refused.value
    # A name Lizard's templates cannot have.
    with pytest.raises(Exception) as bad:
        Template.build(Template().from_template("base"), "Bad_Name")
    assert "template name" in str(bad.value), bad.value


def test_an_upload_url_takes_one_upload_of_its_files_and_nothing_else(e2b_env):
    import io
    import tarfile

    headers = {"X-API-KEY": e2b_env["lizard_key"]}
    files_hash = os.urandom(32).hex()
    link = httpx.get(f"{API_URL}/templates/any/files/{files_hash}", headers=headers, timeout=60)
    assert link.status_code == 201 and link.json()["present"] is False, link.text
    url = link.json()["url"]
    data = io.BytesIO()
    with tarfile.open(fileobj=data, mode="w:gz") as tar:
        info = tarfile.TarInfo("f.txt")
        info.size = 2
        tar.addfile(info, io.BytesIO(b"hi"))
    body = data.getvalue()
    # No key and no token; a made-up token; the token for another hash: refused.
    assert httpx.put(url.split("?")[0], content=body, timeout=60).status_code == 401
    assert httpx.put(url.split("=")[0] + "=" + "0" * 64, content=body, timeout=60).status_code == 403
    other = url.replace(files_hash, os.urandom(32).hex())
    assert httpx.put(other, content=body, timeout=60).status_code == 403
    # The URL alone takes its upload once (the refusal above spent it: a new one).
    url = httpx.get(f"{API_URL}/templates/any/files/{files_hash}", headers=headers, timeout=60).json()["url"]
    assert httpx.put(url, content=body, timeout=60).status_code == 200
    assert httpx.put(url, content=body, timeout=60).status_code == 403
    again = httpx.get(f"{API_URL}/templates/any/files/{files_hash}", headers=headers, timeout=60).json()
    assert again == {"present": True}, again
    # A path out of the archive is refused, nothing kept.
    bad_hash = os.urandom(32).hex()
    evil = io.BytesIO()
    with tarfile.open(fileobj=evil, mode="w") as tar:
        info = tarfile.TarInfo("../evil")
        info.size = 1
        tar.addfile(info, io.BytesIO(b"x"))
    url = httpx.get(f"{API_URL}/templates/any/files/{bad_hash}", headers=headers, timeout=60).json()["url"]
    refused = httpx.put(url, content=evil.getvalue(), timeout=60)
    assert refused.status_code == 422 and "archive" in refused.text, refused.text
    # An upload is bounded as it is unpacked: a small gzip of 600 MiB is refused, nothing kept.
    import zlib

    packer = zlib.compressobj(1, zlib.DEFLATED, 31)
    bomb = b"".join(packer.compress(bytes(1 << 20)) for _ in range(600)) + packer.flush()
    assert len(bomb) < 4 << 20
    big_hash = os.urandom(32).hex()
    url = httpx.get(f"{API_URL}/templates/any/files/{big_hash}", headers=headers, timeout=60).json()["url"]
    too_big = httpx.put(url, content=bomb, timeout=120)
    assert too_big.status_code == 422 and "at most 576 MiB" in too_big.text, too_big.text
    after = httpx.get(f"{API_URL}/templates/any/files/{big_hash}", headers=headers, timeout=60).json()
    assert after["present"] is False, after


def test_a_debian_image_is_made_from_debians_archive(e2b_env):
    # `from_debian_image(suite)`: the node makes that suite's root from Debian's archive
    # (not from an image registry); E2B's steps then run as `user`, as on E2B.
    name = "e2b-debian-" + os.urandom(3).hex()
    t = Template().from_debian_image("bookworm").run_cmd("cat /etc/debian_version > /home/user/version; id -un >> /home/user/version")
    Template.build(t, name)
    sbx = Sandbox.create(name)
    try:
        version, who = sbx.files.read("/home/user/version").split()
        assert version.startswith("12.") and who == "user", (version, who)
        assert sbx.commands.run("sudo -n id -u").stdout == "0\n"
    finally:
        sbx.kill()
    # A suite not offered is refused at once, naming those that are.
    with pytest.raises(Exception) as refused:
        Template.build(Template().from_debian_image("jessie").run_cmd("true"), name)
    assert "from_debian_image: bookworm, trixie, forky, sid" in str(refused.value), refused.value


def test_the_async_template_builds_too(e2b_env, tmp_path):
    import asyncio

    from e2b import AsyncSandbox, AsyncTemplate

    name = "e2b-async-" + os.urandom(3).hex()

    async def build_and_use():
        t = AsyncTemplate().from_template("base").set_envs({"ASYNC": "1"}).run_cmd("echo $ASYNC > /home/user/a")
        await AsyncTemplate.build(t, name)
        assert await AsyncTemplate.exists(name) is True
        sbx = await AsyncSandbox.create(name)
        try:
            return (await sbx.commands.run("cat /home/user/a")).stdout
        finally:
            await sbx.kill()

    assert asyncio.run(build_and_use()) == "1\n"


def test_tags_name_builds_that_creates_start_from(e2b_env):
    """`name:tag` names one build: a build requested under a tag takes it when ready, a
    rebuild moves only `default`, tags are given, listed and removed (by the SDK where it
    has them, else by E2B's own routes), and a create of a tag starts from its build."""
    name = "e2b-tags-" + os.urandom(3).hex()
    headers = {"X-API-KEY": e2b_env["lizard_key"]}
    Template.build(Template().from_template("base").run_cmd("echo one > /home/user/v"), f"{name}:v1")
    Template.build(Template().from_template("base").run_cmd("echo two > /home/user/v"), name)

    def version(reference: str) -> str:
        sbx = Sandbox.create(reference)
        try:
            return sbx.commands.run("cat /home/user/v").stdout
        finally:
            sbx.kill()

    assert (version(f"{name}:v1"), version(name), version(f"{name}:default")) == ("one\n", "two\n", "two\n")
    if hasattr(Template, "assign_tags"):
        assert Template.assign_tags(f"{name}:v1", ["stable"]).tags == ["stable"]
        listed = {t.tag: t.build_id for t in Template.get_tags(name)}
        Template.remove_tags(name, ["v1"])
        with pytest.raises(Exception, match="no tag nope"):
            Template.remove_tags(name, ["nope"])
    else:
        given = httpx.post(f"{API_URL}/templates/tags", headers=headers, json={"target": f"{name}:v1", "tags": ["stable"]})
        assert given.status_code == 201 and given.json()["tags"] == ["stable"], given.text
        listed = {t["tag"]: t["buildID"] for t in httpx.get(f"{API_URL}/templates/{name}/tags", headers=headers).json()}
        removed = httpx.request("DELETE", f"{API_URL}/templates/tags", headers=headers, json={"name": name, "tags": ["v1"]})
        assert removed.status_code == 204, removed.text
        missing = httpx.request("DELETE", f"{API_URL}/templates/tags", headers=headers, json={"name": name, "tags": ["nope"]})
        assert missing.status_code == 404 and "no tag nope" in missing.text, missing.text
    assert set(listed) == {"default", "v1", "stable"} and listed["v1"] == listed["stable"] != listed["default"]
    assert version(f"{name}:stable") == "one\n"
    with pytest.raises(Exception, match="no tag v1"):
        Sandbox.create(f"{name}:v1")
    # `default` is always the latest build: it is not given by hand.
    refused = httpx.post(f"{API_URL}/templates/tags", headers=headers, json={"target": name, "tags": ["default"]})
    assert refused.status_code == 422 and "cannot be moved" in refused.text, refused.text
    Template.delete(name) if hasattr(Template, "delete") else httpx.delete(f"{API_URL}/templates/{name}", headers=headers)
