"""A sandbox: one microVM, its files (``sandbox.fs``) and processes (``sandbox.process``).
``Sandbox`` is the blocking flavour, ``AsyncSandbox`` the asyncio one; both are
``SandboxBase``, whose calls are written once (see ``_ops``)."""

from __future__ import annotations

import json
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Type, Union
from urllib.parse import quote

from ._http import AsyncHttpClient, HttpClient, shared_async_client, shared_client
from ._archive import pack_files
from ._ops import Async, F, Flavoured, Join, Op, Started, Sync, api, api_background, invoke, static_api
from .desktop import Desktop
from .processes import BackgroundProcesses, Pty, command_body
from .code import CodeInterpreter
from .errors import APIConnectionError, LizardError, NotFoundError
from ._frames import Output, read_exec_frames
from .models import ArchiveResult, FileEntry, FileInfo, FsEvent, ListeningPort, ProcessResult, SandboxInfo

Http = Union[HttpClient, AsyncHttpClient]

#: Creating the first sandbox of a template boots it and saves its snapshot: slow.
CREATE_TIMEOUT_S = 600.0
#: A command without ``timeout_ms`` may run this long before the call gives up.
EXEC_TIMEOUT_S = 3600.0
#: A watch's stream carries a blank line every 15 s of silence: this much silence means it
#: is gone.
WATCH_READ_TIMEOUT_S = 60.0


def _sandbox_path(sandbox_id: str, rest: str = "") -> str:
    return f"/v1/sandboxes/{quote(sandbox_id, safe='')}{rest}"


def _no_route(e: NotFoundError) -> bool:
    """A 404 because the server has no such route (older server), not no such sandbox."""
    return e.message.startswith("no route for")


