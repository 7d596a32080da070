"""The core of E2B's Python SDK on Lizard: create, commands (live output, exit codes,
background processes), files, timeouts, pause and connect, kill, and its error paths."""

from __future__ import annotations

import hashlib
import inspect
import os
import time

import httpx
import pytest
from e2b import Sandbox
from e2b.exceptions import AuthenticationException, NotFoundException, SandboxException
from e2b.sandbox.commands.command_handle import CommandExitException

from conftest import SANDBOX_URL, lizard, raw_create


@pytest.fixture
def sbx(e2b_env):
    s = Sandbox.create()
    yield s
    try:
        s.kill()
    except Exception:
        pass


def test_create_run_and_kill(e2b_env):
    s = Sandbox.create(metadata={"who": "e2b-test"})
    assert s.commands.run("echo hi").stdout == "hi\n"
    # E2B's base has pip and `python`, and pip installs into the system Python.
    assert s.commands.run("python --version && pip --version").exit_code == 0
    info = s.get_info()
    assert info.sandbox_id == s.sandbox_id and info.state.value == "running"
    assert info.metadata["who"] == "e2b-test"
    # The same sandbox through Lizard's own API, in the key's project.
    own = lizard("GET", f"/v1/sandboxes/{s.sandbox_id}").json()
    assert own["projectId"] == e2b_env["project"]
    assert s.kill() is True
    assert s.kill() is False
    with pytest.raises(NotFoundException):
        Sandbox.connect(s.sandbox_id)


def test_commands_and_files_are_users_by_default_and_roots_when_asked(sbx):
    # E2B's default: `user`, in /home/user, root by sudo without a password.
    # (The guest's hosts file names its own host: sudo has nothing to complain about.)
    me = sbx.commands.run("whoami; pwd; sudo -n whoami")
    assert (me.stdout, me.stderr) == ("user\n/home/user\nroot\n", "")
    # A relative path is in the user's home; what the user writes is theirs, parents too.
    sbx.files.write("notes/today.txt", "mine")
    owners = sbx.commands.run("stat -c '%U %n' /home/user/notes /home/user/notes/today.txt").stdout
    assert owners == "user /home/user/notes\nuser /home/user/notes/today.txt\n"
    assert sbx.commands.run("echo more >> notes/today.txt && cat notes/today.txt").stdout == "minemore\n"
    assert sbx.files.make_dir("made/deep") is True
    assert sbx.commands.run("stat -c %U made made/deep").stdout == "user\nuser\n"
    # As root when asked: root's home, root's files, and what root keeps the user cannot read.
    assert sbx.commands.run("whoami; pwd", user="root").stdout == "root\n/root\n"
    sbx.files.write("secret.txt", "root only", user="root")
    assert sbx.commands.run("stat -c '%U %a' /root/secret.txt", user="root").stdout == "root 644\n"
    with pytest.raises(CommandExitException):
        sbx.commands.run("cat /root/secret.txt")


def test_exit_codes_env_cwd_and_live_output(sbx):
    with pytest.raises(CommandExitException) as failed:
        sbx.commands.run("echo out; echo err >&2; exit 3")
    assert (failed.value.exit_code, failed.value.stdout, failed.value.stderr) == (3, "out\n", "err\n")
    r = sbx.commands.run("echo $GREETING; pwd", envs={"GREETING": "hello"}, cwd="/tmp")
    assert r.stdout == "hello\n/tmp\n"
    seen: list[tuple[float, str]] = []
    started = time.monotonic()
    sbx.commands.run("echo first; sleep 3; echo second", on_stdout=lambda line: seen.append((time.monotonic() - started, line)))
    assert [line for _, line in seen] == ["first\n", "second\n"]
    # Streamed as it came: the first line long before the second.
    assert seen[1][0] - seen[0][0] > 2, seen


def test_a_command_timeout_ends_the_process(sbx):
    with pytest.raises(Exception):
        sbx.commands.run("sleep 30", timeout=2)
    time.sleep(1)
    assert "sleep 30" not in sbx.commands.run("ps -eo args").stdout


