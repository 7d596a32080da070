"""E2B's snapshots on Lizard, through E2B's own Python SDK: `create_snapshot` saves a
running sandbox, `Sandbox.create(<snapshot id or name>)` starts sandboxes with its
processes and files (after the source is gone), `list_snapshots` and `delete_snapshot`;
and another project's key reaches none of it."""

from __future__ import annotations

import os

import httpx
import pytest
from e2b import Sandbox
from e2b.exceptions import SandboxException

from conftest import API_URL, e2b_form, scoped_key

# A process the copies must have running, found by its arguments.
SLEEPER = "nohup sleep 4321 >/dev/null 2>&1 &"


def listed(**kw) -> list:
    paginator = Sandbox.list_snapshots(**kw)
    items = []
    while paginator.has_next:
        items += paginator.next_items()
    return items


def test_a_snapshot_starts_sandboxes_with_the_sources_processes_and_files(e2b_env):
    src = Sandbox.create()
    made = []
    try:
        src.commands.run("echo original > ~/f")
        src.commands.run(SLEEPER)
        snap = src.create_snapshot()
        assert snap.snapshot_id.startswith("snp_") and snap.names == []
        # The source runs on, and what it does from here is its own.
        src.commands.run("echo changed > ~/f")
        assert [s.snapshot_id for s in listed(sandbox_id=src.sandbox_id)] == [snap.snapshot_id]
        src.kill()

        for _ in range(2):
            copy = Sandbox.create(snap.snapshot_id)
            made.append(copy)
            assert copy.sandbox_id != src.sandbox_id
            assert copy.commands.run("cat ~/f").stdout == "original\n"
            assert copy.commands.run("pgrep -f 'sleep [4]321'").exit_code == 0
            assert copy.commands.run("whoami").stdout == "user\n"
            copy.commands.run(f"echo {copy.sandbox_id} > ~/f")
        assert made[0].commands.run("cat ~/f").stdout == f"{made[0].sandbox_id}\n"

        # A name: created from by name, and a second snapshot under it keeps its id.
        name = "snap-" + os.urandom(3).hex()
        named = made[0].create_snapshot(name=name)
        assert named.names == [name] and named.snapshot_id != snap.snapshot_id
        by_name = Sandbox.create(name)
        made.append(by_name)
        assert by_name.commands.run("cat ~/f").stdout == f"{made[0].sandbox_id}\n"
        again = made[1].create_snapshot(name=name)
        assert again.snapshot_id == named.snapshot_id
        from_again = Sandbox.create(name)
        made.append(from_again)
        assert from_again.commands.run("cat ~/f").stdout == f"{made[1].sandbox_id}\n"
        ids = [s.snapshot_id for s in listed()]
        assert ids == [snap.snapshot_id, named.snapshot_id], ids
        # By name (older SDKs have no such filter: the route as newer ones call it).
        headers = {"X-API-KEY": e2b_env["lizard_key"]}
        by = httpx.get(f"{API_URL}/snapshots", headers=headers, params={"name": name}, timeout=60)
        assert [s["snapshotID"] for s in by.json()] == [named.snapshot_id], by.text

        # Deleted, it starts nothing more; what was started from it runs on.
        assert Sandbox.delete_snapshot(snap.snapshot_id) is True
        assert Sandbox.delete_snapshot(snap.snapshot_id) is False
        with pytest.raises(SandboxException):
            Sandbox.create(snap.snapshot_id)
        assert made[0].commands.run("pgrep -f 'sleep [4]321'").exit_code == 0
        assert Sandbox.delete_snapshot(named.snapshot_id) is True
        assert listed() == []
    finally:
        for s in [src, *made]:
            try:
                s.kill()
            except Exception:
                pass


def test_snapshots_are_refused_what_they_cannot_do_and_stay_in_their_project(e2b_env):
    src = Sandbox.create()
    try:
        headers = {"X-API-KEY": e2b_env["lizard_key"]}
        url = f"{API_URL}/sandboxes/{src.sandbox_id}/snapshots"
        # A disk-only snapshot is not served: refused (as any request Lizard cannot serve), nothing saved.
        disk_only = httpx.post(url, headers=headers, json={"memory": False}, timeout=120)
        assert disk_only.status_code == 422 and "disk-only" in disk_only.json()["message"], disk_only.text
        assert listed() == []
        missing = httpx.post(f"{API_URL}/sandboxes/nope/snapshots", headers=headers, json={}, timeout=120)
        assert missing.status_code == 404, missing.text
        snap = src.create_snapshot()

        # Another project's key neither sees, starts from nor deletes it.
        other, _, _ = scoped_key("e2b-other")
        theirs = {"X-API-KEY": other}
        assert httpx.get(f"{API_URL}/snapshots", headers=theirs, timeout=60).json() == []
        create = httpx.post(f"{API_URL}/v2/sandboxes", headers=theirs, json={"templateID": snap.snapshot_id}, timeout=120)
        assert create.status_code == 404, create.text
        gone = httpx.delete(f"{API_URL}/templates/{snap.snapshot_id}", headers=theirs, timeout=60)
        assert gone.status_code == 404, gone.text
        taken = httpx.post(url, headers=theirs, json={}, timeout=120)
        assert taken.status_code == 404, taken.text
        assert [s.snapshot_id for s in listed()] == [snap.snapshot_id]
        assert Sandbox.delete_snapshot(snap.snapshot_id, api_key=e2b_form(e2b_env["lizard_key"])) is True
    finally:
        src.kill()
