"""Every Python example of the SDK reference, as written, against a real server.

Lines of the reference are kept verbatim; checks are inserted between them. The examples
that name ``codex`` run on the real ``codex`` template."""

from __future__ import annotations

import asyncio
import uuid

import pytest

import lizard as lizard_sdk
from conftest import Server, wait_for_http


def test_quickstart_python_http_server(server: Server, my_project: lizard_sdk.Project) -> None:
    # --- reference: Python quickstart -------------------------------------------------
    from lizard import Lizard
    # A client is pinned to one project — sandboxes are billed per project, so a
    # project is required (its ID, slug, or name). api_key defaults to LIZARD_API_KEY.
    lizard = Lizard(project="my-project")
    # Boot a Python microVM from the 'code-interpreter-v1' template
    sandbox = lizard.create("code-interpreter-v1")
    # Write a script into the microVM filesystem
    sandbox.fs.write("/app/main.py", """
import http.server, socketserver
class Handler(http.server.SimpleHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"hello from Lizard")
with socketserver.TCPServer(("", 3000), Handler) as httpd:
    httpd.serve_forever()
""")
    # Execute a process inside the microVM
    sandbox.process.exec_("python /app/main.py &")
    print(f"Live at https://{sandbox.get_host(3000)}")
    # --- checks: a real HTTP request through the sandbox URL -----------------------------
    assert sandbox.info.project_id == my_project.id
    host = sandbox.get_host(3000)
    assert host == f"{sandbox.sandbox_id}-3000.sandbox.local.lizard.localhost"
    r = wait_for_http(server.proxy, host, b"hello from Lizard")
    assert r.content == b"hello from Lizard"
    sandbox_id = sandbox.sandbox_id
    # --- reference ---------------------------------------------------------------------
    sandbox.kill()
    # --- checks: gone for good -----------------------------------------------------------
    with pytest.raises(lizard_sdk.NotFoundError) as e:
        lizard_sdk.Sandbox.connect(sandbox_id)
    assert e.value.code == "NOT_FOUND" and e.value.status == 404
    assert all(s.sandbox_id != sandbox_id for s in lizard.list())


def test_volume_survives_the_first_sandbox(server: Server, my_project: lizard_sdk.Project) -> None:
    from lizard import Lizard
    lizard = Lizard(project="my-project")
    # A volume left by an earlier run would make the check below vacuous.
    try:
        lizard.volumes.delete("agent-scratch")
    except lizard_sdk.NotFoundError:
        pass
    # --- reference: volumes ---------------------------------------------------------------
    vol = lizard.volumes.get_or_create("agent-scratch", size_gb=10)
    first = lizard.create("codex", volume_name="agent-scratch")
    first.process.exec_('echo "notes" > /workspace/notes.txt')
    first.kill() # sandbox gone, /workspace survives
    second = lizard.create("codex", volume_name="agent-scratch")
    print(second.fs.read("/workspace/notes.txt")) # "notes"
    # --- checks ----------------------------------------------------------------------------
    assert vol.name == "agent-scratch" and vol.project_id == my_project.id
    assert second.fs.read("/workspace/notes.txt") == "notes\n"
    assert lizard.volumes.get_or_create("agent-scratch").id == vol.id
    with pytest.raises(lizard_sdk.ConflictError) as e:
        lizard.volumes.create("agent-scratch")
    assert e.value.code == "CONFLICT"
    assert [v.name for v in lizard.volumes.list()].count("agent-scratch") == 1
    second.kill()
    lizard.volumes.delete("agent-scratch")
    with pytest.raises(lizard_sdk.NotFoundError):
        lizard.volumes.get("agent-scratch")


def test_workspace_per_user_with_scoped_key(server: Server) -> None:
    from lizard import Lizard, Sandbox
    lizard = Lizard()
    user_id = uuid.uuid4().hex[:8]
    # --- reference: a workspace and a scoped key per user -----------------------------------
    ws = lizard.workspaces.create(name=f"user-{user_id}")
    prj = lizard.projects.create(workspace_id=ws.id, name="default")
    key = lizard.api_keys.create(name=f"user-{user_id}", workspaces=[ws.id])
    sandbox = Sandbox.create("codex", project_id=prj.id, lizard_token=key.key)
    result = sandbox.process.exec_("lizard volume list")
    # --- checks: the CLI in the sandbox ran as that user ----------------------------------
    assert result.exit_code == 0, result
    who = sandbox.process.exec_("lizard whoami --json")
    assert who.exit_code == 0, who
    assert f'"keyId":"{key.id}"' in who.stdout.replace(" ", ""), who.stdout
    assert '"scoped":true' in who.stdout.replace(" ", ""), who.stdout
    # The guest's API address (forwarded by its agent) needs a key like any client…
    other = lizard.workspaces.create(name=f"other-{user_id}")
    probe = sandbox.process.exec_('echo $LIZARD_API_URL; curl -s -o /dev/null -w "%{http_code}" "$LIZARD_API_URL/v1/whoami"')
    assert probe.stdout == "http://127.0.0.1:49171\n401", probe
    # …and the sandbox's key reaches nothing outside its workspace.
    peek = sandbox.process.exec_(
        f'curl -s -o /dev/null -w "%{{http_code}}" -H "X-API-Key: $LIZARD_API_KEY" "$LIZARD_API_URL/v1/workspaces/{other.id}"'
    )
    assert peek.stdout == "404", peek
    listed = sandbox.process.exec_("lizard workspace list --json")
    assert listed.exit_code == 0 and other.id not in listed.stdout and ws.id in listed.stdout, listed
    # The key reaches nothing outside ws and cannot mint a broader key.
    scoped = Lizard(api_key=key.key)
    assert [w.id for w in scoped.workspaces.list()] == [ws.id]
    with pytest.raises(lizard_sdk.NotFoundError):
        scoped.workspaces.find(other.id)
    with pytest.raises(lizard_sdk.PermissionDeniedError) as e:
        scoped.api_keys.create(name="wider")
    assert e.value.code == "FORBIDDEN" and e.value.status == 403
    # Account-wide routes are refused with ACCOUNT_SCOPE_REQUIRED; whoami shows no email.
    me = scoped.whoami()
    assert me.scoped and me.email is None and me.workspaces == [ws.id]
    with pytest.raises(lizard_sdk.PermissionDeniedError) as e:
        scoped.platform.get("/v1/account")
    assert e.value.code == "ACCOUNT_SCOPE_REQUIRED"
    with pytest.raises(lizard_sdk.PermissionDeniedError) as e:
        scoped.billing.balance()
    assert e.value.code == "ACCOUNT_SCOPE_REQUIRED"
    sandbox.kill()
    lizard.workspaces.delete(other.id)
    lizard.workspaces.delete(ws.id, force=True)
    with pytest.raises(lizard_sdk.NotFoundError):
        lizard.workspaces.find(ws.id)