class Filesystem(Flavoured[F]):
    """``sandbox.fs``: read and write files inside the microVM."""

    def __init__(self, sandbox: "SandboxBase[F]") -> None:
        self._sandbox: SandboxBase[F] = sandbox
        self._http = sandbox._http

    def _path(self, rest: str = "") -> str:
        return _sandbox_path(self._sandbox.sandbox_id, "/files" + rest)

    @api
    def write(self, path: str, data: Union[str, bytes], *, mode: Optional[int] = None) -> Op[None]:
        """Write a file (parents are created), replacing it atomically."""
        body = data.encode() if isinstance(data, str) else bytes(data)
        params: Dict[str, Any] = {"path": path}
        if mode is not None:
            params["mode"] = format(mode, "o")
        headers = {"Content-Type": "application/octet-stream"}
        yield from self._http.send("PUT", self._path(), params=params, content=body, headers=headers)

    @api
    def read(self, path: str) -> Op[str]:
        """A file's content as text (UTF-8)."""
        return (yield from self._read_bytes(path)).decode("utf-8", errors="replace")

    def _read_bytes(self, path: str) -> Op[bytes]:
        return (yield from self._http.send("GET", self._path(), params={"path": path})).content

    read_bytes = api(_read_bytes)
    """A file's exact bytes."""

    @api
    def list(self, path: str) -> Op[List[FileEntry]]:
        """A directory's entries, sorted by name."""
        entries = yield from self._http.call("GET", self._path("/list"), params={"path": path})
        return [FileEntry.from_json(e) for e in entries]

    @api
    def remove(self, path: str) -> Op[None]:
        """Delete a file, or a directory with everything in it."""
        yield from self._http.call("DELETE", self._path(), params={"path": path})

    @api
    def make_dir(self, path: str) -> Op[None]:
        """Create a directory and its parents."""
        yield from self._http.call("POST", self._path("/mkdir"), params={"path": path})

    @api
    def get_info(self, path: str) -> Op[FileInfo]:
        """What is at ``path``: type, size, mode, owner, mtime, and a link's target (a link
        is described, not followed). ``NotFoundError`` when nothing is there."""
        return FileInfo.from_json((yield from self._http.call("GET", self._path("/info"), params={"path": path})))

    @api
    def exists(self, path: str) -> Op[bool]:
        """Whether anything (a dangling link included) is at ``path``."""
        answer = yield from self._http.call("GET", self._path("/exists"), params={"path": path})
        return bool(answer["exists"])

    @api
    def rename(self, old_path: str, new_path: str) -> Op[FileInfo]:
        """Move a file or directory (a file at ``new_path`` is replaced); what is there now."""
        params = {"path": old_path, "to": new_path}
        return FileInfo.from_json((yield from self._http.call("POST", self._path("/rename"), params=params)))

    def _write_archive(self, path: str, archive: bytes) -> Op[ArchiveResult]:
        headers = {"Content-Type": "application/octet-stream"}
        resp = yield from self._http.send(
            "PUT", self._path("/archive"), params={"path": path}, content=archive, headers=headers
        )
        return ArchiveResult.from_json(resp.json())

    write_archive = api(_write_archive)
    """Unpack a tar archive (bytes) into the directory ``path`` (created with its
    parents); an entry that would land outside it is refused (``InvalidArgumentError``)."""

    @api
    def write_files(self, files: Mapping[str, Union[str, bytes]], *, mode: int = 0o644) -> Op[ArchiveResult]:
        """Write several files in one call: ``{absolute path: content}`` (parents are
        created, each file gets ``mode``). They travel as one tar archive."""
        directory, archive = pack_files(files, mode)
        return (yield from self._write_archive(directory, archive))

    @api
    def download_dir(self, path: str) -> Op[bytes]:
        """The directory ``path`` and everything under it as a tar archive (links stored as
        links), in one call: ``tarfile.open(fileobj=io.BytesIO(data))`` reads it."""
        return (yield from self._http.send("GET", self._path("/archive"), params={"path": path})).content

    @api_background
    def watch(
        self,
        path: str,
        on_event: Callable[[FsEvent], object],
        *,
        recursive: bool = False,
        on_exit: Optional[Callable[[Optional[Exception]], object]] = None,
    ) -> Op[None]:
        """Follow the changes in the directory ``path`` (and, ``recursive``, every directory
        under it): ``on_event`` gets each ``FsEvent`` as it happens (``create``, ``write``,
        ``remove``, ``rename``, ``overflow`` when the guest lost events). Returns once the
        watch is in place, as a handle: ``stop()`` ends it (``await handle.stop()`` in the
        async flavour, where ``on_event`` may be ``async``). The watch ends by itself when
        the sandbox pauses or goes away: ``on_exit`` then gets the error (watch again after
        a resume)."""
        stream = yield from self._http.open(
            "GET", self._path("/watch"), params={"path": path, "recursive": recursive}, timeout=WATCH_READ_TIMEOUT_S, lines=True
        )
        yield Started()
        error: Exception = APIConnectionError(f"the watch of {path} ended")
        try:
            while True:
                line = yield from self._http.next(stream)
                if line is None:
                    break
                if line.strip():
                    yield from invoke(on_event, FsEvent.from_json(json.loads(line)))
        except LizardError as e:
            error = e
        yield from invoke(on_exit, error)