def test_a_background_process_outlives_its_client_and_takes_input(sbx):
    # Newer SDKs close stdin unless asked (`stdin=True`); older ones keep it open, as
    # envd before 0.3.0 did.
    flag = "stdin" in inspect.signature(sbx.commands.run).parameters
    if flag:
        assert sbx.commands.run("cat", timeout=20).stdout == ""
    handle = sbx.commands.run("head -n 1 > /tmp/in.txt; echo done", background=True, **({"stdin": True} if flag else {}))
    assert handle.pid in [p.pid for p in sbx.commands.list()]
    sbx.commands.send_stdin(handle.pid, "typed\n")
    assert handle.wait().stdout == "done\n"
    if hasattr(sbx.commands, "close_stdin"):
        reader = sbx.commands.run("cat; echo closed", background=True, stdin=True)
        sbx.commands.send_stdin(reader.pid, "x")
        sbx.commands.close_stdin(reader.pid)
        assert reader.wait().stdout == "xclosed\n"
    assert sbx.files.read("/tmp/in.txt") == "typed\n"
    sleeper = sbx.commands.run("sleep 300", background=True)
    sleeper.disconnect()
    assert sleeper.pid in [p.pid for p in sbx.commands.list()]
    # Reattached by pid, from another client of the same sandbox.
    again = Sandbox.connect(sbx.sandbox_id)
    assert sleeper.pid in [p.pid for p in again.commands.list()]
    assert sbx.commands.kill(sleeper.pid) is True
    time.sleep(0.5)
    assert sleeper.pid not in [p.pid for p in sbx.commands.list()]
    assert sbx.commands.kill(sleeper.pid) is False


def test_files(sbx):
    info = sbx.files.write("/tmp/e2b/a.txt", "hello")
    assert info.path == "/tmp/e2b/a.txt"
    assert sbx.files.read("/tmp/e2b/a.txt") == "hello"
    assert sbx.files.exists("/tmp/e2b/a.txt") and not sbx.files.exists("/tmp/e2b/none")
    assert sbx.files.make_dir("/tmp/e2b/d") is True
    assert sbx.files.make_dir("/tmp/e2b/d") is False
    entry = sbx.files.get_info("/tmp/e2b/a.txt")
    assert (entry.name, entry.size, entry.type.value) == ("a.txt", 5, "file")
    names = sorted(e.name for e in sbx.files.list("/tmp/e2b"))
    assert names == ["a.txt", "d"]
    moved = sbx.files.rename("/tmp/e2b/a.txt", "/tmp/e2b/d/b.txt")
    assert moved.path == "/tmp/e2b/d/b.txt"
    assert sorted(e.path for e in sbx.files.list("/tmp/e2b", depth=2)) == ["/tmp/e2b/d", "/tmp/e2b/d/b.txt"]
    sbx.files.remove("/tmp/e2b/d")
    assert not sbx.files.exists("/tmp/e2b/d")
    with pytest.raises(NotFoundException):
        sbx.files.read("/tmp/e2b/d/b.txt")
    # Several files in one multipart upload, and 64 MiB of random bytes both ways.
    sbx.files.write_files([{"path": "/tmp/m/1", "data": "one"}, {"path": "/tmp/m/2", "data": b"two"}])
    assert sbx.commands.run("cat /tmp/m/1 /tmp/m/2").stdout == "onetwo"
    blob = os.urandom(64 << 20)
    sbx.files.write("/tmp/blob", blob)
    assert sbx.commands.run("sha256sum < /tmp/blob").stdout.split()[0] == hashlib.sha256(blob).hexdigest()
    assert hashlib.sha256(sbx.files.read("/tmp/blob", format="bytes")).hexdigest() == hashlib.sha256(blob).hexdigest()


def pause(sbx: Sandbox):
    """`pause()` in newer SDKs, `beta_pause()` in older ones."""
    return getattr(sbx, "pause", None) or sbx.beta_pause


