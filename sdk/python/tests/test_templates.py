"""``lizard.templates`` against a real server: the built-ins, a push of a tiny directory
(copy, run, a start command) built in a microVM, a sandbox from it, a failing step, and
delete refused while a sandbox uses the template. Steps are kept short: each push boots a
build VM."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Iterator, List, Tuple

import pytest

from conftest import Server, wait_for_http
from lizard import AsyncLizard, BuildError, BuildEvent, ConflictError, Lizard, NotFoundError, TemplateBuildInfo

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
    (root / "site/notes.tmp").write_text("left out by .lizardignore")
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


@pytest.fixture(scope="module")
def pushed(lz: Lizard, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tuple[str, TemplateBuildInfo, List[BuildEvent]]]:
    """One template pushed for the module (deleted by the last test)."""
    name = f"sdk-py-{uuid.uuid4().hex[:6]}"
    events: List[BuildEvent] = []
    root = make_dir(tmp_path_factory.mktemp("push"), name, "echo built > /opt/site/built.txt")
    build = lz.templates.push(str(root), on_event=events.append)
    yield name, build, events
    try:
        lz.templates.delete(name)
    except NotFoundError:
        pass


def test_push_builds_and_streams_its_events_in_order(lz: Lizard, pushed: Tuple[str, TemplateBuildInfo, List[BuildEvent]]) -> None:
    name, build, events = pushed
    assert build.status == "ready" and build.template == name
    assert [(s.index, s.status) for s in build.steps] == [(1, "ready"), (2, "ready")]
    # Each step before its end, `done` last.
    kinds = [(e.type, e.index) for e in events if e.type in ("step", "stepDone", "done")]
    assert events[-1].type == "done" and events[-1].status == "ready" and events[-1].error is None
    assert kinds.index(("step", 1)) < kinds.index(("stepDone", 1)) < kinds.index(("step", 2)) < kinds.index(("stepDone", 2)), kinds
    # The whole stream can be read again, and the build's status is kept.
    assert [(e.type, e.index) for e in lz.templates.events(name, build.build_id) if e.type != "output"][-1] == ("done", None)

    async def read_async() -> None:
        async with AsyncLizard(project="my-project") as alz:
            again = [(e.type, e.index) async for e in alz.templates.events(name, build.build_id) if e.type != "output"]
            assert again == [(e.type, e.index) for e in events if e.type != "output"]
            assert (await alz.templates.get_build(name, build.build_id)).status == "ready"

    asyncio.run(read_async())
    assert lz.templates.get_build(name, build.build_id).status == "ready"
    info = lz.templates.get(name)
    assert info.ready and not info.builtin and info.from_ == "base" and info.build_id == build.build_id
    assert name in [t.name for t in lz.templates.list()]


def test_a_failing_step_names_itself_and_the_unchanged_prefix_is_cached(
    lz: Lizard, pushed: Tuple[str, TemplateBuildInfo, List[BuildEvent]], tmp_path: Path
) -> None:
    name = f"sdk-py-fail-{uuid.uuid4().hex[:6]}"
    seen: List[BuildEvent] = []

    async def push_async() -> None:
        # The async flavour: the same push, its events given to an async callback.
        async def on_event(event: BuildEvent) -> None:
            seen.append(event)

        async with AsyncLizard(project="my-project") as alz:
            await alz.templates.push(str(make_dir(tmp_path, name, "echo about to fail; exit 3")), on_event=on_event)

    with pytest.raises(BuildError) as e:
        asyncio.run(push_async())
    assert e.value.code == "STEP_FAILED" and e.value.step == 2, e.value
    assert "about to fail" in (e.value.output_tail or "")
    assert e.value.build.status == "failed" and seen[-1].type == "done" and seen[-1].status == "failed"
    # Step 1 is the pushed template's first step over the same content: taken from the cache.
    assert [(s.index, s.cached) for s in e.value.build.steps] == [(1, True), (2, False)]
    assert not lz.templates.get(name).ready
    lz.templates.delete(name)


def test_create_from_it_and_delete_refused_while_used(
    lz: Lizard, pushed: Tuple[str, TemplateBuildInfo, List[BuildEvent]], server: Server
) -> None:
    name = pushed[0]
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
