"""A sandbox: one microVM, its files (``sandbox.fs``) and processes (``sandbox.process``)."""

from __future__ import annotations

import builtins
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union
from urllib.parse import quote

from ._http import HttpClient, shared_client
from .desktop import Desktop
from .code import CodeInterpreter
from .errors import NotFoundError
from ._frames import read_exec_frames
from .models import FileEntry, ProcessResult, SandboxInfo

#: Creating the first sandbox of a template boots it and saves its snapshot: slow.
CREATE_TIMEOUT_S = 600.0
#: A command without ``timeout_ms`` may run this long before the call gives up.
EXEC_TIMEOUT_S = 3600.0


def _sandbox_path(sandbox_id: str, rest: str = "") -> str:
    return f"/v1/sandboxes/{quote(sandbox_id, safe='')}{rest}"


def _no_route(e: NotFoundError) -> bool:
    """A 404 because the server has no such route (older server), not no such sandbox."""
    return e.message.startswith("no route for")


class Filesystem:
    """``sandbox.fs``: read and write files inside the microVM."""

    def __init__(self, sandbox: "Sandbox") -> None:
        self._sandbox = sandbox

    def write(self, path: str, data: Union[str, bytes], *, mode: Optional[int] = None) -> None:
        """Write a file (parents are created), replacing it atomically."""
        body = data.encode() if isinstance(data, str) else bytes(data)
        params: Dict[str, Any] = {"path": path}
        if mode is not None:
            params["mode"] = format(mode, "o")
        self._sandbox._http.request(
            "PUT",
            _sandbox_path(self._sandbox.sandbox_id, "/files"),
            params=params,
            content=body,
            headers={"Content-Type": "application/octet-stream"},
        )

    def read(self, path: str) -> str:
        """A file's content as text (UTF-8)."""
        return self.read_bytes(path).decode("utf-8", errors="replace")

    def read_bytes(self, path: str) -> bytes:
        """A file's exact bytes."""
        resp = self._sandbox._http.request("GET", _sandbox_path(self._sandbox.sandbox_id, "/files"), params={"path": path})
        return resp.content

    def list(self, path: str) -> List[FileEntry]:
        """A directory's entries, sorted by name."""
        entries = self._sandbox._http.get(_sandbox_path(self._sandbox.sandbox_id, "/files/list"), params={"path": path})
        return [FileEntry.from_json(e) for e in entries]

    def remove(self, path: str) -> None:
        """Delete a file, or a directory with everything in it."""
        self._sandbox._http.delete(_sandbox_path(self._sandbox.sandbox_id, "/files"), params={"path": path})

    def make_dir(self, path: str) -> None:
        """Create a directory and its parents."""
        self._sandbox._http.post(_sandbox_path(self._sandbox.sandbox_id, "/files/mkdir"), params={"path": path})


class Process:
    """``sandbox.process``: run commands inside the microVM."""

    def __init__(self, sandbox: "Sandbox") -> None:
        self._sandbox = sandbox

    def exec_(
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
    ) -> ProcessResult:
        """Run ``cmd`` and wait for it to finish. A string runs under ``/bin/sh -c`` (so
        ``server &`` starts it in the background); a list is the exact argv. A non-zero exit
        code is returned, not raised. ``timeout_ms`` kills the command (exit code 124);
        ``request_timeout`` (seconds) bounds the HTTP call itself. ``on_stdout`` and
        ``on_stderr`` receive the output as it arrives (the result still has all of it)."""
        body: Dict[str, Any] = {"argv": list(cmd)} if isinstance(cmd, builtins.list) else {"cmd": cmd}
        if cwd is not None:
            body["cwd"] = cwd
        if envs:
            body["env"] = dict(envs)
        if user is not None:
            body["user"] = user
        if timeout_ms is not None:
            body["timeoutMs"] = timeout_ms
        if stdin is not None:
            body["stdin"] = stdin
        if request_timeout is None:
            request_timeout = timeout_ms / 1000 + 60 if timeout_ms is not None else EXEC_TIMEOUT_S
        path = _sandbox_path(self._sandbox.sandbox_id, "/exec")
        if on_stdout is None and on_stderr is None:
            return ProcessResult.from_json(self._sandbox._http.post(path, json=body, timeout=request_timeout))
        with self._sandbox._http.stream("POST", path, params={"stream": True}, json=body, timeout=request_timeout) as resp:
            return read_exec_frames(resp.iter_bytes(), on_stdout, on_stderr)

    # The reference names it `exec_` (after the builtin); `exec` works too.
    exec = exec_