def test_timeout_pause_and_connect(sbx):
    sbx.set_timeout(120)
    end = sbx.get_info().end_at
    sbx.commands.run("nohup sh -c 'i=0; while true; do i=$((i+1)); echo $i > /tmp/count; sleep 0.2; done' >/dev/null 2>&1 &")
    time.sleep(1)
    pause(sbx)()
    assert sbx.get_info().state.value == "paused"
    # A second pause is refused (409), which the SDKs answer without raising.
    pause(sbx)()
    again = Sandbox.connect(sbx.sandbox_id)
    assert again.get_info().state.value == "running"
    first = int(again.commands.run("cat /tmp/count").stdout)
    time.sleep(1)
    assert int(again.commands.run("cat /tmp/count").stdout) > first > 0
    # A connect to a running sandbox never shortens its timeout.
    Sandbox.connect(sbx.sandbox_id, timeout=10)
    assert sbx.get_info().end_at >= end
    r = httpx.post(
        os.environ["E2B_API_URL"] + f"/sandboxes/{sbx.sandbox_id}/pause", headers={"X-API-KEY": os.environ["E2B_API_KEY"]}
    )
    assert r.status_code == 204
    r = httpx.post(
        os.environ["E2B_API_URL"] + f"/sandboxes/{sbx.sandbox_id}/pause", headers={"X-API-KEY": os.environ["E2B_API_KEY"]}
    )
    assert (r.status_code, r.json()["code"]) == (409, 409)


def test_error_paths(e2b_env, sbx):
    from conftest import e2b_form, scoped_key

    with pytest.raises(AuthenticationException):
        Sandbox.create(api_key=e2b_form("lz_not_a_key"))
    with pytest.raises(NotFoundException):
        Sandbox.connect("sbx_doesnotexist")
    # Another project's key reaches nothing of this sandbox.
    other_key, _, other_ws = scoped_key("other")
    other_key = e2b_form(other_key)
    try:
        with pytest.raises(NotFoundException):
            Sandbox.connect(sbx.sandbox_id, api_key=other_key)
        assert Sandbox.kill(sbx.sandbox_id, api_key=other_key) is False
    finally:
        lizard("DELETE", f"/v1/workspaces/{other_ws}?force=true")
    # envd refuses a missing or another sandbox's token, and says nothing of the host.
    other = raw_create(e2b_env)
    try:
        for token in [None, other["envdAccessToken"]]:
            headers = {"E2b-Sandbox-Id": sbx.sandbox_id, "E2b-Sandbox-Port": "49983"}
            if token:
                headers["X-Access-Token"] = token
            r = httpx.post(SANDBOX_URL + "/filesystem.Filesystem/Stat", headers=headers, json={"path": "/"})
            assert r.status_code == 401, r.text
            assert r.json()["code"] == 401 and "/var" not in r.text, r.text
    finally:
        httpx.delete(
            e2b_env["E2B_API_URL"] + "/sandboxes/" + other["sandboxID"], headers={"X-API-KEY": e2b_env["E2B_API_KEY"]}
        )
    # A gone sandbox answers as E2B's proxy does.
    r = httpx.get(SANDBOX_URL + "/health", headers={"E2b-Sandbox-Id": "sbx_gone", "E2b-Sandbox-Port": "49983"})
    assert r.status_code == 502 and "was not found" in r.json()["message"]
    with pytest.raises(SandboxException):
        sbx.commands.run("true", user="nosuchuser")