class Process(BackgroundProcesses[F]):
    """``sandbox.process``: run commands inside the microVM: ``exec_`` waits for one,
    ``start`` leaves it running in the background (see ``processes``)."""

    def __init__(self, sandbox: "SandboxBase[F]") -> None:
        self._sandbox: SandboxBase[F] = sandbox
        self._http = sandbox._http

    def _exec(
        self,
        cmd: Union[str, List[str]],
        *,
        cwd: Optional[str] = None,
        envs: Optional[Mapping[str, str]] = None,
        user: Optional[str] = None,
        timeout_ms: Optional[int] = None,
        stdin: Optional[str] = None,
        request_timeout: Optional[float] = None,
        on_stdout: Optional[Callable[[str], None]] = None,
        on_stderr: Optional[Callable[[str], None]] = None,
    ) -> Op[ProcessResult]:
        """Run ``cmd`` and wait for it to finish. A string runs under ``/bin/sh -c`` (so
        ``server &`` starts it in the background); a list is the exact argv. A non-zero exit
        code is returned, not raised. ``timeout_ms`` kills the command (exit code 124);
        ``request_timeout`` (seconds) bounds the HTTP call itself. ``on_stdout`` and
        ``on_stderr`` receive the output as it arrives (the result still has all of it)."""
        body = command_body(cmd, cwd, envs, user)
        if timeout_ms is not None:
            body["timeoutMs"] = timeout_ms
        if stdin is not None:
            body["stdin"] = stdin
        if request_timeout is None:
            request_timeout = timeout_ms / 1000 + 60 if timeout_ms is not None else EXEC_TIMEOUT_S
        path = _sandbox_path(self._sandbox.sandbox_id, "/exec")
        if on_stdout is None and on_stderr is None:
            return ProcessResult.from_json((yield from self._http.call("POST", path, body, timeout=request_timeout)))
        stream = yield from self._http.open("POST", path, params={"stream": True}, json=body, timeout=request_timeout)
        return (yield from read_exec_frames(lambda: self._http.next(stream), Output(on_stdout, on_stderr)))

    exec_ = api(_exec)
    # The reference names it `exec_` (after the builtin); `exec` works too.
    exec = exec_