# --- The same examples in the async flavour (AsyncLizard / AsyncSandbox) --------------------


def test_async_quickstart_python_http_server(server: Server, my_project: lizard_sdk.Project) -> None:
    async def main() -> None:
        from lizard import AsyncLizard
        async with AsyncLizard(project="my-project") as lizard:
            sandbox = await lizard.create("code-interpreter-v1")
            await sandbox.fs.write("/app/main.py", """
import http.server, socketserver
class Handler(http.server.SimpleHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"hello from Lizard")
with socketserver.TCPServer(("", 3000), Handler) as httpd:
    httpd.serve_forever()
""")
            await sandbox.process.exec_("python /app/main.py &")
            print(f"Live at https://{sandbox.get_host(3000)}")
            # --- checks ------------------------------------------------------------------
            assert isinstance(sandbox, lizard_sdk.AsyncSandbox)
            assert sandbox.info.project_id == my_project.id
            r = wait_for_http(server.proxy, sandbox.get_host(3000), b"hello from Lizard")
            assert r.content == b"hello from Lizard"
            await sandbox.kill()
            with pytest.raises(lizard_sdk.NotFoundError) as e:
                await lizard_sdk.AsyncSandbox.connect(sandbox.sandbox_id)
            assert e.value.code == "NOT_FOUND" and e.value.status == 404
            assert all(s.sandbox_id != sandbox.sandbox_id for s in await lizard.list())

    asyncio.run(main())


def test_async_volume_survives_the_first_sandbox(server: Server, my_project: lizard_sdk.Project) -> None:
    async def main() -> None:
        from lizard import AsyncLizard
        lizard = AsyncLizard(project="my-project")
        try:
            await lizard.volumes.delete("agent-scratch-async")
        except lizard_sdk.NotFoundError:
            pass
        vol = await lizard.volumes.get_or_create("agent-scratch-async", size_gb=10)
        first = await lizard.create("codex", volume_name="agent-scratch-async")
        await first.process.exec_('echo "notes" > /workspace/notes.txt')
        await first.kill()  # sandbox gone, /workspace survives
        second = await lizard.create("codex", volume_name="agent-scratch-async")
        print(await second.fs.read("/workspace/notes.txt"))  # "notes"
        # --- checks ------------------------------------------------------------------------
        assert vol.project_id == my_project.id
        assert await second.fs.read("/workspace/notes.txt") == "notes\n"
        assert (await lizard.volumes.get_or_create("agent-scratch-async")).id == vol.id
        with pytest.raises(lizard_sdk.ConflictError):
            await lizard.volumes.create("agent-scratch-async")
        assert [v.name for v in await lizard.volumes.list()].count("agent-scratch-async") == 1
        await second.kill()
        await lizard.volumes.delete("agent-scratch-async")
        with pytest.raises(lizard_sdk.NotFoundError):
            await lizard.volumes.get("agent-scratch-async")
        await lizard.close()

    asyncio.run(main())


def test_async_workspace_per_user_with_scoped_key(server: Server) -> None:
    async def main() -> None:
        from lizard import AsyncLizard, AsyncSandbox
        lizard = AsyncLizard()
        user_id = uuid.uuid4().hex[:8]
        ws = await lizard.workspaces.create(name=f"user-{user_id}")
        prj = await lizard.projects.create(workspace_id=ws.id, name="default")
        key = await lizard.api_keys.create(name=f"user-{user_id}", workspaces=[ws.id])
        sandbox = await AsyncSandbox.create("codex", project_id=prj.id, lizard_token=key.key)
        result = await sandbox.process.exec_("lizard volume list")
        # --- checks ------------------------------------------------------------------------
        assert result.exit_code == 0, result
        who = await sandbox.process.exec_("lizard whoami --json")
        assert f'"keyId":"{key.id}"' in who.stdout.replace(" ", ""), who.stdout
        assert key.key is not None
        scoped = AsyncLizard(api_key=key.key)
        assert [w.id for w in await scoped.workspaces.list()] == [ws.id]
        with pytest.raises(lizard_sdk.PermissionDeniedError) as e:
            await scoped.api_keys.create(name="wider")
        assert e.value.code == "FORBIDDEN"
        with pytest.raises(lizard_sdk.PermissionDeniedError) as e:
            await scoped.billing.balance()
        assert e.value.code == "ACCOUNT_SCOPE_REQUIRED"
        await sandbox.kill()
        await lizard.workspaces.delete(ws.id, force=True)
        with pytest.raises(lizard_sdk.NotFoundError):
            await lizard.workspaces.find(ws.id)
        await scoped.close()
        await lizard.close()

    asyncio.run(main())
