"""``lizard.templates`` against a real server: the built-ins, a push of a tiny directory
(copy, run, a start command) built in a microVM, a sandbox from it, a failing step, and
delete refused while a sandbox uses the template. Steps are kept short: each push boots a
build VM."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import List

import pytest

from conftest import Server, wait_for_http
from lizard import BuildError, BuildEvent, ConflictError, Lizard, NotFoundError

RECIPE = """name = "{name}"
from = "base"
[[steps]]
copy = {{ src = "site/", dest = "/opt/site/" }}
[[steps]]
run = "{run}"
[start]
cmd = "python3 -m http.server 8000 --directory /opt/site"
ready = {{ port = 8000 }}
"""


def make_dir(root: Path, name: str, run: str) -> Path:
    (root / "site").mkdir(parents=True)
    (root / "site/hello.txt").write_text("hello from a pushed template\n")
    (root / "notes.tmp").write_text("left out by .lizardignore")
    (root / ".lizardignore").write_text("*.tmp\n")
    (root / "lizard.template.toml").write_text(RECIPE.format(name=name, run=run))
    return root


@pytest.fixture(scope="module")
def lz(server: Server, my_project) -> Lizard:
    return Lizard(project="my-project")


def test_list_shows_the_builtins(lz: Lizard) -> None:
    by_name = {t.name: t for t in lz.templates.list()}
    for name in ("base", "code-interpreter-v1"):
        assert by_name[name].builtin and by_name[name].ready, by_name[name]
    assert lz.templates.get("base").builtin


def test_get_unknown_is_not_found(lz: Lizard) -> None:
    with pytest.raises(NotFoundError) as e:
        lz.templates.get("nope")
    assert e.value.code == "NOT_FOUND"


def test_push_create_and_delete(lz: Lizard, tmp_path: Path, server: Server) -> None:
    name = f"sdk-py-{uuid.uuid4().hex[:6]}"
    events: List[BuildEvent] = []
    build = lz.templates.push(str(make_dir(tmp_path, name, "echo built > /opt/site/built.txt")), on_event=events.append)
    assert build.status == "ready" and build.template == name
    assert [s.index for s in build.steps] == [1, 2] and all(s.status == "ready" for s in build.steps)
    # The events came in order: each step before its end, `done` last.
    kinds = [(e.type, e.index) for e in events if e.type in ("step", "stepDone", "done")]
    assert kinds[-1] == ("done", None) and events[-1].type == "done" and events[-1].status == "ready"
    for index in (1, 2):
        assert kinds.index(("step", index)) < kinds.index(("stepDone", index)), kinds
    assert kinds.index(("stepDone", 1)) < kinds.index(("step", 2))
    # The whole stream can be read again, and the build's status kept.
    assert [e.type for e in lz.templates.events(name, build.build_id)][-1] == "done"
    assert lz.templates.get_build(name, build.build_id).status == "ready"
    info = lz.templates.get(name)
    assert info.ready and not info.builtin and info.from_ == "base" and info.build_id == build.build_id
    assert name in [t.name for t in lz.templates.list()]

    sb = lz.create(name)
    try:
        assert sb.template == name
        assert sb.fs.read("/opt/site/hello.txt") == "hello from a pushed template\n"
        assert sb.process.exec_("cat /opt/site/built.txt").stdout == "built\n"
        assert sb.process.exec_("ls /opt/site").stdout.split() == ["built.txt", "hello.txt"]
        # The start command was in the snapshot: it serves without any exec.
        wait_for_http(server.proxy, sb.get_host(8000), b"built.txt", timeout_s=30)
        with pytest.raises(ConflictError) as e:
            lz.templates.delete(name)
        assert e.value.code == "CONFLICT"
    finally:
        sb.kill()
    lz.templates.delete(name)
    with pytest.raises(NotFoundError):
        lz.templates.get(name)


def test_a_failing_step_names_itself(lz: Lizard, tmp_path: Path) -> None:
    name = f"sdk-py-fail-{uuid.uuid4().hex[:6]}"
    seen: List[BuildEvent] = []
    with pytest.raises(BuildError) as e:
        lz.templates.push(str(make_dir(tmp_path, name, "echo about to fail; exit 3")), on_event=seen.append)
    assert e.value.code == "STEP_FAILED" and e.value.step == 2, e.value
    assert "about to fail" in (e.value.output_tail or "")
    assert e.value.build.status == "failed" and seen[-1].type == "done" and seen[-1].status == "failed"
    assert not lz.templates.get(name).ready
    lz.templates.delete(name)