class SandboxBase(CodeInterpreter[F]):
    """A running (or paused) sandbox, in either flavour: ``Sandbox`` (blocking) or
    ``AsyncSandbox`` (asyncio). Make one with ``Sandbox.create``, ``Lizard.create`` or
    ``Sandbox.connect`` (``await AsyncSandbox.create(...)``, …)."""

    def __init__(self, info: SandboxInfo, http: Http) -> None:
        self.info = info
        self._http = http
        #: The background followers of this object's process handles (``kill()`` stops them).
        self._followers: List[Any] = []
        self.fs: Filesystem[F] = Filesystem(self)
        self.process: Process[F] = Process(self)
        self.pty: Pty[F] = Pty(self)
        self.desktop: Desktop[F] = Desktop(self)

    @staticmethod
    def _of(info: SandboxInfo, http: Http) -> "SandboxBase[Any]":
        """A sandbox of the client's flavour."""
        cls: Type[SandboxBase[Any]] = Sandbox if isinstance(http, HttpClient) else AsyncSandbox
        return cls(info, http)

    def __repr__(self) -> str:
        return f"Sandbox({self.sandbox_id!r}, template={self.info.template!r}, state={self.info.state!r})"

    @property
    def sandbox_id(self) -> str:
        return self.info.sandbox_id

    @property
    def id(self) -> str:
        return self.info.sandbox_id

    @property
    def template(self) -> str:
        return self.info.template

    @property
    def state(self) -> str:
        return self.info.state

    @property
    def access_token(self) -> Optional[str]:
        """The token a private sandbox's URLs require (only on the object ``create``
        returned: it is shown once)."""
        return self.info.access_token

    # -- static forms -------------------------------------------------------------------

    def _create(
        cls: object,
        template: str = "base",
        *,
        project: Optional[str] = None,
        project_id: Optional[str] = None,
        timeout_ms: Optional[int] = None,
        envs: Optional[Mapping[str, str]] = None,
        metadata: Optional[Mapping[str, str]] = None,
        lizard_token: Optional[str] = None,
        volume_name: Optional[str] = None,
        vcpus: Optional[int] = None,
        memory_mib: Optional[int] = None,
        on_timeout: Optional[str] = None,
        allow_internet_access: Optional[bool] = None,
        allow_out: Optional[Sequence[str]] = None,
        deny_out: Optional[Sequence[str]] = None,
        public_urls: Optional[bool] = None,
        resolution: Optional[Tuple[int, int]] = None,
        request_timeout: Optional[float] = None,
        api_key: Optional[str] = None,
        api_url: Optional[str] = None,
        http: Optional[Http] = None,
    ) -> Op["SandboxBase[F]"]:
        """Boot a new microVM from ``template`` in a project (``project``: id, slug or name;
        or ``project_id``: its exact id). ``lizard_token`` is an API key placed inside as
        ``LIZARD_API_KEY`` for the ``lizard`` CLI there; ``volume_name`` mounts that volume
        at ``/workspace``. ``resolution`` (width, height) restarts a ``desktop`` sandbox's
        screen at that size before returning. ``request_timeout`` (seconds) bounds the call
        itself (default 10 minutes: a template's first create boots it).

        Network: ``allow_internet_access=False`` cuts the sandbox off the internet except
        for the CIDRs and domain names (``registry.example``, ``*.example``) in ``allow_out``;
        ``deny_out`` entries are never reachable.
        ``public_urls=False`` makes its URLs answer only to requests carrying
        ``sandbox.access_token`` (header ``X-Lizard-Access-Token`` or query parameter
        ``lizardAccessToken``)."""
        assert http is not None  # given by static_api
        body: Dict[str, Any] = {"template": template}
        for key, value in (
            ("project", project),
            ("projectId", project_id),
            ("timeoutMs", timeout_ms),
            ("env", dict(envs) if envs else None),
            ("metadata", dict(metadata) if metadata else None),
            ("lizardToken", lizard_token),
            ("volumeName", volume_name),
            ("vcpus", vcpus),
            ("memoryMib", memory_mib),
            ("onTimeout", on_timeout),
            ("allowInternetAccess", allow_internet_access),
            ("allowOut", list(allow_out) if allow_out else None),
            ("denyOut", list(deny_out) if deny_out else None),
            ("publicUrls", public_urls),
        ):
            if value is not None:
                body[key] = value
        if request_timeout is None:
            request_timeout = max(http.timeout, CREATE_TIMEOUT_S)
        data = yield from http.call("POST", "/v1/sandboxes", body, timeout=request_timeout)
        sandbox = SandboxBase._of(SandboxInfo.from_json(data), http)
        if resolution is not None:
            yield from sandbox.desktop._set_resolution(*resolution)
        return sandbox

    create = static_api(_create)

    def _connect(
        cls: object,
        sandbox_id: str,
        *,
        api_key: Optional[str] = None,
        api_url: Optional[str] = None,
        http: Optional[Http] = None,
    ) -> Op["SandboxBase[F]"]:
        """An existing sandbox by id, resumed if it was paused. Raises ``NotFoundError`` once
        it was killed or expired (or is outside the key's scope)."""
        assert http is not None  # given by static_api
        try:
            data = yield from http.call("POST", _sandbox_path(sandbox_id, "/connect"), timeout=max(http.timeout, CREATE_TIMEOUT_S))
        except NotFoundError as e:
            if not _no_route(e):
                raise
            data = yield from http.call("GET", _sandbox_path(sandbox_id))
        return SandboxBase._of(SandboxInfo.from_json(data), http)

    connect = static_api(_connect)

    def _list(
        cls: object,
        *,
        project_id: Optional[str] = None,
        workspace_id: Optional[str] = None,
        api_key: Optional[str] = None,
        api_url: Optional[str] = None,
        http: Optional[Http] = None,
    ) -> Op[List[SandboxInfo]]:
        """The running sandboxes the key reaches (optionally of one project or workspace)."""
        assert http is not None  # given by static_api
        data = yield from http.call("GET", "/v1/sandboxes", params={"projectId": project_id, "workspaceId": workspace_id})
        return [SandboxInfo.from_json(d) for d in data]

    list = static_api(_list)

    # -- instance -------------------------------------------------------------------------

    def _path(self, rest: str = "") -> str:
        return _sandbox_path(self.sandbox_id, rest)

    def _update(self, method: str, rest: str = "", body: Any = None, *, slow: bool = False) -> Op[SandboxInfo]:
        """A call answered with the sandbox's state, which the object keeps."""
        timeout = max(self._http.timeout, CREATE_TIMEOUT_S) if slow else None
        self.info = SandboxInfo.from_json((yield from self._http.call(method, self._path(rest), body, timeout=timeout)))
        return self.info

    @api
    def get_info(self) -> Op[SandboxInfo]:
        """Fetch the sandbox's current state (raises ``NotFoundError`` once it is gone)."""
        return (yield from self._update("GET"))

    @api
    def is_running(self) -> Op[bool]:
        try:
            return (yield from self._update("GET")).state == "running"
        except NotFoundError:
            return False

    @api
    def set_timeout(self, timeout_ms: int) -> Op[None]:
        """Kill the sandbox ``timeout_ms`` from now (extends or shortens its lifetime)."""
        yield from self._update("POST", "/timeout", {"timeoutMs": timeout_ms})

    @api
    def kill(self) -> Op[None]:
        """Stop the microVM and delete everything in it (and stop following its processes)."""
        for follower in self._followers:
            yield Join(follower, stop=True)
        self._followers = []
        yield from self._http.call("DELETE", self._path())

    @api
    def pause(self) -> Op[None]:
        """Freeze the sandbox: its memory and processes are saved and the VM stops."""
        yield from self._update("POST", "/pause", slow=True)

    @api
    def resume(self) -> Op[None]:
        """Start a paused sandbox again where it stopped."""
        yield from self._update("POST", "/resume", slow=True)

    @api
    def fork(self, count: int = 1) -> Op[List["SandboxBase[F]"]]:
        """``count`` copies of this running sandbox, processes, memory and files included,
        each with its own id and its own writes from here on."""
        timeout = max(self._http.timeout, CREATE_TIMEOUT_S)
        data = yield from self._http.call("POST", self._path("/fork"), {"count": count}, timeout=timeout)
        return [SandboxBase._of(SandboxInfo.from_json(d), self._http) for d in data]

    @api
    def wait_for_port(self, port: int, *, timeout_ms: int = 60_000) -> Op[None]:
        """Return once something listens on TCP ``port`` inside the sandbox (its agent
        watches the socket table); ``TimedOutError`` after ``timeout_ms`` (at most 10 min)."""
        path = self._path(f"/ports/{port}/wait")
        yield from self._http.call("GET", path, params={"timeoutMs": timeout_ms}, timeout=timeout_ms / 1000 + 60)

    @api
    def get_signed_url(
        self, port: int, *, expires_in: int = 3600, path: str = "/", scheme: str = "http", url_port: Optional[int] = None
    ) -> Op[str]:
        """A URL to ``port`` that works without the sandbox's access token for
        ``expires_in`` seconds (at most a week), for a sandbox created with
        ``public_urls=False`` (a public sandbox's URL comes back without a proof). Its
        first request sets a cookie for that host, so a page's own later requests work
        too. ``url_port``: the proxy's port when it is not the scheme's default (a laptop
        server's is 7172)."""
        body = {"port": port, "expiresInSeconds": expires_in}
        signed = yield from self._http.call("POST", self._path("/signed-urls"), body)
        origin = f"{scheme}://{signed['host']}" + (f":{url_port}" if url_port is not None else "")
        query = str(signed["query"])
        if not query:
            return origin + path
        return origin + path + ("&" if "?" in path else "?") + query

    @api
    def list_ports(self) -> Op[List[ListeningPort]]:
        """The TCP ports something listens on in the sandbox, by port (the platform's own
        left out); ``ConflictError`` while it is paused."""
        data = yield from self._http.call("GET", self._path("/ports"))
        return [ListeningPort.from_json(d) for d in data]

    def get_host(self, port: int) -> str:
        """The public host serving ``port`` inside the sandbox:
        ``{sandboxId}-{port}.sandbox.{region}.{domain}``."""
        if not self.info.domain:
            raise ValueError("the server did not say which domain serves this sandbox")
        return f"{self.sandbox_id}-{port}.{self.info.domain}"


class Sandbox(SandboxBase[Sync]):
    """A running (or paused) sandbox; every call blocks until it is answered."""

    _shared_http = staticmethod(shared_client)


class AsyncSandbox(SandboxBase[Async]):
    """A running (or paused) sandbox; every call is a coroutine (``await sandbox.kill()``),
    on ``httpx.AsyncClient``."""

    _shared_http = staticmethod(shared_async_client)
