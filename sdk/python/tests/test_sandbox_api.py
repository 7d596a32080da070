"""The SDK's sandbox and account surface against a real server. One sandbox is shared by the
module where the tests allow it (creates are slow under TCG)."""

from __future__ import annotations

import time
import uuid
from typing import Iterator

import pytest

from conftest import Server
from lizard import (
    AuthenticationError,
    ConflictError,
    InvalidArgumentError,
    Lizard,
    NotFoundError,
    ProcessResult,
    Sandbox,
)


@pytest.fixture(scope="module")
def sandbox(server: Server, my_project) -> Iterator[Sandbox]:
    # The reference's static form, with the project by name.
    sb = Sandbox.create("base", project="my-project")
    yield sb
    try:
        sb.kill()
    except NotFoundError:
        pass


def test_create_returns_a_running_sandbox_in_the_project(sandbox: Sandbox, my_project) -> None:
    assert sandbox.state == "running"
    assert sandbox.template == "base"
    assert sandbox.info.project_id == my_project.id
    assert sandbox.sandbox_id and sandbox.id == sandbox.sandbox_id
    assert sandbox.info.end_at


def test_exec_returns_stdout_stderr_and_exit_code(sandbox: Sandbox) -> None:
    r = sandbox.process.exec_("echo out; echo err >&2; exit 3")
    assert isinstance(r, ProcessResult)
    assert (r.stdout, r.stderr, r.exit_code) == ("out\n", "err\n", 3)
    r = sandbox.process.exec_(["printf", "%s|", "a b", "c"])
    assert r.stdout == "a b|c|" and r.exit_code == 0
    r = sandbox.process.exec_("echo $GREETING; pwd", envs={"GREETING": "hi"}, cwd="/tmp")
    assert r.stdout == "hi\n/tmp\n"
    r = sandbox.process.exec_("cat", stdin="fed")
    assert r.stdout == "fed"
    r = sandbox.process.exec_("sleep 30", timeout_ms=500)
    assert r.exit_code == 124 and r.timed_out
    # Streamed: the callbacks see the output as it comes, the result has all of it.
    chunks: list = []
    r = sandbox.process.exec_("for i in 1 2 3; do echo $i; sleep 0.3; done; echo e >&2; exit 2", on_stdout=chunks.append, on_stderr=chunks.append)
    assert (r.stdout, r.stderr, r.exit_code) == ("1\n2\n3\n", "e\n", 2)
    assert len(chunks) >= 3 and "".join(chunks) == "1\n2\n3\ne\n", chunks
    # The guest's own kernel, not the host's.
    assert sandbox.process.exec_("uname -s").stdout == "Linux\n"


def test_fs_round_trip(sandbox: Sandbox) -> None:
    d = f"/tmp/sdk-{uuid.uuid4().hex[:6]}"
    sandbox.fs.make_dir(f"{d}/sub/deeper")
    sandbox.fs.write(f"{d}/a.txt", "héllo\n")
    sandbox.fs.write(f"{d}/b.bin", bytes(range(256)))
    assert sandbox.fs.read(f"{d}/a.txt") == "héllo\n"
    assert sandbox.fs.read_bytes(f"{d}/b.bin") == bytes(range(256))
    entries = sandbox.fs.list(d)
    assert [(e.name, e.type) for e in entries] == [("a.txt", "file"), ("b.bin", "file"), ("sub", "dir")]
    assert entries[1].size == 256 and entries[1].path == f"{d}/b.bin"
    # What the SDK wrote is what a process inside sees.
    assert sandbox.process.exec_(f"cat {d}/a.txt").stdout == "héllo\n"
    sandbox.fs.remove(f"{d}/a.txt")
    sandbox.fs.remove(f"{d}/sub")
    assert [e.name for e in sandbox.fs.list(d)] == ["b.bin"]
    with pytest.raises(NotFoundError) as e:
        sandbox.fs.read(f"{d}/a.txt")
    assert e.value.code == "NOT_FOUND"


def test_connect_list_and_set_timeout(sandbox: Sandbox) -> None:
    again = Sandbox.connect(sandbox.sandbox_id)
    assert again.sandbox_id == sandbox.sandbox_id and again.state == "running"
    assert again.process.exec_("echo connected").stdout == "connected\n"
    assert sandbox.sandbox_id in [s.sandbox_id for s in Sandbox.list()]
    assert sandbox.sandbox_id in [s.sandbox_id for s in Lizard(project="my-project").list()]
    before = sandbox.info.end_at
    sandbox.set_timeout(3_600_000)
    assert sandbox.info.end_at and sandbox.info.end_at > (before or "")
    with pytest.raises(InvalidArgumentError) as e:
        sandbox.set_timeout(0)
    assert e.value.code == "INVALID_ARGUMENT" and e.value.status == 422