def test_list_filters_and_pages(e2b_env):
    from e2b.sandbox.sandbox_api import SandboxQuery, SandboxState

    tag = os.urandom(4).hex()
    made = [Sandbox.create(metadata={"suite": tag, "n": str(i)}) for i in range(3)]
    try:
        pause(made[0])()
        seen, pages = [], 0
        paginator = Sandbox.list(query=SandboxQuery(metadata={"suite": tag}), limit=2)
        while paginator.has_next and pages < 5:
            seen += paginator.next_items()
            pages += 1
        assert pages == 2, pages
        assert sorted(s.sandbox_id for s in seen) == sorted(s.sandbox_id for s in made)
        assert {s.sandbox_id: s.state.value for s in seen}[made[0].sandbox_id] == "paused"
        running = Sandbox.list(query=SandboxQuery(metadata={"suite": tag}, state=[SandboxState.RUNNING])).next_items()
        assert sorted(s.sandbox_id for s in running) == sorted(s.sandbox_id for s in made[1:])
        one = Sandbox.list(query=SandboxQuery(metadata={"suite": tag, "n": "2"})).next_items()
        assert [s.sandbox_id for s in one] == [made[2].sandbox_id]
        assert one[0].metadata["n"] == "2"
    finally:
        for s in made:
            s.kill()


def test_fork_copies_a_running_sandbox(sbx):
    sbx.commands.run("echo original > ~/f")
    if hasattr(sbx, "fork"):
        copies = sbx.fork(count=2)
    else:
        # SDKs before fork existed: the route as newer ones call it.
        r = httpx.post(
            os.environ["E2B_API_URL"] + f"/sandboxes/{sbx.sandbox_id}/fork",
            headers={"X-API-KEY": os.environ["E2B_API_KEY"]},
            json={"count": 2},
            timeout=300,
        )
        assert r.status_code == 201, r.text
        copies = [Sandbox.connect(c["sandbox"]["sandboxID"]) for c in r.json()]
    try:
        assert len(copies) == 2 and len({c.sandbox_id for c in copies} | {sbx.sandbox_id}) == 3
        for i, copy in enumerate(copies):
            assert not isinstance(copy, Exception), copy
            assert copy.commands.run("cat ~/f").stdout == "original\n"
            copy.commands.run(f"echo copy{i} > ~/f")
        assert sbx.commands.run("cat ~/f").stdout == "original\n"
    finally:
        for c in copies:
            if not isinstance(c, Exception):
                c.kill()


def test_a_create_retried_with_an_idempotency_key_makes_one_sandbox(e2b_env):
    tag = os.urandom(4).hex()
    headers = {"X-API-KEY": e2b_env["lizard_key"], "Idempotency-Key": f"create-{tag}"}
    body = {"templateID": "base", "metadata": {"retry": tag}}
    first = httpx.post(e2b_env["E2B_API_URL"] + "/v2/sandboxes", headers=headers, json=body, timeout=120)
    again = httpx.post(e2b_env["E2B_API_URL"] + "/v2/sandboxes", headers=headers, json=body, timeout=120)
    try:
        assert first.status_code == again.status_code == 201, (first.text, again.text)
        assert again.headers.get("Idempotency-Replayed") == "true"
        assert again.json()["sandboxID"] == first.json()["sandboxID"]
        assert again.json()["envdAccessToken"] == first.json()["envdAccessToken"]
        listed = httpx.get(
            e2b_env["E2B_API_URL"] + "/v2/sandboxes", headers={"X-API-KEY": e2b_env["lizard_key"]},
            params={"metadata": f"retry={tag}"},
        ).json()
        assert [s["sandboxID"] for s in listed] == [first.json()["sandboxID"]]
        other = dict(body, metadata={"retry": "changed"})
        reused = httpx.post(e2b_env["E2B_API_URL"] + "/v2/sandboxes", headers=headers, json=other, timeout=120)
        assert reused.status_code == 422, reused.text
    finally:
        httpx.delete(e2b_env["E2B_API_URL"] + "/sandboxes/" + first.json()["sandboxID"], headers={"X-API-KEY": e2b_env["lizard_key"]})


