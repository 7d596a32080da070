"""``lizard.templates``: list, read and delete templates, follow and cancel their builds,
and push a directory as a template (what ``lizard push`` does)."""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional
from urllib.parse import quote

from ._context import Manifest, read_recipe, scan
from ._ops import Emit, F, Flavoured, Items, Op, Sleep, api, api_items, invoke
from .errors import APIConnectionError, APITimeoutError, BuildError
from .models import BuildEvent, TemplateBuildInfo, TemplateInfo

if TYPE_CHECKING:
    from .client import LizardBase

#: A build follows its steps for as long as its own time limit allows; the event stream may
#: be silent that long between two events (a step that prints nothing).
EVENTS_READ_TIMEOUT_S = 3600.0
#: How often a push whose event stream broke asks for the build's status instead.
POLL_INTERVAL_S = 2.0


def _template_path(name: str, rest: str = "") -> str:
    return f"/v1/templates/{quote(name, safe='')}{rest}"


def _build_path(name: str, build_id: str, rest: str = "") -> str:
    return _template_path(name, f"/builds/{quote(build_id, safe='')}{rest}")


class Templates(Flavoured[F]):
    """``lizard.templates``: templates are built-in (``base``, ``code-interpreter-v1``,
    visible to every key) or pushed by a workspace. A client with a project works in that
    project's workspace; ``workspace=`` (id, slug or name) picks one explicitly; a key that
    reaches a single workspace needs neither."""

    def __init__(self, client: "LizardBase[F]") -> None:
        self._client: LizardBase[F] = client
        self._http = client.platform

    def _scope(self, workspace: Optional[str]) -> Op[Dict[str, str]]:
        if workspace is not None:
            return {"workspace": workspace}
        if self._client.project:
            return {"project": (yield from self._client._project_id())}
        return {}

    def _call(self, method: str, path: str, workspace: Optional[str], body: Any = None) -> Op[Any]:
        """A call in the client's (or ``workspace``'s) scope."""
        return (yield from self._http.call(method, path, body, params=(yield from self._scope(workspace))))

    @api
    def list(self, *, workspace: Optional[str] = None) -> Op[List[TemplateInfo]]:
        """The built-ins, then the templates of the workspace (all the key reaches without one)."""
        return [TemplateInfo.from_json(t) for t in (yield from self._call("GET", "/v1/templates", workspace))]

    @api
    def get(self, name: str, *, workspace: Optional[str] = None) -> Op[TemplateInfo]:
        """A template by name; ``NotFoundError`` if there is none the key reaches."""
        return TemplateInfo.from_json((yield from self._call("GET", _template_path(name), workspace)))

    @api
    def delete(self, name: str, *, workspace: Optional[str] = None) -> Op[None]:
        """Delete a pushed template and its builds: ``ConflictError`` while a sandbox uses
        it, ``PermissionDeniedError`` for a built-in."""
        yield from self._call("DELETE", _template_path(name), workspace)

    def _get_build(self, name: str, build_id: str, *, workspace: Optional[str] = None) -> Op[TemplateBuildInfo]:
        """A build's status, steps (cached or not), failure and log."""
        return TemplateBuildInfo.from_json((yield from self._call("GET", _build_path(name, build_id), workspace)))

    get_build = api(_get_build)

    @api
    def cancel_build(self, name: str, build_id: str, *, workspace: Optional[str] = None) -> Op[None]:
        """Stop a queued or running build (``ConflictError`` once it has finished)."""
        yield from self._call("DELETE", _build_path(name, build_id), workspace)

    def _events(
        self,
        name: str,
        build_id: str,
        on_event: Callable[[BuildEvent], Op[None]],
        workspace: Optional[str],
        read_timeout: float,
    ) -> Op[None]:
        """Read a build's events, giving each to ``on_event``, until ``done``."""
        path = _build_path(name, build_id, "/events")
        # The HTTP client turns a broken or silent stream into APIConnectionError / APITimeoutError.
        params = yield from self._scope(workspace)
        stream = yield from self._http.open("GET", path, params=params, timeout=read_timeout, lines=True)
        while True:
            line = yield from self._http.next(stream)
            if line is None:
                raise APIConnectionError(f"GET {path}: the stream ended before the build did")
            if not line.strip():
                continue
            try:
                event = BuildEvent.from_json(json.loads(line))
            except ValueError as e:
                raise APIConnectionError(f"GET {path}: a line that is not JSON: {e}") from e
            yield from on_event(event)
            if event.type == "done":
                return

    @api_items
    def events(
        self, name: str, build_id: str, *, workspace: Optional[str] = None, read_timeout: float = EVENTS_READ_TIMEOUT_S
    ) -> Items[BuildEvent]:
        """A build's events from the first, as they happen, ending after ``done``.
        ``APIConnectionError`` if the stream breaks before ``done``; ``read_timeout``
        (seconds) bounds the silence between two events."""

        def emit(event: BuildEvent) -> Op[None]:
            yield Emit(event)

        yield from self._events(name, build_id, emit, workspace, read_timeout)

    @api
    def push(
        self,
        dir: str = ".",
        name: Optional[str] = None,
        on_event: Optional[Callable[[BuildEvent], object]] = None,
        *,
        workspace: Optional[str] = None,
        timeout: Optional[float] = None,
    ) -> Op[TemplateBuildInfo]:
        """Build a template from a directory, as ``lizard push`` does: read its
        ``lizard.template.toml`` (or ``Dockerfile``, which needs ``name``; ``name`` also
        overrides the recipe's), upload the files the server lacks (``.lizardignore``
        leaves paths out), start the build and follow it, giving each event to
        ``on_event``. Returns the finished build; raises ``BuildError`` (``code``,
        ``step``, ``output_tail``) when it failed or was cancelled, and
        ``APITimeoutError`` after ``timeout`` seconds (the build goes on: cancel it with
        ``cancel_build``)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        recipe = read_recipe(dir, name)
        manifest = scan(dir)
        scope = yield from self._scope(workspace)
        yield from self._upload_missing(manifest, scope)
        body: Dict[str, Any] = {"recipe": recipe.text, "format": recipe.format, "files": manifest.entries, **scope}
        if name:
            body["name"] = name
        # Not retried on a broken connection: a second POST would start a second build.
        build = TemplateBuildInfo.from_json((yield from self._http.call("POST", "/v1/templates", body)))
        final = yield from self._follow(build, workspace, on_event, deadline)
        if final.status != "ready":
            raise BuildError(final)
        return final

    def _upload_missing(self, manifest: Manifest, scope: Dict[str, str]) -> Op[None]:
        hashes = manifest.hashes()
        if not hashes:
            return
        answer = yield from self._http.call("POST", "/v1/templates/blobs/missing", {"sha256": hashes}, params=scope)
        missing = answer["missing"]
        for sha256 in missing:
            source = manifest.files_by_hash.get(sha256)
            if source is None:
                raise APIConnectionError(f"the server asked for {sha256}, which the push does not have")
            with open(source, "rb") as f:
                content = f.read()
            # PUT is idempotent: retried like any other by the HTTP client.
            yield from self._http.send(
                "PUT",
                f"/v1/templates/blobs/{sha256}",
                params=scope,
                content=content,
                headers={"Content-Type": "application/octet-stream"},
                timeout=max(self._http.timeout, 600.0),
            )

    def _follow(
        self,
        build: TemplateBuildInfo,
        workspace: Optional[str],
        on_event: Optional[Callable[[BuildEvent], object]],
        deadline: Optional[float],
    ) -> Op[TemplateBuildInfo]:
        """Read the build's events until ``done``, then its final status. A broken stream
        falls back to polling the status (the events would start over from the first)."""
        read_timeout = EVENTS_READ_TIMEOUT_S if deadline is None else max(deadline - time.monotonic(), 1.0)
        try:
            yield from self._events(
                build.template, build.build_id, lambda event: invoke(on_event, event), workspace, read_timeout
            )
        except APIConnectionError:
            pass  # the status says how it ended (or that it still runs)
        while True:
            info = yield from self._get_build(build.template, build.build_id, workspace=workspace)
            if info.finished:
                return info
            if deadline is not None and time.monotonic() >= deadline:
                raise APITimeoutError(f"build {build.build_id} of {build.template} still running after the timeout")
            yield Sleep(POLL_INTERVAL_S)