def test_expired_sandbox_is_not_found(server: Server) -> None:
    sb = Lizard(project="my-project").create("base", timeout_ms=60_000)
    sb.set_timeout(1_000)
    deadline = time.monotonic() + 30
    while True:
        try:
            Sandbox.connect(sb.sandbox_id)
        except NotFoundError as e:
            assert e.code == "NOT_FOUND"
            break
        assert time.monotonic() < deadline, "the sandbox outlived its timeout"
        time.sleep(0.5)
    with pytest.raises(NotFoundError):
        sb.process.exec_("true")
    with pytest.raises(NotFoundError):
        sb.kill()


def test_create_errors_are_typed(server: Server) -> None:
    with pytest.raises(InvalidArgumentError) as e:
        Sandbox.create("base")  # no project
    assert e.value.code == "INVALID_ARGUMENT"
    with pytest.raises(NotFoundError):
        Sandbox.create("base", project="no-such-project")
    with pytest.raises(InvalidArgumentError):
        Sandbox.create("base", project="my-project", timeout_ms=0)
    with pytest.raises(InvalidArgumentError):
        Sandbox.create("base", project="my-project", lizard_token="lz_not_a_key")
    with pytest.raises(AuthenticationError) as e:
        Lizard(api_key="lz_not_a_key").whoami()
    assert e.value.code == "UNAUTHENTICATED" and e.value.status == 401


def test_pause_and_connect_resume(server: Server) -> None:
    sb = Lizard(project="my-project").create("base")
    sb.process.exec_("echo kept > /tmp/kept; sleep 600 >/dev/null 2>&1 &")
    sb.pause()
    assert sb.state == "paused"
    back = Sandbox.connect(sb.sandbox_id)  # resumes it
    assert back.state == "running"
    assert back.process.exec_("cat /tmp/kept").stdout == "kept\n"
    assert back.process.exec_("pgrep -x sleep").exit_code == 0  # the process survived
    # The guest still reaches the API through its agent (a new channel after the resume).
    api = 'curl -s --max-time 20 -o /dev/null -w "%{http_code}" "$LIZARD_API_URL/v1/whoami"'
    assert back.process.exec_(api).stdout == "401"
    back.pause()
    back.resume()
    assert back.state == "running"
    # A fork has what the sandbox had; from then on each has its own writes.
    [copy] = back.fork()
    assert copy.sandbox_id != back.sandbox_id and copy.state == "running"
    assert copy.process.exec_("cat /tmp/kept").stdout == "kept\n"
    assert copy.process.exec_(api).stdout == "401"
    copy.fs.write("/tmp/kept", "changed\n")
    assert back.fs.read("/tmp/kept") == "kept\n"
    copy.kill()
    back.kill()


def test_tenancy_namespaces(server: Server) -> None:
    lz = Lizard()
    me = lz.whoami()
    assert not me.scoped and me.email and me.key_name == "owner"
    regions = lz.regions.list()
    assert [r.id for r in regions] == ["local"] and regions[0].sandbox_domain == "sandbox.local.lizard.localhost"
    name = f"ns-{uuid.uuid4().hex[:6]}"
    ws = lz.workspaces.create(name=name)
    assert lz.workspaces.find(name).id == ws.id and ws.id in [w.id for w in lz.workspaces.list()]
    prj = lz.projects.create(workspace_id=ws.id, name="alpha")
    assert lz.projects.update(prj.id, name="beta").name == "beta"
    assert lz.projects.get(prj.id).slug == "alpha"  # the slug stays on rename
    assert [p.id for p in lz.projects.list(workspace_id=ws.id)] == [prj.id]
    with pytest.raises(ConflictError) as e:
        lz.workspaces.delete(ws.id)  # not empty
    assert e.value.code == "CONFLICT" and e.value.status == 409
    key = lz.api_keys.create(name=name, projects=[prj.id])
    assert key.key and key.key.startswith(key.prefix) and key.projects == [prj.id]
    listed = {k.id: k for k in lz.api_keys.list()}
    assert listed[key.id].key is None  # shown once
    assert Lizard(api_key=key.key).whoami().projects == [prj.id]
    lz.api_keys.delete(key.id)
    with pytest.raises(AuthenticationError):
        Lizard(api_key=key.key).whoami()
    lz.projects.delete(prj.id)
    lz.workspaces.delete(ws.id)
    with pytest.raises(NotFoundError):
        lz.workspaces.find(ws.id)


def test_billing_and_metrics(server: Server) -> None:
    lz = Lizard(project="my-project")
    balance = lz.billing.balance()
    assert isinstance(balance.balance_nanos, int) and balance["currency"] == "USD"
    page = lz.billing.transactions(limit=5, include_usage=True)
    assert page["items"] and len(page["items"]) <= 5
    assert lz.billing.summary(granularity="day", periods=1)["granularity"] == "day"
    assert "sandboxes" in lz.billing.live().raw
    metrics = lz.metrics.get(project_id=lz.project_id())
    assert metrics.raw is not None