def test_a_terminal_takes_input_resizes_and_is_killed(sbx):
    from e2b.sandbox.commands.command_handle import PtySize

    term = sbx.pty.create(PtySize(rows=24, cols=80), timeout=0)
    assert sbx.is_running()
    # Moved into place once written: the file's existence means stty has answered.
    sbx.pty.send_stdin(term.pid, b"stty size > /tmp/s.tmp && mv /tmp/s.tmp /tmp/size1; echo marker-$((6*7))\n")
    deadline = time.monotonic() + 60
    while not sbx.files.exists("/tmp/size1"):
        assert time.monotonic() < deadline, "the terminal ran nothing"
        time.sleep(0.3)
    sbx.pty.resize(term.pid, PtySize(rows=30, cols=100))
    sbx.pty.send_stdin(term.pid, b"stty size > /tmp/size2; exit\n")
    out = bytearray()
    try:
        term.wait(on_pty=lambda data: out.extend(data))
    except Exception:
        pass  # a terminal's shell may end with a non-zero status
    assert "marker-42" in out.decode(errors="replace")
    assert sbx.files.read("/tmp/size1") == "24 80\n"
    assert sbx.files.read("/tmp/size2") == "30 100\n"
    other = sbx.pty.create(PtySize(rows=10, cols=10), timeout=0)
    assert other.pid in [p.pid for p in sbx.commands.list()]
    assert sbx.pty.kill(other.pid) is True


def test_metrics_are_the_guests_own(sbx):
    samples = sbx.get_metrics()
    assert len(samples) == 1
    m = samples[0]
    assert m.cpu_count == 1 and 0 <= m.cpu_used_pct <= 100
    assert 256 << 20 < m.mem_total <= 512 << 20 and 0 < m.mem_used < m.mem_total
    assert 0 < m.disk_used < m.disk_total
    # 64 MiB written shows on the disk.
    sbx.commands.run("head -c 67108864 /dev/zero > ~/fill && sync")
    assert sbx.get_metrics()[0].disk_used >= m.disk_used + (60 << 20)


def test_a_polling_watcher_sees_what_happens_in_its_directory(sbx):
    sbx.files.make_dir("/tmp/w")
    handle = sbx.files.watch_dir("/tmp/w", recursive=True)
    sbx.files.write("/tmp/w/a.txt", "one")
    sbx.commands.run("mkdir -p /tmp/w/sub && echo two > /tmp/w/sub/b.txt && mv /tmp/w/a.txt /tmp/w/c.txt && rm /tmp/w/c.txt")
    seen: list[tuple[str, str]] = []
    deadline = time.monotonic() + 30
    while ("c.txt", "remove") not in seen and time.monotonic() < deadline:
        seen += [(e.name, e.type.value) for e in handle.get_new_events()]
        time.sleep(0.3)
    handle.stop()
    for expected in [("a.txt", "create"), ("sub/b.txt", "create"), ("a.txt", "rename"), ("c.txt", "create"), ("c.txt", "remove")]:
        assert expected in seen, (expected, seen)
    with pytest.raises(Exception):
        handle.get_new_events()


def test_signed_file_urls_work_with_no_header_and_only_for_their_file(sbx):
    if not hasattr(sbx, "download_url"):
        pytest.fail("this SDK has no download_url")
    sbx.files.write("/tmp/signed.txt", "signed content")
    url = sbx.download_url("/tmp/signed.txt", use_signature_expiration=60)
    # Fetched as a browser or curl would: no header at all.
    r = httpx.get(url)
    assert (r.status_code, r.text) == (200, "signed content"), r.text
    # The same signature for another path, or altered, or expired, opens nothing.
    assert httpx.get(url.replace("signed.txt", "other.txt")).status_code == 401
    assert httpx.get(url.replace("signature=v1_", "signature=v1_A")).status_code == 401
    expired = sbx.download_url("/tmp/signed.txt", use_signature_expiration=-5)
    assert httpx.get(expired).status_code == 401
    up = sbx.upload_url("/tmp/uploaded.txt")
    r = httpx.post(up, files={"file": ("uploaded.txt", b"uploaded by curl")})
    assert r.status_code == 200, r.text
    assert sbx.files.read("/tmp/uploaded.txt") == "uploaded by curl"
    # A read URL does not write.
    assert httpx.post(url, files={"file": ("x", b"x")}).status_code == 401


def envelope(message: dict) -> bytes:
    """One Connect envelope (JSON codec)."""
    import json
    import struct

    body = json.dumps(message).encode()
    return struct.pack(">BI", 0, len(body)) + body