class Sandbox(CodeInterpreter):
    """A running (or paused) sandbox. Make one with ``Sandbox.create``, ``Lizard.create`` or
    ``Sandbox.connect``."""

    def __init__(self, info: SandboxInfo, http: HttpClient) -> None:
        self.info = info
        self._http = http
        self.fs = Filesystem(self)
        self.process = Process(self)
        self.desktop = Desktop(self)

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

    @classmethod
    def create(
        cls,
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
        http: Optional[HttpClient] = None,
    ) -> "Sandbox":
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
        http = http or shared_client(api_key, api_url)
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
        data = http.post("/v1/sandboxes", json=body, timeout=request_timeout)
        sandbox = cls(SandboxInfo.from_json(data), http)
        if resolution is not None:
            sandbox.desktop.set_resolution(*resolution)
        return sandbox

    @classmethod
    def connect(
        cls,
        sandbox_id: str,
        *,
        api_key: Optional[str] = None,
        api_url: Optional[str] = None,
        http: Optional[HttpClient] = None,
    ) -> "Sandbox":
        """An existing sandbox by id, resumed if it was paused. Raises ``NotFoundError`` once
        it was killed or expired (or is outside the key's scope)."""
        http = http or shared_client(api_key, api_url)
        try:
            data = http.post(_sandbox_path(sandbox_id, "/connect"), timeout=max(http.timeout, CREATE_TIMEOUT_S))
        except NotFoundError as e:
            if not _no_route(e):
                raise
            data = http.get(_sandbox_path(sandbox_id))
        return cls(SandboxInfo.from_json(data), http)

    @classmethod
    def list(
        cls,
        *,
        project_id: Optional[str] = None,
        workspace_id: Optional[str] = None,
        api_key: Optional[str] = None,
        api_url: Optional[str] = None,
        http: Optional[HttpClient] = None,
    ) -> List[SandboxInfo]:
        """The running sandboxes the key reaches (optionally of one project or workspace)."""
        http = http or shared_client(api_key, api_url)
        data = http.get("/v1/sandboxes", params={"projectId": project_id, "workspaceId": workspace_id})
        return [SandboxInfo.from_json(d) for d in data]

    # -- instance -------------------------------------------------------------------------

    def get_info(self) -> SandboxInfo:
        """Fetch the sandbox's current state (raises ``NotFoundError`` once it is gone)."""
        self.info = SandboxInfo.from_json(self._http.get(_sandbox_path(self.sandbox_id)))
        return self.info

    def is_running(self) -> bool:
        try:
            return self.get_info().state == "running"
        except NotFoundError:
            return False

    def set_timeout(self, timeout_ms: int) -> None:
        """Kill the sandbox ``timeout_ms`` from now (extends or shortens its lifetime)."""
        data = self._http.post(_sandbox_path(self.sandbox_id, "/timeout"), json={"timeoutMs": timeout_ms})
        self.info = SandboxInfo.from_json(data)

    def kill(self) -> None:
        """Stop the microVM and delete everything in it."""
        self._http.delete(_sandbox_path(self.sandbox_id))

    def pause(self) -> None:
        """Freeze the sandbox: its memory and processes are saved and the VM stops."""
        data = self._http.post(_sandbox_path(self.sandbox_id, "/pause"), timeout=max(self._http.timeout, CREATE_TIMEOUT_S))
        self.info = SandboxInfo.from_json(data)

    def resume(self) -> None:
        """Start a paused sandbox again where it stopped."""
        data = self._http.post(_sandbox_path(self.sandbox_id, "/resume"), timeout=max(self._http.timeout, CREATE_TIMEOUT_S))
        self.info = SandboxInfo.from_json(data)

    def fork(self, count: int = 1) -> List["Sandbox"]:
        """``count`` copies of this running sandbox, processes, memory and files included,
        each with its own id and its own writes from here on."""
        data = self._http.post(
            _sandbox_path(self.sandbox_id, "/fork"), json={"count": count}, timeout=max(self._http.timeout, CREATE_TIMEOUT_S)
        )
        return [Sandbox(SandboxInfo.from_json(d), self._http) for d in data]

    def get_host(self, port: int) -> str:
        """The public host serving ``port`` inside the sandbox:
        ``{sandboxId}-{port}.sandbox.{region}.{domain}``."""
        if not self.info.domain:
            raise ValueError("the server did not say which domain serves this sandbox")
        return f"{self.sandbox_id}-{port}.{self.info.domain}"