def test_input_streamed_into_a_process(e2b_env):
    created = raw_create(e2b_env)
    token, sid = created["envdAccessToken"], created["sandboxID"]
    sbx = Sandbox.connect(sid)
    try:
        flag = "stdin" in inspect.signature(sbx.commands.run).parameters
        handle = sbx.commands.run("head -n 3 > /tmp/streamed.txt; echo got", background=True, **({"stdin": True} if flag else {}))

        # StreamInput as the Python SDK sends it: a chunked stream of envelopes.
        def chunks():
            yield envelope({"start": {"process": {"pid": handle.pid}}})
            for i in range(2):
                yield envelope({"data": {"input": {"stdin": __import__("base64").b64encode(f"line {i}\n".encode()).decode()}}})
                time.sleep(0.2)
            yield envelope({"keepalive": {}})

        r = httpx.post(
            SANDBOX_URL + "/process.Process/StreamInput",
            headers={
                "E2b-Sandbox-Id": sid,
                "E2b-Sandbox-Port": "49983",
                "X-Access-Token": token,
                "Content-Type": "application/connect+json",
            },
            content=chunks(),
        )
        assert r.status_code == 200 and r.content.endswith(envelope({})[5:]), r.content
        if hasattr(sbx.commands, "stream_input"):
            sbx.commands.stream_input(handle.pid, iter(["line 2\n"]))
        else:
            sbx.commands.send_stdin(handle.pid, "line 2\n")
        assert handle.wait().stdout == "got\n"
        assert sbx.files.read("/tmp/streamed.txt") == "line 0\nline 1\nline 2\n"
    finally:
        sbx.kill()


def test_gzip_uploads_and_downloads(e2b_env, sbx):
    import gzip

    blob = os.urandom(1 << 20) + b"x" * (1 << 20)
    sbx.files.write("/tmp/gz.bin", blob, gzip=True)
    assert sbx.commands.run("sha256sum < /tmp/gz.bin").stdout.split()[0] == hashlib.sha256(blob).hexdigest()
    assert sbx.files.read("/tmp/gz.bin", format="bytes", gzip=True) == blob

    # The upload as the SDKs send it with gzip (envd 0.5.7): a raw body, Content-Encoding gzip.
    created = raw_create(e2b_env)
    token, sid = created["envdAccessToken"], created["sandboxID"]
    try:
        assert created["envdVersion"] == "0.6.2"
        r = httpx.post(
            SANDBOX_URL + "/files",
            params={"path": "/tmp/raw.bin"},
            headers={
                "E2b-Sandbox-Id": sid,
                "E2b-Sandbox-Port": "49983",
                "X-Access-Token": token,
                "Content-Type": "application/octet-stream",
                "Content-Encoding": "gzip",
            },
            content=gzip.compress(blob),
        )
        assert r.status_code == 200 and r.json()[0]["path"] == "/tmp/raw.bin", r.text
        assert Sandbox.connect(sid).files.read("/tmp/raw.bin", format="bytes") == blob
    finally:
        Sandbox.kill(sid)


def test_a_process_is_found_by_its_tag(e2b_env):
    import struct

    created = raw_create(e2b_env)
    token, sid = created["envdAccessToken"], created["sandboxID"]
    route = {"E2b-Sandbox-Id": sid, "E2b-Sandbox-Port": "49983", "X-Access-Token": token}
    try:
        # A Start naming a tag (the wire allows it; the SDKs read tags back in `list`).
        start = {"process": {"cmd": "/bin/sh", "args": ["-c", "sleep 300"]}, "tag": "web"}
        with httpx.stream(
            "POST",
            SANDBOX_URL + "/process.Process/Start",
            headers={**route, "Content-Type": "application/connect+json"},
            content=envelope(start),
        ) as stream:
            head = stream.iter_bytes().__next__()
        flags, length = struct.unpack(">BI", head[:5])
        pid = __import__("json").loads(head[5 : 5 + length])["event"]["start"]["pid"]
        listed = httpx.post(SANDBOX_URL + "/process.Process/List", headers=route, json={}).json()["processes"]
        assert {"pid": pid, "tag": "web"} in [{"pid": p["pid"], "tag": p.get("tag")} for p in listed], listed
        sbx = Sandbox.connect(sid)
        assert pid in [p.pid for p in sbx.commands.list()]
        assert "web" in [p.tag for p in sbx.commands.list()]
        r = httpx.post(
            SANDBOX_URL + "/process.Process/SendSignal",
            headers=route,
            json={"process": {"tag": "web"}, "signal": "SIGNAL_SIGKILL"},
        )
        assert r.status_code == 200, r.text
        time.sleep(0.5)
        assert pid not in [p.pid for p in sbx.commands.list()]
        gone = httpx.post(
            SANDBOX_URL + "/process.Process/SendSignal",
            headers=route,
            json={"process": {"tag": "web"}, "signal": "SIGNAL_SIGKILL"},
        )
        assert (gone.status_code, gone.json()["code"]) == (404, "not_found"), gone.text
    finally:
        Sandbox.kill(sid)


def test_file_metadata_is_kept_on_the_file_and_read_back(e2b_env):
    created = raw_create(e2b_env)
    token, sid = created["envdAccessToken"], created["sandboxID"]
    envd = {"E2b-Sandbox-Id": sid, "E2b-Sandbox-Port": "49983", "X-Access-Token": token}

    def upload(path: str, **metadata: str) -> httpx.Response:
        headers = {**envd, **{f"X-Metadata-{k}": v for k, v in metadata.items()}}
        return httpx.post(SANDBOX_URL + "/files", params={"path": path}, headers=headers, content=b"data", timeout=60)

    def info(path: str) -> dict:
        return lizard("GET", f"/v1/sandboxes/{sid}/files/info", params={"path": path}).json()

    try:
        # As envd 0.6.2 keeps them: keys lowercased, on the file, in the upload's answer.
        r = upload("/home/user/m/a.txt", Owner="team a", v="1")
        assert r.status_code == 200 and r.json()[0]["metadata"] == {"owner": "team a", "v": "1"}, r.text
        assert info("/home/user/m/a.txt")["metadata"] == {"owner": "team a", "v": "1"}
        # A file written again has the new upload's metadata only; one without has none.
        assert upload("/home/user/m/a.txt", v="2").status_code == 200
        assert info("/home/user/m/a.txt")["metadata"] == {"v": "2"}
        assert upload("/home/user/m/b.txt").status_code == 200
        assert "metadata" not in info("/home/user/m/b.txt")
        # A value past what a file can keep is refused, and nothing is written.
        refused = upload("/home/user/m/c.txt", big="x" * 5000)
        assert refused.status_code == 400 and "metadata" in refused.text, refused.text
        assert lizard("GET", f"/v1/sandboxes/{sid}/files/exists", params={"path": "/home/user/m/c.txt"}).json() == {"exists": False}

        # The guest's /tmp (tmpfs) keeps none: refused, saying so, and nothing written.
        refused = upload("/tmp/t.txt", k="v")
        assert refused.status_code == 400 and "keeps no file metadata" in refused.text, refused.text
        assert lizard("GET", f"/v1/sandboxes/{sid}/files/exists", params={"path": "/tmp/t.txt"}).json() == {"exists": False}

        # Through the SDK, where it has metadata (envd 0.6.2's gate): written, stat and list.
        sbx = Sandbox.connect(sid)
        if "metadata" in inspect.signature(sbx.files.write).parameters:
            written = sbx.files.write("/home/user/m/d.txt", "data", metadata={"Kind": "report"})
            assert written.metadata == {"kind": "report"}
            assert sbx.files.get_info("/home/user/m/d.txt").metadata == {"kind": "report"}
            listed = {e.name: e.metadata for e in sbx.files.list("/home/user/m")}
            assert listed == {"a.txt": {"v": "2"}, "b.txt": None, "d.txt": {"kind": "report"}}, listed
    finally:
        Sandbox.kill(sid)
